/*
 * goddp_module.c: the CPython extension goddp._goddp.
 *
 * It links the Go planner (a c-archive of ./bridge) and exposes the C ABI of
 * goddp.h to Python. Like the bridge, it only converts: Python dicts of
 * buffers become a goddp_graph and a goddp_config, a goddp_plan becomes a
 * dict of bytes, a goddp_status becomes PlannerError. The Python side
 * (goddp/native/extension.py) imports this module lazily, because loading it starts
 * the Go runtime.
 *
 * It uses only CPython's limited API as of 3.10 (Py_LIMITED_API, set by
 * setup.py), so one abi3 build serves every CPython >= 3.10 (Note [abi3]).
 *
 * Rules kept here:
 *   - the GIL is released while Go plans, on private copies of the
 *     caller's arrays (the caller may change its own meanwhile);
 *   - a process forked after this module was loaded must never call into Go
 *     (the Go runtime does not survive fork and the call would hang): every
 *     entry point that calls Go checks a flag set by a pthread_atfork child
 *     handler and raises ForkedChildError instead;
 *   - every C plan and message from the library is freed before returning.
 */
/*
 * Note [abi3]: one build for every CPython >= 3.10.
 * The buffer protocol (Py_buffer, PyObject_GetBuffer) joined the limited API
 * only in 3.11. To serve 3.10 as well, each graph array is read through a
 * memoryview instead: its format, itemsize and c_contiguous attributes are
 * checked as the buffer's were, and memoryview.tobytes() copies it into a
 * bytes object whose pointer the limited API does give. One copy per
 * array per plan is a few hundred kilobytes on the largest graphs, far
 * below the cost of planning them, and the copies are private, so the Go
 * call never reads memory the caller can touch. Type names in messages
 * come from type.__name__ (tp_name is not in the limited API).
 */
#ifndef Py_LIMITED_API
#error "goddp_module.c is built with Py_LIMITED_API (setup.py defines it)"
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "goddp.h"

static PyObject *PlannerError;     /* RuntimeError subclass with .code */
static PyObject *ForkedChildError; /* RuntimeError subclass */

/* Set in the child of a fork() by the atfork handler. sig_atomic_t because
 * the handler runs in the child right after fork, when only async-signal-safe
 * work is allowed. */
static volatile sig_atomic_t forked_after_load;

static void mark_forked_after_load(void) { forked_after_load = 1; }

static const char forked_child_message[] =
    "goddp's Go planner cannot run in a process forked after it was loaded; "
    "plan in the parent or use the 'spawn' start method";

/* Returns -1 with ForkedChildError set when Go must not be called. */
static int refuse_in_forked_child(void) {
    if (forked_after_load) {
        PyErr_SetString(ForkedChildError, forked_child_message);
        return -1;
    }
    return 0;
}

/* Raises PlannerError(message) with .code = status, then frees msg (which may
 * be NULL). The message is decoded leniently: a panic value could in
 * principle hold bytes that are not UTF-8. */
static void raise_planner_error(goddp_status status, char *msg) {
    PyObject *text;
    if (msg != NULL) {
        text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    } else {
        text = PyUnicode_FromFormat("goddp planner failed with status %d and no message", (int)status);
    }
    goddp_string_free(msg);
    if (text == NULL) return;
    PyObject *exc = PyObject_CallFunctionObjArgs(PlannerError, text, NULL);
    Py_DECREF(text);
    if (exc == NULL) return;
    PyObject *code = PyLong_FromLong((long)status);
    if (code == NULL || PyObject_SetAttrString(exc, "code", code) < 0) {
        Py_XDECREF(code);
        Py_DECREF(exc);
        return;
    }
    Py_DECREF(code);
    PyErr_SetObject(PlannerError, exc);
    Py_DECREF(exc);
}

/* The name of obj's type for an error message (Note [abi3]). *holder
 * receives a reference that the caller drops after formatting; on failure
 * the name is "?" and no error is left set. */
static const char *type_name(PyObject *obj, PyObject **holder) {
    *holder = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
    const char *name = *holder != NULL ? PyUnicode_AsUTF8AndSize(*holder, NULL) : NULL;
    if (name == NULL) {
        PyErr_Clear();
        return "?";
    }
    return name;
}

/* ---------------------------------------------------------------------- */
/* Dict keys                                                               */

/* Checks that d (a dict called what) has only the given string keys and
 * every one of the first nrequired of them (the rest are optional), raising
 * ValueError that names every unknown and missing key. */
static int check_keys(PyObject *d, const char *what, const char *const *keys, size_t nkeys, size_t nrequired) {
    PyObject *unknown = PyList_New(0), *missing = PyList_New(0);
    int result = -1;
    if (unknown == NULL || missing == NULL) goto done;

    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value)) {
        int known = 0;
        if (PyUnicode_Check(key)) {
            for (size_t i = 0; i < nkeys && !known; i++) known = PyUnicode_CompareWithASCIIString(key, keys[i]) == 0;
        }
        if (!known) {
            PyObject *r = PyObject_Repr(key);
            if (r == NULL || PyList_Append(unknown, r) < 0) {
                Py_XDECREF(r);
                goto done;
            }
            Py_DECREF(r);
        }
    }
    for (size_t i = 0; i < nrequired; i++) {
        PyObject *v = PyDict_GetItemString(d, keys[i]); /* borrowed; cannot raise */
        if (v == NULL) {
            PyObject *r = PyUnicode_FromFormat("'%s'", keys[i]);
            if (r == NULL || PyList_Append(missing, r) < 0) {
                Py_XDECREF(r);
                goto done;
            }
            Py_DECREF(r);
        }
    }
    if (PyList_Size(unknown) == 0 && PyList_Size(missing) == 0) {
        result = 0;
        goto done;
    }
    PyObject *sep = PyUnicode_FromString(", ");
    if (sep == NULL) goto done;
    PyObject *unknown_s = PyUnicode_Join(sep, unknown), *missing_s = PyUnicode_Join(sep, missing);
    Py_DECREF(sep);
    if (unknown_s != NULL && missing_s != NULL) {
        if (PyList_Size(unknown) > 0 && PyList_Size(missing) > 0) {
            PyErr_Format(PyExc_ValueError, "%s has unknown key(s) %U and is missing key(s) %U", what, unknown_s,
                         missing_s);
        } else if (PyList_Size(unknown) > 0) {
            PyErr_Format(PyExc_ValueError, "%s has unknown key(s) %U", what, unknown_s);
        } else {
            PyErr_Format(PyExc_ValueError, "%s is missing key(s) %U", what, missing_s);
        }
    }
    Py_XDECREF(unknown_s);
    Py_XDECREF(missing_s);
done:
    Py_XDECREF(unknown);
    Py_XDECREF(missing);
    return result;
}

/* Reads d[key] as an int64 (anything with __index__), raising TypeError or
 * ValueError naming what[key]. */
static int get_int64(PyObject *d, const char *what, const char *key, int64_t *out) {
    PyObject *obj = PyDict_GetItemString(d, key); /* present: keys were checked */
    if (obj == NULL) {
        PyErr_Format(PyExc_ValueError, "%s is missing key '%s'", what, key);
        return -1;
    }
    PyObject *index = PyNumber_Index(obj);
    if (index == NULL) {
        PyObject *tn;
        PyErr_Format(PyExc_TypeError, "%s['%s'] must be an int, not %.100s", what, key, type_name(obj, &tn));
        Py_XDECREF(tn);
        return -1;
    }
    long long v = PyLong_AsLongLong(index);
    Py_DECREF(index);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "%s['%s'] does not fit in a signed 64-bit integer", what, key);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* Reads the cap d[key] (present: keys were checked): None is
 * GODDP_CAP_NOT_GIVEN, the one place where the shim's "not given" becomes
 * the ABI's (Note [Cap defaults] in planner/settings.go); a given cap may
 * not be that value. Other values are the planner's to judge. */
