package planner

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// gptModel builds the graph Dynamo captures for a small GPT (tests/python/
// models.py's transformer and bench/models.py's GPTLike): token and position
// embeddings, `layers` pre-LN blocks, a final LayerNorm and a head tied to
// the token embedding. d is the model width; parameters are fp32. It
// returns the builder and, per node, its block (the layer index or -1), as
// the Python side derives it from nn_module_stack.
func gptModel(layers int, d int64) (*graphBuilder, []int32) {
	b := &graphBuilder{}
	var blocks []int32
	block := int32(-1)
	node := func(name string, inputs []int, refs ...paramRef) int {
		blocks = append(blocks, block)
		return b.call(name, inputs, refs...)
	}
	placeholder := func(name string) int {
		blocks = append(blocks, -1)
		return b.placeholder(name)
	}
	weight := func(name string, bytes int64) (int32, int) {
		return b.param(name, bytes), placeholder("l_" + name)
	}
	const vocab, ctx = 16, 4
	idx := placeholder("idx")
	wte, pWte := weight("wte.weight", vocab*d*f32)
	wpe, pWpe := weight("wpe.weight", ctx*d*f32)
	type blockParams struct {
		p [12]int32
		h [12]int
	}
	names := []string{"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
		"ln2.weight", "ln2.bias", "fc.weight", "fc.bias", "out.weight", "out.bias"}
	sizes := []int64{d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d}
	bps := make([]blockParams, layers)
	for l := range bps {
		for k, nm := range names {
			bps[l].p[k], bps[l].h[k] = weight(fmt.Sprintf("blocks.%d.%s", l, nm), sizes[k]*f32)
		}
	}
	lnfW, pLnfW := weight("ln_f.weight", d*f32)
	lnfB, pLnfB := weight("ln_f.bias", d*f32)

	tok := node("embedding", in(idx, pWte), arg(wte))
	pos := node("arange", nil)
	pe := node("embedding_1", in(pos, pWpe), arg(wpe))
	x := node("add", in(tok, pe))
	for l, bp := range bps {
		block = int32(l)
		s := fmt.Sprintf("_%d", l)
		ln1 := node("ln1"+s, in(x, bp.h[0], bp.h[1]), arg(bp.p[0]), arg(bp.p[1]))
		qkv := node("qkv"+s, in(ln1, bp.h[2], bp.h[3]), arg(bp.p[2]), arg(bp.p[3]))
		split := node("split"+s, in(qkv))
		sdpa := node("sdpa"+s, in(split))
		proj := node("proj"+s, in(sdpa, bp.h[4], bp.h[5]), arg(bp.p[4]), arg(bp.p[5]))
		x1 := node("add_a"+s, in(x, proj))
		ln2 := node("ln2"+s, in(x1, bp.h[6], bp.h[7]), arg(bp.p[6]), arg(bp.p[7]))
		fc := node("fc"+s, in(ln2, bp.h[8], bp.h[9]), arg(bp.p[8]), arg(bp.p[9]))
		gelu := node("gelu"+s, in(fc))
		out := node("out"+s, in(gelu, bp.h[10], bp.h[11]), arg(bp.p[10]), arg(bp.p[11]))
		x = node("add_b"+s, in(x1, out))
	}
	block = -1
	lnf := node("ln_f", in(x, pLnfW, pLnfB), arg(lnfW), arg(lnfB))
	head := node("head", in(lnf, pWte), arg(wte))
	blocks = append(blocks, -1)
	b.output(head)
	return b, blocks
}

// gptBlockBytes is the bytes of one gptModel block of width d.
func gptBlockBytes(d int64) int64 { return (12*d*d + 13*d) * f32 }

type blockCase struct {
	name   string
	layers int
	cfg    Config
	check  func(t *testing.T, b *graphBuilder, pl *Plan)
}

