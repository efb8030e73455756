package main

/*
#cgo CFLAGS: -I${SRCDIR}/../csrc
#include <stdlib.h>
#include "goddp.h"
*/
import "C"

import (
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/goddp/goddp/planner"
)

// maxArrayLen bounds every length read from the caller before unsafe.Slice
// turns a C pointer into a slice. Node and parameter indices are int32 in the
// ABI, so no valid graph has an array this long, and a garbage count is
// reported instead of faulting.
const maxArrayLen = math.MaxInt32

// spans are the caller's arrays (goddp_span), where it gives them: with
// them, every read of an array is checked against the memory the caller
// holds, here and nowhere else (a binding that holds buffers of known
// size, such as python/goddp/native, checks no length itself). A C caller
// that gives none vouches for its counts.
type spans []C.goddp_span

// spansOf reads a struct's spans; code is the status of a bad pair.
func spansOf(p *C.goddp_span, n C.int64_t, code planner.ErrorCode) (spans, error) {
	if n == 0 {
		return nil, nil
	}
	if n < 0 || n > maxArrayLen || p == nil {
		return nil, &planner.Error{Code: code, Msg: fmt.Sprintf("goddp: num_spans = %d with spans %p", int64(n), p)}
	}
	return unsafe.Slice(p, int(n)), nil
}

// held is how many bytes from p on the caller holds: the rest of the span
// p points into, or -1 when it points into none; whole says p begins its
// span, which the array must then fill exactly.
func (s spans) held(p unsafe.Pointer) (held int64, whole bool) {
	for _, span := range s {
		begin := uintptr(span.data)
		if at := uintptr(p); at == begin || (at > begin && at < begin+uintptr(span.bytes)) {
			return int64(span.bytes) - int64(at-begin), at == begin
		}
	}
	return -1, false
}

// cView returns a Go view of n elements of type E at p without copying,
// after checking the pointer/length pair: a negative or absurd length, a
// NULL pointer with a nonzero length, or (with spans) more elements than
// the caller's array holds, is an error naming the field.
func cView[E any](s spans, p unsafe.Pointer, n int64, field string, code planner.ErrorCode) ([]E, error) {
	switch {
	case n < 0:
		return nil, &planner.Error{Code: code, Msg: fmt.Sprintf("goddp: %s: negative length %d", field, n)}
	case n > maxArrayLen:
		return nil, &planner.Error{Code: code, Msg: fmt.Sprintf("goddp: %s: length %d exceeds the ABI limit %d", field, n, int64(maxArrayLen))}
	case p == nil && n > 0:
		return nil, &planner.Error{Code: code, Msg: fmt.Sprintf("goddp: %s is NULL but its length is %d", field, n)}
	}
	if s != nil && p != nil {
		size := int64(unsafe.Sizeof(*new(E)))
		if held, whole := s.held(p); held < n*size || (whole && held != n*size) {
			return nil, &planner.Error{Code: code, Msg: fmt.Sprintf("goddp: %s has %d items; the counts and offsets say %d", field, max(held, 0)/size, n)}
		}
	}
	if n == 0 {
		return nil, nil
	}
	return unsafe.Slice((*E)(p), n), nil
}

// cCopy is cView followed by a copy into Go memory: the planner must never
// hold on to the caller's memory.
func cCopy[E any](s spans, p unsafe.Pointer, n int64, field string, code planner.ErrorCode) ([]E, error) {
	v, err := cView[E](s, p, n, field, code)
	if err != nil {
		return nil, err
	}
	return slices.Clone(v), nil
}

// csrValuesLen is the length of a CSR values array: the last offset. The
// planner checks the rest of the offsets; the bridge needs only this one to
// know how much caller memory it may read.
func csrValuesLen(offsets []int64, field string) (int64, error) {
	last := offsets[len(offsets)-1]
	if last < 0 || last > maxArrayLen {
		return 0, invalidGraph("goddp: %s[%d] = %d is not a valid array length", field, len(offsets)-1, last)
	}
	return last, nil
}

