"""align_buckets: goddp sets DDP's own buckets to the pieces it cut (see
goddp.ddp.align), and leaves DDP alone, saying why, where that is not safe."""

from __future__ import annotations

import ast
import copy
import gc
import pathlib
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.ddp.align import install_bucket_caps
from goddp.ddp.refusals import alignment_facts
from goddp.ddp.state import ATTR, ModuleState, state_of
from goddp.native.plan import AlignmentFacts
from models import ZOO, SquareStack


@pytest.fixture(autouse=True)
def _group(dist_group):
    return dist_group


def Stack(width: int = 128, depth: int = 6) -> nn.Module:
    return SquareStack(width, depth)


def _recording_hook(seen: list):
    def hook(state, bucket):
        seen.append(sorted(bucket.parameters(), key=id))
        # Average, as DDP's own reduction does.
        work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    return hook


def _rebuilt_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets"), data
    return [int(x) for x in data["rebuilt_bucket_sizes"].split(", ")]


def test_installed_caps_make_ddp_rebuild_exactly_those_buckets_and_keep_comm_hooks():
    """The mechanism on eager DDP: caps installed inside DDP's forward are
    the buckets DDP rebuilds, and a user's comm hook survives the new reducer."""
    torch.manual_seed(0)
    model = Stack()
    ddp = DDP(model, bucket_cap_mb=0.25)
    seen: list = []
    ddp.register_comm_hook(None, _recording_hook(seen))
    per_layer = (128 * 128 + 128) * 4
    caps = [2 * per_layer, 3 * per_layer, per_layer]
    assert alignment_facts(ddp) == (AlignmentFacts(), None)  # nothing refuses alignment

    installed = []
    model.register_forward_pre_hook(lambda mod, args: installed.append(install_bucket_caps(ddp, caps)))
    for _ in range(3):
        seen.clear()
        ddp(torch.randn(4, 128)).sum().backward()
    assert installed == [True, False, False]  # idempotent once in place
    assert state_of(ddp).aligned_caps == tuple(caps)
    assert _rebuilt_sizes(ddp) == caps
    # The hook saw every bucket of the last iteration, each of the right size.
    assert [sum(p.numel() * 4 for p in params) for params in seen] == caps


def test_goddp_plans_and_ddp_agree_and_gradients_stay_exact():
    torch.manual_seed(0)
    base = Stack()
    eager = DDP(Stack(), bucket_cap_mb=0.125)
    eager.module.load_state_dict(base.state_dict())
    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    ddp.module.load_state_dict(base.state_dict())
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    for step in range(3):
        x = torch.randn(4, 128, generator=torch.Generator().manual_seed(step))
        eager.zero_grad()
        ddp.zero_grad()
        eager(x).square().sum().backward()
        compiled(x).square().sum().backward()
        for a, b in zip(eager.parameters(), ddp.parameters()):
            assert torch.equal(a.grad, b.grad)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] and plan["num_pieces"] >= 3
    assert _rebuilt_sizes(ddp) == [b["bytes"] for b in plan["buckets"]]


@pytest.mark.parametrize(
    ("ddp_kwargs", "options", "reason"),
    [
        ({}, {"align_buckets": False}, "align_buckets=False"),
        ({}, {"mode": "torch"}, "mode='torch'"),
    ],
)
def test_ddp_keeps_its_own_buckets_where_goddp_cannot_set_them(ddp_kwargs, options, reason):
    torch.manual_seed(0)
    ddp = DDP(Stack(), bucket_cap_mb=0.125, **ddp_kwargs)
    before = ddp.reducer
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False, **options})
    compiled(torch.randn(4, 128)).sum().backward()
    (plan,) = goddp.last_plans()
    assert plan["num_pieces"] > 1
    assert plan["ddp_buckets"]["aligned"] is False
    assert reason in plan["ddp_buckets"]["reason"]
    assert ddp.reducer is before and state_of(ddp).aligned_caps is None


