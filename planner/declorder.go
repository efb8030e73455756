package planner

import (
	"slices"
)

// Note [Declaration order]
//
// This file aligns DDP's buckets with the pieces when DDP never rebuilds
// them: find_unused_parameters=True without static_graph (BucketOrder
// OrderDeclaration).
//
// In that case DDP keeps the buckets it made at construction (or when goddp
// rebuilds its reducer). It fills them walking its parameter list in
// declaration order, first declared first, against the cap list (per-bucket
// caps included, torch >= 2.9), and then reverses the bucket list: its
// bucket 0 holds the last-declared parameters. It launches the allreduces
// strictly in that order, so a bucket starts once it and every bucket
// before it are complete: walking the declaration order from its end, at
// the end of backward of the smallest piece seen so far (the suffix minimum
// of the pieces of first use). Caps may cut the declaration order anywhere,
// so each bucket can start at the suffix minimum of its first parameter,
// and no choice of caps can start buckets at any other piece ends.
//
// The planner therefore cuts the declaration order wherever the suffix
// minimum changes (one bucket per distinct value) and keeps the cuts at the
// start of exactly those pieces: each bucket then starts as soon as that
// piece's backward ends, and every kept piece completes one bucket. A piece
// whose end no bucket can start at (the declaration order puts a parameter
// of an earlier piece after it) gives up its cut. Where the declaration
// order follows the forward order, the suffix minima are all the pieces and
// every cut stays (AlignDeclaration); otherwise the fewest cuts go that any
// caps would need (AlignDeclarationMerged). A classifier head declared
// before the body joins the first layer's bucket and loses only its own cut.
//
// The other answer, keeping DDP's own caps (25 MiB, 1 MiB for the
// first-declared bucket by default) and cutting where those buckets start,
// leaves fewer and later launch points; the README gives the measurements.

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
	// AlignReadyGroups: as AlignReady with parameters of several (dtype,
	// device) groups: one bucket per unit run and group, Plan.DDPCaps fit
	// every group, Plan.MergedCuts unit boundaries close no bucket (Note
	// [Several dtype groups], keys.go).
	AlignReadyGroups Alignment = 4
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
	case AlignReadyGroups:
		return "ready-order caps per dtype group"
	}
	return "unknown"
}

// validateDeclaration checks Param.DDPPosition under OrderDeclaration:
// every counted parameter has a position, no two share one. It also bounds
// the total bytes of every counted parameter: declaration-order buckets
// hold the unused ones too, which firstUses does not count.
func validateDeclaration(g *Graph, cfg *Config) error {
	if cfg.BucketOrder != OrderDeclaration {
		return nil
	}
	owner := make(map[int32]int, len(g.Params))
	var total int64
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
		var ok bool
		if total, ok = addBytes(total, prm.Bytes); !ok {
			return errorf(ErrOverflow, "planner: total bytes of counted parameters overflow int64 when adding parameter %d (%q, %d bytes)",
				p, prm.Name, prm.Bytes)
		}
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

// declaredPieces labels each parameter of order with the piece of its
// first use; one that no compute node uses gets the last piece (DDP marks
// its gradient ready as backward starts, so it never holds a bucket back).
func declaredPieces(order, firstUse, part []int32, numPieces int) []int32 {
	label := make([]int32, len(order))
	for k, p := range order {
		label[k] = int32(numPieces - 1)
		if f := firstUse[p]; f >= 0 {
			label[k] = part[f]
		}
	}
	return label
}

// suffixMinima returns, for each position k of label, min(label[k:]): the
// piece at whose backward end a DDP bucket starting at k can launch.
func suffixMinima(label []int32) []int32 {
	m := make([]int32, len(label))
	for k := len(label) - 1; k >= 0; k-- {
		m[k] = label[k]
		if k+1 < len(label) {
			m[k] = min(m[k], m[k+1])
		}
	}
	return m
}

// declarationAlign makes the buckets for DDP's declaration-order bucketing
// and the cuts that suit them (see the top of this file). cuts are the
// final cuts (ascending first nodes of every piece but the first);
// extended[q] says whether a predicted bucket completed by piece q was
// Extended. It returns the cuts kept, the buckets in DDP order, the caps in
// the order DDP walks them (declaration order) and how many cuts went.
func declarationAlign(g *Graph, firstUse []int32, cuts []int, extended []bool) (kept []int, buckets []Bucket, caps []int64, dropped int) {
	numPieces := len(cuts) + 1
	order := declarationOrder(g)
	part := piecesFromCuts(g.Ops, cuts)
	launch := suffixMinima(declaredPieces(order, firstUse, part, numPieces))

	// A piece keeps its cut (and stays a piece) if some bucket launches at
	// its end; newPiece renumbers the pieces after the others merge into
	// the piece before them.
	launches := make([]bool, numPieces)
	for _, q := range launch {
		launches[q] = true
	}
	newPiece := make([]int32, numPieces)
	mergedExt := make([]bool, numPieces)
	for q := range newPiece {
		if q > 0 {
			newPiece[q] = newPiece[q-1]
			if launches[q] {
				newPiece[q]++
				kept = append(kept, cuts[q-1])
			} else {
				dropped++
			}
		}
		if q < len(extended) && extended[q] {
			mergedExt[newPiece[q]] = true
		}
	}

	// One bucket per run of equal launch piece, first-declared first.
	for lo := 0; lo < len(order); {
		hi := lo
		for hi < len(order) && launch[hi] == launch[lo] {
			hi++
		}
		// Listed last-declared first, the order DDP's bucket 0 comes in.
		run := slices.Clone(order[lo:hi])
		slices.Reverse(run)
		b := bucketFromRun(g, firstUse, run)
		piece := newPiece[launch[lo]]
		b.Piece, b.Extended = int(piece), mergedExt[piece]
		caps = append(caps, b.Bytes)
		buckets = append(buckets, b)
		lo = hi
	}
	slices.Reverse(buckets)
	return kept, buckets, caps, dropped
}