// copyInto and viewInto make the readers of graphFromC's table: each reads
// one C array into *dst, copied (kept by the planner) or viewed (read once).
func copyInto[E any](s spans, dst *[]E) func(unsafe.Pointer, int64, string) error {
	return func(p unsafe.Pointer, n int64, field string) (err error) {
		*dst, err = cCopy[E](s, p, n, field, planner.ErrInvalidGraph)
		return err
	}
}

func viewInto[E any](s spans, dst *[]E) func(unsafe.Pointer, int64, string) error {
	return func(p unsafe.Pointer, n int64, field string) (err error) {
		*dst, err = cView[E](s, p, n, field, planner.ErrInvalidGraph)
		return err
	}
}

// graphFromC copies a goddp_graph into a planner.Graph.
func graphFromC(g *C.goddp_graph) (*planner.Graph, error) {
	if g == nil {
		return nil, invalidGraph("goddp: graph is NULL")
	}
	n := int64(g.num_nodes)
	if n < 0 || n >= maxArrayLen {
		return nil, invalidGraph("goddp: num_nodes = %d is out of range [0, %d)", n, int64(maxArrayLen))
	}
	np := int64(g.num_params)
	if np < 0 || np >= maxArrayLen {
		return nil, invalidGraph("goddp: num_params = %d is out of range [0, %d)", np, int64(maxArrayLen))
	}
	s, err := spansOf(g.spans, g.num_spans, planner.ErrInvalidGraph)
	if err != nil {
		return nil, err
	}

	// Every array of goddp_graph is one row: the C pointer, its length and
	// where it goes. Lengths are pointers because a CSR values array is as
	// long as the last entry of its offsets array, known only once the row
	// before it is read; a row with csrValues sets that length.
	var (
		out                         planner.Graph
		bytes, storage, nameOffsets []int64
		dtypes, devices             []int32
		flags                       []uint32
		nameBytes                   []byte
		nodesPlus1, paramsPlus1     = n + 1, np + 1
		numRefs, numUsers, namesLen int64
	)
	arrays := []struct {
		field     string
		ptr       unsafe.Pointer
		n         *int64
		read      func(p unsafe.Pointer, n int64, field string) error
		offsets   *[]int64 // for CSR offsets rows: the array just read...
		csrValues *int64   // ...and the length of its values array
	}{
		// OpKind and RefKind have the C element types as underlying types,
		// so the caller's arrays are read as planner types directly.
		{"node_ops", unsafe.Pointer(g.node_ops), &n, copyInto(s, &out.Ops), nil, nil},
		{"node_module_ids", unsafe.Pointer(g.node_module_ids), &n, copyInto(s, &out.ModuleIDs), nil, nil},
		{"node_param_offsets", unsafe.Pointer(g.node_param_offsets), &nodesPlus1, copyInto(s, &out.ParamOffsets), &out.ParamOffsets, &numRefs},
		{"node_params", unsafe.Pointer(g.node_params), &numRefs, copyInto(s, &out.ParamIndex), nil, nil},
		{"node_param_refs", unsafe.Pointer(g.node_param_refs), &numRefs, copyInto(s, &out.ParamRefs), nil, nil},
		{"node_user_offsets", unsafe.Pointer(g.node_user_offsets), &nodesPlus1, copyInto(s, &out.UserOffsets), &out.UserOffsets, &numUsers},
		{"node_users", unsafe.Pointer(g.node_users), &numUsers, copyInto(s, &out.Users), nil, nil},
		// The parameter table is transposed into []planner.Param below, so
		// its columns are only viewed here, not copied twice.
		{"param_bytes", unsafe.Pointer(g.param_bytes), &np, viewInto(s, &bytes), nil, nil},
		{"param_storage_bytes", unsafe.Pointer(g.param_storage_bytes), &np, viewInto(s, &storage), nil, nil},
		{"param_dtypes", unsafe.Pointer(g.param_dtypes), &np, viewInto(s, &dtypes), nil, nil},
		{"param_devices", unsafe.Pointer(g.param_devices), &np, viewInto(s, &devices), nil, nil},
		{"param_flags", unsafe.Pointer(g.param_flags), &np, viewInto(s, &flags), nil, nil},
		{"param_name_offsets", unsafe.Pointer(g.param_name_offsets), &paramsPlus1, viewInto(s, &nameOffsets), &nameOffsets, &namesLen},
		{"param_names", unsafe.Pointer(g.param_names), &namesLen, viewInto(s, &nameBytes), nil, nil},
	}
	for _, a := range arrays {
		if err := a.read(a.ptr, *a.n, a.field); err != nil {
			return nil, err
		}
		if a.csrValues != nil {
			values, err := csrValuesLen(*a.offsets, a.field)
			if err != nil {
				return nil, err
			}
			*a.csrValues = values
		}
	}
	// Optional (ABI 4): NULL means no block information (a nil BlockIDs).
	if g.node_block_ids != nil {
		if out.BlockIDs, err = cCopy[int32](s, unsafe.Pointer(g.node_block_ids), n, "node_block_ids", planner.ErrInvalidGraph); err != nil {
			return nil, err
		}
	}
	// Optional (ABI 12), both or neither: NULL means no cost estimates.
	if (g.node_flops == nil) != (g.node_bytes == nil) {
		return nil, invalidGraph("goddp: node_flops and node_bytes go together: give both or neither")
	}
	if g.node_flops != nil {
		if out.NodeFlops, err = cCopy[int64](s, unsafe.Pointer(g.node_flops), n, "node_flops", planner.ErrInvalidGraph); err != nil {
			return nil, err
		}
		if out.NodeBytes, err = cCopy[int64](s, unsafe.Pointer(g.node_bytes), n, "node_bytes", planner.ErrInvalidGraph); err != nil {
			return nil, err
		}
	}
	// One string for all names; each Param.Name is a substring of it.
	names := string(nameBytes)
	// Optional (ABI 5): NULL means no parameter has a DDP position.
	var positions []int32
	if g.param_ddp_positions != nil {
		if err := viewInto(s, &positions)(unsafe.Pointer(g.param_ddp_positions), np, "param_ddp_positions"); err != nil {
			return nil, err
		}
	}

	const knownFlags = C.GODDP_PARAM_REQUIRES_GRAD | C.GODDP_PARAM_DDP_IGNORED
	out.Params = make([]planner.Param, np)
	for i := range out.Params {
		begin, end := nameOffsets[i], nameOffsets[i+1]
		if begin < 0 || begin > end || end > namesLen {
			return nil, invalidGraph("goddp: param_name_offsets[%d:%d] = [%d, %d] is not a range within param_names (length %d)",
				i, i+2, begin, end, namesLen)
		}
		if flags[i]&^knownFlags != 0 {
			return nil, invalidGraph("goddp: param_flags[%d] = %#x has unknown bits", i, flags[i])
		}
		out.Params[i] = planner.Param{
			Name:         names[begin:end],
			Bytes:        bytes[i],
			StorageBytes: storage[i],
			DType:        dtypes[i],
			Device:       devices[i],
			RequiresGrad: flags[i]&C.GODDP_PARAM_REQUIRES_GRAD != 0,
			Ignored:      flags[i]&C.GODDP_PARAM_DDP_IGNORED != 0,
			DDPPosition:  -1,
		}
		if positions != nil {
			out.Params[i].DDPPosition = positions[i]
		}
	}
	return &out, nil
}

