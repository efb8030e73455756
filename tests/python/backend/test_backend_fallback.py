"""When planning or a piece's compilation fails, goddp warns and compiles
the whole graph instead (never losing a training step or producing wrong
gradients); strict=True raises instead."""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch
from torch import nn
import torch._dynamo.exc as dynamo_exc
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
import goddp.compile.pipeline
from goddp.compile.fallback import STAGES, FellBack, Stages, is_dynamo_control_flow

CAP_MB = 0.004  # a few Linear(32, 32) layers per bucket


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(5))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def make_models():
    torch.manual_seed(0)
    base = Net()
    return copy.deepcopy(base), copy.deepcopy(base)


def step(model, x):
    out = model(x)
    out.pow(2).sum().backward()
    return out


def assert_same_training_step(model, reference, out, ref_out):
    torch.testing.assert_close(out, ref_out)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, msg=name)


class FailingCompiler:
    """aot_eager, except that the call numbered fail_on (1-based) raises."""

    def __init__(self, fail_on: int) -> None:
        self.fail_on = fail_on
        self.calls = 0
        self.graph_sizes: list[int] = []
        self._inner = lookup_backend("aot_eager")

    def __call__(self, gm, example_inputs):
        self.calls += 1
        self.graph_sizes.append(len(gm.graph.nodes))
        if self.calls == self.fail_on:
            raise RuntimeError("inner compiler exploded on purpose")
        return self._inner(gm, example_inputs)


def test_planner_failure_warns_and_compiles_the_whole_graph(dist_group, native_module, monkeypatch, caplog):
    def broken_planner(*args):
        raise RuntimeError("planner broke on purpose")

    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", broken_planner)
    model, reference = make_models()
    x = torch.randn(4, 32)
    recorder = FailingCompiler(fail_on=0)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB), backend=goddp.backend(inner=recorder)
    )
    with caplog.at_level(logging.WARNING, logger="goddp"):
        with pytest.warns(RuntimeWarning, match="planning failed .*planner broke on purpose"):
            out = step(compiled, x)
    assert any("planner broke on purpose" in r.getMessage() for r in caplog.records)
    ref_out = step(reference, x)
    assert_same_training_step(model, reference, out, ref_out)
    # One compile: the whole graph (every node of the Dynamo graph).
    assert recorder.calls == 1
    (record,) = goddp.last_plans()
    assert "planner broke on purpose" in record["fallback"]
    assert record["fingerprint"] is None


def test_the_fallback_cause_is_logged_whole_with_its_traceback_at_debug(dist_group, native_module, monkeypatch, caplog):
    def broken_planner(*args):
        raise RuntimeError("planner broke on purpose\nsecond line of the cause")

    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", broken_planner)
    model, _ = make_models()
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB), backend=goddp.backend(inner="aot_eager")
    )
    with caplog.at_level(logging.DEBUG, logger="goddp"):
        with pytest.warns(RuntimeWarning, match="planning failed"):
            step(compiled, torch.randn(4, 32))
    goddp_records = [r for r in caplog.records if r.name == "goddp"]
    (warning,) = [r for r in goddp_records if r.levelno == logging.WARNING]
    # The record and the warning keep one line; the log keeps the whole message.
    assert "second line of the cause" in warning.getMessage()
    (record,) = goddp.last_plans()
    assert "second line" not in record["fallback"]
    traced = [r for r in goddp_records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(traced) == 1
    assert traced[0].exc_info[0] is RuntimeError and "broken_planner" in caplog.text


def test_piece_compile_failure_warns_and_compiles_the_whole_graph(dist_group, native_module, caplog):
    model, reference = make_models()
    x = torch.randn(4, 32)
    failing = FailingCompiler(fail_on=2)  # the second piece
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB), backend=goddp.backend(inner=failing)
    )
    with caplog.at_level(logging.WARNING, logger="goddp"):
        with pytest.warns(RuntimeWarning, match="compiling piece 1 of .* failed .*exploded on purpose"):
            out = step(compiled, x)
    ref_out = step(reference, x)
    assert_same_training_step(model, reference, out, ref_out)

    (record,) = goddp.last_plans()
    assert record["num_pieces"] >= 3
    assert "exploded on purpose" in record["fallback"]
    # Two pieces tried, then the whole graph, which is larger than any piece.
    assert failing.calls == 3
    assert failing.graph_sizes[2] > max(failing.graph_sizes[:2])
    # A second step runs the whole-graph compile, still correct.
    for p in list(model.parameters()) + list(reference.parameters()):
        p.grad = None
    assert_same_training_step(model, reference, step(compiled, x), step(reference, x))


def test_strict_raises_on_planner_failure(dist_group, native_module, monkeypatch):
    def broken_planner(*args):
        raise RuntimeError("planner broke on purpose")

    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", broken_planner)
    model, _ = make_models()
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB),
        backend=goddp.backend(inner="aot_eager", strict=True),
    )
    with pytest.raises(Exception, match="planner broke on purpose"):
        compiled(torch.randn(4, 32))


def test_strict_raises_on_piece_compile_failure(dist_group, native_module):
    model, _ = make_models()
    failing = FailingCompiler(fail_on=2)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB),
        backend=goddp.backend(inner=failing, strict=True),
    )
    with pytest.raises(Exception, match="exploded on purpose"):
        compiled(torch.randn(4, 32))
    assert failing.calls == 2  # no whole-graph retry


