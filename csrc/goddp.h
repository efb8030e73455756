/*
 * goddp.h: the C ABI of the goddp planning core.
 *
 * The planner (Go, package planner) decides where to cut a forward FX graph
 * so that each piece's gradients form one DistributedDataParallel allreduce
 * bucket. This header is the whole contract between that core and its
 * callers: goddp's Python binding (python/goddp/native/extension.py, which
 * reads this header's declarations with cffi and loads libgoddp.so) and any
 * C program that links libgoddp.so (see tests/c/plan_toy.c).
 *
 * Conventions
 *   - Every array is flat. Variable-length per-item lists use CSR form: an
 *     offsets array of length count+1 (offsets[0] == 0, non-decreasing) and a
 *     values array of length offsets[count].
 *   - Node indices are positions in forward (topological) order, 0-based.
 *
 * Ownership
 *   - Inputs (goddp_graph, goddp_config and every array they point to) are
 *     owned by the caller and only read for the duration of the call. The
 *     planner copies what it needs; nothing is retained after return.
 *   - Outputs are allocated by the library with C malloc: a goddp_plan is
 *     released with goddp_plan_free, an error message with goddp_string_free.
 *     No pointer into Go memory ever reaches the caller, and C never keeps
 *     a Go pointer.
 *
 * Errors
 *   - Every function that can fail returns a goddp_status. On failure *out is
 *     left NULL and, if err_msg is non-NULL, *err_msg receives a
 *     NUL-terminated, malloc'd, human-readable message.
 *   - A Go panic inside any export is recovered and reported as
 *     GODDP_ERR_PANIC; it never unwinds into the caller.
 *
 * Thread safety
 *   - All functions may be called from several threads at once. The planner
 *     keeps no global mutable state; each call works on its own copies.
 *   - Callers embedding the library in an interpreter should release their
 *     interpreter lock around goddp_plan_graph.
 *   - Fork: the Go runtime does not survive fork(). A child process must not
 *     call any function here if the library was loaded before the fork; the
 *     Python binding enforces this and raises an error instead.
 *
 * Declarations
 *   - Everything between the lines "cdef: begin" and "cdef: end" below is
 *     plain C declarations that cffi's cdef takes (no preprocessor
 *     conditionals or includes; #define only for integer constants): the
 *     Python binding reads its structs, enums and constants from there and
 *     copies none of them.
 */
#ifndef GODDP_H
#define GODDP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef: begin */

/* The ABI's version. Compatibility is equality: a caller compares
 * goddp_abi_version() (the library it loaded) with the GODDP_ABI_VERSION it
 * was built or generated from, and refuses a library of another version.
 * The version goes up with any change that would break a caller built
 * against the previous header: a struct field added, removed, moved or
 * retyped (the caller lays out the input structs), a function's signature
 * or the keys of a JSON request or reply changed, an enum value or flag bit
 * renumbered. A new function, enum value or flag bit leaves it alone.
 * Layout digests name the build (goddp_layout.build), so ranks of two
 * versions never agree on a layout. */
#define GODDP_ABI_VERSION 15

/* FX node kinds, as in torch.fx.Node.op. */
enum goddp_op {
    GODDP_OP_PLACEHOLDER = 0,
    GODDP_OP_GET_ATTR = 1,
    GODDP_OP_CALL_MODULE = 2,
    GODDP_OP_CALL_FUNCTION = 3,
    GODDP_OP_CALL_METHOD = 4,
    GODDP_OP_OUTPUT = 5
};

/* How a node refers to a parameter (goddp_graph.node_param_refs). torch
 * mode needs the distinction because torch's DDPOptimizer counts each kind
 * differently; ddp mode treats every reference alike. */
enum goddp_ref {
    GODDP_REF_ARG = 0,    /* a placeholder holding the parameter, passed as a positional arg */
    GODDP_REF_OTHER = 1,  /* any other use: kwargs, nested containers */
    GODDP_REF_MODULE = 2, /* owned by the module a call_module/call_method node calls */
    GODDP_REF_ATTR = 3    /* fetched by a get_attr node */
};

/* Bits of goddp_graph.param_flags. */
#define GODDP_PARAM_REQUIRES_GRAD 0x1u
#define GODDP_PARAM_DDP_IGNORED 0x2u

enum goddp_mode {
    GODDP_MODE_DDP = 0,  /* match the buckets DDP builds after its rebuild (default) */
    GODDP_MODE_TORCH = 1 /* reproduce torch's DDPOptimizer, quirks included */
};

/* The order in which DDP fills the buckets it reduces with
 * (goddp_config.bucket_order). */
