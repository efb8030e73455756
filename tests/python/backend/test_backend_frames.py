"""Graph breaks that trainers cause: goddp names each graph's frame and the
break that ended it, and a frame without parameters costs nothing (no plan
check across ranks, no alignment attempt, no warning, no note).

The model below does what Lightning's ``self.log`` does: it hands the loss
to a function Dynamo must not trace (``torch.compiler.disable``), which ends
the graph, and finishes the step in a parameter-free frame."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp

WIDTH = 128
logged: list[float] = []


@pytest.fixture(autouse=True)
def _group(dist_group):
    return dist_group


@torch.compiler.disable
def log_metric(value: torch.Tensor) -> None:
    logged.append(float(value))


def scale_loss(loss: torch.Tensor) -> torch.Tensor:
    # A parameter-free frame of its own after the break.
    return loss * 0.5 + loss.detach().abs().clamp(max=0) * 0


class LoggingStack(nn.Module):
    def __init__(self, depth: int = 6) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        loss = x.square().mean()
        log_metric(loss)  # breaks the graph, as Lightning's self.log does
        return scale_loss(loss)


def test_graph_breaks_are_named_and_parameter_free_frames_cost_nothing(caplog):
    torch.manual_seed(0)
    ddp = DDP(LoggingStack(), bucket_cap_mb=0.125)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "strict": True})
    caplog.set_level(logging.INFO, logger="goddp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2):
            compiled(torch.randn(4, WIDTH)).backward()
    assert not [w for w in caught if "goddp" in str(w.message)]
    plans = goddp.last_plans()
    model_plans = [p for p in plans if p["graph"]["num_params"]]
    empty = [p for p in plans if not p["graph"]["num_params"]]
    assert len(model_plans) == 1 and empty, plans

    (model,) = model_plans
    assert model["num_pieces"] > 1 and model["ddp_buckets"]["aligned"] is True
    frame = model["frame"]
    assert frame["frame"].startswith("forward (test_backend_frames.py:")
    assert frame["graph_break"], frame
    assert frame["break_at"].startswith("forward (test_backend_frames.py:")

    for plan in empty:
        assert plan["plan_check"] is None  # no cross-rank comparison
        assert plan["ddp_buckets"] == {"aligned": False, "reason": "no parameters in this graph"}
        assert plan["fingerprint"] is None and plan["fallback"] is None
        assert plan["frame"]["frame"] is not None
    text = caplog.text
    assert "DDP keeps its own buckets" not in text  # no alignment note for the empty frame
    assert "holds no parameters" in text and "graph break at forward (test_backend_frames.py:" in text
    assert len(logged) == 2


def test_a_parameter_free_frame_is_not_planned_so_no_plan_error_reaches_it(caplog):
    # DDP's defaults and a first-bucket cap above its 25 MiB cap: the model's
    # graph cannot be planned and falls back; the parameter-free frame after
    # the break has nothing to plan (Note [Parameter-free graphs]), so no
    # planning error, no second fallback warning, no plan check.
    torch.manual_seed(0)
    ddp = DDP(LoggingStack())
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "first_bucket_cap_mb": 30})
    caplog.set_level(logging.INFO, logger="goddp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(4, WIDTH)).backward()
    plans = goddp.last_plans()
    empty = [p for p in plans if p["graph"]["num_params"] == 0]
    (model,) = [p for p in plans if p["graph"]["num_params"]]
    assert empty and model["fallback_stage"] == "plan", plans
    for plan in empty:
        assert plan["fallback"] is None, plan
        assert plan["ddp_buckets"] == {"aligned": False, "reason": "no parameters in this graph"}
        assert plan["plan_check"] is None
    failed = [w for w in caught if "planning failed" in str(w.message)]
    assert len(failed) == 1, [str(w.message) for w in failed]  # the model's graph only
    assert "holds no parameters" in caplog.text
