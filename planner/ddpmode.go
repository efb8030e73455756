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

// ddpWalk holds the state of one planDDP run: the inputs it derives once,
// then the reducer simulation of the reverse walk.
type ddpWalk struct {
	g            *Graph
	cfg          *Config
	lastUser     []int32
	firstUse     []int32     // per parameter: node of its first forward use, or -1
	keyOf        []int32     // per parameter: its (dtype, device) key number
	keys         []bucketKey // the keys in use, ascending
	caps         []int64     // DDP's cap list; the last entry repeats
	cursors      []keyCursor // per key
	firstCompute int         // first compute node, or -1

	buckets   []ddpBucket // closed buckets in closing order (DDP order)
	pending   []int       // closed buckets still waiting for their cut
	cutsDesc  []int       // first node of each piece but the first, descending
	emitted   []bool      // per parameter: already passed to the reducer
	ready     []int32     // the predicted ready order, kept for AlignBuckets only
	readyPos  int
	end       int  // first node after the current piece
	hasOutput bool // the current piece has a value read at or after end
}

// planDDP assigns each counted parameter to the node of its first forward
// use, walks those first uses in gradient-ready order (reverse forward order,
// reverse listed order within a node) through a simulation of DDP's bucket
// assignment, and cuts the graph just before the node at which each bucket
// closes, moving a cut earlier when the piece it would end has no output.
func planDDP(g *Graph, cfg *Config, lastUser []int32) (*Plan, error) {
	w, err := newDDPWalk(g, cfg, lastUser)
	if err != nil {
		return nil, err
	}
	for i := len(g.Ops) - 2; i >= 0; i-- {
		if isCompute(g.Ops[i]) {
			w.visit(i)
		}
	}
	w.closeOpenBuckets()
	cuts := w.dropEmptyFirstCut(w.forwardCuts())
	cuts = w.limitPieces(cuts)
	return w.plan(cuts), nil
}

// newDDPWalk derives what the walk needs from the graph and config.
func newDDPWalk(g *Graph, cfg *Config, lastUser []int32) (*ddpWalk, error) {
	firstUse, err := firstUses(g)
	if err != nil {
		return nil, err
	}
	w := &ddpWalk{
		g:            g,
		cfg:          cfg,
		lastUser:     lastUser,
		firstUse:     firstUse,
		caps:         capList(cfg),
		firstCompute: -1,
		emitted:      make([]bool, len(g.Params)),
		end:          len(g.Ops) - 1,
	}
	w.keyOf, w.keys = groupKeys(g, firstUse)
	w.cursors = make([]keyCursor, len(w.keys))
	for k := range w.cursors {
		w.cursors[k].open = ddpBucket{key: k, closedAt: -1, cutAt: -1}
	}
	for i, op := range g.Ops {
		if isCompute(op) {
			w.firstCompute = i
			break
		}
	}
	return w, nil
}

// visit handles compute node i of the reverse walk: the gradients of the
// parameters first used there become ready, and if that closed a bucket the
// graph is cut before i, once the piece ending at the cut has an output.
func (w *ddpWalk) visit(i int) {
	if w.lastUser[i] >= int32(w.end) {
		w.hasOutput = true
	}
	g := w.g
	lo, hi := g.ParamOffsets[i], g.ParamOffsets[i+1]
	for k := hi - 1; k >= lo; k-- {
		p := g.ParamIndex[k]
		if int(w.firstUse[p]) != i || w.emitted[p] {
			continue
		}
		w.emitted[p] = true
		w.gradientReady(i, p)
	}
	if len(w.pending) > 0 && (w.hasOutput || i == w.firstCompute) {
		w.cut(i)
	}
}

// gradientReady passes parameter p, first used at node i, to the reducer
// simulation: it joins its key's open bucket, which closes at its cap.
func (w *ddpWalk) gradientReady(i int, p int32) {
	if w.cfg.AlignBuckets {
		w.ready = append(w.ready, p)
	}
	cur := &w.cursors[w.keyOf[p]]
	b := &cur.open
	if len(b.params) == 0 {
		b.firstReady = w.readyPos
		b.nodeEnd = i + 1
	}
	w.readyPos++
	b.params = append(b.params, p)
	b.bytes += w.g.Params[p].Bytes // cannot overflow: firstUses bounded the total
	b.nodeBegin = i
	if b.bytes >= w.caps[cur.capIdx] {
		b.closedAt = i
		w.buckets = append(w.buckets, *b)
		w.pending = append(w.pending, len(w.buckets)-1)
		cur.open = ddpBucket{key: b.key, closedAt: -1, cutAt: -1}
		if cur.capIdx < len(w.caps)-1 {
			cur.capIdx++
		}
	}
}

// cut starts a piece at node i for the pending buckets. A bucket that closed
// at a later node is extended: its cut had to wait for an output.
func (w *ddpWalk) cut(i int) {
	// At the first compute node the piece starts anyway: no cut.
	if i != w.firstCompute {
		w.cutsDesc = append(w.cutsDesc, i)
		w.end = i
		w.hasOutput = false
	}
	for _, bi := range w.pending {
		if i != w.firstCompute {
			w.buckets[bi].cutAt = i
		}
		if w.buckets[bi].closedAt != i {
			w.buckets[bi].extended = true
		}
	}
	w.pending = w.pending[:0]
}

