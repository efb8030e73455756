"""goddp.trace's prediction (Note [Trace prediction] in
goddp.tracing.prediction): the allreduce fit on synthetic points, the
prediction of a record against the planner's own answer for the same
inputs, bad measurements left out or refused with a reason, and a real
one-rank trace (a plain process, a 1-rank gloo group) whose summary, record
and picture carry the prediction."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

import goddp
from goddp.native import extension
from goddp.tracing import figures, prediction
from goddp.tools import timing
from models import ZOO

MIB = 1 << 20


def bucket(index, nbytes, launch, done):
    return {"index": index, "bytes": nbytes, "params": 1, "launch_s": launch, "done_s": done}


# --------------------------------------------------------------------------
# The fit


def test_fit_recovers_an_exact_line():
    points = [(b, 250e-6 + b / 2e9) for b in (MIB, 4 * MIB, 9 * MIB, 25 * MIB)]
    fit = prediction.fit_allreduce(points)
    assert (fit["method"], fit["note"], fit["points"]) == ("least squares", "", 4)
    assert fit["latency_ns"] == 250_000
    assert fit["bytes_per_second"] == pytest.approx(2e9, rel=1e-9)


@pytest.mark.parametrize(
    "points, note",
    [
        pytest.param([(MIB, 0.002)], "degenerate: 1 point(s) of one size", id="one bucket"),
        pytest.param([(MIB, 0.002), (MIB, 0.004)], "degenerate: 2 point(s) of one size", id="one size"),
        pytest.param([(MIB, 0.004), (2 * MIB, 0.002)], "the fitted line does not grow with bytes", id="falling"),
        pytest.param([(MIB, 0.001), (2 * MIB, 0.003)], "the fitted latency is negative", id="negative latency"),
    ],
)
def test_fit_falls_back_to_a_zero_latency_line(points, note):
    fit = prediction.fit_allreduce(points)
    assert fit["method"] == "zero-latency line" and fit["note"].startswith(note)
    assert fit["latency_ns"] == 0
    # least squares through the origin: slope sum(b t) / sum(b^2)
    slope = sum(b * t for b, t in points) / sum(b * b for b, _ in points)
    assert fit["bytes_per_second"] == round(1 / slope)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64 * MIB), st.floats(1e-6, 1.0)), min_size=2, max_size=12))
def test_fit_matches_numpy_least_squares(points):
    fit = prediction.fit_allreduce(points)
    if fit["note"]:
        return
    slope, intercept = np.polyfit([float(b) for b, _ in points], [t for _, t in points], 1)
    assume(slope > 1e-15)  # a line flat to rounding: the two may differ in sign
    assert fit["latency_ns"] == pytest.approx(intercept * 1e9, abs=1.0, rel=1e-6)
    # bytes/s is an integer: 1/slope rounded, at least 1
    assert abs(fit["bytes_per_second"] - max(1.0, min(1 / slope, timing.MAX_BYTES_PER_SECOND))) <= 0.5 + 1e-6 / slope


def test_ddp_default_starts():
    # 0.5 + 0.75 MiB closes the first (>= 1 MiB); then 25 MiB buckets.
    sizes = [MIB // 2, 3 * MIB // 4, 20 * MIB, 5 * MIB, 30 * MIB, MIB]
    assert prediction.ddp_starts(sizes) == [2, 4, 5]


# --------------------------------------------------------------------------
# A record's prediction


RECORD = {
    "module": "M",
    "steps": [
        {"start_seen": True, "compute_end_s": 0.030, "buckets": [
            bucket(0, MIB, 0.004, 0.009), bucket(1, 8 * MIB, 0.012, 0.030), bucket(2, 8 * MIB, 0.020, 0.049),
            bucket(3, 4 * MIB, 0.029, 0.060)]},
        {"start_seen": True, "compute_end_s": 0.032, "buckets": [
            bucket(0, MIB, 0.005, 0.010), bucket(1, 8 * MIB, 0.013, 0.032), bucket(2, 8 * MIB, 0.021, 0.051),
            bucket(3, 4 * MIB, 0.031, 0.062)]},
    ],
}


def test_prediction_is_the_planners_answer_for_the_measured_inputs():
    rep = figures.report(RECORD)
    pred = rep["prediction"]
    step = rep["steps"][pred["step"]]
    assert pred["step"] == rep["median_step"] == 1
    request = pred["request"]
    launches = [b["launch_s"] for b in step["buckets"]]
    assert request["backward_ns"] == [round(b * 1e9) - round(a * 1e9) for a, b in zip([0.0] + launches, launches)]
    assert request["bytes"] == [b["bytes"] for b in step["buckets"]]
    assert (request["launch_ns"], request["slowdown_permille"]) == (0, 1000)
    assert request["allreduce"] == {k: pred["fit"][k] for k in ("latency_ns", "bytes_per_second")}
    # The fit's points: each bucket's service time, pooled over both steps.
    points, left_out = prediction.service_points(rep["steps"])
    assert len(points) == 8 and left_out == [] and pred["fit"]["points"] == 8
    # done less the later of launch and the earlier completion: 9-4, 30-12, 49-30, 60-49 ms
    assert [b for b, _ in points[:4]] == [MIB, 8 * MIB, 8 * MIB, 4 * MIB]
    assert [t for _, t in points[:4]] == pytest.approx([0.005, 0.018, 0.019, 0.011])

    model = extension.timeline(dict(request, starts=[1, 2, 3]))
    for b, m, measured in zip(pred["buckets"], model["buckets"], step["buckets"]):
        assert b["index"] == measured["index"]
        assert b["predicted_launch_s"] == m["ready_ns"] / 1e9 and b["predicted_done_s"] == m["done_ns"] / 1e9
        assert b["predicted_start_s"] == m["start_ns"] / 1e9
        assert b["launch_error_s"] == b["predicted_launch_s"] - measured["launch_s"]
        assert b["done_error_s"] == b["predicted_done_s"] - measured["done_s"]
    assert max(abs(b["launch_error_s"]) for b in pred["buckets"]) < 1e-9, "launches match by construction"
    assert pred["exposed_s"] == model["exposed_ns"] / 1e9
    assert pred["measured_exposed_s"] == rep["step_stats"][1]["exposed_s"]
    assert pred["exposed_error_s"] == pred["exposed_s"] - pred["measured_exposed_s"]
    json.dumps(pred, allow_nan=False)


def test_another_cap_lists_three_settings_the_optimum_least():
    pred = figures.report(RECORD)["prediction"]
    caps = {c["key"]: c for c in pred["caps"]}
    assert [c["key"] for c in pred["caps"]] == ["ddp_default", "current", "optimum"]
    request = pred["request"]
    for key, starts in (("ddp_default", prediction.ddp_starts(request["bytes"])), ("current", [1, 2, 3]), ("optimum", None)):
        model = extension.timeline(dict(request, starts=starts))
        assert caps[key]["exposed_s"] == model["exposed_ns"] / 1e9 and caps[key]["step_s"] == model["step_ns"] / 1e9
        assert caps[key]["bucket_bytes"] == [b["bytes"] for b in model["buckets"]]
    assert caps["ddp_default"]["bucket_bytes"] == [MIB, 20 * MIB], "DDP's rule over the measured buckets"
    assert caps["current"]["exposed_s"] == pred["exposed_s"]
    assert caps["optimum"]["search"] == "exact"
    assert all(caps["optimum"]["exposed_s"] <= c["exposed_s"] for c in pred["caps"])
    text = figures.format_summary(RECORD)
    assert "what would another cap give?" in text
    for c in pred["caps"]:
        assert c["setting"] in text
    assert "(dtype, device) groups" not in text


def test_another_cap_says_that_several_dtype_groups_cannot_merge():
    """DDP buckets each (dtype, device) group apart: the merged buckets are
    no layout it can hold, and the summary says so."""
    text = figures.format_summary(dict(RECORD, dtype_groups=2))
    assert "(the parameters span 2 (dtype, device) groups, which DDP buckets apart: merges across them" in text


@pytest.mark.parametrize(
    "bad, reason",
    [
        pytest.param(dict(done_s=math.nan), "launch 0.004 s, done nan s: not a finite time", id="NaN"),
        pytest.param(dict(done_s=0.004), "measured duration 0 ms: not > 0", id="zero duration"),
        pytest.param(dict(done_s=0.003), "measured duration -1 ms: not > 0", id="negative duration"),
    ],
)
def test_a_bad_duration_is_left_out_with_its_reason(bad, reason):
    record = json.loads(json.dumps(RECORD))
    record["steps"][0]["buckets"][0].update(bad)
    pred = figures.report(record)["prediction"]
    assert pred["fit"]["points"] == 7
    assert [(x["step"], x["index"]) for x in pred["left_out"]] == [(0, 0)]
    assert pred["left_out"][0]["reason"].startswith(reason)
    assert "left out of the fit: step 0 bucket 0:" in figures.format_summary(record)


def test_a_completion_that_is_not_a_number_gets_no_error():
    record = json.loads(json.dumps(RECORD))
    record["steps"][1]["buckets"][2]["done_s"] = math.nan
    pred = figures.report(record)["prediction"]
    assert pred["step"] == 1
    b = pred["buckets"][2]
    assert (b["done_s"], b["done_error_s"]) == (None, None) and b["predicted_done_s"] > 0
    assert pred["exposed_error_s"] == pred["exposed_s"] - pred["measured_exposed_s"], "from the buckets that completed"
    assert {(x["step"], x["index"]) for x in pred["left_out"]} == {(1, 2)}
    json.dumps(pred, allow_nan=False)
    lines = figures.format_summary(record).split("\n")
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("predicted by the timeline model")):]
    row = next(line for line in table if line.split()[:2] == ["2", "8.00"])
    assert row.split()[6:] == ["-", f"{b['predicted_done_s'] * 1e3:.1f}", "-"]


@pytest.mark.parametrize(
    "steps, reason",
    [
        pytest.param([{"compute_end_s": 0.01, "buckets": [bucket(0, MIB, 0.01, 0.01)]}],
                     "no bucket has a usable allreduce duration", id="every duration 0"),
        pytest.param([{"compute_end_s": 0.01, "buckets": [bucket(0, MIB, math.nan, 0.02)]}],
                     "bucket 0's launch is nan s", id="NaN launch"),
        pytest.param([{"compute_end_s": 0.01, "buckets": [bucket(0, 0, 0.005, 0.02)]}],
                     "bucket 0 has 0 bytes", id="no bytes"),
        pytest.param([{"compute_end_s": 5e9, "buckets": [bucket(0, MIB, 5e9, 6e9)]}],
                     "the planner refused the trace's inputs", id="beyond the model's range"),
    ],
)
def test_unusable_measurements_give_no_prediction_and_say_why(steps, reason):
    record = {"module": "M", "steps": steps}
    pred = figures.report(record)["prediction"]
    assert list(pred) == ["unavailable"] and reason in pred["unavailable"]
    assert f"predicted: none ({pred['unavailable']})" in figures.format_summary(record)


def test_no_steps_no_prediction():
    assert figures.report({"module": "M"})["prediction"] == {"unavailable": "no step with a DDP allreduce was recorded"}


# --------------------------------------------------------------------------
# A real trace, one rank


def test_one_rank_trace_carries_the_prediction(dist_group, tmp_path):
    entry = ZOO["mlp"]
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)

    def train(steps):
        for step in steps:
            optimizer.zero_grad(set_to_none=True)
            entry.loss(ddp(*entry.make_inputs(step))).backward()
            optimizer.step()

    train(range(2))  # one rank's DDP starts with one bucket and rebuilds them after its first step
    with goddp.trace(ddp, timeout=30) as tr:
        train(range(2, 5))
    record = tr.to_dict()
    pred = record["prediction"]
    assert "unavailable" not in pred, pred
    median = record["steps"][pred["step"]]
    assert len(median["buckets"]) > 1, "the test wants several buckets"
    assert [b["index"] for b in pred["buckets"]] == [b["index"] for b in median["buckets"]]
    fields = {"predicted_launch_s", "predicted_done_s", "launch_error_s", "done_error_s", "predicted_start_s"}
    assert all(fields <= set(b) for b in pred["buckets"])
    n = len(median["buckets"])
    model = extension.timeline(dict(pred["request"], starts=list(range(1, n))))
    assert [b["predicted_done_s"] for b in pred["buckets"]] == [m["done_ns"] / 1e9 for m in model["buckets"]]
    for b, measured in zip(pred["buckets"], median["buckets"]):
        # by construction, to the nanosecond (1 ns more per bucket launched in the same ns as the one before)
        assert abs(b["launch_error_s"]) <= n * 1e-9
        assert b["done_error_s"] == b["predicted_done_s"] - measured["done_s"]
        assert b["launch_error_s"] == b["predicted_launch_s"] - measured["launch_s"]
    caps = {c["key"]: c["exposed_s"] for c in pred["caps"]}
    assert list(caps) == ["ddp_default", "current", "optimum"] and caps["optimum"] <= min(caps.values())
    text = tr.summary()
    assert "predicted by the timeline model" in text and "what would another cap give?" in text
    json.dumps(record, allow_nan=False)
    pytest.importorskip("matplotlib")
    assert tr.plot(tmp_path / "t.png") == str(tmp_path / "t.png") and (tmp_path / "t.png").stat().st_size > 0
