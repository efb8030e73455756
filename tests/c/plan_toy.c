/*
 * plan_toy.c: plans a toy graph through libgoddp.so, the way any C caller
 * would, and checks the result.
 *
 * The model is three Linear(1000, 1000) fp32 layers with ReLU. Its forward
 * graph, in FX order:
 *   0      placeholder x
 *   1..6   placeholders w0 b0 w1 b1 w2 b2 (the parameters)
 *   7+2i   linear_i = call_function(prev, w_i, b_i)   params w_i, b_i (REF_ARG)
 *   8+2i   relu_i   = call_function(linear_i)
 *   13     output(relu_2)
 * Each weight is 4,000,000 B and each bias 4,000 B. With a 4 MB cap and a
 * 1 MB first cap every layer fills a bucket of its own in both modes, so the
 * plan has three pieces, one per layer.
 *
 * Build and run (from the repository root, after `make lib`):
 *   gcc -std=c11 -Wall -Wextra -Werror -O2 -Icsrc tests/c/plan_toy.c \
 *       -o build/plan_toy -Lbuild/lib -Wl,-rpath,'$ORIGIN/lib' -lgoddp -lpthread -ldl
 *   build/plan_toy
 * Exits non-zero when any check fails; the last line is "N passed, N failed".
 *
 * `make ctest` builds this file twice: against the shipped build/lib library,
 * where it checks that the test hook goddp_debug_panic is absent, and with
 * -DGODDP_TESTHOOKS against build/testhooks/libgoddp.so (Go tag
 * goddp_testhooks), where it checks that a deliberate Go panic comes back as
 * GODDP_ERR_PANIC.
 */
#define _POSIX_C_SOURCE 200809L

/* RTLD_DEFAULT, to look for the test hook among the loaded symbols. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "goddp.h"

static int passed, failed;

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (cond) {                                                   \
            passed++;                                                 \
        } else {                                                      \
            failed++;                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);      \
            fprintf(stderr, __VA_ARGS__);                             \
            fputc('\n', stderr);                                      \
        }                                                             \
    } while (0)

enum { LAYERS = 3, NUM_NODES = 7 + 2 * LAYERS + 1, NUM_PARAMS = 2 * LAYERS, MAX_EDGES = 64 };
static const int64_t WEIGHT_BYTES = 4000000, BIAS_BYTES = 4000;
static const int64_t CAP_BYTES = 4000000, FIRST_CAP_BYTES = 1000000;

/* The toy graph's arrays, filled by build_toy_graph. */
static int32_t node_ops[NUM_NODES], node_module_ids[NUM_NODES];
static int64_t node_param_offsets[NUM_NODES + 1], node_user_offsets[NUM_NODES + 1];
static int32_t node_params[MAX_EDGES], node_users[MAX_EDGES];
static uint8_t node_param_refs[MAX_EDGES];
static int64_t param_bytes[NUM_PARAMS], param_storage_bytes[NUM_PARAMS];
static int32_t param_dtypes[NUM_PARAMS], param_devices[NUM_PARAMS];
static uint32_t param_flags[NUM_PARAMS];
static int64_t param_name_offsets[NUM_PARAMS + 1];
static char param_names[256];

static int linear_node(int layer) { return 7 + 2 * layer; }
static int relu_node(int layer) { return 8 + 2 * layer; }
static int weight_node(int layer) { return 1 + 2 * layer; }
static int bias_node(int layer) { return 2 + 2 * layer; }

