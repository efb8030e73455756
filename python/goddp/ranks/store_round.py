"""One round of statements among the ranks of a process group, through the
c10d store: how goddp's agreements across ranks wait for each other, within
a bound, and settle on one outcome. Two agreements use it: goddp.ranks.plan_check
(at a DDP module's first training call) and goddp.tracing (entering and
leaving a trace, and the records it publishes). Why the store and not the
process group: see Note [The store, not the process group] in
goddp.ranks.group.

Keys under a round's base:
- ``<base>/<rank>``: that rank's statement.
- ``<base>/outcome``: set once, atomically (``store.compare_set``), by the
  first rank that either has every statement (its verdict on them) or gives
  up waiting ("gave up: rank r"). Every rank follows it, so a rank that
  arrives after another gave up learns so and stops, instead of going on
  alone and then waiting in a collective for a rank that has left.
- ``<base>/read``: how many ranks have read the complete round; the last
  reader deletes the round's keys. In a round some rank gave up on no rank
  reads, and its keys (they are small) stay.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, Mapping

from goddp.ranks.group import Group

logger = logging.getLogger("goddp")

# A rank that waits longer than this says so at INFO, then again each time.
PROGRESS_EVERY_S = 30.0
POLL_S = 1.0  # how often a waiting rank looks whether the round was settled
GAVE_UP = "gave up: rank "


@dataclasses.dataclass(frozen=True)
class Round:
    """How a round ended for this rank.

    outcome: the one outcome every rank follows: a verdict on the
        statements, or "gave up: rank r".
    statements: what each rank said; with a give-up, only the ranks this
        rank saw.
    complete: whether this rank saw every statement within its wait.
    waited_s: how long this rank waited.
    """

    outcome: str
    statements: Mapping[int, str]
    complete: bool
    waited_s: float

    @property
    def gave_up(self) -> bool:
        return self.outcome.startswith(GAVE_UP)

    def missing(self, group: Group) -> list[int]:
        return [r for r in group.ranks if r not in self.statements]


def settle(
    store: Any,
    base: str,
    group: Group,
    statement: str,
    verdict: Callable[[Mapping[int, str]], str],
    waiting_for: str,
) -> Round:
    """Publishes this rank's statement under base, waits at most
    group.timeout_s for every other rank's, and returns the round's one
    outcome (see module doc). verdict turns the complete statements into
    the outcome; every rank computes it from the same statements.
    waiting_for ends the progress line ("rank 0 has waited 30 s for rank(s)
    [1] to ...")."""
    store.set(f"{base}/{group.rank}", statement)
    keys = {r: f"{base}/{r}" for r in group.ranks}
    started = time.monotonic()
    complete = _wait(store, keys, group, waiting_for, f"{base}/outcome")
    waited = time.monotonic() - started
    mine = verdict(_read(store, keys)) if complete else f"{GAVE_UP}{group.rank}"
    outcome = _compare_set(store, f"{base}/outcome", mine)
    if outcome.startswith(GAVE_UP):
        seen = {r: k for r, k in keys.items() if store.check([k])}
        return Round(outcome, _read(store, seen), complete, waited)
    # Someone saw every statement, so all are there to read, on every rank.
    statements = _read(store, keys)
    if int(store.add(f"{base}/read", 1)) == len(group.ranks):
        for k in [*keys.values(), f"{base}/outcome", f"{base}/read"]:
            try:
                store.delete_key(k)
            except Exception:  # a store without delete: the keys are small
                pass
    return Round(outcome, statements, complete, waited)


def _read(store: Any, keys: Mapping[int, str]) -> dict[int, str]:
    return {r: _text(store.get(k)) for r, k in keys.items()}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


_warned_no_compare_set = False


def _compare_set(store: Any, key: str, mine: str) -> str:
    """The round's outcome: mine if this rank sets it first, else the one
    another rank set (compare_set sets a missing key when expected is "").
    A store without compare_set settles nothing: each rank keeps its own
    view (warned once)."""
    try:
        return _text(store.compare_set(key, "", mine))
    except (AttributeError, NotImplementedError, RuntimeError) as exc:
        global _warned_no_compare_set
        if not _warned_no_compare_set:
            _warned_no_compare_set = True
            warnings.warn(
                f"goddp: the c10d store ({type(store).__name__}) cannot compare_set ({exc}); a rank that arrives "
                "after the others gave up waiting for it will not learn that they did"
            )
        return mine


def _wait(store: Any, keys: Mapping[int, str], group: Group, waiting_for: str, outcome: str) -> bool:
    """Whether every key appeared within group.timeout_s. Stops early, with
    False, once another rank has settled the round (its outcome key is set):
    a rank that gave up settles it for everyone, and a latecomer must not
    spend its own wait on a round already given up."""
    started = time.monotonic()
    deadline = started + group.timeout_s
    next_progress = started + PROGRESS_EVERY_S
    while True:
        now = time.monotonic()
        step = min(POLL_S, deadline - now, next_progress - now)
        try:
            store.wait(list(keys.values()), timedelta(seconds=max(0.001, step)))
            return True
        except RuntimeError:  # the store's timeout (DistStoreError is one)
            pass
        missing = [r for r, k in sorted(keys.items()) if not store.check([k])]
        if not missing:
            return True
        if store.check([outcome]) or time.monotonic() >= deadline:
            return False
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_EVERY_S
            logger.info(
                "goddp: rank %d has waited %.0f s for rank(s) %s to %s; giving up after %.0f s",
                group.rank, time.monotonic() - started, missing, waiting_for, group.timeout_s,
            )


# --------------------------------------------------------------------------
# A yes-or-no round, and records (goddp.trace)


def agree(store: Any, base: str, group: Group, verdict: str, waiting_for: str) -> Round:
    """A round whose statements are verdicts ("ok" or a reason) and whose
    outcome is "go" when every rank said "ok", else "refused" (or a give-up,
    Round.gave_up). Without a store (a group of one rank) this rank's own
    verdict decides."""
    if store is None:
        return Round("go" if verdict == "ok" else "refused", {group.rank: verdict}, True, 0.0)
    return settle(
        store,
        base,
        group,
        verdict,
        lambda said: "go" if all(v == "ok" for v in said.values()) else "refused",
        waiting_for,
    )


def publish(store: Any, key: str, record: Any) -> None:
    """Leaves record (JSON) under key for any rank to read, any number of times."""
    if store is not None:
        store.set(key, json.dumps(record))


def gather(store: Any, keys: Mapping[int, str], timeout_s: float) -> dict[int, Any]:
    """The records published under keys (rank -> key); ranks whose record
    did not appear within timeout_s seconds in all are left out."""
    out: dict[int, Any] = {}
    if store is None:
        return out
    deadline = time.monotonic() + timeout_s
    for r, key in keys.items():
        left = max(0.001, deadline - time.monotonic())
        try:
            store.wait([key], timedelta(seconds=left))
            out[r] = json.loads(store.get(key))
        except Exception:
            continue
    return out
