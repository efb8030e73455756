package planner

import (
	"math"
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
// A group's run of consecutive units closes where its last unit ends,
// whatever order that unit's gradients arrive in, exactly when its cap lies
// in (S - m, S]: S the run's bytes, m the smallest gradient of its last
// unit. A group's last run may also stay open (any cap above S - m): DDP
// then lists that bucket after every closed one, still holding those units'
// gradients alone, and launches it at the end of backward. So a cap list
// fits when, for every j, the intervals of the groups' j-th runs meet.
//
// alignKeys walks the units in DDP order and gives each group's runs their
// index j. A unit joins the next one (their boundary then closes no
// bucket: a merged cut) where its intervals would leave some j empty, and
// where the last units cannot be met even merged, the run before them
// joins as well. All units as one run always fit (every group then has one
// last run), so the walk ends. The caps are the intersections' upper ends,
// or, where every run of a j is its group's last, the largest of them. The
// pieces stay as they are: a merged cut only stops closing a bucket.
// Plan.MergedCuts counts them. Each bucket names the piece whose backward
// completes it; DDP's closed buckets of one unit run come in the order
// their last gradients arrive, which the plan cannot know, so it lists
// them by key. As with one group, a zero-byte gradient that arrives after
// its bucket's bytes reached the cap joins a later bucket.

// keyRun is one group's share of a run of units.
type keyRun struct {
	params []int32 // gradient-ready order
	bytes  int64
	last   int64 // the smallest positive gradient in its last unit
}

// keySplit holds the state of one alignKeys call.
type keySplit struct {
	g     *Graph
	units []Bucket // the aligned plan's buckets, DDP order
	keyOf []int    // per parameter: its key's index
	keys  int      // number of keys
	final []int    // per key: the last unit holding it
}

// alignKeys splits the aligned buckets of pl by (dtype, device) group and
// sets the caps that close every group's buckets at unit boundaries (Note
// [Several dtype groups]); a plan of one group stays as it is.
func alignKeys(g *Graph, pl *Plan) {
	firstUse, _ := firstUses(g) // cannot fail: Build bounded the same sums
	keyOf32, keys := groupKeys(g, firstUse)
	if len(keys) < 2 {
		return
	}
	s := &keySplit{g: g, units: pl.Buckets, keyOf: make([]int, len(g.Params)), keys: len(keys)}
	for p, k := range keyOf32 {
		s.keyOf[p] = int(k)
	}
	s.final = make([]int, s.keys)
	for u := range s.units {
		for _, p := range s.units[u].Params {
			s.final[s.keyOf[p]] = u
		}
	}
	spans, caps := s.walk()
	var closed, open []Bucket
	merged, count := 0, make([]int, s.keys)
	for _, sp := range spans {
		merged += sp[1] - sp[0] - 1
		extended := false
		for u := sp[0]; u < sp[1]; u++ {
			extended = extended || s.units[u].Extended
		}
		for k, run := range s.runs(sp[0], sp[1]) {
			if run.params == nil {
				continue
			}
			j := count[k]
			count[k]++
			b := bucketFromRun(g, firstUse, run.params)
			b.Piece, b.Extended = int(pl.NodePiece[b.NodeBegin]), extended
			if caps[j] <= run.bytes {
				closed = append(closed, b)
			} else {
				open = append(open, b)
			}
		}
	}
	pl.Buckets, pl.DDPCaps, pl.MergedCuts = append(closed, open...), caps, merged
	pl.Alignment = AlignReadyGroups
}

// runs returns each group's run over units [lo, hi), by key (a group with
// no parameter there has nil params).
func (s *keySplit) runs(lo, hi int) []keyRun {
	out := make([]keyRun, s.keys)
	for u := lo; u < hi; u++ {
		seen := make([]bool, s.keys)
		for _, p := range s.units[u].Params {
			k := s.keyOf[p]
			r := &out[k]
			if !seen[k] {
				seen[k], r.last = true, 0
			}
			r.params = append(r.params, p)
			b := s.g.Params[p].Bytes
			r.bytes += b
			if b > 0 && (r.last == 0 || b < r.last) {
				r.last = b
			}
		}
	}
	return out
}

// walk groups the units into runs (spans [lo, hi) in DDP order) and
// returns them with their caps.
func (s *keySplit) walk() (spans [][2]int, caps []int64) {
	m := len(s.units)
	for lo := 0; lo < m; {
		hi := lo + 1
		for {
			if c, ok := s.fit(append(slices.Clone(spans), [2]int{lo, hi})); ok {
				spans, caps = append(spans, [2]int{lo, hi}), c
				lo = hi
				break
			}
			if hi < m {
				hi++
				continue
			}
			// The rest cannot be met even as one run: the run before joins.
			prev := spans[len(spans)-1]
			spans = spans[:len(spans)-1]
			lo = prev[0]
		}
	}
	return spans, caps
}

// fit intersects, per index j, the intervals of the groups' j-th runs over
// spans and returns the caps, or false when some intersection is empty.
func (s *keySplit) fit(spans [][2]int) ([]int64, bool) {
	var lows, highs, largest []int64
	count := make([]int, s.keys)
	for _, sp := range spans {
		for k, run := range s.runs(sp[0], sp[1]) {
			if run.params == nil {
				continue
			}
			j := count[k]
			count[k]++
			if j == len(lows) {
				lows, highs, largest = append(lows, math.MinInt64), append(highs, math.MaxInt64), append(largest, 0)
			}
			lows[j] = max(lows[j], run.bytes-run.last)
			if s.final[k] >= sp[1] { // not its group's last run: it must close
				highs[j] = min(highs[j], run.bytes)
			}
			largest[j] = max(largest[j], run.bytes)
		}
	}
	caps := make([]int64, len(lows))
	for j := range lows {
		if lows[j] >= highs[j] {
			return nil, false
		}
		caps[j] = highs[j]
		if caps[j] == math.MaxInt64 {
			caps[j] = largest[j]
		}
	}
	return caps, true
}
