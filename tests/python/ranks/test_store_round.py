"""goddp.ranks.store_round: rounds of statements through a c10d store, played
by threads on one HashStore (the two-rank cases live with their users:
test_dist_rank_safety, test_dist_trace)."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from goddp.ranks.group import Group, env_seconds, timeout_s
from goddp.ranks.store_round import settle


def _refused_if_any(said):
    return "go" if all(v == "ok" for v in said.values()) else "refused"


# A watchdog against a hang, never a measure of speed: how long a test waits
# for its ranks (threads) before it fails.
WATCHDOG_S = 120.0


def _join(threads):
    for t in threads:
        t.join(WATCHDOG_S)
    assert not any(t.is_alive() for t in threads), f"a rank still waits after the {WATCHDOG_S:.0f} s watchdog"


def _play(store, said, timeout=30.0, arrive=None):
    ranks = tuple(sorted(said))
    ended = {}

    def run(rank):
        group = Group(name="g", ranks=ranks, rank=rank, timeout_s=timeout)
        ended[rank] = settle(store, "r", group, said[rank], _refused_if_any, "test")

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in (arrive or ranks)]
    for t in threads:
        t.start()
    _join(threads)
    return ended


def test_every_rank_follows_one_verdict_and_the_round_is_cleaned_up():
    store = dist.HashStore()
    ended = _play(store, {0: "ok", 1: "busy", 2: "ok"})
    assert {e.decision for e in ended.values()} == {"refused"}
    assert all(e.complete and dict(e.statements) == {0: "ok", 1: "busy", 2: "ok"} for e in ended.values())
    keys = ("r/0", "r/1", "r/2", "r/ref", "r/diff", "r/in", "r/count", "r/outcome", "r/read")
    assert not any(store.check([k]) for k in keys)


def test_a_verdict_that_raises_raises_on_every_rank():
    """Every rank decides on the same statements; where the decision raises,
    every rank raises it (it is a pure function of them), and none waits
    out its bound for an outcome that never comes."""

    def strict(said):
        if len(set(said.values())) > 1:
            raise ValueError(f"ranks differ: {sorted(said.items())}")
        return "go"

    store = dist.HashStore()
    ranks = (0, 1, 2)
    ended = {}

    def run(rank):
        # a wait no rank may sit out: each ends on the verdict, not on it
        group = Group(name="g", ranks=ranks, rank=rank, timeout_s=3600.0)
        try:
            ended[rank] = settle(store, "r", group, "busy" if rank == 1 else "ok", strict, "test")
        except ValueError as exc:
            ended[rank] = str(exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    _join(threads)
    assert len(ended) == 3 and set(ended.values()) == {"ranks differ: [(0, 'ok'), (1, 'busy'), (2, 'ok')]"}


def test_a_rank_that_never_comes_ends_the_round_for_everyone_who_did():
    store = dist.HashStore()
    ended = _play(store, {0: "ok", 1: "ok", 2: "ok"}, timeout=0.5, arrive=(0, 1))
    for e in ended.values():
        assert e.gave_up and e.stopped_by in (0, 1) and e.decision is None and not e.complete
        assert e.missing(Group("g", (0, 1, 2), 0, 0.5)) == [2]
    # the late rank sees everyone, yet follows the give-up
    (late,) = _play(store, {0: "ok", 1: "ok", 2: "ok"}, arrive=(2,)).values()
    assert late.gave_up and late.complete


def test_env_seconds(monkeypatch):
    monkeypatch.setenv("GODDP_TEST_SECONDS", "2.5")
    assert env_seconds("GODDP_TEST_SECONDS") == 2.5
    monkeypatch.delenv("GODDP_TEST_SECONDS")
    assert env_seconds("GODDP_TEST_SECONDS") is None
    for bad in ("soon", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("GODDP_TEST_SECONDS", bad)
        with pytest.warns(UserWarning, match="not a positive, finite number of seconds"):
            assert env_seconds("GODDP_TEST_SECONDS") is None


@pytest.mark.parametrize("given", [0.0, -1.0, float("inf"), float("nan")])
def test_a_timeout_must_be_positive_and_finite(given):
    # A round's wait is written into its error text.
    with pytest.raises(ValueError, match="timeout must be positive seconds"):
        timeout_s("GODDP_TEST_SECONDS", 5.0, given, "goddp.test")

