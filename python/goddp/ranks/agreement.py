"""When the ranks of a DDP module agree, and what follows from it.

Changing what DDP communicates (its buckets, its reducer) is decided
identically on every rank of the DDP module's process group, or not done at
all; a wait across ranks happens only where every rank is certain to arrive.
Note [Agreeing on DDP's layout] below says what is compared and how.

Note [Where the ranks meet]: outside a Join context (inside one: Note
[Meeting under Join] in goddp.ranks.join) every rank arrives at the DDP
module's first training call, that is the first call with gradients enabled of any graph goddp compiled inside that
module's forward. Compiling is no such place: rank 0 alone may compile a
no_grad evaluation graph, one rank alone may recompile for its uneven last
batch. So goddp compiles without waiting, and each graph it returns for a
grad-enabled DDP forward (pieces, or the whole graph after a fallback)
carries a ``TrainingGate`` that runs before its first call: at the module's
first training call it calls ``agree`` with this rank's proposal.

Later graphs of a decided module (a recompile, a second torch.compile of the
same module) never wait and never re-bucket (only bucket_cap_mb="auto"
decides once more, at a synchronised step: Note [Buckets chosen by cost]
in goddp.ranks.auto): they follow the decision, and
say so in their plan record. Graphs compiled with gradients disabled need no
gate: Dynamo guards on grad mode, so they never run a training step. A
module that is not a real DDP (no process group or reducer, such as torch's
test stand-in FakeDDP) gets no gate: nothing to agree on (goddp.compile.pipeline).
"""

from __future__ import annotations

# Note [Agreeing on DDP's layout]
#
# What the ranks of a DDP module compare is the layout goddp would give DDP,
# never the graph: per bucket, the DDP positions of its parameters in the
# order they become ready, and the cap handed to DDP; the bucket order
# ("ready": DDP rebuilds its buckets from gradient-ready order after its
# first backward, with rank 0's assignment broadcast to all; "declaration":
# find_unused_parameters=True, DDP never rebuilds); and the goddp build
# (version and ABI), since two builds may turn one plan into other caps. The
# Go planner computes its digest (planner/layout.go, goddp_layout_digest).
# Graphs that differ in shapes, symbolic sizes, no_grad history or
# recompiles agree when their layouts do.
#
# One mechanism, for every caller (a graph's first training call here; a
# forward whose graphs are planned together, goddp issue 17):
#
#   agree(ddp, statement, report, may_defer=True) -> Decision
#
# 1. propose: each rank brings a Statement (goddp.ranks.verdict): a Layout
#    (goddp.ranks.layout) with its digest; or none, with the
#    reason (alignment off, a blocker, a fallback); or later=True: its graphs so
#    far hold only part of DDP's parameters and it will bring a combined
#    layout to the module's next training call.
# 2. agree: inside DDP's forward (after DDP's pre-forward, before any of
#    the step's allreduces), at a training call every rank of the module's
#    group is certain to reach, the proposals go through one bounded store
#    round (goddp.ranks.store_round), which hands every rank's statement to
#    the decision (goddp.ranks.verdict.decide, Note [The agreement verdict];
#    pure, so every rank computes the same Decision): INSTALL when every rank
#    proposed the same layout digest; LATER when some rank said later and
#    the round may still wait for it (may_defer); otherwise KEEP
#    DDP's own buckets, with one WARNING naming the rank, bucket and
#    parameter that differ when layouts differ (PlanMismatchError instead,
#    only where some rank runs with strict=True).
# 3. install: only after the decision. Every rank installs the caps (a new
#    reducer); a second round at the same call confirms that all did. If any
#    rank failed, every rank puts DDP's own bucket settings back. Either way
#    each rank ends with a fresh reducer built from one config that is the
#    same on all ranks, so no rank keeps an old (perhaps rebuilt) reducer
#    while another starts afresh. A rank that cannot even put DDP's own back
#    stops (ReducerLost), and so do the others (PeerFailedError).
#
# Where every rank is certain to arrive: the module's first training call;
# and, after a LATER decision, the module's next training call (every rank
# read the same statements, so every rank knows that round is due:
# round_due(ddp); it is held with may_defer=False, so it decides for
# good). Inside Join, both only at a call every rank runs (Note [Meeting
# under Join]). Nothing that one rank alone saw (a recompile, an
# evaluation graph, a graph that shows up later) ever starts a round.
#
# Why aligning after DDP rebuilt its buckets is safe now: the old refusal
# guarded against installing before the ranks had decided: a rank that put
# DDP's settings back then held DDP's initial buckets while a rank that had
# never installed kept the rebuilt ones. Nobody installs before the
# decision now, and a failed install makes every rank rebuild alike. A
# fresh reducer rebuilds its buckets after its next backward, from rank 0's
# gradient order under the caps: every rank's buckets then close at the
# cuts, because every rank proposed the same parameters per bucket.
#
# Inside a Join context the ranks meet only at a training call that every
# rank runs, as DDP's own Join allreduce of that iteration shows (Note
# [Meeting under Join] in goddp.ranks.join).
#
# What cannot align (KEEP on every rank, and why):
# DDP mixed precision, a built-in comm hook goddp cannot identify, the
# Python reducer (Note [Alignment refusals] in planner/refusals.go); ranks
# whose layouts differ; a module that
# is not a real DDP (no process group or reducer: nothing to agree on, one
# INFO line). A graph that first appears after the decision follows it and
# never re-buckets training in the middle (bucket_cap_mb="auto" decides once
# more, where every rank is certain to arrive: Note [Buckets chosen by cost]
# in goddp.ranks.auto).

