//go:build goddp_testhooks

package main

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goddp/goddp/planner"
)

// toyGraph is a model of three Linear(width, width) fp32 layers with ReLU:
// placeholders x, w0, b0, w1, b1, w2, b2 (nodes 0-6), then linear_i (7+2i)
// reading x or the previous relu plus w_i and b_i, relu_i (8+2i), and the
// output (13). Parameters reach the linear nodes as positional placeholders.
func toyGraph(width int64) *rawGraph {
	const layers = 3
	g := &rawGraph{NumNodes: 7 + 2*layers + 1, NumParams: 2 * layers}
	n := g.NumNodes
	users := make([][]int32, n)
	params := make([][]int32, n)
	g.NodeOps = make([]int32, n)
	g.NodeModuleIDs = make([]int32, n)
	for i := range g.NodeModuleIDs {
		g.NodeModuleIDs[i] = -1
	}
	for i := 0; i < 7; i++ {
		g.NodeOps[i] = int32(planner.OpPlaceholder)
	}
	prev := int32(0) // x
	for l := int32(0); l < layers; l++ {
		linear, relu := 7+2*l, 8+2*l
		w, b := 1+2*l, 2+2*l // placeholder node indices
		g.NodeOps[linear] = int32(planner.OpCallFunction)
		g.NodeOps[relu] = int32(planner.OpCallFunction)
		params[linear] = []int32{2 * l, 2*l + 1}
		users[prev] = append(users[prev], linear)
		users[w] = append(users[w], linear)
		users[b] = append(users[b], linear)
		users[linear] = append(users[linear], relu)
		prev = relu
	}
	g.NodeOps[n-1] = int32(planner.OpOutput)
	users[prev] = append(users[prev], int32(n-1))

	g.NodeParamOffsets = []int64{0}
	g.NodeUserOffsets = []int64{0}
	for i := range n {
		g.NodeParams = append(g.NodeParams, params[i]...)
		for range params[i] {
			g.NodeParamRefs = append(g.NodeParamRefs, uint8(planner.RefArg))
		}
		g.NodeParamOffsets = append(g.NodeParamOffsets, int64(len(g.NodeParams)))
		g.NodeUsers = append(g.NodeUsers, users[i]...)
		g.NodeUserOffsets = append(g.NodeUserOffsets, int64(len(g.NodeUsers)))
	}
	g.ParamNameOffsets = []int64{0}
	for l := range layers {
		for _, kind := range []string{"weight", "bias"} {
			size := 4 * width
			if kind == "weight" {
				size *= width
			}
			g.ParamBytes = append(g.ParamBytes, size)
			g.ParamStorageBytes = append(g.ParamStorageBytes, size)
			g.ParamDtypes = append(g.ParamDtypes, 7)
			g.ParamDevices = append(g.ParamDevices, 0)
			g.ParamFlags = append(g.ParamFlags, 1) // GODDP_PARAM_REQUIRES_GRAD
			g.ParamNames = append(g.ParamNames, fmt.Sprintf("layers.%d.%s", l, kind)...)
			g.ParamNameOffsets = append(g.ParamNameOffsets, int64(len(g.ParamNames)))
		}
	}
	return g
}

func toyConfig(mode planner.Mode) *rawConfig {
	return &rawConfig{Mode: int32(mode), BucketCapBytes: 4_000_000, FirstBucketCapBytes: 1_000_000}
}

func TestABIVersion(t *testing.T) {
	assert.Equal(t, abiVersion, callABIVersion(), "goddp_abi_version() vs GODDP_ABI_VERSION")
}

func TestStatusMapping(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, statusOK},
		{&planner.Error{Code: planner.ErrInvalidConfig, Msg: "cap"}, statusInvalidConfig},
		{&planner.Error{Code: planner.ErrInvalidGraph, Msg: "edge"}, statusInvalidGraph},
		{&planner.Error{Code: planner.ErrOverflow, Msg: "sum"}, statusOverflow},
		{fmt.Errorf("wrapped: %w", &planner.Error{Code: planner.ErrInvalidGraph}), statusInvalidGraph},
		{&planner.Error{Code: 99, Msg: "unknown code"}, statusInternal},
		{errors.New("plain"), statusInternal},
		{errOutOfMemory, statusInternal},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, statusOfInt(c.err), "statusOf(%v)", c.err)
	}
}

