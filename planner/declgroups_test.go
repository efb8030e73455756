package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// declaredKeyedChain is keyedChain with a random declaration order (the
// forward order one time in four) and, one time in three, an unused
// parameter of a random group, declared anywhere.
func declaredKeyedChain(rng *rand.Rand, n, keys int) *Graph {
	g := keyedChain(rng, n, keys)
	if rng.IntN(3) == 0 {
		k := int32(rng.IntN(keys))
		g.Params = append(g.Params, Param{Name: "unused", Bytes: int64(1 + rng.IntN(64)), StorageBytes: 64,
			RequiresGrad: true, DType: k % 2, Device: k / 2})
	}
	perm := countedParams(g)
	if rng.IntN(4) > 0 {
		rng.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	}
	setDDPPositions(g, perm)
	return g
}

// TestDeclarationGroupsAlignWithDDPsWalk: on random chains of two to four
// (dtype, device) groups in random declaration orders, DDP's
// construction-time walk with the plan's caps makes exactly the plan's
// buckets, in DDP's order, each launching where the plan says, every
// piece launching one (Note [Declaration order per group]).
func TestDeclarationGroupsAlignWithDDPsWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 41))
	merged, grouped := 0, 0
	for range 600 {
		keys := 2 + rng.IntN(3)
		g := declaredKeyedChain(rng, 2+rng.IntN(12), keys)
		cfg := randomAlignedConfig(rng)
		ready, err := Build(g, cfg)
		require.NoError(t, err)
		cfg.BucketOrder = OrderDeclaration
		decl, err := Build(g, cfg)
		require.NoError(t, err)
		again, err := Build(g, cfg)
		require.NoError(t, err)
		require.Equal(t, decl, again, "deterministic")
		if len(decl.Buckets) == 0 {
			continue
		}
		if _, found := paramKeys(g, declarationOrder(g)); len(found) < 2 {
			checkDeclarationAligned(t, g, ready, decl)
			continue
		}
		checkDeclarationGroups(t, g, ready, decl)
		grouped++
		if decl.MergedCuts > 0 {
			merged++
		}
	}
	assert.Greater(t, grouped, 400)
	assert.Positive(t, merged, "some case merges a cut")
}

// declaredLayers plans layersGraph(layers...) aligned in declaration order
// perm (nil: the forward order), one piece per layer.
func declaredLayers(t *testing.T, perm []int, layers ...[]int64) (*Graph, *Plan) {
	t.Helper()
	g := layersGraph(layers...)
	order := countedParams(g)
	if perm != nil {
		// perm lists the layers in declaration order.
		byLayer := map[int][]int32{}
		p := 0
		for i, layer := range layers {
			for range layer {
				byLayer[i] = append(byLayer[i], order[p])
				p++
			}
		}
		order = order[:0:0]
		for _, i := range perm {
			order = append(order, byLayer[i]...)
		}
	}
	setDDPPositions(g, order)
	cfg := Config{AlignBuckets: true, BucketCapBytes: 1, FirstBucketCapBytes: 1}
	ready, err := Build(g, cfg)
	require.NoError(t, err)
	require.Equal(t, len(layers), ready.NumPieces)
	cfg.BucketOrder = OrderDeclaration
	decl, err := Build(g, cfg)
	require.NoError(t, err)
	checkDeclarationGroups(t, g, ready, decl)
	return g, decl
}

// TestDeclarationGroupsByHand: what the caps make of a few layer stacks.
func TestDeclarationGroupsByHand(t *testing.T) {
	t.Run("a bf16 layer in forward order keeps every cut", func(t *testing.T) {
		g, pl := declaredLayers(t, nil, []int64{100}, []int64{-100}, []int64{100}, []int64{100})
		assert.Equal(t, []int64{100, 100, 100}, pl.DDPCaps)
		assert.Zero(t, pl.MergedCuts)
		var got [][]string
		for _, b := range pl.Buckets {
			got = append(got, names(g, b))
		}
		assert.Equal(t, [][]string{{"l3.f32.0"}, {"l2.f32.0"}, {"l1.bf16.0"}, {"l0.f32.0"}}, got)
	})
	t.Run("bf16 weights and fp32 norms in every layer", func(t *testing.T) {
		// Each layer: a 400-byte bf16 weight, then a 16-byte fp32 norm.
		layer := []int64{-400, 16}
		_, pl := declaredLayers(t, nil, layer, layer, layer, layer)
		// The walk is fixed: cap 16 closes each layer's norm and its weight.
		assert.Zero(t, pl.MergedCuts, "every layer launches a bucket")
		assert.Len(t, pl.Buckets, 8, "a bucket per layer and group")
		assert.Equal(t, []int64{16}, slices.Compact(pl.DDPCaps))
	})
	t.Run("a head declared first merges only its own cut", func(t *testing.T) {
		// Layers 0-3 used in that order; layer 3 (a bf16 head) declared first.
		_, pl := declaredLayers(t, []int{3, 0, 1, 2}, []int64{100}, []int64{100}, []int64{100}, []int64{-50, -10})
		assert.Equal(t, 1, pl.MergedCuts)
		assert.Equal(t, 3, pl.NumPieces)
	})
	t.Run("a zero-byte parameter joins the next bucket, as DDP's walk puts it", func(t *testing.T) {
		// fp32 layer 1's second parameter holds no bytes: DDP closes the
		// layer's bucket at its first and puts the second with layer 3,
		// whose bucket then launches with layer 1: layer 3's cut goes.
		g, pl := declaredLayers(t, nil, []int64{-100}, []int64{100, 0}, []int64{-100}, []int64{100})
		var got [][]string
		for _, b := range pl.Buckets {
			got = append(got, names(g, b))
		}
		assert.Equal(t, [][]string{{"l2.bf16.0"}, {"l1.f32.1", "l3.f32.0"}, {"l1.f32.0"}, {"l0.bf16.0"}}, got)
		assert.Equal(t, 1, pl.MergedCuts)
	})
	t.Run("groups that need different caps", func(t *testing.T) {
		// The fp32 layer 0 closes only against a cap in (60, 100]; the bf16
		// group's first bucket then runs to 70 bytes (layers 0-6).
		var layers [][]int64
		for i := range 8 {
			layer := []int64{-10}
			if i == 0 {
				layer = append(layer, 60, 40)
			}
			layers = append(layers, layer)
		}
		g, pl := declaredLayers(t, nil, layers...)
		assert.Equal(t, int64(61), min(pl.DDPCaps[0], 61), "cap 0 lies above 60")
		sizes := map[string][]int64{}
		for _, b := range pl.Buckets {
			key := fmt.Sprint(g.Params[b.Params[0]].DType)
			sizes[key] = append(sizes[key], b.Bytes)
		}
		assert.Equal(t, []int64{100}, sizes["0"])
		assert.Equal(t, []int64{10, 70}, sizes["1"], "bf16: layer 7, then layers 0-6")
		// DDP order: layer 7's, the fp32 bucket (declared second), then the
		// bf16 layers 0-6, launching with layer 0.
		assert.Equal(t, 6, pl.MergedCuts, "layers 1-6 launch no bucket")
	})
}

