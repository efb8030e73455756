package planner

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// decodeFuzzRequest turns fuzz bytes into a Decide request: the graph of
// decodeFuzzInput, and from the second half of the bytes the user's
// settings (each cap given or not), sometimes a DDP module (its caps,
// flags, refusal facts and parameter positions, covering the graph's
// counted parameters or not) and sometimes module stacks.
func decodeFuzzRequest(data []byte) *Request {
	g, cfg := decodeFuzzInput(data)
	s := &byteSource{data: data, pos: len(data) / 2}
	set := Settings{
		Mode:         cfg.Mode,
		MaxPieces:    cfg.MaxPieces,
		AlignBuckets: cfg.AlignBuckets,
		Edges:        EdgePolicy(s.intn(3)),
		BlockCuts:    cfg.Mode == ModeDDP && s.chance(220),
	}
	if s.chance(160) {
		set.UserBucketCapBytes = cfg.BucketCapBytes
	}
	if s.chance(128) {
		set.UserFirstBucketCapBytes = cfg.FirstBucketCapBytes
	}
	if s.chance(64) {
		set.UserBucketCapsBytes = cfg.BucketCapsBytes
	}
	if s.chance(170) {
		d := &DDPSettings{
			BucketCapBytes:       int64(1 + s.intn(400)),
			CapIsDefault:         s.chance(64),
			FirstBucketCapBytes:  CapNotGiven,
			FindUnusedParameters: s.chance(100),
			StaticGraph:          s.chance(40),
			NoPerBucketCaps:      s.chance(12),
			PythonReducer:        s.chance(12),
			MixedPrecision:       s.chance(12),
			BuiltinCommHook:      s.chance(12),
		}
		if s.chance(100) {
			d.FirstBucketCapBytes = int64(1 + s.intn(300))
		}
		for range s.intn(3) {
			d.BucketCapsBytes = append(d.BucketCapsBytes, int64(1+s.intn(300)))
		}
		if validateGraph(g) == nil {
			counted := countedParams(g)
			rand.New(rand.NewPCG(uint64(s.next()), 1)).Shuffle(len(counted), func(i, j int) { counted[i], counted[j] = counted[j], counted[i] })
			setDDPPositions(g, counted)
			d.NumParams = len(counted) + s.intn(2) // one more: a parameter the graph lacks
			if len(counted) > 0 && s.chance(20) {
				g.Params[counted[0]].DDPPosition = -1 // a parameter that is not DDP's
			}
		}
		set.DDP = d
	} else {
		set.BucketOrder = cfg.BucketOrder
	}
	var stacks *ModuleStacks
	if s.chance(160) && validateGraph(g) == nil && len(g.Ops) > 0 {
		g.BlockIDs = nil
		stacks = stacksOf(randomStacks(s, g), s.chance(128))
		if s.chance(80) { // checkpoint calls weighing their bodies (Note [Node weights])
			stacks.Weights = make([]int32, len(g.Ops))
			for i := range stacks.Weights {
				stacks.Weights[i] = int32(s.intn(4)) // 0 too: a node inside a checkpoint body
			}
		}
	}
	if s.chance(160) && validateGraph(g) == nil { // node costs (Note [Edge costs])
		g.NodeFlops, g.NodeBytes = make([]int64, len(g.Ops)), make([]int64, len(g.Ops))
		for i := range g.Ops {
			g.NodeFlops[i] = int64(s.intn(1 << 20))
			g.NodeBytes[i] = int64(s.intn(1 << 16))
		}
	}
	return &Request{Graph: g, Stacks: stacks, Settings: set}
}