import dataclasses
import json
import logging
import time
import weakref
from typing import Any, Callable, Mapping

import torch

from goddp.ranks import forward as _forward
from goddp.ranks import join as _join
from goddp.ddp.align import install_or_reset, remove_bucket_caps
from goddp.ddp.declaration import ddp_parameter_names
from goddp.ddp.private import ReducerLost, ddp_parameters
from goddp.ddp.state import state_of
from goddp.ranks.group import Group, group_of, store_for
from goddp.ranks.layout import Layout, installed_run
from goddp.ranks.store_round import (
    RanksMissingError,
    agreement_key,
    exchange,
    first_round_timeout_s,
    model_key,
    timeout_s,
)
from goddp.ranks.verdict import INSTALL, LATER, Decision, Statement, confirm_install, decide
from goddp.tools.phases import phase

logger = logging.getLogger("goddp")

# Called with the plan record's "plan_check" and "ddp_buckets" entries once
# the gate knows them.
Report = Callable[[dict[str, Any], dict[str, Any]], None]


def decided(ddp: Any) -> Decision | None:
    """The module's decision so far (None before its first agreement)."""
    state = state_of(ddp, create=False)
    return None if state is None else state.decision


def round_due(ddp: Any) -> bool:
    """Whether the module's last agreement decided LATER: every rank then
    holds the next one at the module's next training call (Note [Agreeing on
    DDP's layout])."""
    decision = decided(ddp)
    return decision is not None and decision.action == LATER