func TestSetMaxProcs(t *testing.T) {
	st, orig := callSetMaxProcs(0)
	require.Equal(t, statusOK, st, "query")
	require.GreaterOrEqual(t, orig, int32(1), "query")
	defer callSetMaxProcs(orig)
	for _, step := range []struct {
		name    string
		n, want int32
	}{{"set 3", 3, orig}, {"negative only queries", -5, 3}, {"query after set", 0, 3}} {
		st, prev := callSetMaxProcs(step.n)
		require.Equal(t, statusOK, st, step.name)
		require.Equal(t, step.want, prev, step.name)
	}
}

// TestFreeNilIsNoop: the free exports accept NULL, as free(3) does. Their
// deferred recoverSilently would hide a nil dereference, so the freeing
// helpers are called directly too.
func TestFreeNilIsNoop(t *testing.T) {
	assert.NotPanics(t, func() { freePlan(nil) }, "freePlan(nil)")
	assert.NotPanics(t, func() { freeForwardPlan(nil) }, "freeForwardPlan(nil)")
	assert.NotPanics(t, callPlanFreeNil, "goddp_plan_free(NULL)")
	assert.NotPanics(t, callStringFreeNil, "goddp_string_free(NULL)")
}

func TestConvertGraph(t *testing.T) {
	raw := toyGraph(1000)
	// A non-ASCII name and an ignored, frozen parameter exercise the
	// name slicing and the flag bits.
	raw.ParamNames = append(raw.ParamNames[:raw.ParamNameOffsets[5]], "layers.2.bïas"...)
	raw.ParamNameOffsets[6] = int64(len(raw.ParamNames))
	raw.ParamFlags[3] = 2 // ignored, no grad
	raw.ParamBytes[4] = 12345
	raw.ParamStorageBytes[4] = 23456
	raw.ParamDevices[4] = 3
	raw.NodeModuleIDs[9] = 42

	g, err := convertGraphViaC(raw)
	require.NoError(t, err)
	if assert.Len(t, g.Ops, 14) {
		assert.Equal(t, planner.OpPlaceholder, g.Ops[0])
		assert.Equal(t, planner.OpCallFunction, g.Ops[7])
		assert.Equal(t, planner.OpOutput, g.Ops[13])
	}
	assert.Equal(t, raw.NodeModuleIDs, g.ModuleIDs, "module ids")
	assert.Equal(t, raw.NodeParamOffsets, g.ParamOffsets, "node param offsets")
	assert.Equal(t, raw.NodeParams, g.ParamIndex, "node params")
	if assert.Len(t, g.ParamRefs, 6) {
		assert.Equal(t, planner.RefArg, g.ParamRefs[5])
	}
	assert.Equal(t, raw.NodeUserOffsets, g.UserOffsets, "user offsets")
	assert.Equal(t, raw.NodeUsers, g.Users, "users")
	want := []planner.Param{
		{Name: "layers.0.weight", Bytes: 4_000_000, StorageBytes: 4_000_000, DType: 7, RequiresGrad: true},
		{Name: "layers.0.bias", Bytes: 4000, StorageBytes: 4000, DType: 7, RequiresGrad: true},
		{Name: "layers.1.weight", Bytes: 4_000_000, StorageBytes: 4_000_000, DType: 7, RequiresGrad: true},
		{Name: "layers.1.bias", Bytes: 4000, StorageBytes: 4000, DType: 7, Ignored: true},
		{Name: "layers.2.weight", Bytes: 12345, StorageBytes: 23456, DType: 7, Device: 3, RequiresGrad: true},
		{Name: "layers.2.bïas", Bytes: 4000, StorageBytes: 4000, DType: 7, RequiresGrad: true},
	}
	for i := range want {
		want[i].DDPPosition = -1 // param_ddp_positions is NULL
	}
	assert.Equal(t, want, g.Params)
	assert.Nil(t, g.BlockIDs, "no node_block_ids: no block information")
}

