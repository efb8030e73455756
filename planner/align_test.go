package planner

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// firstUsePieces returns, per piece, the set of counted parameters whose
// first use by a compute node lies in it, found by scanning the nodes
// forward.
func firstUsePieces(g *Graph, pl *Plan) []map[int32]bool {
	sets := make([]map[int32]bool, pl.NumPieces)
	for q := range sets {
		sets[q] = map[int32]bool{}
	}
	seen := map[int32]bool{}
	for i, op := range g.Ops {
		if !isCompute(op) {
			continue
		}
		for _, p := range g.ParamIndex[g.ParamOffsets[i]:g.ParamOffsets[i+1]] {
			if !seen[p] && g.Params[p].RequiresGrad && !g.Params[p].Ignored {
				seen[p] = true
				sets[pl.NodePiece[i]][p] = true
			}
		}
	}
	return sets
}

// checkAlignedByHand checks the two properties goddp relies on for an
// aligned plan: bucket k holds exactly the parameters first used in piece
// N-1-k, and DDP's rebuild with the buckets' bytes as per-bucket caps gives
// those buckets back, however each piece's gradients are ordered.
func checkAlignedByHand(t *testing.T, g *Graph, pl *Plan, rng *rand.Rand) {
	t.Helper()
	pieces := firstUsePieces(g, pl)
	var nonEmpty int
	for _, s := range pieces {
		if len(s) > 0 {
			nonEmpty++
		}
	}
	if len(pl.Buckets) != nonEmpty {
		t.Fatalf("%d buckets, %d pieces of which %d hold counted parameters", len(pl.Buckets), pl.NumPieces, nonEmpty)
	}
	for k, b := range pl.Buckets {
		q := pl.NumPieces - 1 - k
		got := map[int32]bool{}
		for _, p := range b.Params {
			got[p] = true
		}
		if len(got) != len(b.Params) || len(got) != len(pieces[q]) {
			t.Fatalf("bucket %d lists %v; piece %d first uses %v", k, b.Params, q, pieces[q])
		}
		for p := range got {
			if !pieces[q][p] {
				t.Fatalf("bucket %d lists parameter %d, not first used in piece %d", k, p, q)
			}
		}
	}
	for _, v := range checkRebuildFollowsPieces(g, pl, rng, 20) {
		t.Error(v)
	}
}

func TestAlignedGoldenPlansByHand(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range planCases {
		if !tc.cfg.AlignBuckets {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			g := tc.model().graph()
			pl, err := Build(g, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			checkAlignedByHand(t, g, pl, rng)
		})
	}
}

// TestAlignedRandomPlansByHand runs the same checks over random graphs with
// one (dtype, device) key, caps, per-bucket caps and MaxPieces from the
// fuzz decoder.
func TestAlignedRandomPlansByHand(t *testing.T) {
	rng := rand.New(rand.NewPCG(99, 5))
	forRandomFuzzInputs(t, rng, 1500, 300, func(data []byte) {
		data[0] = 0x02 // ModeDDP, AlignBuckets, one key, no corruption
		g, cfg := decodeFuzzInput(data)
		pl, err := Build(g, cfg)
		if err != nil {
			t.Fatalf("input %x: %v", data, err)
		}
		checkAlignedByHand(t, g, pl, rng)
	})
}

