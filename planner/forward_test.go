package planner

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCombineForwardConcatenatesTheLaterGraphFirst(t *testing.T) {
	bytes := []int64{10, 20, 30, 40, 50, 60}
	graphs := []ForwardGraph{
		{Buckets: [][]int32{{2}, {1, 0}}}, // forward first: parameters 0-2
		{Buckets: [][]int32{{5, 4}, {3}}}, // then 3-5
	}
	plan, err := CombineForward(graphs, bytes, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []int64{110, 40, 30, 30}, plan.Caps)
	assert.Equal(t, []int{1, 1, 0, 0}, []int{plan.Buckets[0].Graph, plan.Buckets[1].Graph, plan.Buckets[2].Graph, plan.Buckets[3].Graph})
	assert.Equal(t, []int32{5, 4}, plan.Buckets[0].Params)
	assert.Equal(t, 0, plan.Moved)
	assert.Equal(t, 0, plan.Dropped)
}

// TestCombineForwardSplitsSeveralGroups: a forward of two graphs whose
// second holds a bf16 layer: the combined units are split by group, cap j
// every group's j-th bucket's (Note [Several dtype groups]).
func TestCombineForwardSplitsSeveralGroups(t *testing.T) {
	// DDP positions 0-3: fp32 layer 0 (graph 0), fp32 layer 1 and a bf16
	// layer 2 (graph 1), fp32 layer 3 (graph 1); weight and bias each.
	bytes := []int64{90, 10, 90, 10, 45, 5, 90, 10}
	keys := []int32{0, 0, 0, 0, 1, 1, 0, 0}
	graphs := []ForwardGraph{
		{Buckets: [][]int32{{1, 0}}},
		{Buckets: [][]int32{{7, 6}, {5, 4}, {3, 2}}},
	}
	plan, err := CombineForward(graphs, bytes, keys, &Config{BucketCapBytes: 25 << 20, FirstBucketCapBytes: 1 << 20})
	require.NoError(t, err)
	assert.False(t, plan.GroupsLater, "DDP's own 25 MiB buckets launch at the end")
	var got [][]int32
	for _, b := range plan.Buckets {
		got = append(got, b.Params)
	}
	// Cap 0 closes fp32 layer 3 (100 bytes) only above 90: the bf16
	// layer's 50 bytes stay open, after every closed bucket.
	assert.Equal(t, [][]int32{{7, 6}, {3, 2}, {1, 0}, {5, 4}}, got)
	assert.Equal(t, []int64{100, 100, 100}, plan.Caps)
	assert.Equal(t, 1, plan.MergedCuts, "no bucket closes at the bf16 layer's end")
	assert.Equal(t, 1, plan.Buckets[3].Graph)

	// One group: the plan of nil keys.
	one, err := CombineForward(graphs, bytes, []int32{3, 3, 3, 3, 3, 3, 3, 3}, nil)
	require.NoError(t, err)
	plain, err := CombineForward(graphs, bytes, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, plain, one)
}

func TestCombineForwardOneGraphIsItself(t *testing.T) {
	plan, err := CombineForward([]ForwardGraph{{Buckets: [][]int32{{1}, {0}}}}, []int64{4, 8}, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []int64{8, 4}, plan.Caps)
}

func TestCombineForwardCountsATiedParameterInTheEarliestGraph(t *testing.T) {
	// Parameter 0 (an embedding tied to the head) is used by both graphs;
	// its gradient completes in the first graph's backward.
	bytes := []int64{100, 10, 20}
	graphs := []ForwardGraph{
		{Buckets: [][]int32{{1, 0}}},
		{Buckets: [][]int32{{0}, {2}}},
	}
	plan, err := CombineForward(graphs, bytes, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []int64{20, 110}, plan.Caps)
	assert.Equal(t, 1, plan.Moved)
	assert.Equal(t, 1, plan.Dropped)
	assert.Equal(t, 1, plan.Buckets[0].Source, "the second graph's bucket 0 held only the tied parameter")
}

