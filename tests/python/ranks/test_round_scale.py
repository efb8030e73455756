"""goddp.ranks.store_round as the group grows: rounds among 16 and 64 ranks
played by threads, each with its own TCPStore client to one TCPStore server
in this process (Note [A round that does not grow with the group]): what a
rank reads does not grow with N, and every guarantee of the round holds."""

from __future__ import annotations

import collections
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from goddp.ranks.group import Group
from goddp.ranks.layout import Layout
from goddp.ranks.store_round import GAVE_UP, RanksMissingError, exchange, settle
from goddp.ranks.verdict import KEEP, PlanMismatchError, Statement, decide

BUILD = "goddp test abi 0"
CAPS = (4096, 8192, 1024)
LAYOUT = Layout(buckets=((5, 4), (3, 2), (1, 0)), caps=CAPS, order="ready", build=BUILD)
OTHER = Layout(buckets=((3, 4), (5, 2), (1, 0)), caps=CAPS, order="ready", build=BUILD)
NAMES = [f"layers.{p}.weight" for p in range(6)]
WIDE = 64


class _Counted:
    """A store client that counts its calls (by kind) and the bytes it reads."""

    def __init__(self, store):
        self._store = store
        self.calls: collections.Counter = collections.Counter()
        self.read = 0

    def __getattr__(self, name):
        method = getattr(self._store, name)

        def counted(*args, **kwargs):
            self.calls[name] += 1
            value = method(*args, **kwargs)
            for v in value if isinstance(value, list) else [value]:
                self.read += len(v) if isinstance(v, (bytes, str)) else 0
            return value

        return counted


@pytest.fixture(scope="module")
def clients():
    """WIDE clients of one TCPStore server; each test counts afresh. (Their
    connections ask DNS for a name: Note [A lost DNS answer] in docs/testing.md.)"""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    made = [dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60)) for _ in range(WIDE)]
    yield lambda n: [_Counted(c) for c in made[:n]]
    del made, server


_bases = iter(range(1_000_000))


# A watchdog against a hang, never a measure of speed: how long a test waits
# for its ranks (threads) before it fails.
WATCHDOG_S = 120.0
# A rank's wait that no test may sit out: a case that passes with it ended
# its wait for another reason than its own timeout.
LONG_WAIT_S = 3600.0


def _join(threads):
    for t in threads:
        t.join(WATCHDOG_S)
    assert not any(t.is_alive() for t in threads), f"a rank still waits after the {WATCHDOG_S:.0f} s watchdog"


def _play(stores, run, arrive=None):
    """run(rank, store) in a thread per rank of `arrive` (default all);
    returns {rank: result or exception}."""
    results = {}

    def one(rank):
        try:
            results[rank] = run(rank, stores[rank])
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True)
               for r in (range(len(stores)) if arrive is None else arrive)]
    for t in threads:
        t.start()
    _join(threads)
    return results


def _settle_all(stores, said, timeout=30.0):
    """One settle round among len(stores) ranks; said: rank -> statement.
    Returns ({rank: Ended}, [the mappings the decision was made on], base)."""
    base, n, seen = f"r/{next(_bases)}", len(stores), []

    def verdict(statements):
        seen.append(dict(statements))
        return "go" if len(set(statements.values())) == 1 else "refused"

    def run(rank, store):
        return settle(store, base, Group("g", tuple(range(n)), rank, timeout), said[rank], verdict, "test")

    return _play(stores, run), seen, base


def _says(layout=LAYOUT, **kw):
    return Statement(layout=layout, digest=layout.digest(), fingerprint=0xABC, pieces=3, **kw)


def _exchange_all(stores, payloads, timeout=30.0, arrive=None, key=None):
    key, n = key or f"k/{next(_bases)}", len(stores)

    def run(rank, store):
        return exchange(store, key, Group("g", tuple(range(n)), rank, timeout), payloads[rank], dict)

    return _play(stores, run, arrive), key


def _polls(calls):
    """Calls beyond a wait that found its key at once (each look again
    is one wait and one check)."""
    return 2 * max(0, calls["wait"] - 1)


