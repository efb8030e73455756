package planner

import (
	"math"
	"slices"
)

// lastUsers returns, for every node, the largest index among its users, or -1
// when it has none. A piece ending just before node e has an output exactly
// when one of its nodes has lastUser >= e: users always come later, are never
// placeholders, and everything from e on is a later piece or the output node.
func lastUsers(g *Graph) []int32 {
	last := make([]int32, len(g.Ops))
	for i := range last {
		m := int32(-1)
		for _, u := range g.Users[g.UserOffsets[i]:g.UserOffsets[i+1]] {
			m = max(m, u)
		}
		last[i] = m
	}
	return last
}

// isCompute reports whether a node runs inside some piece: every node except
// placeholders and the output node.
func isCompute(op OpKind) bool {
	return op != OpPlaceholder && op != OpOutput
}

// counted reports whether DDP allreduces the parameter's gradient at all.
func (p *Param) counted() bool {
	return p.RequiresGrad && !p.Ignored
}

// addBytes adds two non-negative byte counts, reporting overflow of int64.
func addBytes(a, b int64) (int64, bool) {
	if b > math.MaxInt64-a {
		return 0, false
	}
	return a + b, true
}

// piecesFromCuts numbers the compute nodes by piece. cuts holds, in
// ascending order, the index of the first node of every piece but the first.
func piecesFromCuts(ops []OpKind, cuts []int) []int32 {
	part := make([]int32, len(ops))
	piece, next := int32(0), 0
	for i, op := range ops {
		for next < len(cuts) && cuts[next] == i {
			piece++
			next++
		}
		if isCompute(op) {
			part[i] = piece
		} else {
			part[i] = -1
		}
	}
	return part
}

// moduleSet remembers which module identities a walk has met. Identities
// are dense small integers in practice and index a slice directly; an
// unusually sparse set of identities falls back to a sorted table, so memory
// stays linear in the number of nodes whatever the caller sends.
type moduleSet struct {
	seen   []bool
	sorted []int32 // distinct identities when they are too sparse to index directly
}

func newModuleSet(g *Graph) *moduleSet {
	maxID := int32(-1)
	for i, op := range g.Ops {
		if op == OpCallModule || op == OpCallMethod {
			maxID = max(maxID, g.ModuleIDs[i])
		}
	}
	if int64(maxID) < 2*int64(len(g.Ops))+64 {
		return &moduleSet{seen: make([]bool, maxID+1)}
	}
	var ids []int32
	for i, op := range g.Ops {
		if (op == OpCallModule || op == OpCallMethod) && g.ModuleIDs[i] >= 0 {
			ids = append(ids, g.ModuleIDs[i])
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return &moduleSet{seen: make([]bool, len(ids)), sorted: ids}
}

// firstVisit marks id as seen and reports whether it was new.
func (s *moduleSet) firstVisit(id int32) bool {
	slot := int(id)
	if s.sorted != nil {
		slot, _ = slices.BinarySearch(s.sorted, id)
	}
	if s.seen[slot] {
		return false
	}
	s.seen[slot] = true
	return true
}
