"""The in-process record of plans made by the backend (goddp.last_plans())."""

from __future__ import annotations

import collections
import copy
import threading
from typing import Any

# Enough for any realistic number of recompilations, bounded so that a
# long job that recompiles often does not grow without limit.
MAX_RECORDS = 1024

_lock = threading.Lock()
_records: "collections.deque[dict[str, Any]]" = collections.deque(maxlen=MAX_RECORDS)


def add_record(record: dict[str, Any]) -> None:
    with _lock:
        _records.append(record)


def last_plans() -> list[dict[str, Any]]:
    """Plans of the graphs the goddp backend compiled in this process (inside
    a DDP forward), oldest first. Each is a JSON-serialisable dict with:
    fingerprint (int or None after a planning failure), mode, caps, num_pieces,
    pieces, buckets, timings (seconds for export, plan, cut, example_inputs,
    compile, stitch), fallback (None, or why the whole graph was compiled),
    plan_check (the cross-rank comparison, or None), graph (node and
    parameter counts)."""
    with _lock:
        return [copy.deepcopy(r) for r in _records]


def clear_plans() -> None:
    """Forgets the recorded plans."""
    with _lock:
        _records.clear()