def test_a_graph_break_leaves_ddp_buckets_alone_until_the_next_training_call(monkeypatch):
    """Each frame holds only part of DDP's parameters, while DDP buckets the
    whole model: per-frame caps cannot describe that. The planner says so in
    the one call that plans each frame (planner/decide.go,
    ReasonPartOfForward): the plan is the aligned one, not handed to DDP. The
    first step leaves DDP's buckets alone; the next one plans both frames
    together (goddp.ranks.forward, Note [Graphs of one forward])."""
    calls = []
    real = goddp.compile.pipeline.call_planner
    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", lambda *a: calls.append(a) or real(*a))
    entry = ZOO["graph_break"]
    ddp = entry.wrap(entry.build(), bucket_cap_mb=entry.ddp_cap_mb)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    entry.loss(compiled(*entry.make_inputs(0))).backward()
    plans = goddp.last_plans()
    assert len(plans) == 2 and len(calls) == 2
    for plan in plans:
        assert plan["ddp_buckets"]["aligned"] is False
    assert "of DDP's" in plans[1]["ddp_buckets"]["reason"]
    assert "next training call" in plans[0]["ddp_buckets"]["reason"]
    assert state_of(ddp).aligned_caps is None
    entry.loss(compiled(*entry.make_inputs(1))).backward()
    plans = goddp.last_plans()
    assert [p["forward"]["position"] for p in plans] == [0, 1]
    assert all(p["ddp_buckets"]["aligned"] is True for p in plans)
    assert state_of(ddp).aligned_caps is not None


def _failing_first_init(ddp, failures: int):
    """Makes DDP's reducer construction fail `failures` times, then work."""
    real = ddp._ddp_init_helper
    calls = []

    def init_helper(*args, **kwargs):
        calls.append(1)
        if len(calls) <= failures:
            raise RuntimeError("injected reducer failure")
        return real(*args, **kwargs)

    ddp._ddp_init_helper = init_helper
    return calls


def test_a_failed_install_puts_a_working_reducer_back():
    """Rebuilding the reducer with goddp's caps fails: DDP gets a reducer with
    its own settings back (its hooks keep reducing gradients), goddp warns and
    the plan record says the buckets were not aligned."""
    torch.manual_seed(0)
    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    seen: list = []
    ddp.register_comm_hook(None, _recording_hook(seen))
    calls = _failing_first_init(ddp, failures=1)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    reference = Stack()
    reference.load_state_dict(ddp.module.state_dict())
    x = torch.randn(4, 128)
    compiled(x).sum().backward()
    reference(x).sum().backward()
    assert len(calls) == 2  # goddp's caps, then DDP's own
    assert seen, "no bucket was reduced: the reducer lost its hooks"
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is False
    assert "injected reducer failure" in plan["ddp_buckets"]["reason"]
    assert state_of(ddp).aligned_caps is None


def test_losing_the_reducer_stops_training_at_every_call():
    """If DDP's reducer cannot be rebuilt at all, gradients would never be
    reduced: every step must fail loudly instead of training on silently,
    not only the first."""
    torch.manual_seed(0)
    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    _failing_first_init(ddp, failures=2)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False})
    for _ in range(3):
        with pytest.raises(Exception, match="DDP can no longer reduce gradients"):
            compiled(torch.randn(4, 128))


def _compiled(ddp, **options):
    return torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False, **options})


def _train_twins(setup, steps=3, after_backward=lambda ddp: None, device="cpu", **options):
    """Eager DDP and goddp-compiled DDP from the same weights, each prepared
    by setup(ddp), trained with SGD on the same batches; returns both."""
    torch.manual_seed(0)
    base = Stack()
    twins = []
    for compile_it in (False, True):
        model = Stack().to(device)
        model.load_state_dict(base.state_dict())
        ddp = DDP(model, bucket_cap_mb=0.125)
        optimizer = setup(ddp)
        run = _compiled(ddp, **options) if compile_it else ddp
        for step in range(steps):
            x = torch.randn(4, 128, generator=torch.Generator().manual_seed(step)).to(device)
            run(x).square().sum().backward()
            after_backward(ddp)
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
        twins.append(ddp)
    return twins


def _assert_same_parameters(eager, compiled):
    for (name, a), b in zip(eager.module.named_parameters(), compiled.module.parameters()):
        assert torch.equal(a, b), name


