"""goddp's binding to its Go planner, libgoddp.so, through cffi.

The structs, enums and constants are csrc/goddp.h's: cffi reads the
header's declarations (the region between its "cdef: begin" and "cdef:
end" lines) in ABI mode, so nothing here copies one, and no C compiler
runs at install. The header's constants are this module's, without their
GODDP_ prefix (OP_PLACEHOLDER, ERR_PANIC, ...). Each function converts its
Python arguments, calls the library once and converts the reply back; the
library checks every count, offset and index (with the spans of
goddp_span, every array length too), so this module checks only what it
needs to hand Go a pointer: that an array is a C-contiguous buffer of
native integers of the field's size.

Note [Lazy Go runtime]: loading libgoddp.so starts the Go runtime inside
this process, and the Go runtime does not survive fork(): a child forked
after the load hangs on its first call into Go. So nothing loads the
library at ``import goddp`` time; load() does, on its first call, once per
process, from any thread, and every call into Go from a process other than
the one that loaded it raises ForkedChildError instead (the loader's pid is
remembered). cffi releases the GIL around each call, so other Python
threads run while Go plans.

Environment:
    GODDP_GOMAXPROCS  When set to a positive integer, load() applies it with
                      set_max_procs() right after the library loads. The Go
                      runtime reads GOMAXPROCS only at process start, so
                      setting GOMAXPROCS in os.environ later has no effect;
                      use this variable or set_max_procs() instead.
"""

from __future__ import annotations

import json
import operator
import os
import re
import sys
import threading
from typing import Any, Callable, Mapping

import cffi

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY_NAME = "libgoddp.so"


def _header() -> str:
    """goddp.h: the wheel's copy beside the library, else the checkout's."""
    for path in (os.path.join(_PACKAGE, "goddp.h"), os.path.join(_PACKAGE, "..", "..", "csrc", "goddp.h")):
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
    raise ImportError("goddp: csrc/goddp.h is missing from this installation; reinstall goddp")


def declarations(region: str = "cdef") -> str:
    """The header's declarations between "<region>: begin" and "<region>:
    end" (the tests read the "cdef testhooks" region too)."""
    text = _header()
    return text.split(f"/* {region}: begin */", 1)[1].split(f"/* {region}: end */", 1)[0]


ffi = cffi.FFI()
ffi.cdef(declarations())
# The header's integer constants (enums and #defines), read from the cdef
# without loading libgoddp.so: dlopen(None) is the C library already in
# this process, and cffi answers constants from the declarations.
_constants = ffi.dlopen(None)
globals().update(
    {name[len("GODDP_"):]: getattr(_constants, name) for name in sorted(set(re.findall(r"\bGODDP_[A-Z0-9_]+\b", declarations())))
     if isinstance(getattr(_constants, name, None), int)}
)
del _constants

GOMAXPROCS_ENV = "GODDP_GOMAXPROCS"
FORKED_CHILD_MESSAGE = (
    "goddp's Go planner cannot run in a process forked after it was loaded; "
    "plan in the parent or use the 'spawn' start method"
)


class PlannerError(RuntimeError):
    """The Go planner rejected the input or failed; .code is the
    goddp_status (ERR_INVALID_CONFIG, ERR_INVALID_GRAPH, ERR_OVERFLOW,
    ERR_PANIC, ERR_INTERNAL)."""

    code: int | None = None


class ForkedChildError(RuntimeError):
    """Raised instead of calling Go in a process forked after goddp's Go
    runtime was loaded (the call would hang)."""


# ---------------------------------------------------------------------------
# Python to C

_NATIVE_INTEGERS = set("bBhHiIlLqQnN")
# The caps that may be None, "not given" (Note [Cap defaults] in
# planner/settings.go): the one place where None becomes CAP_NOT_GIVEN.
_OPTIONAL_CAPS = {("config", "bucket_cap_bytes"), ("config", "first_bucket_cap_bytes"),
                  ("config['ddp']", "first_bucket_cap_bytes")}
# The arrays given as sequences of ints, and the fields that count them.
_COUNTED = {"bucket_caps_bytes": "num_bucket_caps", "own_bucket_caps_bytes": "num_own_bucket_caps"}
# Filled in by the binding, never given: the spans of the caller's arrays.
_SPANS = {"num_spans", "spans"}


def _type_name(value: Any) -> str:
    return type(value).__name__


