package planner

import (
	"math"
	"slices"
)

// bucketFromRun is the one rule for the bucket that a run of counted
// parameters forms when a plan aligns DDP's buckets with its pieces
// (alignedBuckets, declarationAlign, groupedBuckets). run lists the
// parameters in the order the bucket lists them. The caller sets Piece and
// Extended, which follow from the pieces rather than from the parameters.
func bucketFromRun(g *Graph, firstUse, run []int32) Bucket {
	b := Bucket{
		Bytes: runBytes(g, run),
		// Runs are often slices of one longer list; the clip keeps an
		// append to one bucket's list from reaching the next.
		Params: slices.Clip(run),
	}
	b.NodeBegin, b.NodeEnd = runSpan(firstUse, run)
	b.DType, b.Device = runKey(g, run)
	return b
}

// runBytes sums the bytes of the run's parameters. firstUses bounded the
// total of those in use; declarationAlign's runs may also hold unused ones.
func runBytes(g *Graph, run []int32) int64 {
	var bytes int64
	for _, p := range run {
		bytes += g.Params[p].Bytes
	}
	return bytes
}

// runSpan returns the nodes [begin, end) between the run's first and last
// first use. Parameters that no compute node uses (only declarationAlign
// has them, see declaredPieces) widen nothing; a run of only those spans
// [0, 0).
func runSpan(firstUse, run []int32) (begin, end int) {
	begin = math.MaxInt
	for _, p := range run {
		if f := int(firstUse[p]); f >= 0 {
			begin = min(begin, f)
			end = max(end, f+1)
		}
	}
	if end == 0 {
		begin = 0
	}
	return begin, end
}

// runKey returns the (dtype, device) that the run's parameters share, or
// -1, -1 when they share none or the run is empty (an aligned unit of
// several keys before alignKeys splits it, keys.go).
func runKey(g *Graph, run []int32) (dtype, device int32) {
	if len(run) == 0 {
		return -1, -1
	}
	first := &g.Params[run[0]]
	for _, p := range run[1:] {
		if prm := &g.Params[p]; prm.DType != first.DType || prm.Device != first.Device {
			return -1, -1
		}
	}
	return first.DType, first.Device
}