// closeOpenBuckets closes the buckets that never reached their cap, as
// backward's end does, in the order of their first gradient (DDP appends
// them in hash-map order; a fixed order keeps every rank's plan identical).
func (w *ddpWalk) closeOpenBuckets() {
	openStart := len(w.buckets)
	for k := range w.cursors {
		if len(w.cursors[k].open.params) > 0 {
			w.buckets = append(w.buckets, w.cursors[k].open)
		}
	}
	slices.SortFunc(w.buckets[openStart:], func(a, b ddpBucket) int { return cmp.Compare(a.firstReady, b.firstReady) })
}

// forwardCuts returns the cuts in forward order.
func (w *ddpWalk) forwardCuts() []int {
	cuts := make([]int, len(w.cutsDesc))
	for k, c := range w.cutsDesc {
		cuts[len(cuts)-1-k] = c
	}
	return cuts
}

// dropEmptyFirstCut removes the first cut when the forward-first piece does
// not deserve a piece of its own (see firstPieceContents).
func (w *ddpWalk) dropEmptyFirstCut(cuts []int) []int {
	if len(cuts) == 0 {
		return cuts
	}
	hasParam, hasOutput := firstPieceContents(w.g, w.firstUse, w.lastUser, w.firstCompute, cuts[0])
	if hasParam && hasOutput {
		return cuts
	}
	// Dropping a cut for want of an output moves it, as extension does; a
	// parameter-free preamble merely joins the next piece.
	if !hasOutput {
		for k := range w.buckets {
			if w.buckets[k].cutAt == cuts[0] {
				w.buckets[k].extended = true
			}
		}
	}
	return cuts[1:]
}

// numPieces is how many pieces the cuts make: none for a graph without
// compute nodes.
func (w *ddpWalk) numPieces(cuts []int) int {
	if w.firstCompute < 0 {
		return 0
	}
	return len(cuts) + 1
}

// limitPieces merges adjacent pieces down to cfg.MaxPieces (see
// mergePieces) and returns the surviving cuts.
func (w *ddpWalk) limitPieces(cuts []int) []int {
	numPieces := w.numPieces(cuts)
	if w.cfg.MaxPieces <= 0 || numPieces <= w.cfg.MaxPieces {
		return cuts
	}
	part := piecesFromCuts(w.g.Ops, cuts)
	pieceBytes := make([]int64, numPieces)
	for p, i := range w.firstUse {
		if i >= 0 {
			pieceBytes[part[i]] += w.g.Params[p].Bytes // bounded by the checked total
		}
	}
	keep := mergePieces(pieceBytes, w.cfg.MaxPieces)
	kept := cuts[:0:0]
	for k, c := range cuts {
		if keep[k] {
			kept = append(kept, c)
		}
	}
	return kept
}

// plan numbers the nodes by piece and reports the buckets, each in the
// piece of its forward-first parameter use; AlignBuckets then reshapes the
// buckets to the pieces.
func (w *ddpWalk) plan(cuts []int) *Plan {
	part := piecesFromCuts(w.g.Ops, cuts)
	numPieces := w.numPieces(cuts)
	pl := &Plan{
		NodePiece: part,
		NumPieces: numPieces,
		Buckets:   make([]Bucket, len(w.buckets)),
	}
	for k := range w.buckets {
		b := &w.buckets[k]
		pl.Buckets[k] = Bucket{
			Bytes:     b.bytes,
			Params:    slices.Clip(b.params),
			NodeBegin: b.nodeBegin,
			NodeEnd:   b.nodeEnd,
			Piece:     int(part[b.nodeBegin]),
			Extended:  b.extended,
			DType:     w.keys[b.key].dtype,
			Device:    w.keys[b.key].device,
		}
	}
	if w.cfg.AlignBuckets {
		w.align(pl, cuts)
	}
	return pl
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

// groupKeys is paramKeys of the parameters in use: those DDP's rebuild
// sees in backward.
func groupKeys(g *Graph, firstUse []int32) (keyOf []int32, keys []bucketKey) {
	var used []int32
	for p, i := range firstUse {
		if i >= 0 {
			used = append(used, int32(p))
		}
	}
	return paramKeys(g, used)
}

// paramKeys numbers the (dtype, device) keys of params (ascending) and
// gives each of them its key's number; other parameters get 0.
func paramKeys(g *Graph, params []int32) (keyOf []int32, keys []bucketKey) {
	keyOf = make([]int32, len(g.Params))
	keyAt := func(p int32) bucketKey { return bucketKey{g.Params[p].DType, g.Params[p].Device} }
	for _, p := range params {
		keys = append(keys, keyAt(p))
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
	for _, p := range params {
		k, _ := slices.BinarySearchFunc(keys, keyAt(p), compare)
		keyOf[p] = int32(k)
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
