//go:build goddp_testhooks

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goddp/goddp/planner"
)

// withBodies gives the toy graph's layers as if each were one
// higher-order-op call (ABI 10, Note [Body stacks]): linear_l (7+2l) is a
// call whose body holds two nodes inside "L['self'].layers.<l>", relu_l its
// companion; no node of a layer has a stack of its own.
func withBodies(g *rawGraph) *rawGraph {
	g = withStacks(g)
	g.NodeStackPaths, g.NodeStackTypes, g.NodeStackOffsets = nil, nil, []int64{0}
	for range g.NumNodes {
		g.NodeStackOffsets = append(g.NodeStackOffsets, 0)
	}
	g.NodeBodyOffsets, g.BodyStackOffsets = []int64{0}, []int64{0}
	for i := range g.NumNodes {
		g.NodeHopCalls = append(g.NodeHopCalls, -1)
		if i >= 7 && i < 13 {
			g.NodeHopCalls[i] = int32(7 + 2*((i-7)/2))
		}
		if g.NodeHopCalls[i] == int32(i) {
			for range 2 {
				g.BodyStackPaths = append(g.BodyStackPaths, 0, int32(3+(i-7)/2))
				g.BodyStackTypes = append(g.BodyStackTypes, 1, 2)
				g.BodyStackOffsets = append(g.BodyStackOffsets, int64(len(g.BodyStackPaths)))
			}
		}
		g.NodeBodyOffsets = append(g.NodeBodyOffsets, int64(len(g.BodyStackOffsets)-1))
	}
	return g
}

func TestConvertBodies(t *testing.T) {
	st, err := convertStacksViaC(withStacks(toyGraph(10)))
	require.NoError(t, err)
	assert.Nil(t, st.Bodies, "no node_hop_calls: no body facts")

	raw := withBodies(toyGraph(10))
	st, err = convertStacksViaC(raw)
	require.NoError(t, err)
	require.NotNil(t, st.Bodies)
	assert.Equal(t, raw.NodeHopCalls, st.Bodies.Calls)
	assert.Equal(t, raw.NodeBodyOffsets, st.Bodies.Offsets)
	assert.Equal(t, raw.BodyStackOffsets, st.Bodies.StackOffsets)
	assert.Equal(t, raw.BodyStackPaths, st.Bodies.Paths)
	assert.Equal(t, raw.BodyStackTypes, st.Bodies.Types)

	for name, edit := range map[string]func(g *rawGraph){
		"node_body_offsets is NULL":            func(g *rawGraph) { g.NodeBodyOffsets = nil },
		"body_stack_offsets is NULL":           func(g *rawGraph) { g.BodyStackOffsets = nil },
		"body_stack_paths is NULL":             func(g *rawGraph) { g.BodyStackPaths = nil },
		"body_stack_types is NULL":             func(g *rawGraph) { g.BodyStackTypes = nil },
		"node_body_offsets[14] = -1":           func(g *rawGraph) { g.NodeBodyOffsets[14] = -1 },
		"the body facts need node_hop_calls":   func(g *rawGraph) { g.NodeHopCalls = nil },
		"node_hop_calls without module stacks": func(g *rawGraph) { g.NodeStackOffsets = nil },
	} {
		_, err := convertStacksViaC(func() *rawGraph { g := withBodies(toyGraph(10)); edit(g); return g }())
		require.ErrorContains(t, err, name, name)
	}
}

// TestBodiesThroughC: the body facts decide the blocks as the stacks they
// stand for do, and bad facts are the planner's clear error.
func TestBodiesThroughC(t *testing.T) {
	cfg := &rawConfig{BlockCuts: 1,
		DDP: &rawDDP{BucketCapBytes: 4_000_000, FirstBucketCapBytes: planner.CapNotGiven, NumParams: 6}}
	res := callPlanGraph(withBodies(toyGraph(1000)), cfg, false)
	require.Equal(t, statusOK, res.Status, res.Msg)
	want := callPlanGraph(withStacks(toyGraph(1000)), cfg, false)
	require.Equal(t, statusOK, want.Status, want.Msg)
	assert.Equal(t, []int32{-1, -1, -1, -1, -1, -1, -1, 0, 0, 1, 1, 2, 2, -1}, res.Decision.BlockIDs)
	assert.Equal(t, want.Plan.Fingerprint, res.Plan.Fingerprint)

	bad := withBodies(toyGraph(1000))
	bad.NodeHopCalls[8] = 10
	res = callPlanGraph(bad, cfg, false)
	assert.Equal(t, int(planner.ErrInvalidGraph), res.Status)
	assert.Contains(t, res.Msg, "node 8 belongs to node 10, which is no call")
}
