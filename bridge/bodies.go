package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include "goddp.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goddp/goddp/planner"
)

// bodiesFromC copies the optional body facts of a goddp_graph (ABI 10);
// NULL node_hop_calls means none. The planner checks the facts; only the
// pointer/length pairs are checked here.
func bodiesFromC(g *C.goddp_graph) (*planner.BodyFacts, error) {
	if g.node_hop_calls == nil {
		if g.node_body_offsets != nil || g.body_stack_offsets != nil || g.body_stack_paths != nil || g.body_stack_types != nil {
			return nil, invalidGraph("goddp: the body facts need node_hop_calls, node_body_offsets, body_stack_offsets, body_stack_paths and body_stack_types, or none")
		}
		return nil, nil
	}
	n := int64(g.num_nodes)
	var (
		b                     planner.BodyFacts
		bodyNodes, numEntries int64
	)
	s, err := spansOf(g.spans, g.num_spans, planner.ErrInvalidGraph)
	if err != nil {
		return nil, err
	}
	if b.Calls, err = cCopy[int32](s, unsafe.Pointer(g.node_hop_calls), n, "node_hop_calls", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if b.Offsets, err = cCopy[int64](s, unsafe.Pointer(g.node_body_offsets), n+1, "node_body_offsets", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if bodyNodes, err = csrValuesLen(b.Offsets, "node_body_offsets"); err != nil {
		return nil, err
	}
	if b.StackOffsets, err = cCopy[int64](s, unsafe.Pointer(g.body_stack_offsets), bodyNodes+1, "body_stack_offsets", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if numEntries, err = csrValuesLen(b.StackOffsets, "body_stack_offsets"); err != nil {
		return nil, err
	}
	if b.Paths, err = cCopy[int32](s, unsafe.Pointer(g.body_stack_paths), numEntries, "body_stack_paths", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if b.Types, err = cCopy[int32](s, unsafe.Pointer(g.body_stack_types), numEntries, "body_stack_types", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	return &b, nil
}
