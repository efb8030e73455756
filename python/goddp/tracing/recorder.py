"""What goddp.trace records, and the figures it derives (see goddp.tracing)."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from goddp.tools.ranges import allreduce_range
from goddp.tools.timing import Stamp, now, seconds_between
from goddp.tracing.figures import normalize_step


class TraceError(RuntimeError):
    """goddp.trace was used in a way it cannot honour; nothing was changed
    (unless the message says otherwise)."""


# --------------------------------------------------------------------------
# What is recorded


@dataclass
class BucketEvent:
    index: int
    bytes: int
    params: int
    param_ids: tuple[int, ...]  # named when the record is read, not in the hook
    launch: "float | Stamp"
    done: "float | Stamp | None" = None


@dataclass
class StepRecord:
    start: "float | Stamp | None" = None  # backward start (perf_counter seconds, or a Stamp)
    compute_end: "float | Stamp | None" = None
    finalized: "float | Stamp | None" = None
    buckets: list[BucketEvent] = field(default_factory=list)
    cuda: bool = False  # timed with CUDA events (Note [Trace clocks on CUDA])

    def raw(self, names: dict[int, str]) -> dict[str, Any]:
        """The recorded times in seconds from backward start (from the first
        launch when the start was not seen; None where nothing was
        recorded), buckets as appended; `names`: parameter id -> name."""
        if self.start is not None:
            origin = self.start
        else:  # the earliest launch; events are ordered on the device, not here
            origin = self.buckets[0].launch if self.cuda else min(b.launch for b in self.buckets)

        def at(stamp):
            return None if stamp is None else seconds_between(stamp, origin)

        return {
            "start_seen": self.start is not None,
            "compute_end_s": at(self.compute_end),
            "finalized_s": at(self.finalized),
            "buckets": [
                {
                    "index": b.index,
                    "bytes": b.bytes,
                    "params": b.params,
                    "param_names": [names.get(i, "?") for i in b.param_ids],
                    "launch_s": at(b.launch),
                    "done_s": at(b.done),
                }
                for b in self.buckets
            ],
        }

    def to_dict(self, names: dict[int, str]) -> dict[str, Any]:
        """The step dict: raw(), normalized (a compute end, every bucket
        done, buckets in launch order; goddp.tracing.figures)."""
        return normalize_step(self.raw(names))


# --------------------------------------------------------------------------
# Recording (called from autograd and from comm hooks)


class Recorder:
    def __init__(self, names: dict[int, str], max_steps: int) -> None:
        self.names = names
        self.steps: list[StepRecord] = []
        self.dropped = 0
        self._max_steps = max_steps
        self._open: StepRecord | None = None
        self.pending_forward = False
        self.recording = True
        self.cuda = False  # the last traced forward's output is on a CUDA device
        self._lock = threading.Lock()

    # DDP's post-forward: hook the output's autograd nodes.
    def after_forward(self, output: Any, reduces: bool) -> None:
        """`reduces`: DDP armed its reducer for this forward's backward."""
        if not (self.recording and torch.is_grad_enabled()):
            return
        with self._lock:
            # A step still open now lost its backward to an error (the
            # engine runs final callbacks only on success): forget it, so
            # that it does not hold the trace "in backward" for good.
            self._open = None
        fired = [False]

        def prehook(grad_outputs):
            if not fired[0]:
                fired[0] = True
                self._backward_started()
            return None

        hooked = False
        for leaf in torch.utils._pytree.tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None:
                leaf.grad_fn.register_prehook(prehook)
                hooked = True
                self.cuda = leaf.is_cuda
        self.pending_forward = self.pending_forward or (hooked and reduces)

    def _backward_started(self) -> None:
        self.pending_forward = False
        step = StepRecord(start=now(self.cuda), cuda=self.cuda)
        with self._lock:
            self._open = step
        engine = torch.autograd.Variable._execution_engine

        def compute_done() -> None:
            step.compute_end = now(step.cuda)
            engine.queue_callback(finalized)

        def finalized() -> None:
            step.finalized = now(step.cuda)
            self._close(step)

        engine.queue_callback(compute_done)

    def launched(self, bucket: Any) -> BucketEvent:
        buf = bucket.buffer()
        step = self._open
        cuda = step.cuda if step is not None else buf.is_cuda
        launch = now(cuda)
        params = bucket.parameters()
        event = BucketEvent(
            index=bucket.index(),
            bytes=buf.numel() * buf.element_size(),
            params=len(params),
            param_ids=tuple(map(id, params)),
            launch=launch,
        )
        with self._lock:
            if self._open is None:
                # No backward start was seen (an output without autograd
                # node): the step starts at its first launch.
                self._open = StepRecord(cuda=cuda)
            step = self._open
            step.buckets.append(event)
            if bucket.is_last() and step.start is None:
                self._close_locked(step)
        return event

    def _close(self, step: StepRecord) -> None:
        with self._lock:
            self._close_locked(step)

    def _close_locked(self, step: StepRecord) -> None:
        if self._open is step:
            self._open = None
        if step.buckets and self.recording:  # a no_sync backward reduces nothing
            self.steps.append(step)
            if len(self.steps) > self._max_steps:
                del self.steps[0]
                self.dropped += 1

    def in_backward(self) -> bool:
        """A backward of the traced module has started and not finished."""
        return self._open is not None


def timing_hook(recorder_ref: "weakref.ref[Recorder]", reduce: Callable[[Any, Any], Any], first: bool):
    """A comm hook: notes the launch, runs `reduce(state, bucket)` and notes
    when its future completes. The future's value is passed through, or its
    first element when `first` (a collective's own future holds a list); one
    callback does both, so the trace adds no second hop on the future
    (a second one only while a profiler records: its range's end)."""

    def result(fut):
        return fut.value()[0] if first else fut.value()

    def goddp_trace_hook(state, bucket):
        recorder = recorder_ref()
        if recorder is None or not recorder.recording:
            future = reduce(state, bucket)
            return future.then(result) if first else future
        event = recorder.launched(bucket)
        # Named in a torch.profiler trace while one records (Note [Piece ranges]).
        future = allreduce_range(event.index, lambda: reduce(state, bucket))

        def done(fut):
            # On CUDA: recorded on the stream that waits for the collective.
            event.done = now(isinstance(event.launch, Stamp))
            return result(fut)

        return future.then(done)

    return goddp_trace_hook
