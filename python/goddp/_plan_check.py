"""Cross-rank comparison of plan fingerprints.

Every rank must cut the same graph the same way. Before a compiled graph
first runs, each rank publishes its plan's fingerprint in the default c10d
store (a key-value store: no collective on the process group, so no device
or backend concerns) and reads everyone else's.

Keys: ``goddp/plan/<seq>/<rank>`` where <seq> counts the DDP graphs this
process has planned. Value: ``"<fingerprint hex> <pieces>"``, or
``"fallback <pieces>"`` when planning failed and the whole graph is used.

Environment:
- GODDP_PLAN_CHECK_TIMEOUT: seconds to wait for the other ranks (default
  300); on timeout goddp warns and continues.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import warnings
from datetime import timedelta

import torch

logger = logging.getLogger("goddp")

_seq_lock = threading.Lock()
_seq = itertools.count()

DEFAULT_TIMEOUT_S = 300.0


class PlanMismatchError(RuntimeError):
    """Ranks planned the same graph differently."""


def _timeout_s() -> float:
    raw = os.environ.get("GODDP_PLAN_CHECK_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        warnings.warn(f"goddp: ignoring GODDP_PLAN_CHECK_TIMEOUT={raw!r} (not a number); using {DEFAULT_TIMEOUT_S:g} s")
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def published_fingerprint(fingerprint: int, rank: int) -> int:
    """The fingerprint rank publishes: its own. (The tests replace this
    function to make ranks disagree; nothing in goddp does.)"""
    return fingerprint


def distributed_world() -> tuple[int, int] | None:
    """(rank, world size) when a default process group with more than one
    rank exists, else None."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    if world <= 1:
        return None
    return dist.get_rank(), world


def check_plans_across_ranks(fingerprint: int | None, num_pieces: int) -> dict | None:
    """Publishes this rank's plan and compares it with every rank's.

    fingerprint is None when this rank fell back to the whole graph. Raises
    PlanMismatchError (on every rank, since every rank sees the same values)
    when ranks that all planned disagree; warns when only some fell back or
    the other ranks do not answer in time. Returns a summary for the plan
    record, or None when there is nothing to compare.
    """
    world = distributed_world()
    if world is None:
        return None
    rank, world_size = world
    with _seq_lock:
        seq = next(_seq)
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    mine = "fallback" if fingerprint is None else f"{published_fingerprint(fingerprint, rank):016x}"
    store.set(f"goddp/plan/{seq}/{rank}", f"{mine} {num_pieces}")
    keys = [f"goddp/plan/{seq}/{r}" for r in range(world_size)]
    timeout = _timeout_s()
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception as exc:  # the store reports a timeout as an error
        message = (
            f"goddp: rank {rank} waited {timeout:g} s for the other ranks' plans of graph #{seq} "
            f"and continues without comparing ({type(exc).__name__}: {exc})"
        )
        warnings.warn(message)
        logger.warning(message)
        return {"seq": seq, "checked": False, "reason": "timeout"}

    entries = []
    for r, key in enumerate(keys):
        value = store.get(key).decode("utf-8", "replace").split()
        entries.append((r, value[0], int(value[1]) if len(value) > 1 else -1))
    planned = {fp for _, fp, _ in entries if fp != "fallback"}
    fallbacks = [r for r, fp, _ in entries if fp == "fallback"]
    listing = "; ".join(f"rank {r}: fingerprint {fp}, {pieces} pieces" for r, fp, pieces in entries)
    if len(planned) > 1:
        raise PlanMismatchError(
            f"goddp: ranks planned graph #{seq} differently, which must never happen "
            f"(every rank has to cut the same graph the same way): {listing}. Check that all "
            "ranks run the same model, goddp options and DDP bucket settings; please report it "
            "as a bug if they do."
        )
    if fallbacks and planned:
        message = (
            f"goddp: graph #{seq} was split on some ranks but compiled whole on ranks {fallbacks} "
            f"(planning failed there): {listing}. Gradients stay correct; overlap differs."
        )
        warnings.warn(message)
        logger.warning(message)
    return {"seq": seq, "checked": True, "ranks": [{"rank": r, "fingerprint": fp, "pieces": p} for r, fp, p in entries]}
