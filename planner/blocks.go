package planner

// This file implements block-aligned cuts (ModeDDP with Graph.BlockIDs).
//
// Why: a model built from repeated blocks (transformer layers) compiles each
// piece separately. Byte-driven cuts fall inside blocks, so every piece is a
// different graph and compile time grows with depth. Cutting at block
// boundaries instead makes every block piece the same graph, which the
// caller compiles once; DDP's buckets then span several consecutive pieces
// (a bucket's caps close at a subset of the cuts) instead of one each.
//
// Pieces. A block run is a maximal stretch of compute nodes that belong to
// one block instance, nodes without a block (-1) in between being
// transparent: they join the run before them. A piece starts at the first
// compute node of every run and at the first compute node after the last
// block node (the tail); compute nodes before the first run form a preamble
// piece. A cut whose piece before it would have no output (no node of it
// used at or after the cut) is dropped, merging that piece into the next.
// MaxPieces, if set, then merges pieces as in byte-driven ModeDDP
// (identical pieces may stop being identical: the user asked for fewer).
//
// Buckets. Without AlignBuckets, the buckets are ModeDDP's predicted DDP
// buckets (see ddpmode.go); only their Piece is re-read from the new
// pieces and Extended is false (no cut moved for them). With AlignBuckets,
// consecutive pieces are grouped into buckets, walking pieces in DDP order
// (last piece first) and the cap list as DDP does (capList); a bucket
// closes at the piece boundary whose cumulative bytes are nearest to its
// cap. See groupPieces for the tolerance.

// blockRuns returns the first compute node of every block run, ascending.
// A graph without block ids has none.
func blockRuns(g *Graph) []int {
	if g.BlockIDs == nil {
		return nil
	}
	var runs []int
	current := int32(-1)
	for i, op := range g.Ops {
		if !isCompute(op) {
			continue
		}
		id := g.BlockIDs[i]
		if id >= 0 && id != current {
			runs = append(runs, i)
			current = id
		}
	}
	return runs
}

// blockPlan holds the state of one block-aligned plan.
type blockPlan struct {
	g        *Graph
	cfg      *Config
	lastUser []int32
	firstUse []int32
	cuts     []int // first node of every piece but the first, ascending
	part     []int32
	pieces   int
}

// planBlocks cuts at block boundaries and builds the buckets (see the file
// comment). runs comes from blockRuns and has at least two entries.
func planBlocks(g *Graph, cfg *Config, lastUser []int32, runs []int) (*Plan, error) {
	// The predicted DDP buckets; planDDP also checks that byte sums cannot
	// overflow.
	predictCfg := *cfg
	predictCfg.MaxPieces = 0
	predictCfg.AlignBuckets = false
	predicted, err := planDDP(g, &predictCfg, lastUser)
	if err != nil {
		return nil, err
	}
	firstUse, err := firstUses(g)
	if err != nil {
		return nil, err
	}
	b := &blockPlan{g: g, cfg: cfg, lastUser: lastUser, firstUse: firstUse}
	b.cutAtBlocks(runs)
	b.dropCutsWithoutOutput()
	b.mergeToLimit()
	b.part = piecesFromCuts(g.Ops, b.cuts)

	pl := &Plan{NodePiece: b.part, NumPieces: b.pieces}
	if cfg.AlignBuckets {
		pl.Buckets = b.groupedBuckets()
		pl.Alignment = AlignReady
		for k := range pl.Buckets {
			pl.DDPCaps = append(pl.DDPCaps, pl.Buckets[k].Bytes)
		}
		return pl, nil
	}
	pl.Buckets = predicted.Buckets
	for k := range pl.Buckets {
		pl.Buckets[k].Piece = int(b.part[pl.Buckets[k].NodeBegin])
		pl.Buckets[k].Extended = false
	}
	return pl, nil
}

// cutAtBlocks places a cut at every run start that has compute nodes before
// it, and one at the first compute node after the last block node.
func (b *blockPlan) cutAtBlocks(runs []int) {
	g := b.g
	firstCompute, lastBlock := -1, -1
	for i, op := range g.Ops {
		if !isCompute(op) {
			continue
		}
		if firstCompute < 0 {
			firstCompute = i
		}
		if g.BlockIDs[i] >= 0 {
			lastBlock = i
		}
	}
	for _, r := range runs {
		if r != firstCompute {
			b.cuts = append(b.cuts, r)
		}
	}
	for i := lastBlock + 1; i < len(g.Ops); i++ {
		if isCompute(g.Ops[i]) {
			b.cuts = append(b.cuts, i)
			break
		}
	}
}

// dropCutsWithoutOutput removes every cut whose preceding piece has no node
// used at or after the cut: such a piece could not hand anything on, so it
// joins the next one. Then, while the last piece has nothing the output node
// reads (a tail of in-place updates, say), its cut goes too.
func (b *blockPlan) dropCutsWithoutOutput() {
	kept := b.cuts[:0]
	next := 0
	reach := int32(-1) // largest lastUser among the current piece's nodes
	for i, op := range b.g.Ops {
		if next < len(b.cuts) && b.cuts[next] == i {
			if reach >= int32(i) {
				kept = append(kept, i)
				reach = -1
			}
			next++
		}
		if isCompute(op) {
			reach = max(reach, b.lastUser[i])
		}
	}
	output := int32(len(b.g.Ops) - 1)
	for len(kept) > 0 && reach < output {
		last := kept[len(kept)-1]
		kept = kept[:len(kept)-1]
		start := 0
		if len(kept) > 0 {
			start = kept[len(kept)-1]
		}
		for i := start; i < last; i++ {
			if isCompute(b.g.Ops[i]) {
				reach = max(reach, b.lastUser[i])
			}
		}
	}
	b.cuts = kept
	b.pieces = len(b.cuts) + 1
}

