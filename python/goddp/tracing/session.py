"""goddp.trace: when does each DDP bucket's allreduce run, relative to backward?

(This module is goddp.tracing; ``goddp.trace`` is its ``trace`` function.)

    with goddp.trace(ddp_model) as tr:      # every rank of the DDP group
        for batch in batches:               # a few ordinary training steps
            train_step(batch)
    print(tr.summary())                     # per-bucket and per-step table, verdict
    tr.plot("overlap.png")                  # launch timeline, one row per step
    json.dumps(tr.to_dict())

Works on any DistributedDataParallel module: eager, compiled with goddp, or
compiled with torch's DDPOptimizer (pass the DDP module or what
``torch.compile`` returned for it).

What is recorded, per step (one backward pass that reduced gradients):
- backward start: the moment the gradient reaches the DDP module's output
  (a pre-hook on the output's autograd node, added by wrapping DDP's
  ``_post_forward`` for the duration of the trace). The loss's own backward
  before that is not the model's and is left out.
- backward compute end: an autograd-engine final callback queued at backward
  start. The engine runs final callbacks in the order they were queued, and
  DDP's reducer queues its own (which waits for every allreduce) only when
  the first gradient is ready, so ours runs after the last autograd node and
  before DDP starts waiting: it marks when backward would have returned
  without communication. A second callback, queued from the first, runs
  after DDP's and marks when ``loss.backward()`` really returns.
- per bucket: bytes, parameters, when the comm hook was called (launch) and
  when the future it returned completed (done). The duration includes
  waiting for the slower ranks to launch the same bucket.

Exposed communication is the time from the compute end to the last
allreduce's completion; the overlapped fraction is the share of the time
during which some allreduce was in flight that lies before the compute end.
A bucket counts as launched during backward when backward still had at least
``DURING_BACKWARD_MARGIN`` of its duration left: the last bucket is always
launched just before the end (an unsplit compiled graph launches none before
its single backward node has finished).

How it hooks DDP (see ``_Installation``): DDP's C++ reducer takes one comm
hook, once, and cannot forget it. Entering the trace registers a timing hook
that either chains to the user's Python hook or performs DDP's own default
reduction with DDP's own arithmetic (so gradients are bit-identical); where a
hook is already registered (at the start of the next forward), or when
leaving, DDP gets a fresh reducer built by DDP's own ``_ddp_init_helper``
with exactly the buckets it has now, and the comm hooks it should have.
Built-in C++ hooks cannot be wrapped and are refused.

Ranks (the contract): entering and leaving the trace are collective over the
DDP module's process group. Every rank must enter at the same step and leave
at the same step, because a fresh reducer makes DDP re-derive its buckets
after its next step, which includes a broadcast. Each rank waits for the
others through the c10d store (not the process group) for at most
``timeout`` seconds (``GODDP_TRACE_TIMEOUT``, default 300); all ranks then
follow one decision: if any rank refused or did not arrive, nobody changes
anything (on entry) and ``TraceError`` is raised on every rank that arrived;
if they do not leave together, every rank keeps the trace's hook, which
then only passes through, so that all still communicate alike. Enter and
leave between steps; leaving between a forward and its backward is handled
too (the fresh reducer is armed as DDP's forward armed the old one).
When leaving, each rank also publishes its record in the store, so
``summary(gather=True)`` and ``to_dict(gather=True)`` on any rank, any number
of times, only read what the others published (waiting at most ``timeout``
for ranks that have not left yet, then showing the ranks it has): calling
them on one rank only, or on every rank, never deadlocks.
"""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from goddp.ddp import private
from goddp.ddp.private import ReducerLost
from goddp.ddp.refusals import TRACE_ACTIVE_ATTR, trace_refusal
from goddp.graph.export import parameter_names
from goddp.ranks.group import group_of, missing_ranks_message, store_for, timeout_s
from goddp.ranks.store_round import agree, gather, publish

logger = logging.getLogger("goddp")

