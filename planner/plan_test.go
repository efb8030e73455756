package planner

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFingerprintPinned pins the fingerprint of a fixed plan. A change here
// means every rank on an older build would disagree with a newer one: bump
// fingerprintVersion when the encoding changes on purpose.
func TestFingerprintPinned(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want uint64
	}{
		{"ddp", ddpCfg(25*mib, 1*mib), 0x824e0a14e54731d4},
		{"torch", torchCfg(25*mib, 1*mib), 0x95b998f0d96e08d3},
		{"ddp aligned", alignedCfg(ddpCfg(25*mib, 1*mib)), 0xda5537cc395a0635},
	}
	for _, tc := range cases {
		pl, err := Build(toyModel().graph(), tc.cfg)
		require.NoError(t, err)
		assert.Equal(t, tc.want, pl.Fingerprint, "%s: fingerprint %#016x, want %#016x", tc.name, pl.Fingerprint, tc.want)
	}
}

// TestFingerprintCoversInputs changes one input at a time and expects a
// different fingerprint each time, even where the plan itself is unchanged.
func TestFingerprintCoversInputs(t *testing.T) {
	base := ddpCfg(25*mib, 1*mib)
	basePlan, err := Build(toyModel().graph(), base)
	require.NoError(t, err)
	changes := []struct {
		name   string
		change func(g *Graph, c *Config)
	}{
		{"mode", func(g *Graph, c *Config) { c.Mode = ModeTorch }},
		{"cap", func(g *Graph, c *Config) { c.BucketCapBytes++ }},
		{"first cap", func(g *Graph, c *Config) { c.FirstBucketCapBytes++ }},
		{"per-bucket caps", func(g *Graph, c *Config) { c.BucketCapsBytes = []int64{1 * mib, 25 * mib} }},
		{"max pieces", func(g *Graph, c *Config) { c.MaxPieces = 5 }},
		{"align buckets", func(g *Graph, c *Config) { c.AlignBuckets = true }},
		{"param name", func(g *Graph, c *Config) { g.Params[0].Name = "renamed" }},
		{"param bytes", func(g *Graph, c *Config) { g.Params[0].Bytes++ }},
		{"storage bytes", func(g *Graph, c *Config) { g.Params[0].StorageBytes++ }},
		{"dtype", func(g *Graph, c *Config) { g.Params[1].DType = 3 }},
		{"device", func(g *Graph, c *Config) { g.Params[1].Device = 3 }},
		{"requires grad", func(g *Graph, c *Config) { g.Params[7].RequiresGrad = false }},
		{"ignored", func(g *Graph, c *Config) { g.Params[7].Ignored = true }},
		{"module id", func(g *Graph, c *Config) { g.ModuleIDs[12] = 3 }},
		{"ref kind", func(g *Graph, c *Config) { g.ParamRefs[0] = RefOther }},
		{"extra user", func(g *Graph, c *Config) {
			// x also feeds the output node.
			g.Users = append([]int32{int32(len(g.Ops) - 1)}, g.Users...)
			for i := 1; i < len(g.UserOffsets); i++ {
				g.UserOffsets[i]++
			}
		}},
	}
	for _, ch := range changes {
		g, cfg := toyModel().graph(), base
		ch.change(g, &cfg)
		pl, err := Build(g, cfg)
		if assert.NoError(t, err, ch.name) {
			assert.NotEqual(t, basePlan.Fingerprint, pl.Fingerprint, "%s: fingerprint unchanged", ch.name)
		}
	}
}

// TestConcurrentBuild plans one graph from 8 goroutines at once; run under
// -race it also proves that Build shares no mutable state.
func TestConcurrentBuild(t *testing.T) {
	g := syntheticGraph(20_000)
	for _, cfg := range []Config{
		ddpCfg(25*mib, 1*mib),
		torchCfg(25*mib, 1*mib),
		{Mode: ModeDDP, BucketCapBytes: 4 * mib, FirstBucketCapBytes: 1 * mib, MaxPieces: 7},
	} {
		want, err := Build(g, cfg)
		require.NoError(t, err)
		const workers = 8
		plans := make([]*Plan, workers)
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() { plans[w], errs[w] = Build(g, cfg) })
		}
		wg.Wait()
		for w := range workers {
			require.NoError(t, errs[w], "worker %d", w)
			assert.Equal(t, want, plans[w], "worker %d: plan differs from the sequential one", w)
		}
	}
}

// TestBuildLeavesInputsAlone checks that Build modifies neither the graph
// nor the config's cap list, which callers may share between calls.
func TestBuildLeavesInputsAlone(t *testing.T) {
	g := moduleModel().graph()
	before := moduleModel().graph()
	caps := []int64{50, 4000, 100}
	for _, mode := range []Mode{ModeDDP, ModeTorch} {
		cfg := Config{Mode: mode, BucketCapBytes: 4000, FirstBucketCapBytes: 50}
		if mode == ModeDDP {
			cfg.BucketCapsBytes, cfg.MaxPieces = caps, 1
		}
		_, err := Build(g, cfg)
		require.NoError(t, err)
	}
	assert.Equal(t, before, g, "Build modified the graph")
	assert.Equal(t, []int64{50, 4000, 100}, caps, "Build modified BucketCapsBytes")
}

// TestTorchModuleMarkedSeenWithoutRefs: torch marks a module processed at
// the first node calling it even when that node counts nothing, so a later
// (forward-earlier) call that does refer to its parameters counts nothing.
func TestTorchModuleMarkedSeenWithoutRefs(t *testing.T) {
	b := &graphBuilder{}
	w := b.param("m.weight", 100)
	x := b.placeholder("x")
	first := b.node("first", OpCallModule, 5, in(x), module(w))
	second := b.node("second", OpCallModule, 5, in(first)) // no references
	b.output(second)
	pl, err := Build(b.graph(), torchCfg(1000, 1000))
	require.NoError(t, err)
	require.Len(t, pl.Buckets, 1, "want one empty bucket")
	assert.Zero(t, pl.Buckets[0].Bytes)
	assert.Empty(t, pl.Buckets[0].Params)
}
