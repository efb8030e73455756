"""What ranks say and decide (goddp.ranks.verdict), and the plan check's
store rounds (goddp.ranks.store_round), in one process: decide()
on hand-made statements (layouts, not plans, decide: Note [Agreeing on
DDP's layout]), and the store exchange between threads that play
the ranks over torch's own in-memory store."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch.distributed as dist

import goddp.ranks.store_round as store_round
from goddp.ranks.layout import Layout
from goddp.ranks.store_round import RanksMissingError, exchange
from goddp.ranks.verdict import (
    INSTALL,
    KEEP,
    LATER,
    Decision,
    PeerFailedError,
    PlanMismatchError,
    Statement,
    confirm_install,
    decide,
)
from goddp.ranks.group import FALLBACK_TIMEOUT_S, Group

CAPS = (4096, 8192, 1024)
BUILD = "goddp test abi 0"
LAYOUT = Layout(buckets=((5, 4), (3, 2), (1, 0)), caps=CAPS, order="ready", build=BUILD)
# the same buckets, rank 1's parameters 5 and 3 swapped: another layout
OTHER = Layout(buckets=((3, 4), (5, 2), (1, 0)), caps=CAPS, order="ready", build=BUILD)
NAMES = [f"layers.{p}.weight" for p in range(6)]


def _digest(layout):
    # the planner's own: decide() refuses a digest that is not the layout's
    return None if layout is None else layout.digest()


def says(layout=LAYOUT, fingerprint=0xABC, reason=None, **kw) -> Statement:
    return Statement(layout=layout, digest=_digest(layout), reason=reason, fingerprint=fingerprint, pieces=3, **kw)


def test_a_statement_survives_the_store():
    for statement in (
        says(),
        says(layout=None, reason="fallback: x", fingerprint=None, strict=True),
        says(lost="gone"),
        says(layout=None, later=True),
    ):
        assert Statement.from_json(statement.to_json()) == statement


def test_the_same_layout_everywhere_aligns():
    decision = decide({0: says(), 1: says(), 2: says()})
    assert decision.action == INSTALL and decision.caps == CAPS and decision.reason is None
    assert not decision.disagreed
    assert decision.summary()["aligned"] is True


def test_plans_that_differ_with_the_same_layout_align():
    """Rank 0 evaluated first and recompiled with a symbolic batch: its plan
    (fingerprint) differs, what DDP communicates does not."""
    decision = decide({0: says(fingerprint=0xABD), 1: says()})
    assert decision.action == INSTALL and decision.caps == CAPS


def test_one_rank_that_fell_back_keeps_ddp_buckets_on_every_rank_and_is_named():
    statements = {0: says(), 1: says(layout=None, reason="fallback: compiling piece 2 of 3 failed"), 2: says()}
    decision = decide(statements)
    assert decision.action == KEEP and decision.caps is None and decision.disagreed
    assert "rank 1: plan 0000000000000abc, 3 pieces; keeps DDP's buckets: fallback: compiling piece 2" in decision.reason
    assert f"rank 0: plan 0000000000000abc, 3 pieces; proposes DDP buckets {list(CAPS)} bytes (layout " in decision.reason


def test_layouts_that_differ_keep_ddp_buckets_naming_rank_bucket_and_parameter():
    decision = decide({0: says(), 1: says(layout=OTHER)}, NAMES.__getitem__)
    assert decision.action == KEEP and decision.disagreed
    assert decision.reason.startswith("the ranks' layouts differ: bucket 0: rank 1 holds [layers.3.weight] where rank 0 holds [layers.5.weight]"), decision.reason
    assert "layers.3.weight" in decision.reason and "layers.5.weight" in decision.reason


def test_caps_that_differ_do_not_align():
    other = Layout(LAYOUT.buckets, (1, 2, 3), "ready", BUILD)
    decision = decide({0: says(), 1: says(layout=other)})
    assert decision.action == KEEP and decision.disagreed and "caps " in decision.reason


def test_the_same_no_everywhere_is_no_disagreement():
    decision = decide({0: says(layout=None, reason="align_buckets=False"), 1: says(layout=None, reason="align_buckets=False")})
    assert decision == Decision(KEEP, None, "align_buckets=False", False, decision.statements, decision.record)


def test_differing_layouts_raise_under_strict_listing_every_rank():
    with pytest.raises(PlanMismatchError) as info:
        decide({0: says(), 1: says(strict=True), 2: says(layout=OTHER)}, NAMES.__getitem__)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "bucket 0: rank 2 holds [layers.3.weight] where rank 0 holds [layers.5.weight]" in message
    for r in (0, 1, 2):
        assert f"rank {r}: plan " in message


def test_strict_alone_raises_nothing_when_layouts_agree():
    assert decide({0: says(strict=True), 1: says(strict=True, fingerprint=0xABD)}).action == INSTALL


def test_a_rank_whose_planning_failed_is_no_mismatch():
    decision = decide({0: says(), 1: says(fingerprint=None, layout=None, reason="fallback: planning failed")})
    assert decision.action == KEEP and decision.disagreed


def test_a_rank_that_will_propose_later_defers_every_rank():
    statements = {0: says(), 1: says(layout=None, later=True)}
    assert decide(statements).action == LATER
    # at the round that was deferred to, later counts as none
    final = decide(statements, may_defer=False)
    assert final.action == KEEP and final.disagreed


def test_a_rank_that_lost_its_reducer_stops_everyone():
    with pytest.raises(PeerFailedError, match=r"rank 1 \(injected\)"):
        decide({0: says(), 1: says(layout=None, lost="injected")})


def test_the_install_round_keeps_everyone_when_one_rank_failed():
    decision = decide({0: says(), 1: says()})
    assert confirm_install(decision, {0: {"failed": None, "lost": None}, 1: {"failed": None}}) == decision
    kept = confirm_install(decision, {1: {"failed": "no per-bucket caps"}, 0: {"failed": None, "lost": None}})
    assert kept.action == KEEP and kept.disagreed and kept.caps is None
    assert kept.reason == "the ranks agreed, but rank 1: no per-bucket caps"
    assert kept.summary()["aligned"] is False and kept.summary()["reason"] == kept.reason
    with pytest.raises(PeerFailedError, match=r"rebuilt on rank 0 \(gone\); every rank stops"):
        confirm_install(decision, {0: {"failed": "x", "lost": "gone"}, 1: {"failed": None}})


def test_the_verdict_names_ranks_in_order_whatever_order_they_came_in():
    forward = decide({0: says(), 1: says(layout=None, reason="r1"), 2: says(layout=OTHER)}, NAMES.__getitem__)
    backward = decide({2: says(layout=OTHER), 1: says(layout=None, reason="r1"), 0: says()}, NAMES.__getitem__)
    assert forward.reason == backward.reason and forward.summary() == backward.summary()
    assert [r["rank"] for r in backward.summary()["ranks"]] == [0, 1, 2]


# --------------------------------------------------------------------------
# The exchange


# A watchdog against a hang, never a measure of speed: how long _play waits
# for its ranks before it fails the test.
WATCHDOG_S = 120.0
# A rank's wait that no test may sit out: a case that passes with it ended
# its wait for another reason than its own timeout.
LONG_WAIT_S = 3600.0


def _play(store, key, ranks, payloads, timeout=30.0, arrive=None):
    """Runs exchange for each rank of `arrive` (default: all) in a thread;
    returns {rank: result or exception}. A rank still waiting after
    WATCHDOG_S fails the test."""
    results: dict = {}

    def run(rank):
        group = Group(name="g", ranks=tuple(ranks), rank=rank, timeout_s=timeout)
        try:
            results[rank] = exchange(store, key, group, payloads[rank], dict)
        except Exception as exc:
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in (ranks if arrive is None else arrive)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WATCHDOG_S)
    assert not any(t.is_alive() for t in threads), f"a rank still waits after the {WATCHDOG_S:.0f} s watchdog"
    return results


def _remaining_keys(store, key, rounds, ranks):
    names = [f"{key}/{n}/{r}" for n in range(rounds) for r in ranks]
    names += [f"{key}/{n}/{k}" for n in range(rounds) for k in ("ref", "diff", "in", "count", "outcome", "read")]
    return [k for k in names if store.check([k])]


def test_every_rank_reads_every_statement_and_the_last_reader_cleans_up():
    store = dist.HashStore()
    ranks = (0, 3, 5)  # global ranks of a subgroup
    results = _play(store, "k", ranks, {r: f"said by {r}" for r in ranks})
    expected = {r: f"said by {r}" for r in ranks}
    assert results == {r: expected for r in ranks}
    assert _remaining_keys(store, "k", 1, ranks) == []
    assert store.add("k/arrivals", 0) == 3  # the one key left: the next round counts on it


def test_a_second_round_on_the_same_key_never_sees_the_first():
    """Two runs sharing a long-lived store, or two same-shaped DDP modules:
    the arrival count puts each in its own round."""
    store = dist.HashStore()
    first = _play(store, "k", (0, 1), {0: "a0", 1: "a1"})
    second = _play(store, "k", (0, 1), {0: "b0", 1: "b1"})
    assert first[0] == first[1] == {0: "a0", 1: "a1"}
    assert second[0] == second[1] == {0: "b0", 1: "b1"}
    assert _remaining_keys(store, "k", 2, (0, 1)) == []


def test_a_rank_that_never_comes_is_named_after_the_bounded_wait():
    store = dist.HashStore()
    results = _play(store, "k", (0, 1, 2), {0: "x", 1: "y", 2: "z"}, timeout=1.0, arrive=(0, 1))
    for rank in (0, 1):
        assert isinstance(results[rank], RanksMissingError), results[rank]
        message = str(results[rank])
        assert f"rank {rank} waited" in message and "for rank(s) [2]" in message
        assert store_round.TIMEOUT_ENV in message


def test_a_latecomer_does_not_wait_on_a_round_already_given_up():
    """Three ranks: rank 0 gives up on ranks 1 and 2; rank 1 comes late
    and must not spend its own (long) wait on rank 2, who never comes: in
    the rank-that-never-comes case, rank 2 already waits in DDP's first
    allreduce, whose timeout runs from before rank 1's wait."""
    store = dist.HashStore()
    early = _play(store, "k", (0, 1, 2), {0: "x", 1: "y", 2: "z"}, timeout=0.5, arrive=(0,))
    assert isinstance(early[0], RanksMissingError)
    assert early[0].unsettled == {"stopped_by": 0, "missing": [1, 2]}
    late = _play(store, "k", (0, 1, 2), {0: "x", 1: "y", 2: "z"}, timeout=LONG_WAIT_S, arrive=(1,))
    assert isinstance(late[1], RanksMissingError), late[1]
    assert late[1].unsettled == {"stopped_by": 0, "missing": [2]}  # rank 0's give-up, not its own wait
    assert set(late[1].seen) == {0, 1}


