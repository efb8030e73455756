"""Ranks that compile different graphs for the same DDP module (issue 16).

The ranks of a DDP module must agree on what DDP communicates: per bucket
the parameters (by DDP position) and their order, the caps given to DDP,
the bucket order, and the goddp build. How each rank's graph looks (its
shapes, symbolic sizes, what it compiled before) is no business of the
agreement. Each case here is one a user meets, run inside each of two ranks
(pytest under torchrun, gloo, CPU) with goddp's default settings (the inner
compiler aside) and no timeout override, in both wrapping orders where the
order matters:

- rank 0 alone evaluates with another batch size before the first step;
- a GAN loop: G's first grad-enabled forward has no backward of its own;
- two compiled DDP modules of the same shapes in one process;
- a module that trained eagerly before its first compiled step;
- ranks whose layouts really differ: nobody aligns, nobody dies.

Every case trains exactly as eager DDP does (bitwise: aot_eager), and
"aligned" means what DDP itself reports: its rebuilt buckets have the sizes
the plan gave. A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.ddp.state import state_of
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks, rank

ORDERS = ["compile(DDP(m))", "DDP(compile(m))"]
OPTIONS = {"inner": "aot_eager", "log_plan": False}
CAP_MB = 0.02
STEPS = 3


class Tower(nn.Module):
    """Square tanh layers and a head; `tag` names the parameters, so that the
    plans of two towers in one process tell apart."""

    def __init__(self, fan_in: int, width: int, fan_out: int, depth: int = 4, tag: str = "t") -> None:
        super().__init__()
        self.tag = tag
        layers = [nn.Linear(fan_in, width)] + [nn.Linear(width, width) for _ in range(depth - 1)]
        self.add_module(f"{tag}_layers", nn.ModuleList(layers))
        self.add_module(f"{tag}_head", nn.Linear(width, fan_out))

    def forward(self, x):
        for layer in getattr(self, f"{self.tag}_layers"):
            x = torch.tanh(layer(x))
        return getattr(self, f"{self.tag}_head")(x)


def _build(seed: int, **kwargs) -> nn.Module:
    torch.manual_seed(seed)
    return Tower(**kwargs)


def _wrap(model: nn.Module, group, order: str | None):
    """(the DDP module, what the training loop calls): eager DDP when order
    is None, else goddp in that wrapping order."""
    if order is None:
        ddp = DDP(model, process_group=group, bucket_cap_mb=CAP_MB)
        return ddp, ddp
    if order == "compile(DDP(m))":
        ddp = DDP(model, process_group=group, bucket_cap_mb=CAP_MB)
        return ddp, torch.compile(ddp, backend="goddp", options=OPTIONS)
    ddp = DDP(torch.compile(model, backend="goddp", options=OPTIONS), process_group=group, bucket_cap_mb=CAP_MB)
    return ddp, ddp


def _rows(seed: int, rows: int, width: int) -> torch.Tensor:
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))


def _ddp_bucket_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    sizes = data["rebuilt_bucket_sizes"] if data.get("has_rebuilt_buckets") else data["bucket_sizes"]
    return [int(s) for s in sizes.split(", ")]


def _plans_of(tag: str) -> list[dict]:
    """The training plans (those that reached a training call) of the tower tagged tag."""
    return [
        p for p in goddp.last_plans()
        if p["plan_check"] is not None and any(f"{tag}_head" in n for b in p["buckets"] for n in b["param_names"])
    ]


def _assert_aligned(ddp, tag: str) -> dict:
    """DDP's buckets are the plan's, on this rank; returns the first plan."""
    plans = _plans_of(tag)
    assert plans, goddp.last_plans()
    first = plans[0]
    assert first["fallback"] is None, first["fallback"]
    assert first["num_pieces"] > 1, first
    assert first["ddp_buckets"]["aligned"] is True, first["ddp_buckets"]
    assert _ddp_bucket_sizes(ddp) == [b["bytes"] for b in first["buckets"]], (
        _ddp_bucket_sizes(ddp), first["buckets"])
    return first


def _assert_same(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"{what}, step {step}: {g!r} != eager DDP {w!r}"


def _assert_same_weights(got: nn.Module, want: nn.Module) -> None:
    for (name, w), g in zip(want.state_dict().items(), got.state_dict().values()):
        assert torch.equal(g, w), f"{name} differs from eager DDP"


def _gather(value, group):
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


# --------------------------------------------------------------------------
# Rank 0 alone evaluates, with another batch size, before the first step.


def _eval_then_train(group, order):
    fresh()
    model = _build(0, fan_in=32, width=64, fan_out=8)
    ddp, forward = _wrap(model, group, order)
    evaluations = []
    if rank() == 0:
        model.eval()
        with torch.no_grad():
            evaluations.append(forward(_rows(7, 4, 32)).sum())
        model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = forward(_rows(100 * rank() + step, 16, 32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return ddp, model, losses, evaluations


@needs_two_ranks
@pytest.mark.parametrize("order", ORDERS)
def test_rank0_evaluates_another_batch_size_before_the_first_step(group, order):
    eager_ddp, eager_model, eager_losses, eager_evals = _eval_then_train(group, None)
    ddp, model, losses, evals = _eval_then_train(group, order)
    _assert_same(losses, eager_losses, "loss")
    _assert_same(evals, eager_evals, "evaluation")
    _assert_same_weights(model, eager_model)
    plan = _assert_aligned(ddp, "t")
    assert plan["plan_check"]["size"] == 2
    # the ranks' graphs differ (rank 0's training graph is a dynamic-shape
    # recompile), their buckets do not
    caps = _gather(plan["plan_check"]["caps"], group)
    assert caps[0] == caps[1], caps
    sizes = _gather(_ddp_bucket_sizes(ddp), group)
    assert all(s == sizes[0] for s in sizes), sizes  # the same buckets on every rank
    fresh()


# --------------------------------------------------------------------------
# A GAN: D's step on G(z).detach(), then G's step through D.


def _gan(group, order, shared_fake: bool):
    """Returns (G's ddp, D's ddp, G, D, G's losses, D's losses)."""
    fresh()
    g_model = _build(1, fan_in=8, width=64, fan_out=16, tag="g")
    d_model = _build(2, fan_in=16, width=64, fan_out=1, tag="d")
    g_ddp, g = _wrap(g_model, group, order)
    d_ddp, d = _wrap(d_model, group, order)
    g_opt = torch.optim.SGD(g_model.parameters(), lr=0.05)
    d_opt = torch.optim.SGD(d_model.parameters(), lr=0.05)
    g_losses, d_losses = [], []
    for step in range(STEPS + 1):
        z = _rows(10 * step + rank(), 8, 8)
        real = _rows(1000 + 10 * step + rank(), 8, 16)
        fake = g(z)
        d_opt.zero_grad(set_to_none=True)
        d_loss = (d(fake.detach()) - d(real)).mean()
        d_loss.backward()
        d_opt.step()
        g_opt.zero_grad(set_to_none=True)
        g_loss = (1 - d(fake if shared_fake else g(z))).mean()
        g_loss.backward()
        g_opt.step()
        g_losses.append(g_loss.detach().clone())
        d_losses.append(d_loss.detach().clone())
    return g_ddp, d_ddp, g_model, d_model, g_losses, d_losses


@needs_two_ranks
@pytest.mark.parametrize("shared_fake", [False, True], ids=["G-called-twice", "fake-shared"])
@pytest.mark.parametrize("order", ORDERS)
def test_a_gan_aligns_both_modules(group, order, shared_fake):
    eager = _gan(group, None, shared_fake)
    got = _gan(group, order, shared_fake)
    _assert_same(got[4], eager[4], "G's loss")
    _assert_same(got[5], eager[5], "D's loss")
    _assert_same_weights(got[2], eager[2])
    _assert_same_weights(got[3], eager[3])
    _assert_aligned(got[0], "g")
    _assert_aligned(got[1], "d")
    sizes = _gather((_ddp_bucket_sizes(got[0]), _ddp_bucket_sizes(got[1])), group)
    assert sizes[0] == sizes[1], sizes
    fresh()


# --------------------------------------------------------------------------
# Two compiled DDP modules of the same shapes in one process (an ensemble).


def _ensemble(group, order):
    fresh()
    models = [_build(3 + i, fan_in=32, width=64, fan_out=8, tag=tag) for i, tag in enumerate("ab")]
    wrapped = [_wrap(m, group, order) for m in models]
    optimizer = torch.optim.SGD([p for m in models for p in m.parameters()], lr=0.05)
    losses = []
    for step in range(STEPS):
        x = _rows(100 * rank() + step, 16, 32)
        optimizer.zero_grad(set_to_none=True)
        loss = sum(forward(x).pow(2).mean() for _, forward in wrapped)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return [ddp for ddp, _ in wrapped], models, losses


@needs_two_ranks
@pytest.mark.parametrize("order", ORDERS)
def test_two_compiled_ddp_modules_of_the_same_shapes_align(group, order):
    _, eager_models, eager_losses = _ensemble(group, None)
    ddps, models, losses = _ensemble(group, order)
    _assert_same(losses, eager_losses, "loss")
    for got, want in zip(models, eager_models):
        _assert_same_weights(got, want)
    for ddp, tag in zip(ddps, "ab"):
        _assert_aligned(ddp, tag)
    fresh()


# --------------------------------------------------------------------------
# A module trained eagerly for a step before its first compiled step:
# DDP has rebuilt its buckets, and every rank can still agree.


def _eager_first(group, order):
    fresh()
    model = _build(5, fan_in=32, width=64, fan_out=8)
    ddp, forward = _wrap(model, group, order)
    eager_forward = ddp if order != "DDP(compile(m))" else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS + 1):
        optimizer.zero_grad(set_to_none=True)
        x = _rows(100 * rank() + step, 16, 32)
        if step == 0 and eager_forward is not None:
            loss = eager_forward(x).pow(2).mean()
        elif step == 0:
            with torch.compiler.set_stance("force_eager"):
                loss = forward(x).pow(2).mean()
        else:
            loss = forward(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return ddp, model, losses


@needs_two_ranks
@pytest.mark.parametrize("order", ORDERS)
def test_a_module_trained_eagerly_first_aligns_on_every_rank(group, order):
    eager_ddp, eager_model, eager_losses = _eager_first(group, None)
    ddp, model, losses = _eager_first(group, order)
    _assert_same(losses, eager_losses, "loss")
    _assert_same_weights(model, eager_model)
    _assert_aligned(ddp, "t")
    fresh()


# --------------------------------------------------------------------------
# An install that fails on one rank after the ranks agreed, on a module that
# trained before (DDP rebuilt its buckets): every rank must end with DDP's
# own settings on a fresh reducer, never some ranks with the old rebuilt
# buckets and others with fresh initial ones.


@needs_two_ranks
@pytest.mark.parametrize("eager_first", [False, True], ids=["fresh", "eager-first"])
def test_an_install_that_fails_on_one_rank_puts_ddp_buckets_back_everywhere(group, monkeypatch, caplog, eager_first):
    import goddp.ddp.private as private

    rebuild = private.rebuild_reducer

    def fails_with_caps_on_rank_1(ddp, *, config=None, **kwargs):
        # goddp's caps are the only per-bucket caps here; fail before
        # touching the old reducer, the hardest case to end alike from
        if rank() == 1 and config is not None and tuple(config.per_bucket_bytes_caps):
            raise RuntimeError("rebuild failed on purpose on this rank")
        return rebuild(ddp, config=config, **kwargs)

    def run(order):
        fresh()
        model = _build(5, fan_in=32, width=64, fan_out=8)
        ddp, forward = _wrap(model, group, order)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for step in range(STEPS + 1):
            optimizer.zero_grad(set_to_none=True)
            loss = (ddp if step == 0 and eager_first else forward)(_rows(100 * rank() + step, 16, 32)).pow(2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().clone())
        return ddp, model, losses

    eager_ddp, eager_model, eager_losses = run(None)
    monkeypatch.setattr(private, "rebuild_reducer", fails_with_caps_on_rank_1)
    with caplog.at_level(logging.WARNING, logger="goddp"):
        ddp, model, losses = run("compile(DDP(m))")
    _assert_same(losses, eager_losses, "loss")
    _assert_same_weights(model, eager_model)
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["ddp_buckets"]["aligned"] is False
    assert "the ranks agreed, but rank 1: installing the caps failed" in plan["ddp_buckets"]["reason"], plan
    assert state_of(ddp).aligned_caps is None
    # DDP's own settings on a fresh reducer, rebuilt from the compiled
    # backward's gradient order: the same on both ranks
    assert ddp._bucket_config == eager_ddp._bucket_config
    assert ddp._get_ddp_logging_data().get("has_rebuilt_buckets")
    sizes = _gather(_ddp_bucket_sizes(ddp), group)
    assert all(s == sizes[0] for s in sizes), sizes  # the same buckets on every rank
    assert any("the ranks agreed, but rank 1" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    fresh()


# --------------------------------------------------------------------------
# Layouts that really differ: rank 1 applies the same layers in the
# opposite order, so its buckets hold other parameters.


class Reversible(nn.Module):
    def __init__(self, reverse: bool) -> None:
        super().__init__()
        self.reverse = reverse
        self.t_layers = nn.ModuleList(nn.Linear(48, 48) for _ in range(5))
        self.t_head = nn.Linear(48, 48)

    def forward(self, x):
        for layer in reversed(self.t_layers) if self.reverse else self.t_layers:
            x = torch.tanh(layer(x))
        return self.t_head(x)


def _reversible(group, order, mode="ddp"):
    fresh()
    torch.manual_seed(0)
    model = Reversible(reverse=rank() == 1)
    if order is None:
        ddp = forward = DDP(model, process_group=group, bucket_cap_mb=CAP_MB)
    else:
        ddp = DDP(model, process_group=group, bucket_cap_mb=CAP_MB)
        forward = torch.compile(ddp, backend="goddp", options={**OPTIONS, "mode": mode})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        loss = forward(_rows(100 * rank() + step, 8, 48)).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return ddp, model, losses


@needs_two_ranks
@pytest.mark.parametrize("mode", ["ddp", "torch"])
def test_layouts_that_differ_keep_ddp_buckets_and_warn_on_every_rank(group, caplog, mode):
    """Rank 1 runs the layers in the other order: every rank keeps DDP's
    buckets, says why (in ddp mode, a warning naming what differs), and
    trains as eager DDP does. The round settled with
    every rank's statement, not by giving up on one after a timeout.
    (strict=True: test_dist_fingerprint.py.)"""
    _, eager_model, eager_losses = _reversible(group, None)
    with caplog.at_level(logging.WARNING, logger="goddp"):
        ddp, model, losses = _reversible(group, "compile(DDP(m))", mode)
    _assert_same(losses, eager_losses, "loss")
    _assert_same_weights(model, eager_model)
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["num_pieces"] > 1
    assert plan["ddp_buckets"]["aligned"] is False
    assert state_of(ddp).aligned_caps is None
    reason = plan["plan_check"]["reason"]
    assert [r["rank"] for r in plan["plan_check"]["ranks"]] == list(range(dist.get_world_size(group))), plan["plan_check"]
    assert len(set(_gather(reason, group))) == 1, reason  # the same decision on every rank
    if mode == "ddp":
        # it warns, naming the rank, the bucket and a parameter that differ
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        differ = [w for w in warnings if "layout" in w and "differ" in w]
        assert differ, warnings
        assert reason.startswith("the ranks' layouts differ: bucket 0: rank 1 holds ["), reason
        assert "bucket 0: rank 1 holds [t_layers." in differ[0] and "where rank 0 holds [t_layers." in differ[0], differ[0]
    else:  # torch mode never sets DDP's buckets: different cuts are no difference
        assert reason.startswith("off ("), reason
    fresh()


@pytest.mark.single_process
def test_rank_layouts_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