static int get_cap(PyObject *d, const char *what, const char *key, int64_t *out) {
    if (PyDict_GetItemString(d, key) == Py_None) { /* borrowed; cannot raise */
        *out = GODDP_CAP_NOT_GIVEN;
        return 0;
    }
    if (get_int64(d, what, key, out) < 0) return -1;
    if (*out == GODDP_CAP_NOT_GIVEN) {
        PyErr_Format(PyExc_ValueError, "%s['%s'] is %d bytes; a cap must be > 0 (None: not given)", what, key,
                     GODDP_CAP_NOT_GIVEN);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Graph arrays                                                            */

enum graph_array {
    NODE_OPS,
    NODE_MODULE_IDS,
    NODE_PARAM_OFFSETS,
    NODE_PARAMS,
    NODE_PARAM_REFS,
    NODE_USER_OFFSETS,
    NODE_USERS,
    PARAM_BYTES,
    PARAM_STORAGE_BYTES,
    PARAM_DTYPES,
    PARAM_DEVICES,
    PARAM_FLAGS,
    PARAM_NAME_OFFSETS,
    PARAM_NAMES,
    NODE_BLOCK_IDS, /* optional (ABI 4) */
    PARAM_DDP_POSITIONS, /* optional (ABI 5): absent or None means NULL */
    /* Optional (ABI 6), all five or none: the module stacks. */
    MODULE_STRING_OFFSETS,
    MODULE_STRINGS,
    NODE_STACK_OFFSETS,
    NODE_STACK_PATHS,
    NODE_STACK_TYPES,
    NODE_WEIGHTS,
    /* Optional (ABI 10), all five or none, with the module stacks: the body facts. */
    NODE_HOP_CALLS,
    NODE_BODY_OFFSETS,
    BODY_STACK_OFFSETS,
    BODY_STACK_PATHS,
    BODY_STACK_TYPES,
    NODE_FLOPS,
    NODE_BYTES,
    NUM_GRAPH_ARRAYS
};
#define FIRST_OPTIONAL_ARRAY NODE_BLOCK_IDS

static const struct {
    const char *name;
    Py_ssize_t itemsize;
    const char *hint; /* a Python type that has this item size */
} graph_arrays[NUM_GRAPH_ARRAYS] = {
    [NODE_OPS] = {"node_ops", 4, "int32, e.g. array('i')"},
    [NODE_MODULE_IDS] = {"node_module_ids", 4, "int32, e.g. array('i')"},
    [NODE_PARAM_OFFSETS] = {"node_param_offsets", 8, "int64, e.g. array('q')"},
    [NODE_PARAMS] = {"node_params", 4, "int32, e.g. array('i')"},
    [NODE_PARAM_REFS] = {"node_param_refs", 1, "uint8, e.g. bytes or array('B')"},
    [NODE_USER_OFFSETS] = {"node_user_offsets", 8, "int64, e.g. array('q')"},
    [NODE_USERS] = {"node_users", 4, "int32, e.g. array('i')"},
    [PARAM_BYTES] = {"param_bytes", 8, "int64, e.g. array('q')"},
    [PARAM_STORAGE_BYTES] = {"param_storage_bytes", 8, "int64, e.g. array('q')"},
    [PARAM_DTYPES] = {"param_dtypes", 4, "int32, e.g. array('i')"},
    [PARAM_DEVICES] = {"param_devices", 4, "int32, e.g. array('i')"},
    [PARAM_FLAGS] = {"param_flags", 4, "uint32, e.g. array('I')"},
    [PARAM_NAME_OFFSETS] = {"param_name_offsets", 8, "int64, e.g. array('q')"},
    [PARAM_NAMES] = {"param_names", 1, "UTF-8 bytes"},
    [NODE_BLOCK_IDS] = {"node_block_ids", 4, "int32, e.g. array('i')"},
    [PARAM_DDP_POSITIONS] = {"param_ddp_positions", 4, "int32, e.g. array('i')"},
    [MODULE_STRING_OFFSETS] = {"module_string_offsets", 8, "int64, e.g. array('q')"},
    [MODULE_STRINGS] = {"module_strings", 1, "UTF-8 bytes"},
    [NODE_STACK_OFFSETS] = {"node_stack_offsets", 8, "int64, e.g. array('q')"},
    [NODE_STACK_PATHS] = {"node_stack_paths", 4, "int32, e.g. array('i')"},
    [NODE_STACK_TYPES] = {"node_stack_types", 4, "int32, e.g. array('i')"},
    [NODE_WEIGHTS] = {"node_weights", 4, "int32, e.g. array('i')"},
    [NODE_HOP_CALLS] = {"node_hop_calls", 4, "int32, e.g. array('i')"},
    [NODE_BODY_OFFSETS] = {"node_body_offsets", 8, "int64, e.g. array('q')"},
    [BODY_STACK_OFFSETS] = {"body_stack_offsets", 8, "int64, e.g. array('q')"},
    [BODY_STACK_PATHS] = {"body_stack_paths", 4, "int32, e.g. array('i')"},
    [BODY_STACK_TYPES] = {"body_stack_types", 4, "int32, e.g. array('i')"},
    [NODE_FLOPS] = {"node_flops", 8, "int64, e.g. array('q')"},
    [NODE_BYTES] = {"node_bytes", 8, "int64, e.g. array('q')"},
};

static const char *const graph_keys[] = {
    "num_nodes",          "node_ops",          "node_module_ids", "node_param_offsets",  "node_params",
    "node_param_refs",    "node_user_offsets", "node_users",      "num_params",          "param_bytes",
    "param_storage_bytes", "param_dtypes",     "param_devices",   "param_flags",         "param_name_offsets",
    "param_names",
    "node_block_ids", /* optional: absent or None means no block information (ABI 4) */
    "param_ddp_positions", /* optional (ABI 5): absent or None means NULL */
    /* optional (ABI 6), all or none: the module stacks */
    "module_string_offsets", "module_strings", "node_stack_offsets", "node_stack_paths", "node_stack_types",
    "node_weights", /* optional (ABI 7): absent or None means one each */
    /* optional (ABI 10), all or none, with the module stacks: the body facts */
    "node_hop_calls", "node_body_offsets", "body_stack_offsets", "body_stack_paths", "body_stack_types",
    /* optional (ABI 12), both or neither: the node costs */
    "node_flops", "node_bytes",
};
#define NUM_GRAPH_KEYS (sizeof graph_keys / sizeof graph_keys[0])
#define NUM_REQUIRED_GRAPH_KEYS 16 /* the optional ones come last */

/* The required keys first, then the optional ones (added in later ABI
 * versions; callers written before them keep working). */
static const char *const config_keys[] = {
    "mode", "bucket_cap_bytes", "first_bucket_cap_bytes", "bucket_caps_bytes", "max_pieces",
    "align_buckets", /* optional, default 0 (ABI 2) */
    "bucket_order",  /* optional, default 0 = GODDP_ORDER_READY (ABI 5) */
    "block_cuts",    /* optional, default 0 (ABI 6) */
    "edges",         /* optional, default 0 = GODDP_EDGES_COMPILE (ABI 6) */
    "ddp",           /* optional dict (ddp_keys) or None: the DDP module's settings (ABI 6) */
    "uniform_caps",  /* optional, default 0 (ABI 9) */
};
#define NUM_CONFIG_KEYS (sizeof config_keys / sizeof config_keys[0])
#define NUM_REQUIRED_CONFIG_KEYS 5

/* The keys of config['ddp'], goddp_ddp's fields (the first two required). */
static const char *const ddp_keys[] = {
    "bucket_cap_bytes", "first_bucket_cap_bytes", /* the first None: this torch keeps none */
    "bucket_caps_bytes", "flags", "num_params",   /* optional: (), 0, 0 */
};
#define NUM_DDP_KEYS (sizeof ddp_keys / sizeof ddp_keys[0])
#define NUM_REQUIRED_DDP_KEYS 2

static const char *const plan_keys[] = {
    "fingerprint",          "num_nodes",            "node_pieces",          "num_pieces",
    "num_buckets",          "bucket_bytes",         "bucket_pieces",        "bucket_node_begin",
    "bucket_node_end",      "bucket_extended",      "bucket_param_offsets", "bucket_params",
    "piece_input_offsets",  "piece_inputs",         "piece_output_offsets", "piece_outputs",
    "alignment",            "ddp_caps",             "merged_cuts",
    /* ABI 6: the decisions */
    "bucket_cap_bytes",     "first_bucket_cap_bytes", "bucket_caps_bytes",  "max_pieces",
    "align_buckets",        "bucket_order",         "align_reason",         "aligned_params",
    "num_counted_params",   "piece_param_offsets",  "piece_params",
    "eager_pieces",         "node_block_ids",
    /* ABI 8 */
    "ddp_bucket_order",
    /* ABI 9 */
    "block_runs",           "checkpoint_regions",
};
#define NUM_PLAN_KEYS (sizeof plan_keys / sizeof plan_keys[0])

/* True when a buffer format names a single integer in native byte order, so
 * that reading its items as C integers of the same size is exact. Item sizes
 * are checked separately. A float array of the right size is refused here
 * rather than reinterpreted. */
static int is_native_integer_format(const char *fmt) {
    if (fmt == NULL) return 1; /* NULL means unsigned bytes */
    const uint16_t probe = 1;
    const int little_endian = *(const uint8_t *)&probe == 1;
    if (*fmt == '@' || *fmt == '=') {
        fmt++;
    } else if (*fmt == '<' || *fmt == '>' || *fmt == '!') {
        int little = *fmt == '<';
        if (little != little_endian) return 0;
        fmt++;
    }
    return fmt[0] != '\0' && fmt[1] == '\0' && strchr("bBhHiIlLqQnN", fmt[0]) != NULL;
}

/* A copy of one of the caller's arrays (Note [abi3]). */
struct graph_view {
    PyObject *copy; /* bytes; owns buf */
    void *buf;
    Py_ssize_t len; /* in bytes */
};

/* The copies for the duration of one plan_graph call. */
struct graph_views {
    struct graph_view views[NUM_GRAPH_ARRAYS];
    int held[NUM_GRAPH_ARRAYS];
};

static void release_graph_views(struct graph_views *gv) {
    for (int i = 0; i < NUM_GRAPH_ARRAYS; i++) {
        if (gv->held[i]) {
            Py_CLEAR(gv->views[i].copy);
            gv->held[i] = 0;
        }
    }
}

static Py_ssize_t view_len(const struct graph_views *gv, enum graph_array a) {
    return gv->views[a].len / graph_arrays[a].itemsize;
}

/* Copies graph[name], a C-contiguous buffer of the field's item size. */
static int get_graph_view(PyObject *graph, struct graph_views *gv, enum graph_array a) {
    const char *name = graph_arrays[a].name;
    PyObject *obj = PyDict_GetItemString(graph, name);
    if (obj == NULL) {
        PyErr_Format(PyExc_ValueError, "graph is missing key '%s'", name);
        return -1;
    }
    PyObject *view = PyMemoryView_FromObject(obj);
    PyObject *contiguous = NULL, *format = NULL, *itemsize_obj = NULL;
    int rc = -1;
    int is_contiguous = view != NULL ? -1 : 0;
    if (view != NULL && (contiguous = PyObject_GetAttrString(view, "c_contiguous")) != NULL) {
        is_contiguous = PyObject_IsTrue(contiguous);
    }
    if (is_contiguous != 1) {
        int not_a_buffer = view == NULL && PyErr_ExceptionMatches(PyExc_TypeError);
        PyErr_Clear(); /* replaced by an error that names the field */
        PyObject *tn;
        PyErr_Format(not_a_buffer ? PyExc_TypeError : PyExc_ValueError,
                     "graph['%s'] must be a C-contiguous buffer of %s, not %.100s%s", name, graph_arrays[a].hint,
                     type_name(obj, &tn), not_a_buffer ? "" : " (not C-contiguous)");
        Py_XDECREF(tn);
        goto done;
    }
    if ((format = PyObject_GetAttrString(view, "format")) == NULL ||
        (itemsize_obj = PyObject_GetAttrString(view, "itemsize")) == NULL) {
        goto done;
    }
    const char *fmt = PyUnicode_AsUTF8AndSize(format, NULL);
    Py_ssize_t itemsize = PyLong_AsSsize_t(itemsize_obj);
    if (fmt == NULL || (itemsize == -1 && PyErr_Occurred())) goto done;
    if (itemsize != graph_arrays[a].itemsize || !is_native_integer_format(fmt)) {
        PyErr_Format(PyExc_ValueError,
                     "graph['%s'] must hold %s (native integers of %zd bytes); got format '%s' with item size %zd",
                     name, graph_arrays[a].hint, graph_arrays[a].itemsize, fmt, itemsize);
        goto done;
    }
    struct graph_view *v = &gv->views[a];
    if ((v->copy = PyObject_CallMethod(view, "tobytes", NULL)) == NULL) goto done;
    gv->held[a] = 1;
    v->buf = PyBytes_AsString(v->copy);
    v->len = PyBytes_Size(v->copy);
    if (v->buf == NULL || v->len < 0) goto done;
    rc = 0;
done:
    Py_XDECREF(itemsize_obj);
    Py_XDECREF(format);
    Py_XDECREF(contiguous);
    Py_XDECREF(view); /* releases the caller's buffer */
    return rc;
}

/* Checks that array a has exactly want items; count_desc says where want
 * came from. */
static int check_len(const struct graph_views *gv, enum graph_array a, int64_t want, const char *count_desc) {
    Py_ssize_t got = view_len(gv, a);
    if ((int64_t)got != want) {
        PyErr_Format(PyExc_ValueError, "graph['%s'] has %zd items but %s is %lld", graph_arrays[a].name, got,
                     count_desc, (long long)want);
        return -1;
    }
    return 0;
}

/* The length of a CSR values array: the last entry of its offsets array,
 * which must already have passed check_len. */
static int csr_values_len(const struct graph_views *gv, enum graph_array offsets, int64_t *out) {
    Py_ssize_t n = view_len(gv, offsets);
    int64_t last = ((const int64_t *)gv->views[offsets].buf)[n - 1];
    if (last < 0) {
        PyErr_Format(PyExc_ValueError, "graph['%s'][-1] is %lld; offsets must be >= 0", graph_arrays[offsets].name,
                     (long long)last);
        return -1;
    }
    *out = last;
    return 0;
}

/* Checks the module stack arrays (ABI 6): all five or none, with lengths
 * that agree; *num_strings receives the string table's size. */
static int stacks_from_views(const struct graph_views *gv, int64_t num_nodes, int64_t *num_strings) {
    int held = 0;
    for (int a = MODULE_STRING_OFFSETS; a <= NODE_STACK_TYPES; a++) held += gv->held[a];
    if (held == 0) return 0;
    if (held != NODE_STACK_TYPES - MODULE_STRING_OFFSETS + 1) {
        PyErr_SetString(PyExc_ValueError,
                        "graph: the module stacks need all of 'module_string_offsets', 'module_strings', "
                        "'node_stack_offsets', 'node_stack_paths' and 'node_stack_types', or none");
        return -1;
    }
    Py_ssize_t n = view_len(gv, MODULE_STRING_OFFSETS);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "graph['module_string_offsets'] is empty; it needs one entry more than there are strings");
        return -1;
    }
    *num_strings = (int64_t)n - 1;
    int64_t names_len, num_entries;
    if (check_len(gv, NODE_STACK_OFFSETS, num_nodes + 1, "num_nodes + 1") < 0 ||
        csr_values_len(gv, MODULE_STRING_OFFSETS, &names_len) < 0 ||
        csr_values_len(gv, NODE_STACK_OFFSETS, &num_entries) < 0 ||
        check_len(gv, MODULE_STRINGS, names_len, "module_string_offsets[-1]") < 0 ||
        check_len(gv, NODE_STACK_PATHS, num_entries, "node_stack_offsets[num_nodes]") < 0 ||
        check_len(gv, NODE_STACK_TYPES, num_entries, "node_stack_offsets[num_nodes]") < 0) {
        return -1;
    }
    return 0;
}