static goddp_graph build_toy_graph(void) {
    /* Users per node, collected first, then flattened to CSR. */
    int32_t users[NUM_NODES][4];
    int num_users[NUM_NODES] = {0};
    for (int i = 0; i < NUM_NODES; i++) {
        node_ops[i] = GODDP_OP_PLACEHOLDER;
        node_module_ids[i] = -1;
    }
    int prev = 0; /* x */
    for (int l = 0; l < LAYERS; l++) {
        node_ops[linear_node(l)] = GODDP_OP_CALL_FUNCTION;
        node_ops[relu_node(l)] = GODDP_OP_CALL_FUNCTION;
        users[prev][num_users[prev]++] = linear_node(l);
        users[weight_node(l)][num_users[weight_node(l)]++] = linear_node(l);
        users[bias_node(l)][num_users[bias_node(l)]++] = linear_node(l);
        users[linear_node(l)][num_users[linear_node(l)]++] = relu_node(l);
        prev = relu_node(l);
    }
    node_ops[NUM_NODES - 1] = GODDP_OP_OUTPUT;
    users[prev][num_users[prev]++] = NUM_NODES - 1;

    int64_t np = 0, nu = 0;
    for (int i = 0; i < NUM_NODES; i++) {
        node_param_offsets[i] = np;
        node_user_offsets[i] = nu;
        for (int l = 0; l < LAYERS; l++) {
            if (i == linear_node(l)) {
                node_params[np] = 2 * l; /* weight */
                node_param_refs[np++] = GODDP_REF_ARG;
                node_params[np] = 2 * l + 1; /* bias */
                node_param_refs[np++] = GODDP_REF_ARG;
            }
        }
        for (int u = 0; u < num_users[i]; u++) node_users[nu++] = users[i][u];
    }
    node_param_offsets[NUM_NODES] = np;
    node_user_offsets[NUM_NODES] = nu;

    size_t names_len = 0;
    for (int p = 0; p < NUM_PARAMS; p++) {
        int is_weight = p % 2 == 0;
        param_bytes[p] = param_storage_bytes[p] = is_weight ? WEIGHT_BYTES : BIAS_BYTES;
        param_dtypes[p] = 0;  /* all float32 */
        param_devices[p] = 0; /* all on one device */
        param_flags[p] = GODDP_PARAM_REQUIRES_GRAD;
        param_name_offsets[p] = (int64_t)names_len;
        names_len += (size_t)snprintf(param_names + names_len, sizeof param_names - names_len,
                                      "layers.%d.%s", p / 2, is_weight ? "weight" : "bias");
    }
    param_name_offsets[NUM_PARAMS] = (int64_t)names_len;

    goddp_graph g = {
        .num_nodes = NUM_NODES,
        .node_ops = node_ops,
        .node_module_ids = node_module_ids,
        .node_param_offsets = node_param_offsets,
        .node_params = node_params,
        .node_param_refs = node_param_refs,
        .node_user_offsets = node_user_offsets,
        .node_users = node_users,
        .num_params = NUM_PARAMS,
        .param_bytes = param_bytes,
        .param_storage_bytes = param_storage_bytes,
        .param_dtypes = param_dtypes,
        .param_devices = param_devices,
        .param_flags = param_flags,
        .param_name_offsets = param_name_offsets,
        .param_names = param_names,
    };
    return g;
}

static goddp_config toy_config(int32_t mode) {
    goddp_config c = {
        .mode = mode,
        .bucket_cap_bytes = CAP_BYTES,
        .first_bucket_cap_bytes = FIRST_CAP_BYTES,
        .num_bucket_caps = 0,
        .bucket_caps_bytes = NULL,
        .max_pieces = 0,
        .align_buckets = 0,
    };
    return c;
}

/* Checks that the CSR list [offsets[i], offsets[i+1]) of values equals want. */
static void check_list(const char *what, int64_t i, const int64_t *offsets, const int32_t *values,
                       const int32_t *want, int64_t want_len) {
    int64_t len = offsets[i + 1] - offsets[i];
    int same = len == want_len;
    for (int64_t k = 0; same && k < len; k++) same = values[offsets[i] + k] == want[k];
    CHECK(same, "%s[%" PRId64 "]: got %" PRId64 " entries, want %" PRId64 " (first %d)", what, i, len,
          want_len, len > 0 ? values[offsets[i]] : -1);
}

/* Plans the toy graph in one mode and checks the plan in full. Returns its
 * fingerprint. */
