"""The ranks of a DDP module's process group, as goddp's agreements see them.

One group type (``Group``, made by ``group_of``), one timeout parser
(``timeout_s``), the store every agreement goes through (``store_for``),
and one way to say why a round did not settle (``round_error``, Note
[Rounds that did not settle]).
Two agreements use them: the plan check at a DDP module's first training
call (goddp.ranks.agreement) and goddp.trace (entering and leaving).
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist

# Used when the process group's timeout cannot be read: torch's own default.
FALLBACK_TIMEOUT_S = 1800.0


@dataclasses.dataclass(frozen=True)
class Group:
    """A process group as an agreement sees it."""

    name: str  # the same on every member; differs between groups over the same ranks
    ranks: tuple[int, ...]  # global ranks
    rank: int  # this process's global rank
    timeout_s: float


def group_of(ddp: Any, timeout_s: float | Callable[[Any], float]) -> Group:
    """The group of ddp's process group; timeout_s: seconds, or a function of
    the process group that gives them."""
    process_group = ddp.process_group
    ranks = tuple(dist.get_process_group_ranks(process_group))
    name = getattr(process_group, "group_name", None) or "-".join(map(str, ranks))
    timeout = timeout_s(process_group) if callable(timeout_s) else float(timeout_s)
    return Group(name=str(name), ranks=ranks, rank=dist.get_rank(), timeout_s=timeout)


def store_for(group: Group) -> Any:
    """The c10d store the ranks agree through, None for a group of one rank.

    Note [The store, not the process group]: a rank that never arrives must
    cost the others a bounded wait, not a collective that hangs or pairs
    with one of DDP's own allreduces. Every agreement across ranks waits
    through the store for that reason."""
    if len(group.ranks) <= 1:
        return None
    from torch.distributed.distributed_c10d import _get_default_store  # c10d's private accessor; only with several ranks

    return _get_default_store()


# --------------------------------------------------------------------------
# Timeouts


def env_seconds(name: str) -> float | None:
    """The positive number of seconds environment variable `name` holds,
    or None when it is unset or holds something else (warned)."""
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value > 0 and math.isfinite(value):
        return value
    warnings.warn(f"goddp: ignoring {name}={raw!r} (not a positive, finite number of seconds)")
    return None


def timeout_s(env: str, default: float | Callable[[], float], given: float | None = None, what: str = "goddp") -> float:
    """The one timeout rule: `given` when not None (positive, else
    ValueError naming `what`), else environment variable `env`, else
    `default` (a number, or a function called only when needed)."""
    if given is not None:
        if not given > 0 or not math.isfinite(given):
            raise ValueError(f"{what}: timeout must be positive seconds (and finite), got {given!r}")
        return float(given)
    from_env = env_seconds(env)
    if from_env is not None:
        return from_env
    return float(default() if callable(default) else default)


def process_group_timeout_s(process_group: Any) -> float:
    """The process group's own timeout, as generous as any collective on it."""
    if process_group is not None:
        for device in ("cpu", "cuda"):
            try:
                return float(process_group._get_backend(torch.device(device)).options._timeout.total_seconds())
            except (AttributeError, RuntimeError):  # no backend for that device, or one without options
                continue
    return FALLBACK_TIMEOUT_S


# --------------------------------------------------------------------------
# Rounds that did not settle

# Note [Rounds that did not settle]
#
# Two agreements meet in rounds of goddp.ranks.store_round: the plan check
# at a DDP module's first training call (and its install round) and
# goddp.trace (entering and leaving). A round that does not end in "go"
# becomes one error text, decided here from the round's facts: either this
# rank waited for ranks that never arrived, or it came after the others
# had given up on it (then it stops too, or, where the meeting lets the
# ranks keep DDP's own buckets, Note [A round given up], it keeps them),
# or, for the trace, some rank refused. Each meeting names where the ranks
# were to meet and the rule every rank must follow; the callers only raise
# or log the text.

# Where the ranks of a round were to meet: the plan check's rounds (the
# first step, the install, bucket_cap_mb="auto"'s decision), goddp.trace's two.
PLAN_CHECK_EVENTS = {
    "first step": "the first training step",
    "install": "installing DDP's new buckets",
    "auto": "the bucket_cap_mb='auto' decision",
}
TRACE_EVENTS = {"enter": "entering the trace", "leave": "leaving the trace"}


