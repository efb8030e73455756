package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ddpWalkOfPieces is DDP's bucket assignment as its rebuild makes it
// (compute_bucket_assignment_by_size, the rule checked against torch in
// tests/python/distributed/test_dist_dtype_groups.py): gradients in
// ready order, each (dtype, device) group filling its own bucket and
// closing it when its bytes reach the group's current cap, each group
// walking caps from the start and staying at the last: the closed buckets
// in closing order, and the open ones.
func ddpWalkOfPieces(g *Graph, ready []int32, caps []int64) (closed, open [][]int32) {
	type key struct{ dtype, device int32 }
	filling := map[key][]int32{}
	size := map[key]int64{}
	pos := map[key]int{}
	var keys []key
	for _, p := range ready {
		k := key{g.Params[p].DType, g.Params[p].Device}
		if _, seen := pos[k]; !seen {
			pos[k] = 0
			keys = append(keys, k)
		}
		filling[k] = append(filling[k], p)
		size[k] += g.Params[p].Bytes
		if size[k] >= caps[pos[k]] {
			closed = append(closed, filling[k])
			filling[k], size[k] = nil, 0
			pos[k] = min(pos[k]+1, len(caps)-1)
		}
	}
	for _, k := range keys {
		if len(filling[k]) > 0 {
			open = append(open, filling[k])
		}
	}
	return closed, open
}

// keyedChain is a chain of n nodes, each using 1 to 3 fresh parameters of
// random sizes and of one of keys (dtype, device) groups.
func keyedChain(rng *rand.Rand, n, keys int) *Graph {
	b := &graphBuilder{}
	x := b.placeholder("x")
	for i := range n {
		var refs []paramRef
		for j := range 1 + rng.IntN(3) {
			k := int32(rng.IntN(keys))
			p := b.param(fmt.Sprintf("n%d.p%d", i, j), int64(1+rng.IntN(64)), dtype(k%2), func(p *Param) { p.Device = k / 2 })
			refs = append(refs, arg(p))
		}
		x = b.call(fmt.Sprintf("n%d", i), in(x), refs...)
	}
	b.output(x)
	return b.graph()
}

// randomAlignedConfig is an aligned ready-order config with caps of 8 to
// 127 bytes and, one time in three, 2 to 4 pieces at most.
func randomAlignedConfig(rng *rand.Rand) Config {
	capBytes := int64(8 + rng.IntN(120))
	cfg := Config{AlignBuckets: true, BucketCapBytes: capBytes, FirstBucketCapBytes: 1 + rng.Int64N(capBytes)}
	if rng.IntN(3) == 0 {
		cfg.MaxPieces = 2 + rng.IntN(3)
	}
	return cfg
}

// piecesReady returns the counted parameters in use by piece, backward
// order (last piece first), each piece's in a random order: any order the
// autograd engine may choose inside a piece.
func piecesReady(rng *rand.Rand, g *Graph, pl *Plan) []int32 {
	firstUse, err := firstUses(g)
	if err != nil {
		panic(err)
	}
	per := make([][]int32, pl.NumPieces)
	for p, f := range firstUse {
		if f >= 0 {
			q := pl.NodePiece[f]
			per[q] = append(per[q], int32(p))
		}
	}
	var ready []int32
	for q := pl.NumPieces - 1; q >= 0; q-- {
		rng.Shuffle(len(per[q]), func(i, j int) { per[q][i], per[q][j] = per[q][j], per[q][i] })
		ready = append(ready, per[q]...)
	}
	return ready
}

func sortedSets(buckets [][]int32) []string {
	var out []string
	for _, b := range buckets {
		s := slices.Clone(b)
		slices.Sort(s)
		out = append(out, fmt.Sprint(s))
	}
	slices.Sort(out)
	return out
}

