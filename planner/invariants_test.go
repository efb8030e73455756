package planner

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
)

// This file checks plans against the documented invariants and against
// deliberately naive reference implementations of both modes: maps, sets
// and sorting where Build uses flat arrays and a single pass, so that the
// two share no code and no shortcuts.

// checkPlan returns every violated invariant of pl as planned from g and
// cfg; an empty result means the plan is valid.
func checkPlan(g *Graph, cfg Config, pl *Plan) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	n := len(g.Ops)

	// Pieces: contiguous, non-empty, numbered in forward order.
	if len(pl.NodePiece) != n {
		fail("NodePiece has %d entries, want %d", len(pl.NodePiece), n)
		return bad
	}
	prev := int32(-1)
	anyCompute := false
	for i, op := range g.Ops {
		q := pl.NodePiece[i]
		if !isCompute(op) {
			if q != -1 {
				fail("node %d (op %d) has piece %d, want -1", i, op, q)
			}
			continue
		}
		anyCompute = true
		if q < prev || q > prev+1 {
			fail("node %d has piece %d after piece %d: pieces must be contiguous and increase by one", i, q, prev)
		}
		prev = q
	}
	if anyCompute && int(prev) != pl.NumPieces-1 {
		fail("last piece is %d but NumPieces is %d", prev, pl.NumPieces)
	}
	if !anyCompute && pl.NumPieces != 0 {
		fail("no compute nodes but NumPieces is %d", pl.NumPieces)
	}
	if cfg.MaxPieces > 0 && pl.NumPieces > cfg.MaxPieces {
		fail("NumPieces %d exceeds MaxPieces %d", pl.NumPieces, cfg.MaxPieces)
	}
	if len(bad) > 0 {
		return bad
	}

	// Crossings, recomputed naively.
	wantIn, wantOut := naiveCrossings(g, pl.NodePiece, pl.NumPieces)
	if len(pl.PieceInputs) != pl.NumPieces || len(pl.PieceOutputs) != pl.NumPieces {
		fail("crossing lists have %d/%d entries, want %d", len(pl.PieceInputs), len(pl.PieceOutputs), pl.NumPieces)
		return bad
	}
	for p := range pl.NumPieces {
		if !slices.Equal(pl.PieceInputs[p], wantIn[p]) {
			fail("piece %d inputs %v, want %v", p, pl.PieceInputs[p], wantIn[p])
		}
		if !slices.Equal(pl.PieceOutputs[p], wantOut[p]) {
			fail("piece %d outputs %v, want %v", p, pl.PieceOutputs[p], wantOut[p])
		}
		// Every piece after the first was cut off only once it had an
		// output; in ModeDDP the first piece too, when there is a cut.
		needsOutput := p > 0 || (cfg.Mode == ModeDDP && pl.NumPieces > 1)
		if needsOutput && len(wantOut[p]) == 0 {
			fail("piece %d has no output", p)
		}
	}

	for k, b := range pl.Buckets {
		if b.Piece < 0 || b.Piece >= pl.NumPieces {
			fail("bucket %d: piece %d out of range", k, b.Piece)
		}
		if b.NodeBegin < 0 || b.NodeEnd > n || b.NodeBegin >= b.NodeEnd {
			fail("bucket %d: bad node range [%d, %d)", k, b.NodeBegin, b.NodeEnd)
		}
		seen := map[int32]bool{}
		for _, p := range b.Params {
			if seen[p] {
				fail("bucket %d lists parameter %d twice", k, p)
			}
			seen[p] = true
			if !g.Params[p].counted() {
				fail("bucket %d lists parameter %d (%q), which DDP does not reduce", k, p, g.Params[p].Name)
			}
		}
	}
	if len(bad) > 0 {
		return bad
	}
	switch {
	case cfg.Mode == ModeTorch:
		bad = append(bad, checkTorch(g, cfg, pl)...)
	case countBlockRuns(g) >= 2:
		bad = append(bad, checkBlocks(g, cfg, pl)...)
	case cfg.AlignBuckets:
		bad = append(bad, checkAligned(g, cfg, pl)...)
	default:
		bad = append(bad, checkDDP(g, cfg, pl)...)
	}
	return bad
}