// node_block_ids is optional (ABI 4): given, it is copied; NULL leaves
// BlockIDs nil, so that callers written before it plan as before.
func TestConvertBlockIDs(t *testing.T) {
	raw := toyGraph(1000)
	raw.NodeBlockIDs = make([]int32, raw.NumNodes)
	for i := range raw.NodeBlockIDs {
		raw.NodeBlockIDs[i] = int32(i%3) - 1
	}
	g, err := convertGraphViaC(raw)
	require.NoError(t, err)
	assert.Equal(t, raw.NodeBlockIDs, g.BlockIDs)
}

func TestConvertConfig(t *testing.T) {
	s, err := convertSettingsViaC(&rawConfig{Mode: 1, BucketCapBytes: 10, FirstBucketCapBytes: 5,
		NumBucketCaps: 2, BucketCapsBytes: []int64{7, 9}, MaxPieces: 4, AlignBuckets: -3})
	require.NoError(t, err)
	want := planner.Settings{Mode: planner.ModeTorch, UserBucketCapBytes: 10,
		UserFirstBucketCapBytes: 5,
		UserBucketCapsBytes:     []int64{7, 9}, MaxPieces: 4, AlignBuckets: true}
	assert.Equal(t, want, s)
	s, err = convertSettingsViaC(&rawConfig{BucketCapBytes: 10, FirstBucketCapBytes: 5})
	require.NoError(t, err)
	assert.Nil(t, s.UserBucketCapsBytes, "no per-bucket caps")
	assert.False(t, s.AlignBuckets)
	assert.Nil(t, s.DDP, "ddp NULL: no DDP module")

	// ABI 6: caps not given (ABI 11: GODDP_CAP_NOT_GIVEN), block cuts,
	// edges and the DDP module.
	s, err = convertSettingsViaC(&rawConfig{BlockCuts: 1, Edges: 2,
		DDP: &rawDDP{BucketCapBytes: 100, FirstBucketCapBytes: planner.CapNotGiven, NumBucketCaps: 1, BucketCapsBytes: []int64{50},
			Flags: ddpFindUnused | ddpCapIsDefault, NumParams: 6}})
	require.NoError(t, err)
	assert.Equal(t, int64(planner.CapNotGiven), s.UserBucketCapBytes)
	assert.Equal(t, int64(planner.CapNotGiven), s.UserFirstBucketCapBytes)
	assert.True(t, s.BlockCuts)
	assert.Equal(t, planner.EdgesEager, s.Edges)
	assert.Equal(t, &planner.DDPSettings{BucketCapBytes: 100, CapIsDefault: true, FirstBucketCapBytes: planner.CapNotGiven,
		BucketCapsBytes: []int64{50}, FindUnusedParameters: true, NumParams: 6}, s.DDP)

	for name, c := range map[string]*rawConfig{
		"ddp.flags = 0x200 has unknown bits":                {DDP: &rawDDP{BucketCapBytes: 1, Flags: 0x200}},
		"ddp.num_params = -1 is out of range":               {DDP: &rawDDP{BucketCapBytes: 1, NumParams: -1}},
		"ddp.bucket_caps_bytes is NULL but its length is 2": {DDP: &rawDDP{BucketCapBytes: 1, NumBucketCaps: 2}},
	} {
		_, err := convertSettingsViaC(c)
		var perr *planner.Error
		require.ErrorAs(t, err, &perr, name)
		assert.Equal(t, planner.ErrInvalidConfig, perr.Code, name)
		assert.Contains(t, perr.Msg, name)
	}
}

