//go:build goddp_testhooks

package main

// Helpers for bridge_test.go. Test files cannot use cgo, so the code that
// builds C inputs and reads C outputs lives here, in an ordinary file, built
// only with the goddp_testhooks tag (as the bridge's tests are: make gotest),
// so that no test code is compiled into the shipped library or the wheel.

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"

// The same typedefs as in exports.go; cgo preambles are per file.
typedef const goddp_graph goddp_graph_in;
typedef const goddp_config goddp_config_in;
*/
import "C"

import (
	"unsafe"

	"github.com/goddp/goddp/planner"
)

// Status codes as plain ints, for tests.
const (
	statusOK            = int(C.GODDP_OK)
	statusInvalidConfig = int(C.GODDP_ERR_INVALID_CONFIG)
	statusInvalidGraph  = int(C.GODDP_ERR_INVALID_GRAPH)
	statusOverflow      = int(C.GODDP_ERR_OVERFLOW)
	statusPanic         = int(C.GODDP_ERR_PANIC)
	statusInternal      = int(C.GODDP_ERR_INTERNAL)
)

// rawGraph mirrors goddp_graph with Go slices. Each non-nil slice is copied
// into C memory; a nil slice becomes a NULL pointer. Counts are given
// explicitly so that tests can make them disagree with the arrays.
type rawGraph struct {
	NumNodes          int64
	NodeOps           []int32
	NodeModuleIDs     []int32
	NodeParamOffsets  []int64
	NodeParams        []int32
	NodeParamRefs     []uint8
	NodeUserOffsets   []int64
	NodeUsers         []int32
	NumParams         int64
	ParamBytes        []int64
	ParamStorageBytes []int64
	ParamDtypes       []int32
	ParamDevices      []int32
	ParamFlags        []uint32
	ParamNameOffsets  []int64
	ParamNames        []byte
	NodeBlockIDs      []int32 // optional: nil means NULL, no block information
	ParamDDPPositions []int32 // nil: NULL
	// Module stacks (ABI 6); a nil NodeStackOffsets means NULL, none.
	NumModuleStrings    int64
	ModuleStringOffsets []int64
	ModuleStrings       []byte
	NodeStackOffsets    []int64
	NodeStackPaths      []int32
	NodeStackTypes      []int32
	// Body facts (ABI 10); a nil NodeHopCalls means NULL, none.
	NodeHopCalls     []int32
	NodeBodyOffsets  []int64
	BodyStackOffsets []int64
	BodyStackPaths   []int32
	BodyStackTypes   []int32
	// Spans (ABI 12): every non-nil array above as one of the caller's
	// arrays, its exact size, so that the bridge checks reads against them.
	Spans bool
}

// rawConfig mirrors goddp_config the same way.
type rawConfig struct {
	Mode                int32
	BucketCapBytes      int64
	FirstBucketCapBytes int64
	NumBucketCaps       int64
	BucketCapsBytes     []int64
	MaxPieces           int64
	AlignBuckets        int32
	BucketOrder         int32
	BlockCuts           int32
	Edges               int32
	DDP                 *rawDDP // nil: NULL
	UniformCaps         int32
}

// rawDDP mirrors goddp_ddp.
type rawDDP struct {
	BucketCapBytes      int64
	FirstBucketCapBytes int64
	NumBucketCaps       int64
	BucketCapsBytes     []int64
	Flags               uint32
	NumParams           int64
}

// DDP flag bits as plain ints, for tests.
const (
	ddpFindUnused   = uint32(C.GODDP_DDP_FIND_UNUSED_PARAMETERS)
	ddpStaticGraph  = uint32(C.GODDP_DDP_STATIC_GRAPH)
	ddpCapIsDefault = uint32(C.GODDP_DDP_CAP_IS_DEFAULT)
)

// cArena owns C copies of test inputs until release; copies lists each
// copy of a slice with its size in bytes.
type cArena struct {
	ptrs   []unsafe.Pointer
	copies []C.goddp_span
}

func cArenaCopy[E any](a *cArena, s []E) unsafe.Pointer {
	if s == nil {
		return nil
	}
	var zero E
	// One spare byte keeps malloc(0) from returning NULL for empty slices.
	p := C.malloc(C.size_t(uintptr(len(s))*unsafe.Sizeof(zero) + 1))
	if p == nil {
		panic("test helper: out of C memory")
	}
	copy(unsafe.Slice((*E)(p), len(s)), s)
	a.ptrs = append(a.ptrs, p)
	a.copies = append(a.copies, C.goddp_span{data: p, bytes: C.int64_t(uintptr(len(s)) * unsafe.Sizeof(zero))})
	return p
}

