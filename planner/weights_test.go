package planner

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Node weights (Note [Node weights]): a checkpointed block is three outer nodes (the
// body's get_attr, the call, a getitem) that stand for its body's nodes.

func TestWeightsCountInstances(t *testing.T) {
	block := func(k int) []stackEntry { return []stackEntry{{fmt.Sprintf("L['self'].blocks.%d", k), "Block"}} }
	// one node per instance: no block unless its weight says it is more
	stacks := [][]stackEntry{nil, block(0), block(1), block(2), nil}
	g := blockGraph(stacks[1:4])
	st := stacksOf(stacks, false)
	require.NoError(t, validateStacks(st, len(g.Ops)))
	assert.Nil(t, assignBlocks(g, st), "single-node instances")
	st.Weights = []int32{1, 5, 5, 5, 1}
	require.NoError(t, validateStacks(st, len(g.Ops)))
	assert.Equal(t, []int32{-1, 0, 1, 2, -1}, assignBlocks(g, st))
	// weight 0 (a body's get_attr) counts nothing but still joins its block
	st.Weights = []int32{1, 0, 0, 0, 1}
	assert.Nil(t, assignBlocks(g, st))
}

func TestWeightsValidated(t *testing.T) {
	g := blockGraph([][]stackEntry{nil, nil})
	for _, tc := range []struct {
		weights []int32
		want    string
	}{
		{[]int32{1, 1}, "2 node weights for 4 nodes"},
		{[]int32{1, -1, 1, 1}, "node 1 has weight -1"},
	} {
		st := stacksOf([][]stackEntry{nil, nil, nil, nil}, false)
		st.Weights = tc.weights
		_, err := Decide(&Request{Graph: g, Stacks: st, Settings: Settings{BlockCuts: true}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}
