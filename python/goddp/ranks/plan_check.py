"""What the ranks of a DDP module say to each other, and what they decide.

Every rank of a DDP module's process group publishes one ``Statement``: the
fingerprint of the plan it runs, and the per-bucket caps it proposes for
DDP's buckets (or why it proposes none). ``exchange`` passes the statements
through the default c10d store; ``decide`` turns them into one ``Decision``.
``decide`` is a pure function of all statements, and every rank reads the
same statements, so every rank reaches the same decision or raises the same
error: there is no second round.

When the exchange happens, and what a decision changes, is
goddp.ranks.agreement's business; README.md ("Several ranks") explains both.

Store keys, all under ``goddp/agree/<group name>/<model key>/``:
- ``arrivals``: a counter (``store.add``). The n-th arrival belongs to round
  ``(n - 1) // group size``, so two runs that share a long-lived store, or
  two DDP modules of the same shapes in one run, never read each other's
  statements. It stays when a round ends: the next round counts on it.
- ``<round>/...``: the round's statements, outcome and read count
  (goddp.ranks.store_round says how a round settles).

Environment: GODDP_PLAN_CHECK_TIMEOUT, seconds to wait for the other ranks
(default: the DDP process group's own timeout, 30 minutes unless
``init_process_group(timeout=...)`` says otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping, Sequence

from goddp.ranks.group import Group, missing_ranks_message, process_group_timeout_s
from goddp.ranks.group import timeout_s as group_timeout_s
from goddp.ranks.store_round import settle

TIMEOUT_ENV = "GODDP_PLAN_CHECK_TIMEOUT"


class PlanMismatchError(RuntimeError):
    """Ranks of one DDP module planned the same graph differently."""


class RanksMissingError(RuntimeError):
    """Some ranks of a DDP module's group never reached the agreement."""


class PeerFailedError(RuntimeError):
    """Another rank of the group cannot train on (its DDP reducer is lost)."""


@dataclasses.dataclass(frozen=True)
class Statement:
    """What one rank says about the graph it runs first for a DDP module.

    fingerprint: the plan's fingerprint; None when planning failed.
    pieces: how many pieces the plan has.
    caps: the per-bucket caps (bytes, DDP order) this rank proposes for
        DDP's buckets; None when it proposes to leave them alone.
    reason: why caps is None.
    check: this rank asks that differing plans be an error (check_plans).
    lost: why this rank cannot go on (its reducer could not be rebuilt).
    """

    fingerprint: int | None
    pieces: int
    caps: tuple[int, ...] | None
    reason: str | None = None
    check: bool = True
    lost: str | None = None

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)
        fields["fingerprint"] = None if self.fingerprint is None else f"{self.fingerprint:016x}"
        fields["caps"] = None if self.caps is None else list(self.caps)
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Statement":
        fields = json.loads(text)
        fingerprint = fields.get("fingerprint")
        caps = fields.get("caps")
        return cls(
            fingerprint=None if fingerprint is None else int(fingerprint, 16),
            pieces=int(fields.get("pieces", 1)),
            caps=None if caps is None else tuple(int(c) for c in caps),
            reason=fields.get("reason"),
            check=bool(fields.get("check", True)),
            lost=fields.get("lost"),
        )

    def describe(self) -> str:
        plan = "planning failed" if self.fingerprint is None else f"plan {self.fingerprint:016x}, {self.pieces} pieces"
        if self.lost is not None:
            return f"{plan}; lost DDP's reducer: {self.lost}"
        if self.caps is not None:
            return f"{plan}; proposes DDP buckets {list(self.caps)} bytes"
        return f"{plan}; keeps DDP's buckets: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What every rank of the group does.

    caps: DDP's per-bucket caps on every rank; None: every rank keeps DDP's
        own buckets.
    reason: why caps is None (naming what each rank said when they differ).
    disagreed: the ranks said different things, which is worth a WARNING.
    statements: what each rank (global rank numbers) said.
    """

    caps: tuple[int, ...] | None
    reason: str | None
    disagreed: bool
    statements: Mapping[int, Statement]

    def summary(self) -> dict[str, Any]:
        """The plan record's view of the decision (JSON-serialisable)."""
        return {
            "aligned": self.caps is not None,
            "caps": None if self.caps is None else list(self.caps),
            "reason": self.reason,
            "ranks": [
                {
                    "rank": r,
                    "fingerprint": None if s.fingerprint is None else f"{s.fingerprint:016x}",
                    "pieces": s.pieces,
                    "caps": None if s.caps is None else list(s.caps),
                    "reason": s.reason,
                }
                for r, s in sorted(self.statements.items())
            ],
        }