// withStacks gives the toy graph module stacks: layer l's linear and relu
// inside "L['self'].layers.<l>" (a Block), every node inside the model.
func withStacks(g *rawGraph) *rawGraph {
	strs := []string{"L['self']", "Model", "Block", "L['self'].layers.0", "L['self'].layers.1", "L['self'].layers.2"}
	g.NumModuleStrings = int64(len(strs))
	g.ModuleStringOffsets = []int64{0}
	for _, s := range strs {
		g.ModuleStrings = append(g.ModuleStrings, s...)
		g.ModuleStringOffsets = append(g.ModuleStringOffsets, int64(len(g.ModuleStrings)))
	}
	g.NodeStackOffsets = []int64{0}
	for i := range g.NumNodes {
		g.NodeStackPaths, g.NodeStackTypes = append(g.NodeStackPaths, 0), append(g.NodeStackTypes, 1)
		if i >= 7 && i < 13 {
			g.NodeStackPaths, g.NodeStackTypes = append(g.NodeStackPaths, int32(3+(i-7)/2)), append(g.NodeStackTypes, 2)
		}
		g.NodeStackOffsets = append(g.NodeStackOffsets, int64(len(g.NodeStackPaths)))
	}
	return g
}

func TestConvertStacks(t *testing.T) {
	st, err := convertStacksViaC(toyGraph(10))
	require.NoError(t, err)
	assert.Nil(t, st, "no node_stack_offsets: no stacks")

	raw := withStacks(toyGraph(10))
	st, err = convertStacksViaC(raw)
	require.NoError(t, err)
	assert.Equal(t, []string{"L['self']", "Model", "Block", "L['self'].layers.0", "L['self'].layers.1", "L['self'].layers.2"}, st.Strings)
	assert.Equal(t, raw.NodeStackOffsets, st.Offsets)
	assert.Equal(t, raw.NodeStackPaths, st.Paths)
	assert.Equal(t, raw.NodeStackTypes, st.Types)

	for name, edit := range map[string]func(g *rawGraph){
		"node_stack_paths is NULL":                             func(g *rawGraph) { g.NodeStackPaths = nil },
		"node_stack_types is NULL":                             func(g *rawGraph) { g.NodeStackTypes = nil },
		"num_module_strings = -1":                              func(g *rawGraph) { g.NumModuleStrings = -1 },
		"module_string_offsets[0:2] = [0, 100] is not a range": func(g *rawGraph) { g.ModuleStringOffsets[1] = 100 },
	} {
		g := withStacks(toyGraph(10))
		edit(g)
		_, err := convertStacksViaC(g)
		require.ErrorContains(t, err, name, name)
	}
}