def test_a_rank_that_comes_after_the_others_gave_up_is_told_so():
    """Without the round's outcome the late rank would find every statement
    and decide alone (what the agreement then does: Note [A round given up]
    in goddp.ranks.verdict)."""
    store = dist.HashStore()
    early = _play(store, "k", (0, 1), {0: "x", 1: "y"}, timeout=0.5, arrive=(0,))
    assert isinstance(early[0], RanksMissingError) and "for rank(s) [1]" in str(early[0])
    late = _play(store, "k", (0, 1), {0: "x", 1: "y"}, timeout=LONG_WAIT_S, arrive=(1,))
    assert isinstance(late[1], RanksMissingError), late[1]
    assert "after the others had stopped waiting for it (gave up: rank 0)" in str(late[1])


class _StaleStore:
    """A HashStore whose wait never sees a round's outcome: a rank whose
    last look at the store came just before the last rank settled it."""

    def __init__(self, store):
        self._store = store

    def wait(self, keys, timeout):
        raise RuntimeError("timed out")

    def check(self, keys):
        return not any(k.endswith("/outcome") for k in keys) and self._store.check(keys)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_rank_that_times_out_as_the_round_settles_follows_it():
    """Rank 0 never sees the outcome rank 1 set; when its wait ends, its
    give-up finds that outcome and follows it (one outcome for all)."""
    inner = dist.HashStore()
    results = {}

    def run(rank, store, timeout):
        group = Group(name="g", ranks=(0, 1), rank=rank, timeout_s=timeout)
        results[rank] = exchange(store, "k", group, "xy"[rank], dict)

    early = threading.Thread(target=run, args=(0, _StaleStore(inner), 2.0))
    early.start()
    while inner.add("k/0/count", 0) < 1:  # rank 0 is in; rank 1 comes last and settles
        time.sleep(0.01)
    run(1, inner, 30.0)
    early.join(WATCHDOG_S)
    assert not early.is_alive(), "rank 0 still waits after the watchdog"
    assert results == {0: {0: "x", 1: "y"}, 1: {0: "x", 1: "y"}}


