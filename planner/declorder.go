package planner

import (
	"slices"
)

// This file aligns DDP's buckets with the pieces when DDP never rebuilds
// them: find_unused_parameters=True without static_graph (BucketOrder
// OrderDeclaration).
//
// In that case DDP keeps the buckets it made at construction (or when goddp
// rebuilds its reducer). It fills them walking its parameter list in
// declaration order, first declared first, against the cap list (per-bucket
// caps included, torch >= 2.9), and then reverses the bucket list, so that
// its bucket 0 holds the last-declared parameters and is allreduced first.
// Caps therefore make those buckets close exactly at piece boundaries when
// each piece's parameters form one run of the declaration order and the
// runs follow the pieces in forward order: the caps are then the pieces'
// byte totals, forward-first piece first.
//
// Where the declaration order interleaves the parameters of several pieces,
// no caps can do that: the smallest change that restores it is to merge
// every range of pieces that one run of declaration order jumps back across
// (declaredPieceRuns). The merged cuts are dropped; the rest stay. The other
// answer, keeping DDP's own caps and cutting where its declaration-order
// buckets become ready, leaves the buckets DDP chose (one 25 MiB bucket plus
// a 1 MiB one by default), which for models below a few hundred MiB means
// one allreduce at the end of backward; merging keeps every cut the orders
// agree on. The README gives the measurements.

// BucketOrder says in which order DDP fills the buckets it reduces with.
type BucketOrder int32

const (
	// OrderReady: DDP rebuilds its buckets once, after its first
	// iteration, from the order in which gradients became ready (the
	// default: find_unused_parameters=False, or static_graph).
	OrderReady BucketOrder = 0
	// OrderDeclaration: DDP never rebuilds (find_unused_parameters=True
	// without static_graph) and keeps buckets filled in declaration order,
	// the positions in Param.DDPPosition.
	OrderDeclaration BucketOrder = 1
)

// Alignment says how a plan's buckets relate to DDP's.
type Alignment int32

const (
	// AlignNone: the buckets are the planner's prediction of DDP's own.
	AlignNone Alignment = 0
	// AlignReady: one bucket per piece; Plan.DDPCaps make DDP's rebuild
	// (gradient-ready order) close each bucket at a piece boundary.
	AlignReady Alignment = 1
	// AlignDeclaration: one bucket per piece; Plan.DDPCaps make DDP's
	// declaration-order buckets close at the piece boundaries. The cuts
	// are those of the ready-order plan.
	AlignDeclaration Alignment = 2
	// AlignDeclarationMerged: as AlignDeclaration, after merging the pieces
	// whose parameters the declaration order interleaves
	// (Plan.MergedCuts says how many cuts that dropped).
	AlignDeclarationMerged Alignment = 3
)

// String names the alignment the way plan records and logs do.
func (a Alignment) String() string {
	switch a {
	case AlignNone:
		return "none"
	case AlignReady:
		return "ready-order caps"
	case AlignDeclaration:
		return "declaration-order caps"
	case AlignDeclarationMerged:
		return "declaration-order caps, pieces merged"
	}
	return "unknown"
}

// validateDeclaration checks Param.DDPPosition under OrderDeclaration:
// every counted parameter has a position, no two share one.
func validateDeclaration(g *Graph, cfg *Config) error {
	if cfg.BucketOrder != OrderDeclaration {
		return nil
	}
	owner := make(map[int32]int, len(g.Params))
	for p := range g.Params {
		prm := &g.Params[p]
		if prm.DDPPosition < -1 {
			return errorf(ErrInvalidGraph, "planner: parameter %d (%q): DDP position %d; want -1 (not DDP's) or a position >= 0",
				p, prm.Name, prm.DDPPosition)
		}
		if !prm.counted() {
			continue
		}
		if prm.DDPPosition < 0 {
			return errorf(ErrInvalidGraph, "planner: parameter %d (%q) is reduced by DDP but has no DDP position; declaration-order bucketing needs one for every counted parameter",
				p, prm.Name)
		}
		if q, dup := owner[prm.DDPPosition]; dup {
			return errorf(ErrInvalidGraph, "planner: parameters %d (%q) and %d (%q) share DDP position %d",
				q, g.Params[q].Name, p, prm.Name, prm.DDPPosition)
		}
		owner[prm.DDPPosition] = p
	}
	return nil
}

