"""What the ranks of a DDP module decide, and its words: the one module
that decides.

Every rank of a DDP module's process group brings one ``Statement``: the
layout it proposes for DDP's buckets (goddp.ranks.layout) with its digest,
or why it proposes none, or that it will propose later. ``Round`` holds one
round's statements in rank order; ``propose``, ``given_up`` and ``confirm``
are its three kinds of round, each a ``Decision`` or one of the errors every
rank raises alike (``decide`` and ``confirm_install`` are the agreement's
way in). The plan's fingerprint travels along for the record only: graphs
may differ (Note [Agreeing on DDP's layout] in goddp.ranks.agreement).
Only the layouts' digests come from the Go planner (goddp_layout_digest).
How the statements travel is goddp.ranks.store_round's business.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Callable, Mapping, Sequence

from goddp.native import extension as _native
from goddp.ranks.group import Group
from goddp.ranks.layout import ORDERS, Layout


@dataclasses.dataclass(frozen=True)
class Statement:
    """What one rank says at an agreement of a DDP module.

    layout: the layout this rank proposes for DDP's buckets; None when it
        proposes to leave them alone (reason says why) or to propose later.
    digest: the planner's digest of layout.
    reason: why layout is None.
    later: this rank's graphs so far hold only part of DDP's parameters; it
        will bring a combined layout to the module's next training call.
    strict: this rank asks that differing layouts be an error (strict=True).
    lost: why this rank cannot go on (its reducer could not be rebuilt).
    fingerprint, pieces: the plan this rank runs, for the record (planning
        failed: fingerprint None).
    """

    layout: Layout | None
    digest: int | None = None
    reason: str | None = None
    later: bool = False
    strict: bool = False
    lost: str | None = None
    fingerprint: int | None = None
    pieces: int = 1

    @property
    def caps(self) -> tuple[int, ...] | None:
        return None if self.layout is None else self.layout.caps

    def to_dict(self) -> dict[str, Any]:
        """The statement as it crosses the store."""
        return {
            "layout": None if self.layout is None else self.layout.to_dict(),
            "digest": None if self.digest is None else f"{self.digest:016x}",
            "reason": self.reason,
            "later": self.later,
            "strict": self.strict,
            "lost": self.lost,
            "fingerprint": None if self.fingerprint is None else f"{self.fingerprint:016x}",
            "pieces": self.pieces,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Statement":
        fields = json.loads(text)
        layout, digest, fingerprint = fields.get("layout"), fields.get("digest"), fields.get("fingerprint")
        return cls(
            layout=None if layout is None else Layout.from_dict(layout),
            digest=None if digest is None else int(digest, 16),
            reason=fields.get("reason"),
            later=bool(fields.get("later", False)),
            strict=bool(fields.get("strict", False)),
            lost=fields.get("lost"),
            fingerprint=None if fingerprint is None else int(fingerprint, 16),
            pieces=int(fields.get("pieces", 1)),
        )


# Note [The agreement verdict]
#
# Every rank of a DDP module's process group brings one Statement to an
# agreement round (goddp.ranks.agreement, Note [Agreeing on DDP's layout]);
# the ranks pass them through the c10d store and each hands all of them
# here. The verdict is a pure function of the statements, the parameter
# names and the round: every rank reads the same statements, so every rank
# reaches the same verdict, word for word, or raises the same error. Ranks
# are walked in ascending order and no set or dict order reaches a message,
# so the order in which statements arrived never does either.
#
# The propose round, in this order:
#  1. a rank lost its reducer: PeerFailedError, naming every such rank;
#  2. layouts differ (each compared with the lowest rank's that has one)
#     and some rank runs with strict=True: PlanMismatchError, naming rank,
#     bucket and parameter, and listing what every rank said;
#  3. some rank will propose later and the round may defer: LATER;
#  4. every rank gave the same layout digest: INSTALL (the lowest rank's
#     layout);
#  5. otherwise KEEP, with the differences, the one reason every rank gave,
#     or the listing; disagreed when the ranks said different things.
#
# The install round (after an INSTALL verdict, each rank says whether it
# installed): a rank that lost its reducer is PeerFailedError; a rank that
# failed makes the verdict KEEP for all ("the ranks agreed, but ...");
# otherwise the INSTALL verdict stands.

# Note [A round given up]
#
# A rank may not come to a round in time: it still compiles, it crashed,
# or Dynamo ran the frame eagerly there and it never comes at all. The
# first rank whose bounded wait runs out settles the round as given up,
# and every rank follows that one outcome (goddp.ranks.store_round), so
# the verdict is KEEP on every rank, whatever each saw (the reason says
# what this rank saw, and so may differ between ranks; the action never):
# nobody has installed anything yet, so all of them train on with DDP's own
# buckets and pair in DDP's allreduces, the latecomer too. It is never an
# error: a rank that crashed is reported by DDP's first collective, as in
# eager DDP. Only the install round, which every rank that decided INSTALL
# reaches at the same call, still fails when a rank does not come.

# Note [What the verdict refuses]
#
# A verdict is only as good as the statements, so a Round refuses
# (ValueError, the same on every rank, since every rank reads the same
# statements) rather than decide on:
#   - no statement, or a negative rank;
#   - a layout without its digest, or a digest without a layout;
#   - a negative piece count (a record-only field, but no rank runs fewer
#     than no pieces);
#   - a layout of an order other than "ready" and "declaration", or a
#     digest that is not the planner's digest of its layout (recomputed:
#     equal digests must mean equal layouts, or two ranks could install
#     different caps); the planner also refuses a layout no DDP module
#     could have (a negative or repeated position among them);
#   - at an install round, reports that are not from exactly the ranks
#     that made statements, or statements that do not agree on one layout;
#   - a given-up round that names a negative rank, or a rank both missing
#     and heard from;
#   - a process group (for the outcome line) of no rank.

# Note [The agreement's lines]
#
# What goddp tells its users about the ranks' agreement (the outcome line
# of a round, the refusals of a forward planned across graphs and the line
# that announces it, the line of a later graph that follows the decision)
# is worded from facts the verdict already holds: the verdict, the members'
# layouts, orders and reasons. Each line is written once, where its rule
# is (outcome_line here, goddp.ranks.forward.combine,
# goddp.ranks.agreement.follow), at the level it names; the words are the
# ones goddp's users and tests read (tests/python/ranks/goldens/words.golden).

# Decision.action
INSTALL = "install"
KEEP = "keep"
LATER = "later"


class PlanMismatchError(RuntimeError):
    """Ranks of one DDP module proposed different layouts for DDP's buckets
    and some rank runs with strict=True."""


class PeerFailedError(RuntimeError):
    """Another rank of the group cannot train on (its DDP reducer is lost)."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank of the group does.

    action: INSTALL (the layout, on every rank), KEEP (DDP's own buckets,
        on every rank) or LATER (decide at the module's next training call).
    layout: the layout every rank installs, the lowest rank's (INSTALL only).
    reason: why not INSTALL (None when INSTALL, or when every rank kept
        DDP's buckets without saying why; naming what each rank said when
        they differ).
    disagreed: the ranks said different things (worth a WARNING).
    statements: what each rank (global rank numbers) said.
    record: the plan record's "plan_check" entry, less what only the
        caller knows (the group's name and size, the seconds it took).
    log: the line every rank logs for it, (logging level, text); None
        without a group (Note [The agreement's lines]).
    """

    action: str
    layout: Layout | None
    reason: str | None
    disagreed: bool
    statements: Mapping[int, Statement]
    record: dict[str, Any] | None = None
    log: tuple[int, str] | None = None

    @property
    def caps(self) -> tuple[int, ...] | None:
        return None if self.layout is None else self.layout.caps

    def summary(self) -> dict[str, Any]:
        """The plan record's view of the decision (JSON-serialisable)."""
        return json.loads(json.dumps(self.record))


def _hex(value: int | None) -> str | None:
    return None if value is None else f"{value:016x}"


def _caps(layout: Layout | None) -> list[int] | None:
    return None if layout is None else list(layout.caps)


class Round:
    """One agreement round's statements in rank order
    (Note [The agreement verdict]). name_of names DDP positions in the
    words; group, when given, makes each verdict carry its outcome line
    (Note [The agreement's lines]). Raises ValueError for statements no
    rank could have made (Note [What the verdict refuses])."""

    def __init__(
        self, statements: Mapping[int, Statement], name_of: Callable[[int], str] = str, group: Group | None = None
    ) -> None:
        if group is not None and len(group.ranks) < 1:
            raise ValueError(f"goddp: process group {group.name!r} has {len(group.ranks)} ranks; want at least 1")
        self.ranks = sorted(statements)
        self.said = [statements[r] for r in self.ranks]
        self.name_of = name_of
        self.group = group
        self._check()

    # -- the three kinds of round

    def propose(self, may_defer: bool) -> Decision:
        """The propose round; may_defer: a rank that will propose later
        defers the decision (False at the round that was deferred to)."""
        self._raise_lost(self._lost())
        diffs = self._differences()
        if diffs and any(s.strict for s in self.said):
            raise PlanMismatchError(
                "goddp: the ranks of this DDP module proposed different layouts for DDP's buckets ("
                + "; ".join(diffs) + "): " + self._listing()
                + ". strict=True makes this an error; without it every rank keeps DDP's own buckets and trains on."
            )
        if may_defer and any(s.later for s in self.said):
            return self._verdict(LATER, None, "some rank will propose its layout at the next training call", False)
        if self._same_digest():
            return self._verdict(INSTALL, 0, None, False)
        sayings = len({(s.digest, s.reason, s.later, s.fingerprint is None) for s in self.said})
        if diffs:
            reason = "the ranks' layouts differ: " + "; ".join(diffs)
        elif sayings == 1:
            reason = self.said[0].reason
        else:
            reason = "the ranks did not all propose the same layout: " + self._listing()
        return self._verdict(KEEP, None, reason, sayings > 1)

    def given_up(self, stopped_by: int, missing: Sequence[int]) -> Decision:
        """A round given up (Note [A round given up]): stopped_by is the rank
        whose bounded wait ran out first, missing the ranks whose statements
        this rank never saw; the statements are the ones it saw."""
        missing = sorted(missing)
        if stopped_by < 0 or any(r < 0 for r in missing):
            raise ValueError("goddp: a given-up round names a negative rank")
        for r in self.ranks:
            if r in missing:
                raise ValueError(f"goddp: rank {r} is both missing and heard from")
        if missing:
            why = (
                f"rank(s) [{' '.join(map(str, missing))}] did not come to the agreement within the bounded wait "
                f"(rank {stopped_by} stopped waiting first)"
            )
        else:
            why = f"rank {stopped_by} stopped waiting before this rank had seen every rank's statement"
        return self._verdict(KEEP, None, why + "; every rank keeps DDP's own buckets and trains on", True)

    def confirm(self, installed: Mapping[int, Mapping[str, Any]]) -> Decision:
        """The install round after this round's INSTALL verdict: installed
        holds what each rank said ({"failed": why or None, "lost": why or
        None}; an absent or empty why says nothing)."""
        for r in self.ranks:
            if r not in installed:
                raise ValueError(f"goddp: the install round has no report from rank {r}")
        for r in sorted(installed):
            if r not in self.ranks:
                raise ValueError(f"goddp: the install round has a report from rank {r}, which made no statement")
        if self._lost() or not self._same_digest():
            raise ValueError("goddp: an install round needs statements that agree on one layout")
        lost, failed = [], []
        for r in sorted(installed):
            said = installed[r]
            if said.get("lost"):
                lost.append((r, said["lost"]))
            elif said.get("failed"):
                failed.append(f"rank {r}: {said['failed']}")
        self._raise_lost(lost)
        if not failed:
            return self._verdict(INSTALL, 0, None, False)
        return self._verdict(KEEP, None, "the ranks agreed, but " + "; ".join(failed), True)

    # -- the steps

    def _check(self) -> None:
        """Refuses statements no rank could have made
        (Note [What the verdict refuses])."""
        if not self.said:
            raise ValueError("goddp: an agreement needs at least one statement")
        if self.ranks[0] < 0:
            raise ValueError(f"goddp: rank {self.ranks[0]} is not a rank (ranks are 0 or more)")
        for r, s in zip(self.ranks, self.said):
            if s.layout is None and s.digest is not None:
                raise ValueError(f"goddp: rank {r} gave a layout digest without a layout")
            if s.layout is not None and s.digest is None:
                raise ValueError(f"goddp: rank {r} gave a layout without its digest")
            if s.pieces < 0:
                raise ValueError(f"goddp: rank {r} runs {s.pieces} pieces (a count is 0 or more)")
            if s.layout is None:
                continue
            if s.layout.order not in ORDERS:
                raise ValueError(f"goddp: rank {r} proposed a layout of bucket order {s.layout.order!r}; want one of {ORDERS}")
            try:
                digest = s.layout.digest()
            except (_native.load().PlannerError, ValueError, TypeError, OverflowError) as exc:
                raise ValueError(f"goddp: rank {r} proposed a layout no DDP module could have: {exc}") from exc
            if digest != s.digest:
                raise ValueError(
                    f"goddp: rank {r} gave layout digest {s.digest:016x} for a layout whose digest is {digest:016x}"
                )

    def _lost(self) -> list[tuple[int, str]]:
        return [(r, s.lost) for r, s in zip(self.ranks, self.said) if s.lost is not None]

    @staticmethod
    def _raise_lost(lost: list[tuple[int, str]]) -> None:
        if lost:
            raise PeerFailedError(
                "goddp: DDP's reducer could not be rebuilt on "
                + ", ".join(f"rank {r} ({why})" for r, why in lost)
                + "; every rank stops rather than train without gradient allreduces"
            )

    def _differences(self) -> list[str]:
        """Per rank whose layout digest differs from the lowest rank's with a
        layout, what differs."""
        proposed = [(r, s) for r, s in zip(self.ranks, self.said) if s.layout is not None]
        if not proposed:
            return []
        (first_rank, first), out = proposed[0], []
        for r, s in proposed[1:]:
            if s.digest != first.digest:
                me, them = f"rank {r}", f"rank {first_rank}"
                out.append(layout_difference(s.layout, first.layout, self.name_of, me, them)
                           or f"the layout digests of {me} and {them} differ")
        return out

    def _same_digest(self) -> bool:
        """Every rank gave a digest, and the same one."""
        return all(s.digest is not None and s.digest == self.said[0].digest for s in self.said)

    def _listing(self) -> str:
        """What every rank said, in rank order."""
        return "; ".join(f"rank {r}: {describe(s)}" for r, s in zip(self.ranks, self.said))

    def _verdict(self, action: str, layout_at: int | None, reason: str | None, disagreed: bool) -> Decision:
        """The decision and its record; layout_at indexes the statements in
        rank order (None: no layout)."""
        chosen = None if layout_at is None else self.said[layout_at]
        record = {
            "aligned": action == INSTALL,
            "action": action,
            "caps": None if chosen is None else _caps(chosen.layout),
            "layout_digest": None if chosen is None else _hex(chosen.digest),
            "reason": reason,
            "ranks": [
                {
                    "rank": r,
                    "fingerprint": _hex(s.fingerprint),
                    "pieces": s.pieces,
                    "layout_digest": _hex(s.digest),
                    "caps": _caps(s.layout),
                    "reason": s.reason,
                    "later": s.later,
                }
                for r, s in zip(self.ranks, self.said)
            ],
        }
        statements = dict(zip(self.ranks, self.said))
        decision = Decision(action, None if chosen is None else chosen.layout, reason, disagreed, statements, record)
        if self.group is None:
            return decision
        return dataclasses.replace(decision, log=outcome_line(decision, self.group))


def decide(
    statements: Mapping[int, Statement],
    name_of: Callable[[int], str] = str,
    may_defer: bool = True,
    unsettled: Mapping[str, Any] | None = None,
    group: Group | None = None,
) -> Decision:
    """The group's decision from every rank's statement (Note [The
    agreement verdict]), naming parameters by name_of(DDP position).

    Raises PeerFailedError when a rank lost its reducer, and
    PlanMismatchError when the ranks' layouts differ and some rank runs with
    strict=True. Otherwise DDP's buckets follow the layout if and only if
    every rank proposes the very same one (equal digests); the decision
    waits for the next training call when some rank will propose later
    (may_defer: not where that call has come). unsettled (a
    RanksMissingError's): the round was given up, and statements are the
    ones this rank saw; KEEP on every rank (Note [A round given up]).
    group: the round's group, for the decision's log line.
    """
    round_ = Round(statements, name_of, group)
    if unsettled is None:
        return round_.propose(may_defer)
    return round_.given_up(unsettled["stopped_by"], unsettled["missing"])


def confirm_install(
    decision: Decision, installed: Mapping[int, Mapping[str, Any]], group: Group | None = None
) -> Decision:
    """The install round after an INSTALL decision: installed holds what
    each rank said ({"failed": why or None, "lost": why or None}). Raises
    PeerFailedError when a rank lost its reducer; KEEP on every rank when
    some rank failed to install; else the decision stands."""
    return Round(decision.statements, str, group).confirm(installed)


def describe(s: Statement) -> str:
    """One rank's statement in words."""
    plan = "planning failed" if s.fingerprint is None else f"plan {s.fingerprint:016x}, {s.pieces} pieces"
    if s.lost is not None:
        return f"{plan}; lost DDP's reducer: {s.lost}"
    if s.layout is not None:
        return f"{plan}; proposes DDP buckets {list(s.layout.caps)} bytes (layout {s.digest or 0:016x})"
    if s.later:
        return f"{plan}; will propose at the next training call"
    return f"{plan}; keeps DDP's buckets: {s.reason}"


def outcome_line(verdict: Decision, group: Group) -> tuple[int, str]:
    """The line every rank logs once a round has decided
    (Note [The agreement's lines])."""
    where = f"{len(group.ranks)} rank(s) of process group {group.name!r}"
    if verdict.action == INSTALL:
        caps = verdict.record["caps"]
        buckets = len(verdict.layout.buckets) if verdict.layout is not None else len(caps)
        if verdict.layout is not None and verdict.layout.shares_caps:
            # A group's open bucket closes no piece boundary (docs/limits.md).
            return logging.INFO, (
                f"goddp: DDP's {buckets} buckets of several dtype groups now follow the pieces on all {where} "
                f"(per-bucket caps {caps} bytes)"
            )
        return logging.INFO, (
            f"goddp: DDP's {buckets} buckets now close at piece boundaries on all {where} (per-bucket caps {caps} bytes)"
        )
    if verdict.action == LATER:
        return logging.INFO, f"goddp: the {where} decide DDP's buckets at the module's next training call"
    if verdict.disagreed:
        return logging.WARNING, (
            f"goddp: DDP keeps its own buckets on all {where}: {verdict.reason}. Gradients stay exact; "
            "only the overlap of allreduces with backward is smaller."
        )
    return logging.INFO, f"goddp: DDP keeps its own buckets on all {where}: {verdict.reason}"


def layout_difference(a: Layout, b: Layout, name_of: Callable[[int], str], me: str, them: str) -> str | None:
    """What first differs between layout a (called me) and b (them), in
    words, naming parameters by name_of(position); None when they are equal.
    The words are the ones goddp's users read in its WARNING and errors
    (tests/python/ranks/goldens/agree_wording.golden)."""
    if a.build != b.build:
        return f"{me} was made by {a.build!r}, {them} by {b.build!r}"
    if a.order != b.order:
        return f"{me} has bucket order {a.order!r}, {them} {b.order!r}"
    for k in range(max(len(a.buckets), len(b.buckets))):
        mine = a.buckets[k] if k < len(a.buckets) else ()
        theirs = b.buckets[k] if k < len(b.buckets) else ()
        if mine == theirs:
            continue
        if not mine or not theirs:
            fewer, more = (me, them) if not mine else (them, me)
            return f"{more} has a bucket {k}, {fewer} has {k} buckets"
        only_mine = [p for p in mine if p not in theirs]
        only_theirs = [p for p in theirs if p not in mine]
        if not only_mine and not only_theirs:
            return f"bucket {k}: {me} orders its parameters {_names(mine, name_of)}, {them} {_names(theirs, name_of)}"
        return f"bucket {k}: {me} holds {_names_or(only_mine, name_of)} where {them} holds {_names_or(only_theirs, name_of)}"
    if a.caps != b.caps:
        return f"{me} gives DDP caps {list(a.caps)} bytes, {them} {list(b.caps)}"
    return None


def _names(positions: Sequence[int], name_of: Callable[[int], str], shown: int = 3) -> str:
    """Up to three parameters by name, then how many more."""
    names = ", ".join(name_of(p) for p in positions[:shown])
    more = len(positions) - shown
    return f"[{names}{f' and {more} more' if more > 0 else ''}]"


def _names_or(positions: Sequence[int], name_of: Callable[[int], str]) -> str:
    return _names(positions, name_of) if positions else "nothing else"