def test_real_planner_error_for_bad_caps_falls_back(dist_group, native_module):
    """A cap the planner rejects (first bucket larger than the others) is a
    PlannerError from Go: warning, whole graph, correct step."""
    model, reference = make_models()
    x = torch.randn(4, 32)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB),
        backend=goddp.backend(inner="aot_eager", first_bucket_cap_mb=1.0),
    )
    with pytest.warns(RuntimeWarning, match="planning failed .*PlannerError"):
        out = step(compiled, x)
    assert_same_training_step(model, reference, out, step(reference, x))
    (record,) = goddp.last_plans()
    assert "PlannerError" in record["fallback"]
    # No plan: the record's caps are the request (goddp.reports.records), the
    # bucket cap not given (None), the first cap the user's.
    assert record["caps"]["bucket_cap_bytes"] is None
    assert record["caps"]["first_bucket_cap_bytes"] == 1 << 20
    assert record["caps"]["align_buckets"] is False


@pytest.mark.parametrize(
    "stage, target",
    [
        ("export", "export_graph"),
        ("cut", "cut_graph"),
        ("example_inputs", "piece_example_inputs"),
        ("identify", "group_pieces"),
        ("stitch", "StitchedPieces"),
    ],
)
def test_every_stage_falls_back_naming_itself_and_the_cause(dist_group, native_module, monkeypatch, stage, target):
    """One fallback context for every stage of the pipeline: the warning and
    the record name the stage and the real exception, and the step is the
    eager model's."""

    def broken(*args, **kwargs):
        raise ValueError(f"{stage} broke on purpose")

    monkeypatch.setattr(goddp.compile.pipeline, target, broken)
    model, reference = make_models()
    x = torch.randn(4, 32)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=CAP_MB), backend=goddp.backend(inner="aot_eager")
    )
    words = STAGES[stage]
    with pytest.warns(RuntimeWarning, match=re.escape(f"{words} failed (ValueError: {stage} broke on purpose)")):
        out = step(compiled, x)
    assert_same_training_step(model, reference, out, step(reference, x))
    (record,) = goddp.last_plans()
    assert record["fallback_stage"] == stage
    assert record["fallback"] == f"{words} failed (ValueError: {stage} broke on purpose)"
    assert (record["fingerprint"] is None) == (stage == "export")
    # strict: the real exception, not a wrapper
    torch._dynamo.reset()
    strict = torch.compile(
        DDP(make_models()[0], bucket_cap_mb=CAP_MB),
        backend=goddp.backend(inner="aot_eager", strict=True),
    )
    with pytest.raises(Exception, match=f"{stage} broke on purpose") as raised:
        step(strict, x)
    # Dynamo wraps what a backend raises; inside is the ValueError itself.
    assert isinstance(getattr(raised.value, "inner_exception", raised.value), ValueError), raised.value


def _steering_exceptions():
    from torch._subclasses.fake_tensor import DataDependentOutputException

    return [
        dynamo_exc.RestartAnalysis(),
        dynamo_exc.TensorifyScalarRestartAnalysis(),
        dynamo_exc.SkipFrame("skip this frame"),
        DataDependentOutputException(torch.ops.aten.nonzero.default),
    ]


def test_dynamo_control_flow_passes_the_fallback_context_untouched():
    """Dynamo's own control-flow exceptions are not failures: the fallback
    context lets each through as it is; any other exception becomes a
    fallback naming the stage."""
    for exc in _steering_exceptions():
        assert is_dynamo_control_flow(exc), exc
        for strict in (False, True):
            with pytest.raises(type(exc)) as raised:
                with Stages(strict, {}).guard("plan"):
                    raise exc
            assert raised.value is exc
    for exc in (RuntimeError("boom"), ValueError("boom"), dynamo_exc.Unsupported("boom")):
        assert not is_dynamo_control_flow(exc), exc
        with pytest.raises(FellBack) as fell:
            with Stages(False, {}).guard("compile", piece=2, pieces=5):
                raise exc
        assert fell.value.stage == "compile" and fell.value.cause is exc
        assert fell.value.reason == f"compiling piece 2 of 5 failed ({type(exc).__name__}: boom)"


def test_dynamo_skipping_the_frame_from_a_piece_compile_is_no_fallback(dist_group, native_module, recwarn):
    """An inner compiler that asks Dynamo to skip the frame (SkipFrame) is
    obeyed: no goddp fallback, no whole-graph compile, Dynamo runs the frame
    eagerly and the step is eager DDP's."""
    calls = []

    def skipping(gm, example_inputs):
        calls.append(len(gm.graph.nodes))
        raise dynamo_exc.SkipFrame("the inner compiler skips this frame")

    model, reference = make_models()
    x = torch.randn(4, 32)
    compiled = torch.compile(DDP(model, bucket_cap_mb=CAP_MB), backend=goddp.backend(inner=skipping))
    out = step(compiled, x)
    assert_same_training_step(model, reference, out, step(reference, x))
    assert len(calls) == 1, calls  # the first piece only: no fallback compiled the whole graph
    assert not [w for w in recwarn if "goddp" in str(w.message)], [str(w.message) for w in recwarn]