class TrainingGate:
    """Runs before a compiled graph's first training call (see module doc),
    and at its later calls while ``armed``: while the module's decision
    waits for its next training forward (LATER; goddp.ranks.forward, Note
    [Graphs of one forward]), and while its bucket_cap_mb="auto" counts,
    measures and decides (goddp.ranks.auto; after_call hands it the
    graph's outputs). Raises when the DDP module cannot train on.

    member: what this graph brings to a forward planned across graphs (its
    aligned layout, or why it has none; goddp.ranks.forward.Member)."""

    def __init__(self, ddp: Any, statement: Statement, report: Report, member: Any = None) -> None:
        self._ddp = weakref.ref(ddp)
        self.statement = statement
        self._report = report
        self.member = member
        self.armed = True
        self._joined = False
        self._followed = False

    def __call__(self) -> None:
        ddp = self._ddp()
        if ddp is None:
            self.armed = False
            return
        state = state_of(ddp)
        if state.fatal is not None:
            raise state.fatal
        if state.decision is None:
            if not _join.meets_now(ddp):
                return  # armed: the ranks meet at a later call (Note [Meeting under Join])
            if agree(ddp, self.statement, self._report).action == LATER:
                _forward.start(ddp)
                self._join(ddp)
                return
        elif state.decision.action == LATER:
            if _forward.in_recorded_forward(ddp):
                self._join(ddp)
                return
            if not _join.meets_now(ddp):
                return  # armed: under Join, the second round too waits for a call every rank runs
            self._second_round(ddp)
        elif not self._joined and not self._followed:
            self._follow(state.decision, state.shared, state.parts)
        self._followed = True
        # bucket_cap_mb="auto" counts the module's training calls until it decides.
        auto = state.auto
        self.armed = auto is not None and auto.pending
        if self.armed:
            auto.at_call(ddp)
            self.armed = auto.pending

    def after_call(self, outputs: Any) -> None:
        """The graph's outputs at a call the gate ran before."""
        ddp = self._ddp()
        auto = None if ddp is None else state_of(ddp).auto
        if auto is not None and auto.pending:
            auto.after_call(outputs)

    def _join(self, ddp: Any) -> None:
        if not self._joined:
            # Without a member (no plan) the graph brings nothing: the forward cannot be combined.
            member = self.member or _forward.Member(
                None, self.statement.reason or "no plan", "a graph", self._report, lambda info: None
            )
            _forward.join(ddp, id(self), member)
            self._joined = True

    def _second_round(self, ddp: Any) -> None:
        """The agreement at the module's next training forward: this rank's
        recorded graphs combined into one layout (goddp.ranks.forward)."""
        members = _forward.finish(ddp)
        combined = _forward.combine(members, ddp_parameters(ddp))
        layout, reason, info = combined.layout, combined.reason, combined.info
        logger.info("%s", combined.note)
        statement = Statement(
            layout=layout, digest=combined.digest, reason=reason, strict=self.statement.strict,
            fingerprint=self.statement.fingerprint, pieces=sum(1 for _ in members),
        )

        def report_all(plan_check: dict[str, Any], ddp_buckets: dict[str, Any]) -> None:
            for position, member in enumerate(members):
                member.report(plan_check, ddp_buckets)
                member.note({**info, "position": position, "aligned": ddp_buckets["aligned"],
                             "reason": ddp_buckets["reason"]})

        decision = agree(ddp, statement, report_all, may_defer=False)
        state = state_of(ddp)
        state.shared = _forward.shared(members)
        state.parts = frozenset(m.layout for m in members if m.layout is not None)
        if not self._joined:
            self._follow(decision, state.shared, state.parts)

    def _follow(self, decision: Decision, shared: frozenset[int], parts: frozenset[Layout]) -> None:
        """A graph that first runs after the module decided follows the
        decision (follow); this rank alone runs it."""
        part = None if self.member is None else self.member.layout
        plan_check, ddp_buckets, line = follow(decision, self.statement.layout, part, shared, parts)
        if line is not None:
            logger.info("%s", line)
        self._report(plan_check, ddp_buckets)


# The plan record's "followed" of a later graph.
FOLLOWED = "the decision of the module's first training call"


