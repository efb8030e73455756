"""Every round of statements among the ranks of a process group, through
the c10d store: how goddp's agreements across ranks wait for each other,
within a bound, and settle on one outcome. ``settle`` is the one round;
``exchange`` holds the plan check's rounds (a DDP module's first training
call, and its install round; goddp.ranks.agreement; bucket_cap_mb="auto"'s
decision, goddp.ranks.auto), ``unanimous`` the
rounds of goddp.tracing (entering and leaving a trace), ``publish`` and
``gather`` the records a trace leaves. Each round's caller hands it the
decision it needs (goddp.ranks.verdict decides the plan check's). Why the
store and not the process group: see Note [The store, not the process
group] in goddp.ranks.group.

Note [A round that does not grow with the group]: every store call is a
round trip to one server (torchrun's, on one host), which serves the calls
of every rank one after the other. A round where each rank read every
other rank's statement made 2N calls per rank and 2N^2 through that server
(512 ranks: 26 s on a 2-core machine; 4,096 would pass the first round's
bound). So a rank reads only what differs from the first statement:
- the first rank to arrive sets the reference (``compare_set`` on ``ref``:
  its rank, its statement's sha256 digest and the statement itself); every
  later rank's ``compare_set`` returns the reference, in the same call;
- a rank whose digest differs publishes its statement (once per digest)
  and appends its rank and digest to a list (``diff``);
- every rank counts itself in (``add``); the one that makes the count the
  group's size is the last: every statement is in, it reads the list and
  one statement per distinct digest on it (every rank not on the list
  said the reference), leaves a summary for the others (``said``) and
  settles the round (``compare_set`` on ``outcome``);
- every other rank waits on that one key, then rebuilds the same mapping
  from the reference and the summary: empty where every rank said the
  reference; else the statements other than the reference, the digest
  most ranks said and the ranks of every other digest. So what it reads
  grows with what differs from the most common statement (the decision
  needs every rank's: a lost reducer on any rank stops them all), never
  with N alone, and not with which rank came first. Every rank then
  decides on the same mapping (the decision is a pure function of it, so
  every rank reaches the same one, or raises the same error).
Ranks that agree make a fixed number of calls and read the reference, the
outcome and a few counters, whatever N. The last rank reads the list once,
and the roll call (``in``) is read only to name the ranks that did not
come (the progress line, a give-up). docs/ranks-scale.md has the
measurements, and what 4,096 and 16,384 ranks cost the server.

Keys under a round's base:
- ``<base>/ref``: "<rank>:<digest>" and, after a newline, that rank's
  statement: the reference, set once, by the first rank to arrive.
- ``<base>/diff``: "<rank>:<digest>," appended by each rank whose digest
  is not the reference's, before it counts itself in;
  ``<base>/text/<digest>``: that statement, set before it appends.
- ``<base>/in``: "<rank>," appended by each rank as it counts itself in.
- ``<base>/count``: how many ranks came (``store.add``).
- ``<base>/said``: the last rank's summary of every statement (JSON, or
  empty), set before the outcome.
- ``<base>/outcome``: set once, atomically (``store.compare_set``), by the
  last rank to arrive ("settled") or by the first that gives up waiting
  ("gave up: rank r"). Every rank follows it, so a rank
  that arrives after another gave up learns so and stops, instead of going
  on alone and then waiting in a collective for a rank that has left.
- ``<base>/read``: how many ranks have read the complete round; the last
  reader deletes the round's keys. In a round some rank gave up on no rank
  reads, and its keys (they are small) stay.
A store without ``compare_set`` (a Python store written before it) gets
the older round instead: every rank reads every statement and settles
nothing (warned once).

The plan check's keys, all under ``goddp/agree/<attempt>/<group name>/<model
key>/`` (attempt: torchrun's restart count, so that an elastic restart never
reads what a dead attempt left in a store the agent keeps across attempts):
- ``arrivals``: a counter (``store.add``). The n-th arrival belongs to round
  ``(n - 1) // group size``, so two runs that share a long-lived store, or
  two DDP modules of the same shapes in one run, never read each other's
  statements. It stays when a round ends: the next round counts on it.
- ``<round>/...``: the round's keys, as above.
- ``installed/...``: the same for the install round, in which the ranks
  that decided to install say whether they did.

Environment: GODDP_PLAN_CHECK_TIMEOUT, seconds the plan check waits for the
other ranks (default: the DDP process group's own timeout, 30 minutes
unless ``init_process_group(timeout=...)`` says otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, Iterable, Mapping, Sequence

from goddp.ranks.group import Group, env_seconds, process_group_timeout_s, round_error
from goddp.ranks.group import timeout_s as group_timeout_s

logger = logging.getLogger("goddp")

# A rank that waits longer than this says so at INFO, then again each time.
PROGRESS_EVERY_S = 30.0
# How often a waiting rank looks again (a store wait cannot be interrupted:
# this bounds how late Ctrl-C lands). In a group of more than LOOKS_PER_S
# ranks each looks less often, so that the server answers about that many
# looks a second in all, whatever N (a look is a wait, its cancel and a
# check, on one key).
POLL_S = 1.0
LOOKS_PER_S = 1024
GAVE_UP = "gave up: rank "
SETTLED = "settled"
TIMEOUT_ENV = "GODDP_PLAN_CHECK_TIMEOUT"


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a round ended for this rank.

    decision: what the caller's decision made of every rank's statement;
        None when the round was given up.
    statements: what each rank said; with a give-up, only the ranks this
        rank saw.
    complete: whether this rank saw every statement within its wait.
    waited_s: how long this rank waited.
    stopped_by: the rank whose bounded wait ran out first, where one did:
        the one outcome every rank follows.
    """

    decision: Any
    statements: Mapping[int, str]
    complete: bool
    waited_s: float
    stopped_by: int | None = None

    @property
    def gave_up(self) -> bool:
        return self.stopped_by is not None

    def missing(self, group: Group) -> list[int]:
        return [r for r in group.ranks if r not in self.statements]


