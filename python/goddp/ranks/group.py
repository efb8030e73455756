"""The ranks of a DDP module's process group, as goddp's agreements see them.

One group type (``Group``, made by ``group_of``), one timeout parser
(``timeout_s``), the store every agreement goes through (``store_for``),
and one way to say why a round did not settle (``round_error``, the
planner's words).
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

from goddp.native import extension as _native

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
            except Exception:  # no backend for that device, or a backend without options
                continue
    return FALLBACK_TIMEOUT_S


# --------------------------------------------------------------------------
# Rounds that did not settle


def round_error(meeting: str, group: Group, ended: Any, keeps: bool = False, timeout_env: str = "") -> str | None:
    """The error text of a round (goddp.ranks.store_round.Round `ended`) of
    `meeting` that did not end in "go", None when it did: the planner's
    (Note [Rounds that did not settle] in planner/rounds.go). meeting:
    "first step" or "install" (the plan check), "enter" or "leave"
    (goddp.trace); keeps: the ranks keep DDP's buckets rather than stop;
    timeout_env: the plan check's variable for its wait. Never raises: a
    planner that cannot word it (a forked child, say) gets a plain line, so
    that the caller still raises its own error or keeps DDP's buckets."""
    try:
        return _round_error(meeting, group, ended, keeps, timeout_env)
    except Exception as exc:
        if not ended.gave_up and ended.outcome == "go":
            return None
        said = "; ".join(f"rank {r}: {v}" for r, v in sorted(ended.statements.items()) if v != "ok")
        return (
            f"goddp: rank {group.rank}: the round ({meeting}) of process group {group.name!r} ended "
            f"{ended.outcome!r}, not 'go'{f' ({said})' if said else ''}; the planner could not word it "
            f"({type(exc).__name__}: {exc}){f'; {timeout_env} sets the wait' if timeout_env else ''}"
        )


def _round_error(meeting: str, group: Group, ended: Any, keeps: bool, timeout_env: str) -> str | None:
    return _native.round_error({
        "meeting": meeting,
        "keeps": keeps,
        "timeout_env": timeout_env,
        "group": {"name": group.name, "ranks": list(group.ranks), "rank": group.rank, "timeout_s": group.timeout_s},
        "round": {
            "outcome": ended.outcome,
            "gave_up": ended.gave_up,
            "complete": ended.complete,
            "waited_s": ended.waited_s,
            "statements": dict(ended.statements),
        },
    })