// declarationOrder returns the counted parameters sorted by DDP position.
func declarationOrder(g *Graph) []int32 {
	var order []int32
	for p := range g.Params {
		if g.Params[p].counted() {
			order = append(order, int32(p))
		}
	}
	slices.SortFunc(order, func(a, b int32) int {
		return int(g.Params[a].DDPPosition) - int(g.Params[b].DDPPosition)
	})
	return order
}

// declaredPieces labels each parameter of order with a piece: the piece of
// its first use, or, for one no compute node uses (DDP marks its gradient
// ready as backward starts, so any bucket suits it), the label of the
// parameter declared before it (of the first used one for a leading run).
func declaredPieces(order, firstUse, part []int32) []int32 {
	label := make([]int32, len(order))
	prev := int32(-1)
	for k, p := range order {
		if f := firstUse[p]; f >= 0 {
			prev = part[f]
		}
		label[k] = prev
	}
	lead := 0
	for lead < len(label) && label[lead] < 0 {
		lead++
	}
	fill := int32(0)
	if lead < len(label) {
		fill = label[lead]
	}
	for k := 0; k < lead; k++ {
		label[k] = fill
	}
	return label
}

// mergedBoundaries reports, for each boundary b between pieces b and b+1
// (numPieces-1 of them), whether it must go so that the declaration-order
// labels become non-decreasing: a label q met after a larger label m forces
// boundaries q..m-1 out. The result is the finest such merging.
func mergedBoundaries(label []int32, numPieces int) []bool {
	drop := make([]bool, max(numPieces-1, 0))
	// extend[q]: the largest label met before some later label q; the
	// boundaries q..extend[q]-1 must go.
	extend := make([]int32, numPieces)
	for q := range extend {
		extend[q] = int32(q)
	}
	running := int32(-1)
	for _, q := range label {
		if q < running {
			extend[q] = max(extend[q], running)
		}
		running = max(running, q)
	}
	reach := int32(-1)
	for q := 0; q < numPieces-1; q++ {
		reach = max(reach, extend[q])
		if reach > int32(q) {
			drop[q] = true
		}
	}
	return drop
}

// declarationAlign makes one bucket per piece for DDP's declaration-order
// bucketing, merging pieces where that order interleaves them. cuts are
// the final cuts (ascending first nodes of every piece but the first);
// extended[q] says whether a predicted bucket completed by piece q was
// Extended. It returns the cuts kept, the buckets in DDP order, the caps in
// the order DDP walks them (declaration order: forward-first piece first)
// and how many cuts it dropped.
func declarationAlign(g *Graph, firstUse []int32, cuts []int, extended []bool) (kept []int, buckets []Bucket, caps []int64, dropped int) {
	order := declarationOrder(g)
	part := piecesFromCuts(g.Ops, cuts)
	label := declaredPieces(order, firstUse, part)
	drop := mergedBoundaries(label, len(cuts)+1)

	// newPiece[q]: the piece that old piece q belongs to after merging.
	newPiece := make([]int32, len(cuts)+1)
	mergedExt := make([]bool, len(cuts)+1)
	kept = make([]int, 0, len(cuts))
	for q := range newPiece {
		if q > 0 {
			newPiece[q] = newPiece[q-1]
			if drop[q-1] {
				dropped++
			} else {
				newPiece[q]++
				kept = append(kept, cuts[q-1])
			}
		}
		if q < len(extended) && extended[q] {
			mergedExt[newPiece[q]] = true
		}
	}

	// One run of declaration order per piece, forward-first piece first.
	for lo := 0; lo < len(order); {
		piece := newPiece[label[lo]]
		first := &g.Params[order[lo]]
		b := Bucket{
			NodeBegin: len(g.Ops),
			Piece:     int(piece),
			Extended:  mergedExt[piece],
			DType:     first.DType,
			Device:    first.Device,
		}
		hi := lo
		for ; hi < len(order) && newPiece[label[hi]] == piece; hi++ {
			p := order[hi]
			b.Bytes += g.Params[p].Bytes // bounded by the total that firstUses checked
			if f := int(firstUse[p]); f >= 0 {
				b.NodeBegin = min(b.NodeBegin, f)
				b.NodeEnd = max(b.NodeEnd, f+1)
			}
		}
		if b.NodeEnd == 0 {
			b.NodeBegin = 0
		}
		// Listed last-declared first, the order DDP's bucket 0 comes in.
		b.Params = slices.Clone(order[lo:hi])
		slices.Reverse(b.Params)
		caps = append(caps, b.Bytes)
		buckets = append(buckets, b)
		lo = hi
	}
	slices.Reverse(buckets)
	return kept, buckets, caps, dropped
}
