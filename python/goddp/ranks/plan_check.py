"""What the ranks of a DDP module say to each other, and what they decide.

Every rank of a DDP module's process group publishes one ``Statement``: the
layout it proposes for DDP's buckets (goddp.ranks.layout) with its digest, or
why it proposes none, or that it will propose later. ``exchange`` passes
the statements through the default c10d store; ``decide`` turns them into
one ``Decision``: the verdict of goddp.ranks.verdict
(Note [The agreement verdict]), a pure function of all statements; every rank reads
the same statements, so every rank reaches the same
decision or raises the same error. The plan's fingerprint travels along for
the record only: graphs may differ (Note [Agreeing on DDP's layout]).

When the exchange happens, and what a decision changes, is
goddp.ranks.agreement's business; README.md ("Several ranks") explains both.

Store keys, all under ``goddp/agree/<attempt>/<group name>/<model key>/``
(attempt: torchrun's restart count, so that an elastic restart never reads
what a dead attempt left in a store the agent keeps across attempts):
- ``arrivals``: a counter (``store.add``). The n-th arrival belongs to round
  ``(n - 1) // group size``, so two runs that share a long-lived store, or
  two DDP modules of the same shapes in one run, never read each other's
  statements. It stays when a round ends: the next round counts on it.
- ``<round>/...``: the round's statements, outcome and read count
  (goddp.ranks.store_round says how a round settles).
- ``installed/...``: the same for the second round, in which the ranks that
  decided to install say whether they did.

Environment: GODDP_PLAN_CHECK_TIMEOUT, seconds to wait for the other ranks
(default: the DDP process group's own timeout, 30 minutes unless
``init_process_group(timeout=...)`` says otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Mapping, Sequence

from goddp.ranks.group import Group, env_seconds, process_group_timeout_s, round_error
from goddp.ranks.group import timeout_s as group_timeout_s
from goddp.ranks.layout import Layout
from goddp.ranks.store_round import GAVE_UP, settle
# Decision.action, the statement and the verdict's errors are goddp.ranks.verdict's, named here too.
from goddp.ranks.verdict import INSTALL, KEEP, LATER, PeerFailedError, PlanMismatchError, Round, Statement, Verdict  # noqa: F401

TIMEOUT_ENV = "GODDP_PLAN_CHECK_TIMEOUT"

class RanksMissingError(RuntimeError):
    """Some ranks of a DDP module's group never reached the agreement.

    unsettled: how the given-up round ended, as decide reads it
    ({"stopped_by": rank, "missing": [ranks]}); seen: the payloads this rank
    read (rank -> text)."""

    def __init__(self, message: str, unsettled: dict[str, Any] | None = None, seen: Mapping[int, str] | None = None):
        super().__init__(message)
        self.unsettled = unsettled
        self.seen = dict(seen or {})


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank of the group does (the round's verdict).

    action: INSTALL (the layout, on every rank), KEEP (DDP's own buckets,
        on every rank) or LATER (decide at the module's next training call).
    layout: the layout to install (INSTALL only).
    reason: why not INSTALL (naming what each rank said when they differ).
    disagreed: the ranks said different things, which is worth a WARNING.
    statements: what each rank (global rank numbers) said.
    record: the verdict's plan-record view of it (summary()).
    log: the line every rank logs for it, (logging level, text), where the
        verdict was told the group (Note [The agreement's lines] in
        goddp.ranks.verdict).
    """

    action: str
    layout: Layout | None
    reason: str | None
    disagreed: bool
    statements: Mapping[int, Statement]
    record: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)
    log: tuple[int, str] | None = dataclasses.field(default=None, compare=False)

    @property
    def caps(self) -> tuple[int, ...] | None:
        return None if self.layout is None else self.layout.caps

    def summary(self) -> dict[str, Any]:
        """The plan record's view of the decision (JSON-serialisable)."""
        return json.loads(json.dumps(self.record))