class _OldStore:
    """A store without compare_set (a Python store written before it)."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name == "compare_set":
            raise AttributeError(name)
        return getattr(self._store, name)


def test_a_store_without_compare_set_still_agrees(monkeypatch):
    monkeypatch.setattr(store_round, "_warned_no_compare_set", False)
    store = _OldStore(dist.HashStore())
    with pytest.warns(UserWarning, match="cannot compare_set"):
        results = _play(store, "k", (0, 1), {0: "a", 1: "b"})
    assert results == {0: {0: "a", 1: "b"}, 1: {0: "a", 1: "b"}}


def test_progress_is_logged_while_waiting(monkeypatch, caplog):
    monkeypatch.setattr(store_round, "PROGRESS_EVERY_S", 0.3)
    store = dist.HashStore()
    with caplog.at_level("INFO", logger="goddp"):
        _play(store, "k", (0, 1), {0: "x", 1: "y"}, timeout=1.0, arrive=(0,))
    assert any("waited" in r.getMessage() and "[1]" in r.getMessage() for r in caplog.records)


def test_timeout_follows_the_group_unless_the_environment_says(dist_group, monkeypatch):
    monkeypatch.delenv(store_round.TIMEOUT_ENV, raising=False)
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=42))
    assert store_round.timeout_s(group) == 42
    assert store_round.timeout_s(None) == FALLBACK_TIMEOUT_S
    monkeypatch.setenv(store_round.TIMEOUT_ENV, "7.5")
    assert store_round.timeout_s(group) == 7.5
    monkeypatch.setenv(store_round.TIMEOUT_ENV, "soon")
    with pytest.warns(UserWarning, match="ignoring GODDP_PLAN_CHECK_TIMEOUT='soon'"):
        assert store_round.timeout_s(group) == 42


def test_the_model_key_depends_on_shapes_and_dtypes_only():
    # Not on names or classes: ranks that declare their parameters
    # differently must meet (test_backend_declaration's two-rank cases).
    a = store_round.model_key([((4, 4), "torch.float32"), ((4,), "torch.float32")])
    assert a == store_round.model_key([((4, 4), "torch.float32"), ((4,), "torch.float32")])
    assert a != store_round.model_key([((4, 4), "torch.float32"), ((4,), "torch.bfloat16")])
    assert a != store_round.model_key([((4,), "torch.float32"), ((4, 4), "torch.float32")])


def test_an_elastic_restart_never_pairs_with_a_dead_attempts_round(monkeypatch):
    """torchrun keeps its store across restarts: rank 0 of the dead attempt
    arrived, rank 1 died first. Had the restarted ranks counted on the same
    key, rank 0 would land in round 0 (waiting for the dead rank's slot) and
    rank 1 in round 1, each waiting for the other until the timeout."""
    store = dist.HashStore()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    dead = store_round.agreement_key("0", "m")
    store.add(f"{dead}/arrivals", 1)
    store.set(f"{dead}/0/0", "said by the dead attempt")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    key = store_round.agreement_key("0", "m")
    assert key != dead and key.startswith("goddp/agree/1/")
    results = _play(store, key, (0, 1), {0: "a", 1: "b"}, timeout=5.0)
    assert results == {0: {0: "a", 1: "b"}, 1: {0: "a", 1: "b"}}