func TestCombineForwardRefusesAPartialForward(t *testing.T) {
	_, err := CombineForward([]ForwardGraph{{Buckets: [][]int32{{0}}}, {Buckets: [][]int32{{2}}}}, []int64{1, 1, 1}, nil, nil)
	var perr *Error
	require.True(t, errors.As(err, &perr), "%v", err)
	assert.Equal(t, ErrInvalidGraph, perr.Code)
	assert.Contains(t, perr.Msg, "use 2 of DDP's 3 parameters")
	assert.Contains(t, perr.Msg, "position 1")
}

func TestCombineForwardRejectsMalformedInput(t *testing.T) {
	cases := map[string]struct {
		graphs []ForwardGraph
		bytes  []int64
		want   string
	}{
		"no graph":     {nil, []int64{1}, "at least one graph"},
		"out of range": {[]ForwardGraph{{Buckets: [][]int32{{3}}}}, []int64{1}, "names DDP position 3"},
		"negative":     {[]ForwardGraph{{Buckets: [][]int32{{-1}}}}, []int64{1}, "names DDP position -1"},
		"twice":        {[]ForwardGraph{{Buckets: [][]int32{{0}, {0}}}}, []int64{1}, "two buckets of graph 0"},
		"size":         {[]ForwardGraph{{Buckets: [][]int32{{0}}}}, []int64{-4}, "negative size"},
		"keys":         {[]ForwardGraph{{Buckets: [][]int32{{0}}}}, []int64{4}, "2 group numbers for 1 parameters"},
		"key":          {[]ForwardGraph{{Buckets: [][]int32{{0}, {1}}}}, []int64{4, 4}, "group number -1"},
	}
	for name, c := range cases {
		keys := map[string][]int32{"keys": {0, 1}, "key": {0, -1}}[name]
		_, err := CombineForward(c.graphs, c.bytes, keys, nil)
		var perr *Error
		if !errors.As(err, &perr) || perr.Code != ErrInvalidConfig || !strings.Contains(perr.Msg, c.want) {
			t.Errorf("%s: error %v, want ErrInvalidConfig containing %q", name, err, c.want)
		}
	}
}

// ddpRebuild is a naive model of DDP's bucket rebuild: walk the gradients in
// ready order, add each to the open bucket, and close it once its bytes
// reach the current cap (the last cap repeats).
func ddpRebuild(ready []int32, bytes []int64, caps []int64) [][]int32 {
	var out [][]int32
	var open []int32
	var size int64
	for _, p := range ready {
		open = append(open, p)
		size += bytes[p]
		limit := caps[min(len(out), len(caps)-1)]
		if size >= limit {
			out = append(out, open)
			open, size = nil, 0
		}
	}
	if len(open) > 0 {
		out = append(out, open)
	}
	return out
}