// TestDecisionsThroughC: the ABI 6 settings go in and the decisions come
// back: caps from DDP's settings, the block assignment from the module
// stacks, the eager edges, the first-use parameters per piece, the counted
// parameters, the alignment reason and the alignment's name.
func TestDecisionsThroughC(t *testing.T) {
	cfg := &rawConfig{AlignBuckets: 1, BlockCuts: 1, Edges: 2,
		DDP: &rawDDP{BucketCapBytes: 4_000_000, FirstBucketCapBytes: planner.CapNotGiven, NumParams: 6}}
	g := withStacks(toyGraph(1000))
	g.ParamDDPPositions = []int32{0, 1, 2, 3, 4, 5}
	res := callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	d := res.Decision
	assert.Equal(t, int64(4_000_000), d.Config.BucketCapBytes, "DDP's cap")
	assert.Equal(t, int64(4_000_000), d.Config.FirstBucketCapBytes, "DDP's rule: a cap of its own is also the first cap")
	assert.True(t, d.Config.AlignBuckets)
	assert.Equal(t, planner.ReasonAligned, d.AlignReason)
	assert.Zero(t, d.AlignedParams)
	assert.Equal(t, 6, d.CountedParams)
	assert.Equal(t, []int32{-1, -1, -1, -1, -1, -1, -1, 0, 0, 1, 1, 2, 2, -1}, d.BlockIDs)
	assert.Equal(t, 3, res.Plan.NumPieces, "a piece per block")
	assert.Equal(t, [][]int32{{0, 1}, {2, 3}, {4, 5}}, d.PieceParams)
	assert.Nil(t, d.EagerPieces, "no edges: every piece is a block")
	assert.Equal(t, planner.AlignReady, alignmentOf(g, cfg))

	// find_unused_parameters without static_graph: declaration order.
	cfg.DDP.Flags = ddpFindUnused
	res = callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, planner.OrderDeclaration, res.Decision.Config.BucketOrder)
	assert.Equal(t, planner.AlignDeclaration, alignmentOf(g, cfg))

	// DDP reduces a parameter the graph does not use (a graph break): the
	// aligned plan is kept for the forward's combined layout, not for DDP.
	cfg.DDP.Flags, cfg.DDP.NumParams = 0, 7
	res = callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, planner.ReasonPartOfForward, res.Decision.AlignReason)
	assert.Equal(t, 6, res.Decision.AlignedParams, "of DDP's 7")
	assert.False(t, res.Decision.Config.AlignBuckets)
	assert.Equal(t, planner.AlignReady, alignmentOf(g, cfg))

	// The same under find_unused_parameters (declaration order): unaligned.
	cfg.DDP.Flags = ddpFindUnused
	res = callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, planner.ReasonNotCovered, res.Decision.AlignReason)
	assert.False(t, res.Decision.Config.AlignBuckets)
	assert.Equal(t, 6, res.Decision.AlignedParams)
	assert.Equal(t, planner.AlignNone, alignmentOf(g, cfg))
	cfg.DDP.Flags = 0

	// Bad input gets a message naming it.
	for name, edit := range map[string]func(c *rawConfig){
		"the user's bucket cap is -1 bytes":  func(c *rawConfig) { c.BucketCapBytes = -1 },
		"DDP's first-bucket cap is -1 bytes": func(c *rawConfig) { c.DDP.FirstBucketCapBytes = -1 },
		"ddp.flags = 0x400 has unknown bits": func(c *rawConfig) { c.DDP.Flags = 0x400 },
		"unknown edge policy 5":              func(c *rawConfig) { c.Edges = 5 },
	} {
		c := *cfg
		ddp := *cfg.DDP
		c.DDP = &ddp
		edit(&c)
		res := callPlanGraph(g, &c, false)
		assert.Equal(t, statusInvalidConfig, res.Status, name)
		assert.Contains(t, res.Msg, name)
		assert.True(t, res.OutNull, name)
	}
	bad := withStacks(toyGraph(1000))
	bad.NodeStackPaths[0] = 99
	res = callPlanGraph(bad, cfg, false)
	assert.Equal(t, statusInvalidGraph, res.Status)
	assert.Contains(t, res.Msg, "path string 99 out of range")
}

