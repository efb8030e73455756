package planner

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bandwidthInput is n units of the given durations and bytes over a
// latency + bandwidth cost.
func bandwidthInput(backward, bytes []int64, latency, bytesPerSecond, launch, slowdown int64) *TimelineInput {
	return &TimelineInput{
		BackwardNs: backward, Bytes: bytes,
		Allreduce: AllreduceCost{LatencyNs: latency, BytesPerSecond: bytesPerSecond},
		LaunchNs:  launch, SlowdownPermille: slowdown,
	}
}

// TestTimelineByHand: three units of 10 ns, 1e9 bytes/s (1 ns a byte).
func TestTimelineByHand(t *testing.T) {
	in := bandwidthInput([]int64{10, 10, 10}, []int64{20, 5, 30}, 2, 1_000_000_000, 1, 1000)

	// One bucket per unit: ready 10, 20, 30. Bucket 0 starts 10+1 and
	// takes 2+20: done 33. Bucket 1 waits: starts 34, done 41. Bucket 2:
	// starts 42, done 74.
	tl, err := PredictTimeline(in, []int{1, 2})
	require.NoError(t, err)
	want := []TimelineBucket{
		{First: 0, End: 1, Bytes: 20, ReadyNs: 10, StartNs: 11, DoneNs: 33},
		{First: 1, End: 2, Bytes: 5, ReadyNs: 20, StartNs: 34, DoneNs: 41},
		{First: 2, End: 3, Bytes: 30, ReadyNs: 30, StartNs: 42, DoneNs: 74},
	}
	assert.Equal(t, want, tl.Buckets)
	assert.Equal(t, int64(30), tl.BackwardNs)
	assert.Equal(t, int64(74), tl.StepNs)
	assert.Equal(t, int64(44), tl.ExposedNs)

	// Unsplit: ready 30, starts 31, takes 2+55: 88.
	tl, err = PredictTimeline(in, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(88), tl.StepNs)

	// The best: [0,1) done 33 as above; [1,3) ready 30, starts 34, takes
	// 2+35: 71. Every other choice is later (the brute force below checks
	// the search in general).
	tl, err = PlanTimeline(in)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 3}, bucketEnds(tl))
	assert.Equal(t, int64(71), tl.StepNs)
}

// TestTimelineSlowdownByHand: compute takes twice as long while the stream
// is busy.
func TestTimelineSlowdownByHand(t *testing.T) {
	in := bandwidthInput([]int64{10, 10}, []int64{8, 8}, 0, 1_000_000_000, 0, 2000)
	// Bucket 0 ready 10, busy [10, 18): unit 1 does 4 ns of work there,
	// then 6 more unslowed: ready 24, done 32.
	tl, err := PredictTimeline(in, []int{1})
	require.NoError(t, err)
	assert.Equal(t, []int64{10, 24}, []int64{tl.Buckets[0].ReadyNs, tl.Buckets[1].ReadyNs})
	assert.Equal(t, int64(32), tl.StepNs)
	// Unsplit: ready 20, done 36; split still wins, by less than the 8 ns
	// it would without slowdown.
	tl, err = PlanTimeline(in)
	require.NoError(t, err)
	assert.Equal(t, int64(32), tl.StepNs)

	// Work that ends inside the busy stretch: 3 ns slowed by 1.5 is 4.5,
	// rounded up to 5.
	in = bandwidthInput([]int64{10, 3}, []int64{100, 1}, 0, 1_000_000_000, 0, 1500)
	tl, err = PredictTimeline(in, []int{1})
	require.NoError(t, err)
	assert.Equal(t, int64(15), tl.Buckets[1].ReadyNs)
}

// TestTimelineTableCost: interpolation between measured points, and the
// end segments' lines beyond them.
func TestTimelineTableCost(t *testing.T) {
	in := &TimelineInput{
		BackwardNs: []int64{1}, Bytes: []int64{1},
		Allreduce:        AllreduceCost{Table: []CostPoint{{100, 50}, {200, 60}, {400, 100}}},
		SlowdownPermille: 1000,
	}
	m, err := newTimelineModel(in)
	require.NoError(t, err)
	for bytes, want := range map[int64]int64{
		0: 40, 50: 45, 99: 50, 100: 50, 101: 51, 150: 55, 200: 60, 201: 61, 300: 80, 400: 100, 500: 120,
	} {
		assert.Equal(t, want, m.cost(bytes), "cost(%d)", bytes)
	}
	// Below the first point, the line stops at 0.
	in.Allreduce.Table = []CostPoint{{100, 10}, {200, 1000}}
	m, err = newTimelineModel(in)
	require.NoError(t, err)
	assert.Equal(t, int64(0), m.cost(0))
	assert.Equal(t, int64(10), m.cost(100))
}

