package planner

// This file reproduces the bucketing of torch's DDPOptimizer
// (torch/_dynamo/backends/distributed.py, DDPOptimizer.compile_fn), quirks
// included, so that ModeTorch can be checked against torch itself and used
// as the baseline that ModeDDP improves on.

// torchBucket is one bucket of the reverse walk while it is being filled.
type torchBucket struct {
	size     int64 // counted storage bytes, duplicates included
	begin    int   // forward-first node in the bucket
	last     int   // forward-last node in the bucket
	extended bool  // it reached its cap without an output and kept growing
	paramsLo int   // its parameters are torchWalk.params[paramsLo:paramsHi]
	paramsHi int
}

// torchWalk holds the state of one reverse walk.
type torchWalk struct {
	g       *Graph
	buckets []torchBucket // closed buckets in the order they were closed (DDP order)
	cur     torchBucket
	params  []int32 // every bucket's parameter list, back to back
	listed  []int32 // per parameter: 1 + the bucket number it was last listed in
	modules *moduleSet
}

// planTorch walks the compute nodes from last to first. Before each node it
// checks whether the current bucket is full (the first bucket against the
// first-bucket cap); a full bucket that has an output is closed and a new one
// opened, while a full bucket without an output keeps growing (extension).
// Then the node's parameters are counted the way torch counts them and the
// node joins the current bucket.
func planTorch(g *Graph, cfg *Config, lastUser []int32) (*Plan, error) {
	n := len(g.Ops)
	output := n - 1
	w := &torchWalk{
		g:       g,
		listed:  make([]int32, len(g.Params)),
		modules: newModuleSet(g),
	}
	// end is the forward index just past the current bucket: the first node
	// of the bucket closed before it, or the output node.
	end := output
	hasOutput := false
	hasNodes := false
	for i := n - 2; i >= 0; i-- {
		if !isCompute(g.Ops[i]) {
			continue
		}
		full := w.cur.size >= cfg.BucketCapBytes ||
			(len(w.buckets) == 0 && w.cur.size >= cfg.FirstBucketCapBytes)
		if full {
			if hasOutput {
				w.cur.paramsHi = len(w.params)
				w.buckets = append(w.buckets, w.cur)
				end = w.cur.begin
				w.cur = torchBucket{paramsLo: len(w.params)}
				hasOutput = false
				hasNodes = false
			} else {
				w.cur.extended = true
			}
		}
		if err := w.countNode(i); err != nil {
			return nil, err
		}
		if !hasNodes {
			w.cur.last = i
			hasNodes = true
		}
		w.cur.begin = i
		if lastUser[i] >= int32(end) {
			hasOutput = true
		}
	}
	if hasNodes {
		w.cur.paramsHi = len(w.params)
		w.buckets = append(w.buckets, w.cur)
	}
	w.mergeEmptyPreamble()
	return w.plan(), nil
}

// countNode adds the parameters that torch counts for node i to the current
// bucket. torch counts module parameters before positional arguments on a
// call_method node, so module references go first on every node.
func (w *torchWalk) countNode(i int) error {
	g := w.g
	op := g.Ops[i]
	lo, hi := g.ParamOffsets[i], g.ParamOffsets[i+1]
	if op == OpCallModule || op == OpCallMethod {
		// torch marks a module as processed the first time any node calls
		// it, whether or not that node refers to its parameters.
		if id := g.ModuleIDs[i]; id >= 0 && w.modules.firstVisit(id) {
			for k := lo; k < hi; k++ {
				if g.ParamRefs[k] == RefModule {
					if err := w.count(i, g.ParamIndex[k]); err != nil {
						return err
					}
				}
			}
		}
	}
	// The kind of reference torch counts on each op, each time it occurs.
	var want RefKind
	switch op {
	case OpCallFunction, OpCallMethod:
		want = RefArg
	case OpGetAttr:
		want = RefAttr
	default:
		return nil
	}
	for k := lo; k < hi; k++ {
		if g.ParamRefs[k] == want {
			if err := w.count(i, g.ParamIndex[k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// count adds one use of parameter p at node i to the current bucket: its
// storage bytes every time, its index once per bucket.
func (w *torchWalk) count(i int, p int32) error {
	prm := &w.g.Params[p]
	if !prm.counted() {
		return nil
	}
	size, ok := addBytes(w.cur.size, prm.StorageBytes)
	if !ok {
		return errorf(ErrOverflow, "planner: node %d: bucket storage bytes overflow int64 when adding parameter %d (%q, %d bytes)",
			i, p, prm.Name, prm.StorageBytes)
	}
	w.cur.size = size
	stamp := int32(len(w.buckets) + 1)
	if w.listed[p] != stamp {
		w.listed[p] = stamp
		w.params = append(w.params, p)
	}
	return nil
}

// mergeEmptyPreamble folds a forward-first bucket that counted nothing (a
// parameter-free preamble) into the bucket after it, as torch does.
func (w *torchWalk) mergeEmptyPreamble() {
	nb := len(w.buckets)
	if nb < 2 || w.buckets[nb-1].size != 0 {
		return
	}
	first, next := w.buckets[nb-1], &w.buckets[nb-2]
	next.begin = first.begin
	// torch asserts that a size-0 bucket lists no parameters; one can when
	// a counted parameter has zero storage bytes. Keep such parameters in
	// the merged bucket (listed once) instead of failing.
	if first.paramsHi > first.paramsLo {
		stamp := int32(nb + 1) // unused by any bucket so far
		for _, p := range w.params[next.paramsLo:next.paramsHi] {
			w.listed[p] = stamp
		}
		var extra []int32
		for _, p := range w.params[first.paramsLo:first.paramsHi] {
			if w.listed[p] != stamp {
				w.listed[p] = stamp
				extra = append(extra, p)
			}
		}
		// first's list directly follows next's in w.params.
		w.params = append(w.params[:next.paramsHi], extra...)
		next.paramsHi = len(w.params)
	}
	w.buckets = w.buckets[:nb-1]
}

// plan turns the buckets into pieces, one per bucket: the bucket closed
// first holds the gradients ready first and becomes the last piece.
func (w *torchWalk) plan() *Plan {
	nb := len(w.buckets)
	cuts := make([]int, 0, max(nb-1, 0))
	for k := nb - 2; k >= 0; k-- {
		cuts = append(cuts, w.buckets[k].begin)
	}
	pl := &Plan{
		NodePiece: piecesFromCuts(w.g.Ops, cuts),
		NumPieces: nb,
		Buckets:   make([]Bucket, nb),
	}
	for k, b := range w.buckets {
		pl.Buckets[k] = Bucket{
			Bytes:     b.size,
			Params:    w.params[b.paramsLo:b.paramsHi:b.paramsHi],
			NodeBegin: b.begin,
			NodeEnd:   b.last + 1,
			Piece:     nb - 1 - k,
			Extended:  b.extended,
			DType:     -1,
			Device:    -1,
		}
	}
	return pl
}