def decide(
    statements: Mapping[int, Statement],
    name_of: Callable[[int], str] = str,
    may_defer: bool = True,
    unsettled: Mapping[str, Any] | None = None,
    group: Group | None = None,
) -> Decision:
    """The group's decision from every rank's statement: the round's
    verdict (goddp.ranks.verdict, Note [The agreement verdict]), naming
    parameters by name_of(DDP position).

    Raises PeerFailedError when a rank lost its reducer, and
    PlanMismatchError when the ranks' layouts differ and some rank runs with
    strict=True. Otherwise DDP's buckets follow the layout if and only if
    every rank proposes the very same one (equal digests); the decision
    waits for the next training call when some rank will propose later
    (may_defer: not where that call has come). unsettled (a
    RanksMissingError's): the round was given up, and statements are the
    ones this rank saw; KEEP on every rank (Note [A round given up] in
    goddp.ranks.verdict). group: the round's group, for the decision's log line.
    """
    round_ = Round(statements, name_of, group)
    if unsettled is None:
        return _decision(round_.propose(may_defer), statements)
    return _decision(round_.given_up(unsettled["stopped_by"], unsettled["missing"]), statements)


def confirm_install(
    decision: Decision, installed: Mapping[int, Mapping[str, Any]], group: Group | None = None
) -> Decision:
    """The install round after an INSTALL decision: installed holds what
    each rank said ({"failed": why or None, "lost": why or None}). Raises
    PeerFailedError when a rank lost its reducer; KEEP on every rank when
    some rank failed to install; else the decision stands."""
    return _decision(Round(decision.statements, str, group).confirm(installed), decision.statements)


def _decision(verdict: Verdict, statements: Mapping[int, Statement]) -> Decision:
    layout = None if verdict.layout_rank is None else statements[verdict.layout_rank].layout
    return Decision(
        verdict.action, layout, verdict.reason, verdict.disagreed, dict(statements), verdict.record, verdict.log
    )


# --------------------------------------------------------------------------
# The exchange


def first_round_timeout_s(group: Group) -> float:
    """How long a module's agreement (not its install round) waits:
    GODDP_PLAN_CHECK_TIMEOUT, else half the group's timeout, so that ranks
    that give up (Note [A round given up] in goddp.ranks.verdict) still meet a
    rank that never came in DDP's first allreduce before that collective's
    own timeout ends it."""
    return env_seconds(TIMEOUT_ENV) or group.timeout_s / 2


def timeout_s(process_group: Any = None) -> float:
    """GODDP_PLAN_CHECK_TIMEOUT, else the process group's own timeout: a
    rank may still be compiling (an evaluation graph, say) while the others
    wait, so the wait is as generous as any collective on that group."""
    return group_timeout_s(TIMEOUT_ENV, lambda: process_group_timeout_s(process_group))


def exchange(
    store: Any,
    key: str,
    group: Group,
    payload: str,
    meeting: str = "first step",
    waiting_for: str = "reach the first training step (they may still be compiling)",
    keeps: bool = False,
) -> dict[int, str]:
    """Publishes payload under key for this rank and returns every rank's
    payload of the same round (see module doc). Waits at most
    group.timeout_s for the others, then raises RanksMissingError naming
    the ranks that did not come; a rank that comes after the others gave
    up on it raises it too. meeting: "first step" or "install"; keeps: the
    message says the rank keeps DDP's buckets rather than stop (see
    Note [Rounds that did not settle] in goddp.ranks.group)."""
    arrival = int(store.add(f"{key}/arrivals", 1))
    base = f"{key}/{(arrival - 1) // len(group.ranks)}"
    ended = settle(store, base, group, payload, lambda _: "go", waiting_for)
    if not ended.gave_up:
        return dict(ended.statements)
    unsettled = {"stopped_by": int(ended.outcome[len(GAVE_UP):]), "missing": ended.missing(group)}
    raise RanksMissingError(round_error(meeting, group, ended, keeps, TIMEOUT_ENV), unsettled, ended.statements)


STORE_PREFIX = "goddp/agree"


def attempt() -> str:
    """torchrun's restart count (the same on every rank of an attempt), "0"
    outside torchrun."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def agreement_key(group_name: str, model: str) -> str:
    """The store key of a DDP module's agreements (see module doc)."""
    return f"{STORE_PREFIX}/{attempt()}/{group_name}/{model}"


def model_key(shapes: Sequence[tuple[tuple[int, ...], str]]) -> str:
    """A key every rank of a DDP module derives identically: its parameters'
    shapes and dtypes in DDP order (DDP checks at construction that these
    agree across the group). Nothing else: ranks may name or declare the
    same parameters differently (another class, another declaration order)
    and must still meet, to find that their layouts differ."""
    text = ";".join(f"{'x'.join(map(str, shape))}:{dtype}" for shape, dtype in shapes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