// TestSeveralKeysAlignWithDDPsWalk: on random chains of two to four
// (dtype, device) groups, DDP's walk with the plan's caps, whatever the
// order inside each piece, makes exactly the plan's buckets, each
// completed by one piece's backward (Note [Several dtype groups]).
func TestSeveralKeysAlignWithDDPsWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 33))
	merged := 0
	for c := range 400 {
		keys := 2 + rng.IntN(3)
		g := keyedChain(rng, 2+rng.IntN(12), keys)
		cfg := randomAlignedConfig(rng)
		pl, err := Build(g, cfg)
		require.NoError(t, err)
		what := fmt.Sprintf("case %d: params %v node pieces %v buckets %v caps %v", c, g.Params, pl.NodePiece, pl.Buckets, pl.DDPCaps)
		if pl.NumPieces < 2 {
			continue
		}
		merged += pl.MergedCuts
		var want [][]int32
		for _, b := range pl.Buckets {
			want = append(want, b.Params)
		}
		firstUse, _ := firstUses(g)
		for range 4 {
			closed, open := ddpWalkOfPieces(g, piecesReady(rng, g, pl), pl.DDPCaps)
			require.Equal(t, sortedSets(want), sortedSets(append(closed, open...)), what)
		}
		for _, b := range pl.Buckets {
			lowest := int32(pl.NumPieces)
			for _, p := range b.Params {
				lowest = min(lowest, pl.NodePiece[firstUse[p]])
				assert.Equal(t, g.Params[b.Params[0]].DType, g.Params[p].DType, what)
			}
			assert.Equal(t, int(lowest), b.Piece, what)
		}
		if pl.Alignment == AlignReady {
			continue // every parameter of one group after all
		}
		assert.Equal(t, AlignReadyGroups, pl.Alignment, what)
	}
	assert.Positive(t, merged, "some case merges a cut")
}

// keyedLayers plans layersGraph(layers...) aligned with cap capBytes and
// checks the plan (checkSeveralKeys).
func keyedLayers(t *testing.T, capBytes int64, layers ...[]int64) (*Plan, *Graph) {
	g := layersGraph(layers...)
	pl, err := Build(g, Config{AlignBuckets: true, BucketCapBytes: capBytes, FirstBucketCapBytes: capBytes})
	require.NoError(t, err)
	for _, v := range checkSeveralKeys(g, pl, rand.New(rand.NewPCG(3, 4))) {
		t.Error(v)
	}
	return pl, g
}

// layersGraph is a chain of layers, each using fresh parameters of the
// given bytes (negative: bf16), named l<layer>.<dtype>.<index>.
func layersGraph(layers ...[]int64) *Graph {
	b := &graphBuilder{}
	x := b.placeholder("x")
	for i, layer := range layers {
		var refs []paramRef
		for j, bytes := range layer {
			name, opts := fmt.Sprintf("l%d.f32.%d", i, j), []paramOpt(nil)
			if bytes < 0 {
				name, opts, bytes = fmt.Sprintf("l%d.bf16.%d", i, j), []paramOpt{dtype(1)}, -bytes
			}
			refs = append(refs, arg(b.param(name, bytes, opts...)))
		}
		x = b.call(fmt.Sprintf("l%d", i), in(x), refs...)
	}
	b.output(x)
	return b.graph()
}

// names lists a bucket's parameter names, sorted.
func names(g *Graph, b Bucket) []string {
	var out []string
	for _, p := range b.Params {
		out = append(out, g.Params[p].Name)
	}
	slices.Sort(out)
	return out
}