def settle(
    store: Any,
    base: str,
    group: Group,
    statement: str,
    decide: Callable[[Mapping[int, str]], Any],
    waiting_for: str,
) -> Ended:
    """States this rank's statement under base, waits at most
    group.timeout_s for every other rank's, and returns how the round ended
    (see module doc). decide turns every rank's statement into the round's
    decision; it must be a pure function of them, since every rank calls it
    (what it raises, every rank raises). A round given up decides nothing.
    waiting_for ends the progress line ("rank 0 has waited 30 s for rank(s)
    [1] to ...")."""
    started = time.monotonic()
    steps = _Steps(store, base, group)
    try:
        count = steps.arrive(statement)
    except _NoCompareSet:
        return _settle_reading_all(store, base, group, statement, decide, waiting_for)
    if count == len(group.ranks):
        steps.statements(group.ranks)
        steps.publish_said()
        outcome: str | None = steps.set_outcome(SETTLED)
        complete = True
    else:
        outcome = steps.wait(waiting_for, started)
        complete = outcome is not None
        if outcome is None:
            outcome = steps.set_outcome(f"{GAVE_UP}{group.rank}")
    waited = time.monotonic() - started
    if outcome.startswith(GAVE_UP):
        seen = steps.came()
        complete = complete and len(seen) == len(group.ranks)
        return Ended(None, steps.statements(seen), complete, waited, int(outcome[len(GAVE_UP):]))
    # Every rank came (the last one settled the round), so every statement
    # can be rebuilt, on every rank, from the last one's summary.
    statements = steps.settled_statements()
    steps.done_reading()
    return Ended(decide(statements), statements, complete, waited)


class _NoCompareSet(Exception):
    """The store cannot compare_set (see module doc)."""


