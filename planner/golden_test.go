package planner

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current plans")

// planCase is one model, one config, and the facts about its plan that were
// worked out by hand; the golden file pins everything else.
type planCase struct {
	name  string
	model func() *graphBuilder
	cfg   Config
	check func(t *testing.T, b *graphBuilder, pl *Plan)
}

func torchCfg(capBytes, firstBytes int64) Config {
	return Config{Mode: ModeTorch, BucketCapBytes: capBytes, FirstBucketCapBytes: firstBytes}
}

func ddpCfg(capBytes, firstBytes int64) Config {
	return Config{Mode: ModeDDP, BucketCapBytes: capBytes, FirstBucketCapBytes: firstBytes}
}

// wantPieces checks the piece count and, for each listed node, its piece.
func wantPieces(t *testing.T, b *graphBuilder, pl *Plan, count int, nodePiece map[string]int32) {
	t.Helper()
	if pl.NumPieces != count {
		t.Errorf("NumPieces = %d, want %d", pl.NumPieces, count)
	}
	for name, want := range nodePiece {
		if got := pl.NodePiece[b.nodeIndex(name)]; got != want {
			t.Errorf("node %s in piece %d, want %d", name, got, want)
		}
	}
}

// wantBucket checks one bucket's bytes, piece, extension and parameters
// (by name, in order).
func wantBucket(t *testing.T, b *graphBuilder, pl *Plan, k int, bytes int64, piece int, extended bool, params ...string) {
	t.Helper()
	if k >= len(pl.Buckets) {
		t.Errorf("bucket %d missing (%d buckets)", k, len(pl.Buckets))
		return
	}
	bk := pl.Buckets[k]
	var names []string
	for _, p := range bk.Params {
		names = append(names, b.params[p].Name)
	}
	if bk.Bytes != bytes || bk.Piece != piece || bk.Extended != extended || !slices.Equal(names, params) {
		t.Errorf("bucket %d = %d bytes, piece %d, extended %t, params %v; want %d, %d, %t, %v",
			k, bk.Bytes, bk.Piece, bk.Extended, names, bytes, piece, extended, params)
	}
}

// alignedCfg is cfg with AlignBuckets set.
func alignedCfg(cfg Config) Config {
	cfg.AlignBuckets = true
	return cfg
}

// buildUnaligned plans b's graph under cfg without AlignBuckets, for
// comparison with an aligned plan.
func buildUnaligned(t *testing.T, b *graphBuilder, cfg Config) *Plan {
	t.Helper()
	cfg.AlignBuckets = false
	pl, err := Build(b.graph(), cfg)
	if err != nil {
		t.Fatalf("unaligned Build: %v", err)
	}
	return pl
}

func wantBucketCount(t *testing.T, pl *Plan, count int) {
	t.Helper()
	if len(pl.Buckets) != count {
		t.Errorf("%d buckets, want %d", len(pl.Buckets), count)
	}
}