static uint64_t plan_and_check(const goddp_graph *g, int32_t mode) {
    const char *name = mode == GODDP_MODE_DDP ? "ddp" : "torch";
    goddp_config cfg = toy_config(mode);
    goddp_plan *plan = NULL;
    char *msg = NULL;
    goddp_status st = goddp_plan_graph(g, &cfg, &plan, &msg);
    CHECK(st == GODDP_OK && plan != NULL, "%s mode: status %d, message: %s", name, st, msg ? msg : "(none)");
    goddp_string_free(msg);
    if (st != GODDP_OK || plan == NULL) return 0;
    CHECK(msg == NULL, "%s mode: message set on success", name);

    CHECK(plan->num_nodes == NUM_NODES, "%s: num_nodes %" PRId64, name, plan->num_nodes);
    CHECK(plan->num_pieces == LAYERS, "%s: %" PRId64 " pieces, want %d", name, plan->num_pieces, LAYERS);
    CHECK(plan->num_buckets == LAYERS, "%s: %" PRId64 " buckets, want %d", name, plan->num_buckets, LAYERS);
    if (plan->num_nodes != NUM_NODES || plan->num_pieces != LAYERS || plan->num_buckets != LAYERS) {
        goddp_plan_free(plan);
        return 0;
    }

    /* node_pieces: -1 for placeholders and output, else in range and
     * non-decreasing in forward order; here layer l is exactly piece l. */
    int32_t last = 0;
    for (int i = 0; i < NUM_NODES; i++) {
        int32_t p = plan->node_pieces[i];
        if (node_ops[i] == GODDP_OP_PLACEHOLDER || node_ops[i] == GODDP_OP_OUTPUT) {
            CHECK(p == -1, "%s: node %d (placeholder/output) in piece %d", name, i, p);
        } else {
            CHECK(p >= last && p < plan->num_pieces, "%s: node %d in piece %d (previous %d)", name, i, p, last);
            last = p;
        }
    }
    for (int l = 0; l < LAYERS; l++) {
        CHECK(plan->node_pieces[linear_node(l)] == l && plan->node_pieces[relu_node(l)] == l,
              "%s: layer %d in pieces %d/%d", name, l, plan->node_pieces[linear_node(l)],
              plan->node_pieces[relu_node(l)]);
    }

    /* Buckets in DDP order: bucket b holds layer LAYERS-1-b's weight and bias. */
    CHECK(plan->bucket_param_offsets[0] == 0, "%s: bucket offsets start at %" PRId64, name,
          plan->bucket_param_offsets[0]);
    for (int b = 0; b < LAYERS; b++) {
        int l = LAYERS - 1 - b;
        CHECK(plan->bucket_bytes[b] == WEIGHT_BYTES + BIAS_BYTES, "%s: bucket %d holds %" PRId64 " B", name, b,
              plan->bucket_bytes[b]);
        CHECK(plan->bucket_pieces[b] == l, "%s: bucket %d completes in piece %d", name, b,
              plan->bucket_pieces[b]);
        /* ddp mode spans the first uses of the bucket's parameters (linear_l);
         * torch mode spans the bucket's whole node range (linear_l, relu_l). */
        int64_t want_end = mode == GODDP_MODE_DDP ? linear_node(l) + 1 : relu_node(l) + 1;
        CHECK(plan->bucket_node_begin[b] == linear_node(l) && plan->bucket_node_end[b] == want_end,
              "%s: bucket %d spans nodes [%" PRId64 ", %" PRId64 ")", name, b, plan->bucket_node_begin[b],
              plan->bucket_node_end[b]);
        CHECK(plan->bucket_extended[b] == 0, "%s: bucket %d extended", name, b);
        int64_t lo = plan->bucket_param_offsets[b], hi = plan->bucket_param_offsets[b + 1];
        int weight = 0, bias = 0;
        for (int64_t k = lo; k < hi; k++) {
            weight += plan->bucket_params[k] == 2 * l;
            bias += plan->bucket_params[k] == 2 * l + 1;
        }
        CHECK(hi - lo == 2 && weight == 1 && bias == 1, "%s: bucket %d params wrong (%" PRId64 " entries)", name,
              b, hi - lo);
    }

    /* Crossing values: piece l reads its input activation and its two
     * parameter placeholders, and hands its relu to the next piece (or the
     * output). */
    CHECK(plan->piece_input_offsets[0] == 0 && plan->piece_output_offsets[0] == 0,
          "%s: crossing offsets do not start at 0", name);
    for (int l = 0; l < LAYERS; l++) {
        /* Ascending node order: x (node 0) comes before w0 and b0, but
         * relu_{l-1} comes after every placeholder. */
        int32_t in[3];
        if (l == 0) {
            in[0] = 0, in[1] = weight_node(0), in[2] = bias_node(0);
        } else {
            in[0] = weight_node(l), in[1] = bias_node(l), in[2] = relu_node(l - 1);
        }
        int32_t out[1] = {relu_node(l)};
        check_list("piece_inputs", l, plan->piece_input_offsets, plan->piece_inputs, in, 3);
        check_list("piece_outputs", l, plan->piece_output_offsets, plan->piece_outputs, out, 1);
    }

    uint64_t fp = plan->fingerprint;
    goddp_plan_free(plan);
    return fp;
}

/* A second identical call must give an identical fingerprint. */
static void check_fingerprint_stable(const goddp_graph *g, int32_t mode, uint64_t first) {
    goddp_config cfg = toy_config(mode);
    goddp_plan *plan = NULL;
    goddp_status st = goddp_plan_graph(g, &cfg, &plan, NULL);
    CHECK(st == GODDP_OK && plan != NULL && plan->fingerprint == first,
          "mode %d: second call status %d fingerprint %016" PRIx64 " vs %016" PRIx64, mode, st,
          plan ? plan->fingerprint : 0, first);
    goddp_plan_free(plan);
}

/* align_buckets: with a bucket cap of one weight and a first cap of one
 * bias, ddp mode predicts four buckets over the same three pieces (the last
 * layer's bias, then its weight, then one per remaining layer). Aligned, there
 * is one bucket per piece, bucket b holding layer LAYERS-1-b's weight and
 * bias with their exact byte total, so that the totals can be DDP's
 * per-bucket caps. torch mode refuses the option. */