// TestCombineForwardClosesDDPBucketsAtEveryCut builds random forwards: the
// parameters, in use order, are split into pieces and the pieces into
// graphs, with some parameters tied back to an earlier graph. Each graph's
// buckets are what AlignBuckets gives (one per piece, DDP order). DDP's
// rebuild from any gradient order consistent with the backward (graphs last
// first, pieces last first, any order inside a piece) with the combined caps
// must close every bucket at a piece boundary.
func TestCombineForwardClosesDDPBucketsAtEveryCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 5))
	keyed, merged := 0, 0
	defer func() {
		assert.Greater(t, keyed, 100, "trials of several groups")
		assert.Positive(t, merged, "a trial of several groups whose caps close no bucket at some cut")
	}()
	for trial := 0; trial < 500; trial++ {
		numParams := 1 + rng.IntN(40)
		bytes := make([]int64, numParams)
		for p := range bytes {
			bytes[p] = 1 + rng.Int64N(1000)
		}
		// DDP positions are a permutation of use order.
		positions := rng.Perm(numParams)
		numGraphs := 1 + rng.IntN(min(4, numParams))
		graphCuts := randomCuts(rng, numParams, numGraphs)
		var graphs []ForwardGraph
		var pieceOf []int // per DDP position: a global piece id of its earliest use
		pieceOf = make([]int, numParams)
		piece := 0
		var graphPieces [][][]int32 // per graph, pieces in forward order
		for g := 0; g < numGraphs; g++ {
			lo, hi := graphCuts[g], graphCuts[g+1]
			numPieces := 1 + rng.IntN(hi-lo)
			cuts := randomCuts(rng, hi-lo, numPieces)
			var pieces [][]int32
			for q := 0; q < numPieces; q++ {
				var members []int32
				for i := lo + cuts[q]; i < lo+cuts[q+1]; i++ {
					members = append(members, int32(positions[i]))
					pieceOf[positions[i]] = piece
				}
				pieces = append(pieces, members)
				piece++
			}
			graphPieces = append(graphPieces, pieces)
		}
		// Ties: a later graph's last piece also uses an earlier parameter.
		for g := 1; g < numGraphs; g++ {
			if rng.IntN(2) == 0 {
				tied := int32(positions[rng.IntN(graphCuts[g])])
				last := len(graphPieces[g]) - 1
				graphPieces[g][last] = append(graphPieces[g][last], tied)
			}
		}
		for _, pieces := range graphPieces {
			var buckets [][]int32
			for q := len(pieces) - 1; q >= 0; q-- {
				buckets = append(buckets, slices.Clone(pieces[q]))
			}
			graphs = append(graphs, ForwardGraph{Buckets: buckets})
		}
		var keys []int32 // one trial in two: parameters of up to 3 groups
		if rng.IntN(2) == 0 {
			keys = make([]int32, numParams)
			groups := 1 + rng.IntN(3)
			for p := range keys {
				keys[p] = int32(rng.IntN(groups))
			}
		}
		var own *Config // one trial in two: DDP's own caps, for the launch check
		if rng.IntN(2) == 0 {
			c := int64(1 + rng.IntN(3000))
			own = &Config{BucketCapBytes: c, FirstBucketCapBytes: 1 + rng.Int64N(c)}
		}
		plan, err := CombineForward(graphs, bytes, keys, own)
		require.NoError(t, err, "trial %d", trial)
		if own != nil && distinctKeys(keys) > 1 {
			// ownOnUnits is DDP's rebuild over the units with own's caps.
			var units [][]int32
			for g := len(graphs) - 1; g >= 0; g-- {
				for _, b := range graphs[g].Buckets {
					var kept []int32
					for _, p := range b {
						if pieceOwner(graphs, p) == g {
							kept = append(kept, p)
						}
					}
					if len(kept) > 0 {
						units = append(units, kept)
					}
				}
			}
			var ready []int32
			for _, u := range units {
				ready = append(ready, u...)
			}
			closed, open := keyedRebuild(ready, bytes, keys, capList(own))
			ownPlan := ownOnUnits(unitBuckets(units), bytes, keys, capList(own))
			var sizes []int64
			for _, b := range append(closed, open...) {
				var n int64
				for _, p := range b {
					n += bytes[p]
				}
				sizes = append(sizes, n)
			}
			var got []int64
			for _, b := range ownPlan.Buckets {
				got = append(got, b.Bytes)
			}
			// The closed ones in closing order; the open ones, whose order
			// DDP does not promise, as a set.
			require.Len(t, got, len(sizes), "trial %d", trial)
			require.Equal(t, sizes[:len(closed)], got[:len(closed)], "trial %d: DDP's own closed buckets over the units", trial)
			require.ElementsMatch(t, sizes[len(closed):], got[len(closed):], "trial %d: DDP's own open buckets", trial)
		}

		// A gradient order of the backward: pieces from the last, each
		// parameter at the piece of its earliest use, shuffled within.
		var ready []int32
		for q := piece - 1; q >= 0; q-- {
			var inPiece []int32
			for p := range numParams {
				if pieceOf[p] == q {
					inPiece = append(inPiece, int32(p))
				}
			}
			rng.Shuffle(len(inPiece), func(i, j int) { inPiece[i], inPiece[j] = inPiece[j], inPiece[i] })
			ready = append(ready, inPiece...)
		}
		if distinctKeys(keys) > 1 {
			checkKeyedForward(t, plan, ready, bytes, keys, pieceOf)
			keyed++
			if plan.MergedCuts > 0 {
				merged++
			}
			continue
		}
		rebuilt := ddpRebuild(ready, bytes, plan.Caps)
		require.Len(t, rebuilt, len(plan.Buckets), "trial %d", trial)
		for k, b := range rebuilt {
			want := slices.Clone(plan.Buckets[k].Params)
			got := slices.Clone(b)
			slices.Sort(want)
			slices.Sort(got)
			require.Equal(t, want, got, "trial %d bucket %d", trial, k)
			for _, p := range b[1:] {
				require.Equal(t, pieceOf[b[0]], pieceOf[p], "trial %d: bucket %d straddles a cut", trial, k)
			}
		}
	}
}