var planCases = []planCase{
	{
		// torch's DDPOptimizer cuts this model into 3 pieces.
		name: "toy_torch", model: toyModel, cfg: torchCfg(25*mib, 1*mib),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{
				"linear1": 0, "relu1": 0, "linear2": 1, "relu2": 1, "linear3": 2, "relu3": 2, "linear4": 2})
			wantBucketCount(t, pl, 3)
			// Per use, torch lists a linear's weight before its bias.
			wantBucket(t, b, pl, 0, 5000*5*f32+5*f32+5000*5000*f32+5000*f32, 2, false,
				"fc4.weight", "fc4.bias", "fc3.weight", "fc3.bias")
			wantBucket(t, b, pl, 1, 5000*5000*f32+5000*f32, 1, false, "fc2.weight", "fc2.bias")
			wantBucket(t, b, pl, 2, 10*5000*f32+5000*f32, 0, false, "fc1.weight", "fc1.bias")
		},
	},
	{
		// DDP's rebuilt buckets: bias before weight within a layer, the
		// first bucket closing at the first parameter that reaches 1 MiB.
		name: "toy_ddp", model: toyModel, cfg: ddpCfg(25*mib, 1*mib),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{
				"linear1": 0, "relu1": 0, "linear2": 1, "relu2": 1, "linear3": 2, "relu3": 2, "linear4": 2})
			wantBucketCount(t, pl, 3)
			wantBucket(t, b, pl, 0, 100020+5000*5000*f32+5000*f32, 2, false,
				"fc4.bias", "fc4.weight", "fc3.bias", "fc3.weight")
			wantBucket(t, b, pl, 1, 100020000, 1, false, "fc2.bias", "fc2.weight")
			wantBucket(t, b, pl, 2, 220000, 0, false, "fc1.bias", "fc1.weight")
		},
	},
	{
		// torch counts the tied weight at both uses and cuts before the
		// head; DDP counts it once, at its first use, and needs no cut.
		name: "shared_weight_torch", model: sharedWeightModel, cfg: torchCfg(3000, 3000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"embed": 0, "mid": 0, "relu": 0, "head": 1})
			wantBucket(t, b, pl, 0, 4000, 1, false, "embed.weight")
			wantBucket(t, b, pl, 1, 5100, 0, false, "mid.weight", "mid.bias", "embed.weight")
		},
	},
	{
		name: "shared_weight_ddp", model: sharedWeightModel, cfg: ddpCfg(3000, 3000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 1, map[string]int32{"embed": 0, "head": 0})
			wantBucketCount(t, pl, 1)
			wantBucket(t, b, pl, 0, 5100, 0, false, "mid.bias", "mid.weight", "embed.weight")
		},
	},
	{
		// fc2.weight (ignored) and fc3.bias (frozen) count nowhere.
		name: "ignored_torch", model: ignoredParamModel, cfg: torchCfg(1000, 1000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"linear1": 0, "linear2": 0, "linear3": 1})
			wantBucket(t, b, pl, 0, 1000, 1, false, "fc3.weight")
			wantBucket(t, b, pl, 1, 1200, 0, false, "fc2.bias", "fc1.weight", "fc1.bias")
		},
	},
	{
		name: "ignored_ddp", model: ignoredParamModel, cfg: ddpCfg(1000, 1000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"linear1": 0, "linear2": 0, "linear3": 1})
			wantBucketCount(t, pl, 2)
			wantBucket(t, b, pl, 0, 1000, 1, false, "fc3.weight")
			wantBucket(t, b, pl, 1, 1200, 0, false, "fc2.bias", "fc1.bias", "fc1.weight")
		},
	},
	{
		// The parameter-free preamble (mul, add) joins the first bucket.
		name: "preamble_torch", model: preambleModel, cfg: torchCfg(1000, 1000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"mul": 0, "add": 0, "linear1": 0, "linear2": 1})
			wantBucket(t, b, pl, 1, 1000, 0, false, "fc1.weight")
			if got := pl.Buckets[1].NodeBegin; got != b.nodeIndex("mul") {
				t.Errorf("merged bucket starts at node %d, want mul", got)
			}
		},
	},
	{
		name: "preamble_ddp", model: preambleModel, cfg: ddpCfg(1000, 1000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"mul": 0, "add": 0, "linear1": 0, "linear2": 1})
			wantBucket(t, b, pl, 0, 1000, 1, false, "fc2.weight")
			wantBucket(t, b, pl, 1, 1000, 0, false, "fc1.weight")
		},
	},
	{
		// The last bucket starts with an in-place update nothing reads, so
		// it cannot close there and grows over linear2.
		name: "inplace_tail_torch", model: inplaceTailModel, cfg: torchCfg(1500, 1500),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"linear1": 0, "linear2": 1, "addcmul_": 1})
			wantBucket(t, b, pl, 0, 3000, 1, true, "scale", "fc2.weight")
			wantBucket(t, b, pl, 1, 1000, 0, false, "fc1.weight")
		},
	},
	{
		name: "inplace_tail_ddp", model: inplaceTailModel, cfg: ddpCfg(1500, 1500),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"linear1": 0, "linear2": 1, "addcmul_": 1})
			wantBucket(t, b, pl, 0, 2000, 1, true, "scale")
			wantBucket(t, b, pl, 1, 2000, 0, false, "fc2.weight", "fc1.weight")
		},
	},
	{
		// torch counts fc1's parameters at its last call (first in the
		// reverse walk); the first call counts nothing and the empty
		// forward-first bucket is merged.
		name: "module_torch", model: moduleModel, cfg: torchCfg(4000, 4000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"fc1_a": 0, "relu": 0, "fc2": 0, "scale": 0, "mul": 0, "fc1_b": 1})
			wantBucket(t, b, pl, 0, 4100, 1, false, "fc1.weight", "fc1.bias")
			wantBucket(t, b, pl, 1, 4150, 0, false, "scale", "fc2.weight", "fc2.bias")
		},
	},
	{
		// DDP makes fc1's gradients ready at its first call.
		name: "module_ddp", model: moduleModel, cfg: ddpCfg(4000, 4000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"fc1_a": 0, "relu": 0, "fc2": 1, "scale": 1, "mul": 1, "fc1_b": 1})
			wantBucket(t, b, pl, 0, 4150, 1, false, "scale", "fc2.bias", "fc2.weight")
			wantBucket(t, b, pl, 1, 4100, 0, false, "fc1.bias", "fc1.weight")
		},
	},
	{
		// Each dtype walks the caps on its own: both get a small first
		// bucket, and the still-open buckets follow by first gradient.
		name: "mixed_dtype_ddp", model: mixedDTypeModel, cfg: ddpCfg(3000, 1000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{"linear1": 0, "linear2": 0, "linear3": 1, "linear4": 2})
			wantBucketCount(t, pl, 4)
			wantBucket(t, b, pl, 0, 1000, 2, false, "fc4.weight")
			wantBucket(t, b, pl, 1, 1000, 1, false, "fc3.weight")
			wantBucket(t, b, pl, 2, 1000, 0, false, "fc2.weight")
			wantBucket(t, b, pl, 3, 1000, 0, false, "fc1.weight")
			for k, dt := range []int32{1, 0, 1, 0} {
				if pl.Buckets[k].DType != dt {
					t.Errorf("bucket %d dtype %d, want %d", k, pl.Buckets[k].DType, dt)
				}
			}
		},
	},
	{
		name: "mixed_dtype_torch", model: mixedDTypeModel, cfg: torchCfg(3000, 1000),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"linear1": 0, "linear3": 0, "linear4": 1})
		},
	},
	{
		// Caps 500, 2000, then 1000 repeating.
		name: "bucket_caps_ddp", model: func() *graphBuilder { return chainModel(100, 400, 400, 400, 400, 400, 400) },
		cfg: Config{Mode: ModeDDP, BucketCapBytes: 2000, FirstBucketCapBytes: 500, BucketCapsBytes: []int64{500, 2000, 1000}},
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{"linear1": 0, "linear2": 1, "linear5": 1, "linear6": 2})
			wantBucket(t, b, pl, 0, 500, 2, false, "fc6.bias", "fc6.weight")
			wantBucket(t, b, pl, 1, 2000, 1, false, "fc5.bias", "fc5.weight", "fc4.bias", "fc4.weight",
				"fc3.bias", "fc3.weight", "fc2.bias", "fc2.weight")
			wantBucket(t, b, pl, 2, 500, 0, false, "fc1.bias", "fc1.weight")
		},
	},
	{
		// Eight one-layer buckets merged down to three pieces, smallest
		// merged piece first: [fc3 fc4] 200, [fc5 fc6] 800, [fc1 fc2] 900,
		// [fc3..fc6] 1000 (tie with [fc7 fc8], lower cut wins), [fc7 fc8].
		name: "max_pieces_ddp", model: func() *graphBuilder { return chainModel(0, 100, 800, 100, 100, 700, 100, 900, 100) },
		cfg: Config{Mode: ModeDDP, BucketCapBytes: 100, FirstBucketCapBytes: 100, MaxPieces: 3},
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{
				"linear1": 0, "linear2": 0, "linear3": 1, "linear6": 1, "linear7": 2, "linear8": 2})
			wantBucketCount(t, pl, 8)
			for k, piece := range []int{2, 2, 1, 1, 1, 1, 0, 0} {
				if pl.Buckets[k].Piece != piece {
					t.Errorf("bucket %d in piece %d, want %d", k, pl.Buckets[k].Piece, piece)
				}
			}
		},
	},
	{
		name: "max_pieces_unlimited_ddp", model: func() *graphBuilder { return chainModel(0, 100, 800, 100, 100, 700, 100, 900, 100) },
		cfg: Config{Mode: ModeDDP, BucketCapBytes: 100, FirstBucketCapBytes: 100},
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 8, nil)
		},
	},
	{
		// fc.weight's cut would leave update_ alone in a piece without an
		// output: the cut is dropped and its bucket marked extended.
		name: "dead_head_ddp", model: deadHeadModel, cfg: ddpCfg(100, 100),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 1, map[string]int32{"update_": 0, "linear": 0})
			wantBucket(t, b, pl, 0, 100, 0, true, "fc.weight")
			wantBucket(t, b, pl, 1, 100, 0, false, "stat.weight")
		},
	},
	{
		// torch keeps a first piece without outputs.
		name: "dead_head_torch", model: deadHeadModel, cfg: torchCfg(100, 100),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"update_": 0, "linear": 1})
		},
	},
	{
		// The motivating case. Unaligned, the bucket after fc4.bias's holds
		// fc4.weight (piece 2) with fc3 and fc2 (piece 1), so in DDP it
		// would wait for piece 1's backward. Aligned: one bucket per piece.
		name: "aligned_mlp_ddp", model: mlpModel, cfg: alignedCfg(ddpCfg(45000, 20)),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{
				"linear1": 0, "relu1": 0, "linear2": 1, "relu3": 1, "linear4": 2})
			wantBucketCount(t, pl, 3)
			wantBucket(t, b, pl, 0, 2020, 2, false, "fc4.bias", "fc4.weight")
			wantBucket(t, b, pl, 1, 80800, 1, false, "fc3.bias", "fc3.weight", "fc2.bias", "fc2.weight")
			wantBucket(t, b, pl, 2, 4400, 0, false, "fc1.bias", "fc1.weight")
			unaligned := buildUnaligned(t, b, ddpCfg(45000, 20))
			wantBucketCount(t, unaligned, 3)
			wantBucket(t, b, unaligned, 0, 20, 2, false, "fc4.bias")
			wantBucket(t, b, unaligned, 1, 82800, 1, false, "fc4.weight", "fc3.bias", "fc3.weight", "fc2.bias", "fc2.weight")
		},
	},
	{
		// Two predicted buckets close in piece 1 and become one; the tied
		// weight counts once, in the piece of its first use.
		name: "aligned_shared_weight_ddp", model: sharedWeightModel, cfg: alignedCfg(ddpCfg(1000, 100)),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"embed": 0, "mid": 1, "relu": 1, "head": 1})
			wantBucketCount(t, pl, 2)
			wantBucket(t, b, pl, 0, 1100, 1, false, "mid.bias", "mid.weight")
			wantBucket(t, b, pl, 1, 4000, 0, false, "embed.weight")
			wantBucketCount(t, buildUnaligned(t, b, ddpCfg(1000, 100)), 3)
		},
	},
	{
		// The pieces of max_pieces_ddp, one bucket each instead of eight.
		name: "aligned_max_pieces_ddp", model: func() *graphBuilder { return chainModel(0, 100, 800, 100, 100, 700, 100, 900, 100) },
		cfg: Config{Mode: ModeDDP, BucketCapBytes: 100, FirstBucketCapBytes: 100, MaxPieces: 3, AlignBuckets: true},
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 3, map[string]int32{
				"linear1": 0, "linear2": 0, "linear3": 1, "linear6": 1, "linear7": 2, "linear8": 2})
			wantBucketCount(t, pl, 3)
			wantBucket(t, b, pl, 0, 1000, 2, false, "fc8.weight", "fc7.weight")
			wantBucket(t, b, pl, 1, 1000, 1, false, "fc6.weight", "fc5.weight", "fc4.weight", "fc3.weight")
			wantBucket(t, b, pl, 2, 900, 0, false, "fc2.weight", "fc1.weight")
		},
	},
	{
		// The extended bucket's piece keeps the mark; fc2.weight moves from
		// the bucket completed in piece 0 to its own piece's.
		name: "aligned_inplace_tail_ddp", model: inplaceTailModel, cfg: alignedCfg(ddpCfg(1500, 1500)),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 2, map[string]int32{"linear1": 0, "linear2": 1, "addcmul_": 1})
			wantBucketCount(t, pl, 2)
			wantBucket(t, b, pl, 0, 3000, 1, true, "scale", "fc2.weight")
			wantBucket(t, b, pl, 1, 1000, 0, false, "fc1.weight")
		},
	},
	{
		name: "no_compute_ddp", model: noComputeModel, cfg: ddpCfg(100, 100),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 0, nil)
			wantBucketCount(t, pl, 0)
		},
	},
	{
		name: "no_compute_torch", model: noComputeModel, cfg: torchCfg(100, 100),
		check: func(t *testing.T, b *graphBuilder, pl *Plan) {
			wantPieces(t, b, pl, 0, nil)
			wantBucketCount(t, pl, 0)
		},
	},
}

func TestPlanGolden(t *testing.T) {
	for _, tc := range planCases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.model()
			g := b.graph()
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

// checkGolden compares a rendered plan with testdata/<name>.golden, or
// rewrites the file under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./planner -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("plan differs from %s (run go test ./planner -update if intended):\n%s", path, diffLines(string(want), got))
	}
}

// diffLines shows the lines of want and got that differ, side by side.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var s strings.Builder
	for i := range max(len(w), len(g)) {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			s.WriteString("- " + a + "\n+ " + b + "\n")
		}
	}
	return s.String()
}