enum goddp_bucket_order {
    GODDP_ORDER_READY = 0,      /* DDP rebuilds its buckets from gradient-ready order (the default) */
    GODDP_ORDER_DECLARATION = 1 /* find_unused_parameters=True without static_graph: DDP never rebuilds
                                 * and keeps buckets filled in declaration order */
};

/* How a plan's buckets relate to DDP's (goddp_plan.alignment). */
enum goddp_alignment {
    GODDP_ALIGN_NONE = 0,                /* the buckets DDP is predicted to build */
    GODDP_ALIGN_READY = 1,               /* one per piece; ddp_caps align DDP's rebuild */
    GODDP_ALIGN_DECLARATION = 2,         /* one per piece; ddp_caps align DDP's declaration-order buckets */
    GODDP_ALIGN_DECLARATION_MERGED = 3,  /* the same after merging pieces the declaration order interleaves */
    GODDP_ALIGN_READY_GROUPS = 4,        /* as READY, one bucket per (dtype, device) group and unit run; merged_cuts
                                          * unit boundaries close no bucket (planner/keys.go) */
    GODDP_ALIGN_DECLARATION_GROUPS = 5   /* as DECLARATION_MERGED, one bucket per (dtype, device) group and run of
                                          * declaration units (planner/declorder.go) */
};

/* Whether DDP's buckets are set to the pieces, and if not why
 * (goddp_plan.align_reason; the caller words it, NOT_COVERED and
 * PART_OF_FORWARD with goddp_plan.aligned_params). */
enum goddp_align_reason {
    GODDP_REASON_ALIGNED = 0,     /* the buckets are DDP's; ddp_caps are its caps */
    GODDP_REASON_OFF = 1,         /* config.align_buckets was 0 */
    GODDP_REASON_NOT_COVERED = 2, /* aligned buckets would not hold exactly DDP's parameters: planned unaligned */
    GODDP_REASON_ONE_PIECE = 3,   /* the aligned plan is one piece: nothing to align */
    GODDP_REASON_PART_OF_FORWARD = 4, /* as NOT_COVERED, ready order: the aligned plan is kept for
                                       * goddp_combine_forward with the forward's other graphs */
    GODDP_REASON_NO_PARAMS = 5,   /* the graph holds no parameter DDP reduces: one piece, no bucket,
                                   * planned before any cap is checked (Note [Parameter-free graphs]) */
    /* A fact about the DDP module refuses alignment (goddp_ddp.flags; Note
     * [Alignment refusals], in this order); planned unaligned. */
    GODDP_REASON_NO_PER_BUCKET_CAPS = 6, /* GODDP_DDP_NO_PER_BUCKET_CAPS */
    GODDP_REASON_PYTHON_REDUCER = 7,     /* GODDP_DDP_PYTHON_REDUCER */
    /* 8, 11 and 12 were static_graph, delay_all_reduce_named_params and several (dtype, device)
     * groups, aligned since; ABI 14 and 15 removed them. */
    GODDP_REASON_MIXED_PRECISION = 9,    /* GODDP_DDP_MIXED_PRECISION */
    GODDP_REASON_BUILTIN_COMM_HOOK = 10, /* GODDP_DDP_BUILTIN_COMM_HOOK */
    GODDP_REASON_GROUPS_LATER = 13       /* several (dtype, device) groups whose per-group caps would launch DDP's
                                          * buckets later than its own (planner/keys.go, planner/declorder.go) */
};

/* Which edge pieces (outside the repeated blocks) run eagerly
 * (goddp_config.edges; planner/edges.go, Note [Edges]). */
enum goddp_edges {
    GODDP_EDGES_COMPILE = 0, /* none */
    GODDP_EDGES_AUTO = 1,    /* those whose unfused traffic is a negligible share of the step (node_flops, node_bytes) */
    GODDP_EDGES_EAGER = 2    /* every edge */
};

/* A cap not given (ABI 11): goddp_config's bucket_cap_bytes and
 * first_bucket_cap_bytes, which the planner then fills in
 * (planner/settings.go, Note [Cap defaults]), and goddp_ddp's
 * first_bucket_cap_bytes where this torch keeps none. A zero-initialized
 * config asks for every default. */
#define GODDP_CAP_NOT_GIVEN 0

/* Bits of goddp_ddp.flags. Unknown bits are GODDP_ERR_INVALID_CONFIG. */
#define GODDP_DDP_FIND_UNUSED_PARAMETERS 0x1u
#define GODDP_DDP_STATIC_GRAPH 0x2u
#define GODDP_DDP_CAP_IS_DEFAULT 0x4u /* built with the default bucket_cap_mb */
/* Facts that refuse alignment (planner/refusals.go, Note [Alignment
 * refusals]; with config.align_buckets the first that applies, in the
 * order of the GODDP_REASON_* codes, is the plan's align_reason).
 * GODDP_DDP_STATIC_GRAPH no longer refuses (static_graph is aligned). */