// With d = 8 a block holds 3488 bytes, the token embedding 512, the
// position embedding 128 and ln_f 64.
var blockCases = []blockCase{
	{
		// Caps of about two blocks: pieces are the preamble, one per block
		// and the tail; buckets group two blocks each (6976 bytes is 24
		// short of the cap, a third block would be 3464 over), the tail
		// alone against the 100-byte first cap (64 bytes, nearer than 3552).
		name: "blocks_gpt_aligned_ddp", layers: 4, cfg: alignedCfg(ddpCfg(7000, 100)),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 6, map[string]int32{"embedding": 0, "add": 0, "ln1_0": 1, "add_b_0": 1,
				"ln1_1": 2, "ln1_3": 4, "add_b_3": 4, "ln_f": 5, "head": 5})
			wantBucketCount(t, pl, 4)
			for k, want := range []struct {
				bytes int64
				piece int
			}{{64, 5}, {6976, 3}, {6976, 1}, {640, 0}} {
				if bk := pl.Buckets[k]; bk.Bytes != want.bytes || bk.Piece != want.piece {
					t.Errorf("bucket %d = %d bytes piece %d, want %d bytes piece %d", k, bk.Bytes, bk.Piece, want.bytes, want.piece)
				}
			}
		},
	},
	{
		// The same cuts; DDP's own predicted buckets, re-assigned to the
		// pieces that complete them.
		name: "blocks_gpt_unaligned_ddp", layers: 4, cfg: ddpCfg(7000, 100),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 6, map[string]int32{"embedding": 0, "ln1_0": 1, "ln_f": 5})
		},
	},
	{
		// Blocks larger than the cap: one bucket per block, never split.
		name: "blocks_larger_than_cap_ddp", layers: 3, cfg: alignedCfg(ddpCfg(1000, 1000)),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 5, map[string]int32{"add": 0, "ln1_0": 1, "ln1_2": 3, "head": 4})
			wantBucketCount(t, pl, 5)
			for k, want := range []int64{64, 3488, 3488, 3488, 640} {
				if pl.Buckets[k].Bytes != want || pl.Buckets[k].Piece != 4-k {
					t.Errorf("bucket %d = %d bytes piece %d, want %d piece %d", k, pl.Buckets[k].Bytes, pl.Buckets[k].Piece, want, 4-k)
				}
			}
		},
	},
	{
		// A cap larger than the model: one bucket, the cuts stay.
		name: "blocks_one_bucket_ddp", layers: 2, cfg: alignedCfg(ddpCfg(1<<20, 1<<20)),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 4, nil)
			wantBucketCount(t, pl, 1)
			if bk := pl.Buckets[0]; bk.Bytes != 2*3488+640+64 || bk.Piece != 0 || len(bk.Params) != 2*12+4 {
				t.Errorf("bucket 0 = %d bytes piece %d, %d params; want the whole model in piece 0", bk.Bytes, bk.Piece, len(bk.Params))
			}
		},
	},
	{
		// MaxPieces still bounds the pieces.
		name: "blocks_max_pieces_ddp", layers: 4, cfg: Config{Mode: ModeDDP, BucketCapBytes: 7000, FirstBucketCapBytes: 100, MaxPieces: 3, AlignBuckets: true},
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, nil)
		},
	},
}

func TestBlockPlanGolden(t *testing.T) {
	for _, tc := range blockCases {
		t.Run(tc.name, func(t *testing.T) {
			b, blocks := gptModel(tc.layers, 8)
			g := b.graph()
			g.BlockIDs = blocks
			pl, err := Build(g, tc.cfg)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			for _, v := range checkPlan(g, tc.cfg, pl) {
				t.Error(v)
			}
			tc.check(t, b, pl)
			checkGolden(t, tc.name, render(g, b.names, tc.cfg, pl))
		})
	}
}