func (a *cArena) release() {
	for _, p := range a.ptrs {
		C.free(p)
	}
	a.ptrs = nil
}

func (a *cArena) graph(g *rawGraph) *C.goddp_graph {
	if g == nil {
		return nil
	}
	cg := (*C.goddp_graph)(C.calloc(1, C.sizeof_goddp_graph))
	a.ptrs = append(a.ptrs, unsafe.Pointer(cg))
	first := len(a.copies)
	defer func() {
		if g.Spans {
			cg.num_spans = C.int64_t(len(a.copies) - first)
			cg.spans = (*C.goddp_span)(cArenaCopy(a, a.copies[first:]))
		}
	}()
	cg.num_nodes = C.int64_t(g.NumNodes)
	cg.node_ops = (*C.int32_t)(cArenaCopy(a, g.NodeOps))
	cg.node_module_ids = (*C.int32_t)(cArenaCopy(a, g.NodeModuleIDs))
	cg.node_param_offsets = (*C.int64_t)(cArenaCopy(a, g.NodeParamOffsets))
	cg.node_params = (*C.int32_t)(cArenaCopy(a, g.NodeParams))
	cg.node_param_refs = (*C.uint8_t)(cArenaCopy(a, g.NodeParamRefs))
	cg.node_user_offsets = (*C.int64_t)(cArenaCopy(a, g.NodeUserOffsets))
	cg.node_users = (*C.int32_t)(cArenaCopy(a, g.NodeUsers))
	cg.num_params = C.int64_t(g.NumParams)
	cg.param_bytes = (*C.int64_t)(cArenaCopy(a, g.ParamBytes))
	cg.param_storage_bytes = (*C.int64_t)(cArenaCopy(a, g.ParamStorageBytes))
	cg.param_dtypes = (*C.int32_t)(cArenaCopy(a, g.ParamDtypes))
	cg.param_devices = (*C.int32_t)(cArenaCopy(a, g.ParamDevices))
	cg.node_block_ids = (*C.int32_t)(cArenaCopy(a, g.NodeBlockIDs))
	cg.param_flags = (*C.uint32_t)(cArenaCopy(a, g.ParamFlags))
	cg.param_name_offsets = (*C.int64_t)(cArenaCopy(a, g.ParamNameOffsets))
	cg.param_names = (*C.char)(cArenaCopy(a, g.ParamNames))
	cg.param_ddp_positions = (*C.int32_t)(cArenaCopy(a, g.ParamDDPPositions))
	cg.num_module_strings = C.int64_t(g.NumModuleStrings)
	cg.module_string_offsets = (*C.int64_t)(cArenaCopy(a, g.ModuleStringOffsets))
	cg.module_strings = (*C.char)(cArenaCopy(a, g.ModuleStrings))
	cg.node_stack_offsets = (*C.int64_t)(cArenaCopy(a, g.NodeStackOffsets))
	cg.node_stack_paths = (*C.int32_t)(cArenaCopy(a, g.NodeStackPaths))
	cg.node_stack_types = (*C.int32_t)(cArenaCopy(a, g.NodeStackTypes))
	cg.node_hop_calls = (*C.int32_t)(cArenaCopy(a, g.NodeHopCalls))
	cg.node_body_offsets = (*C.int64_t)(cArenaCopy(a, g.NodeBodyOffsets))
	cg.body_stack_offsets = (*C.int64_t)(cArenaCopy(a, g.BodyStackOffsets))
	cg.body_stack_paths = (*C.int32_t)(cArenaCopy(a, g.BodyStackPaths))
	cg.body_stack_types = (*C.int32_t)(cArenaCopy(a, g.BodyStackTypes))
	return cg
}

func (a *cArena) config(c *rawConfig) *C.goddp_config {
	if c == nil {
		return nil
	}
	cc := (*C.goddp_config)(C.calloc(1, C.sizeof_goddp_config))
	a.ptrs = append(a.ptrs, unsafe.Pointer(cc))
	cc.mode = C.int32_t(c.Mode)
	cc.bucket_cap_bytes = C.int64_t(c.BucketCapBytes)
	cc.first_bucket_cap_bytes = C.int64_t(c.FirstBucketCapBytes)
	cc.num_bucket_caps = C.int64_t(c.NumBucketCaps)
	cc.bucket_caps_bytes = (*C.int64_t)(cArenaCopy(a, c.BucketCapsBytes))
	cc.max_pieces = C.int64_t(c.MaxPieces)
	cc.align_buckets = C.int32_t(c.AlignBuckets)
	cc.bucket_order = C.int32_t(c.BucketOrder)
	cc.block_cuts = C.int32_t(c.BlockCuts)
	cc.edges = C.int32_t(c.Edges)
	cc.uniform_caps = C.int32_t(c.UniformCaps)
	if d := c.DDP; d != nil {
		cd := (*C.goddp_ddp)(C.calloc(1, C.sizeof_goddp_ddp))
		a.ptrs = append(a.ptrs, unsafe.Pointer(cd))
		cd.bucket_cap_bytes = C.int64_t(d.BucketCapBytes)
		cd.first_bucket_cap_bytes = C.int64_t(d.FirstBucketCapBytes)
		cd.num_bucket_caps = C.int64_t(d.NumBucketCaps)
		cd.bucket_caps_bytes = (*C.int64_t)(cArenaCopy(a, d.BucketCapsBytes))
		cd.flags = C.uint32_t(d.Flags)
		cd.num_params = C.int64_t(d.NumParams)
		cc.ddp = cd
	}
	return cc
}