class _Call:
    """The C memory of one call: every array handed to Go stays alive (and
    the caller's buffers stay exported, so none can be resized) until
    release(), which the call runs whatever happens."""

    def __init__(self) -> None:
        self.keep: list[Any] = []
        self.buffers: dict[str, Any] = {}

    def buffer(self, what: str, value: Any, item: Any) -> Any:
        """value, a C-contiguous buffer of native integers of item's size,
        as a C array over the caller's memory (no copy)."""
        try:
            view = memoryview(value)
        except TypeError:
            raise TypeError(f"{what} must be a C-contiguous buffer of {item.cname}, not {_type_name(value)}") from None
        with view:
            fmt = view.format.lstrip("@=" + ("<" if sys.byteorder == "little" else ">"))
            if not view.c_contiguous:
                raise ValueError(f"{what} must be a C-contiguous buffer of {item.cname} (not C-contiguous)")
            if view.itemsize != ffi.sizeof(item) or fmt not in _NATIVE_INTEGERS:
                raise ValueError(f"{what} must hold {item.cname} (native integers of {ffi.sizeof(item)} bytes); "
                                 f"got format '{view.format}' with item size {view.itemsize}")
        array = ffi.from_buffer(ffi.getctype(item, "[]"), value)
        self.buffers[what] = array
        return array

    def ints(self, what: str, value: Any, item: Any) -> Any:
        """A sequence of ints as a new C array."""
        if isinstance(value, (str, bytes, bytearray)):
            raise TypeError(f"{what} must be a sequence of ints, not {_type_name(value)}")
        values = list(value)
        array = ffi.new(ffi.getctype(item, "[]"), len(values))
        for i, v in enumerate(values):
            try:
                array[i] = v
            except (TypeError, OverflowError):
                raise ValueError(f"{what}[{i}] must be an {item.cname}, got {v!r}") from None
        self.keep.append(array)
        return array

    def spans(self) -> tuple[int, Any]:
        """The caller's arrays, as goddp_span (the library checks every
        length against them)."""
        spans = ffi.new("goddp_span[]", len(self.buffers))
        for span, array in zip(spans, self.buffers.values()):
            span.data, span.bytes = array, ffi.sizeof(array)
        self.keep.append(spans)
        return len(self.buffers), spans

    def struct(self, ctype: str, what: str, values: Mapping[str, Any]) -> Any:
        """A new struct of ctype from a dict of its field names: ints as
        they are, None for a pointer or an optional cap, a buffer (a graph's
        arrays) or a sequence of ints (the caps, with their num_ count) for
        an array, a dict for a nested struct."""
        if not isinstance(values, dict):
            raise TypeError(f"{what} must be a dict, not {_type_name(values)}")
        struct = ffi.new(ctype + " *")
        fields = dict(ffi.typeof(ctype).fields)
        unknown = [repr(k) for k in values if k not in fields or k in _SPANS]
        if unknown:
            raise ValueError(f"{what} has unknown key(s) {', '.join(unknown)}")
        for key, value in values.items():
            kind, name = fields[key].type, f"{what}['{key}']"
            if kind.kind == "pointer" and kind.item.kind == "struct":
                if value is not None:
                    if not isinstance(value, dict):
                        raise TypeError(f"{name} must be a dict or None, not {_type_name(value)}")
                    setattr(struct, key, self.struct(kind.item.cname, name, value))
            elif kind.kind == "pointer":
                if value is None:
                    continue
                if key in _COUNTED:
                    array = self.ints(name, value, kind.item)
                    setattr(struct, _COUNTED[key], len(array))
                else:
                    array = self.buffer(name, value, kind.item)
                setattr(struct, key, array)
            else:
                if value is None and (what, key) in _OPTIONAL_CAPS:
                    value = CAP_NOT_GIVEN  # noqa: F821 (a header constant)
                elif (what, key) in _OPTIONAL_CAPS and value == CAP_NOT_GIVEN:  # noqa: F821
                    raise ValueError(f"{name} is {value} bytes; a cap must be > 0 (None: not given)")
                try:
                    setattr(struct, key, value)
                except TypeError:
                    raise TypeError(f"{name} must be an int, not {_type_name(value)}") from None
                except OverflowError:
                    raise ValueError(f"{name} = {value} does not fit in {kind.cname}") from None
        self.keep.append(struct)
        return struct

    def release(self) -> None:
        for array in self.buffers.values():
            ffi.release(array)
        self.buffers.clear()
        self.keep.clear()