def follow(
    decision: Decision, mine: Layout | None, part: Layout | None, shared: frozenset[int] = frozenset(),
    parts: frozenset[Layout] = frozenset(),
) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """How a graph that first runs after its DDP module decided stands with
    the decision (Note [Where the ranks meet]; its words,
    Note [The agreement's lines] in goddp.ranks.verdict): its plan record's
    "plan_check" and "ddp_buckets" entries, and its INFO line (None where
    DDP's buckets are its own, or not goddp's). mine: the layout the graph
    proposes; part, where mine is None, its layout for its part of DDP's
    parameters (a graph of a forward planned across graphs). It is aligned
    when its buckets are installed ones (Note [A later graph's part of the
    layout] in goddp.ranks.layout; shared: the parameters several graphs of
    the installed forward held; parts: those graphs' own layouts)."""
    installed = decision.action == INSTALL
    plan_check = {"aligned": installed, "followed": FOLLOWED}
    if decision.action == LATER:
        return plan_check, {"aligned": False, "reason": "the ranks decide at this DDP module's next training call"}, None
    if not installed:
        reason = f"decided at this DDP module's first training call: {decision.reason}"
        return plan_check, {"aligned": False, "reason": reason}, None
    if _follows(decision.layout, mine, part, shared, parts):
        return plan_check, {"aligned": True, "reason": None}, None
    proposed = "none"
    if mine is not None:
        proposed = str(list(mine.caps))
    elif part is not None:
        proposed = f"{list(part.caps)} for its part of DDP's parameters"
    reason = (
        f"DDP's buckets were set at this DDP module's first training call ({list(decision.layout.caps)} bytes) and "
        f"never change mid-training; this graph proposed {proposed}"
    )
    return plan_check, {"aligned": False, "reason": reason}, f"goddp: a later graph of a DDP module keeps its buckets: {reason}"


def _follows(
    installed: Layout, mine: Layout | None, part: Layout | None, shared: frozenset[int], parts: frozenset[Layout]
) -> bool:
    if mine is not None:  # every parameter: nothing counted elsewhere
        return installed_run(installed, mine) is not None
    # A part that one of the installed forward's graphs held, as it held it
    # (with several groups its buckets hold whole units, split only in the
    # combined layout), or a run of installed buckets.
    return part is not None and (part in parts or installed_run(installed, part, shared) is not None)


def installed_layout(ddp: Any) -> tuple[Layout, frozenset[int]] | None:
    """The layout ddp's ranks installed, with the parameters several graphs
    of its forward held; or, while the round at this training forward is
    due (a graph compiled in it before its first call), the one this rank
    will propose there; None before or without one (Note [A later graph's
    part of the layout] in goddp.ranks.layout)."""
    decision = decided(ddp)
    if decision is not None and decision.action == INSTALL:
        return decision.layout, state_of(ddp).shared
    if decision is None or decision.action != LATER or _forward.in_recorded_forward(ddp):
        return None
    members = _forward.recorded(ddp)
    combined = _forward.combine(members, ddp_parameters(ddp))
    return None if combined.layout is None else (combined.layout, _forward.shared(members))


def agree(ddp: Any, statement: Statement, report: Report, may_defer: bool = True) -> Decision:
    """One agreement of ddp's ranks (Note [Agreeing on DDP's layout]): this
    rank's proposal goes to every rank of ddp's process group, every rank
    decides alike, and DDP's buckets follow the layout on every rank or on
    none. Call it inside ddp's forward, after DDP's pre-forward, at a
    training call every rank of the group is certain to reach: the module's
    first, or its next one after a LATER decision (round_due), then with
    may_defer=False. Reports to the plan record, logs the outcome, and
    returns the decision; raises (now and at every later gate) when the
    module cannot train on."""
    state = state_of(ddp)
    if state.fatal is not None:
        raise state.fatal
    started = time.monotonic()
    try:
        with phase("agreement", compile_time=False):  # Note [goddp in compile_times] in goddp.tools.phases
            decision, group = _agree(ddp, statement, may_defer)
    except Exception as exc:
        # The group's state is unknown from here on: stop every step.
        state.fatal = exc
        _join.stop(ddp)
        raise
    state.decision = decision
    if decision.action != LATER:  # LATER: a round still to come (Note [Meeting under Join])
        _join.stop(ddp)
    report(
        {**decision.summary(), "group": group.name, "size": len(group.ranks),
         "seconds": round(time.monotonic() - started, 3)},
        {"aligned": decision.action == INSTALL, "reason": decision.reason},
    )
    return decision


