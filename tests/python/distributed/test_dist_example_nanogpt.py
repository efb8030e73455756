"""The nanoGPT-shaped example (examples/nanogpt_ddp.py) under two ranks.

``DDP(torch.compile(gpt, backend="goddp"))`` with rank 0 alone evaluating
under no_grad before the first step (and again mid-training), and gradient
accumulation: rank 0 compiles an evaluation graph that rank 1 never sees.
Issue 7 measured a 300 s stall at the first step there. The ranks must agree
on DDP's buckets at the first training call without anyone waiting for a
graph that another rank will not compile, and train exactly as eager DDP
does, with goddp's default settings (the inner compiler aside) and no
timeout override.

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest
import torch

import goddp
from _dist_util import REPO_ROOT, assert_file_passes_under_torchrun, fresh, needs_two_ranks, rank
from goddp.ddp.state import state_of

EXAMPLE = REPO_ROOT / "examples" / "nanogpt_ddp.py"


def _example():
    spec = importlib.util.spec_from_file_location("nanogpt_ddp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _eager_then_compiled(group, **settings):
    """The example trained eagerly, then compiled with goddp (fresh Dynamo
    and plan records between), with TrainConfig settings; both results,
    whose losses and evaluations must be equal."""
    example = _example()
    config = example.TrainConfig(inner="aot_eager", **settings)
    quiet = lambda *_: None  # noqa: E731
    eager = example.train(dataclasses.replace(config, compile=False), process_group=group, log=quiet)
    fresh()
    compiled = example.train(config, process_group=group, log=quiet)
    assert compiled["losses"] == eager["losses"]
    assert compiled["evaluations"] == eager["evaluations"]
    return eager, compiled


@needs_two_ranks
def test_rank0_only_evaluation_before_the_first_step(group):
    _, compiled = _eager_then_compiled(group, iters=3, eval_interval=2)
    assert len(compiled["evaluations"]) == (2 if rank() == 0 else 0)
    plans = goddp.last_plans()
    # Graphs compiled with gradients disabled take no part in any agreement.
    evaluation = [p for p in plans if p["plan_check"] is None]
    training = [p for p in plans if p["plan_check"] is not None]
    assert len(evaluation) == (1 if rank() == 0 else 0), plans
    (plan,) = training
    assert plan["num_pieces"] > 1
    assert plan["ddp_buckets"]["aligned"] is True
    assert plan["plan_check"]["size"] == 2
    assert {r["fingerprint"] for r in plan["plan_check"]["ranks"]} == {f"{plan['fingerprint']:016x}"}
    assert state_of(compiled["model"]).aligned_caps == tuple(plan["plan_check"]["caps"])
    torch._dynamo.reset()


@needs_two_ranks
def test_bf16_weights_with_float32_norms_are_aligned_per_group(group):
    """--bf16-weights: two dtype groups in every block. DDP's buckets close
    where goddp's plan says in both groups (Note [Several dtype groups] in
    planner/keys.go), and training is eager DDP's, with rank 0 evaluating
    first and gradient accumulation."""
    _, compiled = _eager_then_compiled(group, iters=4, eval_interval=3, bf16_weights=True)
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["alignment"] == "ready-order caps per dtype group"
    ddp = compiled["model"]
    module = ddp.module._orig_mod
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16, torch.float32}
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    rebuilt = sorted(sorted(names[id(p)] for p in b.parameters()) for b in ddp.reducer._get_zeros_like_grad_buckets())
    assert rebuilt == sorted(sorted(b["param_names"]) for b in plan["buckets"])
    torch._dynamo.reset()


@needs_two_ranks
def test_bf16_weights_under_find_unused_parameters_are_aligned_in_declaration_order(group):
    """--bf16-weights --find-unused-parameters (the Hugging Face Trainer's
    DDP setting): DDP keeps the buckets it fills in declaration order, each
    group apart (Note [Declaration order per group] in
    planner/declorder.go); they are the plan's, in its order, and training
    is eager DDP's."""
    _, compiled = _eager_then_compiled(group, iters=4, eval_interval=3, bf16_weights=True,
                                       find_unused_parameters=True)
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["alignment"] == "declaration-order caps per dtype group"
    ddp = compiled["model"]
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    buckets = [sorted(names[id(p)] for p in b.parameters()) for b in ddp.reducer._get_zeros_like_grad_buckets()]
    assert buckets == [sorted(b["param_names"]) for b in plan["buckets"]]
    torch._dynamo.reset()


@pytest.mark.single_process
def test_example_under_torchrun():
    """Plain pytest: run this file's two-rank case under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=300)