/* Checks the body facts (ABI 10): all five or none, only with the module
 * stacks, with lengths that agree. */
static int bodies_from_views(const struct graph_views *gv, int64_t num_nodes) {
    int held = 0;
    for (int a = NODE_HOP_CALLS; a <= BODY_STACK_TYPES; a++) held += gv->held[a];
    if (held == 0) return 0;
    if (held != BODY_STACK_TYPES - NODE_HOP_CALLS + 1) {
        PyErr_SetString(PyExc_ValueError,
                        "graph: the body facts need all of 'node_hop_calls', 'node_body_offsets', "
                        "'body_stack_offsets', 'body_stack_paths' and 'body_stack_types', or none");
        return -1;
    }
    if (!gv->held[NODE_STACK_OFFSETS]) {
        PyErr_SetString(PyExc_ValueError, "graph: the body facts ('node_hop_calls', ...) need the module stacks");
        return -1;
    }
    int64_t body_nodes, num_entries;
    if (check_len(gv, NODE_HOP_CALLS, num_nodes, "num_nodes") < 0 ||
        check_len(gv, NODE_BODY_OFFSETS, num_nodes + 1, "num_nodes + 1") < 0 ||
        csr_values_len(gv, NODE_BODY_OFFSETS, &body_nodes) < 0 ||
        check_len(gv, BODY_STACK_OFFSETS, body_nodes + 1, "node_body_offsets[num_nodes] + 1") < 0 ||
        csr_values_len(gv, BODY_STACK_OFFSETS, &num_entries) < 0 ||
        check_len(gv, BODY_STACK_PATHS, num_entries, "body_stack_offsets[-1]") < 0 ||
        check_len(gv, BODY_STACK_TYPES, num_entries, "body_stack_offsets[-1]") < 0) {
        return -1;
    }
    return 0;
}

/* Fills g from the graph dict, exporting every array into gv. On failure
 * some views may be held: the caller always calls release_graph_views. */