class _Steps:
    """One rank's steps in a round, and what it has read so far
    (Note [A round that does not grow with the group])."""

    def __init__(self, store: Any, base: str, group: Group) -> None:
        self.store, self.base, self.group = store, base, group
        self._reference = ("", "")  # (digest, statement) of the reference
        self._differing: dict[int, str] | None = None  # rank -> digest, once read
        self._texts: dict[str, str] = {}  # digest -> statement, of the differing ones

    def key(self, name: object) -> str:
        return f"{self.base}/{name}"

    def arrive(self, statement: str) -> int:
        """Compares this rank's statement with the reference (setting it
        when first), publishes it where it differs, and counts this rank in;
        returns the count."""
        rank, digest = self.group.rank, _digest(statement)
        try:
            ref = _text(self.store.compare_set(self.key("ref"), "", f"{rank}:{digest}\n{statement}"))
        except (AttributeError, NotImplementedError, RuntimeError) as exc:
            _warn_no_compare_set(self.store, exc)
            raise _NoCompareSet from exc
        header, _, text = ref.partition("\n")
        self._reference = (header.partition(":")[2], text)
        if self._reference[0] != digest:
            # the same text under the same key from every rank that says it
            self.store.set(self.key(f"text/{digest}"), statement)
            self.store.append(self.key("diff"), f"{rank}:{digest},")
        self.store.append(self.key("in"), f"{rank},")
        return int(self.store.add(self.key("count"), 1))

    def wait(self, waiting_for: str, started: float) -> str | None:
        """The outcome, once some rank set it within group.timeout_s of
        started; None when none did."""
        outcome = self.key("outcome")
        if _wait(self.store, [outcome], self.group, waiting_for, started, self.missing):
            return _text(self.store.get(outcome))
        return None

    def set_outcome(self, mine: str) -> str:
        """The round's outcome: mine if this rank sets it first, else the
        one another rank set."""
        return _text(self.store.compare_set(self.key("outcome"), "", mine))

    def came(self) -> list[int]:
        """The ranks that counted themselves in so far, in the group's order."""
        came = {int(r) for r in _text(self.store.get(self.key("in"))).split(",") if r}
        return [r for r in self.group.ranks if r in came]

    def missing(self) -> list[int]:
        """The ranks that have not counted themselves in, in rank order."""
        came = set(self.came())
        return [r for r in sorted(self.group.ranks) if r not in came]

    def statements(self, ranks: Iterable[int]) -> dict[int, str]:
        """What each of ranks (ranks that came) said, read from the round's
        keys: the reference unless it is on the list of those that differ.
        The list, and one statement per distinct digest on it, are read
        once. For the last rank, and after a give-up."""
        if self._differing is None:
            self._differing = self._read_differing()
            digests = sorted(set(self._differing.values()))
            self._texts = dict(zip(digests, _get_many(self.store, [self.key(f"text/{d}") for d in digests])))
        differing, texts = self._differing, self._texts
        return {r: texts[differing[r]] if r in differing else self._reference[1] for r in ranks}

    def _read_differing(self) -> dict[int, str]:
        if not self.store.check([self.key("diff")]):
            return {}
        said = (entry.partition(":") for entry in _text(self.store.get(self.key("diff"))).split(",") if entry)
        return {int(r): digest for r, _, digest in said}

    def publish_said(self) -> None:
        """The last rank's summary of every rank's statement, for the
        others: empty where all said the reference; else the statements
        other than the reference, by digest, the digest most ranks said,
        and the ranks of every other digest. What another rank reads grows
        with what differs from the most common statement, not with N, and
        not with who came first."""
        ref_digest = self._reference[0]
        classes: dict[str, list[int]] = {}
        for r in self.group.ranks:
            classes.setdefault((self._differing or {}).get(r, ref_digest), []).append(r)
        said = ""
        if len(classes) > 1:
            major = max(classes, key=lambda d: (len(classes[d]), d == ref_digest, d))
            said = json.dumps({
                "major": major,
                "texts": self._texts,
                "ranks": {d: rs for d, rs in classes.items() if d != major},
            }, sort_keys=True)
        self.store.set(self.key("said"), said)

    def settled_statements(self) -> dict[int, str]:
        """Every rank's statement, once the last rank has published its
        summary (publish_said): one read."""
        if self._differing is not None:  # read already (the last rank)
            return self.statements(self.group.ranks)
        raw = _text(self.store.get(self.key("said")))
        ref_digest, ref_text = self._reference
        if not raw:
            self._texts = {}
            return {r: ref_text for r in self.group.ranks}
        said = json.loads(raw)
        self._texts = said["texts"]
        texts = {**said["texts"], ref_digest: ref_text}
        listed = {r: texts[d] for d, ranks in said["ranks"].items() for r in ranks}
        return {r: listed.get(r, texts[said["major"]]) for r in self.group.ranks}

    def done_reading(self) -> None:
        """Counts this rank's read of a complete round; the last reader
        deletes the round's keys (a few, whatever N: one more per distinct
        statement)."""
        if int(self.store.add(self.key("read"), 1)) != len(self.group.ranks):
            return
        # (no statement other than the reference: no list was made)
        differing = ["diff", *(f"text/{d}" for d in self._texts)] if self._texts else []
        names = ["ref", "in", "count", "said", "outcome", "read", *differing]
        for name in names:
            try:
                self.store.delete_key(self.key(name))
            except (AttributeError, RuntimeError):  # a store without delete (or failing at it): the keys are small
                pass


