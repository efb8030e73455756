"""DDP's static_graph=True under goddp (Note [Static graph across a
rebuild] in goddp.ddp.private).

A static-graph DDP module is cut and aligned: goddp sets static_graph again
on the reducer it rebuilds, which records its first iteration afresh
(counting gradients, one delayed allreduce at the end of that backward) and
rebuilds its buckets to goddp's caps. Inside each of two ranks (pytest
under torchrun, gloo, CPU), the bench's kind of model (a stack of
transformer blocks) trains with goddp (aot_eager) and as eager DDP with
static_graph: losses and gradients equal bitwise and DDP's rebuilt buckets
are the plan's, with copied gradients and bucket views, in both wrapping
orders when rank 0 first evaluates another batch size, after eager steps
(the fresh reducer repeats the recording iteration), and with per-block
activation checkpointing. goddp.trace times a static-graph module's
buckets and changes no number; leaving it between a forward and its
backward is refused on every rank, which keep its pass-through hook and
train on. A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import goddp
from goddp.ddp import refusals
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks, rank
from checkpoint_models import build as build_checkpointed
from checkpoint_models import lm_loss, make_tokens
from _zoo_training import assert_bitwise, train
from models import ZOO

ENTRY = ZOO["blocks"]
OPTIONS = {"inner": "aot_eager", "strict": True, "log_plan": False}
STEPS = 4  # static graph rebuilds DDP's buckets after its second iteration


def _ddp(group, compile_inside=False, **kwargs):
    model = ENTRY.build(seed=0)
    if compile_inside:
        model = torch.compile(model, backend="goddp", options=OPTIONS)
    return ENTRY.wrap(model, process_group=group, bucket_cap_mb=ENTRY.ddp_cap_mb, static_graph=True, **kwargs)


def _compiled(ddp):
    return torch.compile(ddp, backend="goddp", options=OPTIONS)


def _train(ddp, forward, steps=STEPS, **kwargs):
    return train(ENTRY, ddp, forward, steps, **kwargs)


def _ddp_bucket_sizes(ddp, rebuilt=True) -> list[int]:
    """DDP's buckets' bytes: rebuilt (static graph rebuilds after its
    second iteration), or, rebuilt=False, as the reducer has them (a
    reducer the trace rebuilt starts with the buckets of the one before)."""
    data = ddp._get_ddp_logging_data()
    if not rebuilt and not data.get("has_rebuilt_buckets"):
        return [int(s) for s in data["bucket_sizes"].split(", ")]
    assert data.get("has_rebuilt_buckets"), "static graph rebuilds its buckets after its second iteration"
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]


def _assert_aligned(ddp, rebuilt=True) -> dict:
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans, goddp.last_plans()
    plan = plans[0]
    assert plan["fallback"] is None and plan["num_pieces"] > 2, plan
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert _ddp_bucket_sizes(ddp, rebuilt) == [b["bytes"] for b in plan["buckets"]]
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, _ddp_bucket_sizes(ddp, rebuilt))
    assert all(s == sizes[0] for s in sizes), sizes
    return plan


def _assert_static(ddp) -> None:
    """The reducer goddp rebuilt runs static graph: DDP's logging data says
    so, and DDP refuses to set it a second time on it."""
    assert ddp.static_graph and ddp._get_ddp_logging_data().get("static_graph") == 1
    with pytest.raises(RuntimeError, match="set_static_graph"):
        ddp.reducer._set_static_graph()


# --------------------------------------------------------------------------
# Aligned, and trains as eager DDP with static_graph


@needs_two_ranks
@pytest.mark.parametrize("as_view", [False, True], ids=["copy", "bucket_view"])
def test_static_graph_aligns_and_trains_as_eager_ddp(group, as_view):
    fresh()
    eager = _ddp(group, gradient_as_bucket_view=as_view)
    want_losses, want_grads = _train(eager, eager)
    ddp = _ddp(group, gradient_as_bucket_view=as_view)
    reducer = ddp.reducer
    losses, grads = _train(ddp, _compiled(ddp))
    assert ddp.reducer is not reducer
    _assert_aligned(ddp)
    assert _ddp_bucket_sizes(ddp) != _ddp_bucket_sizes(eager), "the case must move DDP's buckets"
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    _assert_static(ddp)
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("order", ["compile(DDP(m))", "DDP(compile(m))"])
def test_rank0_evaluating_another_batch_size_first_still_aligns(group, order):
    fresh()
    eager = _ddp(group)
    want_losses, want_grads = _train(eager, eager, evaluate_first=True)
    inside = order == "DDP(compile(m))"
    ddp = _ddp(group, compile_inside=inside)
    losses, grads = _train(ddp, ddp if inside else _compiled(ddp), evaluate_first=True)
    plan = _assert_aligned(ddp)
    assert plan["plan_check"]["size"] == 2
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    _assert_static(ddp)
    fresh()


@needs_two_ranks
def test_a_module_that_trained_eagerly_first_records_again_and_aligns(group):
    """Two eager steps (DDP's static graph recorded and rebuilt its
    buckets), then compiled: the fresh reducer records a first iteration
    again, its delayed allreduce reduces that step, and it rebuilds to the
    caps."""
    fresh()
    eager = _ddp(group)
    optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    want_losses, want_grads = _train(eager, eager, steps=2 + STEPS, optimizer=optimizer)
    ddp = _ddp(group)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses, grads = _train(ddp, ddp, steps=2, optimizer=optimizer)
    more = _train(ddp, _compiled(ddp), steps=STEPS, first=2, optimizer=optimizer)
    _assert_aligned(ddp)
    assert_bitwise(losses + more[0], want_losses, "loss")
    assert_bitwise(grads + more[1], want_grads, "gradient")
    _assert_static(ddp)
    fresh()


# --------------------------------------------------------------------------
# static_graph with per-block activation checkpointing


@needs_two_ranks
def test_static_graph_with_per_block_checkpoints_trains_as_eager_ddp(group):
    def wrap():
        model = build_checkpointed("per_block", "transformer")
        return torch.nn.parallel.DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=0.05, static_graph=True)

    def train(ddp, forward):
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        losses, grads = [], []
        for step in range(STEPS):
            optimizer.zero_grad(set_to_none=True)
            loss = lm_loss(forward(make_tokens(100 * rank() + step)))
            loss.backward()
            grads.append([p.grad.clone() for p in ddp.parameters()])
            optimizer.step()
            losses.append(loss.detach().clone())
        return losses, grads

    fresh()
    eager = wrap()
    want_losses, want_grads = train(eager, eager)
    ddp = wrap()
    losses, grads = train(ddp, torch.compile(ddp, backend="goddp", options={**OPTIONS, "edges": "eager"}))
    plan = _assert_aligned(ddp)
    assert plan["num_pieces"] == 6, plan["pieces"]  # embedding, 4 blocks, head
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    _assert_static(ddp)
    fresh()


# --------------------------------------------------------------------------
# goddp.trace


@needs_two_ranks
@pytest.mark.parametrize("user_hook", [False, True], ids=["default", "user_hook"])
def test_trace_times_a_static_graph_modules_buckets_and_changes_no_number(group, user_hook):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def make():
        ddp = _ddp(group)
        if user_hook:
            ddp.register_comm_hook(group, allreduce_hook)
        return ddp

    fresh()
    plain = make()
    _, want = _train(plain, _compiled(plain), steps=STEPS + 4)
    fresh()
    ddp = make()
    assert refusals.trace_refusal(ddp) is None
    compiled = _compiled(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    _, got = _train(ddp, compiled, optimizer=optimizer)
    plan = _assert_aligned(ddp)
    with goddp.trace(compiled) as tr:
        got += _train(ddp, compiled, steps=2, first=STEPS, optimizer=optimizer)[1]
    got += _train(ddp, compiled, steps=2, first=STEPS + 2, optimizer=optimizer)[1]
    assert_bitwise(got, want, "gradient")
    assert [h for h, _ in ddp._comm_hooks] == ([allreduce_hook] if user_hook else [])
    record = tr.to_dict()
    buckets = [(b["index"], b["bytes"], sorted(b["param_names"])) for b in plan["buckets"]]
    assert len(record["steps"]) == 2
    for i, step in enumerate(record["steps"]):
        seen = [(b["index"], b["bytes"], sorted(b["param_names"])) for b in step["buckets"]]
        if user_hook and i == 0:
            # The trace's fresh reducer records its first iteration, whose
            # delayed allreduce hands every bucket to the hook as index 0
            # (torch's GradBucket.index() there): the same buckets.
            assert {b[0] for b in seen} == {0}
            assert sorted(b[1:] for b in seen) == sorted(b[1:] for b in buckets)
        else:
            assert sorted(seen) == buckets
    _assert_aligned(ddp, rebuilt=False)  # the reducer after the trace keeps the aligned buckets
    _assert_static(ddp)
    fresh()


@needs_two_ranks
def test_leaving_a_static_graph_trace_between_forward_and_backward_is_refused(group):
    """A reducer rebuilt there would have no _DDPSink to queue its delayed
    allreduce (Note [Static graph across a rebuild]): every rank refuses to
    leave, keeps the trace's pass-through hook, and trains on as before."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def make():
        ddp = _ddp(group)
        ddp.register_comm_hook(group, allreduce_hook)
        return ddp

    fresh()
    plain = make()
    _, want = _train(plain, _compiled(plain), steps=6)
    fresh()
    ddp = make()
    compiled = _compiled(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    _, got = _train(ddp, compiled, steps=3, optimizer=optimizer)
    optimizer.zero_grad(set_to_none=True)
    with pytest.raises(goddp.TraceError, match=r"backward has not \(static_graph=True\)"):
        with goddp.trace(compiled):
            out = compiled(*ENTRY.make_inputs(100 * rank() + 3))
    ENTRY.loss(out).backward()
    got.append([p.grad.clone() for p in ddp.parameters()])
    optimizer.step()
    got += _train(ddp, compiled, steps=2, first=4, optimizer=optimizer)[1]
    assert_bitwise(got, want, "gradient")
    assert ddp._comm_hooks[0][0].__name__ == "goddp_trace_hook"
    _assert_static(ddp)
    fresh()


@pytest.mark.single_process
def test_static_graph_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
