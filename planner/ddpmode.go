package planner

import (
	"cmp"
	"slices"
)

// This file predicts the buckets that DistributedDataParallel builds when it
// rebuilds them after the first iteration (Reducer::rebuild_buckets over
// compute_bucket_assignment_by_size) and cuts the graph where they close.

// ddpBucket is a bucket of the reducer simulation.
type ddpBucket struct {
	bytes      int64
	params     []int32 // gradient-ready order
	key        int     // index into the (dtype, device) key table
	firstReady int     // ready position of its first parameter
	closedAt   int     // node whose parameter closed it; -1 while open
	cutAt      int     // first node of the piece its cut starts; -1 if none
	nodeBegin  int     // forward-first node holding a first use of its parameters
	nodeEnd    int     // one past the forward-last such node
	extended   bool
}

// bucketKey is DDP's grouping key: buckets never mix dtypes or devices.
type bucketKey struct {
	dtype, device int32
}

// keyCursor is the per-key state of the reducer: its open bucket and its
// position in the cap list (each key walks the cap list on its own).
type keyCursor struct {
	open   ddpBucket
	capIdx int
}

// planDDP assigns each counted parameter to the node of its first forward
// use, walks those first uses in gradient-ready order (reverse forward order,
// reverse listed order within a node) through a simulation of DDP's bucket
// assignment, and cuts the graph just before the node at which each bucket
// closes, moving a cut earlier when the piece it would end has no output.
func planDDP(g *Graph, cfg *Config, lastUser []int32) (*Plan, error) {
	n := len(g.Ops)
	if cfg.AlignBuckets {
		if err := checkSingleKey(g); err != nil {
			return nil, err
		}
	}
	firstUse, err := firstUses(g)
	if err != nil {
		return nil, err
	}
	keyOf, keys := groupKeys(g, firstUse)
	caps := capList(cfg)
	cursors := make([]keyCursor, len(keys))
	for k := range cursors {
		cursors[k].open = ddpBucket{key: k, closedAt: -1, cutAt: -1}
	}

	firstCompute := -1
	for i, op := range g.Ops {
		if isCompute(op) {
			firstCompute = i
			break
		}
	}

	var (
		buckets   []ddpBucket // closed buckets in closing order (DDP order)
		pending   []int       // closed buckets still waiting for their cut
		cutsDesc  []int       // first node of each piece but the first, descending
		emitted   = make([]bool, len(g.Params))
		ready     []int32 // the predicted ready order, kept for AlignBuckets only
		readyPos  = 0
		end       = n - 1 // first node after the current piece
		hasOutput = false
	)
	for i := n - 2; i >= 0; i-- {
		if !isCompute(g.Ops[i]) {
			continue
		}
		if lastUser[i] >= int32(end) {
			hasOutput = true
		}
		lo, hi := g.ParamOffsets[i], g.ParamOffsets[i+1]
		for k := hi - 1; k >= lo; k-- {
			p := g.ParamIndex[k]
			if int(firstUse[p]) != i || emitted[p] {
				continue
			}
			emitted[p] = true
			if cfg.AlignBuckets {
				ready = append(ready, p)
			}
			cur := &cursors[keyOf[p]]
			b := &cur.open
			if len(b.params) == 0 {
				b.firstReady = readyPos
				b.nodeEnd = i + 1
			}
			readyPos++
			b.params = append(b.params, p)
			b.bytes += g.Params[p].Bytes // cannot overflow: firstUses bounded the total
			b.nodeBegin = i
			if b.bytes >= caps[cur.capIdx] {
				b.closedAt = i
				buckets = append(buckets, *b)
				pending = append(pending, len(buckets)-1)
				cur.open = ddpBucket{key: b.key, closedAt: -1, cutAt: -1}
				if cur.capIdx < len(caps)-1 {
					cur.capIdx++
				}
			}
		}
		if len(pending) > 0 && (hasOutput || i == firstCompute) {
			// At the first compute node the piece starts anyway: no cut.
			if i != firstCompute {
				cutsDesc = append(cutsDesc, i)
				end = i
				hasOutput = false
			}
			for _, bi := range pending {
				if i != firstCompute {
					buckets[bi].cutAt = i
				}
				if buckets[bi].closedAt != i {
					buckets[bi].extended = true
				}
			}
			pending = pending[:0]
		}
	}

	// Buckets that never reached their cap close when backward ends, in the
	// order of their first gradient (DDP appends them in hash-map order; a
	// fixed order keeps every rank's plan identical).
	openStart := len(buckets)
	for k := range cursors {
		if len(cursors[k].open.params) > 0 {
			buckets = append(buckets, cursors[k].open)
		}
	}
	slices.SortFunc(buckets[openStart:], func(a, b ddpBucket) int { return cmp.Compare(a.firstReady, b.firstReady) })

	cuts := make([]int, len(cutsDesc))
	for k, c := range cutsDesc {
		cuts[len(cuts)-1-k] = c
	}
	if len(cuts) > 0 {
		hasParam, hasOutput := firstPieceContents(g, firstUse, lastUser, firstCompute, cuts[0])
		if !hasParam || !hasOutput {
			// Dropping a cut for want of an output moves it, as extension
			// does; a parameter-free preamble merely joins the next piece.
			if !hasOutput {
				for k := range buckets {
					if buckets[k].cutAt == cuts[0] {
						buckets[k].extended = true
					}
				}
			}
			cuts = cuts[1:]
		}
	}
	numPieces := 0
	if firstCompute >= 0 {
		numPieces = len(cuts) + 1
	}
	part := piecesFromCuts(g.Ops, cuts)
	if cfg.MaxPieces > 0 && numPieces > cfg.MaxPieces {
		pieceBytes := make([]int64, numPieces)
		for p, i := range firstUse {
			if i >= 0 {
				pieceBytes[part[i]] += g.Params[p].Bytes // bounded by the checked total
			}
		}
		keep := mergePieces(pieceBytes, cfg.MaxPieces)
		kept := cuts[:0:0]
		for k, c := range cuts {
			if keep[k] {
				kept = append(kept, c)
			}
		}
		cuts = kept
		numPieces = len(cuts) + 1
		part = piecesFromCuts(g.Ops, cuts)
	}

	pl := &Plan{
		NodePiece: part,
		NumPieces: numPieces,
		Buckets:   make([]Bucket, len(buckets)),
	}
	for k := range buckets {
		b := &buckets[k]
		pl.Buckets[k] = Bucket{
			Bytes:     b.bytes,
			Params:    slices.Clip(b.params),
			NodeBegin: b.nodeBegin,
			NodeEnd:   b.nodeEnd,
			Piece:     int(part[b.nodeBegin]),
			Extended:  b.extended,
			DType:     keys[b.key].dtype,
			Device:    keys[b.key].device,
		}
	}
	if cfg.AlignBuckets {
		pl.Buckets = alignedBuckets(g, ready, firstUse, part, numPieces, pl.Buckets)
	}
	return pl, nil
}