def _digest(statement: str) -> str:
    return hashlib.sha256(statement.encode("utf-8")).hexdigest()


def _get_many(store: Any, keys: Sequence[str]) -> list[str]:
    """The values of keys (each set), in one call where the store can."""
    if not keys:
        return []
    try:
        return [_text(v) for v in store.multi_get(list(keys))]
    except (AttributeError, NotImplementedError):
        return [_text(store.get(k)) for k in keys]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _wait(
    store: Any,
    keys: Sequence[str],
    group: Group,
    waiting_for: str,
    started: float,
    missing: Callable[[], list[int]],
    settled: Callable[[], bool] = lambda: False,
) -> bool:
    """Whether every key appeared within group.timeout_s of started. Stops
    early, with False, once settled() says another rank settled the round.
    Every PROGRESS_EVERY_S it logs the ranks missing() names."""
    deadline = started + group.timeout_s
    next_progress = started + PROGRESS_EVERY_S
    poll = POLL_S * max(1.0, len(group.ranks) / LOOKS_PER_S)
    while True:
        now = time.monotonic()
        step = min(poll, deadline - now, next_progress - now)
        try:
            store.wait(list(keys), timedelta(seconds=max(0.001, step)))
            return True
        except RuntimeError:  # the store's timeout (DistStoreError is one)
            pass
        if store.check(list(keys)):
            return True
        if settled() or time.monotonic() >= deadline:
            return False
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_EVERY_S
            logger.info(
                "goddp: rank %d has waited %.0f s for rank(s) %s to %s; giving up after %.0f s",
                group.rank, time.monotonic() - started, missing(), waiting_for, group.timeout_s,
            )


# --------------------------------------------------------------------------
# A store without compare_set


_warned_no_compare_set = False


def _warn_no_compare_set(store: Any, exc: Exception) -> None:
    global _warned_no_compare_set
    if not _warned_no_compare_set:
        _warned_no_compare_set = True
        warnings.warn(
            f"goddp: the c10d store ({type(store).__name__}) cannot compare_set ({exc}); a rank that arrives "
            "after the others gave up waiting for it will not learn that they did"
        )


def _settle_reading_all(
    store: Any, base: str, group: Group, statement: str, decide: Callable[[Mapping[int, str]], Any], waiting_for: str
) -> Ended:
    """settle for a store without compare_set: every rank reads every
    statement and decides by itself (nothing settles the round for all)."""
    store.set(f"{base}/{group.rank}", statement)
    keys = {r: f"{base}/{r}" for r in group.ranks}
    started = time.monotonic()
    missing = lambda: [r for r, k in sorted(keys.items()) if not store.check([k])]  # noqa: E731
    complete = _wait(store, list(keys.values()), group, waiting_for, started, missing)
    waited = time.monotonic() - started
    if not complete:
        seen = {r: k for r, k in keys.items() if store.check([k])}
        return Ended(None, _read(store, seen), complete, waited, group.rank)
    statements = _read(store, keys)
    if int(store.add(f"{base}/read", 1)) == len(group.ranks):
        for k in [*keys.values(), f"{base}/read"]:
            try:
                store.delete_key(k)
            except (AttributeError, RuntimeError):  # a store without delete (or failing at it): the keys are small
                pass
    return Ended(decide(statements), statements, complete, waited)


def _read(store: Any, keys: Mapping[int, str]) -> dict[int, str]:
    return {r: _text(store.get(k)) for r, k in keys.items()}


# --------------------------------------------------------------------------
# The plan check's rounds (goddp.ranks.agreement)


