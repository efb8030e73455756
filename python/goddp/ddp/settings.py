"""Reading the active DistributedDataParallel module's real settings."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from goddp.graph.export import parameter_names
from goddp.options import Options
from goddp.native.plan import MIB, PlanSettings, default_first_bucket_cap, resolve_caps

logger = logging.getLogger("goddp")


def active_ddp_module() -> nn.Module | None:
    """The DDP module whose forward is running (Dynamo compiles inside it),
    or None outside any DDP forward."""
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    getter = getattr(DistributedDataParallel, "_get_active_ddp_module", None)
    return getter() if getter is not None else None


@dataclass(frozen=True)
class DDPSettings:
    """What goddp needs from a DDP module."""

    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    bucket_caps_bytes: tuple[int, ...]
    ignored_names: frozenset[str]
    find_unused_parameters: bool
    static_graph: bool
    param_name_of: Callable[[torch.Tensor], str | None]


def _bucket_config(ddp: Any) -> Any:
    """DDP's bucket settings as the user made them: goddp's own per-bucket
    caps (docs/align.md) replace them on the module, but plans keep following
    the user's, so that recompiling a frame plans the same cuts."""
    from goddp.ddp.align import ORIGINAL_CONFIG_ATTR

    return getattr(ddp, ORIGINAL_CONFIG_ATTR, None) or getattr(ddp, "_bucket_config", None)


def _first_bucket_cap(ddp: Any, cap: int) -> int:
    config = _bucket_config(ddp)
    first = getattr(config, "first_bucket_bytes_cap", None)
    if first is not None:
        return int(first)
    # Older torch keeps no first cap: DDP's rule from the cap applies.
    return default_first_bucket_cap("ddp", cap, cap_is_default=bool(getattr(ddp, "bucket_bytes_cap_default", False)))


def _per_bucket_caps(ddp: Any) -> tuple[int, ...]:
    config = _bucket_config(ddp)
    caps = getattr(config, "per_bucket_bytes_caps", None)
    if caps is None:
        caps = getattr(ddp, "bucket_bytes_cap_list", None)
    return tuple(int(c) for c in caps or ())


def read_ddp_settings(ddp: Any) -> DDPSettings:
    cap = int(ddp.bucket_bytes_cap)
    names = parameter_names(getattr(ddp, "module", ddp))
    ignored = frozenset(getattr(ddp, "parameters_to_ignore", ()) or ())
    return DDPSettings(
        bucket_cap_bytes=cap,
        first_bucket_cap_bytes=_first_bucket_cap(ddp, cap),
        bucket_caps_bytes=_per_bucket_caps(ddp),
        ignored_names=ignored,
        find_unused_parameters=bool(getattr(ddp, "find_unused_parameters", False)),
        static_graph=bool(getattr(ddp, "static_graph", False)),
        param_name_of=lambda p: names.get(id(p)),
    )


def caps_for(settings: DDPSettings, options: Options) -> PlanSettings:
    """The caps to plan with: the DDP module's, unless options override
    (defaults: goddp.native.plan.resolve_caps).

    ddp mode follows DDP itself (its first-bucket cap and per-bucket caps);
    an overridden bucket_cap_mb drops DDP's per-bucket caps and clamps its
    first cap. torch mode follows DDPOptimizer: DDP's bucket_bytes_cap and a
    1 MiB first bucket (at most the cap), unless first_bucket_cap_mb is given.
    """
    overridden = options.bucket_cap_mb is not None
    return resolve_caps(
        options.mode,
        int(options.bucket_cap_mb * MIB) if overridden else settings.bucket_cap_bytes,
        None if options.first_bucket_cap_mb is None else int(options.first_bucket_cap_mb * MIB),
        () if (overridden or options.mode == "torch") else settings.bucket_caps_bytes,
        options.max_pieces,
        ddp_first_bucket_cap_bytes=settings.first_bucket_cap_bytes,
    )


_noted_modules: "weakref.WeakSet[Any]" = weakref.WeakSet()
_noted_messages: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def note_once(ddp: Any, message: str) -> None:
    """Logs message at INFO once per DDP module."""
    try:
        seen = _noted_messages.setdefault(ddp, set())
    except TypeError:
        seen = set()
    if message not in seen:
        seen.add(message)
        logger.info("%s", message)


def note_ddp_settings(ddp: Any, settings: DDPSettings, options: Options) -> None:
    """Logs, once per DDP module, facts that affect how well cuts match."""
    try:
        if ddp in _noted_modules:
            return
        _noted_modules.add(ddp)
    except TypeError:
        pass
    if settings.find_unused_parameters and not settings.static_graph and options.mode == "ddp" and not options.aligns_buckets:
        logger.info(
            "goddp: this DDP module has find_unused_parameters=True and static_graph=False, so DDP "
            "never rebuilds its buckets: they stay in parameter declaration order while goddp's "
            "cuts follow gradient-ready order, and align_buckets is off. Cuts still overlap "
            "communication, but buckets may not close exactly at them."
        )