// TestSeveralKeysCloseAtEveryCutTheyCan: the caps close every group's
// bucket at the earliest unit end the other groups allow (Note [Several
// dtype groups]).
func TestSeveralKeysCloseAtEveryCutTheyCan(t *testing.T) {
	t.Run("equal groups", func(t *testing.T) {
		pl, _ := keyedLayers(t, 100, []int64{100, -100}, []int64{100, -100}, []int64{100, -100})
		assert.Equal(t, 3, pl.NumPieces)
		assert.Equal(t, AlignReadyGroups, pl.Alignment)
		assert.Zero(t, pl.MergedCuts)
		assert.Equal(t, []int64{100, 100, 100}, pl.DDPCaps)
		assert.Len(t, pl.Buckets, 6)
	})
	t.Run("a bf16 layer", func(t *testing.T) {
		// Cap 0 closes the last float32 layer (100 bytes, one gradient)
		// and the bf16 layer (60 bytes, its last gradient 30) at once.
		pl, g := keyedLayers(t, 50, []int64{100}, []int64{-30, -30}, []int64{100}, []int64{100})
		assert.Equal(t, 4, pl.NumPieces)
		assert.Zero(t, pl.MergedCuts)
		assert.Equal(t, []int64{60, 100, 100}, pl.DDPCaps)
		assert.Equal(t, []string{"l1.bf16.0", "l1.bf16.1"}, names(g, pl.Buckets[2]))
		assert.Equal(t, 1, pl.Buckets[2].Piece)
	})
	t.Run("bf16 runs that close only together", func(t *testing.T) {
		// bf16 runs close in (20, 40] per layer, the float32 ones in
		// (50, 100]: the bf16 group's first bucket takes both bf16 layers
		// (80 bytes) and the float32 one its last layer, so the later bf16
		// layer's end closes nothing.
		pl, g := keyedLayers(t, 40, []int64{50, 50}, []int64{-20, -20}, []int64{50, 50}, []int64{-20, -20}, []int64{50, 50})
		assert.Equal(t, 5, pl.NumPieces)
		assert.Equal(t, 1, pl.MergedCuts)
		assert.Equal(t, []int64{80, 100, 100}, pl.DDPCaps)
		assert.Equal(t, []string{"l1.bf16.0", "l1.bf16.1", "l3.bf16.0", "l3.bf16.1"}, names(g, pl.Buckets[2]))
	})
	t.Run("fp32 norms beside bf16 weights", func(t *testing.T) {
		// Every block holds both groups: the norms (16 bytes a block) stay
		// under the weights' interval, so their one bucket stays open and
		// the weights close a bucket per block.
		var layers [][]int64
		for range 8 {
			layers = append(layers, []int64{-1000, -20, 8, 8})
		}
		pl, g := keyedLayers(t, 1020, layers...)
		assert.Equal(t, 8, pl.NumPieces)
		assert.Zero(t, pl.MergedCuts)
		assert.Equal(t, slices.Repeat([]int64{1020}, 8), pl.DDPCaps)
		require.Len(t, pl.Buckets, 9)
		last := pl.Buckets[8]
		assert.Len(t, last.Params, 16)
		assert.Equal(t, int32(0), g.Params[last.Params[0]].DType, "the norms' open bucket comes last")
		for k, b := range pl.Buckets[:8] {
			assert.Equal(t, 7-k, b.Piece)
			assert.Equal(t, int64(1020), b.Bytes)
		}
	})
}

// TestSeveralKeysInAPartOfTheForward: the whole graph is aligned per group
// in either order; a graph that holds part of DDP's parameters keeps its
// units whole in ready order (CombineForward splits the forward's by
// group), and in declaration order is not covered, as with one group.
func TestSeveralKeysInAPartOfTheForward(t *testing.T) {
	g := layersGraph([]int64{100}, []int64{-100})
	for _, findUnused := range []bool{false, true} {
		s := alignedDDP(g, 0, func(d *DDPSettings) { d.FindUnusedParameters = findUnused })
		s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 50, 50
		dec, err := Decide(&Request{Graph: g, Settings: s})
		require.NoError(t, err)
		assert.Equal(t, ReasonAligned, dec.AlignReason)
		want := map[bool]Alignment{false: AlignReadyGroups, true: AlignDeclarationGroups}[findUnused]
		assert.Equal(t, want, dec.Plan.Alignment)

		s = alignedDDP(g, 1, func(d *DDPSettings) { d.FindUnusedParameters = findUnused })
		s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 50, 50
		dec, err = Decide(&Request{Graph: g, Settings: s})
		require.NoError(t, err)
		if findUnused {
			assert.Equal(t, ReasonNotCovered, dec.AlignReason)
			continue
		}
		assert.Equal(t, ReasonPartOfForward, dec.AlignReason)
		assert.Equal(t, AlignReady, dec.Plan.Alignment)
		require.Len(t, dec.Plan.Buckets, 2, "a bucket per piece")
		for k, b := range dec.Plan.Buckets {
			assert.Equal(t, b.Bytes, dec.Plan.DDPCaps[k])
		}
	}
}

// countedKeys counts the (dtype, device) groups of the counted parameters
// in use (those DDP's rebuild sees in backward).
func countedKeys(g *Graph) int {
	firstUse, _ := firstUses(g)
	_, keys := groupKeys(g, firstUse)
	return len(keys)
}