__all__ = ["trace", "Trace", "TraceError", "step_stats", "verdict", "median_step", "plot_steps", "draw_launch_rows"]

DEFAULT_TIMEOUT_S = 300.0
# A bucket launched with less than this share of backward left counts as
# launched at the end (see the module doc).
DURING_BACKWARD_MARGIN = 0.05
# Steps kept per trace; older ones are dropped (a trace left open for a
# whole run must not grow without bound).
MAX_STEPS = 1000


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
    launch: float
    done: float | None = None


@dataclass
class StepRecord:
    start: float | None = None  # backward start (perf_counter seconds)
    compute_end: float | None = None
    finalized: float | None = None
    buckets: list[BucketEvent] = field(default_factory=list)

    def to_dict(self, names: dict[int, str]) -> dict[str, Any]:
        """Times in seconds from backward start (from the first launch when
        the start was not seen); `names`: parameter id -> name."""
        t0 = self.start if self.start is not None else min(b.launch for b in self.buckets)
        last_launch = max(b.launch for b in self.buckets)
        compute_end = self.compute_end if self.compute_end is not None else last_launch
        buckets = [
            {
                "index": b.index,
                "bytes": b.bytes,
                "params": b.params,
                "param_names": [names.get(i, "?") for i in b.param_ids],
                "launch_s": b.launch - t0,
                "done_s": (b.done if b.done is not None else compute_end) - t0,
            }
            for b in sorted(self.buckets, key=lambda b: (b.launch, b.index))
        ]
        return {
            "start_seen": self.start is not None,
            "compute_end_s": max(compute_end, last_launch) - t0,
            "finalized_s": (self.finalized - t0) if self.finalized is not None else None,
            "buckets": buckets,
        }