// TestTimelineRefusesBadInput: each malformed input is an *Error with its
// code, before any planning.
func TestTimelineRefusesBadInput(t *testing.T) {
	good := func() *TimelineInput {
		return bandwidthInput([]int64{10, 20}, []int64{100, 200}, 5, 1000, 1, 1000)
	}
	cases := []struct {
		name   string
		edit   func(in *TimelineInput)
		code   ErrorCode
		substr string
	}{
		{"no units", func(in *TimelineInput) { in.BackwardNs, in.Bytes = nil, nil }, ErrInvalidConfig, "at least one unit"},
		{"lengths differ", func(in *TimelineInput) { in.Bytes = in.Bytes[:1] }, ErrInvalidConfig, "1 byte counts for 2"},
		{"zero duration", func(in *TimelineInput) { in.BackwardNs[1] = 0 }, ErrInvalidConfig, "unit 1: backward duration 0"},
		{"negative duration", func(in *TimelineInput) { in.BackwardNs[0] = -3 }, ErrInvalidConfig, "unit 0: backward duration -3"},
		{"zero bytes", func(in *TimelineInput) { in.Bytes[0] = 0 }, ErrInvalidConfig, "unit 0: 0 bytes"},
		{"negative launch", func(in *TimelineInput) { in.LaunchNs = -1 }, ErrInvalidConfig, "launch overhead -1"},
		{"zero slowdown", func(in *TimelineInput) { in.SlowdownPermille = 0 }, ErrInvalidConfig, "slowdown 0 permille"},
		{"speedup", func(in *TimelineInput) { in.SlowdownPermille = 999 }, ErrInvalidConfig, "slowdown 999"},
		{"huge slowdown", func(in *TimelineInput) { in.SlowdownPermille = maxSlowdownPermille + 1 }, ErrInvalidConfig, "slowdown"},
		{"zero bandwidth", func(in *TimelineInput) { in.Allreduce.BytesPerSecond = 0 }, ErrInvalidConfig, "bandwidth 0"},
		{"negative latency", func(in *TimelineInput) { in.Allreduce.LatencyNs = -1 }, ErrInvalidConfig, "latency -1"},
		{"table and bandwidth", func(in *TimelineInput) {
			in.Allreduce.Table = []CostPoint{{1, 1}, {2, 2}}
		}, ErrInvalidConfig, "give one"},
		{"one-point table", func(in *TimelineInput) {
			in.Allreduce = AllreduceCost{Table: []CostPoint{{1, 1}}}
		}, ErrInvalidConfig, "table of 1 point"},
		{"table bytes not ascending", func(in *TimelineInput) {
			in.Allreduce = AllreduceCost{Table: []CostPoint{{1, 1}, {1, 2}}}
		}, ErrInvalidConfig, "point 1 (1 bytes, 2 ns)"},
		{"table time decreasing", func(in *TimelineInput) {
			in.Allreduce = AllreduceCost{Table: []CostPoint{{1, 5}, {2, 4}}}
		}, ErrInvalidConfig, "ns non-decreasing"},
		{"negative table point", func(in *TimelineInput) {
			in.Allreduce = AllreduceCost{Table: []CostPoint{{-1, 5}, {2, 6}}}
		}, ErrInvalidConfig, "point 0"},
		{"durations overflow", func(in *TimelineInput) { in.BackwardNs = []int64{math.MaxInt64, 1} }, ErrOverflow, "overflow"},
		{"bytes overflow", func(in *TimelineInput) { in.Bytes = []int64{math.MaxInt64 - 1, 1} }, ErrOverflow, "overflow"},
		{"times too large", func(in *TimelineInput) { in.BackwardNs[0] = 1<<62 - 10 }, ErrOverflow, "at most"},
		{"too many units", func(in *TimelineInput) {
			in.BackwardNs = slices.Repeat([]int64{1}, maxTimelineUnits+1)
			in.Bytes = slices.Repeat([]int64{1}, maxTimelineUnits+1)
		}, ErrInvalidConfig, "at most 4096"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := good()
			tc.edit(in)
			for _, call := range []func() (*Timeline, error){
				func() (*Timeline, error) { return PlanTimeline(in) },
				func() (*Timeline, error) { return PredictTimeline(in, nil) },
			} {
				tl, err := call()
				assert.Nil(t, tl)
				var perr *Error
				require.True(t, errors.As(err, &perr), "%v", err)
				assert.Equal(t, tc.code, perr.Code)
				assert.Contains(t, perr.Msg, tc.substr)
			}
		})
	}
	for _, starts := range [][]int{{0}, {2}, {1, 1}, {-1}} {
		_, err := PredictTimeline(good(), starts)
		var perr *Error
		require.True(t, errors.As(err, &perr), "starts %v: %v", starts, err)
		assert.Equal(t, ErrInvalidConfig, perr.Code)
	}
}