// naiveCrossings computes piece inputs and outputs with sets.
func naiveCrossings(g *Graph, part []int32, numPieces int) (inputs, outputs [][]int32) {
	inSets := make([]map[int32]bool, numPieces)
	outSets := make([]map[int32]bool, numPieces)
	for p := range numPieces {
		inSets[p], outSets[p] = map[int32]bool{}, map[int32]bool{}
	}
	for j := range g.Ops {
		for _, u := range g.Users[g.UserOffsets[j]:g.UserOffsets[j+1]] {
			if g.Ops[u] == OpOutput {
				if part[j] >= 0 {
					outSets[part[j]][int32(j)] = true
				}
				continue
			}
			if part[u] != part[j] {
				inSets[part[u]][int32(j)] = true
				if part[j] >= 0 {
					outSets[part[j]][int32(j)] = true
				}
			}
		}
	}
	sorted := func(set map[int32]bool) []int32 {
		list := []int32{}
		for j := range set {
			list = append(list, j)
		}
		slices.Sort(list)
		return list
	}
	inputs, outputs = make([][]int32, numPieces), make([][]int32, numPieces)
	for p := range numPieces {
		inputs[p], outputs[p] = sorted(inSets[p]), sorted(outSets[p])
	}
	return inputs, outputs
}

// refTorchBucket is a bucket of referenceTorch, kept as torch keeps it.
type refTorchBucket struct {
	size     int64
	names    []int32 // every counted use, duplicates included, like torch's bucket.params
	nodes    []int   // in walk (reverse) order
	extended bool
	added    map[int]int64 // bytes each node counted
}

// referenceTorch transliterates DDPOptimizer.compile_fn's bucketing:
// buckets[0] is the forward-first bucket.
func referenceTorch(g *Graph, cfg Config) []*refTorchBucket {
	buckets := []*refTorchBucket{{added: map[int]int64{}}}
	processed := map[int32]bool{}
	hasExternalOutput := func(b *refTorchBucket) bool {
		in := map[int]bool{}
		for _, node := range b.nodes {
			in[node] = true
			for _, u := range g.Users[g.UserOffsets[node]:g.UserOffsets[node+1]] {
				if !in[int(u)] {
					return true
				}
			}
		}
		return false
	}
	for i := len(g.Ops) - 1; i >= 0; i-- {
		op := g.Ops[i]
		if op == OpOutput || op == OpPlaceholder {
			continue
		}
		if buckets[0].size >= cfg.BucketCapBytes || len(buckets) == 1 && buckets[0].size >= cfg.FirstBucketCapBytes {
			if hasExternalOutput(buckets[0]) {
				buckets = append([]*refTorchBucket{{added: map[int]int64{}}}, buckets...)
			} else {
				buckets[0].extended = true
			}
		}
		cur := buckets[0]
		ps := g.ParamIndex[g.ParamOffsets[i]:g.ParamOffsets[i+1]]
		refs := g.ParamRefs[g.ParamOffsets[i]:g.ParamOffsets[i+1]]
		addKind := func(kind RefKind) {
			for k, p := range ps {
				if refs[k] == kind && g.Params[p].RequiresGrad && !g.Params[p].Ignored {
					cur.size += g.Params[p].StorageBytes
					cur.added[i] += g.Params[p].StorageBytes
					cur.names = append(cur.names, p)
				}
			}
		}
		addModule := func() {
			if !processed[g.ModuleIDs[i]] {
				processed[g.ModuleIDs[i]] = true
				addKind(RefModule)
			}
		}
		switch op {
		case OpCallFunction:
			addKind(RefArg)
		case OpCallModule:
			addModule()
		case OpCallMethod:
			addModule()
			addKind(RefArg)
		case OpGetAttr:
			addKind(RefAttr)
		}
		cur.nodes = append(cur.nodes, i)
	}
	if len(buckets) > 1 && buckets[0].size == 0 {
		buckets[1].nodes = append(buckets[1].nodes, buckets[0].nodes...)
		buckets[1].names = append(buckets[1].names, buckets[0].names...)
		buckets = buckets[1:]
	}
	if len(buckets) == 1 && len(buckets[0].nodes) == 0 {
		return nil // no compute nodes: no pieces
	}
	return buckets
}

