"""Ranks that do not do the same thing: goddp never stalls or kills training.

Each case is a situation from issue 7 that broke goddp, run inside each of
two ranks (pytest under torchrun, gloo, CPU) with goddp's default settings
(the inner compiler aside) and no timeout override. Nobody may wait for a
rank that will not come: goddp's wait is bounded by the DDP group's timeout,
so a wait of that kind fails the case with RanksMissingError, and the
group's short timeout turns a collective that never pairs up into an error
instead of a hang.

The nanoGPT-shaped case (rank-0-only evaluation before the first step) is
test_dist_example_nanogpt.py. A plain pytest run launches this file under
torchrun itself.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._dynamo.backends.registry import lookup_backend

import goddp
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group
from goddp.ddp.align import ALIGNED_CAPS_ATTR
from models import ZOO

STEPS = 3
GROUP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def group(dist_group):
    return short_timeout_group(GROUP_TIMEOUT_S)


def _batch(seed: int, rows: int = 8) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed))


def _train(ddp, forward, batches, after_backward=lambda: None):
    """SGD with momentum over batches; returns each step's loss."""
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = forward(x).float().pow(2).mean()
        loss.backward()
        after_backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return losses


def _eager_and_goddp(name, process_group, batches, options, setup=lambda ddp: None, finalize=False):
    """Trains zoo model `name` as eager DDP and as goddp-compiled DDP from
    the same weights on the same batches; returns (eager ddp, its losses,
    compiled ddp, its losses)."""
    entry = ZOO[name]
    runs = []
    for compile_it in (False, True):
        torch._dynamo.reset()
        goddp.clear_plans()
        ddp = entry.wrap(entry.build(seed=0), process_group=process_group, bucket_cap_mb=entry.ddp_cap_mb)
        setup(ddp)
        forward = torch.compile(ddp, backend="goddp", options=options) if compile_it else ddp
        after = ddp.finalize_backward if finalize else (lambda: None)
        runs += [ddp, _train(ddp, forward, batches, after)]
    return runs


def _assert_same_training(eager, eager_losses, compiled, compiled_losses):
    for step, (got, want) in enumerate(zip(compiled_losses, eager_losses)):
        assert torch.equal(got, want), f"step {step}: loss {got.item()!r} != eager DDP {want.item()!r}"
    for (key, want), got in zip(eager.module.state_dict().items(), compiled.module.state_dict().values()):
        assert torch.equal(got, want), f"{key} differs from eager DDP"


def _gather(value, group):
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


class FailsOnRank:
    """aot_eager, except that compile number `call` (1-based) raises on
    global rank `on_rank`."""

    def __init__(self, on_rank: int, call: int) -> None:
        self.on_rank, self.call, self.calls = on_rank, call, 0
        self._inner = lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        self.calls += 1
        if rank() == self.on_rank and self.calls == self.call:
            raise RuntimeError("piece compile failed on purpose on this rank")
        return self._inner(gm, example_inputs)


# --------------------------------------------------------------------------
# Issue 7, situation 2: a piece compile fails on one rank only.


@needs_two_ranks
def test_a_fallback_on_one_rank_keeps_ddp_buckets_on_every_rank(group, caplog):
    batches = [_batch(100 * rank() + s) for s in range(STEPS)]
    with caplog.at_level(logging.WARNING, logger="goddp"):
        eager, eager_losses, ddp, losses = _eager_and_goddp(
            "mlp", group, batches, {"inner": FailsOnRank(on_rank=1, call=2)}
        )
    _assert_same_training(eager, eager_losses, ddp, losses)
    (plan,) = goddp.last_plans()
    assert (plan["fallback"] is not None) == (rank() == 1)
    assert plan["ddp_buckets"]["aligned"] is False
    assert not hasattr(ddp, ALIGNED_CAPS_ATTR)
    reason = plan["ddp_buckets"]["reason"]
    assert "rank 1:" in reason and "fallback: compiling piece 1" in reason, reason
    assert "rank 0:" in reason and "proposes DDP buckets" in reason, reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("DDP keeps its own buckets on all 2 rank(s)" in w and "rank 1:" in w for w in warnings), warnings
    # both ranks decided the same, from the same statements
    decisions = _gather((plan["plan_check"]["aligned"], plan["plan_check"]["ranks"]), group)
    assert decisions[0] == decisions[1]


@needs_two_ranks
def test_no_rank_aligns_once_ddp_has_rebuilt_its_buckets(group):
    """Eager DDP steps before the first compiled one: DDP has rebuilt its
    buckets, and rank 1 falls back, so the ranks disagree. No rank may swap
    its reducer then (a rank that had swapped would start from DDP's initial
    buckets while the others kept the rebuilt ones): since issue 16 nobody
    installs before the ranks decided (Note [Agreeing on DDP's layout]).
    Both ranks decline alike and train like eager DDP."""
    batches = [_batch(100 * rank() + s) for s in range(4)]
    entry = ZOO["mlp"]
    runs = []
    for compile_it in (False, True):
        torch._dynamo.reset()
        goddp.clear_plans()
        ddp = entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=entry.ddp_cap_mb)
        losses = _train(ddp, ddp, batches[:2])
        forward = torch.compile(ddp, backend="goddp", options={"inner": FailsOnRank(on_rank=1, call=2)}) if compile_it else ddp
        runs += [ddp, losses + _train(ddp, forward, batches[2:])]
    _assert_same_training(*runs)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is False
    assert not hasattr(runs[2], ALIGNED_CAPS_ATTR)
    reason = plan["ddp_buckets"]["reason"]
    assert "rank 1:" in reason and "fallback: compiling piece 1" in reason, reason
    assert len(set(_gather(reason, group))) == 1


