// Package planner decides where to cut the forward graph of a model wrapped
// in DistributedDataParallel so that each piece's gradients form one
// allreduce bucket, letting that bucket's allreduce start while the rest of
// backward still runs.
//
// The graph model is flat and array based (see Graph) so that it crosses a C
// ABI without per-element calls. Build validates a graph and a Config and
// returns a Plan: a piece index for every node, the bucket list in DDP order,
// the values that cross each cut, and a fingerprint that every rank can
// compare before the first collective.
//
// # Pieces
//
// Placeholders and the output node belong to no piece (NodePiece -1).
// Every other node ("compute node") belongs to exactly one piece; pieces are
// contiguous runs of compute nodes in forward order, numbered from 0, none
// empty. A graph without compute nodes has no pieces. Parameter references
// on placeholders or on the output node are not uses: those nodes run in no
// piece, so neither mode counts them.
//
// # ModeTorch
//
// ModeTorch reproduces torch's DDPOptimizer (torch/_dynamo/backends/
// distributed.py) so that its cuts can be checked against torch itself.
// Compute nodes are walked from last to first. Before a node joins the
// current bucket, the bucket is checked: when its size has reached
// BucketCapBytes, or FirstBucketCapBytes while it is the only bucket, it is
// closed if one of its nodes has a user outside it (a later bucket or the
// output node), and otherwise it keeps growing and is marked Extended. A node
// then adds the storage bytes of the parameters torch counts for it:
//
//   - RefArg on call_function and call_method nodes, at every use (a
//     parameter passed twice is counted twice);
//   - RefModule on call_module and call_method nodes, only at the first node
//     (in the reverse walk) that calls that ModuleID, which marks the
//     module seen even if that node refers to none of its parameters;
//   - RefAttr on get_attr nodes, at every use;
//   - never RefOther, and never a kind on an op not listed for it.
//
// Only parameters with RequiresGrad and not Ignored count. After the walk,
// a forward-first bucket that counted nothing is merged into the next one.
// Buckets map one to one to pieces. Bucket.Bytes includes repeated counting;
// Bucket.Params lists each parameter once per bucket, in counting order; the
// node range is the bucket's whole node range; DType and Device are -1.
//
// Where torch would fail an assertion (a size-0 forward-first bucket that
// lists a zero-byte parameter), ModeTorch merges the bucket anyway.
//
// # ModeDDP
//
// ModeDDP (the default) predicts the buckets DDP builds when it rebuilds
// them after the first iteration, and cuts the graph where they close. Each
// parameter that DDP reduces (RequiresGrad, not Ignored) counts once, with
// Bytes (numel × element size), at its earliest forward use by any reference
// kind. Its gradient is complete once backward passes that node, so the
// predicted ready order is the reverse forward order of first uses, and,
// within one node, the reverse of the listed order (for linear(x, w, b) the
// bias is ready before the weight, as DDP reports for nn.Linear).
//
// The ready order feeds a simulation of DDP's bucket assignment: buckets are
// grouped by (DType, Device); each key keeps its own position in the cap
// list (BucketCapsBytes if given, else FirstBucketCapBytes then
// BucketCapBytes, the last cap repeating); a parameter joins its key's open
// bucket, which closes once its bytes reach the key's current cap. Buckets
// still open at the end follow in the order of their first parameter.
//
// A bucket that closes at node i asks for a cut just before i, so the piece
// that starts at i completes the bucket's last gradient. If that piece would
// have no node used outside it, the cut moves to earlier nodes until it has
// one, and the bucket is marked Extended; buckets closing within one piece
// share one cut. A forward-first piece that would hold no counted parameter
// or have no output is merged into the next piece. With MaxPieces > 0,
// adjacent pieces are then merged, always removing the cut whose removal
// yields the smallest merged piece (by counted bytes; ties to the
// forward-first cut), until at most MaxPieces remain; this decouples the
// number of pieces from the bucket size. Bucket.Piece is the piece
// holding the forward-first use of the bucket's parameters, and NodeBegin and
// NodeEnd span the first uses of its parameters.
//
// Bound: a bucket exceeds the cap it was filled against by less than the
// bytes of the last parameter added to it (bytes - last < cap); a bucket that
// did not close (the last one of its key) stays below its cap.
//
// # Aligned buckets
//
// With Config.AlignBuckets (ModeDDP only), once the cuts are final,
// MaxPieces merging included, the predicted buckets are replaced by one
// bucket per piece, in DDP order (bucket k is piece N-1-k): the counted
// parameters first used in the piece, in predicted ready order, with their
// exact byte total; Piece is the piece, NodeBegin and NodeEnd span those
// first uses, and Extended says whether a predicted bucket completed by the
// piece was Extended. The cuts do not change. The byte totals are meant to
// be DDP's per-bucket caps: the cumulative byte count at each piece boundary
// does not depend on the order of the gradients within a piece, so DDP's
// rebuild closes each bucket exactly at a piece boundary whatever that
// order. DDP walks the caps once per (dtype, device) key: with several keys
// the buckets are split by key and the caps chosen for every key at once
// (Note [Several dtype groups], keys.go; under OrderDeclaration, Note
// [Declaration order per group], declorder.go). A piece without counted
// parameters gets no bucket, which happens
// only for a single-piece plan. Zero-byte parameters are the one exception
// to exact alignment: one that DDP sees after its piece's bytes reached the
// cap joins the next DDP bucket (it is ready already, so overlap does not
// suffer).
//
// # Declaration order
//
// With AlignBuckets and Config.BucketOrder OrderDeclaration (DDP with
// find_unused_parameters=True and no static_graph, which never rebuilds its
// buckets), the buckets and caps are meant for DDP's construction-time
// bucketing, which walks its parameter list (Param.DDPPosition, required
// for every counted parameter) first-declared first against the caps and
// lists the buckets last-declared first. DDP launches buckets in that
// order, so a bucket starting at declaration position k can launch when
// backward finishes the piece min(label[k:]), label being each declared
// parameter's piece of first use (the last piece for an unused one). The
// plan cuts the declaration order where that suffix minimum changes, one
// bucket per distinct value, and keeps the cut at the start of exactly those
// pieces; the other cuts go (no caps could start a bucket at their end).
// Then bucket k completes, and can launch, when piece N-1-k's backward
// ends; Plan.DDPCaps lists the buckets' bytes first-declared first, the
// order DDP walks them. Plan.Alignment says AlignDeclaration, or
// AlignDeclarationMerged with Plan.MergedCuts > 0, or with several (dtype,
// device) groups AlignDeclarationGroups. Under OrderReady,
// Plan.DDPCaps are the aligned buckets' bytes in DDP order (AlignReady).
//
// # Where real DDP buckets can differ from ModeDDP's
//
//   - The ready order is a prediction. Within one node the real order
//     depends on the op's backward: the reverse listed order matches
//     nn.Linear (bias first) but not LayerNorm, which readies its weight
//     first, so a bucket boundary between two parameters of one node can
//     fall on the other side in DDP. Gradients of different nodes can also
//     become ready in an order other than reverse forward order when
//     backward has parallel branches.
//   - Keys walk the cap list independently, so with mixed dtypes or devices
//     the buckets of different keys interleave in DDP order, and a bucket of
//     one key may span cuts made for another.
//   - DDP appends still-open buckets in hash-map order; ModeDDP orders them
//     by first parameter so that every rank agrees.
//   - With find_unused_parameters=True and no static_graph, DDP never
//     rebuilds its buckets and keeps its initial ones, built in parameter
//     declaration order. The predicted buckets ignore that; with
//     AlignBuckets and BucketOrder OrderDeclaration the plan aligns those
//     buckets instead (see "Declaration order").
//   - Parameters that no compute node uses belong to no bucket here, while
//     DDP still buckets them.
//   - Each Dynamo frame is planned alone, while DDP buckets the whole
//     model, so its buckets can straddle a graph break.
//
// # Block-aligned cuts
//
// When Graph.BlockIDs marks at least two runs of repeated module blocks
// (transformer layers), ModeDDP cuts at block boundaries instead of where
// buckets close, so that every block piece is the same graph and can be
// compiled once; buckets then span several consecutive pieces. With
// AlignBuckets the buckets are groups of pieces whose bytes are nearest to
// the caps (tolerance: half a boundary piece); a block larger than the cap
// is a bucket of its own. ModeTorch ignores BlockIDs. See blocks.go.
//
// # Timeline
//
// PredictTimeline and PlanTimeline model a backward step with DDP's
// overlapped allreduces from numbers alone (per unit its backward time and
// gradient bytes, an allreduce cost, a launch overhead, a compute
// slowdown) and choose the bucket boundaries that minimise the predicted
// step. They take no Graph. See timeline.go, Note [Timeline].
//
// # Fingerprint
//
// Plan.Fingerprint is 64-bit FNV-1a over a canonical little-endian encoding
// of a format version, the config, the graph arrays, the parameter table
// (names included) and the resulting NodePiece and buckets.
//
// The package keeps no global mutable state; Build is safe to call from
// several goroutines at once, and planning is linear in nodes + edges (apart
// from sorting the distinct (dtype, device) keys and module identities).
package planner
