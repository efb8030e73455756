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
// walking caps from the start and staying at the last; closed buckets in
// closing order, then the open ones.
func ddpWalkOfPieces(g *Graph, ready []int32, caps []int64) [][]int32 {
	type key struct{ dtype, device int32 }
	open := map[key][]int32{}
	size := map[key]int64{}
	pos := map[key]int{}
	var closed [][]int32
	var keys []key
	for _, p := range ready {
		k := key{g.Params[p].DType, g.Params[p].Device}
		if _, seen := pos[k]; !seen {
			pos[k] = 0
			keys = append(keys, k)
		}
		open[k] = append(open[k], p)
		size[k] += g.Params[p].Bytes
		if size[k] >= caps[pos[k]] {
			closed = append(closed, open[k])
			open[k], size[k] = nil, 0
			pos[k] = min(pos[k]+1, len(caps)-1)
		}
	}
	for _, k := range keys {
		if len(open[k]) > 0 {
			closed = append(closed, open[k])
		}
	}
	return closed
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
		capBytes := int64(8 + rng.IntN(120))
		cfg := Config{AlignBuckets: true, BucketCapBytes: capBytes, FirstBucketCapBytes: 1 + rng.Int64N(capBytes)}
		if rng.IntN(3) == 0 {
			cfg.MaxPieces = 2 + rng.IntN(3)
		}
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
			got := ddpWalkOfPieces(g, piecesReady(rng, g, pl), pl.DDPCaps)
			require.Equal(t, sortedSets(want), sortedSets(got), what)
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

// TestSeveralKeysKeepTheirCuts: groups whose runs of each piece hold the
// same bytes keep every cut and close every bucket; a bf16 layer between
// float32 ones whose bucket cannot close against the float32 group's
// first cap keeps its bucket open (DDP launches it last) and every cut.
func TestSeveralKeysKeepTheirCuts(t *testing.T) {
	// layers: per layer, its parameters' bytes, negative for bf16.
	build := func(capBytes int64, layers ...[]int64) (*Plan, *Graph) {
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
		g := b.graph()
		pl, err := Build(g, Config{AlignBuckets: true, BucketCapBytes: capBytes, FirstBucketCapBytes: capBytes})
		require.NoError(t, err)
		return pl, g
	}
	same, _ := build(100, []int64{100, -100}, []int64{100, -100}, []int64{100, -100})
	assert.Equal(t, 3, same.NumPieces)
	assert.Equal(t, AlignReadyGroups, same.Alignment)
	assert.Zero(t, same.MergedCuts)
	assert.Equal(t, []int64{100, 100, 100}, same.DDPCaps)
	assert.Len(t, same.Buckets, 6)

	// The bf16 layer (60 bytes) closes no bucket against cap 0 (the
	// float32 group's first bucket, 100 bytes): it stays open, last.
	block, g := build(50, []int64{100}, []int64{-30, -30}, []int64{100}, []int64{100})
	assert.Equal(t, 4, block.NumPieces)
	assert.Equal(t, AlignReadyGroups, block.Alignment)
	assert.Zero(t, block.MergedCuts)
	assert.Equal(t, []int64{100, 100, 100}, block.DDPCaps)
	last := block.Buckets[len(block.Buckets)-1]
	require.Len(t, last.Params, 2)
	assert.ElementsMatch(t, []string{"l1.bf16.0", "l1.bf16.1"}, []string{g.Params[last.Params[0]].Name, g.Params[last.Params[1]].Name})
	assert.Equal(t, 1, last.Piece)

	// Two bf16 layers whose runs close only in (20, 40] against float32
	// runs that close only in (50, 100]: the bf16 group's first bucket
	// cannot close apart, so the later bf16 layer's run takes in the
	// layers down to the earlier one; as its group's last it may stay
	// open (80 bytes against cap 100), and DDP launches it last.
	merged, g := build(40, []int64{50, 50}, []int64{-20, -20}, []int64{50, 50}, []int64{-20, -20}, []int64{50, 50})
	assert.Equal(t, 5, merged.NumPieces)
	assert.Equal(t, AlignReadyGroups, merged.Alignment)
	assert.Equal(t, 2, merged.MergedCuts)
	assert.Equal(t, []int64{100, 100, 100}, merged.DDPCaps)
	last = merged.Buckets[len(merged.Buckets)-1]
	assert.Len(t, last.Params, 4)
	assert.Equal(t, 1, last.Piece)
	assert.Equal(t, int32(1), g.Params[last.Params[0]].DType)
}

// TestSeveralKeysRefusedInDeclarationOrder: declarationAlign walks one
// group; Build says so, and Decide refuses with ReasonParamGroups.
func TestSeveralKeysRefusedInDeclarationOrder(t *testing.T) {
	b := &graphBuilder{}
	x := b.placeholder("x")
	x = b.call("a", in(x), arg(b.param("a.w", 100)))
	x = b.call("b", in(x), arg(b.param("b.w", 100, dtype(1))))
	b.output(x)
	g := b.graph()
	setDDPPositions(g, countedParams(g))
	_, err := Build(g, Config{AlignBuckets: true, BucketOrder: OrderDeclaration, BucketCapBytes: 50, FirstBucketCapBytes: 50})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "one dtype and device")

	s := alignedDDP(g, 0, func(d *DDPSettings) { d.SeveralParamGroups = true })
	s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 50, 50
	dec, err := Decide(&Request{Graph: g, Settings: s})
	require.NoError(t, err)
	assert.Equal(t, ReasonAligned, dec.AlignReason, "ready order: aligned per group")
	assert.Equal(t, AlignReadyGroups, dec.Plan.Alignment)

	s.DDP.FindUnusedParameters = true
	dec, err = Decide(&Request{Graph: g, Settings: s})
	require.NoError(t, err)
	assert.Equal(t, ReasonParamGroups, dec.AlignReason)

	// A graph that holds part of DDP's parameters: its forward's graphs
	// are combined by one group's rule, so it is refused as well.
	s = alignedDDP(g, 1, func(d *DDPSettings) { d.SeveralParamGroups = true })
	s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 50, 50
	dec, err = Decide(&Request{Graph: g, Settings: s})
	require.NoError(t, err)
	assert.Equal(t, ReasonParamGroups, dec.AlignReason)
}

