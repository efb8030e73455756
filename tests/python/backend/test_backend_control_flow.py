"""Real forward code stays on goddp's fast path (issue 17): a Python float
argument that changes between calls, a branch on ``.item()``, a loop count
from ``.item()``, ``print()`` and ``torch._dynamo.graph_break()``.

Dynamo steers its own compilation with exceptions (the RestartAnalysis
family, SkipFrame; goddp.compile.fallback, Note [Dynamo's control-flow exceptions]).
They are not failures: goddp lets them pass, Dynamo re-traces the frame, and
goddp plans the graph it gets then. Each pattern must end with no fallback
warning, every graph that holds DDP's parameters cut into more than one
piece, and outputs and gradients bitwise equal to eager DDP (aot_eager
pieces).

The model is 12 ``nn.Linear`` layers in two halves with the pattern between
them, so that the graph breaks split DDP's parameters over two graphs.
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp

WIDTH = 64
CAP_MB = 0.03  # about two Linear(64, 64) layers per bucket
STEPS = 4


@pytest.fixture(autouse=True)
def _group(dist_group, native_module):
    return dist_group


class Halves(nn.Module):
    """Six Linear layers, the pattern, six more."""

    def __init__(self, pattern: str, width: int = WIDTH) -> None:
        super().__init__()
        self.first = nn.ModuleList(nn.Linear(width, width) for _ in range(6))
        self.second = nn.ModuleList(nn.Linear(width, width) for _ in range(6))
        self.pattern = pattern

    def forward(self, x, scale: float = 1.0):
        for layer in self.first:
            x = torch.tanh(layer(x))
        pattern = self.pattern
        if pattern == "float_argument":
            x = x * scale
        elif pattern == "item_branch":
            if x.sum().item() > 0:
                x = x * 2
            else:
                x = x - 1
        elif pattern == "item_loop":
            for _ in range(int(x.abs().sum().item()) % 3 + 1):
                x = x * 0.9
        elif pattern == "print":
            print("between the halves")
        elif pattern == "graph_break":
            torch._dynamo.graph_break()
        for layer in self.second:
            x = torch.tanh(layer(x))
        return x


class RecordingInner:
    """aot_eager, recording the type of every exception that leaves it."""

    __name__ = "recording_aot_eager"

    def __init__(self) -> None:
        self._inner = lookup_backend("aot_eager")
        self.raised: list[type] = []

    def __call__(self, gm, example_inputs):
        try:
            return self._inner(gm, example_inputs)
        except BaseException as exc:
            self.raised.append(type(exc))
            raise


PATTERNS = ["float_argument", "item_branch", "item_loop", "print", "graph_break"]


def _wrap(model: nn.Module, order: str, backend):
    if order == "compile(DDP)":
        ddp = DDP(model, bucket_cap_mb=CAP_MB)
        return ddp, torch.compile(ddp, backend=backend)
    ddp = DDP(torch.compile(model, backend=backend), bucket_cap_mb=CAP_MB)
    return ddp, ddp


def train_against_eager(pattern: str, order: str = "compile(DDP)", caplog=None, width: int = WIDTH):
    """STEPS training steps of goddp and of eager DDP from the same weights;
    asserts outputs and gradients bitwise equal at every step. Returns the
    goddp-side module, the recording inner compiler and the goddp warnings."""
    torch.manual_seed(0)
    base = Halves(pattern, width)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    inner = RecordingInner()
    ddp, compiled = _wrap(model, order, goddp.backend(inner=inner))
    eager = DDP(reference, bucket_cap_mb=CAP_MB)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            x = torch.randn(4, width)
            # Both signs of the .item() branch, a different loop count and a
            # different float on the way.
            x = x if step % 2 == 0 else -x - 0.5
            scale = 0.5 + step
            for m in (model, reference):
                m.zero_grad(set_to_none=True)
            out = compiled(x, scale)
            out.square().sum().backward()
            ref = eager(x, scale)
            ref.square().sum().backward()
            assert torch.equal(out, ref), f"step {step}: outputs differ"
            for (name, p), q in zip(model.named_parameters(), reference.parameters()):
                assert p.grad is not None, (step, name)
                assert torch.equal(p.grad, q.grad), f"step {step}: gradient of {name} differs"
    goddp_warnings = [str(w.message) for w in caught if "goddp" in str(w.message)]
    return ddp, inner, goddp_warnings


def assert_on_the_fast_path(plans, goddp_warnings, caplog):
    assert goddp_warnings == []
    assert not [r for r in caplog.records if r.name == "goddp" and r.levelno >= logging.WARNING], caplog.text
    assert plans, "goddp planned nothing"
    assert [p["fallback"] for p in plans] == [None] * len(plans)
    holding = [p for p in plans if p["graph"]["num_params"]]
    assert holding, plans
    for plan in holding:
        assert plan["num_pieces"] > 1, plan


@pytest.mark.parametrize("pattern", PATTERNS)
def test_pattern_stays_on_the_fast_path(pattern, caplog):
    caplog.set_level(logging.INFO, logger="goddp")
    _, inner, goddp_warnings = train_against_eager(pattern)
    plans = goddp.last_plans()
    assert_on_the_fast_path(plans, goddp_warnings, caplog)
    if pattern == "float_argument":
        # The changing float made Dynamo restart its analysis from a piece's
        # compile: the path this test is about was taken.
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis

        assert TensorifyScalarRestartAnalysis in inner.raised
    if pattern != "float_argument":
        # The break splits DDP's parameters over two graphs, each cut.
        names = [set(n for piece in p["pieces"] for n in piece["param_names"]) for p in plans if p["graph"]["num_params"]]
        assert any(all(n.startswith("first.") for n in s) for s in names), names
        assert any(all(n.startswith("second.") for n in s) for s in names), names


@pytest.mark.parametrize("pattern", ["float_argument", "item_branch"])
def test_pattern_stays_on_the_fast_path_with_compile_inside_ddp(pattern, caplog):
    caplog.set_level(logging.INFO, logger="goddp")
    _, _, goddp_warnings = train_against_eager(pattern, order="DDP(compile)")
    assert_on_the_fast_path(goddp.last_plans(), goddp_warnings, caplog)


def test_a_float_argument_of_a_wider_model_stays_on_the_fast_path(caplog):
    """Another shape of the class: wider layers, so other pieces and caps."""
    caplog.set_level(logging.INFO, logger="goddp")
    _, _, goddp_warnings = train_against_eager("float_argument", width=96)
    assert_on_the_fast_path(goddp.last_plans(), goddp_warnings, caplog)


def test_strict_lets_a_restart_pass_too(caplog):
    """strict=True raises failures; a Dynamo restart is none, so a strict
    goddp trains the changing float like any other."""
    torch.manual_seed(0)
    model = Halves("float_argument")
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB), backend=goddp.backend(inner="aot_eager", strict=True)
    )
    for step in range(3):
        compiled(torch.randn(4, WIDTH), 0.5 + step).sum().backward()
    plans = goddp.last_plans()
    assert plans and all(p["fallback"] is None and p["num_pieces"] > 1 for p in plans), plans
