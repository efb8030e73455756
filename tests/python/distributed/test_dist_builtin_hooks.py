"""DDP's built-in (C++) comm hooks under goddp (Note [Built-in comm hooks]
in goddp.ddp.private).

A DDP module with ``_register_builtin_comm_hook(ALLREDUCE or FP16_COMPRESS)``
is cut and aligned: goddp registers the same built-in hook on the reducer it
rebuilds. Inside each of two ranks (pytest under torchrun, gloo, CPU), the
bench's kind of model (a stack of transformer blocks) trains with goddp
(aot_eager) and as eager DDP with the same hook: losses and weights equal
bitwise (both hooks are elementwise: the buckets do not change a number),
DDP's rebuilt buckets are the plan's, and the rebuilt reducer holds the
hook (DDP refuses to register a second one); with gradient_as_bucket_view,
in both wrapping orders when rank 0 first evaluates another batch size, and
under find_unused_parameters (declaration-order caps). goddp.trace times a built-in
hook's buckets through its Python replica and changes no number. A name in
DDP's logging data that no built-in hook of this torch has is still refused
(the trace's refusal: test_dist_trace.py).
A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import goddp
from goddp.ddp import refusals
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks
from _zoo_training import assert_bitwise, train
from models import ZOO

ENTRY = ZOO["blocks"]
HOOKS = [dist.BuiltinCommHookType.ALLREDUCE, dist.BuiltinCommHookType.FP16_COMPRESS]
HOOK_IDS = [h.name for h in HOOKS]
VIEWS = [False, True]
VIEW_IDS = ["copy", "bucket_view"]
OPTIONS = {"inner": "aot_eager", "strict": True, "log_plan": False}
STEPS = 4


def _ddp(group, hook, compile_inside=False, **kwargs):
    """DDP of the model with hook; compile_inside: DDP(compile(m))."""
    model = ENTRY.build(seed=0)
    if compile_inside:
        model = torch.compile(model, backend="goddp", options=OPTIONS)
    ddp = ENTRY.wrap(model, process_group=group, bucket_cap_mb=ENTRY.ddp_cap_mb, **kwargs)
    if hook is not None:
        ddp._register_builtin_comm_hook(hook)
    return ddp


def _train(ddp, forward, steps=STEPS, **kwargs):
    return train(ENTRY, ddp, forward, steps, **kwargs)


def _compiled(ddp):
    return torch.compile(ddp, backend="goddp", options=OPTIONS)


def _ddp_bucket_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    sizes = data["rebuilt_bucket_sizes"] if data.get("has_rebuilt_buckets") else data["bucket_sizes"]
    return [int(s) for s in sizes.split(", ")]


def _assert_hook_on_reducer(ddp, hook) -> None:
    """DDP's reducer holds a comm hook (a second registration is refused)
    and its logging data names hook."""
    assert ddp._get_ddp_logging_data().get("comm_hook") == str(hook)
    assert not ddp._comm_hooks
    with pytest.raises(RuntimeError, match="once"):
        dist._register_builtin_comm_hook(ddp.reducer, hook)


def _assert_aligned(ddp) -> dict:
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans, goddp.last_plans()
    plan = plans[0]
    assert plan["fallback"] is None and plan["num_pieces"] > 2, plan
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert _ddp_bucket_sizes(ddp) == [b["bytes"] for b in plan["buckets"]]
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, _ddp_bucket_sizes(ddp))
    assert all(s == sizes[0] for s in sizes), sizes
    return plan


# --------------------------------------------------------------------------
# Aligned, and trains as eager DDP with the same hook


@needs_two_ranks
@pytest.mark.parametrize("as_view", VIEWS, ids=VIEW_IDS)
@pytest.mark.parametrize("hook", HOOKS, ids=HOOK_IDS)
def test_a_builtin_hook_is_registered_again_on_the_aligned_reducer(group, hook, as_view):
    fresh()
    eager = _ddp(group, hook, gradient_as_bucket_view=as_view)
    want_losses, want_grads = _train(eager, eager)
    ddp = _ddp(group, hook, gradient_as_bucket_view=as_view)
    losses, grads = _train(ddp, _compiled(ddp))
    _assert_aligned(ddp)
    assert _ddp_bucket_sizes(ddp) != _ddp_bucket_sizes(eager), "the case must move DDP's buckets"
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    _assert_hook_on_reducer(ddp, hook)
    if hook == dist.BuiltinCommHookType.FP16_COMPRESS:
        # the hook changes the numbers: without it they would differ
        plain = _ddp(group, None, gradient_as_bucket_view=as_view)
        _, plain_grads = _train(plain, plain, steps=1)
        assert any(not torch.equal(a, b) for a, b in zip(plain_grads[0], want_grads[0]))
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("order", ["compile(DDP(m))", "DDP(compile(m))"])
@pytest.mark.parametrize("hook", HOOKS, ids=HOOK_IDS)
def test_rank0_evaluating_another_batch_size_first_still_aligns(group, hook, order):
    fresh()
    eager = _ddp(group, hook)
    want_losses, want_grads = _train(eager, eager, evaluate_first=True)
    inside = order == "DDP(compile(m))"
    ddp = _ddp(group, hook, compile_inside=inside)
    losses, grads = _train(ddp, ddp if inside else _compiled(ddp), evaluate_first=True)
    plan = _assert_aligned(ddp)
    assert plan["plan_check"]["size"] == 2
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    _assert_hook_on_reducer(ddp, hook)
    fresh()


@needs_two_ranks
def test_a_builtin_hook_under_find_unused_parameters_aligns_in_declaration_order(group):
    hook = dist.BuiltinCommHookType.FP16_COMPRESS
    fresh()
    eager = _ddp(group, hook, find_unused_parameters=True)
    want_losses, want_grads = _train(eager, eager)
    ddp = _ddp(group, hook, find_unused_parameters=True)
    losses, grads = _train(ddp, _compiled(ddp))
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans and plans[0]["alignment"].startswith("declaration-order caps"), plans
    assert plans[0]["ddp_buckets"] == {"aligned": True, "reason": None}, plans[0]["ddp_buckets"]
    # DDP never rebuilds here: its buckets are the caps' (declaration order)
    assert _ddp_bucket_sizes(ddp) == plans[0]["ddp_caps"][::-1]
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    _assert_hook_on_reducer(ddp, hook)
    fresh()


# --------------------------------------------------------------------------
# goddp.trace


@needs_two_ranks
@pytest.mark.parametrize("hook", HOOKS, ids=HOOK_IDS)
def test_trace_times_a_builtin_hooks_buckets_and_changes_no_number(group, hook):
    fresh()
    plain = _ddp(group, hook)
    _, want = _train(plain, _compiled(plain), steps=6)
    fresh()
    ddp = _ddp(group, hook)
    compiled = _compiled(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    _, got = _train(ddp, compiled, steps=3, optimizer=optimizer)
    plan = _assert_aligned(ddp)
    with goddp.trace(compiled) as tr:
        got += _train(ddp, compiled, steps=2, first=3, optimizer=optimizer)[1]
        assert ddp._comm_hooks[0][0].__name__ == "goddp_trace_hook"  # the replica, in the hook's place
    _assert_hook_on_reducer(ddp, hook)
    got += _train(ddp, compiled, steps=1, first=5, optimizer=optimizer)[1]
    assert_bitwise(got, want, "gradient")  # the replica computes what the C++ hook does
    record = tr.to_dict()
    assert record["comm_hook"] == f"DDP's built-in {hook.name}, timed as its Python replica"
    buckets = [(b["index"], b["bytes"], sorted(b["param_names"])) for b in plan["buckets"]]
    assert len(record["steps"]) == 2
    for step in record["steps"]:
        assert sorted((b["index"], b["bytes"], sorted(b["param_names"])) for b in step["buckets"]) == buckets
        assert all(b["done_s"] >= b["launch_s"] for b in step["buckets"])
    _assert_hook_on_reducer(ddp, hook)
    fresh()


# --------------------------------------------------------------------------
# A built-in hook goddp cannot identify (any number of ranks)


def _unknown_builtin(group):
    """A DDP whose logging data names a built-in hook no
    BuiltinCommHookType of this torch has (what a newer torch's hook would
    look like); the hook on its reducer is ALLREDUCE."""
    ddp = _ddp(group, dist.BuiltinCommHookType.ALLREDUCE)
    ddp.logger._set_comm_hook_name("BuiltinCommHookType.NOT_IN_THIS_TORCH")
    return ddp


def test_an_unknown_builtin_hook_keeps_ddp_buckets_and_trains_as_eager_ddp(dist_group):
    group = dist.group.WORLD
    fresh()
    eager = _unknown_builtin(group)
    want_losses, want_grads = _train(eager, eager)
    ddp = _unknown_builtin(group)
    assert refusals.unknown_builtin_comm_hook(ddp) == "BuiltinCommHookType.NOT_IN_THIS_TORCH"
    reducer = ddp.reducer
    losses, grads = _train(ddp, _compiled(ddp))
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["ddp_buckets"] == {
        "aligned": False, "reason": "a built-in comm hook that goddp cannot identify is registered"}
    assert ddp.reducer is reducer  # never rebuilt: the hook stays
    assert_bitwise(losses, want_losses, "loss")
    assert_bitwise(grads, want_grads, "gradient")
    fresh()


def test_known_builtin_hooks_refuse_nothing(dist_group):
    for hook in HOOKS:
        ddp = _ddp(dist.group.WORLD, hook)
        facts, why = refusals.alignment_facts(ddp)
        assert why is None and facts.builtin_comm_hook is False
        assert refusals.trace_refusal(ddp) is None


@pytest.mark.single_process
def test_builtin_hooks_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
