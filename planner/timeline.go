package planner

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
)

// Note [Timeline]
//
// A model of one backward step with DDP's overlapped allreduces, and a
// search for the bucket boundaries that minimise the step it predicts.
//
// Units. The caller cuts the model into units at its candidate boundaries
// (block runs first, as blocks.go cuts pieces) and lists them in backward
// order: unit 0 is the last piece of the forward, whose backward runs
// first. Each unit has its backward duration and the bytes of the
// gradients it completes (> 0: a piece without parameters joins the unit
// after it in backward order, whose gradients its backward delays). A
// bucket is a run of consecutive units; every boundary between two units
// is a candidate.
//
// The step. Backward runs the units in order on one compute stream. A
// bucket is ready when its last unit's backward finishes (a unit's
// gradients are taken to be ready together, at its end). One communication
// stream takes the buckets in order: a bucket's allreduce starts at
// max(ready, the previous bucket's completion) + the launch overhead and
// completes cost(bytes) later, cost being latency + bytes / bandwidth or
// a measured table. While the stream is busy (launching or transferring),
// compute runs slowed by the given factor (gloo's sends take the rank's
// core; NCCL's kernels share the GPU's memory bandwidth). The step is the
// last completion; the exposed communication is the step minus the end of
// backward. Forward, the optimizer and gradient copies are outside the
// model. Times are integer nanoseconds: a slowed stretch of d ns does
// d*1000/permille ns of work, exact in rationals, rounded up to whole ns
// where work ends.
//
// The search is exact (unless a front is thinned, Note [Timeline search
// bounds]). State at a boundary j, once a bucket closes there: r, when
// that bucket is ready, and e, when its allreduce completes. The past
// reaches the future only through (r, e): every earlier bucket was ready
// by r, so from r on the stream is busy without a gap until e, and compute
// from r is slowed exactly during [r, e). For a fixed choice of the later
// boundaries the step is non-decreasing in r and in e (the next bucket's
// ready time is r + g(e-r), g the time its work takes with the first e-r
// ns slowed, non-decreasing and growing at most 1 ns per ns; its
// completion is max(ready, e) + launch + cost), so a state that is as late
// in both as another is useless: the dynamic program keeps, per boundary,
// the states no other state dominates (a Pareto front), and the front at
// the last unit holds the least step. Without slowdown, r is
// the fixed prefix sum of backward durations and the front is one state.
// Ties: the least step, then the earliest end of backward, then, between
// equal states, fewer buckets, then the earlier predecessor boundary.
//
// Cost: sum over boundaries k of sum over j < k of the front at j, so
// O(n^2) transitions for n units without slowdown, O(n^2 F) with it, F the
// largest front, which Note [Timeline search bounds] bounds; memory
// O(n F).

// TimelineInput is what PredictTimeline and PlanTimeline take (Note
// [Timeline]).
type TimelineInput struct {
	// Per unit, in backward order: the backward duration (ns, > 0) and the
	// gradient bytes it completes (> 0).
	BackwardNs []int64
	Bytes      []int64

	Allreduce AllreduceCost
	// LaunchNs is the overhead before each bucket's allreduce (>= 0).
	LaunchNs int64
	// SlowdownPermille is how much longer compute takes while the
	// communication stream is busy, in thousandths: 1000 none, 1500 half
	// again as long. At most maxSlowdownPermille.
	SlowdownPermille int64
}

// AllreduceCost is an allreduce's duration as a function of its bytes: one
// of LatencyNs + bytes*1e9/BytesPerSecond (ns, rounded up) or, given
// Table, linear interpolation between its points, the nearest segment's
// line extended beyond them (never below 0).
type AllreduceCost struct {
	LatencyNs      int64 // >= 0
	BytesPerSecond int64 // > 0 without Table, 0 with it
	Table          []CostPoint
}

// CostPoint is one measured allreduce: Bytes strictly ascending and Ns
// non-decreasing along a Table of at least two points.
type CostPoint struct {
	Bytes int64
	Ns    int64
}

// TimelineBucket is one bucket of a Timeline: units [First, End) in
// backward order, and its times in ns from the start of backward.
type TimelineBucket struct {
	First, End int
	Bytes      int64
	ReadyNs    int64 // its last unit's backward finishes
	StartNs    int64 // its allreduce starts, after the launch overhead
	DoneNs     int64 // its allreduce completes
}