def _agree(ddp: Any, statement: Statement, may_defer: bool) -> tuple[Decision, Group]:
    group = group_of(ddp, timeout_s)
    key = agreement_key(group.name, model_key_of(ddp))
    name_of = _namer(ddp)

    def verdict(payloads: Mapping[int, str], unsettled: Mapping[str, Any] | None = None) -> Decision:
        statements = {r: Statement.from_json(p) for r, p in payloads.items()}
        return decide(statements, name_of, may_defer, unsettled, group)

    first = dataclasses.replace(group, timeout_s=first_round_timeout_s(group))
    try:
        decision = exchange(store_for(group), key, first, statement.to_json(), verdict, keeps=True)
    except RanksMissingError as exc:
        logger.warning("%s", exc)
        decision = verdict(exc.seen, exc.unsettled)
    if decision.action == INSTALL:
        decision = _install(ddp, decision, group, key)
    if decision.log is not None:
        level, text = decision.log
        logger.log(level, "%s", text)
    return decision, group


def _install(ddp: Any, decision: Decision, group: Group, key: str) -> Decision:
    """Step 3 of Note [Agreeing on DDP's layout]: every rank installs, a
    second round says who did, and if anyone failed every rank ends with
    DDP's own bucket settings on a fresh reducer."""
    lost: ReducerLost | None = None
    failed: str | None = None
    try:
        failed = install_or_reset(ddp, decision.caps)
    except ReducerLost as exc:
        lost = exc
    except Exception as exc:  # even DDP's own settings could not be put back: raised once the round is in (confirm)
        logger.debug("goddp: the install and its rollback failed", exc_info=True)
        lost = ReducerLost(
            f"goddp: could not give DDP a fresh reducer with its own buckets after a failed install "
            f"({type(exc).__name__}: {exc}); this rank would allreduce buckets the others do not"
        )
    mine = json.dumps({"failed": failed, "lost": None if lost is None else str(lost)})

    def confirm(payloads: Mapping[int, str]) -> Decision:
        if lost is not None:
            raise lost  # the others stop too (PeerFailedError), having read why
        return confirm_install(decision, {r: json.loads(p) for r, p in payloads.items()}, group)

    confirmed = exchange(store_for(group), f"{key}/installed", group, mine, confirm, "install", "install DDP's new buckets")
    if confirmed.action != INSTALL:
        _put_ddp_buckets_back(ddp)
    return confirmed


def _namer(ddp: Any) -> Callable[[int], str]:
    """DDP position -> parameter name (the same on every rank)."""
    try:
        names = ddp_parameter_names(ddp)
    except Exception:  # a DDP whose private API differs: positions will do, in messages only
        logger.debug("goddp: could not name DDP's parameters", exc_info=True)
        names = []
    return lambda p: names[p] if 0 <= p < len(names) else f"parameter {p}"


def model_key_of(ddp: Any) -> str:
    """The key of ddp's agreements in the store (store_round.model_key)."""
    return model_key([(tuple(p.shape), str(p.dtype)) for p in ddp_parameters(ddp)])


def _put_ddp_buckets_back(ddp: Any) -> None:
    if state_of(ddp).aligned_caps is not None:
        try:
            remove_bucket_caps(ddp)
        except ReducerLost:
            raise
        except Exception as exc:  # DDP's previous reducer (goddp's caps) is back
            raise ReducerLost(
                f"goddp: could not put DDP's own buckets back after the ranks decided against goddp's "
                f"({type(exc).__name__}: {exc}); this rank would allreduce buckets the others do not"
            ) from exc


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
            if not self._gate.armed:
                self._gate = None
        return self._compiled(*args)


def gate_for_training(ddp: Any, statement: Statement, report: Report, member: Any = None) -> TrainingGate | None:
    """A gate for a graph compiled inside ddp's forward, or None where the
    graph cannot run a training step (compiled with gradients disabled)."""
    if not torch.is_grad_enabled():
        return None
    return TrainingGate(ddp, statement, report, member)
