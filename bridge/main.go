// Command bridge is goddp's C ABI: one cgo export per function declared in
// csrc/goddp.h, over package planner.
//
// It is built either as a shared library for C programs
//
//	go build -buildmode=c-shared -o build/lib/libgoddp.so ./bridge
//
// or as a static archive that setup.py links into the CPython extension
// goddp._goddp:
//
//	go build -buildmode=c-archive -o build/go/libgoddp_go.a ./bridge
//
// The layer stays thin on purpose: it converts C arrays to planner types and
// back, maps errors to goddp_status, and recovers every panic so that none
// ever unwinds into C. All planning logic lives in package planner.
//
// The preamble includes goddp.h itself, so the struct types are the header's
// own and the C compiler checks every export's signature against the
// header's prototype (a mismatch is a "conflicting types" build error).
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include "goddp.h"
*/
import "C"

import "github.com/goddp/goddp/planner"

// abiVersion is the ABI this bridge implements. It must equal
// GODDP_ABI_VERSION in csrc/goddp.h.
const abiVersion = 15

// Compile-time checks that the header and the Go side agree. Converting a
// negative constant to uint does not compile, so each pair of lines fails the
// build unless the two values are equal.
const (
	_ = uint(C.GODDP_ABI_VERSION - abiVersion)
	_ = uint(abiVersion - C.GODDP_ABI_VERSION)

	// A cap not given crosses as it is (Note [Cap defaults]).
	_ = uint(C.GODDP_CAP_NOT_GIVEN - planner.CapNotGiven)
	_ = uint(planner.CapNotGiven - C.GODDP_CAP_NOT_GIVEN)

	// The planner's enums are copied across without translation tables.
	_ = uint(C.GODDP_OP_PLACEHOLDER - planner.OpPlaceholder)
	_ = uint(planner.OpPlaceholder - C.GODDP_OP_PLACEHOLDER)
	_ = uint(C.GODDP_OP_GET_ATTR - planner.OpGetAttr)
	_ = uint(planner.OpGetAttr - C.GODDP_OP_GET_ATTR)
	_ = uint(C.GODDP_OP_CALL_MODULE - planner.OpCallModule)
	_ = uint(planner.OpCallModule - C.GODDP_OP_CALL_MODULE)
	_ = uint(C.GODDP_OP_CALL_FUNCTION - planner.OpCallFunction)
	_ = uint(planner.OpCallFunction - C.GODDP_OP_CALL_FUNCTION)
	_ = uint(C.GODDP_OP_CALL_METHOD - planner.OpCallMethod)
	_ = uint(planner.OpCallMethod - C.GODDP_OP_CALL_METHOD)
	_ = uint(C.GODDP_OP_OUTPUT - planner.OpOutput)
	_ = uint(planner.OpOutput - C.GODDP_OP_OUTPUT)

	_ = uint(C.GODDP_REF_ARG - planner.RefArg)
	_ = uint(planner.RefArg - C.GODDP_REF_ARG)
	_ = uint(C.GODDP_REF_OTHER - planner.RefOther)
	_ = uint(planner.RefOther - C.GODDP_REF_OTHER)
	_ = uint(C.GODDP_REF_MODULE - planner.RefModule)
	_ = uint(planner.RefModule - C.GODDP_REF_MODULE)
	_ = uint(C.GODDP_REF_ATTR - planner.RefAttr)
	_ = uint(planner.RefAttr - C.GODDP_REF_ATTR)

	_ = uint(C.GODDP_MODE_DDP - planner.ModeDDP)
	_ = uint(planner.ModeDDP - C.GODDP_MODE_DDP)
	_ = uint(C.GODDP_MODE_TORCH - planner.ModeTorch)
	_ = uint(planner.ModeTorch - C.GODDP_MODE_TORCH)

	_ = uint(C.GODDP_REASON_ALIGNED - planner.ReasonAligned)
	_ = uint(planner.ReasonAligned - C.GODDP_REASON_ALIGNED)
	_ = uint(C.GODDP_REASON_OFF - planner.ReasonOff)
	_ = uint(planner.ReasonOff - C.GODDP_REASON_OFF)
	_ = uint(C.GODDP_REASON_NOT_COVERED - planner.ReasonNotCovered)
	_ = uint(planner.ReasonNotCovered - C.GODDP_REASON_NOT_COVERED)
	_ = uint(C.GODDP_REASON_ONE_PIECE - planner.ReasonOnePiece)
	_ = uint(planner.ReasonOnePiece - C.GODDP_REASON_ONE_PIECE)
	_ = uint(C.GODDP_REASON_PART_OF_FORWARD - planner.ReasonPartOfForward)
	_ = uint(planner.ReasonPartOfForward - C.GODDP_REASON_PART_OF_FORWARD)
	_ = uint(C.GODDP_REASON_NO_PARAMS - planner.ReasonNoParams)
	_ = uint(planner.ReasonNoParams - C.GODDP_REASON_NO_PARAMS)
	_ = uint(C.GODDP_REASON_NO_PER_BUCKET_CAPS - planner.ReasonNoPerBucketCaps)
	_ = uint(planner.ReasonNoPerBucketCaps - C.GODDP_REASON_NO_PER_BUCKET_CAPS)
	_ = uint(C.GODDP_REASON_PYTHON_REDUCER - planner.ReasonPythonReducer)
	_ = uint(planner.ReasonPythonReducer - C.GODDP_REASON_PYTHON_REDUCER)
	_ = uint(C.GODDP_REASON_MIXED_PRECISION - planner.ReasonMixedPrecision)
	_ = uint(planner.ReasonMixedPrecision - C.GODDP_REASON_MIXED_PRECISION)
	_ = uint(C.GODDP_REASON_BUILTIN_COMM_HOOK - planner.ReasonBuiltinCommHook)
	_ = uint(planner.ReasonBuiltinCommHook - C.GODDP_REASON_BUILTIN_COMM_HOOK)
	_ = uint(C.GODDP_REASON_GROUPS_LATER - planner.ReasonGroupsLater)
	_ = uint(planner.ReasonGroupsLater - C.GODDP_REASON_GROUPS_LATER)

	_ = uint(C.GODDP_ALIGN_NONE - planner.AlignNone)
	_ = uint(planner.AlignNone - C.GODDP_ALIGN_NONE)
	_ = uint(C.GODDP_ALIGN_READY - planner.AlignReady)
	_ = uint(planner.AlignReady - C.GODDP_ALIGN_READY)
	_ = uint(C.GODDP_ALIGN_DECLARATION - planner.AlignDeclaration)
	_ = uint(planner.AlignDeclaration - C.GODDP_ALIGN_DECLARATION)
	_ = uint(C.GODDP_ALIGN_DECLARATION_MERGED - planner.AlignDeclarationMerged)
	_ = uint(planner.AlignDeclarationMerged - C.GODDP_ALIGN_DECLARATION_MERGED)
	_ = uint(C.GODDP_ALIGN_READY_GROUPS - planner.AlignReadyGroups)
	_ = uint(planner.AlignReadyGroups - C.GODDP_ALIGN_READY_GROUPS)
	_ = uint(C.GODDP_ALIGN_DECLARATION_GROUPS - planner.AlignDeclarationGroups)
	_ = uint(planner.AlignDeclarationGroups - C.GODDP_ALIGN_DECLARATION_GROUPS)

	_ = uint(C.GODDP_EDGES_COMPILE - planner.EdgesCompile)
	_ = uint(planner.EdgesCompile - C.GODDP_EDGES_COMPILE)
	_ = uint(C.GODDP_EDGES_AUTO - planner.EdgesAuto)
	_ = uint(planner.EdgesAuto - C.GODDP_EDGES_AUTO)
	_ = uint(C.GODDP_EDGES_EAGER - planner.EdgesEager)
	_ = uint(planner.EdgesEager - C.GODDP_EDGES_EAGER)

	_ = uint(C.GODDP_ERR_INVALID_CONFIG - planner.ErrInvalidConfig)
	_ = uint(planner.ErrInvalidConfig - C.GODDP_ERR_INVALID_CONFIG)
	_ = uint(C.GODDP_ERR_INVALID_GRAPH - planner.ErrInvalidGraph)
	_ = uint(planner.ErrInvalidGraph - C.GODDP_ERR_INVALID_GRAPH)
	_ = uint(C.GODDP_ERR_OVERFLOW - planner.ErrOverflow)
	_ = uint(planner.ErrOverflow - C.GODDP_ERR_OVERFLOW)
)

// main is never called: the Go runtime starts when the library is loaded and
// C calls the exports directly.
func main() {}
