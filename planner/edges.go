package planner

import "math"

// This file picks the edge pieces that the caller runs eagerly.
//
// Note [Edges]: a graph with repeated blocks has, outside them, a preamble
// before the first block (embeddings) and a tail after the last (final
// norm, head, often the loss); the pieces that lie wholly there are its
// edges (with block cuts, at most two). Each is a distinct graph, so
// compiling it costs about what compiling a block does, while it runs once
// per step against the blocks' many. Regional compilation, the alternative
// users weigh goddp against, runs them eagerly to save that compile time.
// goddp does so only where it cannot cost the steady step a measurable
// share (EdgesAuto, Note [Edge costs]): a default never trades time on
// every step for time once. Running a piece eagerly changes nothing DDP
// communicates, so ranks need not agree on it.
//
// Note [Edge costs]: what running a piece eagerly costs is what the inner
// compiler would have saved. The library kernels (matrix products,
// convolutions, attention) are the same either way; the rest, run op by op,
// each reading and writing memory that the compiler's fusion would not, is
// what differs. So per node the caller estimates two numbers from its
// shapes (Graph.NodeFlops, Graph.NodeBytes): the kernels' flops, and the
// bytes the node reads and writes unfused. An edge's penalty is at most its
// unfused bytes; the step is every node's bytes plus its flops at
// kernelFlopsPerByte flops a byte (a machine's balance: about 12 measured
// on this project's 2-core CPU, 10 to 20 for fp32 GPU kernels; higher,
// as on bf16 tensor cores, makes the step's bytes count for more and keeps
// more edges compiled). An edge runs eagerly when its penalty is at most
// 1/negligibleShare of the step. Forward and backward scale alike, so the
// forward's numbers stand for the step's. The measured cases are in
// docs/benchmarks.md ("The edges"): a tied head with the loss over GPT-2's
// vocabulary costs 6 % of the step unfused and is compiled; a head without
// the loss, a small vocabulary's, a ViT's patch embedding and class head
// cost well under 1 % and run eagerly. Without estimates EdgesAuto
// compiles every edge.

// EdgePolicy says which edge pieces run eagerly (Note [Edges]).
type EdgePolicy int32

const (
	EdgesCompile EdgePolicy = 0 // none: every piece is compiled
	EdgesAuto    EdgePolicy = 1 // the edges whose penalty is negligible (Note [Edge costs])
	EdgesEager   EdgePolicy = 2 // every edge
)

// The constants of Note [Edge costs].
const (
	kernelFlopsPerByte = 16
	negligibleShare    = 50 // 2 % of the step
)

// eagerPieces returns the pieces to run eagerly, ascending: under policy,
// the pieces whose compute nodes all lie before the first compute node of
// a block or after the last, in a graph with BlockIDs.
func eagerPieces(g *Graph, nodePiece []int32, numPieces int, policy EdgePolicy) []int32 {
	if policy == EdgesCompile || g.BlockIDs == nil || (policy == EdgesAuto && g.NodeFlops == nil) {
		return nil
	}
	first, last := -1, -1
	for i, op := range g.Ops {
		if isCompute(op) && g.BlockIDs[i] >= 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return nil
	}
	hasCompute := make([]bool, numPieces)
	inside := make([]bool, numPieces)
	penalty := make([]int64, numPieces)
	var step int64
	for i, op := range g.Ops {
		if policy == EdgesAuto {
			step = satAdd(step, satAdd(satMul(g.NodeBytes[i], kernelFlopsPerByte), g.NodeFlops[i]))
		}
		p := nodePiece[i]
		if p < 0 || !isCompute(op) {
			continue
		}
		hasCompute[p] = true
		if first <= i && i <= last {
			inside[p] = true
		}
		if policy == EdgesAuto {
			penalty[p] = satAdd(penalty[p], g.NodeBytes[i])
		}
	}
	var eager []int32
	for p := range numPieces {
		if inside[p] || !hasCompute[p] {
			continue
		}
		// penalty <= step / negligibleShare, the step in bytes.
		if policy == EdgesEager || penalty[p] <= step/(kernelFlopsPerByte*negligibleShare) {
			eager = append(eager, int32(p))
		}
	}
	return eager
}

// satAdd and satMul are + and * on non-negative int64s that stop at
// math.MaxInt64 instead of wrapping.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if b != 0 && a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}
