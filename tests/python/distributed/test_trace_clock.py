"""goddp.trace's CUDA clock (Note [Trace clocks on CUDA]) without a GPU:
a step timed with events reads each time as the event's elapsed time from
the step's origin, in the device's order, not the order the host noted them.

The events are stand-ins with CUDA events' two methods; the host clock path
is the one every other trace test runs.
"""

from __future__ import annotations

import pytest

from goddp.tracing.figures import step_stats
from goddp.tracing.recorder import BucketEvent, Stamp, StepRecord, now


class FakeEvent:
    """What Stamp uses of torch.cuda.Event: synchronize, elapsed_time (ms)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.synced = False

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.synced and end.synced, "elapsed_time before both events completed"
        return (end.seconds - self.seconds) * 1e3


def at(seconds: float) -> Stamp:
    return Stamp(FakeEvent(seconds))


def bucket(index: int, launch, done=None) -> BucketEvent:
    return BucketEvent(index=index, bytes=1024 * (index + 1), params=1, param_ids=(index,), launch=launch, done=done)


def test_a_cuda_step_reads_device_times_from_its_start():
    # Appended in host order 1, 0; on the device bucket 0 launched first.
    step = StepRecord(start=at(10.0), compute_end=at(10.5), finalized=at(10.8), cuda=True,
                      buckets=[bucket(1, at(10.3), at(10.7)), bucket(0, at(10.1), at(10.4))])
    d = step.to_dict({0: "a", 1: "b"})
    assert [b["index"] for b in d["buckets"]] == [0, 1]
    assert [b["launch_s"] for b in d["buckets"]] == pytest.approx([0.1, 0.3])
    assert [b["done_s"] for b in d["buckets"]] == pytest.approx([0.4, 0.7])
    assert d["compute_end_s"] == pytest.approx(0.5) and d["finalized_s"] == pytest.approx(0.8)
    st = step_stats(d)
    assert st["exposed_s"] == pytest.approx(0.2) and st["launched_during_backward"] == 2


def test_a_cuda_step_without_start_or_completion():
    # No backward start seen: the origin is the first launch noted; a bucket
    # whose future never completed is counted done at the compute end.
    step = StepRecord(cuda=True, compute_end=at(5.9), buckets=[bucket(0, at(5.0), at(5.5)), bucket(1, at(5.6))])
    d = step.to_dict({})
    assert not d["start_seen"]
    assert [t for b in d["buckets"] for t in (b["launch_s"], b["done_s"])] == pytest.approx([0.0, 0.5, 0.6, 0.9])
    assert d["finalized_s"] is None


def test_the_host_clock_is_perf_counter_and_unchanged(monkeypatch):
    import time

    monkeypatch.setattr(time, "perf_counter", lambda: 1234.5)
    assert now(False) == 1234.5
    monkeypatch.undo()
    t = now(False)
    step = StepRecord(start=t, compute_end=t + 0.5, buckets=[bucket(0, t + 0.2, t + 0.6)])
    d = step.to_dict({})
    assert d["buckets"][0]["launch_s"] == pytest.approx(0.2) and d["compute_end_s"] == pytest.approx(0.5)