#define GODDP_DDP_NO_PER_BUCKET_CAPS 0x8u /* this torch's DDP keeps no per-bucket caps (torch < 2.9) */
#define GODDP_DDP_PYTHON_REDUCER 0x10u /* DDP runs its Python reducer (compiled autograd) */
#define GODDP_DDP_MIXED_PRECISION 0x20u /* DDP mixed precision is on */
#define GODDP_DDP_BUILTIN_COMM_HOOK 0x40u /* a built-in (C++) comm hook goddp cannot identify is registered */
/* 0x80u and 0x100u were delay_all_reduce_named_params and several (dtype,
 * device) groups, which refuse nothing (ABI 14 and 15 removed them). */

typedef enum goddp_status {
    GODDP_OK = 0,
    GODDP_ERR_INVALID_CONFIG = 1, /* a bad cap, mode or option */
    GODDP_ERR_INVALID_GRAPH = 2,  /* malformed arrays, bad indices, backward edges, no output */
    GODDP_ERR_OVERFLOW = 3,       /* sizes whose sums overflow int64 */
    GODDP_ERR_PANIC = 4,          /* a recovered Go panic: a bug in goddp, please report */
    GODDP_ERR_INTERNAL = 5        /* any other failure, such as out of memory */
} goddp_status;

/* One of the caller's arrays: the spans of goddp_graph, goddp_forward and
 * goddp_layout. Optional there: num_spans 0 means none, and the
 * caller vouches that every array holds what the counts and offsets say.
 * With spans, an array that begins a span and does not fill it exactly,
 * or one that holds fewer items than the counts and offsets say, is an
 * error naming the field
 * (GODDP_ERR_INVALID_GRAPH for a graph, GODDP_ERR_INVALID_CONFIG
 * otherwise), never a read past it: a binding that holds buffers of known
 * size (the Python one) passes them here and checks no length itself. */
typedef struct goddp_span {
    const void *data;
    int64_t bytes;
} goddp_span;