// countedKeys counts the (dtype, device) groups of the counted parameters
// in use (those DDP's rebuild sees in backward).
func countedKeys(g *Graph) int {
	firstUse, _ := firstUses(g)
	_, keys := groupKeys(g, firstUse)
	return len(keys)
}

// checkSeveralKeys checks an aligned plan of several groups (Note [Several
// dtype groups]): the cuts are those of the plan before the split
// (cutsOf), every bucket holds one group's parameters and names the piece
// whose backward completes it, and DDP's walk with the plan's caps makes
// exactly its buckets (as sets) whatever the order inside each piece.
func checkSeveralKeys(g *Graph, pl *Plan, rng *rand.Rand) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if pl.Alignment != AlignReadyGroups {
		fail("several keys: alignment %v, want %v", pl.Alignment, AlignReadyGroups)
		return bad
	}
	firstUse, _ := firstUses(g)
	var want [][]int32
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
		want = append(want, b.Params)
	}
	// A zero-byte gradient that arrives after its bucket's bytes reached the
	// cap joins a later bucket (Note [Several dtype groups]): compared
	// without them.
	positive := func(buckets [][]int32) [][]int32 {
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
		return out
	}
	for range 4 {
		if got := ddpWalkOfPieces(g, piecesReady(rng, g, pl), pl.DDPCaps); !slices.Equal(sortedSets(positive(got)), sortedSets(positive(want))) {
			fail("several keys: DDP's walk with caps %v makes %v, want %v", pl.DDPCaps, got, want)
			break
		}
	}
	return bad
}