static int graph_from_dict(PyObject *graph, struct graph_views *gv, goddp_graph *g) {
    if (!PyDict_Check(graph)) {
        PyObject *tn;
        PyErr_Format(PyExc_TypeError, "graph must be a dict, not %.100s", type_name(graph, &tn));
        Py_XDECREF(tn);
        return -1;
    }
    if (check_keys(graph, "graph", graph_keys, NUM_GRAPH_KEYS, NUM_REQUIRED_GRAPH_KEYS) < 0) return -1;

    int64_t num_nodes, num_params;
    if (get_int64(graph, "graph", "num_nodes", &num_nodes) < 0) return -1;
    if (get_int64(graph, "graph", "num_params", &num_params) < 0) return -1;
    if (num_nodes < 0 || num_nodes >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "graph['num_nodes'] is %lld; must be in [0, 2**31 - 1)", (long long)num_nodes);
        return -1;
    }
    if (num_params < 0 || num_params >= INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "graph['num_params'] is %lld; must be in [0, 2**31 - 1)",
                     (long long)num_params);
        return -1;
    }
    for (int a = 0; a < NUM_GRAPH_ARRAYS; a++) {
        if (a >= FIRST_OPTIONAL_ARRAY) {
            /* Optional arrays: absent or None means NULL. */
            PyObject *optional = PyDict_GetItemString(graph, graph_arrays[a].name); /* borrowed */
            if (optional == NULL || optional == Py_None) continue;
        }
        if (get_graph_view(graph, gv, (enum graph_array)a) < 0) return -1;
    }
    if (gv->held[NODE_BLOCK_IDS] && check_len(gv, NODE_BLOCK_IDS, num_nodes, "num_nodes") < 0) return -1;
    if (gv->held[PARAM_DDP_POSITIONS] && check_len(gv, PARAM_DDP_POSITIONS, num_params, "num_params") < 0) return -1;
    int64_t num_module_strings = 0;
    if (stacks_from_views(gv, num_nodes, &num_module_strings) < 0) return -1;
    if (gv->held[NODE_WEIGHTS] && check_len(gv, NODE_WEIGHTS, num_nodes, "num_nodes") < 0) return -1;
    if (bodies_from_views(gv, num_nodes) < 0) return -1;
    if (gv->held[NODE_FLOPS] != gv->held[NODE_BYTES]) {
        PyErr_SetString(PyExc_ValueError, "graph: the node costs need both 'node_flops' and 'node_bytes', or neither");
        return -1;
    }
    if (gv->held[NODE_FLOPS] && (check_len(gv, NODE_FLOPS, num_nodes, "num_nodes") < 0 ||
                                 check_len(gv, NODE_BYTES, num_nodes, "num_nodes") < 0)) {
        return -1;
    }

    if (check_len(gv, NODE_OPS, num_nodes, "num_nodes") < 0 ||
        check_len(gv, NODE_MODULE_IDS, num_nodes, "num_nodes") < 0 ||
        check_len(gv, NODE_PARAM_OFFSETS, num_nodes + 1, "num_nodes + 1") < 0 ||
        check_len(gv, NODE_USER_OFFSETS, num_nodes + 1, "num_nodes + 1") < 0 ||
        check_len(gv, PARAM_BYTES, num_params, "num_params") < 0 ||
        check_len(gv, PARAM_STORAGE_BYTES, num_params, "num_params") < 0 ||
        check_len(gv, PARAM_DTYPES, num_params, "num_params") < 0 ||
        check_len(gv, PARAM_DEVICES, num_params, "num_params") < 0 ||
        check_len(gv, PARAM_FLAGS, num_params, "num_params") < 0 ||
        check_len(gv, PARAM_NAME_OFFSETS, num_params + 1, "num_params + 1") < 0) {
        return -1;
    }
    int64_t num_refs, num_users, names_len;
    if (csr_values_len(gv, NODE_PARAM_OFFSETS, &num_refs) < 0 ||
        csr_values_len(gv, NODE_USER_OFFSETS, &num_users) < 0 ||
        csr_values_len(gv, PARAM_NAME_OFFSETS, &names_len) < 0) {
        return -1;
    }
    if (check_len(gv, NODE_PARAMS, num_refs, "node_param_offsets[num_nodes]") < 0 ||
        check_len(gv, NODE_PARAM_REFS, num_refs, "node_param_offsets[num_nodes]") < 0 ||
        check_len(gv, NODE_USERS, num_users, "node_user_offsets[num_nodes]") < 0 ||
        check_len(gv, PARAM_NAMES, names_len, "param_name_offsets[num_params]") < 0) {
        return -1;
    }

    g->num_nodes = num_nodes;
    g->node_ops = gv->views[NODE_OPS].buf;
    g->node_module_ids = gv->views[NODE_MODULE_IDS].buf;
    g->node_param_offsets = gv->views[NODE_PARAM_OFFSETS].buf;
    g->node_params = gv->views[NODE_PARAMS].buf;
    g->node_param_refs = gv->views[NODE_PARAM_REFS].buf;
    g->node_user_offsets = gv->views[NODE_USER_OFFSETS].buf;
    g->node_users = gv->views[NODE_USERS].buf;
    g->num_params = num_params;
    g->param_bytes = gv->views[PARAM_BYTES].buf;
    g->param_storage_bytes = gv->views[PARAM_STORAGE_BYTES].buf;
    g->param_dtypes = gv->views[PARAM_DTYPES].buf;
    g->param_devices = gv->views[PARAM_DEVICES].buf;
    g->param_flags = gv->views[PARAM_FLAGS].buf;
    g->param_name_offsets = gv->views[PARAM_NAME_OFFSETS].buf;
    g->param_names = gv->views[PARAM_NAMES].buf;
    g->node_block_ids = gv->held[NODE_BLOCK_IDS] ? gv->views[NODE_BLOCK_IDS].buf : NULL;
    g->param_ddp_positions = gv->held[PARAM_DDP_POSITIONS] ? gv->views[PARAM_DDP_POSITIONS].buf : NULL;
    if (gv->held[NODE_STACK_OFFSETS]) {
        g->num_module_strings = num_module_strings;
        g->module_string_offsets = gv->views[MODULE_STRING_OFFSETS].buf;
        g->module_strings = gv->views[MODULE_STRINGS].buf;
        g->node_stack_offsets = gv->views[NODE_STACK_OFFSETS].buf;
        g->node_stack_paths = gv->views[NODE_STACK_PATHS].buf;
        g->node_stack_types = gv->views[NODE_STACK_TYPES].buf;
    }
    g->node_weights = gv->held[NODE_WEIGHTS] ? gv->views[NODE_WEIGHTS].buf : NULL;
    if (gv->held[NODE_HOP_CALLS]) {
        g->node_hop_calls = gv->views[NODE_HOP_CALLS].buf;
        g->node_body_offsets = gv->views[NODE_BODY_OFFSETS].buf;
        g->body_stack_offsets = gv->views[BODY_STACK_OFFSETS].buf;
        g->body_stack_paths = gv->views[BODY_STACK_PATHS].buf;
        g->body_stack_types = gv->views[BODY_STACK_TYPES].buf;
    }
    g->node_flops = gv->held[NODE_FLOPS] ? gv->views[NODE_FLOPS].buf : NULL;
    g->node_bytes = gv->held[NODE_BYTES] ? gv->views[NODE_BYTES].buf : NULL;
    return 0;
}

/* Reads seq_obj (a sequence of ints, called what) into a PyMem buffer
 * *caps of *n items (NULL when empty) that the caller frees. */
static int read_caps(PyObject *seq_obj, const char *what, int64_t *n_out, int64_t **caps) {
    *caps = NULL;
    *n_out = 0;
    if (PyUnicode_Check(seq_obj) || PyBytes_Check(seq_obj) || PyByteArray_Check(seq_obj)) {
        PyObject *tn;
        PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints, not %.100s", what, type_name(seq_obj, &tn));
        Py_XDECREF(tn);
        return -1;
    }
    PyObject *seq = PySequence_List(seq_obj); /* what PySequence_Fast does, in the limited API */
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints", what);
        }
        return -1;
    }
    Py_ssize_t n = PyList_Size(seq);
    if (n > 0) {
        *caps = PyMem_New(int64_t, n);
        if (*caps == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = PyList_GetItem(seq, i); /* borrowed */
            PyObject *index = PyNumber_Index(item);
            long long v = index ? PyLong_AsLongLong(index) : -1;
            Py_XDECREF(index);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Format(PyExc_ValueError, "%s[%zd] must be an int64, got %R", what, i, item);
                Py_DECREF(seq);
                return -1;
            }
            (*caps)[i] = (int64_t)v;
        }
    }
    *n_out = n;
    Py_DECREF(seq);
    return 0;
}

/* Reads an optional int32 key of d (absent: 0). */
static int get_optional_int32(PyObject *d, const char *what, const char *key, int32_t *out) {
    *out = 0;
    if (PyDict_GetItemString(d, key) == NULL) return 0; /* borrowed; cannot raise */
    int64_t v;
    if (get_int64(d, what, key, &v) < 0) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s['%s'] is %lld; must fit in int32", what, key, (long long)v);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* Buffers that config_from_dict allocates; the caller frees them. */
struct config_storage {
    int64_t *caps;
    int64_t *ddp_caps;
    goddp_ddp ddp;
};

/* Fills ddp from config['ddp'] (a dict of ddp_keys). */
static int ddp_from_dict(PyObject *d, goddp_ddp *ddp, int64_t **caps) {
    const char *what = "config['ddp']";
    if (!PyDict_Check(d)) {
        PyObject *tn;
        PyErr_Format(PyExc_TypeError, "%s must be a dict or None, not %.100s", what, type_name(d, &tn));
        Py_XDECREF(tn);
        return -1;
    }
    if (check_keys(d, what, ddp_keys, NUM_DDP_KEYS, NUM_REQUIRED_DDP_KEYS) < 0) return -1;
    int64_t v;
    if (get_int64(d, what, "bucket_cap_bytes", &v) < 0) return -1;
    ddp->bucket_cap_bytes = v;
    if (get_cap(d, what, "first_bucket_cap_bytes", &ddp->first_bucket_cap_bytes) < 0) return -1;
    PyObject *caps_obj = PyDict_GetItemString(d, "bucket_caps_bytes");
    if (caps_obj != NULL && caps_obj != Py_None) {
        int64_t n;
        if (read_caps(caps_obj, "config['ddp']['bucket_caps_bytes']", &n, caps) < 0) return -1;
        ddp->num_bucket_caps = n;
        ddp->bucket_caps_bytes = *caps;
    }
    if (PyDict_GetItemString(d, "flags") != NULL) {
        if (get_int64(d, what, "flags", &v) < 0) return -1;
        if (v < 0 || v > UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "%s['flags'] is %lld; must fit in uint32", what, (long long)v);
            return -1;
        }
        ddp->flags = (uint32_t)v; /* the planner judges unknown bits */
    }
    if (PyDict_GetItemString(d, "num_params") != NULL) {
        if (get_int64(d, what, "num_params", &v) < 0) return -1;
        ddp->num_params = v;
    }
    return 0;
}