// firstUses returns, per parameter, the first compute node that refers to it
// if DDP reduces its gradient, else -1. It also bounds the total counted
// bytes, so that no later sum of them can overflow.
func firstUses(g *Graph) ([]int32, error) {
	first := make([]int32, len(g.Params))
	for p := range first {
		first[p] = -1
	}
	var total int64
	for i, op := range g.Ops {
		if !isCompute(op) {
			continue
		}
		for _, p := range g.ParamIndex[g.ParamOffsets[i]:g.ParamOffsets[i+1]] {
			prm := &g.Params[p]
			if first[p] >= 0 || !prm.counted() {
				continue
			}
			first[p] = int32(i)
			var ok bool
			if total, ok = addBytes(total, prm.Bytes); !ok {
				return nil, errorf(ErrOverflow, "planner: node %d: total bytes of counted parameters overflow int64 when adding parameter %d (%q, %d bytes)",
					i, p, prm.Name, prm.Bytes)
			}
		}
	}
	return first, nil
}

// groupKeys numbers the distinct (dtype, device) keys of the parameters in
// use, in ascending key order, and returns each parameter's key number
// (0 for parameters not in use).
func groupKeys(g *Graph, firstUse []int32) (keyOf []int32, keys []bucketKey) {
	keyOf = make([]int32, len(g.Params))
	keyAt := func(p int) bucketKey { return bucketKey{g.Params[p].DType, g.Params[p].Device} }
	for p, i := range firstUse {
		if i >= 0 {
			keys = append(keys, keyAt(p))
		}
	}
	if len(keys) == 0 {
		return keyOf, nil
	}
	// Nearly every model has a single key: all parameters' key numbers are
	// already 0.
	if !slices.ContainsFunc(keys, func(k bucketKey) bool { return k != keys[0] }) {
		return keyOf, keys[:1]
	}
	compare := func(a, b bucketKey) int {
		if c := cmp.Compare(a.dtype, b.dtype); c != 0 {
			return c
		}
		return cmp.Compare(a.device, b.device)
	}
	slices.SortFunc(keys, compare)
	keys = slices.Compact(keys)
	for p, i := range firstUse {
		if i >= 0 {
			k, _ := slices.BinarySearchFunc(keys, keyAt(p), compare)
			keyOf[p] = int32(k)
		}
	}
	return keyOf, keys
}

// capList is the list of caps DDP's rebuild walks through, per key; the last
// entry repeats.
func capList(cfg *Config) []int64 {
	if len(cfg.BucketCapsBytes) > 0 {
		return cfg.BucketCapsBytes
	}
	if cfg.FirstBucketCapBytes < cfg.BucketCapBytes {
		return []int64{cfg.FirstBucketCapBytes, cfg.BucketCapBytes}
	}
	return []int64{cfg.BucketCapBytes}
}

// firstPieceContents inspects the forward-first piece, the compute nodes
// before cut. It deserves its own piece only if it holds the first use of a
// counted parameter (else its backward completes no gradient and the cut
// only adds overhead) and has an output (else it cannot be split off).
func firstPieceContents(g *Graph, firstUse, lastUser []int32, firstCompute, cut int) (hasParam, hasOutput bool) {
	for i := firstCompute; i < cut; i++ {
		if !isCompute(g.Ops[i]) {
			continue
		}
		if lastUser[i] >= int32(cut) {
			hasOutput = true
		}
		for _, p := range g.ParamIndex[g.ParamOffsets[i]:g.ParamOffsets[i+1]] {
			if int(firstUse[p]) == i {
				hasParam = true
			}
		}
		if hasParam && hasOutput {
			break
		}
	}
	return hasParam, hasOutput
}
