"""When the ranks of a DDP module agree, and what follows from it.

Changing what DDP communicates (its buckets, its reducer) is decided
identically on every rank of the DDP module's process group, or not done at
all; a wait across ranks happens only where every rank is certain to arrive.

Where every rank arrives: the DDP module's first training call, that is the
first call with gradients enabled of any graph goddp compiled inside that
module's forward. Compiling is no such place: rank 0 alone may compile a
no_grad evaluation graph, one rank alone may recompile for its uneven last
batch. So goddp compiles without waiting, and each graph it returns for a
grad-enabled DDP forward (pieces, or the whole graph after a fallback)
carries a ``TrainingGate`` that runs before its first call:

1. This rank's Statement (goddp.ranks.plan_check): the plan's fingerprint, and
   the per-bucket caps it proposes for DDP's buckets or why it proposes
   none (alignment off, a blocker, a fallback). A rank that proposes caps
   installs them now, tentatively (goddp.ddp.align), so that a failed install
   is part of what it says.
2. The statements are exchanged through the default c10d store within the
   module's process group (not in a 1-rank group), and every rank computes
   the same Decision from them.
3. DDP's buckets follow the pieces if every rank proposed the same caps;
   otherwise every rank keeps (or puts back) DDP's own, and logs why at
   WARNING when the ranks said different things. A plan mismatch, a missing
   rank or a lost reducer raises, on this call and on every later one.

Later graphs of a decided module (a recompile, a second torch.compile of the
same module) never wait and never re-bucket: they follow the decision, and
say so in their plan record. Graphs compiled with gradients disabled need no
gate: Dynamo guards on grad mode, so they never run a training step.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from typing import Any, Callable

import torch

from goddp.ddp.align import ALIGNED_CAPS_ATTR, install_bucket_caps, remove_bucket_caps
from goddp.ddp.private import ReducerLost, ddp_parameters
from goddp.ddp.refusals import rebuild_blocker
from goddp.ranks.plan_check import Decision, Statement, decide, exchange, model_key, timeout_s
from goddp.ranks.group import Group, group_of, store_for

logger = logging.getLogger("goddp")

STORE_PREFIX = "goddp/agree"

# Called with the plan record's "plan_check" and "ddp_buckets" entries once
# the gate knows them.
Report = Callable[[dict[str, Any], dict[str, Any]], None]


@dataclasses.dataclass
class _ModuleState:
    decision: Decision | None = None
    # Set when the module cannot train on; raised at every later call.
    fatal: BaseException | None = None


_states: "weakref.WeakKeyDictionary[Any, _ModuleState]" = weakref.WeakKeyDictionary()


def _state_of(ddp: Any) -> _ModuleState:
    state = _states.get(ddp)
    if state is None:
        state = _states[ddp] = _ModuleState()
    return state


class TrainingGate:
    """Runs before a compiled graph's first training call (see module doc).
    Raises when the DDP module cannot train on."""

    def __init__(self, ddp: Any, statement: Statement, report: Report) -> None:
        self._ddp = weakref.ref(ddp)
        self.statement = statement
        self._report = report

    def __call__(self) -> None:
        ddp = self._ddp()
        if ddp is None:
            return
        state = _state_of(ddp)
        if state.fatal is not None:
            raise state.fatal
        try:
            if state.decision is None:
                started = time.monotonic()
                state.decision, group = _agree(ddp, self.statement)
                self._report(
                    {**state.decision.summary(), "group": group.name, "size": len(group.ranks),
                     "seconds": round(time.monotonic() - started, 3)},
                    {"aligned": state.decision.caps is not None, "reason": state.decision.reason},
                )
            else:
                self._follow(state.decision)
        except Exception as exc:
            # The group's state is unknown from here on: stop every step.
            state.fatal = exc
            raise

    def _follow(self, decision: Decision) -> None:
        mine = self.statement.caps
        if decision.caps is None:
            reason = f"decided at this DDP module's first training call: {decision.reason}"
        elif mine == decision.caps:
            reason = None
        else:
            reason = (
                "DDP's buckets were set at this DDP module's first training call "
                f"({list(decision.caps)} bytes) and never change mid-training; this graph "
                f"proposed {'none' if mine is None else list(mine)}"
            )
            logger.info("goddp: a later graph of a DDP module keeps its buckets: %s", reason)
        self._report(
            {"aligned": decision.caps is not None, "followed": "the decision of the module's first training call"},
            {"aligned": decision.caps is not None and reason is None, "reason": reason},
        )


def _agree(ddp: Any, statement: Statement) -> tuple[Decision, Group]:
    group = group_of(ddp, timeout_s)
    if statement.caps is not None:
        blocker = rebuild_blocker(ddp)
        if blocker is not None:
            statement = dataclasses.replace(statement, caps=None, reason=blocker)
    lost: ReducerLost | None = None
    if statement.caps is not None:
        try:
            install_bucket_caps(ddp, statement.caps)
        except ReducerLost as exc:
            lost = exc
            statement = dataclasses.replace(statement, caps=None, lost=str(exc))
        except Exception as exc:  # DDP's own reducer is back (install_bucket_caps)
            statement = dataclasses.replace(
                statement, caps=None, reason=f"installing the caps failed ({type(exc).__name__}: {exc})"
            )
    statements = {group.rank: statement}
    store = store_for(group)
    if store is not None:
        key = f"{STORE_PREFIX}/{group.name}/{_model_key(ddp)}"
        payloads = exchange(store, key, group, statement.to_json())
        statements = {r: Statement.from_json(p) for r, p in payloads.items()}
    if lost is not None:
        raise lost  # the others stop too (PeerFailedError), having read why
    try:
        decision = decide(statements)
    except Exception:
        _put_ddp_buckets_back(ddp)
        raise
    if decision.caps is None:
        _put_ddp_buckets_back(ddp)
    _log(decision, group)
    return decision, group


def _model_key(ddp: Any) -> str:
    return model_key([(tuple(p.shape), str(p.dtype)) for p in ddp_parameters(ddp)])


def _put_ddp_buckets_back(ddp: Any) -> None:
    if hasattr(ddp, ALIGNED_CAPS_ATTR):
        try:
            remove_bucket_caps(ddp)
        except ReducerLost:
            raise
        except Exception as exc:  # DDP's previous reducer (goddp's caps) is back
            raise ReducerLost(
                f"goddp: could not put DDP's own buckets back after the ranks decided against goddp's "
                f"({type(exc).__name__}: {exc}); this rank would allreduce buckets the others do not"
            ) from exc


def _log(decision: Decision, group: Group) -> None:
    where = f"{len(group.ranks)} rank(s) of process group {group.name!r}"
    if decision.caps is not None:
        logger.info(
            "goddp: DDP's %d buckets now close at piece boundaries on all %s (per-bucket caps %s bytes)",
            len(decision.caps), where, list(decision.caps),
        )
    elif decision.disagreed:
        logger.warning(
            "goddp: DDP keeps its own buckets on all %s: %s. Gradients stay exact; only the overlap of "
            "allreduces with backward is smaller.",
            where, decision.reason,
        )
    else:
        logger.info("goddp: DDP keeps its own buckets on all %s: %s", where, decision.reason)


class GatedCall:
    """A whole-graph compiled callable that takes part in its DDP module's
    agreement at its first training call, like the pieces do, so that a
    rank that fell back still arrives and says why."""

    def __init__(self, compiled: Callable[..., Any], gate: TrainingGate) -> None:
        self._compiled = compiled
        self._gate: TrainingGate | None = gate

    def __call__(self, *args: Any) -> Any:
        if self._gate is not None:
            self._gate()
            self._gate = None
        return self._compiled(*args)


def gate_for_training(ddp: Any, statement: Statement, report: Report) -> TrainingGate | None:
    """A gate for a graph compiled inside ddp's forward, or None where the
    graph cannot run a training step (compiled with gradients disabled)."""
    if not torch.is_grad_enabled():
        return None
    return TrainingGate(ddp, statement, report)