// checkKeyedForward: DDP's rebuild of several groups (each walking the caps
// on its own) from ready with the plan's caps closes exactly the plan's
// closed buckets, leaves its open ones open, and closes each at its
// group's last gradient of a piece; every bucket holds one group.
func checkKeyedForward(t *testing.T, plan *ForwardPlan, ready []int32, bytes []int64, keys []int32, pieceOf []int) {
	t.Helper()
	closedAt := map[int32]int{} // group -> its buckets so far
	var wantClosed, wantOpen [][]int32
	for k, b := range plan.Buckets {
		key := keys[b.Params[0]]
		for _, p := range b.Params {
			require.Equal(t, key, keys[p], "bucket %d mixes groups", k)
		}
		j := min(closedAt[key], len(plan.Caps)-1)
		closedAt[key]++
		if max(1, b.Bytes) >= plan.Caps[j] {
			require.Empty(t, wantOpen, "bucket %d closes after an open one", k)
			wantClosed = append(wantClosed, b.Params)
		} else {
			wantOpen = append(wantOpen, b.Params)
		}
	}
	filling, size, at := map[int32][]int32{}, map[int32]int64{}, map[int32]int{}
	var closed [][]int32
	for i, p := range ready {
		key := keys[p]
		filling[key] = append(filling[key], p)
		size[key] += bytes[p]
		if size[key] >= plan.Caps[min(at[key], len(plan.Caps)-1)] {
			for _, q := range ready[i+1:] {
				require.False(t, keys[q] == key && pieceOf[q] == pieceOf[p], "a bucket closes inside piece %d", pieceOf[p])
			}
			closed = append(closed, filling[key])
			filling[key], size[key] = nil, 0
			at[key]++
		}
	}
	var open [][]int32
	for _, b := range filling {
		if len(b) > 0 {
			open = append(open, b)
		}
	}
	require.Equal(t, sortedSets(wantClosed), sortedSets(closed), "closed buckets, caps %v", plan.Caps)
	require.Equal(t, sortedSets(wantOpen), sortedSets(open), "open buckets, caps %v", plan.Caps)
}

// pieceOwner is the earliest graph holding DDP position p.
func pieceOwner(graphs []ForwardGraph, p int32) int {
	for g, graph := range graphs {
		for _, b := range graph.Buckets {
			if slices.Contains(b, p) {
				return g
			}
		}
	}
	return -1
}

// unitBuckets wraps parameter lists as ForwardBuckets.
func unitBuckets(units [][]int32) []ForwardBucket {
	out := make([]ForwardBucket, len(units))
	for k, u := range units {
		out[k] = ForwardBucket{Params: u, Graph: k}
	}
	return out
}