// Timeline is a predicted backward step.
type Timeline struct {
	Buckets    []TimelineBucket
	BackwardNs int64 // backward's end: the last bucket's ReadyNs
	StepNs     int64 // the last allreduce's completion
	ExposedNs  int64 // StepNs - BackwardNs
	Search     TimelineSearch
}

// TimelineSearch says how a Timeline's boundaries were found (Note
// [Timeline search bounds]).
type TimelineSearch int32

const (
	SearchNone    TimelineSearch = 0 // given (PredictTimeline)
	SearchExact   TimelineSearch = 1 // the least step (PlanTimeline)
	SearchThinned TimelineSearch = 2 // a front was thinned: the least step found, not promised
)

const (
	maxTimelineUnits    = 4096
	maxSlowdownPermille = 1_000_000
	// maxTimelineNs bounds every time the model computes (validateTimeline
	// checks a bound on the largest), so that no sum overflows.
	maxTimelineNs = int64(1) << 62
)

// PredictTimeline predicts the step with a new bucket starting at each of
// starts (unit indices, strictly ascending, in [1, n)). Errors: an *Error,
// ErrInvalidConfig for malformed input, ErrOverflow when times could
// exceed 2^62 ns.
func PredictTimeline(in *TimelineInput, starts []int) (*Timeline, error) {
	m, err := newTimelineModel(in)
	if err != nil {
		return nil, err
	}
	n := len(in.BackwardNs)
	for i, s := range starts {
		if s < 1 || s >= n || (i > 0 && s <= starts[i-1]) {
			return nil, errorf(ErrInvalidConfig, "planner: timeline bucket start %d is %d; want strictly ascending starts in [1, %d)", i, s, n)
		}
	}
	ends := append(slices.Clone(starts), n)
	return m.timeline(ends), nil
}

// PlanTimeline chooses the bucket boundaries that minimise the predicted
// step, exactly (Note [Timeline], which states the ties), and returns
// their timeline. Errors as PredictTimeline's.
func PlanTimeline(in *TimelineInput) (*Timeline, error) {
	m, err := newTimelineModel(in)
	if err != nil {
		return nil, err
	}
	ends, search := m.search()
	tl := m.timeline(ends)
	tl.Search = search
	return tl, nil
}

// timelineModel holds validated input with prefix sums.
type timelineModel struct {
	in      *TimelineInput
	work    []int64 // work[k]: backward ns of units [0, k)
	bytes   []int64 // bytes[k]: bytes of units [0, k)
	permill int64
}

func newTimelineModel(in *TimelineInput) (*timelineModel, error) {
	if err := validateTimeline(in); err != nil {
		return nil, err
	}
	n := len(in.BackwardNs)
	m := &timelineModel{in: in, work: make([]int64, n+1), bytes: make([]int64, n+1), permill: in.SlowdownPermille}
	for i := range n {
		m.work[i+1] = m.work[i] + in.BackwardNs[i]
		m.bytes[i+1] = m.bytes[i] + in.Bytes[i]
	}
	// The largest time: all of backward slowed, plus per bucket its
	// rounding, the launch and the cost of every byte (cost is
	// non-decreasing in bytes).
	perBucket := satAdd(satAdd(in.LaunchNs, m.cost(m.bytes[n])), 2)
	if bound := satAdd(m.slowed(m.work[n]), satMul(perBucket, int64(n))); bound >= maxTimelineNs {
		return nil, errorf(ErrOverflow, "planner: timeline times could reach %d ns; the model takes at most %d", bound, maxTimelineNs)
	}
	return m, nil
}

