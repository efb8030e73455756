package planner

import (
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withCosts sets g's node costs: every node costs flops 0 and bytes 0 but
// those listed, by node index.
func withCosts(g *Graph, flops, bytes map[int]int64) *Graph {
	g.NodeFlops = make([]int64, len(g.Ops))
	g.NodeBytes = make([]int64, len(g.Ops))
	for i, f := range flops {
		g.NodeFlops[i] = f
	}
	for i, b := range bytes {
		g.NodeBytes[i] = b
	}
	return g
}

// The tail of costLayout: piece 0 the preamble (nodes 1-2), pieces 1 and 2
// the blocks (nodes 3-5 and 6-8), piece 3 the tail (nodes 9-11).
var costLayout = [][]int32{{-1, -1}, {0, 0, 0}, {1, 1, 1}, {-1, -1, -1}}

func TestEdgeCosts(t *testing.T) {
	const mib = 1 << 20
	// Each block: 100 Mflop of kernels and 10 MiB unfused.
	blockFlops := map[int]int64{3: 100e6, 6: 100e6}
	blockBytes := map[int]int64{4: 10 * mib, 7: 10 * mib}
	merge := func(a, b map[int]int64) map[int]int64 {
		out := map[int]int64{}
		for _, m := range []map[int]int64{a, b} {
			for k, v := range m {
				out[k] += v
			}
		}
		return out
	}
	// The step in bytes: 2 * (10 MiB + 100e6/16) = 32.4 MiB, plus the edges.
	cases := []struct {
		name         string
		flops, bytes map[int]int64
		want         []int32
	}{
		{"edges of kernels only run eagerly, however large the kernel (a head without its loss)",
			map[int]int64{1: 1e6, 10: 5e9}, map[int]int64{9: 64 << 10}, []int32{0, 3}},
		{"a tail whose unfused bytes are a measurable share is compiled (the loss over a large vocabulary)",
			map[int]int64{10: 5e9}, map[int]int64{9: 64 << 10, 11: 200 * mib}, []int32{0}},
		{"a preamble of unfused work is compiled too",
			nil, map[int]int64{1: 30 * mib}, []int32{3}},
		{"costs of nothing: every edge is free to run eagerly", nil, nil, []int32{0, 3}},
	}
	for _, tc := range cases {
		g, pieces, n := edgeGraph(costLayout)
		withCosts(g, merge(blockFlops, tc.flops), merge(blockBytes, tc.bytes))
		require.NoError(t, validateGraph(g), tc.name)
		assert.Equal(t, tc.want, eagerPieces(g, pieces, n, EdgesAuto), tc.name)
		assert.Equal(t, []int32{0, 3}, eagerPieces(g, pieces, n, EdgesEager), "eager ignores the costs: "+tc.name)
		assert.Nil(t, eagerPieces(g, pieces, n, EdgesCompile), tc.name)
	}
}

func TestEdgeCostsAtTheShare(t *testing.T) {
	// One node per piece: a preamble costing exactly 1/negligibleShare of
	// the step runs eagerly, one byte more is compiled.
	g, pieces, n := edgeGraph([][]int32{{-1}, {0}, {1}})
	const blocks = 1 << 20
	g.NodeFlops, g.NodeBytes = make([]int64, len(g.Ops)), make([]int64, len(g.Ops))
	g.NodeBytes[2], g.NodeBytes[3] = blocks, blocks
	// step = (edge + 2 * blocks) * 16; eager iff edge * 16 * 50 <= step,
	// i.e. edge * 49 <= 2 * blocks.
	edge := int64(2 * blocks / (negligibleShare - 1))
	g.NodeBytes[1] = edge
	assert.Equal(t, []int32{0}, eagerPieces(g, pieces, n, EdgesAuto))
	g.NodeBytes[1] = edge + 1
	assert.Nil(t, eagerPieces(g, pieces, n, EdgesAuto))
}

func TestEdgeCostsSaturate(t *testing.T) {
	g, pieces, n := edgeGraph(costLayout)
	withCosts(g, map[int]int64{3: math.MaxInt64, 6: math.MaxInt64}, map[int]int64{4: math.MaxInt64, 9: 1})
	assert.Equal(t, []int32{0, 3}, eagerPieces(g, pieces, n, EdgesAuto), "a step past int64 makes every small edge negligible")
	g.NodeBytes[9] = math.MaxInt64
	assert.Equal(t, []int32{0}, eagerPieces(g, pieces, n, EdgesAuto), "an edge past int64 is not")
}

func TestEdgeCostsValidated(t *testing.T) {
	for _, tc := range []struct {
		flops, bytes []int64
		want         string
	}{
		{[]int64{0}, nil, "NodeFlops and NodeBytes go together"},
		{nil, []int64{0}, "NodeFlops and NodeBytes go together"},
		{[]int64{0, 0}, []int64{0, 0}, "NodeFlops has 2 entries, want one per node"},
		{[]int64{0, 0, 0, 0, 0, 0}, []int64{0, 0, 0, -1, 0, 0}, "node 3: NodeBytes is -1"},
		{[]int64{0, -5, 0, 0, 0, 0}, []int64{0, 0, 0, 0, 0, 0}, "node 1: NodeFlops is -5"},
	} {
		g, _, _ := edgeGraph([][]int32{{-1}, {0, 0}, {1}})
		g.NodeFlops, g.NodeBytes = tc.flops, tc.bytes
		err := validateGraph(g)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		var perr *Error
		require.ErrorAs(t, err, &perr)
		assert.Equal(t, ErrInvalidGraph, perr.Code)
	}
}

// naiveEagerAuto is EdgesAuto's rule in exact arithmetic: an edge piece
// runs eagerly when its unfused bytes, at kernelFlopsPerByte flops a byte,
// are at most 1/negligibleShare of every node's bytes and flops together.
func naiveEagerAuto(g *Graph, nodePiece []int32, numPieces int) []int32 {
	first, last := blockSpan(g)
	step := new(big.Int)
	for i := range g.Ops {
		b := new(big.Int).Mul(big.NewInt(g.NodeBytes[i]), big.NewInt(kernelFlopsPerByte))
		step.Add(step, b.Add(b, big.NewInt(g.NodeFlops[i])))
	}
	limit := new(big.Int).Div(step, big.NewInt(kernelFlopsPerByte*negligibleShare))
	var eager []int32
	for p := range numPieces {
		edge, compute, penalty := true, false, new(big.Int)
		for i, op := range g.Ops {
			if nodePiece[i] != int32(p) || !isCompute(op) {
				continue
			}
			compute = true
			edge = edge && (i < first || i > last)
			penalty.Add(penalty, big.NewInt(g.NodeBytes[i]))
		}
		if first >= 0 && edge && compute && penalty.Cmp(limit) <= 0 {
			eager = append(eager, int32(p))
		}
	}
	return eager
}

// FuzzEdgeCosts checks EdgesAuto against naiveEagerAuto on costs small
// enough that no sum saturates.
func FuzzEdgeCosts(f *testing.F) {
	f.Add([]byte{2, 0, 0, 1, 1, 3}, []byte{9, 1, 200, 7, 0, 3, 4, 250})
	f.Add([]byte{0, 1, 2, 3}, []byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, layout, costs []byte) {
		if len(layout) == 0 || len(layout) > 40 {
			return
		}
		// layout: per node, piece = b>>4 (pieces in order), block = b&3 - 1
		var pieces [][]int32
		for _, b := range layout {
			p := min(int(b>>4), len(pieces))
			if p == len(pieces) {
				pieces = append(pieces, nil)
			}
			pieces[p] = append(pieces[p], int32(b&3)-1)
		}
		g, nodePiece, n := edgeGraph(pieces)
		g.NodeFlops, g.NodeBytes = make([]int64, len(g.Ops)), make([]int64, len(g.Ops))
		for i := range g.Ops {
			if 2*i+1 < len(costs) {
				g.NodeFlops[i] = int64(costs[2*i]) << (costs[2*i] % 30)
				g.NodeBytes[i] = int64(costs[2*i+1]) << (costs[2*i+1] % 24)
			}
		}
		require.NoError(t, validateGraph(g))
		assert.Equal(t, naiveEagerAuto(g, nodePiece, n), eagerPieces(g, nodePiece, n, EdgesAuto))
	})
}
