"""Activation checkpointing on two ranks (Note [Checkpoint bodies]).

Inside each rank (pytest under torchrun, 2 ranks, gloo, CPU): a checkpointed
language model (tests/python/checkpoint_models.py) trains a few SGD steps as
eager DDP and as DDP compiled with goddp, with the same checkpointing and
different batches per rank; losses and final weights must be equal bit for
bit (aot_eager). A checkpoint around the whole stack, split into one region
per block, launches its buckets during backward (goddp.trace); so does one
checkpoint around a stack of dissimilar layers, split into one region per
bucket; and, under find_unused_parameters=True, per-block checkpoints over
a bucket, split at their buckets.

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import pytest
import torch

import goddp
from goddp import tracing
from _fx_util import CountingCompiler
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank
from checkpoint_models import build, build_one, lm_loss, make_tokens

STEPS = 3
CAP_MB = 0.05
CASES = [("per_block", "transformer"), ("whole", "transformer"), ("wrapper", "residual"), ("halves", "residual")]


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



def assert_trained_as_eager(losses, eager_losses, ddp, eager) -> None:
    """Every step's loss and every final weight bitwise equal to eager DDP's."""
    for step, (got, want) in enumerate(zip(losses, eager_losses)):
        assert torch.equal(got, want), f"step {step}: {got.item()!r} != eager {want.item()!r}"
    want = eager.module.state_dict()
    for key, value in ddp.module.state_dict().items():
        assert torch.equal(value, want[key]), key


@needs_two_ranks
@pytest.mark.parametrize(("how", "block"), CASES, ids=[f"{h}-{b}" for h, b in CASES])
def test_checkpointed_training_equals_eager_ddp(group, how, block):
    eager = wrap(group, how, block)
    eager_losses = train(eager, eager)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = wrap(group, how, block)
    # the edges eager whatever they cost (the residual toy's are a measurable
    # share of its step, so "auto" compiles them: Note [Edge costs])
    options = {"inner": "aot_eager", "strict": True, "log_plan": False, "edges": "eager"}
    compiled = torch.compile(ddp, backend="goddp", options=options)
    losses = train(ddp, compiled)
    (plan,) = goddp.last_plans()
    assert plan["fallback"] is None and plan["ddp_buckets"]["aligned"], plan
    # embedding, 4 blocks, head; the blocks compiled once
    assert (plan["num_pieces"], plan["distinct_pieces"], plan["eager_pieces"]) == (6, 3, 2), plan["pieces"]
    assert_trained_as_eager(losses, eager_losses, ddp, eager)


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
    assert_trained_as_eager(losses, eager_losses, ddp, eager)


@needs_two_ranks
def test_find_unused_per_block_checkpoints_split_at_buckets(group):
    """find_unused_parameters=True (every parameter used): declaration
    order, so the planner cuts by bytes, not at the blocks, and each
    per-block checkpoint over a bucket is split at its buckets; DDP's
    buckets are set to the pieces on both ranks and training is eager
    DDP's bit for bit."""
    cap = 0.01  # each TransformerBlock (width 64) holds about 0.13 MiB

    def wrap_unused():
        model = build("per_block", "transformer")
        return torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=cap, find_unused_parameters=True
        )

    eager = wrap_unused()
    eager_losses = train(eager, eager)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = wrap_unused()
    counting = CountingCompiler()
    compiled = torch.compile(ddp, backend="goddp", options={"inner": counting, "strict": True, "log_plan": False})
    losses = train(ddp, compiled)
    (plan,) = goddp.last_plans()
    assert plan["fallback"] is None and plan["ddp_buckets"]["aligned"], plan
    assert plan["alignment"].startswith("declaration"), plan["alignment"]
    calls = sum(
        1 for gm in counting.graphs for n in gm.graph.nodes if n.target is torch.ops.higher_order.tag_activation_checkpoint
    )
    # checkpoint calls compiled: kept whole, the 4 blocks compile as 2 (a
    # reused block piece); split, their regions make more than 4
    assert calls > 4, calls
    assert_trained_as_eager(losses, eager_losses, ddp, eager)


@pytest.mark.single_process
def test_checkpoint_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=540)