# --------------------------------------------------------------------------
# Issue 7, situation 3: an uneven last batch recompiles on one rank only.


@needs_two_ranks
def test_an_uneven_last_batch_recompiles_on_one_rank_without_waiting_or_rebucketing(group):
    rows = [8] * STEPS + [5 if rank() == 1 else 8]
    batches = [_batch(100 * rank() + s, n) for s, n in enumerate(rows)]
    eager, eager_losses, ddp, losses = _eager_and_goddp("mlp", group, batches, {"inner": "aot_eager"})
    _assert_same_training(eager, eager_losses, ddp, losses)
    plans = goddp.last_plans()
    assert len(plans) == (2 if rank() == 1 else 1), plans
    first = plans[0]
    assert first["ddp_buckets"]["aligned"] is True
    assert first["plan_check"]["size"] == 2
    caps = tuple(first["plan_check"]["caps"])
    assert getattr(ddp, ALIGNED_CAPS_ATTR) == caps
    if rank() == 1:
        # the recompiled graph followed the decision: no exchange, no re-bucketing
        assert plans[1]["plan_check"]["followed"]
        assert "seconds" not in plans[1]["plan_check"]
    assert len(set(map(tuple, _gather(list(caps), group)))) == 1


# --------------------------------------------------------------------------
# Issue 7, situation 4: DDP over per-rank process groups, a different model
# on each rank (pipeline stages).


@needs_two_ranks
def test_ddp_over_per_rank_groups_with_different_models_trains(group):
    per_rank = [dist.new_group([r], backend="gloo") for r in range(dist.get_world_size())]
    name = "mlp" if rank() == 0 else "transformer"
    entry = ZOO[name]
    batches = [entry.make_inputs(100 * rank() + s)[0] for s in range(STEPS)]
    eager, eager_losses, ddp, losses = _eager_and_goddp(name, per_rank[rank()], batches, {"inner": "aot_eager"})
    _assert_same_training(eager, eager_losses, ddp, losses)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is True
    # compared within DDP's own group: this rank alone
    assert plan["plan_check"]["size"] == 1 and [r["rank"] for r in plan["plan_check"]["ranks"]] == [rank()]
    fingerprints = _gather(plan["fingerprint"], group)
    assert fingerprints[0] != fingerprints[1]


# --------------------------------------------------------------------------
# Issue 7, situation 5: manual backward finalization (torch 2.15).


@needs_two_ranks
def test_manual_backward_finalization_survives_aligning(group):
    if not hasattr(torch.nn.parallel.DistributedDataParallel, "require_manual_backward_finalization"):
        pytest.skip("this torch has no manual backward finalization")

    def setup(ddp):
        ddp.require_manual_backward_finalization = True

    batches = [_batch(100 * rank() + s) for s in range(STEPS)]
    eager, eager_losses, ddp, losses = _eager_and_goddp(
        "mlp", group, batches, {"inner": "aot_eager"}, setup=setup, finalize=True
    )
    _assert_same_training(eager, eager_losses, ddp, losses)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is True
    assert getattr(ddp, ALIGNED_CAPS_ATTR) == tuple(plan["plan_check"]["caps"])
    assert ddp.require_manual_backward_finalization


# --------------------------------------------------------------------------
# A rank that never comes to the first training step.


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(48, 48) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


@needs_two_ranks
def test_a_rank_that_never_comes_is_named(group, monkeypatch):
    """Here alone a wait is shortened (GODDP_PLAN_CHECK_TIMEOUT): rank 1
    builds the DDP module but trains it only after rank 0 gave up."""
    monkeypatch.setenv("GODDP_PLAN_CHECK_TIMEOUT", "3")
    torch._dynamo.reset()
    # a group of its own, so that no later case shares its store keys
    lonely = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Stack(), process_group=lonely, bucket_cap_mb=0.01)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    if rank() == 0:
        for _ in range(2):  # and at every later call
            with pytest.raises(RuntimeError, match=r"for rank\(s\) \[1\], which never arrived"):
                compiled(torch.randn(4, 48))
    dist.barrier(group=group)
    # rank 1 comes at last: it stops too, where it would have trained alone
    if rank() == 1:
        with pytest.raises(RuntimeError, match=r"after the others had stopped waiting for it \(gave up: rank 0\)"):
            compiled(torch.randn(4, 48))
    dist.barrier(group=group)


@pytest.mark.single_process
def test_rank_safety_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, cases_per_rank=6, timeout=480)
