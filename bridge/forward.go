package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

typedef const goddp_forward goddp_forward_in;
*/
import "C"

import (
	"unsafe"

	"github.com/goddp/goddp/planner"
)

//export goddp_combine_forward
func goddp_combine_forward(f *C.goddp_forward_in, out **C.goddp_forward_plan, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	if errMsg != nil {
		*errMsg = nil
	}
	if out == nil || f == nil {
		setErrMsg(errMsg, "goddp: goddp_combine_forward: f or out is NULL")
		return C.GODDP_ERR_INVALID_CONFIG
	}
	*out = nil
	graphs, bytes, keys, own, err := forwardFromC((*C.goddp_forward)(f))
	if err != nil {
		setErrMsg(errMsg, err.Error())
		return statusOf(err)
	}
	plan, err := planner.CombineForward(graphs, bytes, keys, own)
	if err != nil {
		setErrMsg(errMsg, err.Error())
		return statusOf(err)
	}
	cp, err := forwardPlanToC(plan)
	if err != nil {
		setErrMsg(errMsg, err.Error())
		return statusOf(err)
	}
	*out = cp
	return C.GODDP_OK
}

//export goddp_forward_plan_free
func goddp_forward_plan_free(plan *C.goddp_forward_plan) {
	defer recoverSilently()
	freeForwardPlan(plan)
}

// forwardFromC copies a goddp_forward into the planner's types (own nil
// where no own caps are given).
func forwardFromC(f *C.goddp_forward) ([]planner.ForwardGraph, []int64, []int32, *planner.Config, error) {
	code := planner.ErrInvalidConfig
	s, err := spansOf(f.spans, f.num_spans, code)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	bytes, err := cCopy[int64](s, unsafe.Pointer(f.param_bytes), int64(f.num_params), "param_bytes", code)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if f.num_graphs < 1 {
		return nil, nil, nil, nil, invalidConfig("goddp: num_graphs = %d; a forward has at least one graph", int64(f.num_graphs))
	}
	graphOffs, err := cView[int64](s, unsafe.Pointer(f.graph_bucket_offsets), int64(f.num_graphs)+1, "graph_bucket_offsets", code)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	numBuckets, err := csrValuesLen(graphOffs, "graph_bucket_offsets")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	bucketOffs, err := cView[int64](s, unsafe.Pointer(f.bucket_param_offsets), numBuckets+1, "bucket_param_offsets", code)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	numValues, err := csrValuesLen(bucketOffs, "bucket_param_offsets")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	params, err := cCopy[int32](s, unsafe.Pointer(f.bucket_params), numValues, "bucket_params", code)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := checkOffsets(graphOffs, numBuckets, "graph_bucket_offsets"); err != nil {
		return nil, nil, nil, nil, err
	}
	if err := checkOffsets(bucketOffs, numValues, "bucket_param_offsets"); err != nil {
		return nil, nil, nil, nil, err
	}
	var keys []int32
	if f.param_keys != nil {
		if keys, err = cCopy[int32](s, unsafe.Pointer(f.param_keys), int64(f.num_params), "param_keys", code); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	graphs := make([]planner.ForwardGraph, int(f.num_graphs))
	for g := range graphs {
		for k := graphOffs[g]; k < graphOffs[g+1]; k++ {
			graphs[g].Buckets = append(graphs[g].Buckets, params[bucketOffs[k]:bucketOffs[k+1]])
		}
	}
	var own *planner.Config
	if f.own_bucket_cap_bytes != 0 {
		// Counted by num_own_bucket_caps, as goddp_ddp's caps: no span.
		caps, err := cCopy[int64](nil, unsafe.Pointer(f.own_bucket_caps_bytes), int64(f.num_own_bucket_caps), "own_bucket_caps_bytes", code)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		own = &planner.Config{BucketCapBytes: int64(f.own_bucket_cap_bytes),
			FirstBucketCapBytes: int64(f.own_first_bucket_cap_bytes), BucketCapsBytes: caps}
	}
	return graphs, bytes, keys, own, nil
}

// checkOffsets requires a CSR offsets array to start at 0, never decrease
// and end at total.
func checkOffsets(offs []int64, total int64, field string) error {
	if offs[0] != 0 {
		return invalidConfig("goddp: %s[0] = %d; want 0", field, offs[0])
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] < offs[i-1] || offs[i] > total {
			return invalidConfig("goddp: %s[%d] = %d after %d (of %d values): offsets must ascend", field, i, offs[i], offs[i-1], total)
		}
	}
	return nil
}

// forwardPlanToC copies a ForwardPlan into C memory (nothing points into Go
// memory); on error everything allocated so far is freed.
func forwardPlanToC(p *planner.ForwardPlan) (_ *C.goddp_forward_plan, err error) {
	cp := (*C.goddp_forward_plan)(C.calloc(1, C.sizeof_goddp_forward_plan))
	if cp == nil {
		return nil, errOutOfMemory
	}
	defer func() {
		if err != nil {
			freeForwardPlan(cp)
		}
	}()
	nb := len(p.Buckets)
	cp.num_buckets = C.int64_t(nb)
	cp.moved, cp.dropped, cp.merged_cuts = C.int64_t(p.Moved), C.int64_t(p.Dropped), C.int64_t(p.MergedCuts)
	if p.GroupsLater {
		cp.groups_later = 1
	}
	ptr, bytes, err := cAlloc[int64](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_bytes = (*C.int64_t)(ptr)
	ptr, caps, err := cAlloc[int64](len(p.Caps))
	if err != nil {
		return nil, err
	}
	cp.num_ddp_caps, cp.ddp_caps = C.int64_t(len(p.Caps)), (*C.int64_t)(ptr)
	copy(caps, p.Caps)
	ptr, graphs, err := cAlloc[int32](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_graphs = (*C.int32_t)(ptr)
	ptr, sources, err := cAlloc[int32](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_sources = (*C.int32_t)(ptr)
	lists := make([][]int32, nb)
	for i, b := range p.Buckets {
		bytes[i], graphs[i], sources[i], lists[i] = b.Bytes, int32(b.Graph), int32(b.Source), b.Params
	}
	offs, vals, err := cCSR(lists)
	if err != nil {
		return nil, err
	}
	cp.bucket_param_offsets, cp.bucket_params = (*C.int64_t)(offs), (*C.int32_t)(vals)
	return cp, nil
}

func freeForwardPlan(cp *C.goddp_forward_plan) {
	if cp == nil {
		return
	}
	for _, p := range []unsafe.Pointer{
		unsafe.Pointer(cp.bucket_bytes),
		unsafe.Pointer(cp.bucket_graphs),
		unsafe.Pointer(cp.bucket_sources),
		unsafe.Pointer(cp.bucket_param_offsets),
		unsafe.Pointer(cp.bucket_params),
		unsafe.Pointer(cp.ddp_caps),
	} {
		C.free(p)
	}
	C.free(unsafe.Pointer(cp))
}