// checkDecide checks Decide's invariants on one request.
func checkDecide(t *testing.T, req *Request) {
	dec, err := Decide(req)
	if err != nil {
		var perr *Error
		require.ErrorAs(t, err, &perr, "Decide fails with an *Error")
		return
	}
	again, err := Decide(req)
	require.NoError(t, err)
	require.Equal(t, dec, again, "deterministic")

	pl, cfg, s := dec.Plan, dec.Config, &req.Settings
	g := *req.Graph
	g.BlockIDs = dec.BlockIDs
	if g.BlockIDs == nil {
		g.BlockIDs = req.Graph.BlockIDs
	}
	require.Equal(t, len(countedParams(&g)), dec.CountedParams, "counted parameters")
	if dec.AlignReason == ReasonNoParams {
		require.Zero(t, dec.CountedParams)
		require.LessOrEqual(t, pl.NumPieces, 1)
		require.Empty(t, pl.Buckets)
		require.Empty(t, dec.EagerPieces)
		return
	}
	require.LessOrEqual(t, cfg.FirstBucketCapBytes, cfg.BucketCapBytes, "first cap <= cap")
	for k, c := range pl.DDPCaps {
		require.GreaterOrEqual(t, c, int64(1), "DDP cap %d", k)
	}
	if dec.AlignReason == ReasonAligned {
		require.True(t, cfg.AlignBuckets)
		require.True(t, s.AlignBuckets)
		if d := s.DDP; d != nil {
			require.Equal(t, ReasonAligned, d.refusal(), "aligned despite a refusal")
			if d.NumParams > 0 {
				var positions []int
				for _, b := range pl.Buckets {
					for _, p := range b.Params {
						positions = append(positions, int(g.Params[p].DDPPosition))
					}
				}
				slices.Sort(positions)
				want := make([]int, d.NumParams)
				for k := range want {
					want[k] = k
				}
				require.Equal(t, want, positions, "aligned implies covered: the buckets hold exactly DDP's parameters")
			}
		}
	} else {
		require.False(t, cfg.AlignBuckets)
		if dec.AlignReason != ReasonPartOfForward { // its caps go to CombineForward, not to DDP
			require.Empty(t, pl.DDPCaps)
		}
		if d := s.DDP; d != nil && s.AlignBuckets && d.refusal() != ReasonAligned {
			require.Equal(t, d.refusal(), dec.AlignReason, "the first refusal")
		}
	}
	if s.DDP != nil {
		require.Equal(t, s.DDP.bucketOrder(), dec.DDPBucketOrder)
	}

	// Eager pieces: a subset of the pieces, ascending, none inside the
	// block span, and what the naive reference picks.
	require.True(t, slices.IsSorted(dec.EagerPieces))
	require.Equal(t, len(slices.Compact(slices.Clone(dec.EagerPieces))), len(dec.EagerPieces))
	for _, p := range dec.EagerPieces {
		require.True(t, p >= 0 && int(p) < pl.NumPieces, "eager piece %d of %d", p, pl.NumPieces)
	}
	first, last := blockSpan(&g)
	for i, p := range pl.NodePiece {
		if first <= i && i <= last && p >= 0 {
			require.NotContains(t, dec.EagerPieces, p, "eager piece %d holds node %d inside the block span [%d, %d]", p, i, first, last)
		}
	}
	require.Equal(t, naiveEagerPieces(&g, pl, s.Edges), dec.EagerPieces, "eager pieces")

	// Piece parameters: the naive reference.
	ref := referencePieceParams(&g, pl, cfg.Mode)
	got := slices.Clone(dec.PieceParams)
	for _, lists := range [][][]int32{ref, got} {
		for p := range lists {
			if len(lists[p]) == 0 {
				lists[p] = nil
			}
		}
	}
	require.Equal(t, ref, got, "piece parameters")
}

// blockSpan is the first and last compute node in a block, or (-1, -2).
func blockSpan(g *Graph) (first, last int) {
	first, last = -1, -2
	if g.BlockIDs == nil {
		return
	}
	for i, op := range g.Ops {
		if isCompute(op) && g.BlockIDs[i] >= 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	return
}

// naiveEagerPieces is Note [Edges] written from its words: a piece whose
// compute nodes all lie outside the block span is an edge; EdgesEager runs
// every edge eagerly, EdgesAuto those that naiveEagerAuto (Note [Edge
// costs]) picks, none without costs.
func naiveEagerPieces(g *Graph, pl *Plan, policy EdgePolicy) []int32 {
	first, last := blockSpan(g)
	switch {
	case policy == EdgesCompile || first < 0:
		return nil
	case policy == EdgesAuto && g.NodeFlops == nil:
		return nil
	case policy == EdgesAuto:
		return naiveEagerAuto(g, pl.NodePiece, pl.NumPieces)
	}
	var out []int32
	for p := range pl.NumPieces {
		edge, compute := true, false
		for i, q := range pl.NodePiece {
			if int(q) == p && isCompute(g.Ops[i]) {
				compute = true
				edge = edge && (i < first || i > last)
			}
		}
		if edge && compute {
			out = append(out, int32(p))
		}
	}
	return out
}

func TestRandomDecisions(t *testing.T) {
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(6060, 11)), 3000, 400, func(data []byte) {
		checkDecide(t, decodeFuzzRequest(data))
	})
}

func FuzzDecide(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0x02, 8, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 200, 9, 9, 9, 9, 9, 9, 9, 9, 9})
	f.Add([]byte{0x00, 8, 200, 100, 50, 30, 255, 7, 3, 39, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1, 1, 1, 1, 1, 0, 0, 0})
	addRandomSeeds(f, rand.New(rand.NewPCG(3, 4)))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecide(t, decodeFuzzRequest(data))
	})
}
