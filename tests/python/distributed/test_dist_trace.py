"""goddp.trace: what it records, that it changes nothing, and its errors.

The two-rank cases run inside each rank under torchrun (a plain pytest run
launches this file under torchrun itself, see test_trace_under_torchrun).
The error cases also run in a plain process, on a 1-rank group.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

import goddp
from goddp import tracing
from goddp.ddp.private import current_buckets
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group, under_torchrun
from models import ZOO

ENTRY = ZOO["mlp"]


def make_ddp(group, **kwargs):
    kwargs.setdefault("bucket_cap_mb", ENTRY.ddp_cap_mb)
    return ENTRY.wrap(ENTRY.build(seed=0), process_group=group, **kwargs)


def train(ddp, forward, steps, first_step=0, optimizer=None):
    """`steps` SGD steps; returns the gradients after each step's backward
    (cloned, in parameter order)."""
    optimizer = optimizer or torch.optim.SGD(ddp.parameters(), lr=0.05)
    grads = []
    for step in range(first_step, first_step + steps):
        optimizer.zero_grad(set_to_none=True)
        ENTRY.loss(forward(*ENTRY.make_inputs(100 * rank() + step))).backward()
        grads.append([p.grad.clone() for p in ddp.parameters()])
        optimizer.step()
    return grads


def assert_bitwise_equal(got, want):
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert torch.equal(a, b), f"step {step}, parameter {i}: max diff {(a - b).abs().max().item()}"


def ddp_state(ddp):
    """What goddp.trace must leave as it found it."""
    return {
        "buckets": current_buckets(ddp),
        "hooks": list(ddp._comm_hooks),
        "comm_hook": ddp._get_ddp_logging_data().get("comm_hook"),
        "post_forward": "_post_forward" in ddp.__dict__,
    }


def averaging_hook(calls):
    """A user comm hook that averages like DDP (world size 2: exact) and
    counts its calls per bucket index."""

    def user_hook(state, bucket):
        calls.append(bucket.index())
        work = dist.all_reduce(bucket.buffer().div_(state.size()), group=state, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    return user_hook


# --------------------------------------------------------------------------
# Two ranks


@needs_two_ranks
def test_goddp_ddp_mode_buckets_overlap_and_outputs(group, tmp_path):
    compiles = []

    def inner(gm, example_inputs):
        compiles.append(len(gm.graph.nodes))
        return gm.forward

    ddp = make_ddp(group)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": inner, "mode": "ddp", "log_plan": False})
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    train(ddp, compiled, 3, optimizer=optimizer)  # compile, align, let DDP rebuild its buckets
    compiled_before = len(compiles)
    frames_before = dict(counters["frames"])
    with goddp.trace(compiled) as tr:
        train(ddp, compiled, 3, first_step=3, optimizer=optimizer)
    assert len(compiles) == compiled_before, "tracing made Dynamo recompile"
    # nor did Dynamo convert the trace's own frames (a cost on every step)
    assert dict(counters["frames"]) == frames_before

    plans = goddp.last_plans()
    assert plans and plans[-1]["num_pieces"] > 2, plans
    want = [(b["index"], b["bytes"], sorted(b["param_names"])) for b in plans[-1]["buckets"]]
    steps = tr.to_dict()["steps"]
    assert len(steps) == 3
    for step in steps:
        got = sorted((b["index"], b["bytes"], sorted(b["param_names"])) for b in step["buckets"])
        assert got == want
        stats = tracing.step_stats(step)
        # goddp's pieces launch their buckets while later pieces still run
        assert stats["launched_during_backward"] >= 1, step
        assert min(b["launch_s"] for b in step["buckets"]) < step["compute_end_s"]
        assert step["finalized_s"] >= max(b["done_s"] for b in step["buckets"])

    record = tr.to_dict()
    assert record["goddp_plans"][-1]["fingerprint"] == f"{plans[-1]['fingerprint']:016x}"
    assert record["goddp_plans"][-1]["num_pieces"] == plans[-1]["num_pieces"]
    text = tr.summary()
    assert record["goddp_plans"][-1]["fingerprint"] in text and "launched before backward ended" in text

    path = tmp_path / f"trace{rank()}.json"
    path.write_text(json.dumps(record))
    assert json.loads(path.read_text())["steps"][0]["buckets"]
    png = tr.plot(tmp_path / f"overlap{rank()}.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

    # An eager DDP of the same model has no goddp plan, though the names match.
    eager = make_ddp(group)
    with goddp.trace(eager) as eager_tr:
        train(eager, eager, 1)
    assert eager_tr.to_dict()["goddp_plans"] == []
    assert "goddp plan: none" in eager_tr.summary()

    # Only rank 0 gathers: the other rank's record is read from the store.
    if rank() == 0:
        gathered = tr.to_dict(gather=True)["ranks"]
        assert sorted(gathered) == ["0", "1"]
        assert "rank 1 of DDP ranks" in tr.summary(gather=True)
        assert open(tr.plot(tmp_path / "ranks.png", gather=True), "rb").read(4) == b"\x89PNG"


@needs_two_ranks
def test_find_unused_parameters_buckets_follow_declaration_order_plan(group):
    """Under find_unused_parameters=True DDP keeps its declaration-order
    buckets and goddp gives it caps for that order (goddp.ddp.declaration): the
    buckets the trace sees launch, in launch order, are the plan's buckets,
    whose reverse is the caps goddp handed DDP; gradients stay eager DDP's."""
    plain = make_ddp(group, find_unused_parameters=True)
    want = train(plain, plain, 7)

    ddp = make_ddp(group, find_unused_parameters=True)
    compiled = torch.compile(
        ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False, "strict": True}
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    got = train(ddp, compiled, 2, optimizer=optimizer)  # compile and align
    before = ddp_state(ddp)
    with goddp.trace(compiled) as tr:
        got += train(ddp, compiled, 3, first_step=2, optimizer=optimizer)
    assert ddp_state(ddp) == before  # the fresh reducer keeps the aligned buckets
    got += train(ddp, compiled, 2, first_step=5, optimizer=optimizer)
    assert ddp_state(ddp) == before
    assert_bitwise_equal(got, want)

    plan = goddp.last_plans()[-1]
    assert plan["caps"]["bucket_order"] == "declaration", plan["caps"]
    assert plan["alignment"] == "declaration-order caps", plan
    assert plan["ddp_buckets"]["aligned"] is True, plan["ddp_buckets"]
    assert plan["num_pieces"] > 2 and plan["merged_cuts"] == 0, plan
    want_bytes = [b["bytes"] for b in plan["buckets"]]
    assert len(want_bytes) > 2
    # DDP fills its caps first-declared first: the reverse of launch order.
    assert plan["ddp_caps"] == want_bytes[::-1]
    steps = tr.to_dict()["steps"]
    assert len(steps) == 3
    for step in steps:
        launched = sorted(step["buckets"], key=lambda b: b["launch_s"])
        assert [b["bytes"] for b in launched] == want_bytes, step
        assert [sorted(b["param_names"]) for b in launched] == [sorted(b["param_names"]) for b in plan["buckets"]]
        assert [b["index"] for b in launched] == list(range(len(want_bytes)))