// Without repeated blocks (no ids, all -1, or a single block) the plan is
// byte-driven ModeDDP's, cut for cut and bucket for bucket.
func TestBlocksAbsentChangeNothing(t *testing.T) {
	for _, cfg := range []Config{ddpCfg(7000, 100), alignedCfg(ddpCfg(7000, 100)), torchCfg(7000, 100)} {
		b, blocks := gptModel(4, 8)
		plain, err := Build(b.graph(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		none := slices.Repeat([]int32{-1}, len(blocks))
		one := slices.Clone(blocks)
		for i, id := range one {
			if id > 0 {
				one[i] = 0 // every layer tagged as the same block: one run
			}
		}
		for name, ids := range map[string][]int32{"none": none, "one run": one} {
			g := b.graph()
			g.BlockIDs = ids
			pl, err := Build(g, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pl.NodePiece, plain.NodePiece) || !reflect.DeepEqual(pl.Buckets, plain.Buckets) {
				t.Errorf("mode %d align %t, block ids %s: plan differs from the plan without block ids", cfg.Mode, cfg.AlignBuckets, name)
			}
		}
	}
	// torch mode ignores blocks altogether.
	b, blocks := gptModel(4, 8)
	g := b.graph()
	plain, _ := Build(g, torchCfg(7000, 100))
	g.BlockIDs = blocks
	pl, err := Build(g, torchCfg(7000, 100))
	if err != nil || !slices.Equal(pl.NodePiece, plain.NodePiece) || !reflect.DeepEqual(pl.Buckets, plain.Buckets) {
		t.Errorf("torch mode plan changed with block ids (err %v)", err)
	}
}

// Every block piece of the GPT is the same run of node kinds, at every depth
// and cap: the property the Python side turns into one compile.
func TestBlockPiecesAlignWithLayers(t *testing.T) {
	for _, layers := range []int{2, 5, 16} {
		for _, capBytes := range []int64{100, 3488, 10000, 1 << 30} {
			b, blocks := gptModel(layers, 8)
			g := b.graph()
			g.BlockIDs = blocks
			pl, err := Build(g, alignedCfg(ddpCfg(capBytes, min(capBytes, 1000))))
			if err != nil {
				t.Fatal(err)
			}
			if pl.NumPieces != layers+2 {
				t.Fatalf("%d layers, cap %d: %d pieces, want %d", layers, capBytes, pl.NumPieces, layers+2)
			}
			for i, id := range blocks {
				if id >= 0 && pl.NodePiece[i] != id+1 {
					t.Fatalf("%d layers, cap %d: node %s of block %d in piece %d", layers, capBytes, b.names[i], id, pl.NodePiece[i])
				}
			}
			for _, v := range checkPlan(g, alignedCfg(ddpCfg(capBytes, min(capBytes, 1000))), pl) {
				t.Error(v)
			}
		}
	}
}

// The tolerance of groupPieces, over random piece sizes and caps: a closed
// bucket of several pieces misses its cap by at most half its boundary
// piece; a one-piece bucket below its cap is the last one.
func TestGroupPiecesTolerance(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		sizes := make([]int64, 1+rng.IntN(12))
		for k := range sizes {
			if rng.IntN(5) > 0 {
				sizes[k] = int64(rng.IntN(100))
			}
		}
		caps := []int64{int64(1 + rng.IntN(150)), int64(1 + rng.IntN(300))}
		got := groupPieces(sizes, caps)
		if want := referenceGroups(sizes, caps); !reflect.DeepEqual(got, want) {
			t.Fatalf("groupPieces(%v, %v) = %v, reference %v", sizes, caps, got, want)
		}
		next := len(sizes) - 1
		for k, grp := range got {
			if grp.last != next || grp.first > grp.last {
				t.Fatalf("groups %v of %v do not tile the pieces in DDP order", got, sizes)
			}
			next = grp.first - 1
			limit := caps[min(k, len(caps)-1)]
			var sum int64
			positive := 0
			for p := grp.first; p <= grp.last; p++ {
				sum += sizes[p]
				if sizes[p] > 0 {
					positive++
				}
			}
			if k == len(got)-1 {
				continue // what remains
			}
			boundary := sizes[grp.first] // over: its last piece; under: the next one
			if sum < limit {
				boundary = sizes[grp.first-1]
				for p := grp.first - 1; boundary == 0 && p > 0; p-- {
					boundary = sizes[p-1]
				}
			}
			if positive >= 2 && 2*abs(sum-limit) > boundary {
				t.Fatalf("groups %v of %v, caps %v: bucket %d has %d bytes, more than half of %d from cap %d", got, sizes, caps, k, sum, boundary, limit)
			}
		}
		if next != -1 {
			t.Fatalf("groups %v of %v leave pieces 0..%d out", got, sizes, next)
		}
	}
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// referenceGroups is a naive statement of the grouping rule: from the start
// of each bucket (in DDP order), find the first piece at which the running
// sum reaches the cap; close there, or just before it when that is strictly
// nearer to the cap and the bucket then holds bytes. Pieces left at the end
// form the last bucket, or join the one before when they hold no bytes.
func referenceGroups(sizes []int64, caps []int64) []pieceGroup {
	var groups []pieceGroup
	start := len(sizes) - 1
	for start >= 0 {
		limit := caps[min(len(groups), len(caps)-1)]
		var sum int64
		reach := -1
		for p := start; p >= 0; p-- {
			if sum+sizes[p] >= limit && sizes[p] > 0 {
				reach = p
				break
			}
			sum += sizes[p]
		}
		if reach < 0 {
			if sum == 0 && len(groups) > 0 {
				groups[len(groups)-1].first = 0
			} else {
				groups = append(groups, pieceGroup{first: 0, last: start})
			}
			break
		}
		under, over := limit-sum, sum+sizes[reach]-limit
		end := reach
		if sum > 0 && under < over {
			end = reach + 1
		}
		groups = append(groups, pieceGroup{first: end, last: start})
		start = end - 1
	}
	return groups
}

// referenceBlockCuts states the cut rule naively: a piece starts at every
// compute node whose block id is set and differs from the last set id
// before it (unless no compute node precedes it), and at the first compute
// node after the last one with a block id; then, forward-first, a cut whose
// piece has no node used at or after the cut is dropped, and last-first, a
// final piece that the output does not read joins the one before.
func referenceBlockCuts(g *Graph) []int {
	var cuts []int
	last := int32(-1)
	seenCompute := false
	lastBlockNode := -1
	for i, op := range g.Ops {
		if op == OpPlaceholder || op == OpOutput {
			continue
		}
		if id := g.BlockIDs[i]; id >= 0 {
			if id != last && seenCompute {
				cuts = append(cuts, i)
			}
			last = id
			lastBlockNode = i
		}
		seenCompute = true
	}
	for i := lastBlockNode + 1; lastBlockNode >= 0 && i < len(g.Ops); i++ {
		if g.Ops[i] != OpPlaceholder && g.Ops[i] != OpOutput {
			cuts = append(cuts, i)
			break
		}
	}
	usedFrom := func(lo, hi, at int) bool { // a compute node in [lo, hi) read at or after node at
		for i := lo; i < hi; i++ {
			if g.Ops[i] == OpPlaceholder || g.Ops[i] == OpOutput {
				continue
			}
			for _, u := range g.Users[g.UserOffsets[i]:g.UserOffsets[i+1]] {
				if int(u) >= at {
					return true
				}
			}
		}
		return false
	}
	var kept []int
	start := 0
	for _, c := range cuts {
		if usedFrom(start, c, c) {
			kept = append(kept, c)
			start = c
		}
	}
	for len(kept) > 0 && !usedFrom(kept[len(kept)-1], len(g.Ops), len(g.Ops)-1) {
		kept = kept[:len(kept)-1]
	}
	return kept
}

// countBlockRuns counts block runs naively (see referenceBlockCuts).
func countBlockRuns(g *Graph) int {
	if g.BlockIDs == nil {
		return 0
	}
	runs, last := 0, int32(-1)
	for i, op := range g.Ops {
		if id := g.BlockIDs[i]; op != OpPlaceholder && op != OpOutput && id >= 0 && id != last {
			runs++
			last = id
		}
	}
	return runs
}

// checkBlocks checks a ModeDDP plan of a graph with at least two block runs
// against the naive references: the cuts (a subset of them under
// MaxPieces), and the buckets (the predicted DDP buckets re-assigned to
// pieces, or the naive grouping of pieces when aligned, which DDP's rebuild
// must then reproduce).
func checkBlocks(g *Graph, cfg Config, pl *Plan) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	cuts := referenceBlockCuts(g)
	var got []int
	for i := 1; i < len(g.Ops); i++ {
		if q := pl.NodePiece[i]; q >= 0 && q != slices.Max(append([]int32{0}, pl.NodePiece[:i]...)) {
			got = append(got, i)
		}
	}
	if cfg.MaxPieces == 0 && !slices.Equal(got, cuts) {
		fail("blocks: cuts at %v, reference %v", got, cuts)
	}
	for _, c := range got {
		if !slices.Contains(cuts, c) {
			fail("blocks: cut at %d is not a reference cut %v", c, cuts)
		}
	}
	if cfg.AlignBuckets && countedKeys(g) > 1 {
		return append(bad, checkSeveralKeys(g, pl, rand.New(rand.NewPCG(pl.Fingerprint, 4)))...)
	}
	firstUse, order := referenceReadyOrder(g)
	if !cfg.AlignBuckets {
		_, ref := referenceDDP(g, cfg)
		if len(ref) != len(pl.Buckets) {
			fail("blocks: %d buckets, reference %d", len(pl.Buckets), len(ref))
			return bad
		}
		for k, r := range ref {
			b := pl.Buckets[k]
			if !slices.Equal(b.Params, r.params) || b.Bytes != r.bytes || b.Extended ||
				b.Piece != int(pl.NodePiece[b.NodeBegin]) {
				fail("blocks: bucket %d = %+v, reference %v %d bytes", k, b, r.params, r.bytes)
			}
		}
		return bad
	}
	sizes := make([]int64, pl.NumPieces)
	for p, i := range firstUse {
		sizes[pl.NodePiece[i]] += g.Params[p].Bytes
	}
	caps := cfg.BucketCapsBytes
	if len(caps) == 0 {
		caps = []int64{cfg.FirstBucketCapBytes, cfg.BucketCapBytes}
	}
	var want []Bucket
	for _, grp := range referenceGroups(sizes, caps) {
		w := Bucket{Piece: grp.first, NodeBegin: len(g.Ops)}
		for _, p := range order {
			if q := int(pl.NodePiece[firstUse[p]]); q >= grp.first && q <= grp.last {
				if len(w.Params) == 0 {
					w.DType, w.Device = g.Params[p].DType, g.Params[p].Device
				}
				w.Params = append(w.Params, p)
				w.Bytes += g.Params[p].Bytes
				w.NodeBegin, w.NodeEnd = min(w.NodeBegin, firstUse[p]), max(w.NodeEnd, firstUse[p]+1)
			}
		}
		if len(w.Params) > 0 {
			w.Params = slices.Clip(w.Params)
			want = append(want, w)
		}
	}
	if !reflect.DeepEqual(pl.Buckets, want) && !(len(pl.Buckets) == 0 && len(want) == 0) {
		fail("blocks: aligned buckets %+v, reference %+v", pl.Buckets, want)
		return bad
	}
	rng := rand.New(rand.NewPCG(pl.Fingerprint, 2))
	return append(bad, checkRebuildFollowsPieces(g, pl, rng, 6)...)
}

// withRandomBlocks gives g block ids: runs of consecutive nodes (placeholders
// included, which the planner must skip) tagged with a block, a few left
// untagged, ids sometimes repeating.
func withRandomBlocks(g *Graph, rng *rand.Rand) {
	g.BlockIDs = make([]int32, len(g.Ops))
	id := int32(-1)
	for i := range g.BlockIDs {
		if rng.IntN(4) == 0 {
			switch rng.IntN(5) {
			case 0:
				id = -1
			case 1:
				id = int32(rng.IntN(3))
			default:
				id++
			}
		}
		g.BlockIDs[i] = id
		if rng.IntN(10) == 0 {
			g.BlockIDs[i] = -1
		}
	}
}

// TestRandomBlockPlans plans the fuzz decoder's random graphs with random
// block ids and checks every plan (checkPlan dispatches to checkBlocks).
func TestRandomBlockPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(77, 11))
	forRandomFuzzInputs(t, rand.New(rand.NewPCG(5150, 9)), 3000, 400, func(data []byte) {
		g, cfg := decodeFuzzInput(data)
		if len(g.BlockIDs) == 0 && len(g.Ops) > 0 {
			withRandomBlocks(g, rng)
		}
		checkBuild(t, g, cfg)
	})
}

