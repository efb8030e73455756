"""bucket_cap_mb="auto" on two ranks (Note [Buckets chosen by cost] in
goddp.ranks.auto).

Inside each of two ranks (pytest under torchrun, gloo, CPU), models of the
bench's kind train with goddp (aot_eager) and as eager DDP with the same
settings: "auto" measures, decides once, and every rank ends with the same
buckets (DDP's rebuilt buckets are the ones it chose, or the starting ones
it kept), while losses and gradients equal eager DDP's bitwise. The choice
comes from rank 0's measurements: ranks whose measurements differ, a rank
that is slow while measuring, and a rank that cannot measure still end
alike. The combinations users write (max_pieces, find_unused_parameters,
checkpointed blocks, rank 0 evaluating first) train as eager DDP. Where a
case must choose, the measurements are replaced by fixed ones in the test
(monkeypatch), on every rank alike where they feed a collective. A plain
pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch
import torch.distributed as dist

import goddp
from goddp.measure import timeline
from goddp.ranks import auto as auto_mod
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank
from _zoo_training import assert_bitwise, train
from checkpoint_models import build as build_checkpointed
from checkpoint_models import lm_loss, make_tokens
from models import ZOO

ENTRY = ZOO["blocks"]
AUTO = {"inner": "aot_eager", "bucket_cap_mb": "auto", "log_plan": False}
# DDP's default cap: the blocks' 0.6 MiB are one starting bucket.
DDP_CAP_MB = 25
STEPS = auto_mod.WARMUP + auto_mod.MEASURED + 3  # decides at the forward after the measured backwards; DDP rebuilds at the next
# A slow link: 20 MB/s, 1 ms latency, so splitting a 0.6 MiB bucket pays.
SLOW_LINK = {"latency_ns": 1_000_000, "bytes_per_second": 20_000_000, "probe": [], "method": "test"}


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    """What rank 0 remembers stays in the test (conftest gives each test a
    fresh Dynamo and no plans)."""
    monkeypatch.setenv(auto_mod.CACHE_ENV, str(tmp_path))


def _ddp(group, entry=ENTRY, **kwargs):
    return entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=DDP_CAP_MB, **kwargs)


def _train_pair(group, steps=STEPS, options=None, entry=ENTRY, **kwargs):
    """Eager DDP and goddp "auto" from the same weights; each one's losses
    and gradients, and the goddp module."""
    eager = _ddp(group, entry, **kwargs)
    want = train(entry, eager, eager, steps)
    ddp = _ddp(group, entry, **kwargs)
    got = train(entry, ddp, torch.compile(ddp, backend="goddp", options={**AUTO, **(options or {})}), steps)
    return ddp, got, want


def _outcome() -> dict:
    (record,) = [p for p in goddp.last_plans() if p["auto_buckets"] is not None]
    return record["auto_buckets"]


def _rebuilt_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets"), data
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]


def _same_on_every_rank(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    assert all(v == values[0] for v in values), values
    return values[0]


def _assert_trains_as_eager(got, want):
    assert_bitwise(got[0], want[0], "loss")
    assert_bitwise(got[1], want[1], "gradient")


def _fixed(monkeypatch, backward_ns_by_rank, link=SLOW_LINK):
    """Each rank measures backward_ns_by_rank[rank] and every rank the same
    link (the probe is a collective: replaced on every rank alike)."""
    mine = backward_ns_by_rank[rank()]
    monkeypatch.setattr(auto_mod.AutoBuckets, "measured", lambda self: None if mine is None else list(mine))
    monkeypatch.setattr(auto_mod, "probe", lambda ddp, buffers: dict(link))


def _best_caps(backward_ns, unit_bytes, link=SLOW_LINK) -> list[int]:
    best = timeline({
        "backward_ns": backward_ns, "bytes": unit_bytes, "launch_ns": 0, "slowdown_permille": 1000,
        "allreduce": {"latency_ns": link["latency_ns"], "bytes_per_second": link["bytes_per_second"]},
    })
    return [b["bytes"] for b in best["buckets"]]


# --------------------------------------------------------------------------
# Measured, chosen and installed alike on every rank


@needs_two_ranks
def test_auto_measures_and_every_rank_ends_with_the_same_buckets(group):
    """The real path: measured backward and probed allreduces."""
    ddp, got, want = _train_pair(group)
    outcome = _outcome()
    assert outcome["state"] == "decided", outcome
    assert outcome["measured_steps"] == auto_mod.MEASURED
    assert len(outcome["backward_ns"]) == outcome["units"] == len(outcome["unit_bytes"]) >= 3
    assert all(ns > 0 for ns in outcome["backward_ns"])
    assert sum(outcome["unit_bytes"]) == sum(p.numel() * p.element_size() for p in ddp.parameters())
    assert len(outcome["allreduce"]["probe"]) == 3 and outcome["allreduce"]["bytes_per_second"] > 0
    assert 1000 <= outcome["allreduce"]["slowdown_permille"] <= 1000 * auto_mod.MAX_SLOWDOWN
    want_caps = outcome["chosen"]["caps"] if outcome["installed"] else outcome["start"]["caps"]
    assert _rebuilt_sizes(ddp) == want_caps
    # each rank timed its own probe; the MAX allreduce gave every rank the slowest's
    _same_on_every_rank((outcome["installed"], want_caps, outcome["allreduce"]))
    _assert_trains_as_eager(got, want)


@needs_two_ranks
def test_ranks_that_measure_differently_install_rank0s_choice(group, monkeypatch):
    units = 4  # the blocks' head and three blocks
    rank0 = [2_000_000] * units  # 2 ms a unit: worth overlapping on the slow link
    rank1 = [1_000] * units  # 1 us a unit: nothing to overlap, one bucket is best
    _fixed(monkeypatch, [rank0, rank1])
    ddp, got, want = _train_pair(group)
    outcome = _outcome()
    assert outcome["installed"] is True, outcome
    assert outcome["backward_ns"] == rank0
    chosen = outcome["chosen"]["caps"]
    assert chosen == _best_caps(rank0, outcome["unit_bytes"])
    assert chosen != _best_caps(rank1, outcome["unit_bytes"]), "the case must tell rank 0's numbers from rank 1's"
    assert len(chosen) > len(outcome["start"]["caps"]) == 1
    assert outcome["predicted_gain"] >= auto_mod.MARGIN
    assert _rebuilt_sizes(ddp) == chosen
    _same_on_every_rank((chosen, _rebuilt_sizes(ddp)))
    (record,) = [p for p in goddp.last_plans() if p["auto_buckets"] is not None]
    assert record["ddp_buckets"] == {"aligned": True, "reason": None}
    _assert_trains_as_eager(got, want)


@needs_two_ranks
def test_a_rank_that_cannot_measure_keeps_the_start_on_every_rank(group, monkeypatch):
    _fixed(monkeypatch, [[2_000_000] * 4, None])
    ddp, got, want = _train_pair(group)
    outcome = _outcome()
    assert outcome["installed"] is False and outcome["reason"].startswith("rank 1 could not measure"), outcome
    assert _rebuilt_sizes(ddp) == outcome["start"]["caps"] and len(outcome["start"]["caps"]) == 1
    _same_on_every_rank(outcome["reason"])
    _assert_trains_as_eager(got, want)


@needs_two_ranks
@pytest.mark.parametrize("bad", [float("nan"), 0, -5, float("inf")], ids=["nan", "zero", "negative", "inf"])
def test_a_bad_measurement_is_refused_and_training_goes_on(group, monkeypatch, bad):
    _fixed(monkeypatch, [[2_000_000, bad, 2_000_000, 2_000_000], [2_000_000] * 4])
    ddp, got, want = _train_pair(group)
    outcome = _outcome()
    assert outcome["installed"] is False, outcome
    assert "measured unit 1's backward as" in outcome["reason"] and "finite number above 0" in outcome["reason"]
    _same_on_every_rank(outcome["reason"])
    assert len(_rebuilt_sizes(ddp)) == 1, "the starting buckets stay"
    _assert_trains_as_eager(got, want)


@needs_two_ranks
def test_a_rank_slow_while_measuring_decides_with_the_others_on_rank0s_numbers(group):
    """Rank 1's backward sleeps 50 ms in every step: both ranks decide at
    the same step, on rank 0's numbers, and nobody gives up."""
    slow_s = 0.05
    ddp = _ddp(group)
    compiled = torch.compile(ddp, backend="goddp", options=AUTO)
    if rank() == 1:
        first = next(iter(ddp.module.parameters()))
        first.register_hook(lambda grad: time.sleep(slow_s) or grad)
    started = time.monotonic()
    train(ENTRY, ddp, compiled, STEPS)
    elapsed = time.monotonic() - started
    outcome = _outcome()
    assert outcome["state"] == "decided" and "did not all reach" not in str(outcome["reason"]), outcome
    assert sum(outcome["backward_ns"]) < slow_s * 1e9, "rank 0's measurements decide"
    _same_on_every_rank((outcome["installed"], outcome["chosen"]["caps"]))
    assert elapsed < 60, elapsed