class RanksMissingError(RuntimeError):
    """Some ranks of a DDP module's group never reached the agreement.

    unsettled: how the given-up round ended, as goddp.ranks.verdict.decide
    reads it ({"stopped_by": rank, "missing": [ranks]}); seen: the payloads
    this rank read (rank -> text)."""

    def __init__(self, message: str, unsettled: dict[str, Any] | None = None, seen: Mapping[int, str] | None = None):
        super().__init__(message)
        self.unsettled = unsettled
        self.seen = dict(seen or {})


def exchange(
    store: Any,
    key: str,
    group: Group,
    payload: str,
    decide: Callable[[Mapping[int, str]], Any],
    meeting: str = "first step",
    waiting_for: str = "reach the first training step (they may still be compiling)",
    keeps: bool = False,
) -> Any:
    """One of the plan check's rounds under key (see module doc): publishes
    payload for this rank and returns decide's decision on every rank's
    payload of the same round. Waits at most group.timeout_s for the
    others, then raises RanksMissingError naming the ranks that did not
    come; a rank that comes after the others gave up on it raises it too.
    meeting: "first step", "install" or "auto"; keeps: the message says the rank
    keeps DDP's buckets rather than stop (see
    Note [Rounds that did not settle] in goddp.ranks.group). Without a
    store (a group of one rank) this rank's own payload decides."""
    if store is None:
        return decide({group.rank: payload})
    arrival = int(store.add(f"{key}/arrivals", 1))
    base = f"{key}/{(arrival - 1) // len(group.ranks)}"
    ended = settle(store, base, group, payload, decide, waiting_for)
    if not ended.gave_up:
        return ended.decision
    unsettled = {"stopped_by": ended.stopped_by, "missing": ended.missing(group)}
    raise RanksMissingError(round_error(meeting, group, ended, keeps, TIMEOUT_ENV), unsettled, ended.statements)


def first_round_timeout_s(group: Group) -> float:
    """How long a module's agreement (not its install round) waits:
    GODDP_PLAN_CHECK_TIMEOUT, else half the group's timeout, so that ranks
    that give up (Note [A round given up] in goddp.ranks.verdict) still meet a
    rank that never came in DDP's first allreduce before that collective's
    own timeout ends it."""
    return env_seconds(TIMEOUT_ENV) or group.timeout_s / 2


def timeout_s(process_group: Any = None) -> float:
    """GODDP_PLAN_CHECK_TIMEOUT, else the process group's own timeout: a
    rank may still be compiling (an evaluation graph, say) while the others
    wait, so the wait is as generous as any collective on that group."""
    return group_timeout_s(TIMEOUT_ENV, lambda: process_group_timeout_s(process_group))


STORE_PREFIX = "goddp/agree"


def attempt() -> str:
    """torchrun's restart count (the same on every rank of an attempt), "0"
    outside torchrun."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def agreement_key(group_name: str, model: str) -> str:
    """The store key of a DDP module's agreements (see module doc)."""
    return f"{STORE_PREFIX}/{attempt()}/{group_name}/{model}"


def model_key(shapes: Sequence[tuple[tuple[int, ...], str]]) -> str:
    """A key every rank of a DDP module derives identically: its parameters'
    shapes and dtypes in DDP order (DDP checks at construction that these
    agree across the group). Nothing else: ranks may name or declare the
    same parameters differently (another class, another declaration order)
    and must still meet, to find that their layouts differ."""
    text = ";".join(f"{'x'.join(map(str, shape))}:{dtype}" for shape, dtype in shapes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------
# goddp.trace's rounds, and its records


def unanimous(store: Any, base: str, group: Group, verdict: str, waiting_for: str) -> Ended:
    """A round whose statements are verdicts ("ok" or a reason) and whose
    decision is "go" when every rank said "ok", else "refused" (None when
    given up). Without a store (a group of one rank) this rank's own
    verdict decides."""
    decide = lambda said: "go" if all(v == "ok" for v in said.values()) else "refused"  # noqa: E731
    if store is None:
        return Ended(decide({group.rank: verdict}), {group.rank: verdict}, True, 0.0)
    return settle(store, base, group, verdict, decide, waiting_for)


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
        except (RuntimeError, ValueError):  # not published in time (DistStoreError), or not JSON: left out
            continue
    return out