func FuzzBlockPlan(f *testing.F) {
	f.Add([]byte{0x00, 8, 100, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, uint64(1))
	f.Add([]byte{0x02, 8, 200, 100, 50, 30, 255, 7, 3, 39, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9}, uint64(2))
	f.Fuzz(func(t *testing.T, data []byte, seed uint64) {
		g, cfg := decodeFuzzInput(data)
		if len(g.Ops) > 0 && len(g.BlockIDs) == 0 {
			withRandomBlocks(g, rand.New(rand.NewPCG(seed, 1)))
		}
		checkBuild(t, g, cfg)
	})
}

func TestBlockIDsValidated(t *testing.T) {
	b, blocks := gptModel(2, 8)
	for name, ids := range map[string][]int32{"short": blocks[1:], "below -1": append(slices.Clone(blocks[:len(blocks)-1]), -2)} {
		g := b.graph()
		g.BlockIDs = ids
		_, err := Build(g, ddpCfg(7000, 100))
		var perr *Error
		if !errors.As(err, &perr) || perr.Code != ErrInvalidGraph || !strings.Contains(perr.Msg, "block id") && !strings.Contains(perr.Msg, "BlockIDs") {
			t.Errorf("%s block ids: error %v, want ErrInvalidGraph naming the block ids", name, err)
		}
	}
}

// TestBlockPlanCapsForDDP: an aligned block plan hands DDP its buckets'
// byte totals as caps (AlignReady), the same as the byte-driven walk does,
// and under declaration order, where DDP never rebuilds, the plan is the
// byte-driven one that declorder.go aligns rather than the block grouping.
func TestBlockPlanCapsForDDP(t *testing.T) {
	b, blocks := gptModel(4, 8)
	g := b.graph()
	g.BlockIDs = blocks
	cfg := alignedCfg(ddpCfg(7000, 100))
	pl, err := Build(g, cfg)
	require.NoError(t, err)
	require.Equal(t, AlignReady, pl.Alignment)
	var bytes []int64
	for _, bk := range pl.Buckets {
		bytes = append(bytes, bk.Bytes)
	}
	require.Equal(t, bytes, pl.DDPCaps)

	setDDPPositions(g, countedParams(g))
	cfg.BucketOrder = OrderDeclaration
	decl, err := Build(g, cfg)
	require.NoError(t, err)
	g.BlockIDs = nil
	byteDriven, err := Build(g, cfg)
	require.NoError(t, err)
	require.Contains(t, []Alignment{AlignDeclaration, AlignDeclarationMerged}, decl.Alignment)
	require.Equal(t, byteDriven.NodePiece, decl.NodePiece)
	require.Equal(t, byteDriven.DDPCaps, decl.DDPCaps)
}