func validateTimeline(in *TimelineInput) error {
	n := len(in.BackwardNs)
	if n == 0 {
		return errorf(ErrInvalidConfig, "planner: a timeline needs at least one unit")
	}
	if n > maxTimelineUnits {
		return errorf(ErrInvalidConfig, "planner: a timeline of %d units; at most %d", n, maxTimelineUnits)
	}
	if len(in.Bytes) != n {
		return errorf(ErrInvalidConfig, "planner: timeline: %d byte counts for %d backward durations", len(in.Bytes), n)
	}
	var work, bytes int64
	for i := range n {
		if d := in.BackwardNs[i]; d <= 0 {
			return errorf(ErrInvalidConfig, "planner: timeline unit %d: backward duration %d ns; want > 0", i, d)
		}
		if b := in.Bytes[i]; b <= 0 {
			return errorf(ErrInvalidConfig, "planner: timeline unit %d: %d bytes; want > 0 (a unit without gradients joins the next one)", i, b)
		}
		work, bytes = satAdd(work, in.BackwardNs[i]), satAdd(bytes, in.Bytes[i])
	}
	if work == math.MaxInt64 || bytes == math.MaxInt64 {
		return errorf(ErrOverflow, "planner: timeline: the units' durations or bytes overflow")
	}
	if in.LaunchNs < 0 {
		return errorf(ErrInvalidConfig, "planner: timeline launch overhead %d ns; want >= 0", in.LaunchNs)
	}
	if s := in.SlowdownPermille; s < 1000 || s > maxSlowdownPermille {
		return errorf(ErrInvalidConfig, "planner: timeline compute slowdown %d permille; want 1000 (none) to %d", s, maxSlowdownPermille)
	}
	return validateCost(&in.Allreduce)
}

func validateCost(c *AllreduceCost) error {
	if c.LatencyNs < 0 {
		return errorf(ErrInvalidConfig, "planner: allreduce latency %d ns; want >= 0", c.LatencyNs)
	}
	if len(c.Table) == 0 {
		if c.BytesPerSecond <= 0 {
			return errorf(ErrInvalidConfig, "planner: allreduce bandwidth %d bytes/s; want > 0 (or a measured table)", c.BytesPerSecond)
		}
		return nil
	}
	if c.LatencyNs != 0 || c.BytesPerSecond != 0 {
		return errorf(ErrInvalidConfig, "planner: allreduce cost given both as latency and bandwidth and as a table; give one")
	}
	if len(c.Table) < 2 {
		return errorf(ErrInvalidConfig, "planner: allreduce cost table of %d point; want at least 2", len(c.Table))
	}
	for i, p := range c.Table {
		if p.Bytes < 0 || p.Ns < 0 {
			return errorf(ErrInvalidConfig, "planner: allreduce cost point %d: %d bytes, %d ns; want both >= 0", i, p.Bytes, p.Ns)
		}
		if i > 0 && (p.Bytes <= c.Table[i-1].Bytes || p.Ns < c.Table[i-1].Ns) {
			return errorf(ErrInvalidConfig, "planner: allreduce cost point %d (%d bytes, %d ns) after (%d bytes, %d ns); want bytes ascending and ns non-decreasing",
				i, p.Bytes, p.Ns, c.Table[i-1].Bytes, c.Table[i-1].Ns)
		}
	}
	return nil
}

// cost is the allreduce's duration for bytes (AllreduceCost), saturating.
func (m *timelineModel) cost(bytes int64) int64 {
	c := &m.in.Allreduce
	if len(c.Table) == 0 {
		return satAdd(c.LatencyNs, mulDivCeil(bytes, 1_000_000_000, c.BytesPerSecond))
	}
	// The segment [a, b] whose line applies: the first whose end reaches
	// bytes, else the last.
	k := 1
	for k < len(c.Table)-1 && c.Table[k].Bytes < bytes {
		k++
	}
	a, b := c.Table[k-1], c.Table[k]
	rise, run := b.Ns-a.Ns, b.Bytes-a.Bytes
	if bytes >= a.Bytes {
		return satAdd(a.Ns, mulDivCeil(bytes-a.Bytes, rise, run))
	}
	// Before the first point: the line down, stopping at 0.
	return max(a.Ns-mulDivFloor(a.Bytes-bytes, rise, run), 0)
}

// slowed is how long w ns of work takes while the stream is busy.
func (m *timelineModel) slowed(w int64) int64 {
	return mulDivCeil(w, m.permill, 1000)
}