/* Fills cfg from the config dict. The buffers it allocates go into st,
 * which the caller releases with PyMem_Free on each. */
static int config_from_dict(PyObject *config, goddp_config *cfg, struct config_storage *st) {
    if (!PyDict_Check(config)) {
        PyObject *tn;
        PyErr_Format(PyExc_TypeError, "config must be a dict, not %.100s", type_name(config, &tn));
        Py_XDECREF(tn);
        return -1;
    }
    if (check_keys(config, "config", config_keys, NUM_CONFIG_KEYS, NUM_REQUIRED_CONFIG_KEYS) < 0) return -1;
    int64_t mode;
    if (get_int64(config, "config", "mode", &mode) < 0) return -1;
    if (mode < INT32_MIN || mode > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "config['mode'] is %lld; must fit in int32", (long long)mode);
        return -1;
    }
    cfg->mode = (int32_t)mode;
    /* None: the planner fills the cap in. */
    if (get_cap(config, "config", "bucket_cap_bytes", &cfg->bucket_cap_bytes) < 0 ||
        get_cap(config, "config", "first_bucket_cap_bytes", &cfg->first_bucket_cap_bytes) < 0) {
        return -1;
    }
    int64_t max_pieces;
    if (get_int64(config, "config", "max_pieces", &max_pieces) < 0) return -1;
    cfg->max_pieces = max_pieces;

    /* Optional: a bool or an int, nonzero meaning on. */
    cfg->align_buckets = 0;
    if (PyDict_GetItemString(config, "align_buckets") != NULL) { /* borrowed; cannot raise */
        int64_t align;
        if (get_int64(config, "config", "align_buckets", &align) < 0) return -1;
        cfg->align_buckets = align != 0;
    }
    /* Optional enums and switches; the planner judges their values. */
    int32_t block_cuts, uniform_caps;
    if (get_optional_int32(config, "config", "bucket_order", &cfg->bucket_order) < 0 ||
        get_optional_int32(config, "config", "block_cuts", &block_cuts) < 0 ||
        get_optional_int32(config, "config", "edges", &cfg->edges) < 0 ||
        get_optional_int32(config, "config", "uniform_caps", &uniform_caps) < 0) {
        return -1;
    }
    cfg->block_cuts = block_cuts != 0;
    cfg->uniform_caps = uniform_caps != 0;

    int64_t n;
    if (read_caps(PyDict_GetItemString(config, "bucket_caps_bytes"), "config['bucket_caps_bytes']", &n, &st->caps) < 0)
        return -1;
    cfg->num_bucket_caps = n;
    cfg->bucket_caps_bytes = st->caps;

    PyObject *ddp = PyDict_GetItemString(config, "ddp"); /* borrowed */
    cfg->ddp = NULL;
    if (ddp != NULL && ddp != Py_None) {
        if (ddp_from_dict(ddp, &st->ddp, &st->ddp_caps) < 0) return -1;
        cfg->ddp = &st->ddp;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* Plan to dict                                                            */

/* d[key] = bytes of count items of itemsize at p. */
static int set_bytes(PyObject *d, const char *key, const void *p, int64_t count, size_t itemsize) {
    if (count < 0 || (count > 0 && p == NULL) || (uint64_t)count > (uint64_t)PY_SSIZE_T_MAX / itemsize) {
        PyErr_Format(PyExc_RuntimeError, "goddp: library returned a malformed plan (%s: %lld items)", key,
                     (long long)count);
        return -1;
    }
    PyObject *b = PyBytes_FromStringAndSize(count > 0 ? p : NULL, (Py_ssize_t)(count * (int64_t)itemsize));
    if (b == NULL) return -1;
    int rc = PyDict_SetItemString(d, key, b);
    Py_DECREF(b);
    return rc;
}

static int set_int(PyObject *d, const char *key, PyObject *v) {
    if (v == NULL) return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

/* The last offset of a CSR offsets array of count + 1 entries. */
static int64_t csr_total(const int64_t *offsets, int64_t count) { return offsets == NULL ? -1 : offsets[count]; }

static PyObject *plan_to_dict(const goddp_plan *p) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    int64_t nn = p->num_nodes, np = p->num_pieces, nb = p->num_buckets;
    if (nn < 0 || np < 0 || nb < 0) {
        PyErr_SetString(PyExc_RuntimeError, "goddp: library returned a plan with negative counts");
        goto fail;
    }
    if (set_int(d, "fingerprint", PyLong_FromUnsignedLongLong(p->fingerprint)) < 0 ||
        set_int(d, "num_nodes", PyLong_FromLongLong(nn)) < 0 ||
        set_int(d, "num_pieces", PyLong_FromLongLong(np)) < 0 ||
        set_int(d, "num_buckets", PyLong_FromLongLong(nb)) < 0 ||
        set_bytes(d, "node_pieces", p->node_pieces, nn, sizeof(int32_t)) < 0 ||
        set_bytes(d, "bucket_bytes", p->bucket_bytes, nb, sizeof(int64_t)) < 0 ||
        set_bytes(d, "bucket_pieces", p->bucket_pieces, nb, sizeof(int32_t)) < 0 ||
        set_bytes(d, "bucket_node_begin", p->bucket_node_begin, nb, sizeof(int64_t)) < 0 ||
        set_bytes(d, "bucket_node_end", p->bucket_node_end, nb, sizeof(int64_t)) < 0 ||
        set_bytes(d, "bucket_extended", p->bucket_extended, nb, sizeof(uint8_t)) < 0 ||
        set_bytes(d, "bucket_param_offsets", p->bucket_param_offsets, nb + 1, sizeof(int64_t)) < 0 ||
        set_bytes(d, "bucket_params", p->bucket_params, csr_total(p->bucket_param_offsets, nb), sizeof(int32_t)) <
            0 ||
        set_bytes(d, "piece_input_offsets", p->piece_input_offsets, np + 1, sizeof(int64_t)) < 0 ||
        set_bytes(d, "piece_inputs", p->piece_inputs, csr_total(p->piece_input_offsets, np),
                  sizeof(int32_t)) < 0 ||
        set_bytes(d, "piece_output_offsets", p->piece_output_offsets, np + 1, sizeof(int64_t)) < 0 ||
        set_bytes(d, "piece_outputs", p->piece_outputs, csr_total(p->piece_output_offsets, np),
                  sizeof(int32_t)) < 0 ||
        set_int(d, "alignment", PyLong_FromLong((long)p->alignment)) < 0 ||
        set_bytes(d, "ddp_caps", p->ddp_caps, p->num_ddp_caps, sizeof(int64_t)) < 0 ||
        set_int(d, "merged_cuts", PyLong_FromLongLong(p->merged_cuts)) < 0 ||
        set_int(d, "bucket_cap_bytes", PyLong_FromLongLong(p->bucket_cap_bytes)) < 0 ||
        set_int(d, "first_bucket_cap_bytes", PyLong_FromLongLong(p->first_bucket_cap_bytes)) < 0 ||
        set_bytes(d, "bucket_caps_bytes", p->bucket_caps_bytes, p->num_bucket_caps, sizeof(int64_t)) < 0 ||
        set_int(d, "max_pieces", PyLong_FromLongLong(p->max_pieces)) < 0 ||
        set_int(d, "align_buckets", PyBool_FromLong(p->align_buckets)) < 0 ||
        set_int(d, "bucket_order", PyLong_FromLong((long)p->bucket_order)) < 0 ||
        set_int(d, "align_reason", PyLong_FromLong((long)p->align_reason)) < 0 ||
        set_int(d, "aligned_params", PyLong_FromLongLong(p->aligned_params)) < 0 ||
        set_int(d, "ddp_bucket_order", PyLong_FromLong((long)p->ddp_bucket_order)) < 0 ||
        set_int(d, "block_runs", PyBool_FromLong(p->block_runs)) < 0 ||
        set_int(d, "checkpoint_regions", PyBool_FromLong(p->checkpoint_regions)) < 0 ||
        set_int(d, "num_counted_params", PyLong_FromLongLong(p->num_counted_params)) < 0 ||
        set_bytes(d, "piece_param_offsets", p->piece_param_offsets, np + 1, sizeof(int64_t)) < 0 ||
        set_bytes(d, "piece_params", p->piece_params, csr_total(p->piece_param_offsets, np), sizeof(int32_t)) < 0 ||
        set_bytes(d, "eager_pieces", p->eager_pieces, p->num_eager_pieces, sizeof(int32_t)) < 0) {
        goto fail;
    }
    /* None when the graph has no blocks. */
    if (p->node_block_ids == NULL) {
        if (PyDict_SetItemString(d, "node_block_ids", Py_None) < 0) goto fail;
    } else if (set_bytes(d, "node_block_ids", p->node_block_ids, nn, sizeof(int32_t)) < 0) {
        goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* Module functions                                                        */

PyDoc_STRVAR(plan_graph_doc,
             "plan_graph(graph, config) -> dict\n\n"
             "Plans a forward graph. graph and config are dicts whose keys are exactly the\n"
             "field names of goddp_graph and goddp_config (csrc/goddp.h), except that\n"
             "config['align_buckets'] (bool or int) and config['bucket_order'] are optional and\n"
             "default to 0, and graph['param_ddp_positions'] is optional (absent or None: NULL);\n"
             "ABI 6: config['bucket_cap_bytes'] and ['first_bucket_cap_bytes'] may be None (the\n"
             "planner fills them in; ABI 11: a cap is None or > 0, never GODDP_CAP_NOT_GIVEN),\n"
             "config['block_cuts'], ['edges'] and ['ddp'] (a dict of\n"
             "DDP_KEYS, goddp_ddp's fields, or None) are optional, and so are the graph's module\n"
             "stacks (module_string_offsets, module_strings, node_stack_offsets, node_stack_paths,\n"
             "node_stack_types: all or none); ABI 7: graph['node_weights'] is optional (absent or\n"
             "None: one each); ABI 9: config['uniform_caps'] is optional (default 0); ABI 10: the\n"
             "graph's body facts (node_hop_calls, node_body_offsets, body_stack_offsets,\n"
             "body_stack_paths, body_stack_types: all or none, with the module stacks) are\n"
             "optional. The reply's ABI 6 keys are the decisions: the\n"
             "settings the plan stands for (bucket_cap_bytes, first_bucket_cap_bytes,\n"
             "bucket_caps_bytes, max_pieces, align_buckets, bucket_order), align_reason and\n"
             "(ABI 11) aligned_params, num_counted_params, piece_param_offsets\n"
             "and piece_params, eager_pieces, node_block_ids (bytes, or None without blocks);\n"
             "arrays are buffers\n"
             "of native integers (int32: array('i'), int64: array('q'), uint8: bytes,\n"
             "uint32: array('I')). The result's keys are the field names of goddp_plan;\n"
             "arrays come back as bytes of native values. The GIL is released while Go\n"
             "plans. Raises ValueError/TypeError for malformed input, PlannerError (with\n"
             ".code, a goddp_status) when the planner rejects it.");

static PyObject *py_plan_graph(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"graph", "config", NULL};
    PyObject *graph_obj, *config_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:plan_graph", kwlist, &graph_obj, &config_obj)) return NULL;
    if (refuse_in_forked_child() < 0) return NULL;

    struct graph_views gv;
    memset(&gv, 0, sizeof gv);
    goddp_graph g;
    memset(&g, 0, sizeof g);
    goddp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    struct config_storage st;
    memset(&st, 0, sizeof st);
    PyObject *result = NULL;

    if (graph_from_dict(graph_obj, &gv, &g) < 0 || config_from_dict(config_obj, &cfg, &st) < 0) goto done;

    goddp_plan *plan = NULL;
    char *msg = NULL;
    goddp_status status;
    Py_BEGIN_ALLOW_THREADS
    status = goddp_plan_graph(&g, &cfg, &plan, &msg);
    Py_END_ALLOW_THREADS

    if (status != GODDP_OK) {
        goddp_plan_free(plan); /* NULL by contract; freed in case */
        raise_planner_error(status, msg);
        goto done;
    }
    goddp_string_free(msg);
    if (plan == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goddp: library returned GODDP_OK without a plan");
        goto done;
    }
    result = plan_to_dict(plan);
    goddp_plan_free(plan);
done:
    release_graph_views(&gv);
    PyMem_Free(st.caps);
    PyMem_Free(st.ddp_caps);
    return result;
}

/* ---------------------------------------------------------------------- */
/* combine_forward                                                          */

/* Copies obj, a C-contiguous buffer of native integers of itemsize bytes,
 * into view (Note [abi3]); what names the argument in errors. */
static int get_int_view(PyObject *obj, struct graph_view *view, Py_ssize_t itemsize, const char *what, const char *hint) {
    view->copy = NULL;
    PyObject *mv = PyMemoryView_FromObject(obj);
    PyObject *contiguous = NULL, *format = NULL, *itemsize_obj = NULL;
    int rc = -1;
    if (mv == NULL || (contiguous = PyObject_GetAttrString(mv, "c_contiguous")) == NULL ||
        PyObject_IsTrue(contiguous) != 1) {
        PyObject *tn;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous buffer of %s, not %.100s", what, hint,
                     type_name(obj, &tn));
        Py_XDECREF(tn);
        goto done;
    }
    if ((format = PyObject_GetAttrString(mv, "format")) == NULL ||
        (itemsize_obj = PyObject_GetAttrString(mv, "itemsize")) == NULL) {
        goto done;
    }
    const char *fmt = PyUnicode_AsUTF8AndSize(format, NULL);
    Py_ssize_t got = PyLong_AsSsize_t(itemsize_obj);
    if (fmt == NULL || (got == -1 && PyErr_Occurred())) goto done;
    if (got != itemsize || !is_native_integer_format(fmt)) {
        PyErr_Format(PyExc_ValueError, "%s must hold %s; got format '%s' with item size %zd", what, hint, fmt, got);
        goto done;
    }
    if ((view->copy = PyObject_CallMethod(mv, "tobytes", NULL)) == NULL) goto done;
    view->buf = PyBytes_AsString(view->copy);
    view->len = PyBytes_Size(view->copy);
    if (view->buf == NULL || view->len < 0) {
        Py_CLEAR(view->copy);
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(itemsize_obj);
    Py_XDECREF(format);
    Py_XDECREF(contiguous);
    Py_XDECREF(mv);
    return rc;
}

static PyObject *forward_plan_to_dict(const goddp_forward_plan *p) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    int64_t nb = p->num_buckets;
    if (nb < 0) {
        PyErr_SetString(PyExc_RuntimeError, "goddp: library returned a forward plan with negative counts");
        goto fail;
    }
    if (set_int(d, "num_buckets", PyLong_FromLongLong(nb)) < 0 ||
        set_bytes(d, "bucket_bytes", p->bucket_bytes, nb, sizeof(int64_t)) < 0 ||
        set_bytes(d, "ddp_caps", p->ddp_caps, nb, sizeof(int64_t)) < 0 ||
        set_bytes(d, "bucket_graphs", p->bucket_graphs, nb, sizeof(int32_t)) < 0 ||
        set_bytes(d, "bucket_sources", p->bucket_sources, nb, sizeof(int32_t)) < 0 ||
        set_bytes(d, "bucket_param_offsets", p->bucket_param_offsets, nb + 1, sizeof(int64_t)) < 0 ||
        set_bytes(d, "bucket_params", p->bucket_params, csr_total(p->bucket_param_offsets, nb), sizeof(int32_t)) <
            0 ||
        set_int(d, "moved", PyLong_FromLongLong(p->moved)) < 0 ||
        set_int(d, "dropped", PyLong_FromLongLong(p->dropped)) < 0) {
        goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

PyDoc_STRVAR(combine_forward_doc,
             "combine_forward(param_bytes, graph_bucket_offsets, bucket_param_offsets, bucket_params) -> dict\n\n"
             "One DDP bucket layout for the graphs of a forward (goddp_combine_forward in\n"
             "csrc/goddp.h): param_bytes (int64, by DDP position), graph_bucket_offsets and\n"
             "bucket_param_offsets (int64 CSR offsets), bucket_params (int32 DDP positions).\n"
             "The result's keys are the field names of goddp_forward_plan; arrays come back\n"
             "as bytes of native values. Raises PlannerError when the planner rejects it.");

static PyObject *py_combine_forward(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO:combine_forward", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    if (refuse_in_forked_child() < 0) return NULL;
    static const char *const names[4] = {"param_bytes", "graph_bucket_offsets", "bucket_param_offsets",
                                         "bucket_params"};
    static const Py_ssize_t sizes[4] = {8, 8, 8, 4};
    struct graph_view views[4];
    int held = 0;
    PyObject *result = NULL;
    for (; held < 4; held++) {
        if (get_int_view(objs[held], &views[held], sizes[held], names[held],
                         sizes[held] == 8 ? "int64, e.g. array('q')" : "int32, e.g. array('i')") < 0)
            goto done;
    }
    Py_ssize_t num_graph_offsets = views[1].len / 8, num_bucket_offsets = views[2].len / 8;
    if (num_graph_offsets < 2 || num_bucket_offsets < 1) {
        PyErr_SetString(PyExc_ValueError, "combine_forward: a forward has at least one graph, and CSR offsets "
                                          "have one more entry than items");
        goto done;
    }
    const int64_t *graph_offs = views[1].buf, *bucket_offs = views[2].buf;
    if (graph_offs[num_graph_offsets - 1] != num_bucket_offsets - 1 ||
        bucket_offs[num_bucket_offsets - 1] != views[3].len / 4) {
        PyErr_SetString(PyExc_ValueError,
                        "combine_forward: the last offset of each CSR array must equal the length of what it indexes");
        goto done;
    }
    goddp_forward f = {
        .num_params = views[0].len / 8,
        .param_bytes = views[0].buf,
        .num_graphs = num_graph_offsets - 1,
        .graph_bucket_offsets = graph_offs,
        .bucket_param_offsets = bucket_offs,
        .bucket_params = views[3].buf,
    };
    goddp_forward_plan *plan = NULL;
    char *msg = NULL;
    goddp_status status;
    Py_BEGIN_ALLOW_THREADS
    status = goddp_combine_forward(&f, &plan, &msg);
    Py_END_ALLOW_THREADS
    if (status != GODDP_OK) {
        goddp_forward_plan_free(plan);
        raise_planner_error(status, msg);
        goto done;
    }
    goddp_string_free(msg);
    if (plan == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goddp: library returned GODDP_OK without a forward plan");
        goto done;
    }
    result = forward_plan_to_dict(plan);
    goddp_forward_plan_free(plan);
done:
    for (int i = 0; i < held; i++) Py_CLEAR(views[i].copy);
    return result;
}

PyDoc_STRVAR(abi_version_doc, "abi_version() -> int\n\nGODDP_ABI_VERSION of the linked Go library.");

static PyObject *py_abi_version(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (refuse_in_forked_child() < 0) return NULL;
    return PyLong_FromLong((long)goddp_abi_version());
}

PyDoc_STRVAR(set_max_procs_doc,
             "set_max_procs(n) -> int\n\n"
             "Sets the Go runtime's GOMAXPROCS to n and returns the previous value; n <= 0\n"
             "only returns the current value. The GOMAXPROCS environment variable is read\n"
             "once when the process starts, so use this instead.");

static PyObject *py_set_max_procs(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "set_max_procs: n = %ld does not fit in int32", n);
        return NULL;
    }
    if (n < 0) n = 0;
    if (refuse_in_forked_child() < 0) return NULL;
    int32_t previous = 0;
    goddp_status status;
    /* GOMAXPROCS stops the Go world briefly; other Python threads may run. */
    Py_BEGIN_ALLOW_THREADS
    status = goddp_set_max_procs((int32_t)n, &previous);
    Py_END_ALLOW_THREADS
    if (status != GODDP_OK) {
        raise_planner_error(status, NULL);
        return NULL;
    }
    return PyLong_FromLong((long)previous);
}

PyDoc_STRVAR(layout_digest_doc,
             "layout_digest(offsets, positions, caps, bucket_order, build) -> int\n\n"
             "The 64-bit digest of a DDP layout (goddp_layout_digest in goddp.h): offsets\n"
             "(int64, num_buckets + 1, CSR into positions), positions (int32 DDP parameter\n"
             "positions) and caps (int64, the caps given to DDP) are buffers; bucket_order\n"
             "is an enum goddp_bucket_order; build names the goddp build.");

/* A bytes copy of a bytes-like object, or NULL with TypeError naming what
 * (Note [abi3]: "y*" needs Py_buffer, not in the limited API before 3.11). */
static PyObject *bytes_copy(PyObject *obj, const char *what) {
    if (PyBytes_Check(obj)) { /* immutable already: no copy needed */
        Py_INCREF(obj);
        return obj;
    }
    PyObject *view = PyMemoryView_FromObject(obj);
    if (view == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyObject *tn;
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "layout_digest: %s must be a bytes-like object, not %.100s", what,
                         type_name(obj, &tn));
            Py_XDECREF(tn);
        }
        return NULL;
    }
    PyObject *copy = PyObject_CallMethod(view, "tobytes", NULL);
    Py_DECREF(view);
    return copy;
}