// convertGraphViaC copies g into C memory and runs the bridge's conversion.
func convertGraphViaC(g *rawGraph) (*planner.Graph, error) {
	var a cArena
	defer a.release()
	return graphFromC(a.graph(g))
}

// convertSettingsViaC copies c into C memory and runs the bridge's conversion.
func convertSettingsViaC(c *rawConfig) (planner.Settings, error) {
	var a cArena
	defer a.release()
	return settingsFromC(a.config(c))
}

// convertStacksViaC copies g into C memory and converts its module stacks.
func convertStacksViaC(g *rawGraph) (*planner.ModuleStacks, error) {
	var a cArena
	defer a.release()
	return stacksFromC(a.graph(g))
}

// planCall is what one goddp_plan_graph call returned, copied back to Go.
type planCall struct {
	Status   int
	Msg      string
	OutNull  bool              // *out was NULL on return
	Plan     *planner.Plan     // nil unless Status == statusOK
	Decision *planner.Decision // the ABI 6 fields, with Plan; nil unless Status == statusOK
}

// callPlanGraph runs the goddp_plan_graph export on C copies of g and c, the
// way a C caller would, then copies the plan back into planner types and
// frees it with goddp_plan_free. nullOut passes out == NULL.
func callPlanGraph(g *rawGraph, c *rawConfig, nullOut bool) planCall {
	var a cArena
	defer a.release()
	var out *C.goddp_plan
	var msg *C.char
	outPtr := &out
	if nullOut {
		outPtr = nil
	}
	// A sentinel that the export must overwrite with NULL on failure.
	sentinel := C.malloc(1)
	defer C.free(sentinel)
	out = (*C.goddp_plan)(sentinel)
	st := goddp_plan_graph((*C.goddp_graph_in)(a.graph(g)), (*C.goddp_config_in)(a.config(c)), outPtr, &msg)
	res := planCall{Status: int(st), OutNull: out == nil}
	if msg != nil {
		res.Msg = C.GoString(msg)
		goddp_string_free(msg)
	}
	if nullOut {
		res.OutNull = true
	}
	if out != nil && !nullOut && st == C.GODDP_OK {
		res.Plan = planFromCPlan(out)
		res.Decision = decisionFromCPlan(out, res.Plan)
		goddp_plan_free(out)
	}
	return res
}

// planFromCPlan reads a C plan back into planner types, the reverse of
// planToC.
func planFromCPlan(cp *C.goddp_plan) *planner.Plan {
	int32s := func(p *C.int32_t, n int64) []int32 {
		if n == 0 {
			return []int32{}
		}
		return append([]int32{}, unsafe.Slice((*int32)(unsafe.Pointer(p)), n)...)
	}
	int64s := func(p *C.int64_t, n int64) []int64 {
		if n == 0 {
			return []int64{}
		}
		return append([]int64{}, unsafe.Slice((*int64)(unsafe.Pointer(p)), n)...)
	}
	csr := func(offp *C.int64_t, valp *C.int32_t, n int64) [][]int32 {
		offs := int64s(offp, n+1)
		vals := int32s(valp, offs[n])
		lists := make([][]int32, n)
		for i := range lists {
			lists[i] = vals[offs[i]:offs[i+1]:offs[i+1]]
		}
		return lists
	}
	nb := int64(cp.num_buckets)
	p := &planner.Plan{
		Fingerprint:  uint64(cp.fingerprint),
		NodePiece:    int32s(cp.node_pieces, int64(cp.num_nodes)),
		NumPieces:    int(cp.num_pieces),
		PieceInputs:  csr(cp.piece_input_offsets, cp.piece_inputs, int64(cp.num_pieces)),
		PieceOutputs: csr(cp.piece_output_offsets, cp.piece_outputs, int64(cp.num_pieces)),
		Alignment:    planner.Alignment(cp.alignment),
		DDPCaps:      int64s(cp.ddp_caps, int64(cp.num_ddp_caps)),
		MergedCuts:   int(cp.merged_cuts),
	}
	bytes := int64s(cp.bucket_bytes, nb)
	parts := int32s(cp.bucket_pieces, nb)
	begins := int64s(cp.bucket_node_begin, nb)
	ends := int64s(cp.bucket_node_end, nb)
	var extended []uint8
	if nb > 0 {
		extended = unsafe.Slice((*uint8)(unsafe.Pointer(cp.bucket_extended)), nb)
	}
	params := csr(cp.bucket_param_offsets, cp.bucket_params, nb)
	for i := range nb {
		p.Buckets = append(p.Buckets, planner.Bucket{
			Bytes:     bytes[i],
			Params:    params[i],
			NodeBegin: int(begins[i]),
			NodeEnd:   int(ends[i]),
			Piece:     int(parts[i]),
			Extended:  extended[i] != 0,
		})
	}
	return p
}