func firstOccurrences(list []int32) []int32 {
	out := []int32{}
	seen := map[int32]bool{}
	for _, p := range list {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// checkTorch compares a ModeTorch plan with referenceTorch and checks the
// cap bound: a bucket that was not extended exceeds its cap (the first
// bucket's cap for bucket 0) by less than the bytes counted at the
// forward-first node that counted any.
func checkTorch(g *Graph, cfg Config, pl *Plan) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	ref := referenceTorch(g, cfg)
	nb := len(ref)
	if pl.NumPieces != nb || len(pl.Buckets) != nb {
		fail("torch: %d pieces and %d buckets, reference has %d", pl.NumPieces, len(pl.Buckets), nb)
		return bad
	}
	for k, b := range pl.Buckets {
		r := ref[nb-1-k]
		if b.Bytes != r.size {
			fail("torch: bucket %d bytes %d, reference %d", k, b.Bytes, r.size)
		}
		if want := firstOccurrences(r.names); !slices.Equal(b.Params, want) {
			fail("torch: bucket %d params %v, reference %v", k, b.Params, want)
		}
		if b.Extended != r.extended {
			fail("torch: bucket %d extended %t, reference %t", k, b.Extended, r.extended)
		}
		if b.Piece != nb-1-k || b.DType != -1 || b.Device != -1 {
			fail("torch: bucket %d piece %d dtype %d device %d, want %d, -1, -1", k, b.Piece, b.DType, b.Device, nb-1-k)
		}
		lo, hi := slices.Min(r.nodes), slices.Max(r.nodes)
		if b.NodeBegin != lo || b.NodeEnd != hi+1 {
			fail("torch: bucket %d nodes [%d, %d), reference [%d, %d)", k, b.NodeBegin, b.NodeEnd, lo, hi+1)
		}
		for _, i := range r.nodes {
			if int(pl.NodePiece[i]) != nb-1-k {
				fail("torch: node %d in piece %d, reference %d", i, pl.NodePiece[i], nb-1-k)
			}
		}
		if !b.Extended {
			limit := cfg.BucketCapBytes
			if k == 0 {
				limit = cfg.FirstBucketCapBytes
			}
			var lastAdded int64
			for _, i := range r.nodes { // walk order: the last adder wins
				if r.added[i] > 0 {
					lastAdded = r.added[i]
				}
			}
			if b.Bytes-lastAdded >= limit {
				fail("torch: bucket %d: %d bytes minus %d counted at its first node reaches cap %d", k, b.Bytes, lastAdded, limit)
			}
		}
	}
	return bad
}

// refDDPBucket is a bucket of referenceDDP.
type refDDPBucket struct {
	params []int32
	bytes  int64
	key    bucketKey
	closed bool
	cap    int64 // the cap it was filled against
}

// referenceDDP returns the first use of every counted parameter and the
// buckets of a straightforward simulation of DDP's rebuild.
func referenceDDP(g *Graph, cfg Config) (map[int32]int, []refDDPBucket) {
	firstUse, order := referenceReadyOrder(g)
	return firstUse, referenceBuckets(g, cfg, order)
}

// referenceReadyOrder returns the first use of every counted parameter and
// the predicted gradient-ready order: later first uses first, and within a
// node, later listings first.
func referenceReadyOrder(g *Graph) (map[int32]int, []int32) {
	firstUse := map[int32]int{}
	// Every listing of a counted parameter at its first-use node.
	type listing struct {
		node, pos int
		p         int32
	}
	var uses []listing
	for i, op := range g.Ops {
		if !isCompute(op) {
			continue
		}
		for k := g.ParamOffsets[i]; k < g.ParamOffsets[i+1]; k++ {
			p := g.ParamIndex[k]
			if !g.Params[p].RequiresGrad || g.Params[p].Ignored {
				continue
			}
			if first, ok := firstUse[p]; !ok {
				firstUse[p] = i
			} else if first != i {
				continue
			}
			uses = append(uses, listing{i, int(k), p})
		}
	}
	// Ready order: later nodes first; within a node, later listings first.
	sort.SliceStable(uses, func(a, b int) bool {
		if uses[a].node != uses[b].node {
			return uses[a].node > uses[b].node
		}
		return uses[a].pos > uses[b].pos
	})
	var order []int32
	emitted := map[int32]bool{}
	for _, u := range uses {
		if !emitted[u.p] {
			emitted[u.p] = true
			order = append(order, u.p)
		}
	}
	return firstUse, order
}

// referenceBuckets simulates DDP's bucket assignment over the ready order.
func referenceBuckets(g *Graph, cfg Config, order []int32) []refDDPBucket {
	caps := cfg.BucketCapsBytes
	if len(caps) == 0 {
		caps = []int64{cfg.BucketCapBytes}
		if cfg.FirstBucketCapBytes < cfg.BucketCapBytes {
			caps = []int64{cfg.FirstBucketCapBytes, cfg.BucketCapBytes}
		}
	}
	open := map[bucketKey]*refDDPBucket{}
	capAt := map[bucketKey]int{}
	firstReady := map[bucketKey]int{}
	var result []refDDPBucket
	for pos, p := range order {
		key := bucketKey{g.Params[p].DType, g.Params[p].Device}
		b := open[key]
		if b == nil {
			b = &refDDPBucket{key: key}
			open[key] = b
			firstReady[key] = pos
		}
		b.params = append(b.params, p)
		b.bytes += g.Params[p].Bytes
		b.cap = caps[capAt[key]]
		if b.bytes >= b.cap {
			b.closed = true
			result = append(result, *b)
			delete(open, key)
			capAt[key] = min(capAt[key]+1, len(caps)-1)
		}
	}
	var rest []refDDPBucket
	var restFirst []int
	for key, b := range open {
		rest = append(rest, *b)
		restFirst = append(restFirst, firstReady[key])
	}
	idx := make([]int, len(rest))
	for k := range idx {
		idx[k] = k
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(restFirst[a], restFirst[b]) })
	for _, k := range idx {
		result = append(result, rest[k])
	}
	return result
}