func bucketEnds(tl *Timeline) []int {
	var ends []int
	for _, b := range tl.Buckets {
		ends = append(ends, b.End)
	}
	return ends
}

// naiveCost is AllreduceCost in exact rationals, written apart from
// timelineModel.cost.
func naiveCost(c *AllreduceCost, bytes int64) int64 {
	var v *big.Rat
	if len(c.Table) == 0 {
		v = new(big.Rat).SetFrac64(bytes*1_000_000_000, c.BytesPerSecond)
		v.Add(v, new(big.Rat).SetInt64(c.LatencyNs))
	} else {
		k := len(c.Table) - 1 // the segment [k-1, k]
		for i := 1; i < len(c.Table); i++ {
			if bytes <= c.Table[i].Bytes {
				k = i
				break
			}
		}
		a, b := c.Table[k-1], c.Table[k]
		v = new(big.Rat).SetFrac64((bytes-a.Bytes)*(b.Ns-a.Ns), b.Bytes-a.Bytes)
		v.Add(v, new(big.Rat).SetInt64(a.Ns))
		if v.Sign() < 0 {
			v.SetInt64(0)
		}
	}
	q, r := new(big.Int).QuoRem(v.Num(), v.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// naiveTimeline steps time 1 ns at a time: in each ns, compute does
// 1000/permille ns of work if the stream is busy and 1 otherwise (counted in
// thousandths of a permille to stay whole); a bucket whose work is done at
// the end of a ns is ready then; the stream starts the next ready bucket
// whenever it is free.
func naiveTimeline(in *TimelineInput, ends []int) *Timeline {
	type bucket struct {
		first, end   int
		work, bytes  int64
		ready, start int64
		done         int64
	}
	var bs []*bucket
	first := 0
	for _, end := range ends {
		b := &bucket{first: first, end: end, ready: -1, done: -1}
		for u := first; u < end; u++ {
			b.work += in.BackwardNs[u] * in.SlowdownPermille
			b.bytes += in.Bytes[u]
		}
		bs = append(bs, b)
		first = end
	}
	computing, next := 0, 0 // the bucket compute works on, the next to send
	var busyUntil int64
	left := bs[0].work
	for t := int64(0); ; t++ {
		for next < len(bs) && bs[next].ready >= 0 && bs[next].ready <= t && busyUntil <= t {
			bs[next].start = t + in.LaunchNs
			bs[next].done = bs[next].start + naiveCost(&in.Allreduce, bs[next].bytes)
			busyUntil = bs[next].done
			next++
		}
		if next == len(bs) && busyUntil <= t {
			break
		}
		if computing < len(bs) {
			if busyUntil > t {
				left -= 1000
			} else {
				left -= in.SlowdownPermille
			}
			if left <= 0 {
				bs[computing].ready = t + 1
				if computing++; computing < len(bs) {
					left = bs[computing].work
				}
			}
		}
	}
	tl := &Timeline{}
	for _, b := range bs {
		tl.Buckets = append(tl.Buckets, TimelineBucket{First: b.first, End: b.end, Bytes: b.bytes,
			ReadyNs: b.ready, StartNs: b.start, DoneNs: b.done})
	}
	last := tl.Buckets[len(tl.Buckets)-1]
	tl.BackwardNs, tl.StepNs = last.ReadyNs, last.DoneNs
	tl.ExposedNs = tl.StepNs - tl.BackwardNs
	return tl
}

// bruteForceTimeline tries every subset of boundaries and returns the
// least step and, among the choices that reach it, the earliest end of
// backward.
func bruteForceTimeline(in *TimelineInput) (step, backward int64) {
	n := len(in.BackwardNs)
	step, backward = math.MaxInt64, math.MaxInt64
	for mask := range 1 << (n - 1) {
		var ends []int
		for u := 1; u < n; u++ {
			if mask&(1<<(u-1)) != 0 {
				ends = append(ends, u)
			}
		}
		tl := naiveTimeline(in, append(ends, n))
		if tl.StepNs < step || (tl.StepNs == step && tl.BackwardNs < backward) {
			step, backward = tl.StepNs, tl.BackwardNs
		}
	}
	return step, backward
}

// randomTimelineInput draws a small input: up to maxUnits units of small
// durations and bytes, a cost by bandwidth or by table, and often a
// slowdown, so that the tick simulation and the brute force stay cheap.
func randomTimelineInput(s *byteSource, maxUnits int) *TimelineInput {
	n := 1 + s.intn(maxUnits)
	in := &TimelineInput{LaunchNs: int64(s.intn(4)), SlowdownPermille: 1000}
	for range n {
		in.BackwardNs = append(in.BackwardNs, int64(1+s.intn(20)))
		in.Bytes = append(in.Bytes, int64(1+s.intn(30)))
	}
	if s.chance(128) {
		in.SlowdownPermille = []int64{1001, 1250, 1500, 2000, 3000, 4700}[s.intn(6)]
	}
	if s.chance(64) {
		x, y := int64(s.intn(10)), int64(s.intn(10))
		in.Allreduce.Table = []CostPoint{{x, y}}
		for range 1 + s.intn(3) {
			x, y = x+1+int64(s.intn(30)), y+int64(s.intn(30))
			in.Allreduce.Table = append(in.Allreduce.Table, CostPoint{x, y})
		}
	} else {
		in.Allreduce.LatencyNs = int64(s.intn(8))
		// 0.25 to 4 ns a byte.
		in.Allreduce.BytesPerSecond = []int64{250_000_000, 333_333_333, 500_000_000, 1_000_000_000, 3_000_000_000, 4_000_000_000}[s.intn(6)]
	}
	return in
}

// checkTimelineAgainstNaive: the model's timeline for random boundaries
// and its plan agree with the tick simulation and the brute force.
func checkTimelineAgainstNaive(t *testing.T, in *TimelineInput, s *byteSource) {
	t.Helper()
	n := len(in.BackwardNs)
	var starts []int
	for u := 1; u < n; u++ {
		if s.chance(100) {
			starts = append(starts, u)
		}
	}
	got, err := PredictTimeline(in, starts)
	require.NoError(t, err)
	want := naiveTimeline(in, append(slices.Clone(starts), n))
	require.Equal(t, want, got, "input %+v, starts %v", in, starts)

	plan, err := PlanTimeline(in)
	require.NoError(t, err)
	step, backward := bruteForceTimeline(in)
	require.Equal(t, step, plan.StepNs, "input %+v: plan %v", in, bucketEnds(plan))
	require.Equal(t, backward, plan.BackwardNs, "input %+v: plan %v", in, bucketEnds(plan))
	require.Equal(t, SearchExact, plan.Search)
	plan.Search = SearchNone
	require.Equal(t, naiveTimeline(in, bucketEnds(plan)), plan)
}

func TestTimelineMatchesNaiveReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 1))
	for range 1500 {
		data := make([]byte, 64)
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		s := &byteSource{data: data}
		checkTimelineAgainstNaive(t, randomTimelineInput(s, 8), s)
	}
}

