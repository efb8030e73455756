package planner

import "slices"

// This file implements CombineForward: one DDP bucket layout for a forward
// that Dynamo compiled as several graphs (a graph break splits DDP's
// parameters over them).
//
// Each graph was planned on its own with AlignBuckets, so each has buckets in
// DDP order that close at its own cuts. DDP sees one backward: the autograd
// engine runs the backward of the forward's last graph first, so the
// gradients of the last graph's pieces become ready first, then the previous
// graph's, and so on. The combined layout is therefore the graphs' bucket
// lists concatenated, the last graph's first. By the argument of
// alignedBuckets (align.go), a cap list holding each bucket's exact byte
// total makes DDP's rebuild close every bucket at a cut, in every graph.
//
// A parameter used by several graphs (weights tied across a graph break)
// has its gradient complete only once the earliest of those graphs has run
// its backward, the last in DDP's order: it is counted in the earliest
// graph's bucket and removed from the later graphs' ones; a bucket left
// with no parameter disappears (its cut then lies inside a DDP bucket).
// Every parameter DDP reduces must belong to exactly one bucket in the end,
// or no layout is returned: DDP buckets parameters the graphs never use as
// well, and a cap list that leaves them out would make its buckets straddle
// the cuts.
//
// With parameters of several (dtype, device) groups (paramKeys) the graphs'
// buckets hold every group (Decide keeps a part-of-forward graph's buckets
// whole, one per unit), and the combined list is split by group with caps
// that fit every group at once, as Note [Several dtype groups] (keys.go)
// does for one graph: the combined buckets are its units. As Decide does
// for one graph, CombineForward then weighs those buckets against the ones
// DDP's own caps (own) would make over the same units, and says so
// (ForwardPlan.GroupsLater) where they would launch more than 10% later:
// the caller keeps DDP's buckets there. Buckets that one unit of several
// pieces completes are listed by group, not in the order DDP closes them
// (the units carry no pieces); the sets are DDP's.

// ForwardGraph is one graph of a forward, as its aligned plan bucketed it.
type ForwardGraph struct {
	// Buckets in DDP order; each lists the DDP positions (indices into the
	// list of parameters DDP reduces) of its parameters.
	Buckets [][]int32
}

// ForwardBucket is one bucket of a combined forward layout.
type ForwardBucket struct {
	Bytes  int64   // the exact byte total of Params: the cap to give DDP
	Params []int32 // DDP positions, in the order of the graph's bucket
	// Graph (forward order) and Source (its index among that graph's
	// buckets, DDP order): the graph bucket it comes from, or with several
	// groups the one that completes it.
	Graph  int
	Source int
}

// ForwardPlan is the result of CombineForward.
type ForwardPlan struct {
	Buckets []ForwardBucket // DDP order: the last graph's buckets first
	// Caps are the per-bucket caps for DDP, DDP order, at least 1: the
	// Bytes, or with several groups cap j every group's j-th bucket's.
	Caps []int64
	// Moved counts parameters found in several graphs and kept only in the
	// earliest; Dropped counts buckets left without parameters by that.
	Moved   int
	Dropped int
	// MergedCuts (several groups): the graphs' buckets, but the last, at
	// whose end no group's bucket closes.
	MergedCuts int
	// GroupsLater (several groups, own given): the buckets would launch
	// more than 10% later than DDP's own do (launchesLater).
	GroupsLater bool
}