static PyObject *py_layout_digest(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *offsets_obj, *positions_obj, *caps_obj;
    int bucket_order;
    const char *build;
    if (!PyArg_ParseTuple(args, "OOOis:layout_digest", &offsets_obj, &positions_obj, &caps_obj, &bucket_order,
                          &build))
        return NULL;
    PyObject *result = NULL;
    PyObject *offsets = bytes_copy(offsets_obj, "offsets");
    PyObject *positions = offsets ? bytes_copy(positions_obj, "positions") : NULL;
    PyObject *caps = positions ? bytes_copy(caps_obj, "caps") : NULL;
    if (caps == NULL) goto done;
    Py_ssize_t offsets_len = PyBytes_Size(offsets), positions_len = PyBytes_Size(positions),
               caps_len = PyBytes_Size(caps);
    Py_ssize_t n = offsets_len / (Py_ssize_t)sizeof(int64_t) - 1;
    Py_ssize_t nc = caps_len / (Py_ssize_t)sizeof(int64_t);
    if (offsets_len % (Py_ssize_t)sizeof(int64_t) != 0 || caps_len % (Py_ssize_t)sizeof(int64_t) != 0 ||
        positions_len % (Py_ssize_t)sizeof(int32_t) != 0 || n < 0 || n > INT32_MAX || nc > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError,
                        "layout_digest: offsets and caps must hold int64, positions int32");
        goto done;
    }
    if (refuse_in_forked_child() < 0) goto done;
    goddp_layout layout = {
        .num_buckets = (int32_t)n,
        .bucket_offsets = (const int64_t *)PyBytes_AsString(offsets),
        .positions = positions_len ? (const int32_t *)PyBytes_AsString(positions) : NULL,
        .bucket_order = (int32_t)bucket_order,
        .build = build,
        .num_caps = (int32_t)nc,
        .caps = (const int64_t *)PyBytes_AsString(caps),
    };
    uint64_t digest = 0;
    char *msg = NULL;
    goddp_status status = goddp_layout_digest(&layout, &digest, &msg);
    if (status != GODDP_OK) {
        raise_planner_error(status, msg);
        goto done;
    }
    result = PyLong_FromUnsignedLongLong((unsigned long long)digest);
