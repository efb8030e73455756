package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// runBucketGraph has parameters of two dtypes and two devices, one that no
// compute node uses (4) and one of zero bytes (5); runBucketFirstUse gives
// their first uses.
var (
	runBucketGraph = &Graph{Params: []Param{
		{Name: "a", Bytes: 100},
		{Name: "b", Bytes: 20},
		{Name: "half", Bytes: 7, DType: 1},
		{Name: "other_device", Bytes: 5, Device: 1},
		{Name: "unused", Bytes: 3},
		{Name: "empty", Bytes: 0},
	}}
	runBucketFirstUse = []int32{4, 2, 6, 6, -1, 9}
)

func TestBucketFromRun(t *testing.T) {
	cases := []struct {
		name string
		run  []int32
		want Bucket
	}{
		{"empty run", nil,
			Bucket{DType: -1, Device: -1}},
		{"one parameter", []int32{0},
			Bucket{Bytes: 100, Params: []int32{0}, NodeBegin: 4, NodeEnd: 5}},
		{"span over first uses in any order", []int32{5, 0, 1},
			Bucket{Bytes: 120, Params: []int32{5, 0, 1}, NodeBegin: 2, NodeEnd: 10}},
		{"mixed dtype", []int32{0, 2},
			Bucket{Bytes: 107, Params: []int32{0, 2}, NodeBegin: 4, NodeEnd: 7, DType: -1, Device: -1}},
		{"mixed device", []int32{3, 1},
			Bucket{Bytes: 25, Params: []int32{3, 1}, NodeBegin: 2, NodeEnd: 7, DType: -1, Device: -1}},
		{"mixed after a shared prefix", []int32{0, 1, 2, 5},
			Bucket{Bytes: 127, Params: []int32{0, 1, 2, 5}, NodeBegin: 2, NodeEnd: 10, DType: -1, Device: -1}},
		{"no first use", []int32{4},
			Bucket{Bytes: 3, Params: []int32{4}}},
		{"no first use beside one in use", []int32{4, 1},
			Bucket{Bytes: 23, Params: []int32{4, 1}, NodeBegin: 2, NodeEnd: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, bucketFromRun(runBucketGraph, runBucketFirstUse, tc.run))
		})
	}
}

// TestBucketFromRunOwnsItsList: callers pass runs that are slices of one
// list, so appending to one bucket's Params must leave the next run alone.
func TestBucketFromRunOwnsItsList(t *testing.T) {
	list := []int32{0, 1, 2, 3}
	b := bucketFromRun(runBucketGraph, runBucketFirstUse, list[:2])
	_ = append(b.Params, 5)
	assert.Equal(t, []int32{0, 1, 2, 3}, list)
}