// CombineForward combines the aligned buckets of a forward's graphs (in
// forward order) into one DDP layout. paramBytes holds the byte size
// (numel*element size) of every parameter DDP reduces, indexed by DDP
// position; paramKeys, nil or as long, its (dtype, device) group's number
// (nil: one group); own, nil or the caps the graphs were planned with
// (DDP's own, resolved), for the launch check. Errors (own's caps as
// Build checks them among the ErrInvalidConfig): ErrInvalidConfig for malformed input (a
// position out of range, a parameter twice in one graph, a negative size
// or group number, no graph) and ErrInvalidGraph when the graphs between
// them do not hold every parameter DDP reduces.
func CombineForward(graphs []ForwardGraph, paramBytes []int64, paramKeys []int32, own *Config) (*ForwardPlan, error) {
	if len(graphs) == 0 {
		return nil, errorf(ErrInvalidConfig, "planner: CombineForward needs at least one graph")
	}
	for p, b := range paramBytes {
		if b < 0 {
			return nil, errorf(ErrInvalidConfig, "planner: parameter %d (DDP position) has negative size %d", p, b)
		}
	}
	if paramKeys != nil && len(paramKeys) != len(paramBytes) {
		return nil, errorf(ErrInvalidConfig, "planner: %d group numbers for %d parameters", len(paramKeys), len(paramBytes))
	}
	for p, k := range paramKeys {
		if k < 0 {
			return nil, errorf(ErrInvalidConfig, "planner: parameter %d (DDP position) has group number %d; want >= 0", p, k)
		}
	}
	owner, err := forwardOwners(graphs, len(paramBytes))
	if err != nil {
		return nil, err
	}
	plan := &ForwardPlan{}
	for p, g := range owner {
		if g < 0 {
			missing := 0
			for _, o := range owner {
				if o < 0 {
					missing++
				}
			}
			return nil, errorf(ErrInvalidGraph, "planner: the forward's %d graphs use %d of DDP's %d parameters (DDP position %d is in none of them): DDP buckets the others too, so no caps can close its buckets at the cuts",
				len(graphs), len(paramBytes)-missing, len(paramBytes), p)
		}
	}
	for g := len(graphs) - 1; g >= 0; g-- {
		for k, bucket := range graphs[g].Buckets {
			out := ForwardBucket{Graph: g, Source: k}
			for _, p := range bucket {
				if owner[p] != g {
					plan.Moved++
					continue
				}
				var ok bool
				if out.Bytes, ok = addBytes(out.Bytes, paramBytes[p]); !ok {
					return nil, errorf(ErrOverflow, "planner: bucket %d of graph %d overflows int64 bytes", k, g)
				}
				out.Params = append(out.Params, p)
			}
			if len(out.Params) == 0 {
				plan.Dropped++
				continue
			}
			plan.Buckets = append(plan.Buckets, out)
			plan.Caps = append(plan.Caps, out.Bytes)
		}
	}
	if own != nil {
		if err := validateConfig(own); err != nil {
			return nil, err
		}
	}
	if distinctKeys(paramKeys) > 1 {
		// A group's bucket may hold several units: bound the sum of all.
		var total int64
		for _, b := range plan.Buckets {
			var ok bool
			if total, ok = addBytes(total, b.Bytes); !ok {
				return nil, errorf(ErrOverflow, "planner: the forward's buckets overflow int64 bytes together")
			}
		}
		units := slices.Clone(plan.Buckets)
		plan.splitByKey(paramBytes, paramKeys)
		if own != nil {
			plan.GroupsLater = launchesLater(plan.onUnits(units), ownOnUnits(units, paramBytes, paramKeys, capList(own)))
		}
	}
	// At least 1 byte, as Decide's clampCaps: a cap of 0 would give each
	// parameter of a zero-byte bucket its own DDP bucket.
	for j := range plan.Caps {
		plan.Caps[j] = max(1, plan.Caps[j])
	}
	return plan, nil
}

// distinctKeys counts the distinct group numbers of keys.
func distinctKeys(keys []int32) int {
	seen := map[int32]bool{}
	for _, k := range keys {
		seen[k] = true
	}
	return len(seen)
}

