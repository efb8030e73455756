package planner

// mergePieces decides which cuts survive when the pieces must be merged down
// to at most limit pieces. pieceBytes holds each piece's counted bytes in
// forward order; cut k separates piece k from piece k+1. It repeatedly drops
// the cut whose removal gives the smallest merged piece, ties going to the
// forward-first cut, so that the surviving cuts keep the large gradient
// groups apart. The result says, per cut, whether it is kept.
//
// A heap of candidate merges keyed by (merged bytes, left piece) with lazy
// invalidation keeps this O(k log k) for k pieces.
func mergePieces(pieceBytes []int64, limit int) []bool {
	k := len(pieceBytes)
	keep := make([]bool, max(k-1, 0))
	for c := range keep {
		keep[c] = true
	}
	if k <= limit {
		return keep
	}
	bytes := append([]int64(nil), pieceBytes...)
	next := make([]int32, k) // next surviving piece, or -1
	prev := make([]int32, k) // previous surviving piece, or -1
	alive := make([]bool, k)
	h := make(mergeHeap, 0, 2*k)
	for p := range k {
		next[p], prev[p], alive[p] = int32(p+1), int32(p-1), true
		if p+1 < k {
			h.push(mergeCandidate{bytes[p] + bytes[p+1], int32(p), int32(p + 1)})
		}
	}
	next[k-1] = -1

	for pieces := k; pieces > limit; {
		c := h.pop()
		l, r := c.left, c.right
		// Skip candidates made stale by an earlier merge: the pair must
		// still be adjacent and the sum current.
		if !alive[l] || next[l] != r || c.merged != bytes[l]+bytes[r] {
			continue
		}
		// The cut between l and r is the one that follows the piece that
		// started at r's original position, i.e. cut r-1.
		keep[r-1] = false
		bytes[l] += bytes[r]
		alive[r] = false
		next[l] = next[r]
		if next[r] >= 0 {
			prev[next[r]] = l
			h.push(mergeCandidate{bytes[l] + bytes[next[l]], l, next[l]})
		}
		if prev[l] >= 0 {
			h.push(mergeCandidate{bytes[prev[l]] + bytes[l], prev[l], l})
		}
		pieces--
	}
	return keep
}

// mergeCandidate proposes merging piece right into its left neighbour.
type mergeCandidate struct {
	merged      int64 // bytes of the merged piece when proposed
	left, right int32
}

func (a mergeCandidate) less(b mergeCandidate) bool {
	if a.merged != b.merged {
		return a.merged < b.merged
	}
	return a.left < b.left
}

// mergeHeap is a binary min-heap of candidates; written out because
// container/heap boxes every element it pushes.
type mergeHeap []mergeCandidate

func (h *mergeHeap) push(c mergeCandidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s[i].less(s[parent]) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *mergeHeap) pop() mergeCandidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, small := 2*i+1, 2*i+2, i
		if l < len(s) && s[l].less(s[small]) {
			small = l
		}
		if r < len(s) && s[r].less(s[small]) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}