/* A forward graph. All pointers may be NULL only when their length is 0. */
typedef struct goddp_graph {
    int64_t num_nodes;
    const int32_t *node_ops;            /* [num_nodes] enum goddp_op */
    const int32_t *node_module_ids;     /* [num_nodes] module identity for call_module/call_method, -1 otherwise */

    /* Parameters each node refers to, in argument order (CSR). */
    const int64_t *node_param_offsets;  /* [num_nodes + 1] */
    const int32_t *node_params;         /* parameter indices */
    const uint8_t *node_param_refs;     /* enum goddp_ref, parallel to node_params */

    /* Users of each node (CSR): every user index must be greater than the node's. */
    const int64_t *node_user_offsets;   /* [num_nodes + 1] */
    const int32_t *node_users;

    int64_t num_params;
    const int64_t *param_bytes;         /* numel * element_size */
    const int64_t *param_storage_bytes; /* untyped_storage().nbytes() */
    const int32_t *param_dtypes;        /* opaque dtype code: equal codes mean equal dtypes */
    const int32_t *param_devices;       /* opaque device code */
    const uint32_t *param_flags;        /* GODDP_PARAM_* bits */
    const int64_t *param_name_offsets;  /* [num_params + 1] byte offsets into param_names */
    const char *param_names;            /* UTF-8 fully qualified names, not NUL-separated */

    /* Optional, ddp mode (ABI 4); NULL: no block information. Per node, the
     * instance of a repeated module block (a transformer layer) it belongs
     * to, numbered from 0, or -1. With at least two block runs, ddp mode
     * cuts at block boundaries so that block pieces are identical graphs,
     * and each bucket spans consecutive pieces (see planner/blocks.go).
     * torch mode ignores it. Values below -1 are GODDP_ERR_INVALID_GRAPH. */
    const int32_t *node_block_ids;      /* [num_nodes] or NULL */

    /* Optional (ABI 5). NULL, or [num_params]: each parameter's index in
     * DDP's own parameter list (declaration order), -1 where DDP does not
     * reduce it. Read only with config.bucket_order ==
     * GODDP_ORDER_DECLARATION, which requires it (one distinct position
     * per counted parameter). */
    const int32_t *param_ddp_positions;

    /* Optional (ABI 6); node_stack_offsets NULL: no module stacks. Each
     * node's module stack (Dynamo's nn_module_stack), outermost first, in
     * interned form: entry k names its module's path and type by index into
     * a string table (CSR over module_strings). With config.block_cuts the
     * planner assigns the repeated blocks from them (planner/modstack.go,
     * Note [Block rule]); together with node_block_ids they are
     * GODDP_ERR_INVALID_GRAPH. */
    int64_t num_module_strings;
    const int64_t *module_string_offsets; /* [num_module_strings + 1] byte offsets into module_strings */
    const char *module_strings;           /* UTF-8, not NUL-separated */
    const int64_t *node_stack_offsets;    /* [num_nodes + 1] or NULL */
    const int32_t *node_stack_paths;      /* [node_stack_offsets[num_nodes]] string index of the path */
    const int32_t *node_stack_types;      /* [node_stack_offsets[num_nodes]] string index of the type */

    /* Optional (ABI 7), read with the module stacks; NULL: one each. How
     * many compute nodes each node stands for in the block rule's instance
     * sizes and the edges' sizes: an activation checkpoint call its body's,
     * its get_attr and getitems 0 (planner/modstack.go, Note [Node
     * weights]). Negative weights are GODDP_ERR_INVALID_GRAPH. */
    const int32_t *node_weights;          /* [num_nodes] or NULL */

    /* Optional (ABI 10), read with the module stacks, all five or none
     * (node_hop_calls NULL: none); not with node_weights. Facts about the
     * higher-order-op calls (activation checkpoints): per node, the call
     * it belongs to (a call its own index; its body's get_attr and its
     * result getitems, the call's; any other node -1), and per call the
     * module stacks of its body's compute nodes, flattened through nested
     * calls, in order (CSR over body nodes, then CSR over entries naming
     * module_strings, like node_stack_*). From them the planner derives a
     * call's stack (the common prefix of its body's), its companions'
     * (the call's) and every node's weight, in place of the given stacks
     * and node_weights (planner/bodies.go, Note [Body stacks]). A body on
     * a node that is no call, a node belonging to a node that is no call,
     * or a string index out of range is GODDP_ERR_INVALID_GRAPH. */
    const int32_t *node_hop_calls;        /* [num_nodes] or NULL */
    const int64_t *node_body_offsets;     /* [num_nodes + 1]: body nodes of each call */
    const int64_t *body_stack_offsets;    /* [node_body_offsets[num_nodes] + 1]: entries of each body node */
    const int32_t *body_stack_paths;      /* [body_stack_offsets[last]] string index of the path */
    const int32_t *body_stack_types;      /* [body_stack_offsets[last]] string index of the type */

    /* Optional (ABI 12), both or neither: per node, what it costs to run,
     * estimated from its shapes, both >= 0 (planner/edges.go, Note [Edge
     * costs]). node_flops: the floating-point work of the library kernels
     * it calls (matrix products, convolutions, attention), the same
     * compiled or not; node_bytes: the memory it reads and writes when it
     * runs unfused, what compiling may save. With them edges "auto" keeps
     * eager only the edges whose unfused traffic is a negligible share of
     * the step; without them it compiles every edge. */
    const int64_t *node_flops;            /* [num_nodes] or NULL */
    const int64_t *node_bytes;            /* [num_nodes] or NULL */
    int64_t num_spans;                    /* optional: the caller's arrays (goddp_span) */
    const goddp_span *spans;
} goddp_graph;

/* A DistributedDataParallel module's own settings (goddp_config.ddp, ABI 6). */
typedef struct goddp_ddp {
    int64_t bucket_cap_bytes;           /* bucket_bytes_cap, > 0 */
    int64_t first_bucket_cap_bytes;     /* > 0, or GODDP_CAP_NOT_GIVEN when this torch keeps none */
    int64_t num_bucket_caps;            /* 0, or the length of bucket_caps_bytes */
    const int64_t *bucket_caps_bytes;   /* its per-bucket caps, DDP order */
    uint32_t flags;                     /* GODDP_DDP_* bits */
    /* The number of parameters DDP reduces; 0: unknown. With it and
     * goddp_graph.param_ddp_positions, aligned buckets must hold exactly
     * DDP's parameters, else the plan is made unaligned
     * (GODDP_REASON_NOT_COVERED). */
    int64_t num_params;
} goddp_ddp;

