"""One DDP bucket layout across the graphs of a forward, on two ranks
(goddp.ranks.forward, Note [Graphs of one forward]; pytest under torchrun, gloo,
CPU). Each case trains goddp and eager DDP side by side on per-rank data
and requires equal losses and weights (bitwise: aot_eager):

- a graph break in the middle of the model: both graphs planned together,
  DDP's buckets close at the cuts of both, on both ranks; with layers in
  bf16 on either side or both, the combined buckets split by group, DDP
  rebuilt to exactly them;
- a branch whose graph first runs at step 3 (on both ranks, or on one):
  DDP's buckets stay as they were, nobody waits, and the branch's graph
  follows them;
- ranks that break at different places: nobody aligns, nobody stalls, one
  WARNING says what differs;
- one rank breaks, the other does not: the same decision on both, no stall;
- a later graph (the graph-break zoo, bench/graph_breaks.py: the resume
  frame recompiled for an .item() branch or loop count, a new batch size, an
  evaluation call in between, a break whose place comes from .item()) is
  cut where the installed buckets close and recorded aligned; one whose
  buckets really differ (a branch in another order) is reported so.

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.ddp.state import state_of
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks, rank, short_timeout_group

WIDTH = 48
CAP_MB = 0.02
STEPS = 5
GROUP_TIMEOUT_S = 120
ORDERS = ["compile(DDP(m))", "DDP(compile(m))"]


@pytest.fixture(scope="module")
def group(dist_group):
    return short_timeout_group(GROUP_TIMEOUT_S)


class Stack(nn.Module):
    """depth Linear layers, those numbered in half in bf16; a graph break
    after layer break_at (None: none); from the step the test sets `late`,
    a branch with a graph of its own after that."""

    def __init__(self, depth: int = 10, break_at: int | None = None, half: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))
        for i in half:
            self.layers[i].to(torch.bfloat16)
        self.break_at, self.half = break_at, half
        self.late = False

    def _layer(self, i: int, x):
        if i in self.half:
            return torch.tanh(self.layers[i](x.to(torch.bfloat16))).float()
        return torch.tanh(self.layers[i](x))

    def forward(self, x):
        # Dynamo runs a whole frame eagerly when it breaks inside a loop, so
        # each break sits between two loops.
        cut = len(self.layers) if self.break_at is None else self.break_at + 1
        for i in range(cut):
            x = self._layer(i, x)
        if self.break_at is not None:
            torch._dynamo.graph_break()
        if self.late:
            x = x + x.detach().mean()
            torch._dynamo.graph_break()
        for i in range(cut, len(self.layers)):
            x = self._layer(i, x)
        return x


def _train_both(group, order: str, break_at, late_from=None, steps: int = STEPS, half=(), batches=None):
    """goddp and eager DDP from the same weights on the same per-rank data;
    returns the goddp DDP module and its reducer after each step, having
    checked losses and weights bitwise equal at every step."""
    fresh()
    torch.manual_seed(0)
    base = Stack(break_at=break_at, half=half)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    options = {"inner": "aot_eager", "log_plan": False}
    if order == "compile(DDP(m))":
        ddp = DDP(model, process_group=group, bucket_cap_mb=CAP_MB)
        forward = torch.compile(ddp, backend="goddp", options=options)
    else:
        ddp = DDP(torch.compile(model, backend="goddp", options=options), process_group=group, bucket_cap_mb=CAP_MB)
        forward = ddp
    eager = DDP(reference, process_group=group, bucket_cap_mb=CAP_MB)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, reference)]
    reducers = []
    for step in range(steps):
        if late_from is not None and step == late_from:
            model.late = reference.late = True
        batch = 8 if batches is None else batches[step]
        x = torch.randn(batch, WIDTH, generator=torch.Generator().manual_seed(100 * rank() + step))
        losses = []
        for f, opt in zip((forward, eager), optimizers):
            opt.zero_grad(set_to_none=True)
            loss = f(x).pow(2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert torch.equal(losses[0], losses[1]), f"step {step}: loss {losses[0]} != eager DDP {losses[1]}"
        reducers.append(id(ddp.reducer))
    for (name, w), g in zip(reference.state_dict().items(), model.state_dict().values()):
        assert torch.equal(g, w), f"{name} differs from eager DDP"
    return ddp, reducers


def _rebuilt_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets"), data
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]


def _together():
    return [p for p in goddp.last_plans() if p["forward"] is not None]


def _gather(value, group):
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


def _nobody_waited_on_a_timeout(group):
    """Every agreement round this rank took part in heard every rank: none
    was given up after GROUP_TIMEOUT_S, so no rank stalled waiting for
    another (what a time bound would say, without the machine's speed)."""
    checks = [p["plan_check"] for p in goddp.last_plans() if p["plan_check"] is not None and p["plan_check"].get("ranks")]
    assert checks, goddp.last_plans()
    everyone = list(range(dist.get_world_size(group)))
    assert all([r["rank"] for r in c["ranks"]] == everyone for c in checks), checks


@needs_two_ranks
@pytest.mark.parametrize("order", ORDERS)
def test_a_break_in_the_middle_aligns_on_both_ranks(group, order):
    ddp, reducers = _train_both(group, order, break_at=4)
    together = _together()
    assert len(together) == 2, goddp.last_plans()
    assert all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in together)
    caps = together[0]["plan_check"]["caps"]
    assert _rebuilt_sizes(ddp) == caps
    assert len(set(map(tuple, _gather(caps, group)))) == 1
    # The reducer was rebuilt once, at step 2's call, before its allreduces.
    assert reducers[0] != reducers[1] and reducers[1:] == [reducers[1]] * (STEPS - 1)
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("half", [(2,), (7,), (1, 2, 8)], ids=["bf16-before", "bf16-after", "bf16-both"])
@pytest.mark.parametrize("order", ORDERS)
def test_a_break_with_several_dtype_groups_aligns_per_group(group, order, half):
    """Layers in bf16 before the break, after it, or on both sides: each
    graph keeps its buckets whole, the combined ones are split by group
    with caps that fit every group (Note [Several dtype groups] in
    planner/keys.go), and DDP rebuilds to exactly those buckets on both
    ranks; training is eager DDP's (checked in _train_both)."""
    from goddp.ddp.private import ddp_parameters
    from goddp.ranks.agreement import decided

    # The last step's batch of 5 recompiles both frames: those later graphs
    # follow the installed buckets.
    ddp, reducers = _train_both(group, order, break_at=4, half=half, batches=[8] * (STEPS - 1) + [5])
    together = _together()
    assert len(together) == 2, goddp.last_plans()
    assert all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in together), together
    layout = decided(ddp).layout
    assert layout.shares_caps, layout
    parameters = ddp_parameters(ddp)
    planned = sorted(sorted(id(parameters[p]) for p in bucket) for bucket in layout.buckets)
    rebuilt = sorted(sorted(id(p) for p in b.parameters()) for b in ddp.reducer._get_zeros_like_grad_buckets())
    assert rebuilt == planned
    assert {p.dtype for b in ddp.reducer._get_zeros_like_grad_buckets() for p in b.parameters()} == {
        torch.float32, torch.bfloat16}
    assert all(len({p.dtype for p in b.parameters()}) == 1 for b in ddp.reducer._get_zeros_like_grad_buckets())
    assert len(set(map(tuple, _gather(list(layout.caps), group)))) == 1
    assert reducers[0] != reducers[1] and reducers[1:] == [reducers[1]] * (STEPS - 1)
    later = [p for p in goddp.last_plans() if p["forward"] is None and p["plan_check"] is not None]
    assert len(later) == 2, goddp.last_plans()
    assert all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in later), [p["ddp_buckets"] for p in later]
    fresh()