// TestBadPointersAndLengths covers the checks the bridge itself makes before
// it reads caller memory: each must fail with the right status, a message
// naming the field, and *out left NULL.
func TestBadPointersAndLengths(t *testing.T) {
	cases := []struct {
		name    string
		edit    func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig)
		status  int
		message string
	}{
		{"null graph", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { return nil, c }, statusInvalidGraph, "graph is NULL"},
		{"null config", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { return g, nil }, statusInvalidConfig, "config is NULL"},
		{"negative num_nodes", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NumNodes = -1; return g, c }, statusInvalidGraph, "num_nodes"},
		{"huge num_nodes", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NumNodes = 1 << 40; return g, c }, statusInvalidGraph, "num_nodes"},
		{"negative num_params", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NumParams = -3; return g, c }, statusInvalidGraph, "num_params"},
		{"null node_ops", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeOps = nil; return g, c }, statusInvalidGraph, "node_ops is NULL"},
		{"null node_module_ids", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeModuleIDs = nil; return g, c }, statusInvalidGraph, "node_module_ids is NULL"},
		{"null node_param_offsets", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeParamOffsets = nil; return g, c }, statusInvalidGraph, "node_param_offsets is NULL"},
		{"negative last param offset", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) {
			g.NodeParamOffsets[g.NumNodes] = -2
			return g, c
		}, statusInvalidGraph, "node_param_offsets[14]"},
		{"null node_params", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeParams = nil; return g, c }, statusInvalidGraph, "node_params is NULL"},
		{"null node_param_refs", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeParamRefs = nil; return g, c }, statusInvalidGraph, "node_param_refs is NULL"},
		{"null node_users", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.NodeUsers = nil; return g, c }, statusInvalidGraph, "node_users is NULL"},
		{"null param_bytes", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamBytes = nil; return g, c }, statusInvalidGraph, "param_bytes is NULL"},
		{"null param_flags", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamFlags = nil; return g, c }, statusInvalidGraph, "param_flags is NULL"},
		{"null param_names", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamNames = nil; return g, c }, statusInvalidGraph, "param_names is NULL"},
		{"name offsets backwards", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamNameOffsets[2] = 1; return g, c }, statusInvalidGraph, "param_name_offsets[1:3]"},
		{"unknown flag bit", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { g.ParamFlags[4] = 0x10; return g, c }, statusInvalidGraph, "param_flags[4]"},
		{"negative num_bucket_caps", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { c.NumBucketCaps = -1; return g, c }, statusInvalidConfig, "bucket_caps_bytes: negative length"},
		{"null bucket caps", func(g *rawGraph, c *rawConfig) (*rawGraph, *rawConfig) { c.NumBucketCaps = 2; return g, c }, statusInvalidConfig, "bucket_caps_bytes is NULL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, cfg := c.edit(toyGraph(1000), toyConfig(planner.ModeDDP))
			res := callPlanGraph(g, cfg, false)
			assert.Equal(t, c.status, res.Status)
			assert.Contains(t, res.Msg, c.message)
			assert.True(t, res.OutNull, "*out not NULL after a failure")
		})
	}
	t.Run("null out", func(t *testing.T) {
		res := callPlanGraph(toyGraph(1000), toyConfig(planner.ModeDDP), true)
		assert.Equal(t, statusInvalidConfig, res.Status)
		assert.Contains(t, res.Msg, "out is NULL")
	})
}

// TestSpansBoundEveryRead: with the caller's arrays given (goddp_span,
// ABI 12), an array of another length than its count or offsets say is
// refused naming the field, never read past.
func TestSpansBoundEveryRead(t *testing.T) {
	g := toyGraph(1000)
	g.Spans = true
	assert.Equal(t, statusOK, callPlanGraph(g, toyConfig(planner.ModeDDP), false).Status)
	cases := map[string]func(g *rawGraph){
		"node_users has 12 items; the counts and offsets say 13": func(g *rawGraph) { g.NodeUsers = g.NodeUsers[1:] },
		"node_ops has 13 items; the counts and offsets say 14":   func(g *rawGraph) { g.NodeOps = g.NodeOps[1:] },
		"param_names has 2 items; the counts":                    func(g *rawGraph) { g.ParamNames = g.ParamNames[:2] },
		"param_flags has 0 items; the counts and offsets say 6":  func(g *rawGraph) { g.ParamFlags = []uint32{} },
		"node_params has 7 items; the counts and offsets say 6":  func(g *rawGraph) { g.NodeParams = append(g.NodeParams, 0) },
		"node_ops has 14 items; the counts and offsets say 0":    func(g *rawGraph) { g.NumNodes = 0 },
	}
	for message, edit := range cases {
		g := toyGraph(1000)
		g.Spans = true
		edit(g)
		res := callPlanGraph(g, toyConfig(planner.ModeDDP), false)
		assert.Equal(t, statusInvalidGraph, res.Status, message)
		assert.Contains(t, res.Msg, message)
	}
}