done:
    Py_XDECREF(caps);
    Py_XDECREF(offsets);
    Py_XDECREF(positions);
    return result;
}

/* The one JSON operation (goddp_checkpoint_split): one JSON document in,
 * one string out. */
typedef goddp_status (*report_fn)(const char *, char **, char **);

static PyObject *call_report(PyObject *args, const char *format, report_fn fn) {
    const char *doc;
    if (!PyArg_ParseTuple(args, format, &doc)) return NULL;
    if (refuse_in_forked_child() < 0) return NULL;
    char *text = NULL, *msg = NULL;
    goddp_status status;
    /* doc stays valid: args holds the str it points into. */
    Py_BEGIN_ALLOW_THREADS
    status = fn(doc, &text, &msg);
    Py_END_ALLOW_THREADS
    if (status != GODDP_OK) {
        goddp_string_free(text);
        raise_planner_error(status, msg);
        return NULL;
    }
    goddp_string_free(msg);
    if (text == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "goddp: library returned GODDP_OK without a report");
        return NULL;
    }
    PyObject *result = PyUnicode_FromString(text);
    goddp_string_free(text);
    return result;
}

PyDoc_STRVAR(checkpoint_split_doc,
             "checkpoint_split(request) -> str\n\n"
             "How to split a graph's activation checkpoints into regions\n"
             "(goddp_checkpoint_split in goddp.h): request and the result are JSON text of\n"
             "the shapes goddp.h gives.");

static PyObject *py_checkpoint_split(PyObject *self, PyObject *args) {
    (void)self;
    return call_report(args, "s:checkpoint_split", goddp_checkpoint_split);
}

#ifdef GODDP_TESTHOOKS
/* Only in the test build of the extension (see goddp.h). */
PyDoc_STRVAR(debug_panic_doc,
             "debug_panic()\n\n"
             "Test hook: makes Go panic on purpose. Always raises PlannerError with code\n"
             "ERR_PANIC, proving that a panic never takes the process down.");

static PyObject *py_debug_panic(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (refuse_in_forked_child() < 0) return NULL;
    char *msg = NULL;
    goddp_status status = goddp_debug_panic(&msg);
    if (status == GODDP_OK) {
        goddp_string_free(msg);
        PyErr_SetString(PyExc_RuntimeError, "goddp_debug_panic returned GODDP_OK; the panic was not raised");
        return NULL;
    }
    raise_planner_error(status, msg);
    return NULL;
}
#endif

