"""What the ranks of a DDP module say to each other, and what they decide.

Every rank of a DDP module's process group publishes one ``Statement``: the
layout it proposes for DDP's buckets (goddp.ranks.layout) with its digest, or
why it proposes none, or that it will propose later. ``exchange`` passes
the statements through the default c10d store; ``decide`` turns them into
one ``Decision``. ``decide`` is a pure function of all statements, and
every rank reads the same statements, so every rank reaches the same
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

from goddp.ranks.group import Group, missing_ranks_message, process_group_timeout_s
from goddp.ranks.group import timeout_s as group_timeout_s
from goddp.ranks.layout import Layout
from goddp.ranks.store_round import settle

TIMEOUT_ENV = "GODDP_PLAN_CHECK_TIMEOUT"

# Decision.action
INSTALL = "install"
KEEP = "keep"
LATER = "later"


class PlanMismatchError(RuntimeError):
    """Ranks of one DDP module proposed different layouts for DDP's buckets
    and some rank runs with strict=True."""


class RanksMissingError(RuntimeError):
    """Some ranks of a DDP module's group never reached the agreement."""


class PeerFailedError(RuntimeError):
    """Another rank of the group cannot train on (its DDP reducer is lost)."""


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

    def to_json(self) -> str:
        fields = {
            "layout": None if self.layout is None else self.layout.to_dict(),
            "digest": None if self.digest is None else f"{self.digest:016x}",
            "reason": self.reason,
            "later": self.later,
            "strict": self.strict,
            "lost": self.lost,
            "fingerprint": None if self.fingerprint is None else f"{self.fingerprint:016x}",
            "pieces": self.pieces,
        }
        return json.dumps(fields, sort_keys=True)

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

    def describe(self) -> str:
        plan = "planning failed" if self.fingerprint is None else f"plan {self.fingerprint:016x}, {self.pieces} pieces"
        if self.lost is not None:
            return f"{plan}; lost DDP's reducer: {self.lost}"
        if self.layout is not None:
            return f"{plan}; proposes DDP buckets {list(self.layout.caps)} bytes (layout {self.digest or 0:016x})"
        if self.later:
            return f"{plan}; will propose at the next training call"
        return f"{plan}; keeps DDP's buckets: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank of the group does.

    action: INSTALL (the layout, on every rank), KEEP (DDP's own buckets,
        on every rank) or LATER (decide at the module's next training call).
    layout: the layout to install (INSTALL only).
    reason: why not INSTALL (naming what each rank said when they differ).
    disagreed: the ranks said different things, which is worth a WARNING.
    statements: what each rank (global rank numbers) said.
    """

    action: str
    layout: Layout | None
    reason: str | None
    disagreed: bool
    statements: Mapping[int, Statement]

    @property
    def caps(self) -> tuple[int, ...] | None:
        return None if self.layout is None else self.layout.caps

    def summary(self) -> dict[str, Any]:
        """The plan record's view of the decision (JSON-serialisable)."""
        digest = next((s.digest for s in self.statements.values() if s.layout == self.layout), None)
        return {
            "aligned": self.action == INSTALL,
            "action": self.action,
            "caps": None if self.caps is None else list(self.caps),
            "layout_digest": None if self.layout is None or digest is None else f"{digest:016x}",
            "reason": self.reason,
            "ranks": [
                {
                    "rank": r,
                    "fingerprint": None if s.fingerprint is None else f"{s.fingerprint:016x}",
                    "pieces": s.pieces,
                    "layout_digest": None if s.digest is None else f"{s.digest:016x}",
                    "caps": None if s.caps is None else list(s.caps),
                    "reason": s.reason,
                    "later": s.later,
                }
                for r, s in sorted(self.statements.items())
            ],
        }


def _listing(statements: Mapping[int, Statement]) -> str:
    return "; ".join(f"rank {r}: {s.describe()}" for r, s in sorted(statements.items()))


def layout_differences(statements: Mapping[int, Statement], name_of: Callable[[int], str]) -> list[str]:
    """Per rank whose layout differs from the lowest rank's with a layout,
    what differs ("bucket 0: rank 1 holds [...] where rank 0 holds [...]")."""
    proposed = sorted((r, s) for r, s in statements.items() if s.layout is not None)
    if not proposed:
        return []
    first_rank, first = proposed[0]
    out = []
    for r, s in proposed[1:]:
        if s.digest != first.digest:
            what = s.layout.difference(first.layout, name_of, f"rank {r}", f"rank {first_rank}")
            out.append(what or f"the layout digests of rank {r} and rank {first_rank} differ")
    return out


def decide(
    statements: Mapping[int, Statement],
    name_of: Callable[[int], str] = str,
    may_defer: bool = True,
) -> Decision:
    """The group's decision from every rank's statement (see module doc).

    Raises PeerFailedError when a rank lost its reducer, and
    PlanMismatchError when the ranks' layouts differ and some rank runs with
    strict=True. Otherwise DDP's buckets follow the layout if and only if
    every rank proposes the very same one (equal digests); the decision
    waits for the next training call when some rank will propose later
    (may_defer: not where that call has come).
    """
    lost = {r: s.lost for r, s in statements.items() if s.lost is not None}
    if lost:
        raise PeerFailedError(
            "goddp: DDP's reducer could not be rebuilt on "
            + ", ".join(f"rank {r} ({why})" for r, why in sorted(lost.items()))
            + "; every rank stops rather than train without gradient allreduces"
        )
    differences = layout_differences(statements, name_of)
    if differences and any(s.strict for s in statements.values()):
        raise PlanMismatchError(
            "goddp: the ranks of this DDP module proposed different layouts for DDP's buckets "
            f"({'; '.join(differences)}): {_listing(statements)}. strict=True makes this an error; "
            "without it every rank keeps DDP's own buckets and trains on."
        )
    if may_defer and any(s.later for s in statements.values()):
        return Decision(LATER, None, "some rank will propose its layout at the next training call", False, dict(statements))
    digests = {s.digest for s in statements.values()}
    if len(digests) == 1 and None not in digests:
        layout = next(iter(statements.values())).layout
        return Decision(INSTALL, layout, None, False, dict(statements))
    said = {(s.digest, s.reason, s.later, s.fingerprint is None) for s in statements.values()}
    if differences:
        reason = f"the ranks' layouts differ: {'; '.join(differences)}"
    elif len(said) == 1:
        reason = next(iter(statements.values())).reason
    else:
        reason = f"the ranks did not all propose the same layout: {_listing(statements)}"
    return Decision(KEEP, None, reason, len(said) > 1, dict(statements))


# --------------------------------------------------------------------------
# The exchange


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
    event: str = "the first training step",
    waiting_for: str = "reach the first training step (they may still be compiling)",
) -> dict[int, str]:
    """Publishes payload under key for this rank and returns every rank's
    payload of the same round (see module doc). Waits at most
    group.timeout_s for the others, then raises RanksMissingError naming
    the ranks that did not come; a rank that comes after the others gave
    up on it raises it too."""
    arrival = int(store.add(f"{key}/arrivals", 1))
    base = f"{key}/{(arrival - 1) // len(group.ranks)}"
    ended = settle(store, base, group, payload, lambda _: "go", waiting_for)
    if not ended.gave_up:
        return dict(ended.statements)
    raise RanksMissingError(
        missing_ranks_message(
            "goddp",
            group,
            event,
            ended,
            f"Every rank of a DDP module must run its first training step within {group.timeout_s:.0f} s of the "
            f"first; a rank that crashed, or one still compiling then, stops here (raise the limit with "
            f"{TIMEOUT_ENV}=<seconds> or the process group's timeout).",
        )
    )


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
    agree across the group)."""
    text = ";".join(f"{'x'.join(map(str, shape))}:{dtype}" for shape, dtype in shapes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
