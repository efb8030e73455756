package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

// See exports.go: cgo cannot spell const in an export's signature.
typedef const goddp_layout goddp_layout_in;
*/
import "C"

import (
	"unsafe"

	"github.com/goddp/goddp/planner"
)

//export goddp_layout_digest
func goddp_layout_digest(l *C.goddp_layout_in, digest *C.uint64_t, errMsg **C.char) (status C.goddp_status) {
	defer recoverAsStatus(&status, errMsg)
	if errMsg != nil {
		*errMsg = nil
	}
	if l == nil || digest == nil {
		setErrMsg(errMsg, "goddp: goddp_layout_digest: layout or digest is NULL")
		return C.GODDP_ERR_INVALID_CONFIG
	}
	layout, err := layoutFromC((*C.goddp_layout)(l))
	if err == nil {
		var d uint64
		if d, err = planner.LayoutDigest(layout); err == nil {
			*digest = C.uint64_t(d)
			return C.GODDP_OK
		}
	}
	setErrMsg(errMsg, err.Error())
	return statusOf(err)
}

// layoutFromC copies a goddp_layout into Go memory, checking the CSR
// offsets; the planner checks the rest.
func layoutFromC(l *C.goddp_layout) (*planner.Layout, error) {
	n := int(l.num_buckets)
	if n < 1 {
		return nil, invalidConfig("goddp: layout: num_buckets = %d; want >= 1", n)
	}
	nc := int(l.num_caps)
	if nc < 1 {
		return nil, invalidConfig("goddp: layout: num_caps = %d; want >= 1", nc)
	}
	if l.build == nil {
		return nil, invalidConfig("goddp: layout: build is NULL")
	}
	s, err := spansOf(l.spans, l.num_spans, planner.ErrInvalidConfig)
	if err != nil {
		return nil, err
	}
	caps, err := cView[int64](s, unsafe.Pointer(l.caps), int64(nc), "layout: caps", planner.ErrInvalidConfig)
	if err != nil {
		return nil, err
	}
	offsets, err := cView[int64](s, unsafe.Pointer(l.bucket_offsets), int64(n)+1, "layout: bucket_offsets", planner.ErrInvalidConfig)
	if err != nil {
		return nil, err
	}
	total := offsets[n]
	if offsets[0] != 0 || total < 0 || total > 1<<31-1 {
		return nil, invalidConfig("goddp: layout: bucket_offsets run from %d to %d; want 0 to the number of positions", offsets[0], total)
	}
	positions, err := cView[int32](s, unsafe.Pointer(l.positions), total, "layout: positions", planner.ErrInvalidConfig)
	if err != nil {
		return nil, err
	}
	out := &planner.Layout{
		Buckets: make([]planner.LayoutBucket, n),
		Caps:    append([]int64(nil), caps...),
		Order:   planner.BucketOrder(l.bucket_order),
		Build:   C.GoString(l.build),
	}
	for k := 0; k < n; k++ {
		lo, hi := offsets[k], offsets[k+1]
		if lo > hi || hi > total {
			return nil, invalidConfig("goddp: layout: bucket_offsets[%d:%d] = %d, %d is not ascending within 0..%d", k, k+2, lo, hi, total)
		}
		out.Buckets[k] = planner.LayoutBucket{Positions: append([]int32(nil), positions[lo:hi]...)}
	}
	return out, nil
}