@dataclasses.dataclass(frozen=True)
class _Meeting:
    """A meeting's words: who speaks, where the ranks were to meet, the rule
    every rank follows, and what a rank that came late does."""

    who: str
    event: str
    rule: str
    late: str = "it stops too rather than go on alone"


def _meeting(meeting: str, group: Group, keeps: bool, timeout_env: str) -> _Meeting:
    if keeps and meeting not in ("first step", "auto"):
        raise ValueError(f"goddp: round_error: only the first-step and auto rounds keep the buckets, not {meeting!r}")
    if meeting in TRACE_EVENTS:
        return _Meeting("goddp.trace", TRACE_EVENTS[meeting], f"Every rank must {meeting} it at the same step")
    if meeting not in PLAN_CHECK_EVENTS:
        raise ValueError(f"goddp: round_error: meeting {meeting!r}; want one of {[*PLAN_CHECK_EVENTS, *TRACE_EVENTS]}")
    if not timeout_env:
        raise ValueError(f"goddp: round_error: the {meeting} round needs the name of its timeout's variable")
    if keeps and meeting == "auto":  # Note [Buckets chosen by cost] in goddp.ranks.auto
        rule = (
            "Every rank keeps the buckets it started with and trains on; "
            f"{timeout_env}=<seconds> sets how long the ranks wait for each other here."
        )
        return _Meeting("goddp", PLAN_CHECK_EVENTS[meeting], rule, "it keeps its starting buckets, as they do")
    if keeps:  # Note [A round given up]
        rule = (
            "Every rank keeps DDP's own buckets and trains on (Note [A round given up] in goddp.ranks.verdict); "
            f"{timeout_env}=<seconds> sets how long the ranks wait for each other here."
        )
        return _Meeting("goddp", PLAN_CHECK_EVENTS[meeting], rule, "it keeps DDP's own buckets, as they do")
    rule = (
        f"Every rank of a DDP module must run its first training step within {group.timeout_s:.0f} s of the first; "
        "a rank that crashed, or one still compiling then, stops here (raise the limit with "
        f"{timeout_env}=<seconds> or the process group's timeout)."
    )
    return _Meeting("goddp", PLAN_CHECK_EVENTS[meeting], rule)


def round_error(meeting: str, group: Group, ended: Any, keeps: bool = False, timeout_env: str = "") -> str | None:
    """The error text of a round (goddp.ranks.store_round.Ended `ended`) of
    `meeting` that did not end in "go", None when it did (Note [Rounds that
    did not settle]). meeting: "first step", "install" or "auto" (the plan check),
    "enter" or "leave" (goddp.trace); keeps: the ranks keep DDP's buckets
    rather than stop; timeout_env: the plan check's variable for its wait.
    ValueError for a meeting, or an ending, no caller has."""
    words = _meeting(meeting, group, keeps, timeout_env)
    where = f"a DDP module (process group {group.name!r}, ranks {list(group.ranks)})"
    if ended.gave_up and ended.complete:
        return (
            f"{words.who}: rank {group.rank} reached {words.event} of {where} after the others had stopped waiting "
            f"for it (gave up: rank {ended.stopped_by}), {group.timeout_s:g} s after the first arrival; {words.late}. "
            f"{words.rule}"
        )
    if ended.gave_up:
        missing = [r for r in group.ranks if r not in ended.statements]
        return (
            f"{words.who}: rank {group.rank} waited {ended.waited_s:.0f} s at {words.event} of {where} for rank(s) "
            f"{missing}, which never arrived. {words.rule}"
        )
    if ended.decision == "go":
        return None
    if meeting not in TRACE_EVENTS:
        raise ValueError(f"goddp: round_error: the {meeting} round ended in {ended.decision!r}, which only a round given up may")
    reasons = "; ".join(f"rank {r}: {v}" for r, v in sorted(ended.statements.items()) if v != "ok")
    return f"goddp.trace: cannot {meeting} the trace ({reasons})"