// TestDeclarationGroupsKeepDDPsOwnWhereTheyLaunchEarlier: where the shared
// caps make a group's buckets long, and DDP's own caps launch more of the
// bytes earlier, Decide keeps DDP's buckets (ReasonGroupsLater); where the
// caps close a bucket per layer, they stay.
func TestDeclarationGroupsKeepDDPsOwnWhereTheyLaunchEarlier(t *testing.T) {
	// fp32 only in layers 0 and 7: cap 0 must lie in (6000, 10000], so the
	// bf16 group's first bucket holds layers 0-6.
	var layers [][]int64
	for i := range 8 {
		layer := []int64{-1000}
		if i == 0 || i == 7 {
			layer = append(layer, 6000, 4000)
		}
		layers = append(layers, layer)
	}
	decide := func(g *Graph) *Decision {
		s := alignedDDP(g, 0, func(d *DDPSettings) { d.FindUnusedParameters = true })
		s.UserBucketCapBytes, s.UserFirstBucketCapBytes = 1, 1 // DDP's own: a bucket per parameter
		dec, err := Decide(&Request{Graph: g, Settings: s})
		require.NoError(t, err)
		return dec
	}
	g := layersGraph(layers...)
	dec := decide(g)
	assert.Equal(t, ReasonGroupsLater, dec.AlignReason)
	assert.False(t, dec.Config.AlignBuckets)
	assert.Equal(t, AlignNone, dec.Plan.Alignment)
	want, err := Build(g, dec.Config)
	require.NoError(t, err)
	assert.Equal(t, want, dec.Plan, "the unaligned plan")

	// On the unaligned plan's pieces (a layer each): the bf16 layers 0-6
	// launch with layer 0, where DDP's own buckets launch each with its
	// layer.
	cfg := alignedCfg(dec.Config)
	cfg.BucketOrder = OrderDeclaration
	aligned, err := Build(g, cfg)
	require.NoError(t, err)
	require.Equal(t, AlignDeclarationGroups, aligned.Alignment)
	assert.Equal(t, 2, aligned.NumPieces)
	clock := dec.Plan
	require.Equal(t, 8, clock.NumPieces)
	var buckets [][]int32
	for _, b := range aligned.Buckets {
		buckets = append(buckets, b.Params)
	}
	own := declaredOwn(g, []int64{1})
	assert.Len(t, own, 12, "a bucket per parameter")
	assert.True(t, launchesLater(launchedOn(g, clock, buckets), launchedOn(g, clock, own)))

	// A bf16 layer among fp32 ones: the caps close a bucket per layer.
	dec = decide(layersGraph([]int64{100}, []int64{-100}, []int64{100}, []int64{100}))
	assert.Equal(t, ReasonAligned, dec.AlignReason)
	assert.Equal(t, AlignDeclarationGroups, dec.Plan.Alignment)
}

// TestDeclaredOwnIsDDPsWalk: declaredOwn's buckets are DDP's
// construction-time ones (naiveInitialBuckets), in the same order, zero-byte
// parameters included.
func TestDeclaredOwnIsDDPsWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	for range 200 {
		g := declaredKeyedChain(rng, 2+rng.IntN(10), 1+rng.IntN(3))
		for p := range g.Params {
			if rng.IntN(6) == 0 {
				g.Params[p].Bytes = 0
			}
		}
		caps := []int64{1 + rng.Int64N(100), 1 + rng.Int64N(100)}
		own := declaredOwn(g, caps)
		want := naiveInitialBuckets(g, caps)
		require.Len(t, own, len(want))
		for k, b := range own {
			assert.Len(t, b, len(want[k]), "bucket %d", k)
			for _, p := range b {
				assert.True(t, want[k][p], "bucket %d", k)
			}
		}
	}
}