def test_manual_backward_finalization_survives_the_rebuild():
    """torch 2.15's require_manual_backward_finalization lives in the C++
    reducer; the rebuilt one must keep it, or finalize_backward() raises."""
    if not hasattr(DDP, "require_manual_backward_finalization"):
        pytest.skip("this torch has no manual backward finalization")

    def setup(ddp):
        ddp.require_manual_backward_finalization = True
        return torch.optim.SGD(ddp.parameters(), lr=0.01)

    eager, compiled = _train_twins(setup, after_backward=lambda ddp: ddp.finalize_backward())
    _assert_same_parameters(eager, compiled)
    assert state_of(compiled).aligned_caps
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"]
    assert _rebuilt_sizes(compiled) == [b["bytes"] for b in plan["buckets"]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="DDP's optimizer-in-backward needs an accelerator stream")
def test_optimizer_in_backward_survives_the_rebuild():
    """An optimizer applied in backward is a comm hook plus a mode of the
    C++ reducer (set at DDP's first forward); both must carry over."""
    from torch.distributed.optim import _apply_optimizer_in_backward

    def setup(ddp):
        _apply_optimizer_in_backward(torch.optim.SGD, ddp.module.parameters(), {"lr": 0.01})
        return None

    eager, compiled = _train_twins(setup, device="cuda")
    _assert_same_parameters(eager, compiled)
    assert state_of(compiled).aligned_caps
    for p in compiled.module.parameters():
        assert p.grad is None  # DDP's optimizer-in-backward mode frees them, as on eager DDP


def test_comm_hook_name_stays_in_ddp_logging_data():
    seen: list = []

    def setup(ddp):
        ddp.register_comm_hook(None, _recording_hook(seen))
        return None

    eager, compiled = _train_twins(setup, steps=1)
    assert state_of(compiled).aligned_caps
    assert compiled._get_ddp_logging_data()["comm_hook"] == eager._get_ddp_logging_data()["comm_hook"]
    assert "hook" in compiled._get_ddp_logging_data()["comm_hook"]


def test_inside_join_the_ranks_meet_at_the_second_training_call():
    """Note [Meeting under Join] in goddp.ranks.join: the first training
    call inside Join keeps DDP's reducer (its Join allreduce went out before
    goddp saw the module); the next one, which every rank (here the only
    one) said it runs, aligns; afterwards DDP's own Join allreduce is back."""
    from torch.distributed.algorithms.join import Join

    torch.manual_seed(0)
    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    before = ddp.reducer
    compiled = _compiled(ddp)
    with Join([ddp]):
        compiled(torch.randn(4, 128)).sum().backward()
        (plan,) = goddp.last_plans()
        assert plan["plan_check"] is None
        assert ddp.reducer is before and state_of(ddp).aligned_caps is None
        assert "_check_global_requires_backward_grad_sync" in vars(ddp)
        compiled(torch.randn(4, 128)).sum().backward()
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}
    assert ddp.reducer is not before and state_of(ddp).aligned_caps
    assert "_check_global_requires_backward_grad_sync" not in vars(ddp)


