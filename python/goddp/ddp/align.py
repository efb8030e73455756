"""Make DDP's gradient buckets the pieces that goddp cut (why: docs/align.md).

goddp installs each piece's byte total as DDP's per-bucket caps and rebuilds
DDP's reducer. The rebuild happens at the DDP module's first training call
(see Note [Where the ranks meet] in goddp.ranks.agreement), inside DDP's forward (after DDP's pre-forward, before its post-forward),
never while Dynamo traces with fake tensors, and only if every rank of the
module's process group proposes the very same caps (goddp.ranks.agreement
decides). It only touches DDP modules where that is known to be safe;
goddp.ddp.refusals names the reason otherwise and goddp keeps DDP's own
buckets (the plan's cuts still apply).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from goddp.ddp import private
from goddp.ddp.private import ReducerLost
from goddp.ddp.state import state_of

logger = logging.getLogger("goddp")


def users_bucket_config(ddp: Any) -> Any:
    """DDP's bucket settings as the user made them: goddp's own per-bucket
    caps replace them on the module, but plans keep following the user's,
    so that recompiling a frame plans the same cuts."""
    return state_of(ddp).original_config or private.bucket_config(ddp)


def install_bucket_caps(ddp: Any, caps_bytes: Sequence[int]) -> bool:
    """Gives DDP per-bucket caps ``caps_bytes`` (DDP order) and rebuilds its
    reducer so that its next bucket rebuild uses them. Must run inside DDP's
    forward, after its pre-forward. Returns False if the caps were already in
    place. Raises what the rebuild raises (goddp.ddp.private.rebuild_reducer:
    DDP's previous reducer is back, or ReducerLost)."""
    # The planner's caps are at least 1 byte each (planner/decide.go,
    # clampCaps); a cap of 0 would make DDP give each parameter its own bucket.
    caps = tuple(int(c) for c in caps_bytes)
    if any(c < 1 for c in caps):
        raise ValueError(f"goddp: DDP bucket caps must be at least 1 byte, got {list(caps)}")
    state = state_of(ddp)
    if state.aligned_caps == caps:
        return False
    if state.original_config is None:
        state.original_config = private.bucket_config(ddp)
    private.rebuild_reducer(
        ddp, config=private.with_per_bucket_caps(private.bucket_config(ddp), caps), in_forward=True
    )
    state.aligned_caps = caps
    return True


def remove_bucket_caps(ddp: Any) -> bool:
    """Undoes install_bucket_caps: a reducer with DDP's own bucket settings.
    Same conditions; returns False if goddp's caps were not in place."""
    state = state_of(ddp)
    if state.aligned_caps is None:
        return False
    private.rebuild_reducer(ddp, config=state.original_config, in_forward=True)
    state.aligned_caps = None
    return True


def install_or_reset(ddp: Any, caps_bytes: Sequence[int]) -> str | None:
    """install_bucket_caps; None when the caps are in place. When the
    install fails, DDP ends with its own bucket settings on a fresh reducer
    (the rebuild's rollback made one, or, where the failure came before the
    old reducer was replaced, reset_to_ddp_buckets does), and the failure is
    returned in words. ReducerLost propagates."""
    before = private.reducer_of(ddp)
    try:
        install_bucket_caps(ddp, caps_bytes)
        return None
    except ReducerLost:
        raise
    except Exception as exc:  # DDP's own buckets serve on every rank alike (the agreement's second round)
        logger.debug("goddp: installing the caps failed", exc_info=True)
        why = f"installing the caps failed ({type(exc).__name__}: {exc})"
    if private.reducer_of(ddp) is before:
        reset_to_ddp_buckets(ddp)
    return why


def reset_to_ddp_buckets(ddp: Any) -> None:
    """A fresh reducer with DDP's own bucket settings, whether goddp's caps
    are in place or not, and whatever a failed install left: how every rank
    ends when one rank's install failed (Note [Agreeing on DDP's layout])."""
    private.rebuild_reducer(ddp, config=users_bucket_config(ddp), in_forward=True)
    state_of(ddp).aligned_caps = None