typedef struct goddp_config {
    int32_t mode;                       /* enum goddp_mode */
    int64_t bucket_cap_bytes;           /* > 0, or GODDP_CAP_NOT_GIVEN */
    int64_t first_bucket_cap_bytes;     /* > 0 and <= bucket_cap_bytes, or GODDP_CAP_NOT_GIVEN */
    int64_t num_bucket_caps;            /* 0, or the length of bucket_caps_bytes */
    const int64_t *bucket_caps_bytes;   /* per-bucket caps in DDP order (ddp mode); the last repeats */
    int64_t max_pieces;                 /* 0 = no limit; else merge adjacent pieces down to this many (ddp mode) */
    /* ddp mode only (nonzero in torch mode is GODDP_ERR_INVALID_CONFIG).
     * 0: buckets as DDP is predicted to build them. Nonzero: once the cuts
     * are final, one bucket per piece instead, in DDP order (bucket k is
     * piece num_pieces-1-k), holding the parameters first used in that
     * piece with their exact byte total; those totals are meant to be
     * passed to DDP as its per-bucket caps, so that DDP's bucket rebuild
     * closes each bucket exactly at a piece boundary whatever the gradient
     * order inside a piece. With block cuts (node_block_ids) a bucket
     * spans consecutive pieces instead of one, still closing at a piece
     * boundary (planner/blocks.go). Parameters of several (dtype, device)
     * groups get a bucket per group and run of pieces, with caps that fit
     * every group (GODDP_ALIGN_READY_GROUPS, GODDP_ALIGN_DECLARATION_GROUPS).
     * A single piece without counted parameters has no bucket. */
    int32_t align_buckets;
    /* ABI 5. enum goddp_bucket_order (ddp mode; nonzero in torch mode is
     * GODDP_ERR_INVALID_CONFIG). With GODDP_ORDER_DECLARATION and
     * align_buckets, the buckets and ddp_caps are made for DDP's
     * declaration-order bucketing, which needs
     * goddp_graph.param_ddp_positions. */
    int32_t bucket_order;

    /* ABI 6. With ddp set, a cap not given defaults to DDP's, the first
     * cap follows DDP's rules and DDP's per-bucket caps apply while the
     * bucket cap is not given (Note [Cap defaults]); bucket_order must then
     * be 0, since the planner derives it from DDP's flags when aligning. */
    int32_t block_cuts;                 /* ddp mode: assign blocks from the module stacks */
    int32_t edges;                      /* enum goddp_edges */
    const goddp_ddp *ddp;               /* NULL outside a DDP module */
    /* ABI 9, ddp mode (nonzero in torch mode is GODDP_ERR_INVALID_CONFIG):
     * every bucket gets the resolved bucket cap; the first-bucket cap and
     * per-bucket caps are not applied (Note [Uniform caps] in
     * planner/regions.go: how the shim cuts one checkpoint's body). */
    int32_t uniform_caps;
} goddp_config;

/* One plan. Every array is malloc'd by the library and freed by goddp_plan_free. */
typedef struct goddp_plan {
    uint64_t fingerprint;               /* identical across processes and machines for identical inputs */
    int64_t num_nodes;
    int32_t *node_pieces;               /* [num_nodes] piece of each node, -1 for placeholders and output */
    int64_t num_pieces;                 /* pieces, numbered in forward order */

    /* Buckets in DDP order: bucket 0 holds the gradients ready first,
     * i.e. the parameters of the last piece. */
    int64_t num_buckets;
    int64_t *bucket_bytes;              /* [num_buckets] counted bytes */
    int32_t *bucket_pieces;             /* [num_buckets] the piece whose backward completes the bucket;
                                         * in the declaration alignments, the one at whose end DDP launches it */
    /* Node span of each bucket, forward order, end exclusive. ddp mode:
     * from the first to the last node holding the first use of one of its
     * params. torch mode: the bucket's whole node range. */
    int64_t *bucket_node_begin;         /* [num_buckets] first node of the span */
    int64_t *bucket_node_end;           /* [num_buckets] one past its last node */
    uint8_t *bucket_extended;           /* [num_buckets] 1 if its cut moved to give the piece an output */
    int64_t *bucket_param_offsets;      /* [num_buckets + 1] CSR */
    int32_t *bucket_params;             /* parameter indices, in gradient-ready order */

    /* Values crossing the cuts, per piece (CSR, node indices ascending):
     * inputs: placeholders and earlier pieces' nodes the piece reads;
     * outputs: the piece's nodes read by later pieces or by the output node. */
    int64_t *piece_input_offsets;       /* [num_pieces + 1] */
    int32_t *piece_inputs;
    int64_t *piece_output_offsets;      /* [num_pieces + 1] */
    int32_t *piece_outputs;

    /* ABI 5: alignment, num_ddp_caps, ddp_caps, merged_cuts.
     * enum goddp_alignment: GODDP_ALIGN_NONE unless config.align_buckets. */
    int32_t alignment;
    /* With alignment: the per-bucket caps to give DDP, in the order DDP
     * walks them (DDP order for GODDP_ALIGN_READY, forward-first piece
     * first for the declaration cases; for GODDP_ALIGN_READY_GROUPS and
     * GODDP_ALIGN_DECLARATION_GROUPS cap j is every group's j-th bucket's). */
    int64_t num_ddp_caps;
    int64_t *ddp_caps;                  /* [num_ddp_caps] */
    int64_t merged_cuts;                /* cuts GODDP_ALIGN_DECLARATION_MERGED or _GROUPS dropped, or unit
                                         * boundaries GODDP_ALIGN_READY_GROUPS closes no bucket at */

    /* ABI 6: the decisions (planner/decide.go, Note [One call]).
     * The settings the plan stands for, under the config's names: the
     * resolved caps, max_pieces, and align_buckets (1 exactly when DDP's
     * buckets are to be set to the pieces, align_reason
     * GODDP_REASON_ALIGNED) with its bucket_order. */
    int64_t bucket_cap_bytes;
    int64_t first_bucket_cap_bytes;
    int64_t num_bucket_caps;
    int64_t *bucket_caps_bytes;         /* [num_bucket_caps] */
    int64_t max_pieces;
    int32_t align_buckets;
    int32_t bucket_order;               /* enum goddp_bucket_order */
    int32_t align_reason;               /* enum goddp_align_reason; ddp_caps are empty unless ALIGNED */
    /* ABI 11. With align_reason NOT_COVERED or PART_OF_FORWARD: the
     * parameters the aligned buckets held, against goddp_ddp.num_params;
     * 0 otherwise. */
    int64_t aligned_params;
    int64_t num_counted_params;         /* table parameters DDP reduces (requires grad, not ignored) */
    /* Per piece (CSR), its parameters in forward order: ddp mode, the
     * bucketed parameters first used in it; torch mode, the parameters of
     * the bucket it completes. */
    int64_t *piece_param_offsets;       /* [num_pieces + 1] */
    int32_t *piece_params;
    int64_t num_eager_pieces;
    int32_t *eager_pieces;              /* [num_eager_pieces] ascending: run eagerly (config.edges) */
    int32_t *node_block_ids;            /* [num_nodes] the block of each node, or NULL: no blocks */

    /* ABI 8. enum goddp_bucket_order: the order in which the DDP module
     * (config.ddp) fills its own buckets, from its flags, whether or not
     * they are set to the pieces: GODDP_ORDER_DECLARATION exactly when it
     * finds unused parameters without a static graph (it never rebuilds);
     * GODDP_ORDER_READY without config.ddp. */
    int32_t ddp_bucket_order;

    /* ABI 9. 1 when the pieces begin only at block runs (ddp mode, at
     * least two runs of node_block_ids, bucket_order other than
     * GODDP_ORDER_DECLARATION; planner/blocks.go), 0 when the cuts follow
     * the bytes or torch's rule. The shim splits checkpoints at buckets
     * only where it is 0 (Note [Checkpoint bodies]). */
    int32_t block_runs;
    /* ABI 9, with config.uniform_caps (one checkpoint body planned alone):
     * 1 when the body is to be split into one checkpoint region per piece
     * (not cut at block runs, at least two pieces; Note [Uniform caps]),
     * else 0. */
    int32_t checkpoint_regions;
} goddp_plan;

