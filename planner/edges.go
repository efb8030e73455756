package planner

// This file picks the edge pieces that the caller runs eagerly.
//
// Note [Edges]: a graph with repeated blocks has, outside them, a preamble
// before the first block (embeddings) and a tail after the last (final
// norm, head); the pieces that lie wholly there are its edges (with block
// cuts, at most two). Each is a distinct graph, so compiling it costs about
// what compiling a block does, while it runs once per step against the
// blocks' many. Regional compilation, the alternative users weigh goddp
// against, runs them eagerly for that reason. goddp does too, by default
// (EdgesAuto), for an edge no bigger than the mean block in compute nodes;
// a larger edge holds enough work for the inner compiler's fusion to
// matter, and is compiled. Node counts do not weigh cost: a
// large-vocabulary head is a few nodes and runs eagerly, which costs little
// since its matmul is an extern kernel either way. README.md ("Repeated
// blocks: compile time against depth") has the measurement. Running a piece
// eagerly changes nothing DDP communicates, so ranks need not agree on it.

// EdgePolicy says which edge pieces run eagerly (Note [Edges]).
type EdgePolicy int32

const (
	EdgesCompile EdgePolicy = 0 // none: every piece is compiled
	EdgesAuto    EdgePolicy = 1 // the edges no bigger than the mean block
	EdgesEager   EdgePolicy = 2 // every edge
)

// eagerPieces returns the pieces to run eagerly, ascending: under policy,
// the pieces whose compute nodes all lie before the first compute node of
// a block or after the last, in a graph with BlockIDs.
// Sizes count each compute node's weight under st (Note [Node weights]).
func eagerPieces(g *Graph, st *ModuleStacks, nodePiece []int32, numPieces int, policy EdgePolicy) []int32 {
	if policy == EdgesCompile || g.BlockIDs == nil {
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
	pieceSize := make([]int, numPieces)
	inside := make([]bool, numPieces)
	blockSize := map[int32]int{}
	for i, op := range g.Ops {
		p := nodePiece[i]
		if p < 0 || !isCompute(op) {
			continue
		}
		w := st.weight(i)
		pieceSize[p] += w
		if id := g.BlockIDs[i]; id >= 0 {
			blockSize[id] += w
		}
		if first <= i && i <= last {
			inside[p] = true
		}
	}
	blockNodes := 0
	for _, n := range blockSize {
		blockNodes += n
	}
	var eager []int32
	for p := range numPieces {
		if inside[p] || pieceSize[p] == 0 {
			continue
		}
		// pieceSize <= mean block, in integers: size * blocks <= nodes.
		if policy == EdgesEager || pieceSize[p]*len(blockSize) <= blockNodes {
			eager = append(eager, int32(p))
		}
	}
	return eager
}
