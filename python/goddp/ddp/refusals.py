"""Why goddp leaves a DDP module alone: every refusal, in one place.

Two things goddp may change on a DDP module, each refused where it is not
known to be safe, with a reason the user reads:
- alignment (docs/align.md): ``alignment_facts`` reads what about DDP may
  refuse it, and the planner decides (Note [Alignment refusals] in
  planner/refusals.go; goddp.native.plan words its code; only "could not
  inspect DDP" is said here); goddp then keeps
  DDP's own buckets. Whether the plan's buckets hold exactly DDP's
  parameters is the planner's decision too (GODDP_REASON_NOT_COVERED);
- goddp.trace: ``trace_refusal``; the trace is then refused on every rank.
The trace's reasons are this module's (Note [DDP refusals]). Inside a
Join context the rebuild waits for a training call every rank runs (Note
[Meeting under Join] in goddp.ranks.join); nothing about Join refuses it.
"""

from __future__ import annotations

import logging
from typing import Any

from goddp.ddp import private
from goddp.ddp.state import state_of
from goddp.native.plan import AlignmentFacts

logger = logging.getLogger("goddp")


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


def alignment_facts(ddp: Any) -> tuple[AlignmentFacts | None, str | None]:
    """What about this DDP module may refuse alignment, for the planner
    (static_graph travels with its settings); or None and why goddp must
    leave its buckets alone without asking."""
    try:
        return (
            AlignmentFacts(
                no_per_bucket_caps=not private.has_per_bucket_caps(ddp),
                python_reducer=private.uses_python_reducer(ddp),
                mixed_precision=getattr(ddp, "mixed_precision", None) is not None,
                builtin_comm_hook=unknown_builtin_comm_hook(ddp) is not None,
            ),
            None,
        )
    except Exception as exc:  # a DDP whose private API differs: leave it alone
        return None, could_not_inspect(exc)


def unknown_builtin_comm_hook(ddp: Any) -> str | None:
    """The name of a built-in comm hook registered on ddp that goddp could
    not register again on a rebuilt reducer (Note [Built-in comm hooks] in
    goddp.ddp.private), or None: no built-in hook, or a known one."""
    name = private.builtin_comm_hook(ddp)
    return name if name and private.builtin_hook_type(name) is None else None


def could_not_inspect(exc: Exception) -> str:
    """Why goddp leaves the buckets of a DDP module alone whose private API
    raised exc (the caller's refusal of Note [Alignment refusals]); the
    traceback goes to DEBUG, since a bug in goddp reads the same."""
    logger.debug("goddp: could not inspect DDP", exc_info=exc)
    return f"could not inspect DDP ({type(exc).__name__}: {exc})"


# Note [DDP refusals]: besides alignment (Note [Alignment refusals] in
# planner/refusals.go), goddp changes a DDP module in one more way,
# refused here from facts read off the module, each fact read once and only
# where its rule is reached.
#   - goddp.trace wraps DDP's comm hook in a fresh reducer. It is refused,
#     first that applies: a trace is already installed on the module; DDP
#     runs its Python reducer (no comm hooks to wrap); every parameter is
#     in DDP's delayed allreduce (nothing reduced in backward); DDP lists
#     several comm hooks; DDP's logging data, which
#     names a built-in hook, cannot be read; a built-in (C++) comm hook
#     that goddp cannot identify is registered (Note [Built-in comm hooks]
#     in goddp.ddp.private: it could not be registered again). Reading the
#     comm hooks may raise: that error is goddp.trace's.


def trace_refusal(ddp: Any) -> str | None:
    """Why this DDP module cannot be traced (goddp.trace), or None (Note
    [DDP refusals])."""
    state = state_of(ddp, create=False)
    if state is not None and state.trace is not None:
        return "this DDP module is already being traced (one goddp.trace at a time)"
    if private.uses_python_reducer(ddp):
        return "DDP uses the Python reducer (compiled autograd): it has no comm hooks"
    if private.delays_every_allreduce(ddp):
        return "every parameter is in DDP's delayed allreduce: DDP reduces nothing in backward"
    hooks = len(private.comm_hooks(ddp))
    if hooks > 1:
        return f"DDP lists {hooks} comm hooks; expected at most one"
    try:
        builtin = private.builtin_comm_hook(ddp)
    except Exception as exc:  # a DDP whose private API differs: it is not traced, and trains as it is
        logger.debug("goddp: could not read DDP's logging data", exc_info=True)
        return f"could not read DDP's logging data ({type(exc).__name__}: {exc})"
    if builtin and private.builtin_hook_type(builtin) is None:
        return (
            f"a built-in C++ comm hook goddp cannot identify ({builtin}) is registered; it could not be "
            "registered again after the trace"
        )
    return None