/* GODDP_ABI_VERSION of the library actually loaded. */
int32_t goddp_abi_version(void);

/* Sets the Go runtime's GOMAXPROCS (n >= 1) and stores the previous value in
 * *previous when it is non-NULL. n <= 0 only queries. Use this rather than the
 * GOMAXPROCS environment variable, which Go reads once at process start. */
goddp_status goddp_set_max_procs(int32_t n, int32_t *previous);

/* Plans graph g under cfg, making every decision of docs/planner.md
 * ("Decisions") in this one call. On GODDP_OK, *out holds a plan to
 * release with goddp_plan_free. */
goddp_status goddp_plan_graph(const goddp_graph *g, const goddp_config *cfg,
                              goddp_plan **out, char **err_msg);

/* What DDP will communicate for one module once goddp has set its buckets
 * (python/goddp/ranks/agreement.py, Note [Agreeing on DDP's layout]): the ranks
 * of a DDP module compare its digest, never their graphs. */
typedef struct goddp_layout {
    int32_t num_buckets;                /* >= 1, DDP order */
    const int64_t *bucket_offsets;      /* [num_buckets + 1] into positions (CSR) */
    const int32_t *positions;           /* DDP parameter positions, ready order per bucket */
    int32_t bucket_order;               /* enum goddp_bucket_order */
    const char *build;                  /* NUL-terminated: goddp version and ABI */
    int32_t num_caps;                   /* >= 1 */
    const int64_t *caps;                /* [num_caps] per-bucket caps given to DDP, in DDP's walk order */
    int64_t num_spans;                    /* optional: the caller's arrays (goddp_span) */
    const goddp_span *spans;
} goddp_layout;

/* Stores in *digest a 64-bit digest of layout, equal on every process and
 * machine for equal layouts. GODDP_ERR_INVALID_CONFIG for a layout no DDP
 * module could have (no bucket or cap, an empty bucket, a repeated or
 * negative position, a cap below one byte). */
goddp_status goddp_layout_digest(const goddp_layout *layout, uint64_t *digest, char **err_msg);

