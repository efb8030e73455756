"""A stand-in for DDP: a module with only what torch's DDPOptimizer reads.

torch's own DDPOptimizer tests use such a module (their ``FakeDDP``): it
holds the wrapped module and a bucket cap, and marks itself as DDP's active
module while its forward runs. It has no process group and no reducer, so
there is nothing to agree on and no bucket to set: goddp plans and cuts its
graphs, skips the agreement and the alignment, and says why in one INFO
line. Run in a plain process and inside each of two ranks (each rank on its
own: nobody waits for anybody).
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import assert_file_passes_under_torchrun, rank

MIB = 1024 * 1024
OPTIONS = {"inner": "aot_eager", "log_plan": False}


class StandIn(nn.Module):
    """The wrapped module, its bucket cap, and DDP's active-module mark."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25) -> None:
        super().__init__()
        self.module = module
        self.bucket_bytes_cap = int(bucket_cap_mb * MIB)

    @contextlib.contextmanager
    def _inside_ddp_forward(self):
        DDP._active_ddp_module = self
        try:
            yield
        finally:
            DDP._active_ddp_module = None

    def forward(self, *inputs, **kwargs):
        with self._inside_ddp_forward():
            return self.module.forward(*inputs, **kwargs)


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _model() -> nn.Module:
    torch.manual_seed(0)
    return Stack()


def _grads(model: nn.Module, forward, seed: int) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
    forward(x).pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("order", ["compile(StandIn(m))", "StandIn(compile(m))"])
def test_a_stand_in_is_planned_and_cut_without_agreement(dist_group, caplog, order):
    want_model = _model()
    want = [_grads(want_model, want_model, 100 * rank() + s) for s in range(2)]
    model = _model()
    if order == "compile(StandIn(m))":
        forward = torch.compile(StandIn(model, bucket_cap_mb=0.02), backend="goddp", options=OPTIONS)
    else:
        forward = StandIn(torch.compile(model, backend="goddp", options=OPTIONS), bucket_cap_mb=0.02)
    with caplog.at_level(logging.INFO, logger="goddp"):
        got = [_grads(model, forward, 100 * rank() + s) for s in range(2)]
        with torch.no_grad():
            forward(torch.randn(3, 64))  # an evaluation graph too
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert torch.equal(a, b), f"step {step}, parameter {i}: gradient differs from the uncompiled module"
    plans = goddp.last_plans()
    assert plans and all(p["num_pieces"] > 1 for p in plans), plans
    assert all(p["fallback"] is None for p in plans), [p["fallback"] for p in plans]
    for plan in plans:
        assert plan["ddp_buckets"]["aligned"] is False
        assert "no process group" in plan["ddp_buckets"]["reason"], plan["ddp_buckets"]
    said = [r.getMessage() for r in caplog.records if "no process group" in r.getMessage()]
    assert len(said) == 1, said
    assert [r.levelno for r in caplog.records if "no process group" in r.getMessage()] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]


@pytest.mark.single_process
def test_stand_in_under_torchrun():
    """Plain pytest: run this file's cases inside each of two ranks too."""
    assert_file_passes_under_torchrun(__file__, timeout=240)