@needs_two_ranks
@pytest.mark.parametrize("as_view", [False, True], ids=["copy", "bucket_view"])
def test_gradients_bit_identical_and_ddp_restored(group, as_view):
    plain = make_ddp(group, gradient_as_bucket_view=as_view)
    want = train(plain, plain, 7)

    ddp = make_ddp(group, gradient_as_bucket_view=as_view)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    got = train(ddp, ddp, 2, optimizer=optimizer)
    before = ddp_state(ddp)
    with goddp.trace(ddp) as tr:
        assert ddp._comm_hooks and ddp._comm_hooks[0][0].__name__ == "goddp_trace_hook"
        got += train(ddp, ddp, 3, first_step=2, optimizer=optimizer)
    assert ddp_state(ddp) == before
    got += train(ddp, ddp, 2, first_step=5, optimizer=optimizer)
    assert_bitwise_equal(got, want)
    assert ddp_state(ddp) == before  # DDP's re-derivation after the fresh reducer's first step
    assert len(tr.to_dict()["steps"]) == 3


@needs_two_ranks
def test_manual_backward_finalization_survives_the_trace(group):
    """The trace's fresh reducers keep what the user set on DDP's (shared
    with goddp's alignment: goddp.ddp.private.rebuild_reducer)."""
    if not hasattr(torch.nn.parallel.DistributedDataParallel, "require_manual_backward_finalization"):
        pytest.skip("this torch has no manual backward finalization")
    ddp = make_ddp(group)
    ddp.require_manual_backward_finalization = True

    def step(seed):
        ddp(*ENTRY.make_inputs(100 * rank() + seed)).float().pow(2).mean().backward()
        ddp.finalize_backward()  # raises if the reducer lost the mode

    step(0)
    with goddp.trace(ddp) as tr:
        step(1)
        step(2)
    step(3)
    assert len(tr.to_dict()["steps"]) == 2