// keyedRebuild is DDP's rebuild of several groups in ready order: each
// group closes its bucket at its current cap, walking caps on its own; the
// closed buckets in closing order, then the open ones.
func keyedRebuild(ready []int32, bytes []int64, keys []int32, caps []int64) (closed, open [][]int32) {
	filling, size, at := map[int32][]int32{}, map[int32]int64{}, map[int32]int{}
	var order []int32
	for _, p := range ready {
		k := keys[p]
		if _, seen := at[k]; !seen {
			at[k] = 0
			order = append(order, k)
		}
		filling[k] = append(filling[k], p)
		size[k] += bytes[p]
		if size[k] >= caps[min(at[k], len(caps)-1)] {
			closed = append(closed, filling[k])
			filling[k], size[k] = nil, 0
			at[k]++
		}
	}
	for _, k := range order {
		if len(filling[k]) > 0 {
			open = append(open, filling[k])
		}
	}
	return closed, open
}

// TestCombineForwardKeepsDDPsOwnWhereTheyLaunchEarlier: fp32 layers before
// a break and a bf16 head with a bias after it: the one cap that closes
// the head's bucket leaves every fp32 gradient in one open bucket, which
// DDP's own 250-byte caps launch layer by layer.
func TestCombineForwardKeepsDDPsOwnWhereTheyLaunchEarlier(t *testing.T) {
	var bytes []int64
	var keys []int32
	var first [][]int32
	for l := range 10 {
		bytes, keys = append(bytes, 100), append(keys, 0)
		first = append([][]int32{{int32(l)}}, first...)
	}
	bytes, keys = append(bytes, 1000, 10), append(keys, 1, 1)
	graphs := []ForwardGraph{{Buckets: first}, {Buckets: [][]int32{{11, 10}}}}
	plan, err := CombineForward(graphs, bytes, keys, &Config{BucketCapBytes: 250, FirstBucketCapBytes: 250})
	require.NoError(t, err)
	assert.Equal(t, []int64{1010}, plan.Caps)
	assert.Equal(t, 9, plan.MergedCuts)
	assert.True(t, plan.GroupsLater)

	// Without own caps there is nothing to weigh against.
	plan, err = CombineForward(graphs, bytes, keys, nil)
	require.NoError(t, err)
	assert.False(t, plan.GroupsLater)
	// Bad own caps are named.
	_, err = CombineForward(graphs, bytes, keys, &Config{BucketCapBytes: 0, FirstBucketCapBytes: 1})
	require.ErrorContains(t, err, "BucketCapBytes must be > 0")
}

// randomCuts splits n items into k non-empty runs: k+1 ascending bounds.
func randomCuts(rng *rand.Rand, n, k int) []int {
	inner := rng.Perm(n - 1)[:k-1]
	for i := range inner {
		inner[i]++
	}
	slices.Sort(inner)
	return append(append([]int{0}, inner...), n)
}

func TestCombineForwardGivesDDPCapsOfAtLeastOneByte(t *testing.T) {
	// Parameter 1 holds no bytes (an empty tensor): its bucket's total is 0,
	// and a cap of 0 would give DDP one bucket per parameter.
	plan, err := CombineForward([]ForwardGraph{{Buckets: [][]int32{{1}}}, {Buckets: [][]int32{{0}}}}, []int64{8, 0}, nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []int64{8, 1}, plan.Caps)
	assert.Equal(t, int64(0), plan.Buckets[1].Bytes, "the byte total stays exact")
}

// TestCombineForwardBoundsTheGroupsTotal: each graph bucket fits int64, but
// a group's bucket may hold several: their sum is bounded too.
func TestCombineForwardBoundsTheGroupsTotal(t *testing.T) {
	huge := int64(1<<62 + 10)
	graphs := []ForwardGraph{{Buckets: [][]int32{{0}, {1}}}, {Buckets: [][]int32{{2}, {3}}}}
	_, err := CombineForward(graphs, []int64{huge, huge, huge, 4}, []int32{0, 0, 0, 1}, nil)
	var perr *Error
	require.True(t, errors.As(err, &perr), "%v", err)
	assert.Equal(t, ErrOverflow, perr.Code)
	_, err = CombineForward(graphs, []int64{huge, huge, huge, 4}, nil, nil)
	require.NoError(t, err, "one group: each bucket its own cap")
}