// decisionFromCPlan reads the ABI 6 fields of a C plan back, the reverse
// of decisionToC.
func decisionFromCPlan(cp *C.goddp_plan, pl *planner.Plan) *planner.Decision {
	int32s := func(p *C.int32_t, n int64) []int32 {
		if n == 0 || p == nil {
			return nil
		}
		return append([]int32{}, unsafe.Slice((*int32)(unsafe.Pointer(p)), n)...)
	}
	d := &planner.Decision{
		Plan: pl,
		Config: planner.Config{
			Mode:                planner.ModeDDP,
			BucketCapBytes:      int64(cp.bucket_cap_bytes),
			FirstBucketCapBytes: int64(cp.first_bucket_cap_bytes),
			MaxPieces:           int(cp.max_pieces),
			AlignBuckets:        cp.align_buckets != 0,
			BucketOrder:         planner.BucketOrder(cp.bucket_order),
		},
		AlignReason:   planner.AlignReason(cp.align_reason),
		AlignedParams: int(cp.aligned_params),
		CountedParams: int(cp.num_counted_params),
		EagerPieces:   int32s(cp.eager_pieces, int64(cp.num_eager_pieces)),
		BlockIDs:      int32s(cp.node_block_ids, int64(cp.num_nodes)),
	}
	if n := int64(cp.num_bucket_caps); n > 0 {
		d.Config.BucketCapsBytes = append([]int64{}, unsafe.Slice((*int64)(unsafe.Pointer(cp.bucket_caps_bytes)), n)...)
	}
	np := int64(cp.num_pieces)
	offs := unsafe.Slice((*int64)(unsafe.Pointer(cp.piece_param_offsets)), np+1)
	vals := int32s(cp.piece_params, offs[np])
	d.PieceParams = make([][]int32, np)
	for i := range d.PieceParams {
		d.PieceParams[i] = vals[offs[i]:offs[i+1]:offs[i+1]]
	}
	return d
}

// alignmentOf is the alignment a C plan carries, for tests (-1: the call
// failed).
func alignmentOf(g *rawGraph, c *rawConfig) planner.Alignment {
	var a cArena
	defer a.release()
	var out *C.goddp_plan
	if goddp_plan_graph((*C.goddp_graph_in)(a.graph(g)), (*C.goddp_config_in)(a.config(c)), &out, nil) != C.GODDP_OK {
		return -1
	}
	defer goddp_plan_free(out)
	return planner.Alignment(out.alignment)
}

// callSetMaxProcs runs the goddp_set_max_procs export.
func callSetMaxProcs(n int32) (status int, previous int32) {
	var prev C.int32_t = -1
	st := goddp_set_max_procs(C.int32_t(n), &prev)
	return int(st), int32(prev)
}

func callABIVersion() int { return int(goddp_abi_version()) }

func callPlanFreeNil() { goddp_plan_free(nil) }

func callStringFreeNil() { goddp_string_free(nil) }

// statusOfInt exposes statusOf to tests as an int.
func statusOfInt(err error) int { return int(statusOf(err)) }

// reportCall is what an export that takes and gives text returned.
type reportCall struct {
	status    int
	text, msg string
	textSet   bool // *out was non-NULL
}

// collectReport turns what such an export returned into a reportCall and
// frees the returned strings, as a C caller must.
func collectReport(status C.goddp_status, out, msg *C.char) reportCall {
	r := reportCall{status: int(status), textSet: out != nil}
	if out != nil {
		r.text = C.GoString(out)
		goddp_string_free(out)
	}
	if msg != nil {
		r.msg = C.GoString(msg)
		goddp_string_free(msg)
	}
	return r
}
