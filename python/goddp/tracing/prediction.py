"""goddp.trace's prediction: the planner's timeline model (Note [Timeline]
in planner/timeline.go) fed with what the trace measured, set beside the
measurement, and what other caps would give (Note [Trace prediction]).
Python gathers the inputs and writes the words; every predicted time is
the planner's (goddp_timeline)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from goddp.native import extension
from goddp.options import MIB
from goddp.tools.timing import fit_allreduce

# DDP's default caps (bucket_cap_mb=25, its first bucket 1 MiB).
DDP_CAP = 25 * MIB
DDP_FIRST_CAP = MIB

# Note [Trace prediction]
#
# What goes into the model, for the median step (Note [Trace figures]):
# - Units: the step's buckets in launch order, one unit each. The trace
#   times no piece's backward, only when each bucket was handed to its comm
#   hook, which is when DDP found it ready (DDP launches buckets in order,
#   so one ready before the bucket before it launches, and counts as ready,
#   with that one). So a unit's backward duration is
#   estimated as the time from the previous bucket's launch (the first
#   bucket: from backward start) to its own, at least 1 ns. With compute
#   slowdown 1.0 the predicted launches then equal the measured ones by
#   construction (to the nanosecond; 1 ns later per bucket launched in the
#   same nanosecond as the one before); the completions and the exposed time
#   are what the model predicts. Backward compute after the last launch is
#   outside the model: its backward ends at the last bucket's launch.
# - Bytes: each bucket's, as recorded.
# - Allreduce cost: latency + bytes / bandwidth, fitted by least squares
#   (fit_allreduce) over every recorded step's buckets. Each bucket gives
#   its service time: its completion less the later of its launch and the
#   step's earlier completions, i.e. its measured duration less the wait
#   behind earlier buckets that the model adds itself. A bucket whose
#   times are not finite, whose duration is 0 or less, or that completed no
#   later than an earlier one (not one in-order stream) is left out, with
#   its reason.
# - Launch overhead: 0. It is a constant per bucket, as the latency is, and
#   the trace cannot tell the two apart: the fitted latency includes it.
# - Compute slowdown: 1.0 (the trace does not measure it).
#
# Another cap's buckets are the measured ones merged (the trace cannot
# time a finer split): DDP's default closes a bucket once it holds 1 MiB
# (the first) or 25 MiB (DDP's rule); the current setting keeps every
# measured bucket; the optimum is the planner's exact search over the same
# boundaries (PlanTimeline), so its predicted step is the least of the
# three.


class PredictionError(ValueError):
    """The trace's measurements give the model no usable input."""


def ddp_starts(sizes: Sequence[int]) -> list[int]:
    """DDP's default buckets over units in backward order, as unit starts: a
    bucket closes once it holds DDP_FIRST_CAP (the first) or DDP_CAP."""
    starts: list[int] = []
    size = 0
    for i, b in enumerate(sizes):
        size += b
        if size >= (DDP_FIRST_CAP if not starts else DDP_CAP) and i + 1 < len(sizes):
            starts.append(i + 1)
            size = 0
    return starts


def _finite(*values: Any) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def service_points(steps: Sequence[dict[str, Any]]) -> tuple[list[tuple[int, float]], list[dict[str, Any]]]:
    """Each bucket's (bytes, service time) over the normalized steps, and
    the buckets left out with their reasons (Note [Trace prediction])."""
    points: list[tuple[int, float]] = []
    left_out: list[dict[str, Any]] = []
    for i, step in enumerate(steps):
        earlier = -math.inf
        for b in step["buckets"]:
            launch, done, nbytes = b["launch_s"], b["done_s"], b["bytes"]
            reason = ""
            if not _finite(launch, done):
                reason = f"launch {launch!r} s, done {done!r} s: not a finite time"
            elif done - launch <= 0:
                reason = f"measured duration {(done - launch) * 1e3:g} ms: not > 0"
            elif not (isinstance(nbytes, int) and nbytes > 0):
                reason = f"{nbytes!r} bytes: not > 0"
            elif done <= earlier:
                reason = "completed no later than an earlier bucket: not one in-order stream"
            if reason:
                left_out.append({"step": i, "index": b["index"], "reason": reason})
            else:
                points.append((nbytes, done - max(launch, earlier)))
            if _finite(done):
                earlier = max(earlier, done)
    return points, left_out


