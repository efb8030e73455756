"""Why goddp leaves a DDP module alone: every refusal, in one place.

Two things goddp may change on a DDP module, each refused where it is not
known to be safe, with a reason the user reads:
- alignment (docs/align.md): ``alignment_blocker`` (DDP's settings),
  ``rebuild_blocker`` (the moment of the rebuild); goddp then keeps DDP's
  own buckets. Whether the plan's buckets hold exactly DDP's parameters is
  the planner's decision (planner/decide.go, GODDP_REASON_NOT_COVERED);
- goddp.trace: ``trace_refusal``; the trace is then refused on every rank.
"""

from __future__ import annotations

from typing import Any

from goddp.ddp import private

# Set on a DDP module while a goddp.trace is installed on it.
TRACE_ACTIVE_ATTR = "_goddp_trace_active"


STAND_IN = (
    "not a DDP module (no process group or reducer, a stand-in such as torch's FakeDDP): "
    "planned and cut; no agreement across ranks and DDP's buckets left alone"
)


def stand_in_blocker(ddp: Any) -> str | None:
    """STAND_IN for a module that marks itself as DDP's active module but has
    no process group or reducer (what torch's own DDPOptimizer tests use);
    None for a real DDP."""
    if getattr(ddp, "process_group", None) is None or getattr(ddp, "reducer", None) is None:
        return STAND_IN
    return None


def alignment_blocker(ddp: Any) -> str | None:
    """Why goddp must leave this DDP module's buckets alone, or None."""
    try:
        return _settings_blocker(ddp)
    except Exception as exc:  # a DDP whose private API differs: leave it alone
        return f"could not inspect DDP ({type(exc).__name__}: {exc})"


def _settings_blocker(ddp: Any) -> str | None:
    if not private.has_per_bucket_caps(ddp):
        return "this torch's DDP has no per-bucket caps (needs torch >= 2.9)"
    if private.uses_python_reducer(ddp):
        return "DDP uses the Python reducer, which has no per-bucket caps"
    if ddp.static_graph:
        return "static_graph=True: DDP's delayed-allreduce setup is not rebuilt by goddp"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "DDP mixed precision is on"
    builtin = private.builtin_comm_hook(ddp)
    if builtin:
        # A built-in hook (or fused optimizer) is registered on the reducer and
        # DDP keeps no record from which to register it again.
        return f"a built-in comm hook ({builtin}) is registered"
    if private.delays_some_allreduces(ddp):
        return "delay_all_reduce_named_params is set: those parameters bypass DDP's buckets"
    keys = {(p.dtype, p.device) for p in private.ddp_parameters(ddp)}
    if len(keys) != 1:
        return f"parameters span {len(keys)} (dtype, device) groups; DDP buckets each group apart"
    return None


def rebuild_blocker(ddp: Any) -> str | None:
    """Why DDP's reducer cannot be replaced right now, or None. Asked at the
    first training call, where the rebuild would happen."""
    if private.join_enabled(ddp):
        # DDP's pre-forward has just handed the old reducer this step's
        # Join work handle, which cannot be read back to hand it on.
        return "the first training step runs inside a Join context, whose state lives in DDP's reducer"
    # A module that trained before (DDP rebuilt its buckets) can still be
    # aligned: nobody installs before the ranks decided, and a failed install
    # gives every rank a fresh reducer alike (Note [Agreeing on DDP's layout]).
    return None


def trace_refusal(ddp: Any) -> str | None:
    """Why this DDP module cannot be traced (goddp.trace), or None."""
    if getattr(ddp, TRACE_ACTIVE_ATTR, None) is not None:
        return "this DDP module is already being traced (one goddp.trace at a time)"
    if private.uses_python_reducer(ddp):
        return "DDP uses the Python reducer (compiled autograd): it has no comm hooks"
    if ddp.static_graph:
        return "static_graph=True: a fresh reducer would repeat DDP's static-graph first step"
    if private.delays_every_allreduce(ddp):
        return "every parameter is in DDP's delayed allreduce: DDP reduces nothing in backward"
    hooks = private.comm_hooks(ddp)
    if len(hooks) > 1:
        return f"DDP lists {len(hooks)} comm hooks; expected at most one"
    try:
        builtin = private.builtin_comm_hook(ddp)
    except Exception as exc:
        return f"could not read DDP's logging data ({type(exc).__name__}: {exc})"
    if builtin:
        return (
            f"a built-in C++ comm hook ({builtin}) is registered; it cannot be wrapped "
            "(register it as a Python hook, e.g. torch.distributed.algorithms.ddp_comm_hooks, to trace it)"
        )
    return None