// mergeToLimit applies MaxPieces by merging the pieces with the fewest
// bytes, as byte-driven ModeDDP does.
func (b *blockPlan) mergeToLimit() {
	if b.cfg.MaxPieces <= 0 || b.pieces <= b.cfg.MaxPieces {
		return
	}
	part := piecesFromCuts(b.g.Ops, b.cuts)
	keep := mergePieces(b.pieceBytes(part), b.cfg.MaxPieces)
	kept := b.cuts[:0:0]
	for k, c := range b.cuts {
		if keep[k] {
			kept = append(kept, c)
		}
	}
	b.cuts = kept
	b.pieces = len(kept) + 1
}

// pieceBytes sums, per piece, the bytes of the counted parameters first
// used in it.
func (b *blockPlan) pieceBytes(part []int32) []int64 {
	bytes := make([]int64, b.pieces)
	for p, i := range b.firstUse {
		if i >= 0 {
			bytes[part[i]] += b.g.Params[p].Bytes // bounded by firstUses' check
		}
	}
	return bytes
}

// groupedBuckets builds the aligned buckets, each a run of consecutive
// pieces chosen by groupPieces, in DDP order.
func (b *blockPlan) groupedBuckets() []Bucket {
	g := b.g
	ready := readyOrder(g, b.firstUse)
	if len(ready) == 0 {
		return nil
	}
	groups := groupPieces(b.pieceBytes(b.part), capList(b.cfg))
	// ready lists parameters by descending piece, so each group (a
	// descending range of pieces) is one contiguous run of it.
	out := make([]Bucket, 0, len(groups))
	lo := 0
	for _, grp := range groups {
		hi := lo
		for hi < len(ready) && int(b.part[b.firstUse[ready[hi]]]) >= grp.first {
			hi++
		}
		if hi == lo {
			continue // a group of pieces without counted parameters
		}
		bk := bucketFromRun(g, b.firstUse, ready[lo:hi])
		bk.Piece = grp.first
		out = append(out, bk)
		lo = hi
	}
	return out
}

// pieceGroup is a run of consecutive pieces first..last (forward order) that
// forms one bucket.
type pieceGroup struct {
	first, last int
}

// groupPieces groups pieces into buckets in DDP order (the last piece
// first), the k-th bucket against caps[min(k, len(caps)-1)].
//
// Tolerance: a bucket closes at the piece boundary whose cumulative bytes
// are nearest to its cap, ties going to the boundary at or past the cap as
// DDP's own rule would. So a closed bucket of at least two pieces misses
// its cap by at most half the bytes of the piece at its boundary; a single
// piece larger than the cap is a bucket on its own (a block is never split
// here); the last bucket holds what remains. Why nearest rather than DDP's
// "close once reached": DDP overshoots by up to one parameter, a block is
// many parameters, and always overshooting would make every bucket up to a
// block too large; nearest keeps the mean bucket size at the cap, hence
// DDP's number of allreduces per step, and halves the worst miss.
// Pieces without bytes never close a bucket; a trailing run of them (the
// forward-first pieces) joins the bucket before it.
func groupPieces(pieceBytes []int64, caps []int64) []pieceGroup {
	var groups []pieceGroup
	last := len(pieceBytes) - 1 // last piece of the open group
	var acc int64
	closeAt := func(first int) {
		groups = append(groups, pieceGroup{first: first, last: last})
		last = first - 1
		acc = 0
	}
	for p := len(pieceBytes) - 1; p >= 0; p-- {
		limit := caps[min(len(groups), len(caps)-1)]
		s := pieceBytes[p]
		if acc > 0 && s > 0 && acc+s > limit && limit-acc < acc+s-limit {
			closeAt(p + 1) // closing before p is nearer to the cap
			limit = caps[min(len(groups), len(caps)-1)]
		}
		acc += s
		if acc >= limit && acc > 0 {
			closeAt(p)
		}
	}
	if last >= 0 {
		if acc == 0 && len(groups) > 0 {
			groups[len(groups)-1].first = 0
		} else {
			groups = append(groups, pieceGroup{first: 0, last: last})
		}
	}
	return groups
}

// readyOrder is ModeDDP's predicted gradient-ready order of the counted
// parameters in use: reverse forward order of first uses, reverse listed
// order within a node, each parameter once.
func readyOrder(g *Graph, firstUse []int32) []int32 {
	var ready []int32
	emitted := make([]bool, len(g.Params))
	for i := len(g.Ops) - 1; i >= 0; i-- {
		lo, hi := g.ParamOffsets[i], g.ParamOffsets[i+1]
		for k := hi - 1; k >= lo; k-- {
			p := g.ParamIndex[k]
			if int(firstUse[p]) == i && !emitted[p] {
				emitted[p] = true
				ready = append(ready, p)
			}
		}
	}
	return ready
}