def test_what_a_rank_calls_and_reads_does_not_grow_with_the_group(clients):
    costs = {}
    for n in (16, WIDE):
        stores = clients(n)
        ended, seen, _ = _settle_all(stores, {r: "the same layout, " * 20 for r in range(n)})
        assert {e.decision for e in ended.values()} == {"go"}
        calls = [sum(s.calls.values()) - _polls(s.calls) for s in stores]
        costs[n] = (sorted(calls), max(s.read for s in stores), max(s.calls["get"] for s in stores))
        # one wait on one key, one compare_set, a fixed few more; the last
        # reader deletes a fixed few keys
        assert max(calls) <= 13 and max(sum(s.calls.values()) for s in stores) <= 16, calls
    small, wide = costs[16], costs[WIDE]
    assert small[0][0] == wide[0][0] and small[0][len(small[0]) // 2] == wide[0][len(wide[0]) // 2]
    assert small[0][-1] == wide[0][-1]
    assert wide[1] <= small[1] + 8  # the reference names its rank: one more digit
    assert wide[2] == small[2] == 2  # the outcome, the last rank's summary


def test_ranks_that_agree_rebuild_every_statement_from_one(clients):
    stores = clients(WIDE)
    said = {r: '{"layout": "the same"}' for r in range(WIDE)}
    ended, seen, base = _settle_all(stores, said)
    assert seen == [said] * WIDE  # every rank decided on every rank's statement
    for e in ended.values():
        assert e.decision == "go" and e.complete and dict(e.statements) == said
    assert max(s.read for s in stores) < 2 * len(said[0]) + 100  # the reference, the outcome
    left = [k for k in ("ref", "diff", "in", "count", "said", "outcome", "read") if stores[0].check([f"{base}/{k}"])]
    assert left == []


def test_ranks_that_differ_are_read_and_the_verdict_sees_every_rank(clients):
    stores = clients(WIDE)
    keys = stores[0]._store.num_keys()
    said = {r: "the layout" for r in range(WIDE)}
    said.update({5: "another layout", 17: "a third", 63: "another layout"})
    ended, seen, base = _settle_all(stores, said)
    assert seen == [said] * WIDE
    for e in ended.values():
        assert e.decision == "refused" and dict(e.statements) == said
    # the last rank: the list of those that differ, and one read of the two
    # other statements; the others: the outcome and the last one's summary
    assert max(s.calls["get"] + s.calls["multi_get"] for s in stores) <= 2
    assert stores[0]._store.num_keys() == keys  # cleaned up


def test_what_the_others_read_does_not_depend_on_who_came_first(clients):
    """The one rank that differs comes first and sets the reference: the
    others read the summary of the last rank (the most common statement,
    and who said the reference), not a list of every rank."""
    stores = clients(WIDE)
    odd, common = "the odd one out " * 10, "the layout most ranks state " * 10
    said = {r: odd if r == 0 else common for r in range(WIDE)}
    base, seen, ended = f"r/{next(_bases)}", [], {}

    def run(rank, store):
        verdict = lambda s: seen.append(dict(s)) or "refused"  # noqa: E731
        return settle(store, base, Group("g", tuple(range(WIDE)), rank, 30.0), said[rank], verdict, "test")

    first = threading.Thread(target=lambda: ended.update(_play(stores, run, arrive=[0])), daemon=True)
    first.start()
    while stores[0]._store.add(f"{base}/count", 0) < 1:
        time.sleep(0.01)
    ended.update(_play(stores, run, arrive=range(1, WIDE)))
    _join([first])
    assert seen == [said] * WIDE and all(dict(e.statements) == said for e in ended.values())
    readers = [s.read for r, s in enumerate(stores) if s.calls["get"] == 2]  # read the summary
    assert len(readers) >= WIDE - 2
    assert max(readers) < len(odd) + len(common) + 400, max(readers)


def test_a_rank_that_never_comes_costs_a_bounded_wait_and_every_rank_keeps(clients):
    stores = clients(WIDE)
    payloads = {r: _says().to_json() for r in range(WIDE)}
    results, key = _exchange_all(stores, payloads, timeout=1.0, arrive=[r for r in range(WIDE) if r != 40])
    stopped_by = set()
    for rank, exc in results.items():
        assert isinstance(exc, RanksMissingError), (rank, exc)
        assert exc.unsettled["missing"] == [40] and "for rank(s) [40], which never arrived" in str(exc)
        stopped_by.add(exc.unsettled["stopped_by"])
        assert set(exc.seen) == set(range(WIDE)) - {40}
        said = {r: Statement.from_json(p) for r, p in exc.seen.items()}
        assert decide(said, NAMES.__getitem__, unsettled=exc.unsettled).action == KEEP
    assert len(stopped_by) == 1  # one outcome for all

    # the rank that never came, late: it reads the give-up and keeps too
    late = _exchange_all(stores, payloads, timeout=LONG_WAIT_S, arrive=[40], key=key)[0][40]
    assert isinstance(late, RanksMissingError), late
    assert f"after the others had stopped waiting for it ({GAVE_UP}{stopped_by.pop()})" in str(late)
    assert set(late.seen) == set(range(WIDE))
    said = {r: Statement.from_json(p) for r, p in late.seen.items()}
    assert decide(said, NAMES.__getitem__, unsettled=late.unsettled).action == KEEP


def test_layouts_that_differ_raise_the_same_error_on_every_rank_under_strict(clients):
    stores = clients(WIDE)
    payloads = {r: _says().to_json() for r in range(WIDE)}
    payloads[WIDE - 1] = _says(OTHER, strict=True).to_json()
    results, _ = _exchange_all(stores, payloads)
    messages = set()
    for rank, said in results.items():
        assert said == payloads, rank
        with pytest.raises(PlanMismatchError) as raised:
            decide({r: Statement.from_json(p) for r, p in said.items()}, NAMES.__getitem__)
        messages.add(str(raised.value))
    (message,) = messages
    assert f"bucket 0: rank {WIDE - 1} holds [layers.3.weight] where rank 0 holds [layers.5.weight]" in message