// checkDDP compares a ModeDDP plan with referenceDDP and checks the cuts.
func checkDDP(g *Graph, cfg Config, pl *Plan) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	firstUse, ref := referenceDDP(g, cfg)
	if len(pl.Buckets) != len(ref) {
		fail("ddp: %d buckets, reference has %d", len(pl.Buckets), len(ref))
		return bad
	}
	firstComputeOfPiece := map[int32]int{}
	for i := len(g.Ops) - 1; i >= 0; i-- {
		if q := pl.NodePiece[i]; q >= 0 {
			firstComputeOfPiece[q] = i
		}
	}
	for k, b := range pl.Buckets {
		r := ref[k]
		if !slices.Equal(b.Params, r.params) || b.Bytes != r.bytes || b.DType != r.key.dtype || b.Device != r.key.device {
			fail("ddp: bucket %d = %v %d bytes key (%d,%d), reference %v %d bytes key %v",
				k, b.Params, b.Bytes, b.DType, b.Device, r.params, r.bytes, r.key)
			continue
		}
		// The exact cap bound: a closed bucket reached its cap, and every
		// bucket was below it before its last parameter.
		last := g.Params[r.params[len(r.params)-1]].Bytes
		if b.Bytes-last >= r.cap || (r.closed && b.Bytes < r.cap) {
			fail("ddp: bucket %d: %d bytes (last parameter %d) against cap %d, closed %t", k, b.Bytes, last, r.cap, r.closed)
		}
		lo, hi := len(g.Ops), -1
		for _, p := range b.Params {
			lo, hi = min(lo, firstUse[p]), max(hi, firstUse[p])
		}
		if b.NodeBegin != lo || b.NodeEnd != hi+1 {
			fail("ddp: bucket %d nodes [%d, %d), want [%d, %d)", k, b.NodeBegin, b.NodeEnd, lo, hi+1)
		}
		if b.Piece != int(pl.NodePiece[lo]) {
			fail("ddp: bucket %d piece %d, but its forward-first parameter use is in piece %d", k, b.Piece, pl.NodePiece[lo])
		}
		// A closed bucket that kept its cut starts its piece, unless that
		// cut was dropped (forward-first piece) or merged away.
		if r.closed && !b.Extended && cfg.MaxPieces == 0 {
			q := pl.NodePiece[lo]
			if q != 0 && firstComputeOfPiece[q] != lo {
				fail("ddp: bucket %d closed at node %d without extension, but its piece %d starts at node %d", k, lo, q, firstComputeOfPiece[q])
			}
		}
	}
	// Every non-first piece, and the first when there is a cut, holds the
	// first use of a counted parameter.
	hasParam := make([]bool, pl.NumPieces)
	for _, i := range firstUse {
		hasParam[pl.NodePiece[i]] = true
	}
	for p := range pl.NumPieces {
		if pl.NumPieces > 1 && !hasParam[p] {
			fail("ddp: piece %d holds no counted parameter", p)
		}
	}
	return bad
}

