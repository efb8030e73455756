"""Lazy access to goddp's Go planner, the extension module goddp._goddp.

Note [Lazy Go runtime]: loading goddp._goddp starts the Go runtime inside
this process, and the Go runtime does not survive fork(): a child forked after the load hangs on its
first call into Go (the extension raises ForkedChildError instead). So
nothing imports goddp._goddp at ``import goddp`` time; this module does, on
the first call to load(), once per process, from any thread.

Environment:
    GODDP_GOMAXPROCS  When set to a positive integer, load() applies it with
                      set_max_procs() right after the extension loads. The Go
                      runtime reads GOMAXPROCS only at process start, so
                      setting GOMAXPROCS in os.environ later has no effect;
                      use this variable or set_max_procs() instead.

The constants below mirror csrc/goddp.h so that graphs and configs can be
built without loading Go; tests check them against the extension's own.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from types import ModuleType
from typing import Any, Mapping

EXTENSION_NAME = "goddp._goddp"

# Mirrors of csrc/goddp.h (checked against the extension by the tests).
ABI_VERSION = 12
OP_PLACEHOLDER = 0
OP_GET_ATTR = 1
OP_CALL_MODULE = 2
OP_CALL_FUNCTION = 3
OP_CALL_METHOD = 4
OP_OUTPUT = 5
REF_ARG = 0
REF_OTHER = 1
REF_MODULE = 2
REF_ATTR = 3
PARAM_REQUIRES_GRAD = 0x1
PARAM_DDP_IGNORED = 0x2
MODE_DDP = 0
MODE_TORCH = 1
ORDER_READY = 0
ORDER_DECLARATION = 1
ALIGN_NONE = 0
ALIGN_READY = 1
ALIGN_DECLARATION = 2
ALIGN_DECLARATION_MERGED = 3
REASON_ALIGNED = 0
REASON_OFF = 1
REASON_NOT_COVERED = 2
REASON_ONE_PIECE = 3
REASON_PART_OF_FORWARD = 4
REASON_NO_PARAMS = 5
REASON_NO_PER_BUCKET_CAPS = 6
REASON_PYTHON_REDUCER = 7
REASON_STATIC_GRAPH = 8
REASON_MIXED_PRECISION = 9
REASON_BUILTIN_COMM_HOOK = 10
REASON_DELAYED_ALLREDUCE = 11
REASON_PARAM_GROUPS = 12
CAP_NOT_GIVEN = 0  # a cap the shim gives as None (goddp_module.c converts it)
EDGES_COMPILE = 0
EDGES_AUTO = 1
EDGES_EAGER = 2
DDP_FIND_UNUSED_PARAMETERS = 0x1
DDP_STATIC_GRAPH = 0x2
DDP_CAP_IS_DEFAULT = 0x4
DDP_NO_PER_BUCKET_CAPS = 0x8
DDP_PYTHON_REDUCER = 0x10
DDP_MIXED_PRECISION = 0x20
DDP_BUILTIN_COMM_HOOK = 0x40
DDP_DELAYS_ALLREDUCE = 0x80
DDP_SEVERAL_PARAM_GROUPS = 0x100
OK = 0
ERR_INVALID_CONFIG = 1
ERR_INVALID_GRAPH = 2
ERR_OVERFLOW = 3
ERR_PANIC = 4
ERR_INTERNAL = 5

GOMAXPROCS_ENV = "GODDP_GOMAXPROCS"

_lock = threading.Lock()
_module: ModuleType | None = None


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


def load() -> ModuleType:
    """Returns goddp._goddp, importing it (and starting the Go runtime) on
    the first call. Thread-safe; later calls return the cached module."""
    global _module
    module = _module
    if module is not None:
        return module
    with _lock:
        if _module is None:
            # Validate the environment before Go starts, so that a typo does
            # not leave a half-configured runtime behind.
            max_procs = _max_procs_from_env()
            try:
                module = importlib.import_module(EXTENSION_NAME)
            except ModuleNotFoundError as e:
                if e.name != EXTENSION_NAME:
                    raise
                raise ImportError(
                    f"{EXTENSION_NAME} (goddp's Go planner) is not built: install goddp with "
                    "`pip install .` (needs Go), or `make install` in a checkout",
                    name=EXTENSION_NAME,
                ) from e
            built = getattr(module, "ABI_VERSION", None)
            if built != ABI_VERSION:
                # A stale build: its replies would lack what this shim reads.
                raise ImportError(
                    f"{EXTENSION_NAME} implements goddp ABI {built}, this Python package needs ABI "
                    f"{ABI_VERSION}: rebuild it (`make install`, or `pip install .`)",
                    name=EXTENSION_NAME,
                )
            if max_procs is not None:
                module.set_max_procs(max_procs)
            _module = module
        return _module


def is_loaded() -> bool:
    """True once the extension, and with it the Go runtime, is loaded into
    this process (by load() or by a direct import)."""
    return EXTENSION_NAME in sys.modules


def plan_graph(graph: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """Plans a graph; see goddp._goddp.plan_graph for the dict layouts.

    Raises the extension's PlannerError (with .code) when the planner rejects
    the input, ValueError/TypeError for malformed arrays, and ForkedChildError
    in a process forked after the load."""
    module = load()
    if not isinstance(graph, dict):
        graph = dict(graph)
    if not isinstance(config, dict):
        config = dict(config)
    return module.plan_graph(graph, config)


def set_max_procs(n: int) -> int:
    """Sets the Go runtime's GOMAXPROCS and returns the previous value;
    n <= 0 only returns the current value. Loads the extension."""
    return load().set_max_procs(n)


def combine_forward(param_bytes: Any, graph_bucket_offsets: Any, bucket_param_offsets: Any, bucket_params: Any) -> dict[str, Any]:
    """One DDP bucket layout for the graphs of a forward (goddp_combine_forward
    in csrc/goddp.h; see goddp._goddp.combine_forward). Raises PlannerError
    like plan_graph."""
    return load().combine_forward(param_bytes, graph_bucket_offsets, bucket_param_offsets, bucket_params)


def _json_call(name: str, request: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(getattr(load(), name)(json.dumps(request, sort_keys=True)))


def checkpoint_split(request: Mapping[str, Any]) -> dict[str, Any]:
    """How to split a graph's checkpoint calls (goddp_checkpoint_split in
    csrc/goddp.h, which gives both JSON shapes). Raises PlannerError like
    plan_graph."""
    return _json_call("checkpoint_split", request)