@needs_two_ranks
def test_user_hook_runs_once_per_bucket_and_stays(group):
    plain_calls, calls = [], []
    plain = make_ddp(group)
    plain.register_comm_hook(group, averaging_hook(plain_calls))
    want = train(plain, plain, 6)

    ddp = make_ddp(group)
    ddp.register_comm_hook(group, averaging_hook(calls))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    got = train(ddp, ddp, 2, optimizer=optimizer)
    before = ddp_state(ddp)
    calls.clear()
    with goddp.trace(ddp) as tr:
        got += train(ddp, ddp, 2, first_step=2, optimizer=optimizer)
    steps = tr.to_dict()["steps"]
    assert tr.to_dict()["comm_hook"].endswith("user_hook")
    per_step = len(steps[0]["buckets"])
    assert per_step > 1
    assert sorted(calls) == sorted(list(range(per_step)) * 2), calls
    assert ddp_state(ddp) == before
    calls.clear()
    got += train(ddp, ddp, 2, first_step=4, optimizer=optimizer)
    assert sorted(calls) == sorted(list(range(per_step)) * 2), "the user's hook is gone after the trace"
    assert_bitwise_equal(got, want)


@needs_two_ranks
def test_entering_between_forward_and_backward_with_a_user_hook(group):
    plain = make_ddp(group)
    plain.register_comm_hook(group, averaging_hook([]))
    want = train(plain, plain, 3)

    calls = []
    ddp = make_ddp(group)
    ddp.register_comm_hook(group, averaging_hook(calls))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    got = train(ddp, ddp, 1, optimizer=optimizer)
    optimizer.zero_grad(set_to_none=True)
    loss = ENTRY.loss(ddp(*ENTRY.make_inputs(100 * rank() + 1)))
    with goddp.trace(ddp) as tr:
        loss.backward()  # still DDP's own reducer: the swap waits for the next forward
        got.append([p.grad.clone() for p in ddp.parameters()])
        optimizer.step()
        got += train(ddp, ddp, 1, first_step=2, optimizer=optimizer)
    assert_bitwise_equal(got, want)
    assert len(tr.to_dict()["steps"]) == 1  # the step after the swap


@needs_two_ranks
def test_rank_that_does_not_enter_gets_nobody_traced(dist_group):
    group = short_timeout_group(60)
    ddp = make_ddp(group)
    train(ddp, ddp, 2)
    before = ddp_state(ddp)
    reducer = ddp.reducer
    if rank() == 0:
        with pytest.raises(goddp.TraceError, match=r"waited 2 s at entering the trace .*for rank\(s\) \[1\].*nothing was changed"):
            with goddp.trace(ddp, timeout=2):
                pass
    else:
        # Arrives after rank 0 gave up: the shared decision says no.
        import time

        time.sleep(4)
        with pytest.raises(goddp.TraceError, match="after the others had stopped waiting for it .*2 s after the first arrival"):
            with goddp.trace(ddp, timeout=2):
                pass
    assert ddp.reducer is reducer and ddp_state(ddp) == before
    train(ddp, ddp, 1, first_step=2)  # both ranks still communicate alike