// TestTimelineThinnedSearch: with fronts thinned to a few states, the
// search says so, its timeline is still the simulation's, and its step lies
// between the least and the one chosen without slowdown.
func TestTimelineThinnedSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 2))
	thinnedOnce := false
	for range 600 {
		data := make([]byte, 64)
		for i := range data {
			data[i] = byte(rng.IntN(256))
		}
		in := randomTimelineInput(&byteSource{data: data}, 8)
		m, err := newTimelineModel(in)
		require.NoError(t, err)
		b := m.newBound()
		b.frontCap = 2
		ends, search := m.searchWithin(b)
		tl := m.timeline(ends)
		require.Equal(t, naiveTimeline(in, ends), tl)
		step, _ := bruteForceTimeline(in)
		require.GreaterOrEqual(t, tl.StepNs, step)
		if search == SearchThinned {
			thinnedOnce = true
			require.LessOrEqual(t, tl.StepNs, b.upper)
		} else {
			require.Equal(t, SearchExact, search)
			require.Equal(t, step, tl.StepNs)
		}
	}
	assert.True(t, thinnedOnce, "no front was ever thinned")
}

func FuzzTimeline(f *testing.F) {
	f.Add([]byte{7, 5, 3, 9, 200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0, 0})
	f.Add([]byte{3, 2, 20, 5, 9, 1, 0, 30, 100, 60, 50, 200, 1, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &byteSource{data: data}
		checkTimelineAgainstNaive(t, randomTimelineInput(s, 9), s)
	})
}

