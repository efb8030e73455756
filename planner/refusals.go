package planner

// This file holds the reasons why DDP's buckets cannot be set to the pieces
// that follow from facts about the DDP module alone (the caller reads the
// facts; DDPSettings carries them as flags).
//
// Note [Alignment refusals]: goddp aligns DDP's buckets by handing DDP
// per-bucket caps and rebuilding its reducer. That is refused, in this fixed
// order (the first that applies is the reason), when: the torch keeps no
// per-bucket caps; DDP runs its Python reducer (no per-bucket caps there
// either); DDP mixed precision is on; or a built-in comm hook is registered
// that the caller cannot identify (DDP keeps no record of it but a name in
// its logging data; a known one is registered again on the rebuilt reducer).
// DDP's buckets are then its own and the plan is the unaligned one. The
// caller's own refusals (a stand-in DDP, a DDP it could not inspect) come
// before any of these. Parameters of several (dtype, device) groups refuse
// nothing: they are aligned (Note [Several dtype groups], keys.go; Note
// [Declaration order per group], declorder.go; a split forward's by
// CombineForward), and Decide keeps DDP's own buckets only where they
// launch earlier (ReasonGroupsLater). static_graph refuses nothing: the caller sets it
// again on the reducer it rebuilds, which then records its first iteration
// afresh and rebuilds its buckets to the caps (Note [Static graph across a
// rebuild] in python/goddp/ddp/private.py). Nor does
// delay_all_reduce_named_params: DDP counts the delayed parameters among
// those it ignores, so they are in no bucket, the plan's buckets leave them
// out as they leave out ignored ones, and DDP's own allreduce of them (a
// gradient hook and a buffer, outside the reducer) outlives the rebuild.

// refusal is the first reason of Note [Alignment refusals] that applies to
// d, or ReasonAligned when none does.
func (d *DDPSettings) refusal() AlignReason {
	switch {
	case d.NoPerBucketCaps:
		return ReasonNoPerBucketCaps
	case d.PythonReducer:
		return ReasonPythonReducer
	case d.MixedPrecision:
		return ReasonMixedPrecision
	case d.BuiltinCommHook:
		return ReasonBuiltinCommHook
	}
	return ReasonAligned
}
