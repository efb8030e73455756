"""Reading the active DistributedDataParallel module's real settings.

Only facts are read here; what caps and bucket order they make is the
planner's decision (planner/settings.go, Note [Cap defaults]). Caps the
planner would refuse are refused here, at compile time (check_caps).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from goddp.ddp import private
from goddp.ddp.align import users_bucket_config
from goddp.ddp.state import module_type_name, state_of
from goddp.graph.export import parameter_names
from goddp.native.plan import AlignmentFacts, DDPRequest
from goddp.options import CAP_MB_RANGE, valid_cap_bytes


@dataclass(frozen=True)
class DDPSettings:
    """What goddp needs from a DDP module: its bucket settings as the user
    made them and its flags, as the planner reads them (own;
    first_bucket_cap_bytes None where this torch keeps none), the
    parameters it ignores and how it names parameters."""

    own: DDPRequest
    ignored_names: frozenset[str]
    param_name_of: Callable[[torch.Tensor], str | None]

    def request(self, num_params: int = 0, facts: AlignmentFacts | None = None) -> DDPRequest:
        """These settings for the planner (goddp_ddp); num_params: how many
        parameters DDP reduces, and facts, what may refuse alignment
        (goddp.ddp.refusals), when goddp asks to align its buckets."""
        return dataclasses.replace(self.own, num_params=num_params, facts=facts or AlignmentFacts())


def read_ddp_settings(ddp: Any) -> DDPSettings:
    names = parameter_names(getattr(ddp, "module", ddp))
    ignored = frozenset(getattr(ddp, "parameters_to_ignore", ()) or ())
    config = users_bucket_config(ddp)
    own = DDPRequest(
        bucket_cap_bytes=int(ddp.bucket_bytes_cap),
        first_bucket_cap_bytes=private.first_bucket_cap(config),
        bucket_caps_bytes=private.per_bucket_caps(ddp, config),
        cap_is_default=private.cap_is_default(ddp),
        find_unused_parameters=bool(getattr(ddp, "find_unused_parameters", False)),
        static_graph=bool(getattr(ddp, "static_graph", False)),
    )
    check_caps(own)
    return DDPSettings(own, ignored, lambda p: names.get(id(p)))


def check_caps(own: DDPRequest) -> None:
    """ValueError for a DDP cap the planner takes no plan with (fewer than
    1 or more than 2**63 - 1 bytes, planner/settings.go): DDP itself takes
    a bucket_cap_mb, or bucket_cap_mb_list entry, that makes 0 bytes. Said
    when goddp first compiles inside the module, as goddp.options says it
    of the user's caps, never as a fallback at planning."""
    caps = [("bucket cap (bucket_bytes_cap)", own.bucket_cap_bytes)]
    if own.first_bucket_cap_bytes is not None:
        caps.append(("first-bucket cap", own.first_bucket_cap_bytes))
    caps += [(f"per-bucket cap {i} (from bucket_cap_mb_list)", c) for i, c in enumerate(own.bucket_caps_bytes)]
    for what, nbytes in caps:
        if not valid_cap_bytes(nbytes):
            raise ValueError(
                f"goddp cannot plan inside this DDP module: its {what} is {nbytes} bytes, and goddp's planner "
                f"takes caps of 1 to 2**63 - 1 bytes; DDP's bucket_cap_mb (and each bucket_cap_mb_list entry) must "
                f"be {CAP_MB_RANGE}"
            )


def settings_of(ddp: Any) -> DDPSettings:
    """ddp's settings, read at goddp's first graph inside it and kept in its
    state (Note [One object per DDP module] in goddp.ddp.state)."""
    state = state_of(ddp)
    if state.settings is None:
        state.settings = read_ddp_settings(ddp)
    return state.settings


def module_of(ddp: Any) -> dict[str, Any]:
    """The plan record's "ddp_module": key, type and process_group."""
    process_group = getattr(ddp, "process_group", None)
    return {
        "key": state_of(ddp).module_key(ddp),
        "type": module_type_name(ddp),
        "process_group": None if process_group is None else str(getattr(process_group, "group_name", "") or ""),
    }