/* How to split one graph's activation checkpoint calls into consecutive
 * checkpoints, one per region of each body (planner/ckptsplit.go, Note
 * [Checkpoint regions]; ABI 10). request and *reply are NUL-terminated JSON
 * text (the calls are few, their facts nested per call and per body node,
 * the reply a question or a decision: a shape worse as a struct);
 * docs/planner.md, "Checkpoint regions", gives
 * both shapes:
 *   request: {"calls": [call, ...], "bucket_splits": bool,
 *             "cut_at_blocks": bool|null, "buckets_planned": bool}
 *     call: {"name": str, "indexed_only": bool, "policy_function": bool,
 *            "nodes": [node, ...],   (the body's, in graph order)
 *            "buckets": {"pieces": [int], "param_bytes": int,
 *                        "cap_bytes": int, "buckets": int,
 *                        "regions": bool}|null}
 *     node: {"kind": "placeholder"|"get_attr"|"compute"|"output",
 *            "block": int (-1: none), "inputs": [int] (earlier nodes),
 *            "returned": bool, "writes": int (-1: none), "carries": bool,
 *            "random": bool, "state_change": bool, "nested": bool}
 *            (an absent block or writes is -1)
 *   reply: {"ask": ""|"cut_at_blocks"|"buckets", "plan_buckets": [int],
 *           "calls": [{"boundary": "block"|"bucket"|"", "blocks": int,
 *                      "node_regions": [int]|null,
 *                      "regions": [{"inputs": [int], "outputs": [int]}]|null,
 *                      "code": str, "node": int, "region": int}],
 *           "said": [int]}
 * A reply that asks is answered and the request sent again: "cut_at_blocks"
 * with the outer graph's goddp_plan.block_runs, "buckets" with each named
 * call's body planned alone (config.uniform_caps; null: it holds no DDP
 * parameter) and "buckets_planned": true. Otherwise "calls" is the
 * decision per call ("node_regions" null: kept whole for the reason "code"
 * names: "few_blocks", "result_used", "policy_function", "random_op",
 * "state_change", "nested_hop", "read_before_made", "attribute_both_sides",
 * "not_carried", "mutation_across_cut" or "hands_nothing_on"; "" when
 * split; "node": the body node the reason names (random_op: the op,
 * not_carried: the value, mutation_across_cut: the writer) and "region"
 * the region (hands_nothing_on), each -1 otherwise) and "said" the calls
 * to log and rewrite (boundary not ""); the caller words the lines.
 * On GODDP_OK, *reply is released with goddp_string_free; on error it stays
 * NULL. GODDP_ERR_INVALID_CONFIG for a request that is not of that shape,
 * or a bucket plan with negative bytes or count or a cap below 1;
 * GODDP_ERR_INVALID_GRAPH for a body that does not end with its one output
 * node, a node kind out of range, a node reading a node not before it, a
 * block or piece below -1, a "writes" out of range, bucket pieces not one
 * per node, or too many nodes. The error message names the call and node. */
goddp_status goddp_checkpoint_split(const char *request, char **reply, char **err_msg);

/* A backward step's timeline with DDP's overlapped allreduces, and the
 * bucket boundaries that minimise it (planner/timeline.go, Note [Timeline];
 * docs/planner.md, "The timeline model"). request and *reply are
 * NUL-terminated JSON text, integers only (ns and bytes):
 *   request: {"backward_ns": [int], "bytes": [int],  (per unit, backward
 *                                                      order, each > 0)
 *             "allreduce": {"latency_ns": int, "bytes_per_second": int}
 *                        | {"table": [[bytes, ns], ...]},
 *             "launch_ns": int, "slowdown_permille": int (1000: none),
 *             "starts": [int]|null}
 *   reply: {"buckets": [{"first": int, "end": int, "bytes": int,
 *                        "ready_ns": int, "start_ns": int, "done_ns": int}],
 *           "backward_ns": int, "step_ns": int, "exposed_ns": int,
 *           "search": "none"|"exact"|"thinned"}
 * "starts" (bucket starts, unit indices ascending in [1, units)) predicts
 * those buckets ("search": "none"); null or absent chooses the boundaries
 * ("exact": the least step; "thinned": the search was cut short, the best
 * it found). On GODDP_OK, *reply is released with goddp_string_free; on
 * error it stays NULL. GODDP_ERR_INVALID_CONFIG for a request not of that
 * shape (an unknown key, a non-integer), no units, a duration or byte count
 * below 1, a bandwidth of 0, a table of fewer than two points or out of
 * order, both a line and a table, a slowdown below 1000, bad starts;
 * GODDP_ERR_OVERFLOW for times that could pass 2^62 ns. */
goddp_status goddp_timeline(const char *request, char **reply, char **err_msg);