static PyMethodDef goddp_methods[] = {
    {"plan_graph", (PyCFunction)(void (*)(void))py_plan_graph, METH_VARARGS | METH_KEYWORDS, plan_graph_doc},
    {"abi_version", py_abi_version, METH_NOARGS, abi_version_doc},
    {"combine_forward", py_combine_forward, METH_VARARGS, combine_forward_doc},
    {"set_max_procs", py_set_max_procs, METH_O, set_max_procs_doc},
    {"layout_digest", py_layout_digest, METH_VARARGS, layout_digest_doc},

    {"checkpoint_split", py_checkpoint_split, METH_VARARGS, checkpoint_split_doc},
#ifdef GODDP_TESTHOOKS
    {"debug_panic", py_debug_panic, METH_NOARGS, debug_panic_doc},
#endif
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(module_doc,
             "goddp's Go planner (csrc/goddp.h) for Python.\n\n"
             "Loading this module starts the Go runtime; import it through\n"
             "goddp.native.extension.load(), never at goddp import time.");

static struct PyModuleDef goddp_module = {
    PyModuleDef_HEAD_INIT, "goddp._goddp", module_doc, -1, goddp_methods, NULL, NULL, NULL, NULL,
};

static PyObject *string_tuple(const char *const *items, size_t n) {
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (t == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(items[i]);
        if (s == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        if (PyTuple_SetItem(t, (Py_ssize_t)i, s) < 0) { /* steals s */
            Py_DECREF(t);
            return NULL;
        }
    }
    return t;
}

static int add_constants(PyObject *m) {
    static const struct {
        const char *name;
        long value;
    } constants[] = {
        {"ABI_VERSION", GODDP_ABI_VERSION},
        {"OP_PLACEHOLDER", GODDP_OP_PLACEHOLDER},
        {"OP_GET_ATTR", GODDP_OP_GET_ATTR},
        {"OP_CALL_MODULE", GODDP_OP_CALL_MODULE},
        {"OP_CALL_FUNCTION", GODDP_OP_CALL_FUNCTION},
        {"OP_CALL_METHOD", GODDP_OP_CALL_METHOD},
        {"OP_OUTPUT", GODDP_OP_OUTPUT},
        {"REF_ARG", GODDP_REF_ARG},
        {"REF_OTHER", GODDP_REF_OTHER},
        {"REF_MODULE", GODDP_REF_MODULE},
        {"REF_ATTR", GODDP_REF_ATTR},
        {"PARAM_REQUIRES_GRAD", GODDP_PARAM_REQUIRES_GRAD},
        {"PARAM_DDP_IGNORED", GODDP_PARAM_DDP_IGNORED},
        {"MODE_DDP", GODDP_MODE_DDP},
        {"MODE_TORCH", GODDP_MODE_TORCH},
        {"ORDER_READY", GODDP_ORDER_READY},
        {"ORDER_DECLARATION", GODDP_ORDER_DECLARATION},
        {"ALIGN_NONE", GODDP_ALIGN_NONE},
        {"ALIGN_READY", GODDP_ALIGN_READY},
        {"ALIGN_DECLARATION", GODDP_ALIGN_DECLARATION},
        {"ALIGN_DECLARATION_MERGED", GODDP_ALIGN_DECLARATION_MERGED},
        {"REASON_ALIGNED", GODDP_REASON_ALIGNED},
        {"REASON_OFF", GODDP_REASON_OFF},
        {"REASON_NOT_COVERED", GODDP_REASON_NOT_COVERED},
        {"REASON_ONE_PIECE", GODDP_REASON_ONE_PIECE},
        {"REASON_PART_OF_FORWARD", GODDP_REASON_PART_OF_FORWARD},
        {"REASON_NO_PARAMS", GODDP_REASON_NO_PARAMS},
        {"REASON_NO_PER_BUCKET_CAPS", GODDP_REASON_NO_PER_BUCKET_CAPS},
        {"REASON_PYTHON_REDUCER", GODDP_REASON_PYTHON_REDUCER},
        {"REASON_STATIC_GRAPH", GODDP_REASON_STATIC_GRAPH},
        {"REASON_MIXED_PRECISION", GODDP_REASON_MIXED_PRECISION},
        {"REASON_BUILTIN_COMM_HOOK", GODDP_REASON_BUILTIN_COMM_HOOK},
        {"REASON_DELAYED_ALLREDUCE", GODDP_REASON_DELAYED_ALLREDUCE},
        {"REASON_PARAM_GROUPS", GODDP_REASON_PARAM_GROUPS},
        {"CAP_NOT_GIVEN", GODDP_CAP_NOT_GIVEN},
        {"EDGES_COMPILE", GODDP_EDGES_COMPILE},
        {"EDGES_AUTO", GODDP_EDGES_AUTO},
        {"EDGES_EAGER", GODDP_EDGES_EAGER},
        {"DDP_FIND_UNUSED_PARAMETERS", GODDP_DDP_FIND_UNUSED_PARAMETERS},
        {"DDP_STATIC_GRAPH", GODDP_DDP_STATIC_GRAPH},
        {"DDP_CAP_IS_DEFAULT", GODDP_DDP_CAP_IS_DEFAULT},
        {"DDP_NO_PER_BUCKET_CAPS", GODDP_DDP_NO_PER_BUCKET_CAPS},
        {"DDP_PYTHON_REDUCER", GODDP_DDP_PYTHON_REDUCER},
        {"DDP_MIXED_PRECISION", GODDP_DDP_MIXED_PRECISION},
        {"DDP_BUILTIN_COMM_HOOK", GODDP_DDP_BUILTIN_COMM_HOOK},
        {"DDP_DELAYS_ALLREDUCE", GODDP_DDP_DELAYS_ALLREDUCE},
        {"DDP_SEVERAL_PARAM_GROUPS", GODDP_DDP_SEVERAL_PARAM_GROUPS},
        {"OK", GODDP_OK},
        {"ERR_INVALID_CONFIG", GODDP_ERR_INVALID_CONFIG},
        {"ERR_INVALID_GRAPH", GODDP_ERR_INVALID_GRAPH},
        {"ERR_OVERFLOW", GODDP_ERR_OVERFLOW},
        {"ERR_PANIC", GODDP_ERR_PANIC},
        {"ERR_INTERNAL", GODDP_ERR_INTERNAL},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) return -1;
    }
    PyObject *t;
    if ((t = string_tuple(graph_keys, NUM_GRAPH_KEYS)) == NULL || PyModule_AddObject(m, "GRAPH_KEYS", t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    if ((t = string_tuple(config_keys, NUM_CONFIG_KEYS)) == NULL || PyModule_AddObject(m, "CONFIG_KEYS", t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    if ((t = string_tuple(plan_keys, NUM_PLAN_KEYS)) == NULL || PyModule_AddObject(m, "PLAN_KEYS", t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    if ((t = string_tuple(ddp_keys, NUM_DDP_KEYS)) == NULL || PyModule_AddObject(m, "DDP_KEYS", t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__goddp(void) {
    /* Registered once per process, before anything can call Go. */
    static int atfork_registered;
    if (!atfork_registered) {
        if (pthread_atfork(NULL, NULL, mark_forked_after_load) != 0) {
            PyErr_SetString(PyExc_ImportError, "goddp._goddp: pthread_atfork failed");
            return NULL;
        }
        atfork_registered = 1;
    }
    if (forked_after_load) {
        PyErr_SetString(PyExc_ImportError, forked_child_message);
        return NULL;
    }
    /* The library is linked in statically, so a mismatch means a stale
     * build mixed with a newer header. */
    if (goddp_abi_version() != GODDP_ABI_VERSION) {
        PyErr_Format(PyExc_ImportError, "goddp._goddp: Go library ABI %d does not match header ABI %d; rebuild",
                     (int)goddp_abi_version(), GODDP_ABI_VERSION);
        return NULL;
    }

    PyObject *m = PyModule_Create(&goddp_module);
    if (m == NULL) return NULL;

    PyObject *planner_dict = Py_BuildValue("{s:O}", "code", Py_None);
    if (planner_dict == NULL) goto fail;
    PlannerError = PyErr_NewExceptionWithDoc("goddp._goddp.PlannerError",
                                             "The Go planner rejected the input or failed; .code is the "
                                             "goddp_status (ERR_INVALID_CONFIG, ERR_INVALID_GRAPH, "
                                             "ERR_OVERFLOW, ERR_PANIC, ERR_INTERNAL).",
                                             PyExc_RuntimeError, planner_dict);
    Py_DECREF(planner_dict);
    if (PlannerError == NULL) goto fail;
    ForkedChildError = PyErr_NewExceptionWithDoc("goddp._goddp.ForkedChildError",
                                                 "Raised instead of calling Go in a process forked after goddp's "
                                                 "Go runtime was loaded (the call would hang).",
                                                 PyExc_RuntimeError, NULL);
    if (ForkedChildError == NULL) goto fail;
    Py_INCREF(PlannerError);
    if (PyModule_AddObject(m, "PlannerError", PlannerError) < 0) {
        Py_DECREF(PlannerError);
        goto fail;
    }
    Py_INCREF(ForkedChildError);
    if (PyModule_AddObject(m, "ForkedChildError", ForkedChildError) < 0) {
        Py_DECREF(ForkedChildError);
        goto fail;
    }
    if (add_constants(m) < 0) goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