// buildTwice plans g twice and reports whether both plans are identical.
func buildTwiceSame(g *Graph, cfg Config, first *Plan) error {
	again, err := Build(g, cfg)
	if err != nil {
		return fmt.Errorf("second Build failed: %v", err)
	}
	if !reflect.DeepEqual(first, again) {
		return fmt.Errorf("second Build differs")
	}
	return nil
}

// checkAligned checks an AlignBuckets plan: its cuts are those of the same
// config without alignment (whose plan must itself be valid); it has one
// bucket per piece that holds a counted parameter, in DDP order (bucket k is
// piece N-1-k), listing exactly the parameters first used in that piece, in
// predicted ready order; and DDP's rebuild with the aligned bytes as
// per-bucket caps reproduces those buckets for reorderings of the ready
// order within each piece.
func checkAligned(g *Graph, cfg Config, pl *Plan) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	several := countedKeys(g) > 1
	plain := cfg
	plain.AlignBuckets = false
	base, err := Build(g, plain)
	if err != nil {
		fail("aligned: the same config without AlignBuckets fails: %v", err)
		return bad
	}
	for _, v := range checkPlan(g, plain, base) {
		fail("aligned: the unaligned plan: %s", v)
	}
	if !slices.Equal(pl.NodePiece, base.NodePiece) || pl.NumPieces != base.NumPieces ||
		!reflect.DeepEqual(pl.PieceInputs, base.PieceInputs) || !reflect.DeepEqual(pl.PieceOutputs, base.PieceOutputs) {
		fail("aligned: cuts differ from the unaligned plan's")
		return bad
	}
	if several {
		return append(bad, checkSeveralKeys(g, pl, rand.New(rand.NewPCG(pl.Fingerprint, 3)))...)
	}

	// The expected buckets, from the naive ready order grouped by piece.
	firstUse, order := referenceReadyOrder(g)
	extended := map[int]bool{}
	for _, b := range base.Buckets {
		if b.Extended {
			extended[b.Piece] = true
		}
	}
	var want []Bucket
	for _, p := range order {
		piece := int(pl.NodePiece[firstUse[p]])
		if len(want) == 0 || want[len(want)-1].Piece != piece {
			if len(want) > 0 && piece >= want[len(want)-1].Piece {
				fail("aligned: the ready order meets piece %d after piece %d", piece, want[len(want)-1].Piece)
			}
			want = append(want, Bucket{Piece: piece, NodeBegin: len(g.Ops), Extended: extended[piece],
				DType: g.Params[p].DType, Device: g.Params[p].Device})
		}
		w := &want[len(want)-1]
		w.Params = append(w.Params, p)
		w.Bytes += g.Params[p].Bytes
		w.NodeBegin, w.NodeEnd = min(w.NodeBegin, firstUse[p]), max(w.NodeEnd, firstUse[p]+1)
		if g.Params[p].DType != w.DType || g.Params[p].Device != w.Device {
			w.DType, w.Device = -1, -1
		}
	}
	if pl.NumPieces > 1 && len(want) != pl.NumPieces {
		fail("aligned: %d pieces but only %d hold counted parameters", pl.NumPieces, len(want))
	}
	if len(pl.Buckets) != len(want) {
		fail("aligned: %d buckets, want %d (one per piece holding counted parameters)", len(pl.Buckets), len(want))
		return bad
	}
	for k, b := range pl.Buckets {
		if !reflect.DeepEqual(b, want[k]) {
			fail("aligned: bucket %d = %+v, want %+v", k, b, want[k])
		}
		if b.Piece != pl.NumPieces-1-k {
			fail("aligned: bucket %d is piece %d, want %d", k, b.Piece, pl.NumPieces-1-k)
		}
	}
	if len(bad) > 0 {
		return bad
	}
	rng := rand.New(rand.NewPCG(pl.Fingerprint, 1))
	return checkRebuildFollowsPieces(g, pl, rng, 6)
}