static void check_aligned(const goddp_graph *g) {
    goddp_config cfg = toy_config(GODDP_MODE_DDP);
    cfg.bucket_cap_bytes = WEIGHT_BYTES;
    cfg.first_bucket_cap_bytes = BIAS_BYTES;
    goddp_plan *plain = NULL, *plan = NULL;
    char *msg = NULL;
    goddp_status st = goddp_plan_graph(g, &cfg, &plain, NULL);
    CHECK(st == GODDP_OK && plain != NULL && plain->num_pieces == LAYERS && plain->num_buckets == LAYERS + 1,
          "unaligned: status %d, %" PRId64 " pieces, %" PRId64 " buckets", st, plain ? plain->num_pieces : -1,
          plain ? plain->num_buckets : -1);

    cfg.align_buckets = 1;
    st = goddp_plan_graph(g, &cfg, &plan, &msg);
    CHECK(st == GODDP_OK && plan != NULL, "aligned: status %d, message: %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;
    if (st == GODDP_OK && plan != NULL) {
        CHECK(plan->num_pieces == LAYERS && plan->num_buckets == plan->num_pieces,
              "aligned: %" PRId64 " pieces, %" PRId64 " buckets", plan->num_pieces, plan->num_buckets);
        for (int b = 0; b < LAYERS && b < plan->num_buckets; b++) {
            int l = LAYERS - 1 - b;
            int32_t want[2] = {2 * l + 1, 2 * l}; /* ready order: bias, then weight */
            CHECK(plan->bucket_bytes[b] == WEIGHT_BYTES + BIAS_BYTES && plan->bucket_pieces[b] == l,
                  "aligned: bucket %d holds %" PRId64 " B in piece %d", b, plan->bucket_bytes[b],
                  plan->bucket_pieces[b]);
            check_list("aligned bucket_params", b, plan->bucket_param_offsets, plan->bucket_params, want, 2);
        }
        for (int i = 0; i < NUM_NODES; i++) {
            CHECK(plain == NULL || plan->node_pieces[i] == plain->node_pieces[i],
                  "aligned: node %d moved to piece %d", i, plan->node_pieces[i]);
        }
        CHECK(plain == NULL || plan->fingerprint != plain->fingerprint, "aligned: fingerprint unchanged");
    }
    goddp_plan_free(plan);
    goddp_plan_free(plain);

    cfg.mode = GODDP_MODE_TORCH;
    plan = NULL;
    st = goddp_plan_graph(g, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && plan == NULL, "torch mode with align_buckets: status %d", st);
    CHECK(msg != NULL && strstr(msg, "AlignBuckets") != NULL, "torch mode with align_buckets: message %s",
          msg ? msg : "(none)");
    goddp_string_free(msg);
}

/* node_block_ids (ABI 3): with each layer a block, a cap above the whole
 * model still cuts at every layer, and the one aligned bucket spans all
 * pieces; without block ids the same config gives one piece. */
static void check_blocks(const goddp_graph *base) {
    int32_t blocks[NUM_NODES];
    for (int i = 0; i < NUM_NODES; i++) blocks[i] = -1;
    for (int l = 0; l < LAYERS; l++) blocks[linear_node(l)] = blocks[relu_node(l)] = l;
    goddp_graph g = *base;
    goddp_config cfg = toy_config(GODDP_MODE_DDP);
    cfg.bucket_cap_bytes = cfg.first_bucket_cap_bytes = 1 << 30;
    cfg.align_buckets = 1;
    goddp_plan *plan = NULL;
    goddp_status st = goddp_plan_graph(&g, &cfg, &plan, NULL);
    CHECK(st == GODDP_OK && plan != NULL && plan->num_pieces == 1, "no block ids: status %d, %" PRId64 " pieces",
          st, plan ? plan->num_pieces : -1);
    CHECK(plan == NULL || plan->block_runs == 0, "no block ids: block_runs %d", plan ? plan->block_runs : -1);
    goddp_plan_free(plan);

    g.node_block_ids = blocks;
    plan = NULL;
    st = goddp_plan_graph(&g, &cfg, &plan, NULL);
    CHECK(st == GODDP_OK && plan != NULL, "block ids: status %d", st);
    if (st == GODDP_OK && plan != NULL) {
        CHECK(plan->num_pieces == LAYERS && plan->num_buckets == 1 && plan->bucket_pieces[0] == 0 &&
                  plan->bucket_bytes[0] == LAYERS * (WEIGHT_BYTES + BIAS_BYTES),
              "block ids: %" PRId64 " pieces, %" PRId64 " buckets", plan->num_pieces, plan->num_buckets);
        CHECK(plan->block_runs == 1, "block ids: block_runs %d, want 1 (cut at block runs)", plan->block_runs);
        for (int l = 0; l < LAYERS; l++) {
            CHECK(plan->node_pieces[linear_node(l)] == l && plan->node_pieces[relu_node(l)] == l,
                  "block ids: layer %d in piece %d", l, plan->node_pieces[linear_node(l)]);
        }
    }
    goddp_plan_free(plan);

    blocks[linear_node(1)] = -2;
    char *msg = NULL;
    plan = NULL;
    st = goddp_plan_graph(&g, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_GRAPH && plan == NULL && msg != NULL && strstr(msg, "block id") != NULL,
          "block id -2: status %d, message %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);
}

static void check_errors(const goddp_graph *g) {
    goddp_plan *plan = NULL;
    char *msg = NULL;

    /* A negative cap is the planner's to reject. */
    goddp_config cfg = toy_config(GODDP_MODE_DDP);
    cfg.bucket_cap_bytes = -1;
    goddp_status st = goddp_plan_graph(g, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG, "negative cap: status %d", st);
    CHECK(plan == NULL, "negative cap: plan not NULL");
    CHECK(msg != NULL && strstr(msg, "bucket cap is -1 bytes") != NULL, "negative cap: message %s, want it to name the cap",
          msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;

    /* err_msg may be NULL: the status alone comes back. */
    st = goddp_plan_graph(g, &cfg, &plan, NULL);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && plan == NULL, "negative cap, no err_msg: status %d", st);

    /* Pointer/length pairs are checked before any caller memory is read. */
    goddp_graph bad = *g;
    bad.node_ops = NULL;
    cfg = toy_config(GODDP_MODE_DDP);
    st = goddp_plan_graph(&bad, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_GRAPH && plan == NULL, "NULL node_ops: status %d", st);
    CHECK(msg != NULL && strstr(msg, "node_ops") != NULL, "NULL node_ops: message %s", msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;

    cfg.num_bucket_caps = -2;
    st = goddp_plan_graph(g, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && plan == NULL, "negative num_bucket_caps: status %d", st);
    CHECK(msg != NULL && strstr(msg, "bucket_caps_bytes") != NULL, "negative num_bucket_caps: message %s",
          msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;

#ifdef GODDP_TESTHOOKS
    /* A deliberate Go panic comes back as a status, not an abort. */
    st = goddp_debug_panic(&msg);
    CHECK(st == GODDP_ERR_PANIC, "debug panic: status %d", st);
    CHECK(msg != NULL && strstr(msg, "deliberate panic") != NULL, "debug panic: message %s", msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;
    CHECK(goddp_debug_panic(NULL) == GODDP_ERR_PANIC, "debug panic without err_msg");

#else
    /* What ships has no way to make Go panic on purpose. */
    CHECK(dlsym(RTLD_DEFAULT, "goddp_debug_panic") == NULL, "goddp_debug_panic is exported by the shipped library");
    CHECK(dlsym(RTLD_DEFAULT, "goddp_plan_graph") != NULL, "dlsym cannot see the library's exports at all");
#endif

    goddp_plan_free(NULL);
    goddp_string_free(NULL);
}

static void check_max_procs(void) {
    int32_t original = -1, previous = -1;
    CHECK(goddp_set_max_procs(0, &original) == GODDP_OK && original >= 1, "query GOMAXPROCS: %d", original);
    CHECK(goddp_set_max_procs(2, &previous) == GODDP_OK && previous == original, "set 2: previous %d", previous);
    CHECK(goddp_set_max_procs(-1, &previous) == GODDP_OK && previous == 2, "query after set: %d", previous);
    CHECK(goddp_set_max_procs(original, NULL) == GODDP_OK, "restore GOMAXPROCS");
}

/* Several threads plan at once; every call must agree. */
enum { THREADS = 4, CALLS_PER_THREAD = 50 };

struct worker {
    pthread_t thread;
    const goddp_graph *graph;
    int ok_calls;
    int disagreements;
    uint64_t fingerprint;
};

static void *plan_repeatedly(void *arg) {
    struct worker *w = arg;
    goddp_config cfg = toy_config(GODDP_MODE_DDP);
    for (int i = 0; i < CALLS_PER_THREAD; i++) {
        goddp_plan *plan = NULL;
        if (goddp_plan_graph(w->graph, &cfg, &plan, NULL) != GODDP_OK || plan == NULL) continue;
        w->ok_calls++;
        if (w->ok_calls == 1) w->fingerprint = plan->fingerprint;
        else if (plan->fingerprint != w->fingerprint) w->disagreements++;
        goddp_plan_free(plan);
    }
    return NULL;
}

static void check_threads(const goddp_graph *g, uint64_t want) {
    struct worker workers[THREADS];
    for (int t = 0; t < THREADS; t++) {
        workers[t] = (struct worker){.graph = g};
        CHECK(pthread_create(&workers[t].thread, NULL, plan_repeatedly, &workers[t]) == 0, "pthread_create %d", t);
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(workers[t].thread, NULL);
        CHECK(workers[t].ok_calls == CALLS_PER_THREAD, "thread %d: %d of %d calls succeeded", t,
              workers[t].ok_calls, CALLS_PER_THREAD);
        CHECK(workers[t].disagreements == 0 && workers[t].fingerprint == want,
              "thread %d: fingerprint %016" PRIx64 " (want %016" PRIx64 "), %d disagreements", t,
              workers[t].fingerprint, want, workers[t].disagreements);
    }
}

/* The decisions (ABI 6): inside a DDP module of a 4 MB cap (none given by
 * the caller), aligned buckets, with module stacks that make each layer a
 * block. The plan reports DDP's cap (also the first cap, DDP's rule), one
 * piece per block, the alignment's name, each piece's parameters and the
 * counted parameters; a DDP flag the ABI does not know is refused. */
static void check_decisions(const goddp_graph *base) {
    static const char strings[] = "L['self']ModelBlockL['self'].layers.0L['self'].layers.1L['self'].layers.2";
    int64_t string_offsets[] = {0, 9, 14, 19, 37, 55, 73};
    int64_t stack_offsets[NUM_NODES + 1];
    int32_t paths[2 * NUM_NODES], types[2 * NUM_NODES];
    int64_t k = 0;
    for (int i = 0; i < NUM_NODES; i++) {
        stack_offsets[i] = k;
        paths[k] = 0, types[k] = 1, k++;
        for (int l = 0; l < LAYERS; l++) {
            if (i == linear_node(l) || i == relu_node(l)) paths[k] = 3 + l, types[k] = 2, k++;
        }
    }
    stack_offsets[NUM_NODES] = k;
    int32_t positions[NUM_PARAMS];
    for (int p = 0; p < NUM_PARAMS; p++) positions[p] = p;
    goddp_graph g = *base;
    g.num_module_strings = 6;
    g.module_string_offsets = string_offsets;
    g.module_strings = strings;
    g.node_stack_offsets = stack_offsets;
    g.node_stack_paths = paths;
    g.node_stack_types = types;
    g.param_ddp_positions = positions;

    goddp_ddp ddp = {.bucket_cap_bytes = CAP_BYTES, .first_bucket_cap_bytes = GODDP_CAP_NOT_GIVEN, .num_params = NUM_PARAMS};
    goddp_config cfg = toy_config(GODDP_MODE_DDP);
    cfg.bucket_cap_bytes = cfg.first_bucket_cap_bytes = GODDP_CAP_NOT_GIVEN; /* DDP's */
    cfg.align_buckets = 1;
    cfg.block_cuts = 1;
    cfg.edges = GODDP_EDGES_AUTO;
    cfg.ddp = &ddp;
    goddp_plan *plan = NULL;
    char *msg = NULL;
    goddp_status st = goddp_plan_graph(&g, &cfg, &plan, &msg);
    CHECK(st == GODDP_OK && plan != NULL, "decisions: status %d, message: %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;
    if (st == GODDP_OK && plan != NULL) {
        CHECK(plan->bucket_cap_bytes == CAP_BYTES && plan->first_bucket_cap_bytes == CAP_BYTES,
              "decisions: caps %" PRId64 " / %" PRId64, plan->bucket_cap_bytes, plan->first_bucket_cap_bytes);
        CHECK(plan->align_buckets == 1 && plan->align_reason == GODDP_REASON_ALIGNED && plan->aligned_params == 0,
              "decisions: align %d reason %d (%" PRId64 " aligned params)", plan->align_buckets, plan->align_reason,
              plan->aligned_params);
        CHECK(plan->alignment == GODDP_ALIGN_READY, "decisions: alignment %d", plan->alignment);
        CHECK(plan->num_pieces == LAYERS && plan->num_counted_params == NUM_PARAMS && plan->num_eager_pieces == 0,
              "decisions: %" PRId64 " pieces, %" PRId64 " counted, %" PRId64 " eager", plan->num_pieces,
              plan->num_counted_params, plan->num_eager_pieces);
        CHECK(plan->node_block_ids != NULL && plan->node_block_ids[linear_node(1)] == 1 &&
                  plan->node_block_ids[0] == -1,
              "decisions: block ids");
        for (int l = 0; l < LAYERS && l < plan->num_pieces; l++) {
            int32_t want[2] = {2 * l, 2 * l + 1}; /* forward order: weight, then bias */
            check_list("piece_params", l, plan->piece_param_offsets, plan->piece_params, want, 2);
        }
    }
    goddp_plan_free(plan);

    /* A fact that refuses alignment: the unaligned plan, the planner's reason. */
    ddp.flags = GODDP_DDP_BUILTIN_COMM_HOOK;
    plan = NULL;
    st = goddp_plan_graph(&g, &cfg, &plan, &msg);
    CHECK(st == GODDP_OK && plan != NULL, "refusal: status %d", st);
    if (st == GODDP_OK && plan != NULL) {
        CHECK(plan->align_buckets == 0 && plan->align_reason == GODDP_REASON_BUILTIN_COMM_HOOK &&
                  plan->num_ddp_caps == 0,
              "refusal: align %d reason %d", plan->align_buckets, plan->align_reason);
        CHECK(plan->ddp_bucket_order == GODDP_ORDER_READY, "refusal: ddp bucket order %d", plan->ddp_bucket_order);
    }
    goddp_string_free(msg);
    msg = NULL;
    goddp_plan_free(plan);

    ddp.flags = 0x200;
    plan = NULL;
    st = goddp_plan_graph(&g, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && plan == NULL, "unknown DDP flag: status %d", st);
    CHECK(msg != NULL && strstr(msg, "ddp.flags = 0x200 has unknown bits") != NULL, "unknown DDP flag: message %s",
          msg ? msg : "(none)");
    goddp_string_free(msg);
}

/* The body facts (ABI 10, Note [Body stacks]): each layer as if one
 * higher-order-op call, its linear the call (a body of two nodes inside
 * the layer), its relu the call's companion, no layer node with a stack of
 * its own beyond the model: the planner assigns the same blocks as from
 * the layers' own stacks; a node belonging to a node that is no call is
 * GODDP_ERR_INVALID_GRAPH. */
static void check_bodies(const goddp_graph *base) {
    static const char strings[] = "L['self']ModelBlockL['self'].layers.0L['self'].layers.1L['self'].layers.2";
    int64_t string_offsets[] = {0, 9, 14, 19, 37, 55, 73};
    int64_t stack_offsets[NUM_NODES + 1], body_offsets[NUM_NODES + 1], body_stacks[2 * LAYERS + 1];
    int32_t paths[NUM_NODES], types[NUM_NODES], calls[NUM_NODES];
    int32_t body_paths[4 * LAYERS], body_types[4 * LAYERS];
    int64_t nb = 0, ne = 0;
    body_stacks[0] = 0;
    for (int i = 0; i < NUM_NODES; i++) {
        stack_offsets[i] = i, paths[i] = 0, types[i] = 1;
        body_offsets[i] = nb;
        calls[i] = -1;
        for (int l = 0; l < LAYERS; l++) {
            if (i == linear_node(l) || i == relu_node(l)) calls[i] = linear_node(l);
            if (i != linear_node(l)) continue;
            for (int j = 0; j < 2; j++) {
                body_paths[ne] = 0, body_types[ne] = 1, ne++;
                body_paths[ne] = 3 + l, body_types[ne] = 2, ne++;
                body_stacks[++nb] = ne;
            }
        }
    }
    stack_offsets[NUM_NODES] = NUM_NODES, body_offsets[NUM_NODES] = nb;
    goddp_graph g = *base;
    g.num_module_strings = 6;
    g.module_string_offsets = string_offsets;
    g.module_strings = strings;
    g.node_stack_offsets = stack_offsets;
    g.node_stack_paths = paths;
    g.node_stack_types = types;
    g.node_hop_calls = calls;
    g.node_body_offsets = body_offsets;
    g.body_stack_offsets = body_stacks;
    g.body_stack_paths = body_paths;
    g.body_stack_types = body_types;

    goddp_config cfg = toy_config(GODDP_MODE_DDP);
    cfg.block_cuts = 1;
    goddp_plan *plan = NULL;
    char *msg = NULL;
    goddp_status st = goddp_plan_graph(&g, &cfg, &plan, &msg);
    CHECK(st == GODDP_OK && plan != NULL, "bodies: status %d, message: %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);
    msg = NULL;
    if (st == GODDP_OK && plan != NULL) {
        int ok = plan->node_block_ids != NULL && plan->node_block_ids[0] == -1;
        for (int l = 0; ok && l < LAYERS; l++) {
            ok = plan->node_block_ids[linear_node(l)] == l && plan->node_block_ids[relu_node(l)] == l;
        }
        CHECK(ok, "bodies: block ids");
        CHECK(plan->num_pieces == LAYERS, "bodies: %" PRId64 " pieces", plan->num_pieces);
    }
    goddp_plan_free(plan);

    calls[relu_node(0)] = relu_node(1); /* a relu, which is no call */
    plan = NULL;
    st = goddp_plan_graph(&g, &cfg, &plan, &msg);
    CHECK(st == GODDP_ERR_INVALID_GRAPH && plan == NULL && msg != NULL && strstr(msg, "which is no call") != NULL,
          "bodies: bad call: status %d, message: %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);
    goddp_plan_free(plan);
}

/* A layout's digest (goddp_layout_digest): the same for the same layout,
 * another for other caps; a layout no DDP module could have is refused,
 * and so are offsets that say more positions than the caller's arrays
 * (goddp_span) hold. */
static void check_layout_digest(void) {
    const int64_t offsets[] = {0, 1}, caps[] = {4}, other_caps[] = {5}, no_caps[] = {0}, two[] = {0, 2};
    const int32_t positions[] = {0};
    const goddp_span spans[] = {{offsets, sizeof offsets}, {positions, sizeof positions}, {caps, sizeof caps},
                                {other_caps, sizeof other_caps}, {no_caps, sizeof no_caps}, {two, sizeof two}};
    goddp_layout layout = {.num_buckets = 1, .bucket_offsets = offsets, .positions = positions,
                           .bucket_order = GODDP_ORDER_READY, .build = "b", .num_caps = 1, .caps = caps,
                           .num_spans = 6, .spans = spans};
    uint64_t digest = 0, again = 0, other = 0;
    char *msg = NULL;
    goddp_status st = goddp_layout_digest(&layout, &digest, &msg);
    CHECK(st == GODDP_OK && msg == NULL, "layout digest: status %d, message %s", st, msg ? msg : "(none)");
    st = goddp_layout_digest(&layout, &again, NULL);
    CHECK(st == GODDP_OK && again == digest, "layout digest again: status %d, %016llx vs %016llx", st,
          (unsigned long long)again, (unsigned long long)digest);
    layout.caps = other_caps;
    st = goddp_layout_digest(&layout, &other, NULL);
    CHECK(st == GODDP_OK && other != digest, "layout digest of other caps: status %d", st);

    layout.caps = no_caps;
    msg = NULL;
    st = goddp_layout_digest(&layout, &other, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && msg != NULL, "layout digest of a cap below one byte: status %d", st);
    goddp_string_free(msg);

    layout.caps = caps;
    layout.bucket_offsets = two;
    msg = NULL;
    st = goddp_layout_digest(&layout, &other, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && msg != NULL && strstr(msg, "positions has 1 items; the counts and offsets say 2"),
          "layout digest past the positions: status %d, message %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);

    st = goddp_layout_digest(NULL, &digest, NULL);
    CHECK(st == GODDP_ERR_INVALID_CONFIG, "layout digest of NULL: status %d", st);
}

/* The checkpoint split (goddp_checkpoint_split): JSON text in, JSON text out. */
static void check_checkpoint_split(void) {
    const char *request =
        "{\"calls\": [{\"name\": \"checkpoint\", \"indexed_only\": true, \"nodes\": ["
        "{\"kind\": \"placeholder\"},"
        "{\"kind\": \"compute\", \"block\": 0, \"inputs\": [0], \"carries\": true},"
        "{\"kind\": \"compute\", \"block\": 1, \"inputs\": [1], \"returned\": true, \"carries\": true},"
        "{\"kind\": \"output\", \"inputs\": [2]}]}]}";
    char *reply = NULL, *msg = NULL;
    goddp_status st = goddp_checkpoint_split(request, &reply, &msg);
    CHECK(st == GODDP_OK && reply != NULL && msg == NULL, "checkpoint split: status %d, message %s", st,
          msg ? msg : "(none)");
    CHECK(reply != NULL && strstr(reply, "\"node_regions\":[-1,0,1,-1]") != NULL &&
              strstr(reply, "\"code\":\"\",\"node\":-1,\"region\":-1") != NULL,
          "checkpoint split: reply %s", reply ? reply : "(none)");
    goddp_string_free(reply);
    goddp_string_free(msg);

    reply = NULL;
    msg = NULL;
    st = goddp_checkpoint_split("{\"calls\": [{\"name\": \"c\", \"nodes\": [{\"kind\": \"placeholder\"}]}]}",
                                &reply, &msg);
    CHECK(st == GODDP_ERR_INVALID_GRAPH && reply == NULL && msg != NULL && strstr(msg, "output node") != NULL,
          "checkpoint split without an output: status %d, message %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);

    st = goddp_checkpoint_split(NULL, &reply, NULL);
    CHECK(st == GODDP_ERR_INVALID_CONFIG, "checkpoint split on NULL: status %d", st);
}

/* The timeline (goddp_timeline): JSON text in, JSON text out. Three units
 * of 10 ns, 1 ns a byte: the best buckets are [0, 1) and [1, 3), done at 71. */
static void check_timeline(void) {
    const char *request =
        "{\"backward_ns\": [10, 10, 10], \"bytes\": [20, 5, 30], \"launch_ns\": 1, \"slowdown_permille\": 1000,"
        " \"allreduce\": {\"latency_ns\": 2, \"bytes_per_second\": 1000000000}}";
    char *reply = NULL, *msg = NULL;
    goddp_status st = goddp_timeline(request, &reply, &msg);
    CHECK(st == GODDP_OK && reply != NULL && msg == NULL, "timeline: status %d, message %s", st, msg ? msg : "(none)");
    CHECK(reply != NULL && strstr(reply, "\"step_ns\":71,") != NULL && strstr(reply, "\"search\":\"exact\"") != NULL,
          "timeline: reply %s", reply ? reply : "(none)");
    goddp_string_free(reply);
    goddp_string_free(msg);

    reply = NULL;
    msg = NULL;
    st = goddp_timeline("{\"backward_ns\": [0], \"bytes\": [1]}", &reply, &msg);
    CHECK(st == GODDP_ERR_INVALID_CONFIG && reply == NULL && msg != NULL && strstr(msg, "duration 0") != NULL,
          "timeline of a 0 ns unit: status %d, message %s", st, msg ? msg : "(none)");
    goddp_string_free(msg);
}

int main(void) {
    CHECK(goddp_abi_version() == GODDP_ABI_VERSION, "library ABI %d, header ABI %d", goddp_abi_version(),
          GODDP_ABI_VERSION);
    goddp_graph g = build_toy_graph();

    uint64_t fp_ddp = plan_and_check(&g, GODDP_MODE_DDP);
    uint64_t fp_torch = plan_and_check(&g, GODDP_MODE_TORCH);
    check_fingerprint_stable(&g, GODDP_MODE_DDP, fp_ddp);
    check_fingerprint_stable(&g, GODDP_MODE_TORCH, fp_torch);
    check_aligned(&g);
    check_blocks(&g);
    check_decisions(&g);
    check_bodies(&g);
    check_errors(&g);
    check_max_procs();
    check_layout_digest();
    check_checkpoint_split();
    check_timeline();
    check_threads(&g, fp_ddp);

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