class WideHeadAfterABreak(nn.Module):
    """float32 layers before a graph break, a wide bf16 head with a bias
    after it: the one cap that closes the head's bucket would leave every
    float32 gradient in one bucket, launched at the end of backward."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(8))
        self.head = nn.Linear(WIDTH, 4096).to(torch.bfloat16)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        torch._dynamo.graph_break()
        return self.head(x.to(torch.bfloat16)).float()


@needs_two_ranks
def test_a_break_whose_groups_would_launch_later_keeps_ddps_buckets(group):
    """The combined per-group buckets would launch later than DDP's own
    (planner/forward.go): every rank keeps DDP's buckets, says why, and
    trains as eager DDP."""
    fresh()
    torch.manual_seed(0)
    base = WideHeadAfterABreak()
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    forward = torch.compile(DDP(model, process_group=group, bucket_cap_mb=CAP_MB), backend="goddp",
                            options={"inner": "aot_eager", "log_plan": False})
    eager = DDP(reference, process_group=group, bucket_cap_mb=CAP_MB)
    for step in range(3):
        x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(100 * rank() + step))
        losses = [f(x).pow(2).mean() for f in (forward, eager)]
        for loss in losses:
            loss.backward()
        assert torch.equal(losses[0], losses[1]), step
        for a, b in zip(model.parameters(), reference.parameters()):
            assert torch.equal(a.grad, b.grad), step
            a.grad = b.grad = None
    together = _together()
    assert len(together) == 2, goddp.last_plans()
    for p in together:
        assert p["ddp_buckets"]["aligned"] is False
        assert "would launch them later than DDP's own buckets" in p["ddp_buckets"]["reason"], p["ddp_buckets"]
    assert len(set(_gather(together[0]["ddp_buckets"]["reason"], group))) == 1
    fresh()


@needs_two_ranks
def test_a_branch_first_taken_at_step_3_keeps_ddp_buckets(group):
    ddp, reducers = _train_both(group, "compile(DDP(m))", break_at=4, late_from=2, steps=6)
    assert reducers[1:] == [reducers[1]] * 5
    together = _together()
    assert len(together) == 2 and all(p["ddp_buckets"]["aligned"] for p in together)
    assert _rebuilt_sizes(ddp) == together[0]["plan_check"]["caps"]
    # Its graph of the second half holds the installed layout's first
    # buckets: it follows them (Note [A later graph's part of the layout]
    # in goddp.ranks.layout).
    late = [p for p in goddp.last_plans() if p["forward"] is None and p["plan_check"] is not None]
    assert late and all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in late)
    fresh()


@needs_two_ranks
def test_a_branch_taken_at_step_3_on_one_rank_only_waits_for_nobody(group):
    ddp, reducers = _train_both(group, "compile(DDP(m))", break_at=4, late_from=2 if rank() == 1 else None, steps=6)
    _nobody_waited_on_a_timeout(group)
    assert reducers[1:] == [reducers[1]] * 5
    together = _together()
    assert len(together) == 2 and all(p["ddp_buckets"]["aligned"] for p in together)
    assert _rebuilt_sizes(ddp) == together[0]["plan_check"]["caps"]
    late = [p for p in goddp.last_plans() if p["forward"] is None and p["plan_check"] is not None]
    assert bool(late) == (rank() == 1)
    fresh()


@needs_two_ranks
def test_ranks_that_break_at_different_places_do_not_align_and_do_not_stall(group, caplog):
    caplog.set_level(logging.INFO, logger="goddp")
    ddp, _ = _train_both(group, "compile(DDP(m))", break_at=2 if rank() == 0 else 6)
    _nobody_waited_on_a_timeout(group)
    together = _together()
    assert len(together) == 2
    assert all(p["ddp_buckets"]["aligned"] is False for p in together)
    assert state_of(ddp).aligned_caps is None
    reasons = _gather(together[0]["plan_check"]["reason"], group)
    assert len(set(reasons)) == 1 and "differ" in reasons[0], reasons
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "goddp"]
    assert any("differ" in w for w in warnings), warnings
    fresh()


@needs_two_ranks
def test_one_rank_breaks_and_the_other_does_not(group):
    ddp, _ = _train_both(group, "compile(DDP(m))", break_at=4 if rank() == 1 else None)
    _nobody_waited_on_a_timeout(group)
    checks = [p["plan_check"] for p in goddp.last_plans() if p["plan_check"] is not None]
    # The second agreement's outcome, the same on both ranks.
    final = checks[-1]
    outcomes = _gather((final["aligned"], final.get("caps"), final.get("reason")), group)
    assert outcomes[0] == outcomes[1], outcomes
    if final["aligned"]:
        assert _rebuilt_sizes(ddp) == final["caps"]
    fresh()


# --------------------------------------------------------------------------
# Later graphs follow the installed layout (Note [A later graph's part of
# the layout] in goddp.ranks.layout)

ZOO_WIDTH = 32
# Later graphs appear from the second step (the layout's install); DDP's
# logging data holds its rebuilt buckets from the fourth.
ZOO_STEPS = 4
FOLLOWS = [("item_branch", "compile(DDP(m))"), ("item_branch", "DDP(compile(m))"), ("item_loop", "compile(DDP(m))"),
           ("dynamic_shape", "compile(DDP(m))"), ("eval_between", "compile(DDP(m))"),
           ("moving_break", "compile(DDP(m))"), ("reversed_branch", "compile(DDP(m))")]


def _bucket_sets(plan) -> list[frozenset[str]]:
    return [frozenset(b["param_names"]) for b in plan["buckets"]]


@needs_two_ranks
@pytest.mark.parametrize("name, order", FOLLOWS)
def test_a_later_graph_follows_the_installed_buckets(group, caplog, name, order):
    from bench.graph_breaks import CASES, train

    caplog.set_level(logging.INFO, logger="goddp")
    case = CASES[name]
    trained = train(case, width=ZOO_WIDTH, steps=ZOO_STEPS, process_group=group, seed=100 * rank(), order=order)
    assert trained.as_eager, "gradients differ from eager DDP"
    together = [p for p in trained.plans if p["forward"] is not None]
    later = [p for p in trained.plans if p["forward"] is None]
    assert len(together) == 2 and all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in together)
    assert later, trained.records
    # Installed once, at step 2's call, the same on both ranks; never again.
    caps = together[0]["plan_check"]["caps"]
    assert trained.reducers[1:] == [trained.reducers[1]] * (ZOO_STEPS - 1)
    assert len(set(map(tuple, _gather(caps, group)))) == 1
    # DDP's own rebuilt buckets, against which each aligned graph's buckets
    # are a contiguous run.
    data = trained.ddp._get_ddp_logging_data()
    assert [int(c) for c in data["rebuilt_bucket_sizes"].split(", ")] == caps
    names = [n for n, _ in trained.ddp.module.named_parameters()]
    rebuilt = data["rebuilt_per_bucket_param_indices"].split(", ")
    installed = [frozenset(names[int(p)] for p in b.split()) for b in rebuilt]
    runs = [installed[s:e] for s in range(len(installed)) for e in range(s + 1, len(installed) + 1)]
    for plan in later:
        assert plan["plan_check"]["followed"]
        if plan["ddp_buckets"]["aligned"]:
            assert plan["ddp_buckets"]["reason"] is None and _bucket_sets(plan) in runs, (plan["buckets"], installed)
        else:
            assert "never change mid-training" in plan["ddp_buckets"]["reason"] and _bucket_sets(plan) not in runs
    differ = [p for p in later if not p["ddp_buckets"]["aligned"]]
    assert bool(differ) == case.differs, [p["ddp_buckets"] for p in later]
    if name == "eval_between":
        assert any(p["graph"]["num_params"] and p["plan_check"] is None for p in trained.records), "no evaluation graph"
    if name == "dynamic_shape":
        assert len(later) == 2, "both frames recompiled for the new batch size"
    if name == "moving_break":
        # Its own plan would bucket 3 layers as one: planned with the caps
        # of the installed buckets it holds instead.
        again = [p for p in later if p["caps"]["bucket_caps_bytes"]]
        assert again and all(p["num_pieces"] == len(p["caps"]["bucket_caps_bytes"]) for p in again)
        assert "planned with the caps of DDP's installed buckets" in caplog.text
    fresh()



@pytest.mark.single_process
def test_forward_across_graphs_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
