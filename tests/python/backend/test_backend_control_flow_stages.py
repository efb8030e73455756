"""Dynamo's control-flow exceptions leave goddp's backend unchanged from
every stage, with no fallback and no warning; any other exception from a
stage falls back with a warning that names the stage and the exception
(Note [Dynamo's control-flow exceptions], goddp.compile.fallback).

goddp's backend is called by hand from inside a backend of the test's own,
so that it runs where Dynamo runs it (inside the DDP forward, with Dynamo's
tracing context and fake inputs), while what it raises stays in the test:
Dynamo itself would restart on it, forever, since the stage raises again.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo import exc as dynamo_exc
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
import goddp.compile.pipeline as pipeline
from goddp.compile.fallback import _control_flow_types as steering_types
from goddp.compile.fallback import is_dynamo_control_flow as steers_dynamo

WIDTH = 32
CAP_MB = 0.004  # a few Linear(32, 32) layers per bucket


@pytest.fixture(autouse=True)
def _group(dist_group, native_module):
    return dist_group


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(5))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class FutureRestart(dynamo_exc.RestartAnalysis):
    """A RestartAnalysis subclass this torch does not have."""


def steering_exceptions():
    return [
        dynamo_exc.TensorifyScalarRestartAnalysis(),
        dynamo_exc.SpeculationRestartAnalysis(restart_reason="a test's restart"),
        dynamo_exc.UnspecializeRestartAnalysis(),
        dynamo_exc.CompileCollectiveRestartAnalysis(),
        FutureRestart(),
        dynamo_exc.SkipFrame("a test skips the frame"),
        torch._subclasses.fake_tensor.DynamicOutputShapeException(torch.ops.aten.nonzero.default),
    ]


# stage name (as the fallback warning says it) -> (module, attribute) to patch
STAGES = {
    "exporting the graph": (pipeline, "export_graph"),
    "planning": (pipeline, "call_planner"),
    "cutting the graph along the plan": (pipeline, "cut_graph"),
    "making the pieces' example inputs": (pipeline, "piece_example_inputs"),
    "comparing the pieces": (pipeline, "group_pieces"),
    "compiling piece 0 of": None,  # the inner compiler raises
    "stitching the pieces": (pipeline, "StitchedPieces"),
}


class Outcome:
    result = None
    raised: BaseException | None = None


def call_backend_inside_dynamo(inner=None) -> Outcome:
    """Compiles one training step of a cut model; the test's backend hands
    Dynamo's graph to goddp's and keeps what goddp returns or raises."""
    outcome = Outcome()

    def backend(gm, example_inputs):
        try:
            outcome.result = goddp.backend.goddp_backend(
                gm, example_inputs, options={"inner": inner or "aot_eager"}
            )
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.raised = exc
        return gm.forward

    torch.manual_seed(0)
    compiled = torch.compile(DDP(Net(), bucket_cap_mb=CAP_MB), backend=backend)
    compiled(torch.randn(4, WIDTH)).sum().backward()
    return outcome


def raising(exc: BaseException):
    def stage(*args, **kwargs):
        raise exc

    return stage


class InnerRaisingOnFirstPiece:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self._inner = lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        raise self.exc


def _patch_stage(monkeypatch, stage: str, exc: BaseException):
    target = STAGES[stage]
    if target is None:
        return InnerRaisingOnFirstPiece(exc)
    module, name = target
    monkeypatch.setattr(module, name, raising(exc))
    return None


def test_the_predicate_knows_every_steering_class_and_no_failure():
    for exc in steering_exceptions():
        assert steers_dynamo(exc), type(exc)
    for failure in (
        RuntimeError("x"),
        IndexError("x"),
        dynamo_exc.BackendCompilerFailed(lambda: None, RuntimeError("x"), None),
        dynamo_exc.TorchRuntimeError("x"),
    ):
        assert not steers_dynamo(failure), type(failure)
    assert dynamo_exc.RestartAnalysis in steering_types()
    assert dynamo_exc.SkipFrame in steering_types()


# Every stage with TensorifyScalarRestartAnalysis (the one a backend meets)
# and with one other class each; every class at the piece compiles.
CASES = [(stage, 0) for stage in STAGES]
CASES += [(stage, 1 + i % (len(steering_exceptions()) - 1)) for i, stage in enumerate(STAGES)]
CASES += [("compiling piece 0 of", i) for i in range(len(steering_exceptions()))]
CASES = sorted(set(CASES), key=CASES.index)


@pytest.mark.parametrize("stage,exc_index", CASES)
def test_a_control_flow_exception_leaves_every_stage_unchanged(stage, exc_index, monkeypatch, caplog):
    exc = steering_exceptions()[exc_index]
    args_before, reason_before = exc.args, getattr(exc, "restart_reason", None)
    inner = _patch_stage(monkeypatch, stage, exc)
    caplog.set_level(logging.INFO, logger="goddp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = call_backend_inside_dynamo(inner)
    assert outcome.raised is exc, outcome.raised
    assert type(outcome.raised) is type(exc)
    assert exc.args == args_before and getattr(exc, "restart_reason", None) == reason_before
    assert exc.__cause__ is None
    assert not [w for w in caught if "goddp" in str(w.message)]
    assert not [r for r in caplog.records if r.name == "goddp" and r.levelno >= logging.WARNING]
    assert any(
        type(exc).__name__ in r.getMessage() and "steer" in r.getMessage()
        for r in caplog.records
        if r.name == "goddp" and r.levelno == logging.INFO
    ), caplog.text
    # No plan recorded for an attempt Dynamo abandons.
    assert goddp.last_plans() == []


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_failure_in_a_stage_falls_back_naming_the_stage_and_the_exception(stage, monkeypatch, caplog):
    inner = _patch_stage(monkeypatch, stage, ValueError("a stage broke on purpose"))
    caplog.set_level(logging.WARNING, logger="goddp")
    with pytest.warns(RuntimeWarning) as caught:
        outcome = call_backend_inside_dynamo(inner)
    if stage == "compiling piece 0 of":
        # The whole graph goes to the same inner compiler, which raises again.
        assert isinstance(outcome.raised, ValueError)
    else:
        assert outcome.raised is None and callable(outcome.result)
    (message,) = [str(w.message) for w in caught if "goddp" in str(w.message)]
    assert message.startswith(f"goddp: {stage}")
    assert "failed (ValueError: a stage broke on purpose)" in message
    assert any(message in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("exc_index", [0, 5])
def test_strict_passes_a_control_flow_exception_unchanged_too(exc_index, monkeypatch):
    exc = steering_exceptions()[exc_index]
    outcome = Outcome()

    def backend(gm, example_inputs):
        try:
            goddp.backend.goddp_backend(
                gm, example_inputs, options={"inner": InnerRaisingOnFirstPiece(exc), "strict": True}
            )
        except BaseException as raised:  # noqa: BLE001
            outcome.raised = raised
        return gm.forward

    compiled = torch.compile(DDP(Net(), bucket_cap_mb=CAP_MB), backend=backend)
    compiled(torch.randn(4, WIDTH)).sum().backward()
    assert outcome.raised is exc and exc.__cause__ is None and not exc.__suppress_context__
