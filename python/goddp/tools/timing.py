"""Times and what is fitted to them: a step's clock (the host's, or CUDA
events on a GPU) and the allreduce's cost line. goddp.trace records with
them (goddp.tracing), and bucket_cap_mb="auto" measures with them
(goddp.ranks.auto)."""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

# The largest bandwidth the model is given (bytes/s): a fitted line that is
# nearly flat means an allreduce that costs next to nothing per byte.
MAX_BYTES_PER_SECOND = 1 << 62


# Note [Trace clocks on CUDA]
# The hooks run on the host, which runs ahead of a GPU: when a comm hook is
# called the host has only queued the kernels that produce the bucket's
# gradients, and an NCCL future completes on the host as soon as its
# collective is queued. Host timestamps would tell when work was queued,
# not when it ran. So a step whose tensors are on a CUDA device takes every
# timestamp as a CUDA event (Stamp) recorded on the current stream at that
# point; in a future's callback that stream waits for the collective (torch
# runs the callbacks of CUDA futures on streams synchronised with them), so
# the event completes when the allreduce has. The events' elapsed times are
# read when the record is read, which waits for them; nothing synchronises
# the device while the step runs.


class Stamp:
    """A time on a CUDA device: an event recorded on the current stream
    (Note [Trace clocks on CUDA]); `event` is for tests."""

    __slots__ = ("event",)

    def __init__(self, event: Any = None) -> None:
        if event is None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        self.event = event


def now(cuda: bool) -> "float | Stamp":
    """A timestamp: the host's perf_counter, or a Stamp for a CUDA step."""
    return Stamp() if cuda else time.perf_counter()


def seconds_between(stamp: "float | Stamp", origin: "float | Stamp") -> float:
    """stamp - origin in seconds (host times, or CUDA events: waits for both)."""
    if isinstance(stamp, Stamp):
        origin.event.synchronize()
        stamp.event.synchronize()
        return origin.event.elapsed_time(stamp.event) / 1e3
    return stamp - origin


def fit_allreduce(points: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """latency + bytes / bandwidth through (bytes, seconds) points (bytes >
    0, seconds > 0 and finite) by least squares. Where that line is not
    usable, a zero-latency line, fitted by least squares too, with the
    reason in "note": fewer than two distinct sizes (degenerate), a line
    that does not grow with bytes, or a negative latency. Returns
    latency_ns, bytes_per_second (integers, as goddp_timeline takes them),
    points, method and note."""
    if not points:
        raise ValueError("no allreduce duration to fit")
    n = len(points)
    sizes = {b for b, _ in points}
    note = ""
    slope = intercept = 0.0
    if len(sizes) < 2:
        note = f"degenerate: {n} point(s) of one size ({next(iter(sizes))} bytes)"
    else:
        mb = sum(b for b, _ in points) / n
        mt = sum(t for _, t in points) / n
        sbb = sum((b - mb) ** 2 for b, _ in points)
        slope = sum((b - mb) * (t - mt) for b, t in points) / sbb
        intercept = mt - slope * mb
        if slope <= 0:
            note = "the fitted line does not grow with bytes"
        elif intercept < 0:
            note = f"the fitted latency is negative ({intercept * 1e3:.3f} ms)"
    if note:
        slope = sum(b * t for b, t in points) / sum(b * b for b, _ in points)
        intercept = 0.0
    return {
        "latency_ns": round(intercept * 1e9),
        "bytes_per_second": min(MAX_BYTES_PER_SECOND, max(1, round(1 / slope))),
        "points": n,
        "method": "zero-latency line" if note else "least squares",
        "note": note,
    }