@needs_two_ranks
def test_a_rank_that_comes_after_the_bound_keeps_the_start_on_every_rank(group, monkeypatch, caplog):
    """Rank 1 reaches the deciding step 3 s late, past a 1.5 s bound: rank 0
    stops waiting, rank 1 learns so, and both keep the starting buckets and
    train on as eager DDP."""
    eager = _ddp(group)
    want = train(ENTRY, eager, eager, STEPS)
    ddp = _ddp(group)
    compiled = torch.compile(ddp, backend="goddp", options=AUTO)
    deciding = auto_mod.WARMUP + auto_mod.MEASURED  # the step index of the deciding forward

    def inputs_for(step):
        if step == 1:  # the first agreement waited as usual; the deciding round waits 1.5 s
            monkeypatch.setenv("GODDP_PLAN_CHECK_TIMEOUT", "1.5")
        if step == deciding and rank() == 1:
            time.sleep(3)
        return ENTRY.make_inputs(100 * rank() + step)

    with caplog.at_level(logging.WARNING, logger="goddp"):
        got = train(ENTRY, ddp, compiled, STEPS, inputs_for=inputs_for)
    outcome = _outcome()
    assert outcome["installed"] is False and "did not all reach" in outcome["reason"], outcome
    assert any("bucket_cap_mb='auto' decision" in r.getMessage() and "keeps the buckets it started with" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert _rebuilt_sizes(ddp) == outcome["start"]["caps"]
    _same_on_every_rank(outcome["reason"])
    _assert_trains_as_eager(got, want)


@needs_two_ranks
def test_the_same_model_keeps_its_buckets_unless_its_measurements_move(group, monkeypatch):
    """Rank 0 remembers what it measured and chose: a run whose
    measurements are within DRIFT of the last one's ends with the last
    one's buckets, although alone it would choose others; a run that
    measured further apart chooses afresh."""
    first, near, far = [5_700_000] * 4, [6_100_000] * 4, [12_000_000] * 4
    outcomes = []
    for measured in (first, near, far):
        torch._dynamo.reset()
        goddp.clear_plans()
        _fixed(monkeypatch, [measured, [1_000] * 4])
        ddp, got, want = _train_pair(group)
        outcomes.append(_outcome())
        assert _rebuilt_sizes(ddp) == outcomes[-1]["chosen"]["caps"]
        _assert_trains_as_eager(got, want)
    ran, kept, afresh = outcomes
    unit_bytes = ran["unit_bytes"]
    assert all(abs(a - b) <= auto_mod.DRIFT * b for a, b in zip(near, first))
    assert _best_caps(first, unit_bytes) != _best_caps(near, unit_bytes), "alone, the near run would choose otherwise"
    assert "last_run" not in ran and ran["chosen"]["caps"] == _best_caps(first, unit_bytes)
    assert kept["last_run"].startswith("its buckets") and kept["chosen"]["caps"] == ran["chosen"]["caps"]
    assert afresh["last_run"].startswith("chosen afresh: measured more than") and afresh["chosen"]["caps"] == _best_caps(far, unit_bytes)
    _same_on_every_rank([o["chosen"]["caps"] for o in outcomes])


@needs_two_ranks
def test_a_forward_one_rank_alone_runs_moves_no_count(group, monkeypatch):
    """Rank 0 alone runs a forward with gradients on and no backward (a
    prediction logged without no_grad), and rank 1 recompiles for another
    batch size while measuring: the decision still comes at the same
    synchronised step on both."""
    _fixed(monkeypatch, [[2_000_000] * 4, [2_000_000] * 4])
    eager = _ddp(group)
    want = train(ENTRY, eager, eager, STEPS)
    ddp = _ddp(group)
    compiled = torch.compile(ddp, backend="goddp", options=AUTO)

    def inputs_for(step):
        if step == 3 and rank() == 0:
            compiled(*ENTRY.make_inputs(999))  # no backward follows
        inputs = ENTRY.make_inputs(100 * rank() + step)
        if step == 4 and rank() == 1:
            inputs = tuple(x[:1] for x in inputs)  # another batch size: Dynamo compiles again
        return inputs

    losses, _ = train(ENTRY, ddp, compiled, STEPS, inputs_for=inputs_for)
    outcome = _outcome()
    assert outcome["installed"] is True, outcome
    _same_on_every_rank((outcome["chosen"]["caps"], _rebuilt_sizes(ddp)))
    if rank() == 0:  # the other steps match eager DDP's
        assert_bitwise(losses[:4], want[0][:4], "loss")


# --------------------------------------------------------------------------
# The combinations users write


@needs_two_ranks
def test_rank0_evaluating_another_batch_size_first(group, monkeypatch):
    _fixed(monkeypatch, [[2_000_000] * 4, [1_000] * 4])
    eager = _ddp(group)
    want = train(ENTRY, eager, eager, STEPS, evaluate_first=True)
    ddp = _ddp(group)
    got = train(ENTRY, ddp, torch.compile(ddp, backend="goddp", options=AUTO), STEPS, evaluate_first=True)
    outcome = _outcome()
    assert outcome["installed"] is True, outcome
    _same_on_every_rank(_rebuilt_sizes(ddp))
    _assert_trains_as_eager(got, want)


@needs_two_ranks
@pytest.mark.parametrize("max_pieces", [2, 3])
def test_with_max_pieces(group, monkeypatch, max_pieces):
    _fixed(monkeypatch, [[2_000_000] * 8, [1_000] * 8])
    monkeypatch.setattr(auto_mod, "check_durations", _trimmed(auto_mod.check_durations))
    ddp, got, want = _train_pair(group, options={"max_pieces": max_pieces})
    outcome = _outcome()
    (record,) = [p for p in goddp.last_plans() if p["auto_buckets"] is not None]
    assert record["num_pieces"] <= max_pieces
    assert outcome["units"] <= max_pieces and outcome["state"] == "decided", outcome
    # three pieces leave a split worth its margin on the slow link; two may not
    assert outcome["installed"] is True or (max_pieces == 2 and "margin" in outcome["reason"]), outcome
    assert _rebuilt_sizes(ddp) == outcome["chosen" if outcome["installed"] else "start"]["caps"]
    _same_on_every_rank(_rebuilt_sizes(ddp))
    _assert_trains_as_eager(got, want)


def _trimmed(check):
    """The fixed measurements cut to the units the plan has."""
    return lambda values, units: check(list(values)[:units], units)


@needs_two_ranks
@pytest.mark.parametrize("cap_mb", [DDP_CAP_MB, ENTRY.ddp_cap_mb], ids=["one_piece", "pieces"])
def test_with_find_unused_parameters(group, monkeypatch, caplog, cap_mb):
    """DDP never rebuilds its buckets there: auto keeps the starting
    (declaration-order, aligned) buckets, says why, and trains as DDP."""
    eager = ENTRY.wrap(ENTRY.build(seed=0), process_group=group, bucket_cap_mb=cap_mb, find_unused_parameters=True)
    want = train(ENTRY, eager, eager, STEPS)
    ddp = ENTRY.wrap(ENTRY.build(seed=0), process_group=group, bucket_cap_mb=cap_mb, find_unused_parameters=True)
    with caplog.at_level(logging.INFO, logger="goddp"):
        got = train(ENTRY, ddp, torch.compile(ddp, backend="goddp", options=AUTO), STEPS)
    records = [p for p in goddp.last_plans() if p["num_pieces"] > 1]
    assert bool(records) == (cap_mb == ENTRY.ddp_cap_mb), goddp.last_plans()
    if records:  # cut into pieces: the record says why
        assert records[0]["auto_buckets"]["state"] == "off"
        assert "declaration order" in records[0]["auto_buckets"]["reason"]
        assert records[0]["ddp_buckets"] == {"aligned": True, "reason": None}
        assert any("bucket_cap_mb='auto' keeps" in r.getMessage() for r in caplog.records)
    else:  # the whole model is one bucket: one piece, nothing to choose
        assert all(p["num_pieces"] == 1 for p in goddp.last_plans())
        assert [p["auto_buckets"] for p in goddp.last_plans()] == [
            {"state": "off", "reason": "its graph is one piece: no bucket boundary to choose"}
        ] * len(goddp.last_plans())
    _same_on_every_rank(bool(records))
    _assert_trains_as_eager(got, want)


@needs_two_ranks
def test_with_checkpointed_blocks(group, monkeypatch):
    _fixed(monkeypatch, [[2_000_000] * 8, [1_000] * 8])
    monkeypatch.setattr(auto_mod, "check_durations", _trimmed(auto_mod.check_durations))

    def run(compiled_forward):
        model = build_checkpointed("per_block", seed=0)
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=DDP_CAP_MB)
        forward = torch.compile(ddp, backend="goddp", options=AUTO) if compiled_forward else ddp
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        losses, grads = [], []
        for step in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            tokens = make_tokens(100 * rank() + step)
            loss = lm_loss(forward(tokens))
            loss.backward()
            grads.append([p.grad.clone() for p in ddp.parameters()])
            optimizer.step()
            losses.append(loss.detach().clone())
        return ddp, (losses, grads)

    _, want = run(False)
    ddp, got = run(True)
    outcome = _outcome()
    assert outcome["state"] == "decided" and outcome["installed"] is True, outcome
    assert _rebuilt_sizes(ddp) == outcome["chosen"]["caps"]
    _same_on_every_rank(_rebuilt_sizes(ddp))
    _assert_trains_as_eager(got, want)


@pytest.mark.single_process
def test_auto_buckets_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