@needs_two_ranks
def test_one_rank_refusing_stops_every_rank(dist_group):
    group = short_timeout_group(60)
    ddp = make_ddp(group)
    if rank() == 1:
        # A built-in hook goddp cannot identify on rank 1 only (its logged
        # name is no BuiltinCommHookType): same numbers as DDP's own allreduce.
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        ddp.logger._set_comm_hook_name("BuiltinCommHookType.NOT_IN_THIS_TORCH")
    train(ddp, ddp, 2)
    before, reducer = ddp_state(ddp), ddp.reducer
    with pytest.raises(goddp.TraceError, match=r"rank 1: a built-in C\+\+ comm hook goddp cannot identify"):
        with goddp.trace(ddp, timeout=30):
            pass
    assert ddp.reducer is reducer and ddp_state(ddp) == before
    train(ddp, ddp, 1, first_step=2)


@needs_two_ranks
def test_ranks_that_leave_apart_keep_the_traced_reducer(dist_group):
    group = short_timeout_group(60)
    ddp = make_ddp(group)
    train(ddp, ddp, 2)
    tr = goddp.trace(ddp, timeout=2)
    tr.__enter__()
    train(ddp, ddp, 1, first_step=2)
    if rank() == 1:
        import time

        time.sleep(4)
    with pytest.raises(goddp.TraceError, match="keeps goddp.trace's pass-through comm hook"):
        tr.close()
    tr.close()  # a second close does not wait again
    # Both ranks still run the same reducer with the same hook, which no
    # longer records.
    assert ddp._comm_hooks[0][0].__name__ == "goddp_trace_hook"
    train(ddp, ddp, 1, first_step=3)
    assert len(tr.to_dict()["steps"]) == 1


@needs_two_ranks
def test_leaving_between_forward_and_backward_still_reduces(group):
    plain = make_ddp(group)
    want = train(plain, plain, 3)

    ddp = make_ddp(group)
    got = train(ddp, ddp, 2)
    with goddp.trace(ddp):
        loss = ENTRY.loss(ddp(*ENTRY.make_inputs(100 * rank() + 2)))
    ddp.zero_grad(set_to_none=True)
    loss.backward()  # on the fresh reducer, armed as DDP's forward armed the old one
    got.append([p.grad.clone() for p in ddp.parameters()])
    # no optimizer step after the last: compare the gradients only
    assert_bitwise_equal(got[2:], want[2:])


# --------------------------------------------------------------------------
# Errors (any number of ranks): clear message, nothing changed


def test_non_ddp_module_is_refused(dist_group):
    model = ENTRY.build(seed=0)
    with pytest.raises(goddp.TraceError, match="needs a DistributedDataParallel module.*MLPStack"):
        goddp.trace(model)
    with pytest.raises(goddp.TraceError, match="needs a DistributedDataParallel"):
        goddp.trace(torch.compile(model))


def test_tracing_twice_at_once_is_refused(dist_group):
    ddp = make_ddp(dist.group.WORLD)
    train(ddp, ddp, 1)
    with goddp.trace(ddp) as tr:
        inside = ddp_state(ddp)
        with pytest.raises(goddp.TraceError, match="already being traced"):
            with goddp.trace(ddp):
                pass
        assert ddp_state(ddp) == inside
        train(ddp, ddp, 1, first_step=1)
    assert len(tr.to_dict()["steps"]) == 1