def _units(step: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The median step's units: backward ns per bucket from its launch gaps,
    and its bytes (Note [Trace prediction])."""
    durations, sizes = [], []
    before = 0  # ns: gaps between rounded launches, so that their sums are the launches
    for b in step["buckets"]:
        launch, nbytes = b["launch_s"], b["bytes"]
        if not _finite(launch) or launch < 0:
            raise PredictionError(f"bucket {b['index']}'s launch is {launch!r} s: not a finite time from backward start")
        if not (isinstance(nbytes, int) and nbytes > 0):
            raise PredictionError(f"bucket {b['index']} has {nbytes!r} bytes; the model needs each bucket's bytes > 0")
        at = round(launch * 1e9)
        durations.append(max(1, at - before))
        sizes.append(nbytes)
        before = max(at, before + 1)
    if not _finite(step["compute_end_s"]):
        raise PredictionError(f"the backward's end is {step['compute_end_s']!r} s: not a finite time")
    return durations, sizes


def _seconds(ns: int) -> float:
    return ns / 1e9


def _measured(value: Any) -> float | None:
    """A measured time, None where it is not finite (no error is given
    against it)."""
    return float(value) if _finite(value) else None


def _error(predicted: float, measured: float | None) -> float | None:
    return None if measured is None else predicted - measured


def predict(steps: Sequence[dict[str, Any]], median: int, stats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The prediction for the median step of normalized steps (with their
    figures, stats); {"unavailable": reason} where the measurements give
    the model no usable input or the planner refuses them. A measured time
    that is not finite is None, and so is the error against it."""
    if median < 0:
        return {"unavailable": "no step with a DDP allreduce was recorded"}
    try:
        return _predict(steps, median, stats[median])
    except PredictionError as exc:
        return {"unavailable": str(exc)}
    except (extension.PlannerError, extension.ForkedChildError) as exc:
        return {"unavailable": f"the planner refused the trace's inputs: {exc}"}


def _predict(steps: Sequence[dict[str, Any]], median: int, stat: dict[str, Any]) -> dict[str, Any]:
    step = steps[median]
    durations, sizes = _units(step)
    points, left_out = service_points(steps)
    if not points:
        raise PredictionError("no bucket has a usable allreduce duration to fit the cost to: "
                              + "; ".join(f"step {x['step']} bucket {x['index']}: {x['reason']}" for x in left_out))
    fit = fit_allreduce(points)
    request = {
        "backward_ns": durations,
        "bytes": sizes,
        "allreduce": {"latency_ns": fit["latency_ns"], "bytes_per_second": fit["bytes_per_second"]},
        "launch_ns": 0,
        "slowdown_permille": 1000,
    }
    n = len(sizes)
    measured = extension.timeline(dict(request, starts=list(range(1, n))))
    buckets = []
    for b, p in zip(step["buckets"], measured["buckets"]):
        launch, done = _seconds(p["ready_ns"]), _seconds(p["done_ns"])
        measured_done = _measured(b["done_s"])
        buckets.append({
            "index": b["index"], "bytes": b["bytes"],
            "launch_s": b["launch_s"], "predicted_launch_s": launch, "launch_error_s": launch - b["launch_s"],
            "done_s": measured_done, "predicted_done_s": done, "done_error_s": _error(done, measured_done),
            "predicted_start_s": _seconds(p["start_ns"]),
        })
    exposed = _seconds(measured["exposed_ns"])
    measured_exposed = _measured(stat["exposed_s"])
    caps = []
    for key, setting, starts in (
        ("ddp_default", "DDP's default (25 MiB, first 1 MiB)", ddp_starts(sizes)),
        ("current", "current", list(range(1, n))),
        ("optimum", "timeline optimum", None),
    ):
        tl = measured if key == "current" else extension.timeline(dict(request, starts=starts))
        caps.append({
            "key": key, "setting": setting,
            "bucket_bytes": [b["bytes"] for b in tl["buckets"]],
            "exposed_s": _seconds(tl["exposed_ns"]), "step_s": _seconds(tl["step_ns"]), "search": tl["search"],
        })
    return {
        "step": median,
        "request": request,
        "fit": fit,
        "left_out": left_out,
        "start_seen": step["start_seen"],
        "buckets": buckets,
        "backward_s": _seconds(measured["backward_ns"]),
        "step_s": _seconds(measured["step_ns"]),
        "exposed_s": exposed,
        "measured_exposed_s": measured_exposed,
        "exposed_error_s": _error(exposed, measured_exposed),
        "caps": caps,
    }


def predicted_row(name: str, prediction: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """The picture's row of a prediction: its label, with the error of the
    predicted exposed time, and the predicted timeline as a step dict
    (launch: when the bucket is ready, as the measured launch); no step
    where there is no prediction."""
    if "buckets" not in prediction:
        return f"{name} predicted: none", None
    error = prediction["exposed_error_s"]
    label = f"{name} predicted" + ("" if error is None else f" (exposed {error * 1e3:+.1f} ms off)")
    return label, {
        "start_seen": True, "compute_end_s": prediction["backward_s"], "finalized_s": None,
        "buckets": [{"index": b["index"], "bytes": b["bytes"], "params": 0, "param_names": [],
                     "launch_s": b["predicted_launch_s"], "done_s": b["predicted_done_s"]}
                    for b in prediction["buckets"]],
    }