// checkSeveralKeys checks the buckets of an aligned plan of several groups
// (Note [Several dtype groups]; its callers check the cuts): every bucket
// holds one group's parameters and names the piece whose backward
// completes it, the caps are at least 1 byte, the closed buckets come
// before the open ones, and DDP's walk with the plan's caps closes and
// leaves open exactly those buckets (as sets) whatever the order inside
// each piece.
func checkSeveralKeys(g *Graph, pl *Plan, rng *rand.Rand) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if pl.Alignment != AlignReadyGroups {
		fail("several keys: alignment %v, want %v", pl.Alignment, AlignReadyGroups)
		return bad
	}
	firstUse, _ := firstUses(g)
	for j, c := range pl.DDPCaps {
		if c < 1 {
			fail("several keys: cap %d is %d bytes", j, c)
		}
	}
	var wantClosed, wantOpen [][]int32
	seen := map[[2]int32]int{} // per key: its buckets so far
	for k, b := range pl.Buckets {
		lowest := int32(pl.NumPieces)
		for _, p := range b.Params {
			lowest = min(lowest, pl.NodePiece[firstUse[p]])
			if g.Params[p].DType != b.DType || g.Params[p].Device != b.Device {
				fail("several keys: bucket %d mixes groups", k)
			}
		}
		if int(lowest) != b.Piece {
			fail("several keys: bucket %d names piece %d; its last gradients come from piece %d", k, b.Piece, lowest)
		}
		key := [2]int32{b.DType, b.Device}
		j := min(seen[key], len(pl.DDPCaps)-1)
		seen[key]++
		if pl.DDPCaps[j] <= b.Bytes {
			if len(wantOpen) > 0 {
				fail("several keys: bucket %d closes but comes after an open one", k)
			}
			wantClosed = append(wantClosed, b.Params)
		} else {
			wantOpen = append(wantOpen, b.Params)
		}
	}
	// A zero-byte gradient that arrives after its bucket's bytes reached the
	// cap joins a later bucket (Note [Several dtype groups]): compared
	// without them.
	positive := func(buckets [][]int32) []string {
		var out [][]int32
		for _, b := range buckets {
			var kept []int32
			for _, p := range b {
				if g.Params[p].Bytes > 0 {
					kept = append(kept, p)
				}
			}
			if len(kept) > 0 {
				out = append(out, kept)
			}
		}
		return sortedSets(out)
	}
	for range 4 {
		closed, open := ddpWalkOfPieces(g, piecesReady(rng, g, pl), pl.DDPCaps)
		if !slices.Equal(positive(closed), positive(wantClosed)) || !slices.Equal(positive(open), positive(wantOpen)) {
			fail("several keys: DDP's walk with caps %v closes %v and leaves %v open; want %v and %v",
				pl.DDPCaps, closed, open, wantClosed, wantOpen)
			break
		}
	}
	return bad
}

// headModel is four float32 layers (90-byte weight, 10-byte bias) and a
// bf16 head of headBytes (and a 10-byte bias when withBias), used last in
// forward: its gradients are ready first.
func headModel(headBytes int64, withBias bool) *Graph {
	b := &graphBuilder{}
	x := b.placeholder("x")
	for i := range 4 {
		x = b.call(fmt.Sprintf("l%d", i), in(x), arg(b.param(fmt.Sprintf("l%d.w", i), 90)), arg(b.param(fmt.Sprintf("l%d.b", i), 10)))
	}
	refs := []paramRef{arg(b.param("head.w", headBytes, dtype(1)))}
	if withBias {
		refs = append(refs, arg(b.param("head.b", 10, dtype(1))))
	}
	b.output(b.call("head", in(x), refs...))
	return b.graph()
}

// TestSeveralKeysKeepDDPsOwnWhereTheyLaunchEarlier: a bf16 head with a
// bias closes only against a cap near its own bytes, which leaves the
// float32 layers one open bucket at the end of backward; DDP's own
// buckets launch earlier, so Decide keeps them (ReasonGroupsLater). A
// head of one weight closes against any cap up to its bytes: aligned.
func TestSeveralKeysKeepDDPsOwnWhereTheyLaunchEarlier(t *testing.T) {
	decide := func(g *Graph) *Decision {
		s := alignedDDP(g, 0, nil)
		s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 50, 50
		dec, err := Decide(&Request{Graph: g, Settings: s})
		require.NoError(t, err)
		return dec
	}
	g := headModel(1000, true)
	dec := decide(g)
	assert.Equal(t, ReasonGroupsLater, dec.AlignReason)
	assert.False(t, dec.Config.AlignBuckets)
	assert.Equal(t, AlignNone, dec.Plan.Alignment)
	assert.Empty(t, dec.Plan.DDPCaps)
	want, err := Build(g, dec.Config)
	require.NoError(t, err)
	assert.Equal(t, want, dec.Plan, "the unaligned plan")
	// What it declined: the float32 layers in one open bucket.
	aligned, err := Build(g, alignedCfg(dec.Config))
	require.NoError(t, err)
	require.Equal(t, AlignReadyGroups, aligned.Alignment)
	assert.Len(t, aligned.Buckets, 2)
	assert.True(t, launchesLater(aligned, dec.Plan))

	dec = decide(headModel(1000, false))
	assert.Equal(t, ReasonAligned, dec.AlignReason)
	assert.Equal(t, AlignReadyGroups, dec.Plan.Alignment)
	assert.Len(t, dec.Plan.Buckets, 5, "the head and every layer close a bucket each")
}