// TestBridgeMatchesPlanner checks the round trip through C: whatever
// planner.Build returns for the toy graph, success or error, the export
// must return the same thing.
func TestBridgeMatchesPlanner(t *testing.T) {
	for _, tc := range []struct {
		mode  planner.Mode
		align int32
	}{{planner.ModeDDP, 0}, {planner.ModeTorch, 0}, {planner.ModeDDP, 1}, {planner.ModeTorch, 1}} {
		mode := tc.mode
		t.Run(fmt.Sprintf("mode%d_align%d", mode, tc.align), func(t *testing.T) {
			raw, rawCfg := toyGraph(1000), toyConfig(mode)
			if tc.align != 0 {
				// Caps that split each layer's bias from its weight, so the
				// predicted buckets outnumber the pieces and alignment shows.
				rawCfg.AlignBuckets = tc.align
				rawCfg.BucketCapBytes, rawCfg.FirstBucketCapBytes = 4_000_000, 4_000
			}
			g, err := convertGraphViaC(raw)
			require.NoError(t, err)
			settings, err := convertSettingsViaC(rawCfg)
			require.NoError(t, err)
			var want *planner.Plan
			dec, wantErr := planner.Decide(&planner.Request{Graph: g, Settings: settings})
			if wantErr == nil {
				want = dec.Plan
			}
			res := callPlanGraph(raw, rawCfg, false)
			if wantErr != nil {
				require.Equal(t, statusOfInt(wantErr), res.Status, "bridge vs planner status")
				require.Equal(t, wantErr.Error(), res.Msg)
				require.True(t, res.OutNull)
				return
			}
			require.Equal(t, statusOK, res.Status, res.Msg)
			require.NotNil(t, res.Plan)
			got := res.Plan
			// DType and Device are not part of the C plan.
			for i := range want.Buckets {
				want.Buckets[i].DType, want.Buckets[i].Device = 0, 0
			}
			assert.Equal(t, want.Fingerprint, got.Fingerprint, "fingerprint")
			assert.Equal(t, want.NumPieces, got.NumPieces, "pieces")
			assert.Equal(t, want.NodePiece, got.NodePiece, "node pieces")
			assert.Equal(t, want.Buckets, got.Buckets, "buckets")
			if !equalLists(got.PieceInputs, want.PieceInputs) || !equalLists(got.PieceOutputs, want.PieceOutputs) {
				t.Errorf("crossing values differ:\n got %v / %v\nwant %v / %v",
					got.PieceInputs, got.PieceOutputs, want.PieceInputs, want.PieceOutputs)
			}
			assert.True(t, equalLists(dec.PieceParams, res.Decision.PieceParams), "piece params")
			assert.Equal(t, dec.AlignReason, res.Decision.AlignReason, "align reason")
			assert.Equal(t, dec.CountedParams, res.Decision.CountedParams, "counted parameters")
		})
	}
}

// TestAlignBucketsThroughC: align_buckets crosses the ABI. The toy graph
// with caps that close one bucket per bias and one per weight has four
// predicted buckets over three pieces; aligned, it has one bucket per piece
// holding that layer's weight and bias. torch mode refuses the option.
func TestAlignBucketsThroughC(t *testing.T) {
	cfg := toyConfig(planner.ModeDDP)
	cfg.BucketCapBytes, cfg.FirstBucketCapBytes = 4_000_000, 4_000
	plain := callPlanGraph(toyGraph(1000), cfg, false)
	cfg.AlignBuckets = 1
	aligned := callPlanGraph(toyGraph(1000), cfg, false)
	require.Equal(t, statusOK, plain.Status, plain.Msg)
	require.Equal(t, statusOK, aligned.Status, aligned.Msg)
	require.Equal(t, 3, plain.Plan.NumPieces, "unaligned pieces")
	require.Len(t, plain.Plan.Buckets, 4, "unaligned buckets")
	require.Equal(t, 3, aligned.Plan.NumPieces, "aligned pieces")
	require.Len(t, aligned.Plan.Buckets, 3, "aligned buckets")
	for k, b := range aligned.Plan.Buckets {
		l := int32(2 - k) // layer l's bias and weight
		assert.Equal(t, int64(4_004_000), b.Bytes, "aligned bucket %d", k)
		assert.Equal(t, int(l), b.Piece, "aligned bucket %d", k)
		assert.Equal(t, []int32{2*l + 1, 2 * l}, b.Params, "aligned bucket %d", k)
	}
	assert.NotEqual(t, plain.Plan.Fingerprint, aligned.Plan.Fingerprint, "align_buckets must change the fingerprint")
	cfg.Mode = int32(planner.ModeTorch)
	res := callPlanGraph(toyGraph(1000), cfg, false)
	assert.Equal(t, statusInvalidConfig, res.Status, "torch mode with align_buckets")
	assert.Contains(t, res.Msg, "AlignBuckets")
}

