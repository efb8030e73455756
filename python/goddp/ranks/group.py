"""The ranks of a DDP module's process group, as goddp's agreements see them.

One group type (``Group``, made by ``group_of``), one timeout parser
(``timeout_s``), the store every agreement goes through (``store_for``),
and one way to say that ranks did not come (``missing_ranks_message``).
Two agreements use them: the plan check at a DDP module's first training
call (goddp.ranks.agreement) and goddp.trace (entering and leaving).
"""

from __future__ import annotations

import dataclasses
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

    def where(self) -> str:
        return f"a DDP module (process group {self.name!r}, ranks {list(self.ranks)})"


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
    if value > 0:
        return value
    warnings.warn(f"goddp: ignoring {name}={raw!r} (not a positive number of seconds)")
    return None


def timeout_s(env: str, default: float | Callable[[], float], given: float | None = None, what: str = "goddp") -> float:
    """The one timeout rule: `given` when not None (positive, else
    ValueError naming `what`), else environment variable `env`, else
    `default` (a number, or a function called only when needed)."""
    if given is not None:
        if given <= 0:
            raise ValueError(f"{what}: timeout must be positive seconds, got {given!r}")
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
# Ranks that did not come


def missing_ranks_message(
    who: str, group: Group, event: str, ended: Any, rule: str, late: str = "it stops too rather than go on alone"
) -> str:
    """What a rank says when a round (goddp.ranks.store_round.Round `ended`)
    was given up: either it waited for ranks that never arrived, or it came
    after the others had given up on it. who: "goddp" or "goddp.trace";
    event: where the ranks were to meet ("the first training step",
    "entering the trace"); rule: the sentence that says what every rank must
    do; late: what a rank that came after the others gave up does."""
    where = group.where()
    if ended.complete:
        return (
            f"{who}: rank {group.rank} reached {event} of {where} after the others had stopped waiting for "
            f"it ({ended.outcome}), {group.timeout_s:g} s after the first arrival; {late}. {rule}"
        )
    return (
        f"{who}: rank {group.rank} waited {ended.waited_s:.0f} s at {event} of {where} for rank(s) "
        f"{ended.missing(group)}, which never arrived. {rule}"
    )