// checkRebuildFollowsPieces runs DDP's rebuild (simulateRebuild) with the
// aligned buckets' bytes as per-bucket caps over ready orders that keep the
// pieces in order but reorder each piece's gradients: as planned, reversed,
// then random shuffles, trials orders in all. With parameters of positive
// size, DDP must rebuild exactly the aligned buckets (as sets: DDP lists
// them in the order it saw them). A zero-byte gradient can arrive after its
// piece's bytes closed the bucket and then joins a later DDP bucket; so
// where zero-byte parameters exist, every positive-size parameter must
// still land in its own piece's bucket, and DDP's buckets beyond the aligned
// ones may hold zero-byte parameters only.
func checkRebuildFollowsPieces(g *Graph, pl *Plan, rng *rand.Rand, trials int) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if len(pl.Buckets) == 0 {
		return nil
	}
	caps := make([]int64, len(pl.Buckets))
	home := map[int32]int{} // aligned bucket of each parameter
	anyZero := false
	for k, b := range pl.Buckets {
		caps[k] = b.Bytes
		for _, p := range b.Params {
			home[p] = k
			anyZero = anyZero || g.Params[p].Bytes == 0
		}
	}
	for trial := range trials {
		var order []int32
		for _, b := range pl.Buckets {
			run := slices.Clone(b.Params)
			switch trial {
			case 0:
			case 1:
				slices.Reverse(run)
			default:
				rng.Shuffle(len(run), func(i, j int) { run[i], run[j] = run[j], run[i] })
			}
			order = append(order, run...)
		}
		got := simulateRebuild(g, order, caps)
		if !anyZero {
			if len(got) != len(pl.Buckets) {
				fail("rebuild over %v with caps %v: %d DDP buckets %v, want %d", order, caps, len(got), got, len(pl.Buckets))
				continue
			}
			for k := range got {
				a, b := slices.Sorted(slices.Values(got[k])), slices.Sorted(slices.Values(pl.Buckets[k].Params))
				if !slices.Equal(a, b) {
					fail("rebuild over %v with caps %v: DDP bucket %d = %v, aligned bucket %v", order, caps, k, got[k], pl.Buckets[k].Params)
				}
			}
			continue
		}
		for k, params := range got {
			for _, p := range params {
				if g.Params[p].Bytes > 0 && home[p] != k {
					fail("rebuild over %v with caps %v: parameter %d (%d bytes) in DDP bucket %d, aligned bucket %d", order, caps, p, g.Params[p].Bytes, k, home[p])
				}
				if g.Params[p].Bytes > 0 && k >= len(pl.Buckets) {
					fail("rebuild over %v with caps %v: extra DDP bucket %d holds parameter %d of %d bytes", order, caps, k, p, g.Params[p].Bytes)
				}
			}
		}
	}
	return bad
}

// simulateRebuild transliterates compute_bucket_assignment_by_size in
// torch/csrc/distributed/c10d/reducer.cpp as DDP's rebuild calls it: the
// parameters in ready order join the open bucket of their (dtype, device)
// key, which closes as soon as its bytes reach that key's current cap; each
// key then moves to its next cap, the last one repeating. Buckets still
// open at the end follow (DDP takes them in hash-map order; here by key
// order of first appearance).
func simulateRebuild(g *Graph, order []int32, caps []int64) [][]int32 {
	type acc struct {
		params []int32
		bytes  int64
	}
	open := map[bucketKey]*acc{}
	capIdx := map[bucketKey]int{}
	var keyOrder []bucketKey
	var result [][]int32
	for _, p := range order {
		key := bucketKey{g.Params[p].DType, g.Params[p].Device}
		b := open[key]
		if b == nil {
			b = &acc{}
			open[key] = b
			if !slices.Contains(keyOrder, key) {
				keyOrder = append(keyOrder, key)
			}
		}
		b.params = append(b.params, p)
		b.bytes += g.Params[p].Bytes
		if b.bytes >= caps[capIdx[key]] {
			result = append(result, b.params)
			delete(open, key)
			capIdx[key] = min(capIdx[key]+1, len(caps)-1)
		}
	}
	for _, key := range keyOrder {
		if b := open[key]; b != nil {
			result = append(result, b.params)
		}
	}
	return result
}