// TestAlignedNoCountedParameters: a single piece without counted
// parameters (here all frozen or ignored) gets no bucket, and a graph
// without compute nodes has neither pieces nor buckets.
func TestAlignedNoCountedParameters(t *testing.T) {
	b := &graphBuilder{}
	w := b.param("fc.weight", 100, frozen)
	v := b.param("fc.bias", 10, ignored)
	x := b.placeholder("x")
	lin := b.call("linear", in(x), arg(w), arg(v))
	b.output(b.call("relu", in(lin)))
	cfg := alignedCfg(ddpCfg(50, 50))
	for name, g := range map[string]*Graph{"frozen": b.graph(), "no compute": noComputeModel().graph()} {
		pl, err := Build(g, cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wantPieces := 1
		if name == "no compute" {
			wantPieces = 0
		}
		if pl.NumPieces != wantPieces || len(pl.Buckets) != 0 {
			t.Errorf("%s: %d pieces, %d buckets; want %d, 0", name, pl.NumPieces, len(pl.Buckets), wantPieces)
		}
		for _, v := range checkPlan(g, cfg, pl) {
			t.Errorf("%s: %s", name, v)
		}
	}
}

// TestAlignedMixedKeysNeedTheirOwnCaps shows why several (dtype, device)
// keys need caps of their own (Note [Several dtype groups]): with per-piece
// byte totals as caps, DDP's per-key cap iterators build buckets that do
// not follow the pieces; the plan's per-group caps do.
func TestAlignedMixedKeysNeedTheirOwnCaps(t *testing.T) {
	g := mixedDTypeModel().graph()
	cfg := ddpCfg(3000, 1000)
	pl, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// What AlignBuckets would produce if it ignored the keys.
	pieces := firstUsePieces(g, pl)
	_, order := referenceReadyOrder(g)
	var caps []int64
	for q := pl.NumPieces - 1; q >= 0; q-- {
		var sum int64
		for p := range pieces[q] {
			sum += g.Params[p].Bytes
		}
		caps = append(caps, sum)
	}
	got := simulateRebuild(g, order, caps)
	aligned := len(got) == pl.NumPieces
	for k := 0; aligned && k < len(got); k++ {
		for _, p := range got[k] {
			aligned = aligned && pieces[pl.NumPieces-1-k][p]
		}
	}
	if aligned {
		t.Fatalf("DDP's buckets %v follow the pieces with caps %v; the key check would be needless", got, caps)
	}
	split, err := Build(g, alignedCfg(cfg))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range checkSeveralKeys(g, split, rand.New(rand.NewPCG(1, 2))) {
		t.Error(v)
	}
}

// TestAlignedZeroByteParameters pins the documented limit: a zero-byte
// gradient that DDP sees after its piece's bytes reached the cap joins the
// next DDP bucket, and a piece of zero-byte parameters only has a cap of 0.
func TestAlignedZeroByteParameters(t *testing.T) {
	b := &graphBuilder{}
	w1 := b.param("fc1.weight", 100)
	w2 := b.param("fc2.weight", 100)
	b2 := b.param("fc2.bias", 0)
	z := b.param("fc0.weight", 0)
	x := b.placeholder("x")
	l0 := b.call("linear0", in(x), arg(z))
	l1 := b.call("linear1", in(l0), arg(w1))
	l2 := b.call("linear2", in(l1), arg(w2), arg(b2))
	b.output(l2)
	g := b.graph()
	cfg := alignedCfg(ddpCfg(100, 100))
	pl, err := Build(g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range checkPlan(g, cfg, pl) {
		t.Error(v)
	}
	wantPieces(t, b, pl, 3, map[string]int32{"linear0": 0, "linear1": 1, "linear2": 2})
	wantBucket(t, b, pl, 0, 100, 2, false, "fc2.bias", "fc2.weight")
	wantBucket(t, b, pl, 1, 100, 1, false, "fc1.weight")
	wantBucket(t, b, pl, 2, 0, 0, false, "fc0.weight")

	caps := []int64{100, 100, 0}
	// As predicted (bias first), DDP's buckets are the aligned ones.
	if got := simulateRebuild(g, []int32{b2, w2, w1, z}, caps); !slices.EqualFunc(got, [][]int32{{b2, w2}, {w1}, {z}}, slices.Equal) {
		t.Errorf("predicted order: DDP buckets %v", got)
	}
	// Weight first: the zero-byte bias arrives after piece 2's bucket closed.
	if got := simulateRebuild(g, []int32{w2, b2, w1, z}, caps); !slices.EqualFunc(got, [][]int32{{w2}, {b2, w1}, {z}}, slices.Equal) {
		t.Errorf("weight first: DDP buckets %v", got)
	}
}