/* Releases a plan from goddp_plan_graph. NULL is a no-op. */
void goddp_plan_free(goddp_plan *plan);

/* The graphs of one forward, each bucketed by an aligned plan
 * (goddp_config.align_buckets), for goddp_combine_forward. DDP positions
 * index the list of parameters DDP reduces. */
typedef struct goddp_forward {
    int64_t num_params;                 /* parameters DDP reduces */
    const int64_t *param_bytes;         /* [num_params] numel*element size, by DDP position */
    int64_t num_graphs;                 /* >= 1, in forward order */
    const int64_t *graph_bucket_offsets; /* [num_graphs + 1] CSR over the buckets, each graph's in DDP order */
    const int64_t *bucket_param_offsets; /* [num_buckets + 1] CSR over bucket_params */
    const int32_t *bucket_params;       /* DDP positions */
    int64_t num_spans;                    /* optional: the caller's arrays (goddp_span) */
    const goddp_span *spans;
    /* ABI 15: [num_params] each parameter's (dtype, device) group number,
     * >= 0, by DDP position; NULL: one group. With several, the graphs'
     * buckets (one per unit, every group in it) are split by group. */
    const int32_t *param_keys;
    /* ABI 15: the resolved caps the graphs were planned with (goddp_plan's
     * bucket_cap_bytes, first_bucket_cap_bytes, bucket_caps_bytes): the
     * buckets DDP would make on its own. With several groups, where the
     * combined buckets would launch more than 10% later than those,
     * goddp_forward_plan.groups_later is 1. own_bucket_cap_bytes 0: no
     * such check. */
    int64_t own_bucket_cap_bytes;
    int64_t own_first_bucket_cap_bytes;
    int64_t num_own_bucket_caps;
    const int64_t *own_bucket_caps_bytes;
} goddp_forward;

/* One DDP bucket layout for a forward's graphs (planner/forward.go). Every
 * array is malloc'd by the library and freed by goddp_forward_plan_free. */
typedef struct goddp_forward_plan {
    int64_t num_buckets;                /* DDP order: the last graph's buckets first */
    int64_t *bucket_bytes;              /* [num_buckets] each bucket's exact bytes */
    int32_t *bucket_graphs;             /* [num_buckets] the graph (forward order) it comes from */
    int32_t *bucket_sources;            /* [num_buckets] its index among that graph's buckets */
    int64_t *bucket_param_offsets;      /* [num_buckets + 1] CSR */
    int32_t *bucket_params;             /* DDP positions */
    int64_t moved;                      /* parameters in several graphs, kept in the earliest only */
    int64_t dropped;                    /* buckets left empty by that */
    /* ABI 15: the caps to give DDP, at least 1: bucket_bytes, or with
     * several groups cap j every group's j-th bucket's (fewer than the
     * buckets). */
    int64_t num_ddp_caps;
    int64_t *ddp_caps;                  /* [num_ddp_caps] */
    int64_t merged_cuts;                /* several groups: the graphs' buckets, but the last, at whose
                                         * end no group's bucket closes */
    int64_t groups_later;               /* ABI 15: 1 for several groups whose buckets would launch later
                                         * than the own caps' (goddp_forward): keep DDP's buckets */
} goddp_forward_plan;

/* Combines the aligned buckets of a forward's graphs into one DDP
 * layout: the later graph's buckets first (DDP's backward runs it first),
 * a parameter of several graphs in the earliest one's bucket; with
 * param_keys of several groups, split by group against shared caps. Fails
 * with GODDP_ERR_INVALID_GRAPH unless the graphs between them hold every
 * parameter DDP reduces, GODDP_ERR_INVALID_CONFIG for malformed arrays,
 * group numbers or own caps, GODDP_ERR_OVERFLOW for byte sums past
 * int64. On GODDP_OK, *out is released with goddp_forward_plan_free. */
goddp_status goddp_combine_forward(const goddp_forward *f, goddp_forward_plan **out, char **err_msg);

/* Releases a goddp_forward_plan. NULL is a no-op. */
void goddp_forward_plan_free(goddp_forward_plan *plan);

/* Releases an error message, or a report's text. NULL is a no-op. */
void goddp_string_free(char *s);

/* cdef: end */

#ifdef GODDP_TESTHOOKS
/* cdef testhooks: begin */
/* Test hook, only in libraries built with the goddp_testhooks Go tag (never
 * in build/lib/libgoddp.so or the wheel): panics inside Go on purpose so the
 * tests can prove that a panic becomes GODDP_ERR_PANIC plus a message rather
 * than an abort. */
goddp_status goddp_debug_panic(char **err_msg);
/* cdef testhooks: end */
#endif

#ifdef __cplusplus
}
#endif

#endif /* GODDP_H */