// TestDeclarationOrderThroughC: bucket_order and param_ddp_positions cross
// the ABI, and alignment, ddp_caps and merged_cuts come back. Declared in
// forward order, the toy graph keeps its three pieces and the caps list
// them forward-first; with layer 2 declared first, it joins layer 0's
// bucket and its own cut goes. Without positions, declaration order is
// refused with a message.
func TestDeclarationOrderThroughC(t *testing.T) {
	cfg := toyConfig(planner.ModeDDP)
	cfg.BucketCapBytes, cfg.FirstBucketCapBytes = 4_000_000, 4_000
	cfg.AlignBuckets, cfg.BucketOrder = 1, int32(planner.OrderDeclaration)

	g := toyGraph(1000)
	g.ParamDDPPositions = []int32{0, 1, 2, 3, 4, 5}
	res := callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, planner.AlignDeclaration, res.Plan.Alignment)
	assert.Equal(t, 3, res.Plan.NumPieces)
	assert.Equal(t, []int64{4_004_000, 4_004_000, 4_004_000}, res.Plan.DDPCaps)
	assert.Equal(t, 0, res.Plan.MergedCuts)

	g.ParamDDPPositions = []int32{2, 3, 4, 5, 0, 1} // layer 2 (used last) declared first
	res = callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, planner.AlignDeclarationMerged, res.Plan.Alignment)
	assert.Equal(t, 2, res.Plan.NumPieces)
	assert.Equal(t, 1, res.Plan.MergedCuts)
	assert.Equal(t, []int64{2 * 4_004_000, 4_004_000}, res.Plan.DDPCaps)

	g.ParamDDPPositions = nil
	res = callPlanGraph(g, cfg, false)
	assert.Equal(t, statusInvalidGraph, res.Status)
	assert.Contains(t, res.Msg, "has no DDP position")

	cfg.BucketOrder = 0
	res = callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, planner.AlignReady, res.Plan.Alignment)
	assert.Equal(t, []int64{4_004_000, 4_004_000, 4_004_000}, res.Plan.DDPCaps)
}

// equalLists compares lists of lists treating nil and empty alike: the C
// plan cannot tell them apart.
func equalLists(a, b [][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// TestConcurrentCalls plans from several goroutines at once (run with -race):
// each plans, as a call alone does.
func TestConcurrentCalls(t *testing.T) {
	const workers = 8
	results := make([]planCall, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = callPlanGraph(toyGraph(1000), toyConfig(planner.ModeDDP), false)
		}()
	}
	wg.Wait()
	want := callPlanGraph(toyGraph(1000), toyConfig(planner.ModeDDP), false)
	require.Equal(t, statusOK, want.Status, want.Msg)
	for i := range workers {
		assert.Equal(t, want, results[i], "worker %d vs a call alone", i)
	}
}

// TestUniformCapsThroughC: goddp_config.uniform_caps (ABI 9) crosses the
// ABI: DDP's default first-bucket cap (1 MiB under the default 25 MiB cap)
// gives way to the cap, and torch mode refuses it by name.
func TestUniformCapsThroughC(t *testing.T) {
	cfg := &rawConfig{
		DDP: &rawDDP{BucketCapBytes: 25 << 20, FirstBucketCapBytes: planner.CapNotGiven, Flags: ddpCapIsDefault}}
	g := toyGraph(1000)
	res := callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, int64(1<<20), res.Decision.Config.FirstBucketCapBytes, "DDP's rule without uniform_caps")
	cfg.UniformCaps = 1
	res = callPlanGraph(g, cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	assert.Equal(t, int64(25<<20), res.Decision.Config.FirstBucketCapBytes, "uniform_caps: the cap for every bucket")
	cfg.Mode = 1
	res = callPlanGraph(g, cfg, false)
	assert.Equal(t, statusInvalidConfig, res.Status)
	assert.Contains(t, res.Msg, "UniformCaps")
}