// stacksFromC copies the optional module stacks of a goddp_graph (ABI 6),
// with their node weights (ABI 7) and body facts (ABI 10); NULL
// node_stack_offsets means none. The planner checks the table's
// indices; only the pointer/length pairs are checked here.
func stacksFromC(g *C.goddp_graph) (*planner.ModuleStacks, error) {
	if g == nil {
		return nil, nil
	}
	if g.node_stack_offsets == nil {
		if g.node_hop_calls != nil {
			return nil, invalidGraph("goddp: node_hop_calls without module stacks; the body facts are read with node_stack_offsets")
		}
		return nil, nil
	}
	var (
		st                   planner.ModuleStacks
		stringOffsets        []int64
		stringBytes          []byte
		numEntries, namesLen int64
	)
	numStrings := int64(g.num_module_strings)
	if numStrings < 0 || numStrings >= maxArrayLen {
		return nil, invalidGraph("goddp: num_module_strings = %d is out of range [0, %d)", numStrings, int64(maxArrayLen))
	}
	s, err := spansOf(g.spans, g.num_spans, planner.ErrInvalidGraph)
	if err != nil {
		return nil, err
	}
	if st.Offsets, err = cCopy[int64](s, unsafe.Pointer(g.node_stack_offsets), int64(g.num_nodes)+1, "node_stack_offsets", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if numEntries, err = csrValuesLen(st.Offsets, "node_stack_offsets"); err != nil {
		return nil, err
	}
	if st.Paths, err = cCopy[int32](s, unsafe.Pointer(g.node_stack_paths), numEntries, "node_stack_paths", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if st.Types, err = cCopy[int32](s, unsafe.Pointer(g.node_stack_types), numEntries, "node_stack_types", planner.ErrInvalidGraph); err != nil {
		return nil, err
	}
	if err = viewInto(s, &stringOffsets)(unsafe.Pointer(g.module_string_offsets), numStrings+1, "module_string_offsets"); err != nil {
		return nil, err
	}
	if namesLen, err = csrValuesLen(stringOffsets, "module_string_offsets"); err != nil {
		return nil, err
	}
	if err = viewInto(s, &stringBytes)(unsafe.Pointer(g.module_strings), namesLen, "module_strings"); err != nil {
		return nil, err
	}
	if g.node_weights != nil {
		if st.Weights, err = cCopy[int32](s, unsafe.Pointer(g.node_weights), int64(g.num_nodes), "node_weights", planner.ErrInvalidGraph); err != nil {
			return nil, err
		}
	}
	if st.Bodies, err = bodiesFromC(g); err != nil {
		return nil, err
	}
	all := string(stringBytes)
	st.Strings = make([]string, numStrings)
	for i := range st.Strings {
		begin, end := stringOffsets[i], stringOffsets[i+1]
		if begin < 0 || begin > end || end > namesLen {
			return nil, invalidGraph("goddp: module_string_offsets[%d:%d] = [%d, %d] is not a range within module_strings (length %d)",
				i, i+2, begin, end, namesLen)
		}
		st.Strings[i] = all[begin:end]
	}
	return &st, nil
}

// settingsFromC copies a goddp_config (and its goddp_ddp) into planner
// settings. Cap values are the planner's to judge; only the pointer/length
// pairs and the bit sets are checked here.
func settingsFromC(c *C.goddp_config) (planner.Settings, error) {
	if c == nil {
		return planner.Settings{}, invalidConfig("goddp: config is NULL")
	}
	caps, err := cCopy[int64](nil, unsafe.Pointer(c.bucket_caps_bytes), int64(c.num_bucket_caps), "bucket_caps_bytes", planner.ErrInvalidConfig)
	if err != nil {
		return planner.Settings{}, err
	}
	maxPieces := int64(c.max_pieces)
	if int64(int(maxPieces)) != maxPieces {
		return planner.Settings{}, invalidConfig("goddp: max_pieces = %d does not fit in an int", maxPieces)
	}
	s := planner.Settings{
		Mode:                    planner.Mode(c.mode),
		UserBucketCapBytes:      int64(c.bucket_cap_bytes), // GODDP_CAP_NOT_GIVEN is planner.CapNotGiven
		UserFirstBucketCapBytes: int64(c.first_bucket_cap_bytes),
		UserBucketCapsBytes:     caps,
		MaxPieces:               int(maxPieces),
		AlignBuckets:            c.align_buckets != 0,
		BucketOrder:             planner.BucketOrder(c.bucket_order),
		BlockCuts:               c.block_cuts != 0,
		Edges:                   planner.EdgePolicy(c.edges),
		UniformCaps:             c.uniform_caps != 0,
	}
	if s.DDP, err = ddpFromC(c.ddp); err != nil {
		return planner.Settings{}, err
	}
	return s, nil
}

// ddpFromC copies a goddp_ddp; NULL means no DDP module.
func ddpFromC(d *C.goddp_ddp) (*planner.DDPSettings, error) {
	if d == nil {
		return nil, nil
	}
	const knownFlags = C.GODDP_DDP_FIND_UNUSED_PARAMETERS | C.GODDP_DDP_STATIC_GRAPH | C.GODDP_DDP_CAP_IS_DEFAULT |
		C.GODDP_DDP_NO_PER_BUCKET_CAPS | C.GODDP_DDP_PYTHON_REDUCER | C.GODDP_DDP_MIXED_PRECISION |
		C.GODDP_DDP_BUILTIN_COMM_HOOK
	if d.flags&^knownFlags != 0 {
		return nil, invalidConfig("goddp: ddp.flags = %#x has unknown bits (valid: the GODDP_DDP_* bits of goddp.h, mask %#x)", uint32(d.flags), uint32(knownFlags))
	}
	has := func(bit C.uint32_t) bool { return d.flags&bit != 0 }
	caps, err := cCopy[int64](nil, unsafe.Pointer(d.bucket_caps_bytes), int64(d.num_bucket_caps), "ddp.bucket_caps_bytes", planner.ErrInvalidConfig)
	if err != nil {
		return nil, err
	}
	numParams := int64(d.num_params)
	if numParams < 0 || numParams >= maxArrayLen {
		return nil, invalidConfig("goddp: ddp.num_params = %d is out of range [0, %d)", numParams, int64(maxArrayLen))
	}
	return &planner.DDPSettings{
		BucketCapBytes:       int64(d.bucket_cap_bytes),
		CapIsDefault:         has(C.GODDP_DDP_CAP_IS_DEFAULT),
		FirstBucketCapBytes:  int64(d.first_bucket_cap_bytes),
		BucketCapsBytes:      caps,
		FindUnusedParameters: has(C.GODDP_DDP_FIND_UNUSED_PARAMETERS),
		StaticGraph:          has(C.GODDP_DDP_STATIC_GRAPH),
		NoPerBucketCaps:      has(C.GODDP_DDP_NO_PER_BUCKET_CAPS),
		PythonReducer:        has(C.GODDP_DDP_PYTHON_REDUCER),
		MixedPrecision:       has(C.GODDP_DDP_MIXED_PRECISION),
		BuiltinCommHook:      has(C.GODDP_DDP_BUILTIN_COMM_HOOK),
		NumParams:            int(numParams),
	}, nil
}

// cAlloc allocates n elements of E in C memory and returns the pointer with a
// Go view for filling it. n == 0 gives a NULL pointer, as the ABI allows for
// empty arrays.
func cAlloc[E any](n int) (unsafe.Pointer, []E, error) {
	if n == 0 {
		return nil, nil, nil
	}
	var zero E
	p := C.malloc(C.size_t(uintptr(n) * unsafe.Sizeof(zero)))
	if p == nil {
		return nil, nil, errOutOfMemory
	}
	return p, unsafe.Slice((*E)(p), n), nil
}

// cCSR flattens per-item lists into a malloc'd offsets array of length
// len(lists)+1 and a malloc'd values array.
func cCSR(lists [][]int32) (offsets, values unsafe.Pointer, err error) {
	offsets, offs, err := cAlloc[int64](len(lists) + 1)
	if err != nil {
		return nil, nil, err
	}
	total := 0
	offs[0] = 0
	for i, l := range lists {
		total += len(l)
		offs[i+1] = int64(total)
	}
	values, vals, err := cAlloc[int32](total)
	if err != nil {
		C.free(offsets)
		return nil, nil, err
	}
	at := 0
	for _, l := range lists {
		at += copy(vals[at:], l)
	}
	return offsets, values, nil
}

// planToC copies a decision into C memory: a calloc'd goddp_plan whose
// arrays and strings are all malloc'd. Nothing in it points into Go memory.
// On error everything allocated so far is freed.
func planToC(d *planner.Decision) (_ *C.goddp_plan, err error) {
	p := d.Plan
	if len(p.PieceInputs) != p.NumPieces || len(p.PieceOutputs) != p.NumPieces {
		// A planner bug, reported as GODDP_ERR_INTERNAL.
		return nil, fmt.Errorf("goddp: planner returned %d input and %d output lists for %d pieces",
			len(p.PieceInputs), len(p.PieceOutputs), p.NumPieces)
	}
	// calloc: every array pointer starts NULL, so freeing a half-built plan
	// is safe.
	cp := (*C.goddp_plan)(C.calloc(1, C.sizeof_goddp_plan))
	if cp == nil {
		return nil, errOutOfMemory
	}
	defer func() {
		if err != nil {
			freePlan(cp)
		}
	}()

	cp.fingerprint = C.uint64_t(p.Fingerprint)
	cp.num_nodes = C.int64_t(len(p.NodePiece))
	cp.num_pieces = C.int64_t(p.NumPieces)
	cp.num_buckets = C.int64_t(len(p.Buckets))

	ptr, nodeParts, err := cAlloc[int32](len(p.NodePiece))
	if err != nil {
		return nil, err
	}
	cp.node_pieces = (*C.int32_t)(ptr)
	copy(nodeParts, p.NodePiece)

	nb := len(p.Buckets)
	ptr, bucketBytes, err := cAlloc[int64](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_bytes = (*C.int64_t)(ptr)
	ptr, bucketParts, err := cAlloc[int32](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_pieces = (*C.int32_t)(ptr)
	ptr, nodeBegin, err := cAlloc[int64](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_node_begin = (*C.int64_t)(ptr)
	ptr, nodeEnd, err := cAlloc[int64](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_node_end = (*C.int64_t)(ptr)
	ptr, extended, err := cAlloc[uint8](nb)
	if err != nil {
		return nil, err
	}
	cp.bucket_extended = (*C.uint8_t)(ptr)
	bucketParams := make([][]int32, nb)
	for i, b := range p.Buckets {
		bucketBytes[i] = b.Bytes
		bucketParts[i] = int32(b.Piece)
		nodeBegin[i] = int64(b.NodeBegin)
		nodeEnd[i] = int64(b.NodeEnd)
		extended[i] = 0
		if b.Extended {
			extended[i] = 1
		}
		bucketParams[i] = b.Params
	}
	offs, vals, err := cCSR(bucketParams)
	if err != nil {
		return nil, err
	}
	cp.bucket_param_offsets, cp.bucket_params = (*C.int64_t)(offs), (*C.int32_t)(vals)

	if offs, vals, err = cCSR(p.PieceInputs); err != nil {
		return nil, err
	}
	cp.piece_input_offsets, cp.piece_inputs = (*C.int64_t)(offs), (*C.int32_t)(vals)
	if offs, vals, err = cCSR(p.PieceOutputs); err != nil {
		return nil, err
	}
	cp.piece_output_offsets, cp.piece_outputs = (*C.int64_t)(offs), (*C.int32_t)(vals)

	cp.alignment = C.int32_t(p.Alignment)
	cp.merged_cuts = C.int64_t(p.MergedCuts)
	cp.block_runs = 0
	if p.BlockRuns {
		cp.block_runs = 1
	}
	ptr, caps, err := cAlloc[int64](len(p.DDPCaps))
	if err != nil {
		return nil, err
	}
	cp.ddp_caps, cp.num_ddp_caps = (*C.int64_t)(ptr), C.int64_t(len(p.DDPCaps))
	copy(caps, p.DDPCaps)
	return cp, decisionToC(cp, d)
}

// decisionToC fills the ABI 6 fields of cp from d.
func decisionToC(cp *C.goddp_plan, d *planner.Decision) error {
	cfg := &d.Config
	cp.bucket_cap_bytes = C.int64_t(cfg.BucketCapBytes)
	cp.first_bucket_cap_bytes = C.int64_t(cfg.FirstBucketCapBytes)
	ptr, caps, err := cAlloc[int64](len(cfg.BucketCapsBytes))
	if err != nil {
		return err
	}
	cp.bucket_caps_bytes, cp.num_bucket_caps = (*C.int64_t)(ptr), C.int64_t(len(caps))
	copy(caps, cfg.BucketCapsBytes)
	cp.max_pieces = C.int64_t(cfg.MaxPieces)
	cp.align_buckets = 0
	if cfg.AlignBuckets {
		cp.align_buckets = 1
	}
	cp.bucket_order = C.int32_t(cfg.BucketOrder)
	cp.align_reason = C.int32_t(d.AlignReason)
	cp.ddp_bucket_order = C.int32_t(d.DDPBucketOrder)
	cp.checkpoint_regions = 0
	if d.CheckpointRegions {
		cp.checkpoint_regions = 1
	}
	cp.aligned_params = C.int64_t(d.AlignedParams)
	cp.num_counted_params = C.int64_t(d.CountedParams)
	offs, vals, err := cCSR(d.PieceParams)
	if err != nil {
		return err
	}
	cp.piece_param_offsets, cp.piece_params = (*C.int64_t)(offs), (*C.int32_t)(vals)
	ptr, eager, err := cAlloc[int32](len(d.EagerPieces))
	if err != nil {
		return err
	}
	cp.eager_pieces, cp.num_eager_pieces = (*C.int32_t)(ptr), C.int64_t(len(eager))
	copy(eager, d.EagerPieces)
	if d.BlockIDs != nil {
		ptr, blocks, err := cAlloc[int32](len(d.BlockIDs))
		if err != nil {
			return err
		}
		cp.node_block_ids = (*C.int32_t)(ptr)
		copy(blocks, d.BlockIDs)
	}
	return nil
}

// freePlan releases a plan built by planToC; free(NULL) is a no-op, so a
// half-built plan is released the same way.
func freePlan(cp *C.goddp_plan) {
	if cp == nil {
		return
	}
	for _, p := range []unsafe.Pointer{
		unsafe.Pointer(cp.node_pieces),
		unsafe.Pointer(cp.bucket_bytes),
		unsafe.Pointer(cp.bucket_pieces),
		unsafe.Pointer(cp.bucket_node_begin),
		unsafe.Pointer(cp.bucket_node_end),
		unsafe.Pointer(cp.bucket_extended),
		unsafe.Pointer(cp.bucket_param_offsets),
		unsafe.Pointer(cp.bucket_params),
		unsafe.Pointer(cp.piece_input_offsets),
		unsafe.Pointer(cp.piece_inputs),
		unsafe.Pointer(cp.piece_output_offsets),
		unsafe.Pointer(cp.piece_outputs),
		unsafe.Pointer(cp.ddp_caps),
		unsafe.Pointer(cp.bucket_caps_bytes),
		unsafe.Pointer(cp.piece_param_offsets),
		unsafe.Pointer(cp.piece_params),
		unsafe.Pointer(cp.eager_pieces),
		unsafe.Pointer(cp.node_block_ids),
	} {
		C.free(p)
	}
	C.free(unsafe.Pointer(cp))
}