def _second_compile(**options):
    """A DDP module decided with max_pieces=2, then compiled again with
    options and trained twice beside eager DDP; returns the DDP module, the
    decided caps and both plans."""
    torch.manual_seed(0)
    reference = Stack()
    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    reference.load_state_dict(ddp.module.state_dict())
    first = _compiled(ddp, max_pieces=2)
    x = torch.randn(4, 128)
    first(x).sum().backward()
    decided = state_of(ddp).aligned_caps
    assert len(decided) == 2

    torch._dynamo.reset()
    second = _compiled(ddp, **options)
    for _ in range(2):
        ddp.zero_grad()
        reference.zero_grad()
        second(x).sum().backward()
        reference(x).sum().backward()
    for p, q in zip(ddp.module.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    first_plan, second_plan = goddp.last_plans()
    assert state_of(ddp).aligned_caps == decided
    assert _rebuilt_sizes(ddp) == list(decided)
    assert first_plan["ddp_buckets"]["aligned"] is True
    return ddp, decided, second_plan


def test_a_later_plan_follows_the_buckets_a_decided_module_installed():
    """A second torch.compile of the same DDP module would cut more pieces
    than DDP's installed buckets: it is planned with their caps instead, cut
    where they close, and aligned (Note [A later graph's part of the
    layout] in goddp.ranks.layout); DDP's buckets stay."""
    ddp, decided, second_plan = _second_compile()
    assert second_plan["num_pieces"] == 2
    assert second_plan["caps"]["bucket_caps_bytes"] == list(decided) == second_plan["ddp_caps"]
    assert second_plan["ddp_buckets"] == {"aligned": True, "reason": None}
    assert second_plan["plan_check"]["followed"]


def test_a_later_plan_that_differs_never_rebuckets_a_decided_module():
    """A second torch.compile that does not align: DDP's buckets stay those
    decided at its first training call, and its record says so."""
    ddp, decided, second_plan = _second_compile(align_buckets=False)
    assert second_plan["num_pieces"] > 2
    assert second_plan["ddp_buckets"]["aligned"] is False
    assert "never change mid-training" in second_plan["ddp_buckets"]["reason"]


def test_caps_below_one_byte_are_refused_before_the_reducer_is_touched():
    """The planner hands DDP caps of at least 1 byte (planner/decide.go); a
    cap of 0 would give each parameter a bucket of its own, so the installer
    refuses one, naming it, and leaves DDP's reducer alone."""
    ddp = DDP(Stack(width=8, depth=2))
    before = ddp.reducer
    with pytest.raises(ValueError, match=r"at least 1 byte, got \[0, 5\]"):
        install_bucket_caps(ddp, [0, 5])
    assert ddp.reducer is before and state_of(ddp).aligned_caps is None


def test_trace_refusals_read_a_real_ddp():
    """The facts of Note [DDP refusals] as a real DDP module holds them
    (tests/python/backend/test_ddp_refusals.py has every rule)."""
    from goddp.ddp import refusals

    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    assert refusals.trace_refusal(ddp) is None
    state_of(ddp).trace = object()
    assert refusals.trace_refusal(ddp) == "this DDP module is already being traced (one goddp.trace at a time)"
    state_of(ddp).trace = None
    ddp._comm_hooks = [(None, None), (None, None)]
    assert refusals.trace_refusal(ddp) == "DDP lists 2 comm hooks; expected at most one"


def test_a_ddp_modules_goddp_state_is_one_object_that_goes_with_it():
    """Note [One object per DDP module]: what goddp knows and decided about a
    DDP module is one attribute of it, a copy starts afresh, and the state
    goes away with the module; no module-level registry holds modules."""
    torch.manual_seed(0)
    ddp = DDP(Stack(), bucket_cap_mb=0.125)
    _compiled(ddp, max_pieces=2)(torch.randn(4, 128)).sum().backward()
    assert [k for k in vars(ddp) if "goddp" in k] == [ATTR]
    state = state_of(ddp)
    assert state.decision.action == "install" and state.aligned_caps == state.decision.caps
    assert state.original_config is not None and state.settings.own.bucket_cap_bytes == ddp.bucket_bytes_cap
    assert state.key == goddp.last_plans()[0]["ddp_module"]["key"] and state.settings_noted
    fresh = copy.deepcopy(state)
    assert isinstance(fresh, ModuleState) and fresh.decision is None and fresh.key is None

    gone = weakref.ref(state)
    del ddp, state
    torch._dynamo.reset()
    gc.collect()
    assert gone() is None

    package = pathlib.Path(goddp.__file__).parent
    registries = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "weakref.Weak" in ast.unparse(node)
    ]
    assert registries == []


def test_a_rebuilt_reducer_is_told_ddps_mixed_precision_parameter_dtype():
    """DDP's constructor tells its reducer the low-precision parameter dtype
    of DDP mixed precision; a reducer goddp rebuilds (goddp.trace, or
    alignment) is told too. DDP mixed precision needs CUDA (torch makes a
    stream for it), so a stand-in module records what its reducer is told."""
    from types import SimpleNamespace

    from goddp.ddp import private

    told = []
    reducer = SimpleNamespace(_set_mixed_precision_param_dtype=told.append)
    mixed = SimpleNamespace(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    private._carry_reducer_modes(SimpleNamespace(reducer=reducer, mixed_precision=mixed))
    assert told == [torch.bfloat16]
    private._carry_reducer_modes(SimpleNamespace(reducer=reducer, mixed_precision=None))
    assert told == [torch.bfloat16]
