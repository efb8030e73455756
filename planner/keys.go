package planner

import (
	"cmp"
	"math/bits"
	"slices"
)

// Note [Several dtype groups]
//
// DDP buckets each (dtype, device) group apart and walks its one cap list
// anew for each: the j-th bucket of every group closes against cap j, the
// last cap repeating (compute_bucket_assignment_by_size, checked against
// torch in tests/python/distributed/test_dist_dtype_groups.py). The
// aligned plan's buckets (one per unit: a piece, or a run of block pieces,
// in DDP order) hold every group; alignKeys splits them by group.
//
// A group's bucket that starts at one of its units closes where a later
// unit of it ends, whatever order that unit's gradients arrive in, exactly
// when the cap lies in (S - m, S]: S the group's bytes from the start
// through that unit, m that unit's smallest (positive) gradient of the
// group. A cap above all the group's remaining bytes leaves the bucket
// open: DDP lists it after every closed one and launches it once they are
// launched (usually at the end of backward), and the group has no bucket
// after it.
//
// So each cap is chosen in turn, for the groups' j-th buckets at once: the
// smallest cap that, for every group still bucketing, lies in one of those
// intervals or above its remaining bytes. One always exists (above every
// group's remaining bytes), and the smallest closes each group's bucket at
// its earliest unit end that the others allow; the cap given is the
// largest with the same closings, the least of those buckets' bytes. With fp32 norms beside
// bf16 weights in every block, the norms' bytes stay under the first
// block's bf16 interval: the norms' one bucket stays open and the weights
// close a bucket per block. With a block in bf16 among fp32 ones, the bf16
// bucket stays open where the fp32 group's first bucket is larger.
//
// Each group's buckets are runs of its units; the pieces stay as they are.
// Plan.MergedCuts counts the unit ends, but the last, at which no bucket
// closes. Each bucket names the piece whose backward completes it; the
// closed ones are listed by that piece, later pieces first, as DDP closes
// them, and then by key (DDP lists the closed buckets of one piece in the
// order their last gradients arrive, which the plan cannot know); the open
// ones follow by their first unit. As with one
// group, a zero-byte gradient that arrives after its bucket's bytes reached
// the cap joins a later bucket.
//
// Shared caps can make this worse than DDP's own buckets: a bf16 head with
// a bias, ready first, closes only against a cap near its own bytes, so the
// fp32 group's first bucket would stretch over as many blocks, or the head
// stays open. Decide therefore keeps DDP's own buckets
// (ReasonGroupsLater; CombineForward says GroupsLater for a split forward) where the per-group ones would launch more than 10%
// later: DDP launches in bucket order, each bucket once it and every one
// before it are complete, and launchCost weighs each bucket's bytes by the
// backward position (pieces from the last) at which it can launch.

// groupUnit is one group's share of one unit.
type groupUnit struct {
	unit   int
	params []int32 // walk order
	bytes  int64
	// least: the gradient that must close the bucket at the unit's end:
	// its smallest positive one (ready order, any order inside a unit) or
	// its last positive one (declaration order, a fixed walk); 0 if none.
	least int64
}

// addToUnit adds parameter p, of bytes, to group k's share of unit u (the
// units come in order). fixed: the walk's order is known (declaration
// order), so the unit's last positive gradient closes its bucket; else
// (ready order, any order inside a unit) its smallest.
func addToUnit(groups [][]groupUnit, k, u int, p int32, bytes int64, fixed bool) {
	gs := groups[k]
	if len(gs) == 0 || gs[len(gs)-1].unit != u {
		gs = append(gs, groupUnit{unit: u})
	}
	last := &gs[len(gs)-1]
	last.params = append(last.params, p)
	last.bytes += bytes
	if bytes > 0 && (fixed || last.least == 0 || bytes < last.least) {
		last.least = bytes
	}
	groups[k] = gs
}

// closing is where a group's bucket, started at a given unit of it, may
// close: a cap in (lo, hi] closes it where the group's unit end ends.
type closing struct {
	lo, hi int64
	end    int // index into the group's units
}

// keyedBucket is one group's bucket: its units [from, to) and whether it
// closes.
type keyedBucket struct {
	key, from, to int
	closed        bool
}

// alignKeys splits the aligned buckets of pl by (dtype, device) group and
// sets the caps that close every group's buckets at unit ends (Note
// [Several dtype groups]); a plan of one group stays as it is.
func alignKeys(g *Graph, pl *Plan) {
	firstUse, _ := firstUses(g) // cannot fail: Build bounded the same sums
	keyOf, keys := groupKeys(g, firstUse)
	if len(keys) < 2 {
		return
	}
	groups := make([][]groupUnit, len(keys))
	for u := range pl.Buckets {
		for _, p := range pl.Buckets[u].Params {
			addToUnit(groups, int(keyOf[p]), u, p, g.Params[p].Bytes, false)
		}
	}
	caps, buckets := chooseKeyCaps(groups)

	var closed, open []Bucket
	closes := make([]bool, len(pl.Buckets))
	for _, kb := range buckets {
		units := groups[kb.key][kb.from:kb.to]
		var params []int32
		extended := false
		for _, gu := range units {
			params = append(params, gu.params...)
			extended = extended || pl.Buckets[gu.unit].Extended
		}
		b := bucketFromRun(g, firstUse, params)
		b.Piece, b.Extended = int(pl.NodePiece[b.NodeBegin]), extended
		if kb.closed {
			closes[units[len(units)-1].unit] = true
			closed = append(closed, b)
		} else {
			open = append(open, b)
		}
	}
	// DDP closes buckets in backward order: by the piece that completes
	// them, later pieces first (a unit of block pieces may hold several);
	// its open ones follow, listed here by their first unit.
	slices.SortStableFunc(closed, func(a, b Bucket) int { return cmp.Compare(b.Piece, a.Piece) })
	merged := 0
	for u := range len(pl.Buckets) - 1 {
		if !closes[u] {
			merged++
		}
	}
	pl.Buckets, pl.DDPCaps, pl.MergedCuts = append(closed, open...), caps, merged
	pl.Alignment = AlignReadyGroups
}