# ---------------------------------------------------------------------------
# C to Python

# The length of each array of a reply (csrc/goddp.h): a count field, a count
# field plus one (CSR offsets), or the CSR offsets whose last entry it is.
_LENGTHS: dict[str, dict[str, str | tuple[str, int]]] = {
    "goddp_plan": {
        "node_pieces": "num_nodes", "node_block_ids": "num_nodes",
        "bucket_bytes": "num_buckets", "bucket_pieces": "num_buckets", "bucket_node_begin": "num_buckets",
        "bucket_node_end": "num_buckets", "bucket_extended": "num_buckets",
        "bucket_param_offsets": ("num_buckets", 1), "bucket_params": "bucket_param_offsets",
        "piece_input_offsets": ("num_pieces", 1), "piece_inputs": "piece_input_offsets",
        "piece_output_offsets": ("num_pieces", 1), "piece_outputs": "piece_output_offsets",
        "ddp_caps": "num_ddp_caps", "bucket_caps_bytes": "num_bucket_caps",
        "piece_param_offsets": ("num_pieces", 1), "piece_params": "piece_param_offsets",
        "eager_pieces": "num_eager_pieces",
    },
    "goddp_forward_plan": {
        "bucket_bytes": "num_buckets", "ddp_caps": "num_ddp_caps", "bucket_graphs": "num_buckets",
        "bucket_sources": "num_buckets", "bucket_param_offsets": ("num_buckets", 1),
        "bucket_params": "bucket_param_offsets",
    },
}
# Switches that read as bools; a NULL array that is None (no blocks), not b"".
_BOOLS = {"align_buckets", "block_runs", "checkpoint_regions", "groups_later"}
_NULL_IS_NONE = {"node_block_ids"}


def _reply(ctype: str, struct: Any) -> dict[str, Any]:
    """A reply struct as a dict of its fields: ints, and arrays as bytes of
    native values."""
    out: dict[str, Any] = {}
    for key, field in ffi.typeof(ctype).fields:
        value = getattr(struct, key)
        if field.type.kind != "pointer":
            out[key] = bool(value) if key in _BOOLS else value
            continue
        if value == ffi.NULL and key in _NULL_IS_NONE:
            out[key] = None
            continue
        rule = _LENGTHS[ctype][key]
        if isinstance(rule, tuple):  # CSR offsets
            n = getattr(struct, rule[0]) + rule[1]
        elif isinstance(offsets := _LENGTHS[ctype].get(rule), tuple):  # CSR values: the last offset
            n = getattr(struct, rule)[getattr(struct, offsets[0])]
        else:
            n = getattr(struct, rule)
        out[key] = bytes(ffi.buffer(value, n * ffi.sizeof(field.type.item))) if n else b""
    return out


# ---------------------------------------------------------------------------
# The library