// finish is how long w ns of work takes when the stream is busy for the
// first d ns (d >= 0): the least t whose work, d' * 1000/permille for the
// busy d' = min(t, d) plus t - d' unslowed, reaches w.
func (m *timelineModel) finish(d, w int64) int64 {
	if t := m.slowed(w); t <= d {
		return t
	}
	return d + w - mulDivFloor(d, 1000, m.permill)
}

// next returns the ready time and completion of the bucket of units
// [j, k), after a bucket ready at r whose allreduce completes at e.
func (m *timelineModel) next(r, e int64, j, k int) (ready, done int64) {
	return m.nextCosting(r, e, j, k, m.in.LaunchNs+m.cost(m.bytes[k]-m.bytes[j]))
}

// nextCosting is next given the bucket's launch and allreduce time.
func (m *timelineModel) nextCosting(r, e int64, j, k int, comm int64) (ready, done int64) {
	ready = r + m.finish(max(e-r, 0), m.work[k]-m.work[j])
	return ready, max(ready, e) + comm
}

// timeline evaluates the buckets that end at ends (ascending, the last n).
func (m *timelineModel) timeline(ends []int) *Timeline {
	tl := &Timeline{Buckets: make([]TimelineBucket, 0, len(ends))}
	var r, e int64
	first := 0
	for _, end := range ends {
		var done int64
		r, done = m.next(r, e, first, end)
		tl.Buckets = append(tl.Buckets, TimelineBucket{
			First: first, End: end, Bytes: m.bytes[end] - m.bytes[first],
			ReadyNs: r, StartNs: max(r, e) + m.in.LaunchNs, DoneNs: done,
		})
		e = done
		first = end
	}
	tl.BackwardNs, tl.StepNs = r, e
	tl.ExposedNs = e - r
	return tl
}

// frontState is one undominated state at a boundary (Note [Timeline]).
type frontState struct {
	ready, done int64
	buckets     int
	prevEnd     int // the boundary before, 0 for the first bucket
	prevIndex   int // the state there
}

// search runs the dynamic program of Note [Timeline] and returns the
// chosen bucket ends and how they were found.
func (m *timelineModel) search() ([]int, TimelineSearch) {
	return m.searchWithin(m.newBound())
}

func (m *timelineModel) searchWithin(b *bound) ([]int, TimelineSearch) {
	n := len(m.in.BackwardNs)
	fronts, thinned := m.fronts(b)
	// The final front is ascending in ready time and descending in
	// completion: its last state has the least step.
	last := fronts[n]
	s := last[len(last)-1]
	var ends []int
	for k := n; k > 0; {
		ends = append(ends, k)
		k, s = s.prevEnd, fronts[s.prevEnd][s.prevIndex]
	}
	slices.Reverse(ends)
	if !thinned {
		return ends, SearchExact
	}
	if tl := m.timeline(b.upperEnds); tl.StepNs < last[len(last)-1].done ||
		(tl.StepNs == last[len(last)-1].done && tl.BackwardNs < last[len(last)-1].ready) {
		return b.upperEnds, SearchThinned
	}
	return ends, SearchThinned
}

// fronts returns the front at every boundary, 0 (the start) to n, less
// the states that b shows cannot reach the least step, and whether a front
// was thinned.
func (m *timelineModel) fronts(b *bound) ([][]frontState, bool) {
	n := len(m.in.BackwardNs)
	fronts := make([][]frontState, n+1)
	fronts[0] = []frontState{{}}
	var cands []frontState
	thinned := false
	for k := 1; k <= n; k++ {
		cands = cands[:0]
		for j := range k {
			comm := m.in.LaunchNs + m.cost(m.bytes[k]-m.bytes[j])
			for i, s := range fronts[j] {
				r, e := m.nextCosting(s.ready, s.done, j, k, comm)
				if k < n && b.hopeless(k, r, e) {
					continue
				}
				cands = append(cands, frontState{ready: r, done: e, buckets: s.buckets + 1, prevEnd: j, prevIndex: i})
			}
		}
		front := paretoFront(cands)
		if len(front) > b.frontCap {
			front, thinned = thin(front, b.frontCap), true
		}
		fronts[k] = front
	}
	return fronts, thinned
}

