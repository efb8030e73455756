package planner

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUniformCapsResolve: whatever sets the first-bucket and per-bucket
// caps, UniformCaps plans every bucket under the resolved bucket cap.
func TestUniformCapsResolve(t *testing.T) {
	ddp := defaultDDP()
	ddp.BucketCapsBytes = []int64{1 * mib, 4 * mib}
	own := &DDPSettings{BucketCapBytes: 8 * mib, FirstBucketCapBytes: 2 * mib}
	cases := []struct {
		name string
		s    Settings
		cap  int64
	}{
		{"no DDP, nothing given", Settings{}, 25 * mib},
		{"default DDP (1 MiB first, per-bucket caps)", Settings{DDP: ddp}, 25 * mib},
		{"DDP's own first cap", Settings{DDP: own}, 8 * mib},
		{"the user's caps", Settings{UserBucketCapBytes: 3 * mib,
			UserFirstBucketCapBytes: mib, UserBucketCapsBytes: []int64{5}, DDP: ddp}, 3 * mib},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.UniformCaps = true
			require.NoError(t, checkSettings(&tc.s))
			for _, align := range []bool{false, true} {
				cfg := tc.s.resolve(align)
				assert.Equal(t, tc.cap, cfg.BucketCapBytes, "cap")
				assert.Equal(t, tc.cap, cfg.FirstBucketCapBytes, "first cap")
				assert.Nil(t, cfg.BucketCapsBytes, "per-bucket caps")
			}
		})
	}
	s := Settings{Mode: ModeTorch, UniformCaps: true}
	err := checkSettings(&s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "UniformCaps")
}

// chainBody is a checkpoint body as the shim exports it: placeholders for
// the input and the parameters, then a chain of calls each reading its
// parameters, then the output.
func chainBody(paramBytes []int64) *Graph {
	var b graphBuilder
	x := b.placeholder("x")
	params := make([]int32, len(paramBytes))
	for k, bytes := range paramBytes {
		params[k] = b.param(fmt.Sprintf("p%d", k), bytes)
		b.placeholder(fmt.Sprintf("p%d", k))
	}
	h := x
	for k := range paramBytes {
		h = b.call(fmt.Sprintf("op%d", k), in(h), arg(params[k]))
	}
	b.output(h)
	return b.graph()
}

// TestUniformCapsPieces: a body planned with UniformCaps is cut exactly as
// with the cap given as every cap by hand (the naive reference), whatever
// DDP's first-bucket and per-bucket caps; so the same body is cut alike
// under any of them, and more than a cap's parameters give several pieces.
func TestUniformCapsPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 9))
	for trial := range 200 {
		n := 1 + r.IntN(12)
		bytes := make([]int64, n)
		var total int64
		for k := range bytes {
			bytes[k] = (1 + r.Int64N(16)) * mib / 8
			total += bytes[k]
		}
		g := chainBody(bytes)
		capBytes := (1 + r.Int64N(12)) * mib / 4
		ref, err := Decide(&Request{Graph: g, Settings: Settings{
			UserBucketCapBytes:      capBytes,
			UserFirstBucketCapBytes: capBytes,
		}})
		require.NoError(t, err)
		ddps := []*DDPSettings{
			{BucketCapBytes: capBytes, CapIsDefault: true, FirstBucketCapBytes: CapNotGiven},
			{BucketCapBytes: capBytes, FirstBucketCapBytes: max(capBytes/4, 1)},
			{BucketCapBytes: capBytes, FirstBucketCapBytes: CapNotGiven, BucketCapsBytes: []int64{mib / 8, 3 * mib}},
		}
		for k, ddp := range ddps {
			got, err := Decide(&Request{Graph: g, Settings: Settings{DDP: ddp, UniformCaps: true}})
			require.NoError(t, err)
			assert.Equal(t, ref.Plan.NodePiece, got.Plan.NodePiece, "trial %d, DDP %d: pieces", trial, k)
			assert.Equal(t, capBytes, got.Config.FirstBucketCapBytes, "trial %d, DDP %d: first cap", trial, k)
		}
		if total > 2*capBytes+16*mib/8 {
			assert.Greater(t, ref.Plan.NumPieces, 1, "trial %d: %d bytes under a %d-byte cap", trial, total, capBytes)
		}
	}
}

// TestCheckpointRegions: a body planned with UniformCaps is to be split
// (Decision.CheckpointRegions) exactly when it has at least two pieces and
// is not cut at block runs; never without UniformCaps. Random chains,
// with and without two block runs, against that naive rule.
func TestCheckpointRegions(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 3))
	seen := map[string]bool{}
	for trial := range 200 {
		n := 2 + r.IntN(10)
		bytes := make([]int64, n)
		for k := range bytes {
			bytes[k] = (1 + r.Int64N(16)) * mib / 8
		}
		g := chainBody(bytes)
		twoRuns := r.IntN(2) == 0
		if twoRuns {
			g.BlockIDs = make([]int32, len(g.Ops))
			for i := range g.BlockIDs {
				g.BlockIDs[i] = -1
			}
			calls := 0
			for i, op := range g.Ops {
				if isCompute(op) {
					g.BlockIDs[i] = int32(min(calls*2/n, 1))
					calls++
				}
			}
		}
		capBytes := (1 + r.Int64N(12)) * mib / 4
		for _, uniform := range []bool{false, true} {
			s := Settings{UserBucketCapBytes: capBytes, UniformCaps: uniform}
			d, err := Decide(&Request{Graph: g, Settings: s})
			require.NoError(t, err)
			want := uniform && !d.Plan.BlockRuns && d.Plan.NumPieces >= 2
			require.Equal(t, want, d.CheckpointRegions, "trial %d, uniform %t", trial, uniform)
			require.Equal(t, twoRuns, d.Plan.BlockRuns, "trial %d", trial)
			seen[fmt.Sprintf("uniform=%t regions=%t runs=%t", uniform, d.CheckpointRegions, twoRuns)] = true
		}
	}
	for _, k := range []string{"uniform=true regions=true runs=false", "uniform=true regions=false runs=false",
		"uniform=true regions=false runs=true", "uniform=false regions=false runs=false"} {
		assert.True(t, seen[k], "no trial covered %s", k)
	}
}