def _listing(statements: Mapping[int, Statement]) -> str:
    return "; ".join(f"rank {r}: {s.describe()}" for r, s in sorted(statements.items()))


def decide(statements: Mapping[int, Statement]) -> Decision:
    """The group's decision from every rank's statement (see module doc).

    Raises PeerFailedError when a rank lost its reducer, and
    PlanMismatchError when ranks that all planned planned differently and
    any of them asked for the check. Otherwise DDP's buckets follow the
    pieces if and only if every rank proposes the very same caps.
    """
    lost = {r: s.lost for r, s in statements.items() if s.lost is not None}
    if lost:
        raise PeerFailedError(
            "goddp: DDP's reducer could not be rebuilt on "
            + ", ".join(f"rank {r} ({why})" for r, why in sorted(lost.items()))
            + "; every rank stops rather than train without gradient allreduces"
        )
    planned = {s.fingerprint for s in statements.values() if s.fingerprint is not None}
    if len(planned) > 1 and any(s.check for s in statements.values()):
        raise PlanMismatchError(
            "goddp: the ranks of this DDP module planned their first training graph differently "
            f"(fingerprints differ), which must never happen: {_listing(statements)}. Check that all "
            "ranks run the same model, goddp options and DDP bucket settings, and that evaluation "
            "on some ranks runs under torch.no_grad(); please report it as a bug if they do."
        )
    proposals = {s.caps for s in statements.values()}
    if len(proposals) == 1 and None not in proposals:
        (caps,) = proposals
        return Decision(caps, None, False, dict(statements))
    said = {(s.caps, s.reason, s.fingerprint is None) for s in statements.values()}
    if len(said) == 1:
        reason = next(iter(statements.values())).reason
    else:
        reason = f"the ranks did not all propose the same buckets: {_listing(statements)}"
    return Decision(None, reason, len(said) > 1, dict(statements))


# --------------------------------------------------------------------------
# The exchange


def timeout_s(process_group: Any = None) -> float:
    """GODDP_PLAN_CHECK_TIMEOUT, else the process group's own timeout: a
    rank may still be compiling (an evaluation graph, say) while the others
    wait, so the wait is as generous as any collective on that group."""
    return group_timeout_s(TIMEOUT_ENV, lambda: process_group_timeout_s(process_group))


def exchange(store: Any, key: str, group: Group, payload: str) -> dict[int, str]:
    """Publishes payload under key for this rank and returns every rank's
    payload of the same round (see module doc). Waits at most
    group.timeout_s for the others, then raises RanksMissingError naming
    the ranks that did not come; a rank that comes after the others gave
    up on it raises it too."""
    arrival = int(store.add(f"{key}/arrivals", 1))
    base = f"{key}/{(arrival - 1) // len(group.ranks)}"
    ended = settle(
        store, base, group, payload, lambda _: "go", "reach the first training step (they may still be compiling)"
    )
    if not ended.gave_up:
        return dict(ended.statements)
    raise RanksMissingError(
        missing_ranks_message(
            "goddp",
            group,
            "the first training step",
            ended,
            f"Every rank of a DDP module must run its first training step within {group.timeout_s:.0f} s of the "
            f"first; a rank that crashed, or one still compiling then, stops here (raise the limit with "
            f"{TIMEOUT_ENV}=<seconds> or the process group's timeout).",
        )
    )


def model_key(shapes: Sequence[tuple[tuple[int, ...], str]]) -> str:
    """A key every rank of a DDP module derives identically: its parameters'
    shapes and dtypes in DDP order (DDP checks at construction that these
    agree across the group)."""
    text = ";".join(f"{'x'.join(map(str, shape))}:{dtype}" for shape, dtype in shapes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
