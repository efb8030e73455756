package planner

import (
	"cmp"
	"math"
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
// Note [Declaration order per group]
//
// With parameters of several (dtype, device) groups DDP fills each group's
// buckets apart, walking the group's parameters in declaration order and
// the one cap list anew (bucket j of every group closes against cap j); it
// then lists the buckets of all groups by their first parameter's
// position and reverses the list, so that the bucket declared last comes
// first, and launches them in that order (checked against torch in
// tests/python/distributed/test_dist_dtype_groups.py). The units are the
// runs of equal suffix minimum above. Each group's buckets are runs of its
// units, with caps chosen for every group at once as in Note [Several
// dtype groups] (keys.go); since the walk's order is fixed, a bucket
// closes at a unit's end exactly when its cap lies in (S - b, S], b the
// unit's last positive gradient in the group. Each bucket then launches
// where DDP's order says (the running minimum, in DDP order, of its
// parameters' pieces), which may be later than its unit's when the shared
// caps make it long; the cuts kept are those at which some bucket
// launches. Decide weighs the result against DDP's own buckets on the
// pieces before merging and keeps DDP's where they launch earlier
// (ReasonGroupsLater).
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
	// AlignDeclarationGroups: as AlignDeclarationMerged with parameters of
	// several (dtype, device) groups: one bucket per run of declaration
	// units and group, Plan.DDPCaps fit every group, Plan.MergedCuts
	// counts the cuts that went (Note [Declaration order per group]).
	AlignDeclarationGroups Alignment = 5
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
	case AlignDeclarationGroups:
		return "declaration-order caps per dtype group"
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

// declarationAlign sets pl's buckets for DDP's declaration-order bucketing
// and keeps the cuts that suit them (see the top of this file and, for
// several (dtype, device) groups, Note [Declaration order per group]).
// cuts are pl's final cuts (ascending first nodes of every piece but the
// first). The buckets come in DDP order, the caps in the order DDP walks
// them (declaration order); Plan.MergedCuts counts the cuts that went.
func declarationAlign(g *Graph, firstUse []int32, pl *Plan, cuts []int) {
	numPieces := len(cuts) + 1
	extended := make([]bool, numPieces)
	for k := range pl.Buckets {
		if pl.Buckets[k].Extended {
			extended[pl.Buckets[k].Piece] = true
		}
	}
	order := declarationOrder(g)
	part := piecesFromCuts(g.Ops, cuts)
	label := declaredPieces(order, firstUse, part, numPieces)
	caps, grouped := declarationCaps(g, order, declarationUnits(suffixMinima(label)))
	// DDP's walk with those caps: the planned runs, except that a zero-byte
	// gradient declared after its unit's last positive one joins the
	// group's next bucket (cap reached), which may launch later.
	runs := declaredWalk(g, order, caps)
	launch := declaredLaunches(label, runs)

	// A piece keeps its cut (and stays a piece) if some bucket launches at
	// its end; newPiece renumbers the pieces after the others merge into
	// the piece before them.
	var kept []int
	dropped := 0
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
	var buckets []Bucket
	for k, run := range runs {
		// Listed last-declared first, the order DDP's bucket 0 comes in.
		params := make([]int32, len(run))
		for j, pos := range run {
			params[len(run)-1-j] = order[pos]
		}
		b := bucketFromRun(g, firstUse, params)
		piece := newPiece[launch[k]]
		b.Piece, b.Extended = int(piece), mergedExt[piece]
		buckets = append(buckets, b)
	}
	pl.NodePiece = piecesFromCuts(g.Ops, kept)
	pl.NumPieces = len(kept) + 1
	pl.Buckets, pl.DDPCaps, pl.MergedCuts = buckets, caps, dropped
	switch {
	case grouped:
		pl.Alignment = AlignDeclarationGroups
	case dropped > 0:
		pl.Alignment = AlignDeclarationMerged
	default:
		pl.Alignment = AlignDeclaration
	}
}

// declarationUnits cuts the declaration order where the suffix minimum
// launch changes: unit u is positions [units[u], units[u+1]).
func declarationUnits(launch []int32) []int {
	var starts []int
	for k := range launch {
		if k == 0 || launch[k] != launch[k-1] {
			starts = append(starts, k)
		}
	}
	return append(starts, len(launch))
}

// declarationCaps returns the caps, in the order DDP walks them, that make
// DDP's buckets the units' runs, and whether there are several groups. One
// group: a bucket per unit, capped at its bytes. Several: each group's
// buckets are runs of its units, with caps that fit every group (Note
// [Declaration order per group]).
func declarationCaps(g *Graph, order []int32, units []int) (caps []int64, grouped bool) {
	keyOf, keys := paramKeys(g, order)
	if len(keys) < 2 {
		for u := range len(units) - 1 {
			// At least 1 byte, as DDP will get them (Decide's clampCaps),
			// so that the walk below is DDP's.
			caps = append(caps, max(1, runBytes(g, order[units[u]:units[u+1]])))
		}
		return caps, false
	}
	groups := make([][]groupUnit, len(keys))
	for u := range len(units) - 1 {
		for _, p := range order[units[u]:units[u+1]] {
			addToUnit(groups, int(keyOf[p]), u, p, g.Params[p].Bytes, true)
		}
	}
	caps, _ = chooseKeyCaps(groups)
	return caps, true
}

// declaredLaunches returns the piece at whose backward end DDP launches
// each of runs (DDP order): it launches them strictly in order, each once
// it and every one before it are complete.
func declaredLaunches(label []int32, runs [][]int) []int32 {
	out := make([]int32, len(runs))
	running := int32(math.MaxInt32)
	for k, run := range runs {
		for _, pos := range run {
			running = min(running, label[pos])
		}
		out[k] = running
	}
	return out
}

// declaredWalk returns the buckets DDP fills in declaration order with
// caps, as runs of positions in order, in DDP order: each group walking the
// caps anew, the buckets sorted by their first position and the list
// reversed, as DDP does.
func declaredWalk(g *Graph, order []int32, caps []int64) [][]int {
	keyOf, keys := paramKeys(g, order)
	type filling struct {
		run    []int
		bytes  int64
		capIdx int
	}
	fills := make([]filling, len(keys))
	var runs [][]int
	for pos, p := range order {
		f := &fills[keyOf[p]]
		f.run = append(f.run, pos)
		f.bytes += g.Params[p].Bytes
		if f.bytes >= caps[f.capIdx] {
			runs = append(runs, f.run)
			f.run, f.bytes, f.capIdx = nil, 0, min(f.capIdx+1, len(caps)-1)
		}
	}
	for _, f := range fills {
		if len(f.run) > 0 {
			runs = append(runs, f.run)
		}
	}
	slices.SortFunc(runs, func(a, b []int) int { return cmp.Compare(b[0], a[0]) })
	return runs
}

// declaredOwn returns the buckets DDP fills in declaration order with its
// own caps, in DDP order, as parameter lists.
func declaredOwn(g *Graph, caps []int64) [][]int32 {
	order := declarationOrder(g)
	runs := declaredWalk(g, order, caps)
	out := make([][]int32, len(runs))
	for k, run := range runs {
		for _, pos := range run {
			out[k] = append(out[k], order[pos])
		}
	}
	return out
}

// launchedOn returns buckets (DDP order) as a plan on clock's pieces, each
// naming the piece at whose backward end DDP launches it, for launchCost:
// Decide weighs the aligned buckets and DDP's own on the same pieces:
// those of the plan it would keep DDP's buckets with.
func launchedOn(g *Graph, clock *Plan, buckets [][]int32) *Plan {
	firstUse, _ := firstUses(g) // cannot fail: Build bounded the same sums
	out := &Plan{NumPieces: clock.NumPieces}
	running := int32(clock.NumPieces - 1)
	for _, params := range buckets {
		for _, p := range params {
			if f := firstUse[p]; f >= 0 {
				running = min(running, clock.NodePiece[f])
			}
		}
		out.Buckets = append(out.Buckets, Bucket{Bytes: runBytes(g, params), Piece: int(running)})
	}
	return out
}