// timelineCase is an input for a golden plan; figures are from the runs
// docs/benchmarks.md describes, or from shapes, as each case says.
type timelineCase struct {
	name string
	in   *TimelineInput
}

const mibBytes = 1 << 20

// shapedLink is the cost over a link of bitsPerSecond with gloo's
// per-allreduce latency on this machine's loopback (about 0.2 ms).
func shapedLink(bitsPerSecond int64) AllreduceCost {
	return AllreduceCost{LatencyNs: 200_000, BytesPerSecond: bitsPerSecond / 8}
}

var timelineCases = []timelineCase{
	{
		// The MLP of docs/benchmarks.md's cap table (8 layers of 1024²
		// fp32, 32 MiB of gradients, compute alone 0.65 s, backward about
		// two thirds of it) at 250 Mbit/s: communication-bound.
		name: "timeline_mlp_250mbit",
		in: &TimelineInput{
			BackwardNs: slices.Repeat([]int64{54_000_000}, 8),
			Bytes:      slices.Repeat([]int64{4*mibBytes + 4096}, 8),
			Allreduce:  shapedLink(250_000_000), LaunchNs: 100_000, SlowdownPermille: 1000,
		},
	},
	{
		// The same with gloo's sends taking the core: compute runs at
		// half speed while the stream is busy.
		name: "timeline_mlp_250mbit_slowdown",
		in: &TimelineInput{
			BackwardNs: slices.Repeat([]int64{54_000_000}, 8),
			Bytes:      slices.Repeat([]int64{4*mibBytes + 4096}, 8),
			Allreduce:  shapedLink(250_000_000), LaunchNs: 100_000, SlowdownPermille: 2000,
		},
	},
	{
		// GPT-2 small's block units as bench/simulate.py builds them for
		// its H100/NVLink profile (8 ranks, ring): the tail (final norm and
		// the head's matrix product; the head's weight is the token
		// embedding's), 12 blocks, the embeddings, whose tied gradient is
		// complete only at the end of backward.
		name: "timeline_gpt2_small_nvlink",
		in: &TimelineInput{
			BackwardNs: append(append([]int64{3_198_065}, slices.Repeat([]int64{718_552}, 12)...), 1000),
			Bytes:      append(append([]int64{6144}, slices.Repeat([]int64{28_351_488}, 12)...), 157_535_232),
			Allreduce:  AllreduceCost{LatencyNs: 28_000, BytesPerSecond: 257_142_857_143},
			LaunchNs:   10_000, SlowdownPermille: 1100,
		},
	},
	{
		// A measured cost table (three probe sizes) instead of a line.
		name: "timeline_table_cost",
		in: &TimelineInput{
			BackwardNs: []int64{3_000_000, 9_000_000, 9_000_000, 9_000_000, 9_000_000, 500_000},
			Bytes:      []int64{40 * mibBytes, 8 * mibBytes, 8 * mibBytes, 8 * mibBytes, 8 * mibBytes, 1 * mibBytes},
			Allreduce: AllreduceCost{Table: []CostPoint{
				{1 * mibBytes, 2_500_000}, {8 * mibBytes, 9_000_000}, {64 * mibBytes, 60_000_000}}},
			LaunchNs: 50_000, SlowdownPermille: 1300,
		},
	},
}

