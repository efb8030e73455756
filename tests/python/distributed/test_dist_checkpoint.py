"""Activation checkpointing on two ranks (Note [Checkpoint bodies]).

Inside each rank (pytest under torchrun, 2 ranks, gloo, CPU): a checkpointed
language model (tests/python/checkpoint_models.py) trains a few SGD steps as
eager DDP and as DDP compiled with goddp, with the same checkpointing and
different batches per rank; losses and final weights must be equal bit for
bit (aot_eager). A checkpoint around the whole stack, split into one region
per block, launches its buckets during backward (goddp.trace); so does one
checkpoint around a stack of dissimilar layers, split into one region per
bucket.

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import pytest
import torch

import goddp
from goddp import tracing
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group
from checkpoint_models import build, build_one, lm_loss, make_tokens

STEPS = 3
CAP_MB = 0.05
CASES = [("per_block", "transformer"), ("whole", "transformer"), ("wrapper", "residual"), ("halves", "residual")]


@pytest.fixture(scope="module")
def group(dist_group):
    return short_timeout_group(120)


def train(ddp, forward, steps=STEPS, first=0):
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(first, first + steps):
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(forward(make_tokens(100 * rank() + step)))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return losses


def wrap(group, how, block):
    return torch.nn.parallel.DistributedDataParallel(build(how, block), process_group=group, bucket_cap_mb=CAP_MB)


@needs_two_ranks
@pytest.mark.parametrize(("how", "block"), CASES, ids=[f"{h}-{b}" for h, b in CASES])
def test_checkpointed_training_equals_eager_ddp(group, how, block):
    eager = wrap(group, how, block)
    eager_losses = train(eager, eager)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = wrap(group, how, block)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "strict": True, "log_plan": False})
    losses = train(ddp, compiled)
    (plan,) = goddp.last_plans()
    assert plan["fallback"] is None and plan["ddp_buckets"]["aligned"], plan
    # embedding, 4 blocks, head; the blocks compiled once
    assert (plan["num_pieces"], plan["distinct_pieces"], plan["eager_pieces"]) == (6, 3, 2), plan["pieces"]
    for step, (got, want) in enumerate(zip(losses, eager_losses)):
        assert torch.equal(got, want), f"step {step}: {got.item()!r} != eager {want.item()!r}"
    want = eager.module.state_dict()
    for key, value in ddp.module.state_dict().items():
        assert torch.equal(value, want[key]), key


@needs_two_ranks
def test_split_whole_stack_launches_buckets_during_backward(group):
    ddp = wrap(group, "whole", "transformer")
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    train(ddp, compiled, 2)  # compile, align, let DDP rebuild its buckets
    with goddp.trace(compiled) as tr:
        train(ddp, compiled, 3, first=2)
    (plan,) = goddp.last_plans()
    assert len(plan["buckets"]) >= 3, plan["buckets"]
    steps = tr.to_dict()["steps"]
    assert len(steps) == 3
    for step in steps:
        stats = tracing.step_stats(step)
        assert stats["launched_during_backward"] >= 2, stats


@needs_two_ranks
def test_bucket_split_checkpoint_equals_eager_and_overlaps(group):
    def wrap_one():
        return torch.nn.parallel.DistributedDataParallel(build_one("stack"), process_group=group, bucket_cap_mb=CAP_MB)

    eager = wrap_one()
    # as goddp below: two steps, then three with a new optimizer
    eager_losses = train(eager, eager, 2) + train(eager, eager, 3, first=2)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = wrap_one()
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "strict": True, "log_plan": False})
    losses = train(ddp, compiled, 2)  # compile, align, let DDP rebuild its buckets
    with goddp.trace(compiled) as tr:
        losses += train(ddp, compiled, 3, first=2)
    (plan,) = goddp.last_plans()
    assert plan["fallback"] is None and plan["ddp_buckets"]["aligned"], plan
    # the checkpoint's parameters are spread over several buckets
    body = [b for b in plan["buckets"] if any(n.startswith("body.") for n in b["param_names"])]
    assert len(body) >= 2, plan["buckets"]
    for step in tr.to_dict()["steps"]:
        stats = tracing.step_stats(step)
        assert stats["launched_during_backward"] >= 2, stats
    for step, (got, want) in enumerate(zip(losses, eager_losses)):
        assert torch.equal(got, want), f"step {step}: {got.item()!r} != eager {want.item()!r}"
    want = eager.module.state_dict()
    for key, value in ddp.module.state_dict().items():
        assert torch.equal(value, want[key]), key


@pytest.mark.single_process
def test_checkpoint_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, cases_per_rank=len(CASES) + 2, timeout=540)
