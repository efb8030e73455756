"""Why goddp leaves a DDP module alone: every refusal, in one place.

Two things goddp may change on a DDP module, each refused where it is not
known to be safe, with a reason the user reads:
- alignment (docs/align.md): ``alignment_facts`` reads what about DDP may
  refuse it, and the planner decides (Note [Alignment refusals] in
  planner/refusals.go; goddp.native.plan words its code; only "could not
  inspect DDP" is said here); ``rebuild_blocker`` (the moment of the rebuild); goddp then keeps
  DDP's own buckets. Whether the plan's buckets hold exactly DDP's
  parameters is the planner's decision too (GODDP_REASON_NOT_COVERED);
- goddp.trace: ``trace_refusal``; the trace is then refused on every rank.
The rebuild's and the trace's reasons are the planner's too (Note [DDP
refusals] in planner/ddprefusals.go): this module reads the facts.
"""

from __future__ import annotations

from typing import Any

from goddp.ddp import private
from goddp.native import extension as _native
from goddp.native.plan import AlignmentFacts

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
                builtin_comm_hook=bool(private.builtin_comm_hook(ddp)),
                delays_allreduce=private.delays_some_allreduces(ddp),
                several_param_groups=len({(p.dtype, p.device) for p in private.ddp_parameters(ddp)}) != 1,
            ),
            None,
        )
    except Exception as exc:  # a DDP whose private API differs: leave it alone
        return None, could_not_inspect(exc)


def could_not_inspect(exc: Exception) -> str:
    """Why goddp leaves the buckets of a DDP module alone whose private API
    raised exc (the caller's refusal of Note [Alignment refusals])."""
    return f"could not inspect DDP ({type(exc).__name__}: {exc})"


def rebuild_blocker(ddp: Any) -> str | None:
    """Why DDP's reducer cannot be replaced right now, or None (the planner's
    words, Note [DDP refusals]). Asked at the first training call, where the
    rebuild would happen; a planner error keeps DDP's buckets."""
    flags = _native.DDP_JOIN if private.join_enabled(ddp) else 0
    return _ask("rebuild", {"flags": flags}, "rebuild DDP's reducer")[0]


def trace_refusal(ddp: Any) -> str | None:
    """Why this DDP module cannot be traced (goddp.trace), or None: the facts
    read here, the reason the planner's (Note [DDP refusals])."""
    facts = (
        (getattr(ddp, TRACE_ACTIVE_ATTR, None) is not None, _native.DDP_TRACED),
        (private.uses_python_reducer(ddp), _native.DDP_PYTHON_REDUCER),
        (ddp.static_graph, _native.DDP_STATIC_GRAPH),
        (private.delays_every_allreduce(ddp), _native.DDP_DELAYS_EVERY_ALLREDUCE),
    )
    hooks, unread = _read(lambda: len(private.comm_hooks(ddp)))
    builtin, failed = _read(lambda: private.builtin_comm_hook(ddp) or None)
    request = {
        "flags": sum(bit for fact, bit in facts if fact) | (_native.DDP_BUILTIN_COMM_HOOK if builtin else 0),
        "comm_hooks": hooks,
        "builtin_comm_hook": builtin,
        "logging_error": None if failed is None else f"{type(failed).__name__}: {failed}",
    }
    refusal, needs = _ask("trace", request, "trace this DDP module")
    if needs is not None and unread is not None:
        raise unread  # what reading the comm hooks raised, where the planner needs them
    return refusal


def _read(fact: Any) -> tuple[Any, Exception | None]:
    try:
        return fact(), None
    except Exception as exc:
        return None, exc


def _ask(question: str, request: dict[str, Any], doing: str) -> tuple[str | None, str | None]:
    """The planner's refusal and the fact it could not do without; a planner
    error is itself the refusal (goddp then leaves DDP alone)."""
    try:
        reply = _native.ddp_refusal({"question": question, **request})
        refusal, unread = reply["refusal"], reply["unread"]
        if not all(v is None or isinstance(v, str) for v in (refusal, unread)):
            raise TypeError(f"a reply of another shape: {reply!r}")
    except Exception as exc:
        return f"goddp could not decide whether to {doing} ({type(exc).__name__}: {exc})", None
    return refusal, unread