// Note [Timeline search bounds]
//
// The fronts of Note [Timeline] grow with slowdown (about n states at a
// boundary where compute and communication are balanced), so the search
// prunes and, past a budget, thins:
//   - An upper bound: the boundaries chosen without slowdown (one state a
//     boundary, O(n^2)), timed with it.
//   - A lower bound per state at k < n: the stream still needs, after e,
//     the least time any split of units [k, n) takes (launches and
//     allreduces, computed once in O(n^2)); and backward's rest, at least
//     its unslowed work after r, is followed by the last bucket's launch
//     and allreduce. A state whose lower bound exceeds the upper one
//     cannot lead to the least step and is dropped; this keeps the search
//     exact.
//   - A front longer than frontCap (timelineBudget / n^2, so that the
//     search does about timelineBudget/2 transitions at most) keeps
//     frontCap states evenly spaced along it, its two ends included. The
//     search is then no longer exact: it says SearchThinned, and returns
//     the better of its result and the upper bound's boundaries, so a
//     thinned plan is never predicted slower than the one chosen without
//     slowdown. In the benchmark's balanced inputs with slowdown, fronts
//     stay exact to 64 units and are thinned from about 128.

const timelineBudget = 1 << 22

// bound prunes the search (Note [Timeline search bounds]).
type bound struct {
	m *timelineModel
	// upper: the step of upperEnds, the choice made without slowdown;
	// commRest[j]: the least time the stream needs for units [j, n), over
	// every split.
	upper     int64
	upperEnds []int
	commRest  []int64
	lastCost  int64
	frontCap  int
}

func (m *timelineModel) newBound() *bound {
	n := len(m.in.BackwardNs)
	b := &bound{m: m, commRest: make([]int64, n+1), lastCost: m.in.LaunchNs + m.cost(m.in.Bytes[n-1]),
		upper: math.MaxInt64, frontCap: max(timelineBudget/(n*n), 2)}
	if m.permill == 1000 {
		// Without slowdown a front is one state: nothing to prune.
		return b
	}
	for j := n - 1; j >= 0; j-- {
		b.commRest[j] = math.MaxInt64
		for k := j + 1; k <= n; k++ {
			b.commRest[j] = min(b.commRest[j], m.in.LaunchNs+m.cost(m.bytes[k]-m.bytes[j])+b.commRest[k])
		}
	}
	plain := *m
	plain.permill = 1000
	b.upperEnds, _ = plain.search()
	b.upper = m.timeline(b.upperEnds).StepNs
	return b
}

// hopeless says that a state at boundary k < n (a bucket ready at r, done
// at e) leads to no step of at most upper (Note [Timeline search bounds]).
func (b *bound) hopeless(k int, r, e int64) bool {
	m := b.m
	n := len(m.in.BackwardNs)
	lower := max(satAdd(e, b.commRest[k]), r+m.work[n]-m.work[k]+b.lastCost)
	return lower > b.upper
}

// thin keeps limit states of front (limit >= 2), evenly spaced, its ends
// included.
func thin(front []frontState, limit int) []frontState {
	kept := make([]frontState, limit)
	for i := range limit {
		kept[i] = front[i*(len(front)-1)/(limit-1)]
	}
	return kept
}

// paretoFront returns the states of cands that no other is as early as in
// both ready time and completion, ascending in ready time, with the ties of
// Note [Timeline]. It reorders cands.
func paretoFront(cands []frontState) []frontState {
	slices.SortFunc(cands, func(a, b frontState) int {
		return cmp.Or(cmp.Compare(a.ready, b.ready), cmp.Compare(a.done, b.done),
			cmp.Compare(a.buckets, b.buckets), cmp.Compare(a.prevEnd, b.prevEnd), cmp.Compare(a.prevIndex, b.prevIndex))
	})
	var front []frontState
	for _, c := range cands {
		if len(front) == 0 || c.done < front[len(front)-1].done {
			front = append(front, c)
		}
	}
	return front
}

// mulDivCeil and mulDivFloor are ceil(a*b/c) and floor(a*b/c) for a, b >=
// 0 and c > 0, exact through 128 bits, saturating at math.MaxInt64.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, rem := bits.Div64(hi, lo, uint64(c))
	if rem != 0 {
		q++
	}
	return int64(min(q, math.MaxInt64))
}

func mulDivFloor(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}
