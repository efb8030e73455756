"""Ranks that do not do the same thing: goddp never stalls or kills training.

Each case is a situation from issue 7 that broke goddp, run inside each of
two ranks (pytest under torchrun, gloo, CPU) with goddp's default settings
(the inner compiler aside) and no timeout override, except where a rank
is missing from the agreement on purpose. goddp's wait is bounded (half
the DDP group's timeout); a rank that gave up keeps DDP's buckets and so
does every other (Note [A round given up] in goddp.ranks.verdict), and the
group's short timeout turns a collective that never pairs up into an error
instead of a hang.

The nanoGPT-shaped case (rank-0-only evaluation before the first step) is
test_dist_example_nanogpt.py. A plain pytest run launches this file under
torchrun itself.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group
from goddp.ddp.state import state_of
from goddp.ranks.store_round import TIMEOUT_ENV
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
    assert state_of(ddp).aligned_caps is None
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
    assert state_of(runs[2]).aligned_caps is None
    reason = plan["ddp_buckets"]["reason"]
    assert "rank 1:" in reason and "fallback: compiling piece 1" in reason, reason
    assert len(set(_gather(reason, group))) == 1


# --------------------------------------------------------------------------
# A rank that does not come to the agreement (Note [A round given up]).


class SlowOnRank:
    """aot_eager, except that the first compile on global rank `on_rank`
    first sleeps `seconds` (a rank still compiling while the others wait:
    every piece compiles before the agreement)."""

    def __init__(self, on_rank: int, seconds: float) -> None:
        self.on_rank, self.seconds, self.slept = on_rank, seconds, False
        self._inner = lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        if rank() == self.on_rank and not self.slept:
            self.slept = True
            time.sleep(self.seconds)
        return self._inner(gm, example_inputs)


@needs_two_ranks
@pytest.mark.parametrize("late", ["never", "slow"])
def test_a_rank_missing_from_the_agreement_leaves_every_rank_on_ddps_buckets(group, monkeypatch, caplog, late):
    """never: rank 1 runs the DDP module eagerly (as when Dynamo runs the
    frame eagerly on one rank only), so it never comes; slow: rank 1 comes
    after rank 0 stopped waiting. Rank 0 gives up after the bounded wait and
    trains on with DDP's buckets, which still pair with rank 1's; every
    compiled rank keeps DDP's buckets, and training equals eager DDP."""
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    # a group of its own: the round rank 1 never comes to must not be one
    # that a later case's ranks count in
    group = short_timeout_group(60)
    batches = [_batch(100 * rank() + s) for s in range(STEPS)]
    entry = ZOO["mlp"]
    runs = []
    with caplog.at_level(logging.WARNING, logger="goddp"):
        for compile_it in (False, True):
            torch._dynamo.reset()
            goddp.clear_plans()
            ddp = entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=entry.ddp_cap_mb)
            forward = ddp
            if compile_it and (late == "slow" or rank() == 0):
                inner = SlowOnRank(on_rank=1, seconds=5) if late == "slow" else "aot_eager"
                forward = torch.compile(ddp, backend="goddp", options={"inner": inner, "log_plan": False})
            runs += [ddp, _train(ddp, forward, batches)]
    _assert_same_training(*runs)
    assert state_of(runs[2]).aligned_caps is None
    if late == "never" and rank() == 1:
        assert goddp.last_plans() == []
        return
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is False, plan["ddp_buckets"]
    reason = plan["ddp_buckets"]["reason"]
    assert "every rank keeps DDP's own buckets and trains on" in reason, reason
    if rank() == 0:
        assert "rank(s) [1] did not come to the agreement within the bounded wait" in reason, reason
        assert any("waited" in r.getMessage() and "[1]" in r.getMessage() for r in caplog.records), caplog.text
    else:
        assert "rank 0 stopped waiting before this rank had seen every rank's statement" in reason, reason


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
    assert state_of(ddp).aligned_caps == caps
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
    assert state_of(ddp).aligned_caps == tuple(plan["plan_check"]["caps"])
    assert ddp.require_manual_backward_finalization


# --------------------------------------------------------------------------
# Ranks that declare the same parameters in another order, under
# find_unused_parameters=True (DDP's buckets then follow declaration order).

DECLARED_WIDTH = 128


class Declared(torch.nn.Module):
    """Six equal layers used in order l0..l5 but declared in `order`: ranks
    that declare them differently pass DDP's shape check yet bucket
    differently under find_unused_parameters=True."""

    def __init__(self, order) -> None:
        super().__init__()
        for k in order:
            self.add_module(f"l{k}", torch.nn.Linear(DECLARED_WIDTH, DECLARED_WIDTH))

    def forward(self, x):
        for k in range(6):
            x = torch.relu(getattr(self, f"l{k}")(x))
        return x


def _declared_ddp(group):
    torch.manual_seed(0)
    order = list(range(6)) if rank() == 0 else [5, 0, 1, 2, 3, 4]
    return DDP(Declared(order), process_group=group, bucket_cap_mb=0.06, find_unused_parameters=True)


@needs_two_ranks
def test_ranks_that_declare_differently_keep_ddps_buckets(group, caplog):
    """DDP's declaration-order buckets are computed on each rank and never
    compared; caps that differ between ranks would pair different
    allreduces. The positions reach the layout the ranks compare, so no rank
    installs caps: each says what differs and DDP keeps its own buckets."""
    ddp = _declared_ddp(group)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    with caplog.at_level(logging.WARNING, logger="goddp"):
        compiled(torch.randn(4, DECLARED_WIDTH)).sum().backward()
    assert state_of(ddp).aligned_caps is None
    assert any("layouts differ" in r.getMessage() for r in caplog.records), caplog.text


@needs_two_ranks
def test_ranks_that_declare_differently_stop_under_strict(group):
    """With strict=True the same difference is an error on every rank,
    raised before any allreduce."""
    ddp = _declared_ddp(group)
    options = {"inner": "aot_eager", "log_plan": False, "strict": True}
    compiled = torch.compile(ddp, backend="goddp", options=options)
    with pytest.raises(Exception, match="different layouts") as raised:
        compiled(torch.randn(4, DECLARED_WIDTH))
    assert type(raised.value).__name__ == "PlanMismatchError"
    assert state_of(ddp).aligned_caps is None


@pytest.mark.single_process
def test_rank_safety_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=480)
