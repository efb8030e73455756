"""goddp: a Dynamo backend that cuts DistributedDataParallel graphs at the
boundaries of DDP's gradient buckets, planned by a Go core.

    import goddp
    model = torch.compile(DistributedDataParallel(net), backend="goddp",
                          options={"inner": "inductor"})

Public API:
- ``goddp.backend(**options)``: a configured backend (see goddp.backend for
  the options); ``goddp.backend.goddp_backend`` is the entry point behind
  ``backend="goddp"``.
- ``goddp.plan_graph_module(gm, ...)``: plan a Dynamo graph without
  compiling; returns a ``GraphPlan`` (``BucketInfo`` per bucket).
- ``goddp.last_plans()`` / ``goddp.clear_plans()``: the plans the backend
  made in this process, with per-phase timings.
- ``goddp.trace(ddp_model)``: a context manager that records when each DDP
  bucket's allreduce runs relative to backward (see goddp.tracing).

Logging goes to the Python logger "goddp" (plan table at INFO, graphs at
DEBUG); ``TORCH_LOGS=goddp`` / ``TORCH_LOGS=+goddp`` enable it the torch way.

The Go runtime starts only when the first plan is made, never at import
(see Note [Lazy Go runtime] in goddp.native.extension).

What is where (each subpackage's docstring says more; README.md,
"Architecture"): ``backend`` the entry point, ``options`` the one
validator; ``compile`` the pipeline and its one fallback; ``graph`` export,
cut and stitch; ``native`` the binding to the Go planner; ``ddp`` everything
that touches DistributedDataParallel (torch's private DDP API in
``ddp.private`` alone); ``ranks`` how the ranks agree; ``reports`` plan
records and the plan table; ``tracing`` goddp.trace; ``tools`` goddp in
torch's own tools (structured trace, compile times, profiler ranges);
``measure`` the benchmarks' documented hooks.
"""

from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"

_EXPORTS = {
    "backend": ("goddp.backend", None),
    "plan_graph_module": ("goddp.compile.plan", "plan_graph_module"),
    "GraphPlan": ("goddp.native.plan", "GraphPlan"),
    "BucketInfo": ("goddp.native.plan", "BucketInfo"),
    "last_plans": ("goddp.reports.records", "last_plans"),
    "clear_plans": ("goddp.reports.records", "clear_plans"),
    "trace": ("goddp.tracing", "trace"),
    "Trace": ("goddp.tracing", "Trace"),
    "TraceError": ("goddp.tracing", "TraceError"),
}

__all__ = sorted(_EXPORTS)


def _load(name: str):
    module_name, attr = _EXPORTS[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __getattr__(name: str):
    if name in _EXPORTS:
        return _load(name)
    raise AttributeError(f"module 'goddp' has no attribute {name!r}")


def _torch_is_initializing() -> bool:
    # TORCH_LOGS=goddp makes torch import this package while torch itself is
    # still being imported; loading the backend then would see a half-made
    # torch. The public names are then loaded on first use instead.
    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None) if torch is not None else None
    return bool(getattr(spec, "_initializing", False))


if not _torch_is_initializing():
    for _name in _EXPORTS:
        _load(_name)
    del _name
