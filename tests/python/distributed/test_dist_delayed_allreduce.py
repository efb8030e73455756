"""DDP's delay_all_reduce_named_params under goddp.

DDP counts the delayed parameters among those it ignores: they bypass its
reducer (one allreduce of their own, launched by a gradient hook on
param_to_hook_all_reduce), so goddp plans the buckets of the parameters DDP
reduces in backward and leaves the delayed ones to DDP; rebuilding the
reducer leaves the delayed allreduce's hook and buffer alone. Inside each
of two ranks (pytest under torchrun, gloo, CPU), the bench's kind of model
(a stack of transformer blocks) trains with goddp (aot_eager) and as eager
DDP with the same delayed parameters: losses and gradients equal bitwise,
DDP's rebuilt buckets are the plan's and hold no delayed parameter, for a
delayed head, a delayed parameter inside a repeated block, and delayed
parameters scattered over blocks and head, also when rank 0 first evaluates another batch size (both
wrapping orders); goddp.trace times the buckets of the rest and changes no
number. A plain pytest run launches this file under torchrun
itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import goddp
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks
from _zoo_training import assert_bitwise, train
from models import ZOO

ENTRY = ZOO["blocks"]
OPTIONS = {"inner": "aot_eager", "strict": True, "log_plan": False}
STEPS = 4
# (delayed parameter names, the parameter whose gradient hook launches
# their allreduce). DDP launches it from a hook that runs before that
# parameter's own gradient is accumulated, never waits on it, and reduces
# the buffer as it is then: the hooked parameter must be one whose
# gradient is ready after every delayed one's (here blocks.0's, the last in
# backward, eager and compiled), or eager DDP itself reduces part of them.
CASES = {
    "head": (["head.weight", "head.bias"], "blocks.0.norm1.weight"),
    "in_a_block": (["blocks.1.qkv.weight"], "blocks.0.norm1.weight"),
    "scattered": (["blocks.2.mlp.up.weight", "blocks.2.mlp.up.bias", "blocks.1.norm2.weight", "head.bias"],
                  "blocks.0.qkv.weight"),
}


def _ddp(group, case, compile_inside=False):
    model = ENTRY.build(seed=0)
    if compile_inside:
        model = torch.compile(model, backend="goddp", options=OPTIONS)
    names, hooked = _names(case, compile_inside)
    params = dict(model.named_parameters())
    delayed = [(n, params[n]) for n in names]
    return ENTRY.wrap(model, process_group=group, bucket_cap_mb=ENTRY.ddp_cap_mb,
                      delay_all_reduce_named_params=delayed, param_to_hook_all_reduce=params[hooked])


def _names(case, compile_inside=False):
    """The case's delayed names and hooked name, as DDP names them (a
    compiled module's with its prefix)."""
    prefix = "_orig_mod." if compile_inside else ""
    names, hooked = CASES[case]
    return [prefix + n for n in names], prefix + hooked


def _compiled(ddp):
    return torch.compile(ddp, backend="goddp", options=OPTIONS)


def _train(ddp, forward, group, steps=STEPS, **kwargs):
    """DDP never waits on the delayed allreduce: a barrier does, before the
    gradients are read."""
    return train(ENTRY, ddp, forward, steps, barrier_group=group, **kwargs)


def _ddp_bucket_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets")
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]


def _assert_aligned(ddp, case, compile_inside=False) -> dict:
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans, goddp.last_plans()
    plan = plans[0]
    assert plan["fallback"] is None and plan["num_pieces"] > 2, plan
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert _ddp_bucket_sizes(ddp) == [b["bytes"] for b in plan["buckets"]]
    planned = {n for b in plan["buckets"] for n in b["param_names"]}
    delayed = set(_names(case, compile_inside)[0])
    assert not planned & delayed and planned | delayed == {n for n, _ in ddp.module.named_parameters()}
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, _ddp_bucket_sizes(ddp))
    assert all(s == sizes[0] for s in sizes), sizes
    return plan


@needs_two_ranks
@pytest.mark.parametrize("case", list(CASES))
def test_delayed_parameters_are_left_to_ddp_and_the_rest_aligns(group, case):
    fresh()
    eager = _ddp(group, case)
    want_losses, want_grads = _train(eager, eager, group)
    ddp = _ddp(group, case)
    reducer = ddp.reducer
    losses, grads = _train(ddp, _compiled(ddp), group)
    assert ddp.reducer is not reducer
    _assert_aligned(ddp, case)
    assert _ddp_bucket_sizes(ddp) != _ddp_bucket_sizes(eager), "the case must move DDP's buckets"
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    # the delayed allreduce still ran: the delayed gradients agree across ranks
    names = set(_names(case)[0])
    delayed = [p.grad for n, p in ddp.module.named_parameters() if n in names]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, delayed)
    assert all(torch.equal(a, b) for other in gathered for a, b in zip(other, delayed))
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("order", ["compile(DDP(m))", "DDP(compile(m))"])
def test_rank0_evaluating_another_batch_size_first_still_aligns(group, order):
    case = "in_a_block"
    fresh()
    eager = _ddp(group, case)
    want_losses, want_grads = _train(eager, eager, group, evaluate_first=True)
    inside = order == "DDP(compile(m))"
    ddp = _ddp(group, case, compile_inside=inside)
    losses, grads = _train(ddp, ddp if inside else _compiled(ddp), group, evaluate_first=True)
    plan = _assert_aligned(ddp, case, inside)
    assert plan["plan_check"]["size"] == 2
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    fresh()


@needs_two_ranks
def test_trace_times_the_buckets_of_the_parameters_ddp_reduces_in_backward(group):
    case = "scattered"
    fresh()
    plain = _ddp(group, case)
    _, want = _train(plain, _compiled(plain), group, steps=STEPS + 2)
    fresh()
    ddp = _ddp(group, case)
    compiled = _compiled(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    _, got = _train(ddp, compiled, group, optimizer=optimizer)
    plan = _assert_aligned(ddp, case)
    with goddp.trace(compiled) as tr:
        got += _train(ddp, compiled, group, steps=2, first=STEPS, optimizer=optimizer)[1]
    assert_bitwise(got, want, "gradient")  # the trace changes no number
    buckets = sorted((b["index"], b["bytes"], sorted(b["param_names"])) for b in plan["buckets"])
    steps = tr.to_dict()["steps"]
    assert len(steps) == 2
    for step in steps:
        assert sorted((b["index"], b["bytes"], sorted(b["param_names"])) for b in step["buckets"]) == buckets
    fresh()


@pytest.mark.single_process
def test_delayed_allreduce_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
