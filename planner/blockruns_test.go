package planner

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// Plan.BlockRuns is true exactly when the pieces were cut at block runs:
// ModeDDP, at least two runs, and not declaration order (whose plans keep
// the byte-driven cuts); never without block ids, with one run, or in
// ModeTorch. Where it is true every piece begins at a run (or is the
// preamble), and where it is false the plan is the byte-driven one.
func TestBlockRuns(t *testing.T) {
	b, blocks := gptModel(4, 8)
	one := slices.Clone(blocks)
	for i, id := range one {
		if id > 0 {
			one[i] = 0
		}
	}
	declaration := func(cfg Config) Config {
		cfg.BucketOrder = OrderDeclaration
		return cfg
	}
	cases := []struct {
		name string
		ids  []int32
		cfg  Config
		want bool
	}{
		{"ddp, blocks", blocks, ddpCfg(7000, 100), true},
		{"ddp aligned, blocks", blocks, alignedCfg(ddpCfg(7000, 100)), true},
		{"ddp aligned, declaration order", blocks, declaration(alignedCfg(ddpCfg(7000, 100))), false},
		{"ddp, one run", one, ddpCfg(7000, 100), false},
		{"ddp, no block ids", nil, ddpCfg(7000, 100), false},
		{"torch, blocks", blocks, torchCfg(7000, 100), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := b.graph()
			g.BlockIDs = tc.ids
			if tc.cfg.BucketOrder == OrderDeclaration {
				setDDPPositions(g, countedParams(g))
			}
			pl, err := Build(g, tc.cfg)
			require.NoError(t, err)
			require.Equal(t, tc.want, pl.BlockRuns)
			g.BlockIDs = nil
			plain, err := Build(g, tc.cfg)
			require.NoError(t, err)
			if tc.want {
				require.NotEqual(t, plain.NodePiece, pl.NodePiece, "a block-run plan that is the byte-driven one")
			} else {
				require.Equal(t, plain.NodePiece, pl.NodePiece)
			}
		})
	}
}

// Decide reports BlockRuns from the module stacks under the real settings:
// a find_unused_parameters DDP module, aligned, plans in declaration
// order, so its blocks do not cut the graph; unaligned, its plan follows
// ready order and the blocks cut it.
func TestDecideBlockRunsFollowsTheDDPOrder(t *testing.T) {
	for _, tc := range []struct {
		name       string
		findUnused bool
		align      bool
		want       bool
	}{
		{"ready, aligned", false, true, true},
		{"find unused, aligned", true, true, false},
		{"find unused, not aligned", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, blocks := gptModel(4, 8)
			g := b.graph()
			s := alignedDDP(g, 0, func(d *DDPSettings) { d.FindUnusedParameters = tc.findUnused })
			s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 7000, 100
			s.BlockCuts, s.AlignBuckets = true, tc.align
			dec, err := Decide(&Request{Graph: g, Stacks: gptStacks(blocks), Settings: s})
			require.NoError(t, err)
			require.NotNil(t, dec.BlockIDs)
			require.Equal(t, tc.want, dec.Plan.BlockRuns)
		})
	}
}