// splitByKey splits the combined buckets, the units, by group and sets the
// caps that close every group's buckets at unit ends (Note [Several dtype
// groups]), the groups numbered by first appearance.
func (plan *ForwardPlan) splitByKey(paramBytes []int64, paramKeys []int32) {
	index := map[int32]int{} // group number -> index into groups
	var groups [][]groupUnit
	for u, b := range plan.Buckets {
		for _, p := range b.Params {
			k, ok := index[paramKeys[p]]
			if !ok {
				k = len(groups)
				index[paramKeys[p]] = k
				groups = append(groups, nil)
			}
			// Cannot overflow: the unit's total did not.
			addToUnit(groups, k, u, p, paramBytes[p], false)
		}
	}
	caps, keyed := chooseKeyCaps(groups)
	closes := make([]bool, len(plan.Buckets))
	var buckets []ForwardBucket
	for _, kb := range keyed {
		units := groups[kb.key][kb.from:kb.to]
		last := plan.Buckets[units[len(units)-1].unit]
		out := ForwardBucket{Graph: last.Graph, Source: last.Source}
		for _, gu := range units {
			out.Params = append(out.Params, gu.params...)
			out.Bytes += gu.bytes
		}
		if kb.closed {
			closes[units[len(units)-1].unit] = true
		}
		buckets = append(buckets, out)
	}
	for u := range len(plan.Buckets) - 1 {
		if !closes[u] {
			plan.MergedCuts++
		}
	}
	plan.Buckets, plan.Caps = buckets, caps
}

// forwardOwners returns, per DDP position, the earliest graph (forward
// order) that holds it, -1 for none; it rejects malformed input.
func forwardOwners(graphs []ForwardGraph, numParams int) ([]int, error) {
	owner := make([]int, numParams)
	for p := range owner {
		owner[p] = -1
	}
	for g, graph := range graphs {
		seen := make(map[int32]bool)
		for k, bucket := range graph.Buckets {
			for _, p := range bucket {
				if p < 0 || int(p) >= numParams {
					return nil, errorf(ErrInvalidConfig, "planner: bucket %d of graph %d names DDP position %d; DDP reduces %d parameters", k, g, p, numParams)
				}
				if seen[p] {
					return nil, errorf(ErrInvalidConfig, "planner: DDP position %d is in two buckets of graph %d", p, g)
				}
				seen[p] = true
				if owner[p] < 0 {
					owner[p] = g
				}
			}
		}
	}
	return owner, nil
}

// onUnits returns the plan's buckets as a plan whose pieces are the units
// (DDP order: unit 0 is the last piece), each bucket at the unit that
// completes it, for launchCost. Its Graph and Source name that unit.
func (plan *ForwardPlan) onUnits(units []ForwardBucket) *Plan {
	unitOf := make(map[[2]int]int, len(units))
	for u, unit := range units {
		unitOf[[2]int{unit.Graph, unit.Source}] = u
	}
	out := &Plan{NumPieces: len(units)}
	for _, b := range plan.Buckets {
		out.Buckets = append(out.Buckets, Bucket{Bytes: b.Bytes, Piece: len(units) - 1 - unitOf[[2]int{b.Graph, b.Source}]})
	}
	return out
}

// ownOnUnits returns, as onUnits does, the buckets DDP's rebuild makes with
// caps over the units (in order, each unit's parameters as listed): each
// group walks the caps on its own; the closed buckets in closing order,
// then the open ones by their first unit, as chooseKeyCaps lists them.
func ownOnUnits(units []ForwardBucket, paramBytes []int64, paramKeys []int32, caps []int64) *Plan {
	type filling struct {
		bytes       int64
		first, last int
		capIdx      int
		open        bool
	}
	fills := map[int32]*filling{}
	var keys []int32
	out := &Plan{NumPieces: len(units)}
	for u, unit := range units {
		for _, p := range unit.Params {
			f := fills[paramKeys[p]]
			if f == nil {
				f = &filling{}
				fills[paramKeys[p]] = f
				keys = append(keys, paramKeys[p])
			}
			if !f.open {
				f.first = u
			}
			f.bytes += paramBytes[p]
			f.last, f.open = u, true
			if f.bytes >= caps[f.capIdx] {
				out.Buckets = append(out.Buckets, Bucket{Bytes: f.bytes, Piece: len(units) - 1 - u})
				f.bytes, f.open, f.capIdx = 0, false, min(f.capIdx+1, len(caps)-1)
			}
		}
	}
	slices.SortStableFunc(keys, func(a, b int32) int { return fills[a].first - fills[b].first })
	for _, k := range keys {
		if f := fills[k]; f.open {
			out.Buckets = append(out.Buckets, Bucket{Bytes: f.bytes, Piece: len(units) - 1 - f.last})
		}
	}
	return out
}