// TestLaunchCost: bytes times the backward position at which DDP can
// launch each bucket, in bucket order.
func TestLaunchCost(t *testing.T) {
	pl := &Plan{NumPieces: 3, Buckets: []Bucket{{Bytes: 5, Piece: 2}, {Bytes: 7, Piece: 0}, {Bytes: 11, Piece: 1}}}
	hi, lo := launchCost(pl)
	assert.Equal(t, uint64(0), hi)
	assert.Equal(t, uint64(5*0+7*2+11*2), lo, "the third waits for the second")
	huge := &Plan{NumPieces: 3, Buckets: []Bucket{{Bytes: 1 << 62, Piece: 0}, {Bytes: 1 << 62, Piece: 0}}}
	hi, lo = launchCost(huge)
	assert.Equal(t, uint64(1), hi)
	assert.Equal(t, uint64(0), lo)

	// More than 10% later, not a near tie.
	at := func(bytes int64) *Plan { return &Plan{NumPieces: 2, Buckets: []Bucket{{Bytes: bytes, Piece: 0}}} }
	assert.False(t, launchesLater(at(105), at(100)))
	assert.False(t, launchesLater(at(110), at(100)))
	assert.True(t, launchesLater(at(111), at(100)))
	assert.True(t, launchesLater(huge, at(1)))
	assert.False(t, launchesLater(at(1), huge))
}

// TestSeveralKeysWithAnUnusedParameter: a counted parameter no node uses
// is in no aligned bucket, so the plan holds part of DDP's parameters:
// kept whole for CombineForward, which refuses a forward missing one, as
// with one group.
func TestSeveralKeysWithAnUnusedParameter(t *testing.T) {
	b := &graphBuilder{}
	x := b.placeholder("x")
	x = b.call("a", in(x), arg(b.param("a.w", 100)))
	x = b.call("c", in(x), arg(b.param("c.w", 100, dtype(1))))
	b.param("unused", 40, dtype(1))
	b.output(x)
	g := b.graph()
	pl, err := Build(g, Config{AlignBuckets: true, BucketCapBytes: 50, FirstBucketCapBytes: 50})
	require.NoError(t, err)
	assert.Equal(t, AlignReadyGroups, pl.Alignment)
	s := alignedDDP(g, 0, nil)
	s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 50, 50
	dec, err := Decide(&Request{Graph: g, Settings: s})
	require.NoError(t, err)
	assert.Equal(t, ReasonPartOfForward, dec.AlignReason, "part of DDP's parameters: for CombineForward, which refuses it")
	assert.Equal(t, AlignReady, dec.Plan.Alignment, "whole units")
}

// TestSeveralKeysListBucketsAsDDPClosesThem: in a plan cut at blocks one
// unit may hold several pieces; its groups' buckets close at different
// pieces and are listed as DDP closes them, later pieces first, so a plan
// whose buckets are DDP's own is not taken for a later one.
func TestSeveralKeysListBucketsAsDDPClosesThem(t *testing.T) {
	g := layersGraph([]int64{100}, []int64{-100})
	g.BlockIDs = []int32{-1, 0, 1, -1}
	s := alignedDDP(g, 0, nil)
	s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 5000, 5000
	dec, err := Decide(&Request{Graph: g, Settings: s})
	require.NoError(t, err)
	assert.Equal(t, ReasonAligned, dec.AlignReason)
	require.Equal(t, AlignReadyGroups, dec.Plan.Alignment)
	require.Len(t, dec.Plan.Buckets, 2)
	assert.Equal(t, []int{1, 0}, []int{dec.Plan.Buckets[0].Piece, dec.Plan.Buckets[1].Piece})
}