class Library:
    """libgoddp.so, loaded: one method per call of csrc/goddp.h. Every call
    refuses in a process forked after the load (ForkedChildError)."""

    PlannerError = PlannerError
    ForkedChildError = ForkedChildError

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ffi.dlopen(path)
        self.pid = os.getpid()

    def _go(self, fn: Callable[..., int], *args: Any, out: Any = None, free: Callable[[Any], None] | None = None) -> Any:
        """Calls fn(*args, out, err_msg) (out omitted when None), raising
        PlannerError with the library's message on failure, and returns
        *out's target (freed by the caller)."""
        self._refuse_in_forked_child()
        msg = ffi.new("char **")
        status = fn(*args, *([] if out is None else [out]), msg)
        text = None if msg[0] == ffi.NULL else ffi.string(msg[0]).decode("utf-8", "replace")
        self.lib.goddp_string_free(msg[0])
        if status != OK:  # noqa: F821 (a header constant)
            if free is not None and out is not None:
                free(out[0])
            error = PlannerError(text or f"goddp planner failed with status {status} and no message")
            error.code = status
            raise error
        return None if out is None else out[0]

    def _refuse_in_forked_child(self) -> None:
        """The gate of every call into Go (Note [Lazy Go runtime])."""
        if os.getpid() != self.pid:
            raise ForkedChildError(FORKED_CHILD_MESSAGE)

    def abi_version(self) -> int:
        self._refuse_in_forked_child()
        return self.lib.goddp_abi_version()

    def set_max_procs(self, n: int) -> int:
        """Sets the Go runtime's GOMAXPROCS to n and returns the previous
        value; n <= 0 only returns the current value."""
        n = operator.index(n)
        if n > 2**31 - 1:
            raise ValueError(f"set_max_procs: n = {n} does not fit in int32")
        self._refuse_in_forked_child()
        previous = ffi.new("int32_t *")
        if self.lib.goddp_set_max_procs(max(n, 0), previous) != OK:  # noqa: F821
            raise PlannerError("goddp_set_max_procs failed")
        return previous[0]

    def plan_graph(self, graph: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """Plans a forward graph. graph and config are dicts of goddp_graph's
        and goddp_config's fields (csrc/goddp.h): a graph's arrays are
        buffers of native integers (int32: array('i'), int64: array('q'),
        uint8: bytes, uint32: array('I')), absent or None for NULL;
        config['ddp'] a dict of goddp_ddp's fields or None; a cap None is
        not given. The reply's keys are goddp_plan's fields, its arrays bytes
        of native values. Raises PlannerError (with .code, a goddp_status)
        when the planner rejects the input."""
        call = _Call()
        try:
            g = call.struct("goddp_graph", "graph", graph)
            if "graph['module_string_offsets']" in call.buffers:
                g.num_module_strings = max(len(call.buffers["graph['module_string_offsets']"]) - 1, 0)
            g.num_spans, g.spans = call.spans()
            cfg = call.struct("goddp_config", "config", config)
            plan = self._go(self.lib.goddp_plan_graph, g, cfg, out=ffi.new("goddp_plan **"),
                            free=self.lib.goddp_plan_free)
        finally:
            call.release()
        try:
            return _reply("goddp_plan", plan)
        finally:
            self.lib.goddp_plan_free(plan)

    def combine_forward(self, param_bytes: Any, graph_bucket_offsets: Any, bucket_param_offsets: Any,
                        bucket_params: Any, param_keys: Any = None,
                        own: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One DDP bucket layout for the graphs of a forward
        (goddp_combine_forward): param_bytes (int64, by DDP position),
        graph_bucket_offsets and bucket_param_offsets (int64 CSR offsets),
        bucket_params (int32 DDP positions), param_keys (int32 group
        numbers by DDP position, or None: one group), own (the caps the
        graphs were planned with: bucket_cap_bytes, first_bucket_cap_bytes,
        bucket_caps_bytes; None: no launch check). The reply's keys are
        goddp_forward_plan's fields."""
        call = _Call()
        try:
            f = call.struct("goddp_forward", "combine_forward", {
                "param_bytes": param_bytes, "graph_bucket_offsets": graph_bucket_offsets,
                "bucket_param_offsets": bucket_param_offsets, "bucket_params": bucket_params,
                "param_keys": param_keys,
                **{f"own_{key}": value for key, value in (own or {}).items()},
            })
            f.num_params = len(call.buffers["combine_forward['param_bytes']"])
            f.num_graphs = len(call.buffers["combine_forward['graph_bucket_offsets']"]) - 1
            f.num_spans, f.spans = call.spans()
            plan = self._go(self.lib.goddp_combine_forward, f, out=ffi.new("goddp_forward_plan **"),
                            free=self.lib.goddp_forward_plan_free)
        finally:
            call.release()
        try:
            return _reply("goddp_forward_plan", plan)
        finally:
            self.lib.goddp_forward_plan_free(plan)

    def layout_digest(self, offsets: Any, positions: Any, caps: Any, bucket_order: int, build: str) -> int:
        """The 64-bit digest of a DDP layout (goddp_layout_digest): offsets
        (int64, CSR into positions), positions (int32 DDP parameter
        positions) and caps (int64) are buffers; bucket_order an enum
        goddp_bucket_order; build names the goddp build."""
        call = _Call()
        try:
            layout = call.struct("goddp_layout", "layout_digest", {
                "bucket_offsets": memoryview(offsets).cast("B").cast("q"),
                "positions": memoryview(positions).cast("B").cast("i"),
                "caps": memoryview(caps).cast("B").cast("q"),
                "bucket_order": bucket_order,
            })
            layout.num_buckets = len(call.buffers["layout_digest['bucket_offsets']"]) - 1
            layout.num_caps = len(call.buffers["layout_digest['caps']"])
            name = ffi.new("char[]", build.encode())
            layout.build = name
            layout.num_spans, layout.spans = call.spans()
            digest = ffi.new("uint64_t *")
            self._go(self.lib.goddp_layout_digest, layout, digest)
            return digest[0]
        finally:
            call.release()

    def checkpoint_split(self, request: str) -> str:
        """How to split a graph's activation checkpoints into regions
        (goddp_checkpoint_split): JSON text in and out, of the shapes
        goddp.h gives."""
        reply = self._go(self.lib.goddp_checkpoint_split, request.encode(), out=ffi.new("char **"))
        try:
            return ffi.string(reply).decode()
        finally:
            self.lib.goddp_string_free(reply)

    def timeline(self, request: str) -> str:
        """A backward step's predicted timeline, or the bucket boundaries
        that minimise it (goddp_timeline): JSON text in and out, of the
        shapes goddp.h gives."""
        reply = self._go(self.lib.goddp_timeline, request.encode(), out=ffi.new("char **"))
        try:
            return ffi.string(reply).decode()
        finally:
            self.lib.goddp_string_free(reply)


_lock = threading.Lock()
_library: Library | None = None


def library_path() -> str:
    """The shipped libgoddp.so, beside the goddp package's files."""
    return os.path.join(_PACKAGE, LIBRARY_NAME)


def _max_procs_from_env() -> int | None:
    raw = os.environ.get(GOMAXPROCS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{GOMAXPROCS_ENV}={raw!r}: expected a positive integer")
    return value


def load(path: str | None = None) -> Library:
    """Returns the Library, loading libgoddp.so (and starting the Go
    runtime) on the first call. Thread-safe; later calls return the same
    one. path: another build of the library (the tests' test-hook build);
    it counts only on the first call."""
    global _library
    library = _library
    if library is not None:
        return library
    with _lock:
        if _library is None:
            # Validate the environment before Go starts, so that a typo does
            # not leave a half-configured runtime behind.
            max_procs = _max_procs_from_env()
            path = path or library_path()
            if not os.path.exists(path):
                raise ImportError(
                    f"{path} (goddp's Go planner) is not built: install goddp with `pip install .` "
                    "(needs Go), or `make install` in a checkout",
                    name="goddp", path=path,
                )
            library = Library(path)
            built = library.abi_version()
            if built != ABI_VERSION:  # noqa: F821 (a header constant)
                # A stale build: its replies would not be what this header says.
                raise ImportError(
                    f"{path} implements goddp ABI {built}, this Python package needs ABI "
                    f"{ABI_VERSION}: rebuild it (`make install`, or `pip install .`)",  # noqa: F821
                    name="goddp", path=path,
                )
            if max_procs is not None:
                library.set_max_procs(max_procs)
            _library = library
        return _library


def is_loaded() -> bool:
    """True once the library, and with it the Go runtime, is loaded into
    this process."""
    return _library is not None


def plan_graph(graph: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Library.plan_graph. Raises PlannerError (with .code) when the
    planner rejects the input, and ForkedChildError in a process forked
    after the load."""
    return load().plan_graph(dict(graph), dict(config))


def set_max_procs(n: int) -> int:
    """Sets the Go runtime's GOMAXPROCS and returns the previous value;
    n <= 0 only returns the current value. Loads the library."""
    return load().set_max_procs(n)


def combine_forward(param_bytes: Any, graph_bucket_offsets: Any, bucket_param_offsets: Any, bucket_params: Any,
                    param_keys: Any = None, own: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Library.combine_forward. Raises PlannerError like plan_graph."""
    return load().combine_forward(param_bytes, graph_bucket_offsets, bucket_param_offsets, bucket_params, param_keys,
                                  own)


def checkpoint_split(request: Mapping[str, Any]) -> dict[str, Any]:
    """How to split a graph's checkpoint calls (goddp_checkpoint_split in
    csrc/goddp.h, which gives both JSON shapes). Raises PlannerError like
    plan_graph."""
    return json.loads(load().checkpoint_split(json.dumps(request, sort_keys=True)))


def timeline(request: Mapping[str, Any]) -> dict[str, Any]:
    """A step's timeline (goddp_timeline in csrc/goddp.h, which gives both
    JSON shapes; integers only, so a NaN is refused). Raises PlannerError
    like plan_graph."""
    return json.loads(load().timeline(json.dumps(request, sort_keys=True)))