def step_stats(step: dict[str, Any]) -> dict[str, Any]:
    """Figures of one step dict (``StepRecord.to_dict``): backward time, last
    completion, exposed communication, overlapped fraction, buckets launched
    during backward. Pure arithmetic on the dict; the bench uses it too."""
    end = step["compute_end_s"]
    buckets = step["buckets"]
    last_done = max((b["done_s"] for b in buckets), default=end)
    busy = _union([(b["launch_s"], b["done_s"]) for b in buckets])
    busy_total = sum(e - s for s, e in busy)
    busy_before = sum(max(0.0, min(e, end) - s) for s, e in busy)
    margin = DURING_BACKWARD_MARGIN * end
    total_bytes = sum(b["bytes"] for b in buckets)
    return {
        "backward_s": end,
        "last_done_s": last_done,
        "exposed_s": max(0.0, last_done - end),
        "comm_busy_s": busy_total,
        "overlapped": (busy_before / busy_total) if busy_total > 0 else 1.0,
        "buckets": len(buckets),
        "launched_during_backward": sum(1 for b in buckets if b["launch_s"] <= end - margin),
        # Byte-weighted mean of how long before the compute end each byte's
        # allreduce started: no threshold; about 0 for an unsplit graph.
        "head_start_s": (sum(b["bytes"] * (end - b["launch_s"]) for b in buckets) / total_bytes)
        if total_bytes else 0.0,
    }


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def median_step(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The step with the median backward time (the upper one of two)."""
    if not steps:
        return None
    return sorted(steps, key=lambda s: s["compute_end_s"])[len(steps) // 2]


def verdict(steps: Sequence[dict[str, Any]]) -> str:
    """One line: buckets launched during backward (median step) and the
    median share of communication left exposed."""
    step = median_step(steps)
    if step is None:
        return "no step with a DDP allreduce was recorded"
    stats = step_stats(step)
    exposed = statistics.median(1.0 - step_stats(s)["overlapped"] for s in steps)
    return (
        f"{stats['launched_during_backward']} of {stats['buckets']} buckets launched before backward ended; "
        f"{exposed:.0%} of communication exposed"
    )


# --------------------------------------------------------------------------
# Recording (called from autograd and from comm hooks)


class _Recorder:
    def __init__(self, names: dict[int, str], max_steps: int) -> None:
        self.names = names
        self.steps: list[StepRecord] = []
        self.dropped = 0
        self._max_steps = max_steps
        self._open: StepRecord | None = None
        self.pending_forward = False
        self.recording = True
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
        self.pending_forward = self.pending_forward or (hooked and reduces)

    def _backward_started(self) -> None:
        self.pending_forward = False
        step = StepRecord(start=time.perf_counter())
        with self._lock:
            self._open = step
        engine = torch.autograd.Variable._execution_engine

        def compute_done() -> None:
            step.compute_end = time.perf_counter()
            engine.queue_callback(finalized)

        def finalized() -> None:
            step.finalized = time.perf_counter()
            self._close(step)

        engine.queue_callback(compute_done)

    def launched(self, bucket: Any) -> BucketEvent:
        now = time.perf_counter()
        buf = bucket.buffer()
        params = bucket.parameters()
        event = BucketEvent(
            index=bucket.index(),
            bytes=buf.numel() * buf.element_size(),
            params=len(params),
            param_ids=tuple(map(id, params)),
            launch=now,
        )
        with self._lock:
            if self._open is None:
                # No backward start was seen (an output without autograd
                # node): the step starts at its first launch.
                self._open = StepRecord()
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


def _timing_hook(recorder_ref: "weakref.ref[_Recorder]", reduce: Callable[[Any, Any], Any], first: bool):
    """A comm hook: notes the launch, runs `reduce(state, bucket)` and notes
    when its future completes. The future's value is passed through, or its
    first element when `first` (a collective's own future holds a list); one
    callback does both, so the trace adds no second hop on the future."""

    def result(fut):
        return fut.value()[0] if first else fut.value()

    def goddp_trace_hook(state, bucket):
        recorder = recorder_ref()
        if recorder is None or not recorder.recording:
            future = reduce(state, bucket)
            return future.then(result) if first else future
        event = recorder.launched(bucket)
        future = reduce(state, bucket)

        def done(fut):
            event.done = time.perf_counter()
            return result(fut)

        return future.then(done)

    return goddp_trace_hook


def _ddp_default_reduction(ddp: Any) -> Callable[[Any, Any], Any]:
    """DDP's built-in reduction, as a Python hook with DDP's own arithmetic.

    Without a hook, DDP's reducer scales each gradient by 1/world while
    copying it into the bucket (a multiplication by the reciprocal) or, when
    the gradient already is a view of the bucket (gradient_as_bucket_view
    after the first step) or copies are batched, divides in place; then it
    sums the bucket over the group. With a hook it only copies, so the hook
    does the scaling, the same way. Multiplying by 1/n and dividing by n
    agree bit for bit when n is a power of two; for other world sizes the
    first step of a gradient_as_bucket_view module may differ in the last
    bit (DDP mixes both there). DDP's Join (uneven inputs) changes the
    divisor and is not reproduced."""
    group = ddp.process_group
    size = group.size()
    divide = bool(ddp.gradient_as_bucket_view or getattr(ddp, "batched_grad_copy", False))
    reciprocal = 1.0 / size

    def reduce(state, bucket):
        buf = bucket.buffer()
        if divide:
            buf.div_(size)
        else:
            buf.mul_(reciprocal)
        # The group's own allreduce (a sum), as DDP's reducer calls it,
        # without torch.distributed.all_reduce's per-call Python checks.
        return group.allreduce([buf]).get_future()

    return reduce


# --------------------------------------------------------------------------
# Installing and removing the hooks on DDP


def unwrap_ddp(module: Any) -> Any:
    """The DistributedDataParallel module behind `module` (itself, or what
    torch.compile wrapped); TraceError otherwise."""
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(module, "_orig_mod", module)
    if not isinstance(inner, DistributedDataParallel):
        raise TraceError(
            f"goddp.trace needs a DistributedDataParallel module (or torch.compile of one), "
            f"got {type(module).__name__}"
        )
    return inner


def _rebuild_reducer(ddp: Any, hooks: list[tuple[Callable, Any]], in_forward: bool = False) -> None:
    """A fresh reducer for ddp with its current buckets and `hooks`
    (goddp.ddp.private.rebuild_reducer). The fresh reducer derives its
    buckets once more after its first step, from the same settings and
    gradient order, which gives the same buckets."""
    try:
        private.rebuild_reducer(ddp, hooks=hooks, keep_buckets=True, in_forward=in_forward)
    except ReducerLost as lost:
        raise TraceError(str(lost).replace("goddp:", "goddp.trace:", 1)) from lost


class _Installation:
    """The hooks of one trace on one DDP module, and how to take them off."""

    def __init__(self, ddp: Any, recorder: _Recorder) -> None:
        self.ddp = ddp
        self.recorder = recorder
        self.user_hooks = private.comm_hooks(ddp)
        if self.user_hooks:
            user_hook, state = self.user_hooks[0]
            self.hook_name = getattr(user_hook, "__qualname__", repr(user_hook))
            self.hooks = [(_timing_hook(weakref.ref(recorder), user_hook, first=False), state)]
        else:
            self.hook_name = "DDP's default allreduce"
            self.hooks = [(_timing_hook(weakref.ref(recorder), _ddp_default_reduction(ddp), first=True), None)]
        self.removed = False
        # Where a user hook must be swapped for ours, the fresh reducer is
        # built at the start of the next forward that reduces, after DDP's
        # pre-forward (as goddp's alignment does): a reducer swapped between
        # a forward and its backward would not reduce that backward.
        self.rebuild_pending = bool(self.user_hooks)

    def install(self) -> None:
        ddp = self.ddp
        if not self.user_hooks:
            # No hook yet: the reducer takes ours as it is; nothing to rebuild.
            private.register_comm_hooks(ddp, self.hooks)
        recorder = self.recorder
        pre_forward, post_forward = private.forward_steps(ddp)

        @torch.compiler.disable(recursive=True)
        def _pre_forward(*inputs, **kwargs):
            result = pre_forward(ddp, *inputs, **kwargs)
            if self.rebuild_pending and torch.is_grad_enabled() and ddp.require_backward_grad_sync:
                self.rebuild_pending = False
                _rebuild_reducer(ddp, self.hooks, in_forward=True)
            return result

        # Dynamo skips DDP's forward but would convert the frames it calls
        # that live outside torch (this one, under torch.compile): costly on
        # every step and useless, so it runs eagerly like DDP's own.
        @torch.compiler.disable(recursive=True)
        def _post_forward(output):
            # Read before DDP's post-forward, as DDP's pre-forward saw it.
            reduces = torch.is_grad_enabled() and ddp.require_backward_grad_sync
            output = post_forward(ddp, output)
            recorder.after_forward(output, reduces)
            return output

        private.override_forward_steps(ddp, _pre_forward, _post_forward)
        setattr(ddp, TRACE_ACTIVE_ATTR, self)

    def remove(self) -> None:
        ddp = self.ddp
        self.recorder.recording = False
        private.restore_forward_steps(ddp)
        ddp.__dict__.pop(TRACE_ACTIVE_ATTR, None)
        self.removed = True
        if self.rebuild_pending:  # no forward swapped the reducer: it is DDP's own still
            return
        _rebuild_reducer(ddp, self.user_hooks)
        if self.recorder.pending_forward:
            # A forward ran and its backward has not: arm the fresh reducer
            # the way DDP's forward armed the old one, or that backward
            # would not reduce (find_unused_parameters is refused before).
            private.arm_for_backward(ddp)


# --------------------------------------------------------------------------
# Agreeing across ranks


TIMEOUT_ENV = "GODDP_TRACE_TIMEOUT"
_EVENTS = {"enter": "entering the trace", "leave": "leaving the trace"}

_seq_lock = threading.Lock()
_seqs: dict[str, "itertools.count[int]"] = {}


class _Rounds:
    """This trace's rounds and records in the c10d store, for the DDP
    module's group (goddp.ranks: the group, the store, how a round settles)."""

    def __init__(self, ddp: Any, timeout: float) -> None:
        self.group = group_of(ddp, timeout)
        self.store = store_for(self.group)
        # The sequence counts this process's traces on that group, so each
        # trace gets keys of its own.
        with _seq_lock:
            seq = next(_seqs.setdefault(self.group.name, itertools.count()))
        self.prefix = f"goddp/trace/{self.group.name}/{seq}"

    def agree(self, phase: str, verdict: str) -> None:
        """Publishes this rank's verdict ("ok" or a reason) for `phase`;
        returns when every rank said "ok", else raises TraceError (on every
        rank alike: they follow the round's one outcome)."""
        ended = agree(self.store, f"{self.prefix}/{phase}", self.group, verdict, f"{phase} the trace")
        if ended.gave_up:
            raise TraceError(
                missing_ranks_message(
                    "goddp.trace", self.group, _EVENTS[phase], ended, f"Every rank must {phase} it at the same step"
                )
            )
        if ended.outcome != "go":
            reasons = "; ".join(f"rank {r}: {v}" for r, v in sorted(ended.statements.items()) if v != "ok")
            raise TraceError(f"goddp.trace: cannot {phase} the trace ({reasons})")

    def publish(self, record: dict[str, Any]) -> None:
        publish(self.store, f"{self.prefix}/record/{self.group.rank}", record)

    def gather(self, timeout: float) -> dict[int, dict[str, Any]]:
        """Every rank's published record; ranks that did not publish within
        `timeout` seconds are left out."""
        return gather(self.store, {r: f"{self.prefix}/record/{r}" for r in self.group.ranks}, timeout)


# --------------------------------------------------------------------------
# Plans goddp made for this model


def _compiled_by_goddp(ddp: Any) -> bool:
    """Whether goddp's backend compiled a graph inside this DDP module's
    forward (it notes every such module once)."""
    try:
        from goddp.ddp.settings import _noted_modules

        return ddp in _noted_modules
    except Exception:  # a goddp without that note: no plan is attributed
        return False


def _attributed_plans(ddp: Any) -> list[dict[str, Any]]:
    """goddp_plans_for, never raising: a record must still be published
    when the attribution fails, since the other ranks gather it."""
    try:
        return goddp_plans_for(ddp)
    except Exception:
        logger.debug("goddp.trace: could not attribute goddp's plans", exc_info=True)
        return []


def goddp_plans_for(ddp: Any) -> list[dict[str, Any]]:
    """The goddp plans (from ``goddp.last_plans()``) of this DDP module's
    graphs, oldest first, one per fingerprint; empty when goddp did not
    compile it. Plan records do not name their module, so a plan is this
    module's when its buckets hold only this module's parameter names and,
    where goddp aligned DDP's buckets to the pieces, its buckets are those
    caps (otherwise: its buckets were not aligned)."""
    from goddp.ddp.align import ALIGNED_CAPS_ATTR
    from goddp.reports.records import last_plans

    if not _compiled_by_goddp(ddp):
        return []
    names = {n for n, _ in ddp.module.named_parameters()}
    caps = getattr(ddp, ALIGNED_CAPS_ATTR, None)
    found: dict[Any, dict[str, Any]] = {}
    for record in last_plans():
        buckets = record.get("buckets") or []
        if not buckets or not all(set(b.get("param_names", ())) <= names for b in buckets):
            continue
        aligned = bool((record.get("ddp_buckets") or {}).get("aligned"))
        if caps is not None and (not aligned or tuple(max(1, int(b["bytes"])) for b in buckets) != tuple(caps)):
            continue
        if caps is None and aligned:
            continue
        fingerprint = record.get("fingerprint")
        found.pop(fingerprint, None)
        found[fingerprint] = {
            "fingerprint": f"{fingerprint:016x}" if isinstance(fingerprint, int) else None,
            "mode": record.get("mode"),
            "num_pieces": record.get("num_pieces"),
            "bucket_bytes": [b["bytes"] for b in buckets],
            "bucket_param_names": [list(b.get("param_names", ())) for b in buckets],
            "ddp_buckets": record.get("ddp_buckets"),
            "fallback": record.get("fallback"),
        }
    return list(found.values())


# --------------------------------------------------------------------------
# The public object


class Trace:
    """A context manager recording one DDP module's allreduce timeline; see
    the module doc. Create it with ``goddp.trace(module)``."""

    def __init__(self, module: Any, *, timeout: float | None = None, max_steps: int = MAX_STEPS) -> None:
        self._ddp = unwrap_ddp(module)
        self._timeout = timeout_s(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, timeout, "goddp.trace")
        if max_steps < 1:
            raise ValueError(f"goddp.trace: max_steps must be at least 1, got {max_steps!r}")
        self._max_steps = max_steps
        self._rounds: _Rounds | None = None
        self._installation: _Installation | None = None
        self._recorder: _Recorder | None = None
        self._closed_record: dict[str, Any] | None = None
        self._hook_name = ""
        self._plans: list[dict[str, Any]] = []
        self._leave_tried = False

    # -- entering and leaving

    def __enter__(self) -> "Trace":
        if self._rounds is not None:
            raise TraceError("goddp.trace: this trace object was already entered; create a new one")
        ddp = self._ddp
        refusal = trace_refusal(ddp)
        rounds = self._rounds = _Rounds(ddp, self._timeout)
        try:
            rounds.agree("enter", refusal or "ok")
        except TraceError as refused:
            raise TraceError(f"{refused}; nothing was changed") from None
        recorder = self._recorder = _Recorder(parameter_names(ddp.module), self._max_steps)
        installation = _Installation(ddp, recorder)
        installation.install()
        self._installation = installation
        self._hook_name = installation.hook_name
        logger.info("goddp.trace: recording %s (comm hook: %s)", type(ddp.module).__name__, self._hook_name)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self) -> None:
        """Leaves the trace (what ``with`` does on exit); idempotent."""
        installation, rounds = self._installation, self._rounds
        if installation is None or installation.removed or rounds is None or self._leave_tried:
            return
        recorder = installation.recorder
        verdict = "ok"
        if recorder.in_backward():
            verdict = "a backward of the traced module has not finished"
        elif recorder.pending_forward and self._ddp.find_unused_parameters:
            verdict = "a forward ran whose backward has not (find_unused_parameters=True)"
        self._leave_tried = True
        try:
            rounds.agree("leave", verdict)
        except TraceError as refused:
            # Not every rank leaves now: keep the same reducer on all of them,
            # so they keep communicating alike. The hook passes through.
            raise TraceError(
                f"{refused}; DDP keeps goddp.trace's pass-through comm hook (same communication, same gradients)"
            ) from None
        finally:
            recorder.recording = False
        # Nothing that can fail on one rank alone may run between the agreed
        # "go" and the removal: every rank must change its reducer alike.
        installation.remove()
        self._plans = _attributed_plans(self._ddp)
        self._closed_record = self._record()
        rounds.publish(self._closed_record)

    # -- results

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The recorded steps (``StepRecord.to_dict``), oldest first."""
        if self._recorder is None:
            return []
        return [s.to_dict(self._recorder.names) for s in list(self._recorder.steps)]

    def _record(self) -> dict[str, Any]:
        rounds = self._rounds
        steps = self.steps
        return {
            "rank": dist.get_rank() if dist.is_initialized() else 0,
            "ranks": list(rounds.group.ranks) if rounds else [],
            "module": type(self._ddp.module).__name__,
            "comm_hook": self._hook_name,
            "goddp_plans": self._plans or _attributed_plans(self._ddp),
            "steps": steps,
            "step_stats": [step_stats(s) for s in steps],
            "dropped_steps": self._recorder.dropped if self._recorder else 0,
            "verdict": verdict(steps),
        }

    def to_dict(self, gather: bool = False) -> dict[str, Any]:
        """This rank's record (JSON-serialisable); with gather=True, a dict
        {"ranks": {rank: record}} of every rank that published (see the
        module doc for the contract)."""
        mine = self._closed_record or self._record()
        if not gather:
            return mine
        return {"ranks": {str(r): rec for r, rec in self._gathered(mine).items()}}

    def _gathered(self, mine: dict[str, Any]) -> dict[int, dict[str, Any]]:
        if self._rounds is None or self._closed_record is None:
            raise TraceError("goddp.trace: gather=True needs a trace that was entered and left")
        records = self._rounds.gather(self._timeout)
        records[self._rounds.group.rank] = mine
        return dict(sorted(records.items()))

    def summary(self, gather: bool = False) -> str:
        """A readable table: per-bucket bytes, launch offset and duration of
        the median step, per-step figures, the verdict, goddp's plan."""
        mine = self.to_dict()
        if not gather:
            return format_summary(mine)
        records = self._gathered(mine)
        missing = [r for r in (self._rounds.group.ranks if self._rounds else []) if r not in records]
        text = "\n\n".join(format_summary(rec) for rec in records.values())
        if missing:
            text += f"\n\n(ranks {missing} had not published their trace within {self._timeout:g} s)"
        return text

    def plot(self, path: str | os.PathLike, gather: bool = False, title: str | None = None) -> str:
        """Writes the launch timeline as a PNG: one row per step of this rank,
        or with gather=True one row per rank (its median step)."""
        if gather:
            rows = [(f"rank {r}", median_step(rec["steps"])) for r, rec in self._gathered(self.to_dict()).items()]
        else:
            rows = [(f"step {i}", s) for i, s in enumerate(self.to_dict()["steps"])]
        title = title or f"{type(self._ddp.module).__name__}: {verdict(self.to_dict()['steps'])}"
        return plot_steps(path, rows, title)


def trace(module: Any, *, timeout: float | None = None, max_steps: int = MAX_STEPS) -> Trace:
    """Records when each DDP bucket's allreduce runs relative to backward;
    use it as ``with goddp.trace(ddp_model) as tr: ...`` on every rank (see
    the goddp.trace module doc for what is recorded and the contract across
    ranks). `module`: a DistributedDataParallel module or torch.compile of
    one. `timeout`: seconds to wait for the other ranks (default
    GODDP_TRACE_TIMEOUT or 300). `max_steps`: steps kept (oldest dropped)."""
    return Trace(module, timeout=timeout, max_steps=max_steps)


# --------------------------------------------------------------------------
# Text and picture


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**17 else f"{n / 2**10:.1f} KiB"


def format_summary(record: dict[str, Any]) -> str:
    steps = record["steps"]
    lines = [
        f"goddp.trace: {record['module']}, rank {record['rank']} of DDP ranks {record['ranks'] or [record['rank']]}, "
        f"{len(steps)} step(s), comm hook: {record['comm_hook']}"
    ]
    plans = record.get("goddp_plans") or []
    if plans:
        for plan in plans:
            lines.append(
                f"goddp plan {plan['fingerprint']}: {plan['num_pieces']} piece(s), {len(plan['bucket_bytes'])} "
                f"bucket(s), mode {plan['mode']}" + (f", fallback: {plan['fallback']}" if plan.get("fallback") else "")
            )
    else:
        lines.append("goddp plan: none (not compiled by goddp)")
    step = median_step(steps)
    if step is None:
        lines.append("verdict: " + verdict(steps))
        return "\n".join(lines)
    end = step["compute_end_s"]
    lines.append(f"median step ({steps.index(step)}), times in ms from backward start; backward compute ends at {end * 1e3:.1f}")
    lines.append(f"  {'bucket':>6} {'bytes':>11} {'params':>6} {'launch':>8} {'duration':>8} {'done':>8}  during backward")
    margin = DURING_BACKWARD_MARGIN * end
    for b in step["buckets"]:
        lines.append(
            f"  {b['index']:>6} {_mib(b['bytes']):>11} {b['params']:>6} {b['launch_s'] * 1e3:>8.1f} "
            f"{(b['done_s'] - b['launch_s']) * 1e3:>8.1f} {b['done_s'] * 1e3:>8.1f}  "
            f"{'yes' if b['launch_s'] <= end - margin else 'no'}"
        )
    lines.append("per step (ms):")
    lines.append(f"  {'step':>4} {'backward':>9} {'last done':>9} {'exposed':>8} {'overlapped':>10} {'buckets':>8}")
    for i, s in enumerate(steps):
        st = step_stats(s)
        lines.append(
            f"  {i:>4} {st['backward_s'] * 1e3:>9.1f} {st['last_done_s'] * 1e3:>9.1f} {st['exposed_s'] * 1e3:>8.1f} "
            f"{st['overlapped']:>10.0%} {st['launched_during_backward']:>3}/{st['buckets']:<4}"
        )
    if record.get("dropped_steps"):
        lines.append(f"  ({record['dropped_steps']} older step(s) dropped)")
    lines.append("verdict: " + verdict(steps))
    return "\n".join(lines)


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is a dev requirement
        raise TraceError("goddp.trace: plot() needs matplotlib (pip install 'goddp[plot]')") from exc
    return plt


def plot_steps(
    path: str | os.PathLike,
    rows: Sequence[tuple[str, dict[str, Any] | None]],
    title: str = "",
    colors: str | Sequence[str] = "#2e9e5b",
) -> str:
    """Writes a PNG with one launch-timeline row per (label, step dict);
    rows without a step are left out. Returns the path."""
    plt = _pyplot()
    if not isinstance(colors, str):
        colors = [c for c, (_, s) in zip(colors, rows) if s is not None]
    rows = [(label, s) for label, s in rows if s is not None]
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * max(2, len(rows)) + 1.4))
    draw_launch_rows(ax, rows, colors)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def draw_launch_rows(ax: Any, rows: Sequence[tuple[str, dict[str, Any]]], color: str | Sequence[str] = "#2e9e5b") -> None:
    """Draws launch timelines on a matplotlib axis, one row per (label, step
    dict): grey from backward start to its compute end, one coloured bar per
    bucket from launch to completion (labelled with its size when there are
    few), a black tick where ``loss.backward()`` returned. Shared by
    ``Trace.plot`` and the benchmark's launch_timelines.png."""
    colors = [color] * len(rows) if isinstance(color, str) else list(color)
    for y, ((label, step), c) in enumerate(zip(rows, colors)):
        ax.barh(y, step["compute_end_s"], height=0.7, color="#d0d0d0")
        buckets = step["buckets"]
        k = max(1, len(buckets))
        for i, b in enumerate(sorted(buckets, key=lambda b: b["launch_s"])):
            off = -0.3 + 0.6 * (i + 0.5) / k
            ax.barh(y + off, max(b["done_s"] - b["launch_s"], 1e-6), left=b["launch_s"], height=0.55 / k, color=c)
            if k <= 8:
                ax.text(b["done_s"], y + off, f" {b['bytes'] / 2**20:.1f}M", va="center", fontsize=5)
        if step.get("finalized_s") is not None:
            ax.plot([step["finalized_s"]] * 2, [y - 0.4, y + 0.4], color="k", lw=1)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "seconds since backward started; grey: backward compute, bars: one bucket's allreduce each,\n"
        "launch to completion; black tick: backward returned",
        fontsize=6,
    )
    ax.grid(axis="x", alpha=0.3)
