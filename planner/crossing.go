package planner

// crossings lists, per piece, the values that cross its boundary, in
// O(nodes + edges) with two passes (count, then fill) into one backing array
// per direction so that no list grows by reallocation.
//
// inputs[p]: nodes outside piece p (placeholders or nodes of earlier pieces)
// that some node of p uses, ascending. outputs[p]: nodes of p used by a
// later piece or by the output node, ascending.
func crossings(g *Graph, part []int32, numPieces int) (inputs, outputs [][]int32) {
	n := len(g.Ops)
	inputs = make([][]int32, numPieces)
	outputs = make([][]int32, numPieces)
	if numPieces == 0 {
		return inputs, outputs
	}
	// lastAdded[p] is 1 + the last node appended to inputs[p]; nodes are
	// visited in ascending order, so this deduplicates a node whose several
	// users sit in the same piece.
	lastAdded := make([]int32, numPieces)
	inCount := make([]int, numPieces)
	outCount := make([]int, numPieces)
	visit := func(fill bool) {
		clear(lastAdded)
		for j := range n {
			from := part[j]
			isOutput := false
			for _, u := range g.Users[g.UserOffsets[j]:g.UserOffsets[j+1]] {
				to := part[u]
				if to < 0 {
					// The output node: users are never placeholders.
					if from >= 0 {
						isOutput = true
					}
					continue
				}
				if to != from && lastAdded[to] != int32(j)+1 {
					lastAdded[to] = int32(j) + 1
					if fill {
						inputs[to] = append(inputs[to], int32(j))
					} else {
						inCount[to]++
					}
				}
				if from >= 0 && to > from {
					isOutput = true
				}
			}
			if isOutput {
				if fill {
					outputs[from] = append(outputs[from], int32(j))
				} else {
					outCount[from]++
				}
			}
		}
	}
	visit(false)
	carve(inputs, inCount)
	carve(outputs, outCount)
	visit(true)
	return inputs, outputs
}

// carve points each lists[p] at an empty window of exactly counts[p] slots
// in one shared array, so the fill pass appends without reallocating and
// no list can grow into its neighbour.
func carve(lists [][]int32, counts []int) {
	total := 0
	for _, c := range counts {
		total += c
	}
	backing := make([]int32, total)
	at := 0
	for p, c := range counts {
		lists[p] = backing[at : at : at+c]
		at += c
	}
}