// chooseKeyCaps chooses the caps in turn (Note [Several dtype groups]) and
// returns them with every group's buckets: the closed ones by last unit
// and key, then the open ones by first unit and key.
func chooseKeyCaps(groups [][]groupUnit) (caps []int64, buckets []keyedBucket) {
	next := make([]int, len(groups)) // per group: its first unit not in a bucket
	var open []keyedBucket
	for {
		var active []int
		for k := range groups {
			if next[k] < len(groups[k]) {
				active = append(active, k)
			}
		}
		if len(active) == 0 {
			break
		}
		closings := make([][]closing, len(groups))
		remaining := make([]int64, len(groups))
		var candidates []int64
		for _, k := range active {
			var sum int64
			for e := next[k]; e < len(groups[k]); e++ {
				gu := &groups[k][e]
				sum += gu.bytes
				if gu.least > 0 {
					closings[k] = append(closings[k], closing{lo: sum - gu.least, hi: sum, end: e})
					candidates = append(candidates, sum-gu.least+1)
				}
			}
			remaining[k] = sum
			// firstUses bounds the total by MaxInt64; only a total of
			// exactly 8 EiB would wrap here.
			candidates = append(candidates, sum+1)
		}
		slices.Sort(candidates)
		var c int64
		for _, c = range candidates {
			if fitsEvery(c, active, closings, remaining) {
				break
			}
		}
		// The smallest fitting cap picks each group's closing; the largest
		// cap with the same closings is the least of their bytes (a cap
		// as the bucket's bytes, as with one group).
		chosen := make([]int, len(groups))
		top := int64(-1)
		for _, k := range active {
			if c > remaining[k] {
				continue
			}
			chosen[k] = firstClosing(closings[k], c)
			if hi := closings[k][chosen[k]].hi; top < 0 || hi < top {
				top = hi
			}
		}
		if top >= 0 {
			c = top
		}
		caps = append(caps, c)
		for _, k := range active {
			if c > remaining[k] {
				open = append(open, keyedBucket{key: k, from: next[k], to: len(groups[k])})
				next[k] = len(groups[k])
				continue
			}
			end := closings[k][chosen[k]].end
			buckets = append(buckets, keyedBucket{key: k, from: next[k], to: end + 1, closed: true})
			next[k] = end + 1
		}
	}
	slices.SortStableFunc(buckets, func(a, b keyedBucket) int {
		return cmp.Or(cmp.Compare(groups[a.key][a.to-1].unit, groups[b.key][b.to-1].unit), cmp.Compare(a.key, b.key))
	})
	slices.SortStableFunc(open, func(a, b keyedBucket) int {
		return cmp.Or(cmp.Compare(groups[a.key][a.from].unit, groups[b.key][b.from].unit), cmp.Compare(a.key, b.key))
	})
	return caps, append(buckets, open...)
}

// fitsEvery reports whether cap c closes, for every active group, its next
// bucket at a unit end or leaves it open above its remaining bytes.
func fitsEvery(c int64, active []int, closings [][]closing, remaining []int64) bool {
	for _, k := range active {
		if c > remaining[k] {
			continue
		}
		if i := firstClosing(closings[k], c); i == len(closings[k]) || closings[k][i].lo >= c {
			return false
		}
	}
	return true
}

// firstClosing returns the index of the first closing with hi >= c (the
// closings are disjoint and rising), or len(closings).
func firstClosing(closings []closing, c int64) int {
	i, _ := slices.BinarySearchFunc(closings, c, func(cl closing, c int64) int { return cmp.Compare(cl.hi, c) })
	return i
}

// launchCost sums, over pl's buckets in DDP order, the bucket's bytes times
// the backward position (0 for the last piece) at which DDP can launch it:
// its piece's, or a bucket before it's if later. 128 bits: no overflow.
func launchCost(pl *Plan) (hi, lo uint64) {
	var launch uint64
	for _, b := range pl.Buckets {
		launch = max(launch, uint64(pl.NumPieces-1-b.Piece))
		h, l := bits.Mul64(uint64(b.Bytes), launch)
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi += h + carry
	}
	return hi, lo
}

// launchesLater reports whether the buckets of aligned launch more than
// 10% later, by launchCost, than those of own (the same cuts, DDP's own
// buckets). The margin keeps near ties aligned: the prediction of DDP's
// own buckets lists its open ones in an order DDP does not promise.
func launchesLater(aligned, own *Plan) bool {
	ah, al := times(launchCost(aligned))(10)
	oh, ol := times(launchCost(own))(11)
	return ah > oh || ah == oh && al > ol
}

// times multiplies a 128-bit (hi, lo) by a small k.
func times(hi, lo uint64) func(k uint64) (uint64, uint64) {
	return func(k uint64) (uint64, uint64) {
		carry, l := bits.Mul64(lo, k)
		return hi*k + carry, l
	}
}