// renderTimeline writes the input, the plan and, for comparison, the
// unsplit and one-bucket-per-unit predictions.
func renderTimeline(t *testing.T, in *TimelineInput) string {
	t.Helper()
	var s strings.Builder
	c := &in.Allreduce
	fmt.Fprintf(&s, "input: %d units, launch %d ns, slowdown %d permille\n", len(in.BackwardNs), in.LaunchNs, in.SlowdownPermille)
	if len(c.Table) == 0 {
		fmt.Fprintf(&s, "cost: %d ns + bytes / %d bytes/s\n", c.LatencyNs, c.BytesPerSecond)
	} else {
		fmt.Fprintf(&s, "cost table:")
		for _, p := range c.Table {
			fmt.Fprintf(&s, " (%d bytes, %d ns)", p.Bytes, p.Ns)
		}
		s.WriteString("\n")
	}
	for u := range in.BackwardNs {
		fmt.Fprintf(&s, "unit %d: backward %d ns, %d bytes\n", u, in.BackwardNs[u], in.Bytes[u])
	}
	plan, err := PlanTimeline(in)
	require.NoError(t, err)
	writeTimeline(&s, "plan", plan)
	unsplit, err := PredictTimeline(in, nil)
	require.NoError(t, err)
	var every []int
	for u := 1; u < len(in.BackwardNs); u++ {
		every = append(every, u)
	}
	perUnit, err := PredictTimeline(in, every)
	require.NoError(t, err)
	for _, other := range []*Timeline{unsplit, perUnit} {
		require.LessOrEqual(t, plan.StepNs, other.StepNs)
	}
	fmt.Fprintf(&s, "unsplit: step %d ns, exposed %d ns\n", unsplit.StepNs, unsplit.ExposedNs)
	fmt.Fprintf(&s, "per unit: step %d ns, exposed %d ns\n", perUnit.StepNs, perUnit.ExposedNs)
	return s.String()
}

func writeTimeline(s *strings.Builder, label string, tl *Timeline) {
	fmt.Fprintf(s, "%s: step %d ns, backward %d ns, exposed %d ns, %d buckets, search %d\n",
		label, tl.StepNs, tl.BackwardNs, tl.ExposedNs, len(tl.Buckets), tl.Search)
	for k, b := range tl.Buckets {
		fmt.Fprintf(s, "  bucket %d: units [%d, %d), %d bytes, ready %d, start %d, done %d\n",
			k, b.First, b.End, b.Bytes, b.ReadyNs, b.StartNs, b.DoneNs)
	}
}

func TestTimelineGolden(t *testing.T) {
	for _, tc := range timelineCases {
		t.Run(tc.name, func(t *testing.T) {
			checkGolden(t, tc.name, renderTimeline(t, tc.in))
		})
	}
}

// TestTimelineLeavesInputAlone: the calls read their input only.
func TestTimelineLeavesInputAlone(t *testing.T) {
	in := timelineCases[3].in
	before := fmt.Sprintf("%+v", *in)
	starts := []int{2, 4}
	_, err := PlanTimeline(in)
	require.NoError(t, err)
	_, err = PredictTimeline(in, starts)
	require.NoError(t, err)
	assert.Equal(t, before, fmt.Sprintf("%+v", *in))
	assert.Equal(t, []int{2, 4}, starts)
}

// benchTimelineInput is n transformer-like units with a large first (the
// head), compute and communication balanced, at the given slowdown.
func benchTimelineInput(n int, slowdown int64) *TimelineInput {
	rng := rand.New(rand.NewPCG(uint64(n), uint64(slowdown)))
	in := &TimelineInput{Allreduce: AllreduceCost{LatencyNs: 50_000, BytesPerSecond: 10_000_000_000},
		LaunchNs: 10_000, SlowdownPermille: slowdown}
	for u := range n {
		bytes := int64(28*mibBytes + rng.IntN(mibBytes))
		if u == 0 {
			bytes *= 5
		}
		in.Bytes = append(in.Bytes, bytes)
		in.BackwardNs = append(in.BackwardNs, 2_000_000+int64(rng.IntN(500_000)))
	}
	return in
}

// TestTimelineFrontsStaySmall: the benchmark's 64-unit inputs are searched
// exactly (Note [Timeline search bounds]), without slowdown with fronts of
// one state.
func TestTimelineFrontsStaySmall(t *testing.T) {
	for _, slowdown := range []int64{1000, 1500, 3000} {
		m, err := newTimelineModel(benchTimelineInput(64, slowdown))
		require.NoError(t, err)
		largest := 0
		fronts, thinned := m.fronts(m.newBound())
		assert.False(t, thinned)
		for _, front := range fronts {
			largest = max(largest, len(front))
		}
		if slowdown == 1000 {
			assert.Equal(t, 1, largest)
		}
		t.Logf("slowdown %d: largest front %d", slowdown, largest)
	}
}

func BenchmarkTimelinePlan(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		for _, slowdown := range []int64{1000, 1500} {
			in := benchTimelineInput(n, slowdown)
			b.Run(fmt.Sprintf("units=%d/slowdown=%d", n, slowdown), func(b *testing.B) {
				for b.Loop() {
					if _, err := PlanTimeline(in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