def test_unknown_builtin_comm_hook_is_refused(dist_group):
    """(A known one is traced: test_dist_builtin_hooks.py.)"""
    ddp = make_ddp(dist.group.WORLD)
    ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    ddp.logger._set_comm_hook_name("BuiltinCommHookType.NOT_IN_THIS_TORCH")
    before, reducer = ddp_state(ddp), ddp.reducer
    with pytest.raises(goddp.TraceError, match="built-in C\\+\\+ comm hook goddp cannot identify.*nothing was changed"):
        with goddp.trace(ddp):
            pass
    assert ddp.reducer is reducer and ddp_state(ddp) == before


def test_traced_find_unused_parameters_model_lists_its_plan(dist_group):
    """Plan records name their DDP module, and the trace finds its plans by
    that name. Under find_unused_parameters=True the caps goddp gives DDP run
    in declaration order, the reverse of the plan's buckets: a match by caps
    would miss the plan. A second DDP of the same model, compiled by goddp
    too, lists only its own plan."""
    options = {"inner": "aot_eager", "log_plan": False, "strict": True}
    ddp = make_ddp(dist.group.WORLD, find_unused_parameters=True)
    compiled = torch.compile(ddp, backend="goddp", options=options)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    train(ddp, compiled, 2, optimizer=optimizer)  # compile and align
    plan = goddp.last_plans()[-1]
    assert plan["alignment"] == "declaration-order caps", plan
    assert plan["ddp_caps"] != [b["bytes"] for b in plan["buckets"]], plan  # the case a match by caps missed
    other = make_ddp(dist.group.WORLD)
    other_compiled = torch.compile(other, backend="goddp", options={**options, "max_pieces": 2})
    train(other, other_compiled, 1)
    assert len(goddp.last_plans()) == 2
    with goddp.trace(compiled) as tr:
        train(ddp, compiled, 1, first_step=2, optimizer=optimizer)
    fingerprint = f"{plan['fingerprint']:016x}"
    assert [p["fingerprint"] for p in tr.to_dict()["goddp_plans"]] == [fingerprint]
    assert f"goddp plan {fingerprint}" in tr.summary()
    with goddp.trace(other_compiled) as other_tr:
        train(other, other_compiled, 1, first_step=1)
    assert [p["fingerprint"] for p in other_tr.to_dict()["goddp_plans"]] == [
        f"{goddp.last_plans()[-1]['fingerprint']:016x}"
    ]


def test_bad_options_are_refused(dist_group):
    ddp = make_ddp(dist.group.WORLD)
    with pytest.raises(ValueError, match="timeout must be positive"):
        goddp.trace(ddp, timeout=0)
    with pytest.raises(ValueError, match="max_steps must be at least 1"):
        goddp.trace(ddp, max_steps=0)


def test_step_stats_arithmetic():
    step = {
        "compute_end_s": 1.0,
        "finalized_s": 1.6,
        "buckets": [
            {"index": 0, "bytes": 100, "params": 1, "launch_s": 0.2, "done_s": 0.7},
            {"index": 1, "bytes": 300, "params": 1, "launch_s": 0.6, "done_s": 1.2},
            {"index": 2, "bytes": 100, "params": 1, "launch_s": 0.99, "done_s": 1.5},
        ],
    }
    stats = tracing.step_stats(step)
    assert stats["exposed_s"] == pytest.approx(0.5)
    assert stats["comm_busy_s"] == pytest.approx(1.3)  # 0.2 .. 1.5 without gaps
    assert stats["overlapped"] == pytest.approx(0.8 / 1.3)
    assert stats["launched_during_backward"] == 2  # the last one came in the final 5%
    assert tracing.verdict([step]) == "2 of 3 buckets launched before backward ended; 38% of communication exposed"


@pytest.mark.single_process
def test_trace_under_torchrun():
    """Plain pytest: run this file's cases under torchrun, 2 ranks."""
    if under_torchrun():
        pytest.skip("already inside torchrun")
    assert_file_passes_under_torchrun(__file__, timeout=540)
