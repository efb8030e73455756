"""bucket_cap_mb="auto": DDP's buckets chosen by what a step costs.

Note [Buckets chosen by cost]: a DDP module compiled with
bucket_cap_mb="auto" starts from the buckets DDP's own cap gives, aligned
to the pieces and installed at its first training call, as always (Note
[Agreeing on DDP's layout] in goddp.ranks.agreement).

Units. The module's graph is planned once more so that every piece closes
a bucket: those buckets, in DDP order (backward order), are the units,
each with the bytes of the gradients it completes; Note [Auto's units]
says how the pieces are cut. A bucket auto proposes is a run of
consecutive units, its cap the run's bytes (docs/align.md: DDP then closes
it where the run ends, whatever the order inside it), so nothing is
compiled again: only DDP's caps change. A forward split over several
graphs, find_unused_parameters=True (DDP never rebuilds), a module inside
Join, or a plan whose pieces move with the cap keeps the starting layout,
and says why.

Counted in DDP's synchronised backwards, which every rank runs together:
the end of each backward whose forward ran with DDP's gradient sync on (an
autograd callback queued when the backward reaches the graph's outputs).
A forward that one rank alone runs (an evaluation with gradients on, a
no_sync micro-step) moves no count.

Measured. The forwards after WARMUP synchronised backwards (DDP has
rebuilt its buckets to the starting caps by then) and until WARMUP +
MEASURED of them time, on each rank, each unit's backward: from the start
of the graph's backward (a pre-hook on its outputs' autograd nodes) to the
accumulation of the unit's last gradient (what DDP's reducer waits for: a
post-accumulate-grad hook per parameter; a unit ready before the one
before it counts as ready with it, as DDP launches in order), differenced,
the median over the steps.

The slowdown: communication slows the compute beside it (gloo's sends take
the rank's cores; NCCL's kernels share the GPU's memory bandwidth), so a
layout that overlaps more also computes slower. The probe measures the
factor (compute_slowdown) and the model applies it wherever its
communication stream is busy. The measured durations already hold the
starting layout's own overlap, so the model overstates the backward of
the units the start overlapped (by at most the factor): a known bias,
which docs/benchmarks.md measures.

Where the ranks meet: each rank's first gated forward after that many
synchronised backwards. Every rank is certain to reach it if training goes
on, and no collective of DDP's lies between (the last one ended with that
backward). Every wait is bounded:
1. one store round (goddp.ranks.store_round.exchange, keeping the start on
   every rank when it does not settle within the agreement's bound): the
   group's first rank states its unit times and its last run (below);
   every rank states a digest of its units and starting buckets, so that
   the round reads two statements whatever the group's size, and ranks
   whose units differ, or a rank that could not measure, keep the start on
   every rank;
2. the probe: every rank, now known to be at this call with the same
   units, times allreduces of three sizes on DDP's process group and the
   slowdown beside the largest, and an allreduce (MAX) of those figures
   gives every rank the same numbers: the slowest rank's, as the step
   waits for it too. A line of latency plus bytes over bandwidth is fitted
   to the times (goddp.tools.timing);
3. every rank runs the planner's timeline search (Note [Timeline] in
   planner/timeline.go) on those same numbers and proposes the runs it
   chose to the module's agreement (goddp.ranks.agreement.agree), which
   confirms that every rank proposed the same and installs them on every
   rank or none.

Stability: chosen buckets replace the starting ones only when their
predicted step is shorter by MARGIN or more. And the group's first rank
remembers, per module, units and machine, what it measured and which
buckets it ended with (a JSON file under GODDP_CACHE_DIR, by default
~/.cache/goddp); its statement carries that record, so that every rank
reads the same one. When this run's unit times and its allreduce of all
the bytes are each within DRIFT of the last run's, the last run's buckets
are this run's, margin or not: the same model on the same machine ends
with the same buckets run after run, unless its measurements moved by
more than DRIFT.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from goddp.ddp.private import ddp_parameters
from goddp.ddp.state import state_of
from goddp.native import extension as _native
from goddp.options import MIB
from goddp.ranks import join as _join
from goddp.ranks.agreement import agree, model_key_of
from goddp.ranks.group import group_of, store_for
from goddp.ranks.layout import Layout, build_id
from goddp.ranks.store_round import RanksMissingError, agreement_key, exchange, first_round_timeout_s, timeout_s
from goddp.ranks.verdict import INSTALL, Statement
from goddp.tools.timing import Stamp, fit_allreduce, now, seconds_between

logger = logging.getLogger("goddp")

# Note [Auto's units]: with block cuts a piece starts at every block
# whatever the cap, so a cap of one byte makes every piece a unit. A graph
# without block runs is cut by bytes: under "auto" it is compiled with
# buckets of unit_cap(total) (at least UNIT_MIN_BYTES, and at most
# MAX_UNITS of them), so that its pieces, and so its units, are finer than
# any bucket auto is likely to choose, and few enough to compile; its
# starting buckets are still the ones DDP's own caps give, closed at the
# first unit boundary where DDP's rule closes them (ddp_runs).
UNIT_MIN_BYTES = MIB
MAX_UNITS = 64

WARMUP = 2  # synchronised backwards: the install step's, and the first on DDP's rebuilt buckets
MEASURED = 3
MARGIN = 0.03  # Note [Buckets chosen by cost], "Stability"
DRIFT = 0.10  # and there: measurements this close to the last run's keep its buckets
CACHE_ENV = "GODDP_CACHE_DIR"
PROBE_REPEATS = 3
PROBE_MAX_BYTES = 32 * MIB
PROBE_MIN_BYTES = 4096
# The slowdown's work lasts half the largest probe's allreduce, at most
# SLOWDOWN_MAX_S; an allreduce under SLOWDOWN_MIN_S is too short to slow
# anything measurably; the model takes at most MAX_SLOWDOWN.
SLOWDOWN_MAX_S = 0.1
SLOWDOWN_MIN_S = 0.002
MAX_SLOWDOWN = 8.0


def unit_cap(total: int) -> int:
    """The cap that cuts a graph of total gradient bytes into auto's units
    (Note [Auto's units])."""
    return max(UNIT_MIN_BYTES, -(-total // MAX_UNITS))


def ddp_runs(unit_bytes: Sequence[int], caps: Sequence[int]) -> list[int]:
    """DDP's rule over units, as unit starts: bucket j closes at the first
    unit boundary where it holds caps[j] bytes (the last cap for every
    later bucket)."""
    starts: list[int] = []
    size = 0
    for i, nbytes in enumerate(unit_bytes):
        size += nbytes
        if size >= caps[min(len(starts), len(caps) - 1)] and i + 1 < len(unit_bytes):
            starts.append(i + 1)
            size = 0
    return starts


class MeasurementError(ValueError):
    """A measurement the timeline model cannot take (a time of 0, NaN or
    less, a size of 0): the starting layout stays."""


@dataclasses.dataclass
class _Step:
    cuda: bool
    start: "float | Stamp | None" = None
    ready: dict[int, "float | Stamp"] = dataclasses.field(default_factory=dict)  # unit -> its last gradient


class AutoBuckets:
    """One DDP module's bucket_cap_mb="auto" (Note [Buckets chosen by
    cost]), from its graph's compile to its one decision.

    units: per unit (backward order), the DDP positions of its parameters
    in ready order; sizes: each unit's bytes; starts: the starting buckets
    as unit starts; report(outcome, caps): writes the outcome to the plan
    record, and the caps installed on DDP when they change."""

    def __init__(self, units: Sequence[Sequence[int]], sizes: Sequence[int], starts: Sequence[int],
                 report: Callable[[dict[str, Any], "Sequence[int] | None"], None]) -> None:
        self.units = [tuple(u) for u in units]
        self.sizes = [int(b) for b in sizes]
        self.start = self.layout(starts)
        self.start_starts = list(starts)
        self._report = report
        self.synced = 0  # synchronised backwards seen since the module installed
        self.durations: list[list[int]] = []  # per measured step, per unit (ns)
        self.reordered = 0  # units ready before the unit before them, over the measured steps
        self.pending = True
        self._step: _Step | None = None
        self._watch: tuple[bool, _Step | None] | None = None
        self._handles: list[Any] = []
        self._probes: list[torch.Tensor] = []
        self.outcome: dict[str, Any] = {"state": "measuring", "units": len(self.units), "start": {"caps": list(self.start.caps)}}

    def layout(self, starts: Sequence[int]) -> Layout:
        """The buckets that start at these units, as DDP would hold them."""
        ends = [*starts, len(self.units)]
        buckets, caps, first = [], [], 0
        for end in ends:
            buckets.append(tuple(p for unit in self.units[first:end] for p in unit))
            caps.append(sum(self.sizes[first:end]))
            first = end
        return Layout(tuple(buckets), tuple(caps), "ready", build_id())

    def units_digest(self) -> str:
        """What every rank must agree on before the probe: its units and
        its starting buckets."""
        text = json.dumps([self.units, self.sizes, self.start_starts])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- the calls

    def at_call(self, ddp: Any) -> None:
        """The gate, at each training forward of the module while pending."""
        decision = state_of(ddp).decision
        if decision is None or decision.action != INSTALL:
            return self._keep("the ranks kept DDP's own buckets at the first training call")
        if _join.inside_join(ddp):
            return self._keep("the module trains inside Join, where not every rank is certain to reach a step")
        self._close_step()
        if self.synced >= WARMUP + MEASURED:
            return self._decide(ddp)
        step = None
        if self.synced >= WARMUP:
            if not self._handles:
                self._hook(ddp)
            step = self._step = _Step(cuda=next(iter(ddp_parameters(ddp))).is_cuda)
        self._watch = (bool(ddp.require_backward_grad_sync), step)

    def after_call(self, outputs: Any) -> None:
        """The graph's outputs at a call at_call watched: its backward's
        start, and its end if DDP synchronises it."""
        if self._watch is None:
            return
        synced, step = self._watch
        self._watch = None
        fired = [False]

        def counted() -> None:
            self.synced += 1

        def started(grad_outputs: Any) -> None:
            if fired[0]:
                return
            fired[0] = True
            if step is not None:
                step.start = now(step.cuda)
            if synced:
                torch.autograd.Variable._execution_engine.queue_callback(counted)

        for leaf in torch.utils._pytree.tree_leaves(outputs):
            if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None:
                leaf.grad_fn.register_prehook(started)

    # -- measuring

    def _hook(self, ddp: Any) -> None:
        params = ddp_parameters(ddp)
        for unit, positions in enumerate(self.units):
            for position in positions:
                self._handles.append(params[position].register_post_accumulate_grad_hook(self._ready_hook(unit)))

    def _ready_hook(self, unit: int) -> Callable[[Any], None]:
        def ready(_param: Any) -> None:
            step = self._step
            if step is not None:  # a CUDA event where the step runs on a GPU (Note [Trace clocks on CUDA])
                step.ready[unit] = now(step.cuda)

        return ready

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _close_step(self) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        if step.start is None or len(step.ready) != len(self.units):
            self.durations.append([])  # a step without a backward, or with unused parameters
            return
        seconds = [seconds_between(step.ready[u], step.start) for u in range(len(self.units))]
        ready, durations, before = 0.0, [], 0.0
        for s in seconds:
            if s < ready:
                self.reordered += 1
            ready = max(ready, s)
            durations.append(max(1, round((ready - before) * 1e9)))
            before = ready
        self.durations.append(durations)

    def measured(self) -> list[int] | None:
        """Each unit's backward (ns), the median over the measured steps that
        saw every unit; None when none did."""
        steps = [d for d in self.durations if d]
        if not steps:
            return None
        return [round(statistics.median(s[u] for s in steps)) for u in range(len(self.units))]

    # -- deciding

    def _decide(self, ddp: Any) -> None:
        self._unhook()
        self.pending = False
        group = group_of(ddp, timeout_s)
        group = dataclasses.replace(group, timeout_s=first_round_timeout_s(group))
        first = min(group.ranks)
        cache = self.cache_file(ddp, len(group.ranks))
        mine = self.statement(ddp, group.rank == first, cache)
        key = f"{agreement_key(group.name, model_key_of(ddp))}/auto"
        try:
            decided = exchange(
                store_for(group), key, group, json.dumps(mine, sort_keys=True), lambda said: verdict(said, first),
                "auto", "reach the step where bucket_cap_mb='auto' decides", keeps=True,
            )
        except RanksMissingError as exc:
            logger.warning("%s", exc)
            return self._keep("the ranks did not all reach the step where bucket_cap_mb='auto' decides")
        if "keep" in decided:
            return self._keep(decided["keep"])
        try:
            backward = check_durations(decided["backward_ns"], len(self.units))
            cost = probe(ddp, self._probes)
        except MeasurementError as exc:  # every rank read the same numbers: every rank keeps
            return self._keep(str(exc))
        except Exception as exc:  # a collective of the probe failed: as after a failed agreement, every step stops
            state_of(ddp).fatal = exc
            self.outcome.update(state="failed", reason=f"the allreduce probe failed: {type(exc).__name__}: {exc}")
            self._report(self.outcome, None)
            raise
        finally:
            self._probes = []
        self._choose(ddp, first, backward, cost, decided.get("last"), cache if group.rank == first else None)

    def statement(self, ddp: Any, leader: bool, cache: Path) -> dict[str, Any]:
        """What this rank says at the decision (Note [Buckets chosen by
        cost], step 1); it also sets aside the probe's buffers."""
        said: dict[str, Any] = {"units": self.units_digest()}
        try:
            self._probes = probe_buffers(ddp, self.sizes)
        except torch.OutOfMemoryError:  # this rank cannot probe: every rank keeps the start
            return {**said, "failed": "no memory for the allreduce probe's buffers"}
        durations = self.measured()
        if durations is None:
            return {**said, "failed": "no measured step saw every unit's gradients"}
        if leader:
            said.update(backward_ns=durations, last=load_last(cache, self.sizes))
        return said

    def _choose(self, ddp: Any, first: int, backward: list[int], cost: dict[str, Any],
                last: dict[str, Any] | None, cache: Path | None) -> None:
        """Step 3 of Note [Buckets chosen by cost]; cache: where the leader
        remembers the outcome (None on the other ranks)."""
        try:
            start = predict(backward, self.sizes, cost, self.start_starts)
            chosen, kept = predict(backward, self.sizes, cost, None), False
            if last is not None:
                last_starts = self.starts_of(last["caps"])
                if last_starts is not None and similar(last, backward, self.sizes, cost):
                    chosen, kept = predict(backward, self.sizes, cost, last_starts), True
                    self.outcome["last_run"] = f"its buckets kept: measured within {DRIFT:.0%} of this run"
                elif last_starts is None:
                    self.outcome["last_run"] = "chosen afresh: its buckets are not runs of these units"
                else:
                    self.outcome["last_run"] = f"chosen afresh: measured more than {DRIFT:.0%} apart from this run"
        except MeasurementError as exc:
            return self._keep(str(exc))
        starts = [b["first"] for b in chosen["buckets"]][1:]
        gain = 1 - chosen["step_ns"] / start["step_ns"] if start["step_ns"] else 0.0
        self.outcome.update(
            state="decided", measured_steps=len([d for d in self.durations if d]), reordered_units=self.reordered,
            backward_ns=backward, unit_bytes=self.sizes, allreduce=cost,
            start={"caps": list(self.start.caps), **_summary(start)},
            chosen={"caps": [b["bytes"] for b in chosen["buckets"]], **_summary(chosen)},
            predicted_gain=round(gain, 4),
        )
        logger.info(
            "goddp: bucket_cap_mb='auto' measured %d steps (rank %d's backward: %.1f ms over %d units) and "
            "allreduces of %s (slowest rank: %.3f ms + %.0f MB/s, compute %.2fx slower beside them)%s",
            self.outcome["measured_steps"], first, sum(backward) / 1e6, len(backward),
            ", ".join(_size(b) for b, _ in cost["probe"]), cost["latency_ns"] / 1e6, cost["bytes_per_second"] / 1e6,
            cost.get("slowdown_permille", 1000) / 1000,
            f"; the last run on rank {first}'s machine: {self.outcome['last_run']}" if "last_run" in self.outcome else "",
        )
        installed = self._install(ddp, starts, gain, start, chosen, kept)
        if cache is not None:
            remember(cache, self.sizes, backward, cost, self.outcome["chosen"]["caps"] if installed else list(self.start.caps))

    def _install(self, ddp: Any, starts: list[int], gain: float, start: dict[str, Any], chosen: dict[str, Any],
                 kept: bool) -> bool:
        """Installs the buckets at starts on every rank, when they differ from
        the start and beat it by MARGIN (or were the last run's: kept);
        whether it did."""
        if starts == self.start_starts:
            self._keep("they are the last run's" if kept else "the starting buckets predict the least step already")
            return False
        caps = self.outcome["chosen"]["caps"]
        if gain < MARGIN and not kept:
            self._keep(
                f"its best buckets ({_caps(caps)}) predict a step {gain:.1%} shorter than "
                f"the starting ones ({_caps(self.start.caps)}), under the {MARGIN:.0%} margin"
            )
            return False
        layout = self.layout(starts)
        state = state_of(ddp)
        previous = state.decision
        statement = Statement(layout=layout, digest=layout.digest(), pieces=len(self.units))
        decision = agree(ddp, statement, self._agreement_report, may_defer=False)
        if decision.action != INSTALL:
            if state.aligned_caps is None:  # an install failed: every rank put DDP's own buckets back
                self._keep(f"DDP's own buckets are back on every rank: {decision.reason}", caps=())
            else:  # nothing was installed: the starting buckets stay, and so does their decision
                state.decision = previous
                self._keep(f"the ranks did not install it: {decision.reason}")
            return False
        self.outcome.update(installed=True, reason=None)
        logger.info(
            "goddp: bucket_cap_mb='auto' installed %d buckets (%s) for %d (%s): predicted step %.2f -> %.2f ms "
            "(%.1f%% shorter), exposed communication %.2f -> %.2f ms",
            len(caps), _caps(caps), len(self.start.caps), _caps(self.start.caps),
            start["step_ns"] / 1e6, chosen["step_ns"] / 1e6, 100 * gain, start["exposed_ns"] / 1e6, chosen["exposed_ns"] / 1e6,
        )
        self._report(self.outcome, layout.caps)
        return True

    def _agreement_report(self, plan_check: dict[str, Any], ddp_buckets: dict[str, Any]) -> None:
        self.outcome["agreement"] = {"plan_check": plan_check, "ddp_buckets": ddp_buckets}

    def _keep(self, reason: str, caps: "Sequence[int] | None" = None) -> None:
        """Decided without installing: why, said once; caps: what DDP holds
        now when it is not the start."""
        self._unhook()
        self._watch = None
        self.pending = False
        self.outcome.update(state="decided", installed=False, reason=reason)
        logger.info("goddp: bucket_cap_mb='auto' keeps the starting buckets (%s): %s", _caps(self.start.caps), reason)
        self._report(self.outcome, caps)

    def cache_file(self, ddp: Any, ranks: int) -> Path:
        """Where the group's first rank remembers this module's last choice
        (Note [Buckets chosen by cost], "Stability"): one file per module
        shape, units, device, backend, host and group size."""
        device = next(iter(ddp_parameters(ddp))).device.type
        key = json.dumps([model_key_of(ddp), self.units_digest(), device, dist.get_backend(ddp.process_group),
                          socket.gethostname()])
        return cache_dir() / f"auto-{hashlib.sha256(key.encode()).hexdigest()[:16]}-{ranks}ranks.json"

    def starts_of(self, caps: Sequence[int]) -> list[int] | None:
        """Bucket caps (bytes, DDP order) as unit starts; None where they
        are not runs of these units."""
        ends, size, k = [], 0, 0
        for cap in caps:
            while k < len(self.sizes) and size < cap:
                size += self.sizes[k]
                k += 1
            if size != cap:
                return None
            ends.append(k)
            size = 0
        return ends[:-1] if ends and ends[-1] == len(self.sizes) else None


def verdict(said_text: Any, first: int) -> dict[str, Any]:
    """The decision of the round (Note [Buckets chosen by cost], step 1),
    the same on every rank: the first rank's times and last run, or why
    every rank keeps the start."""
    said = {r: json.loads(p) for r, p in said_text.items()}
    lead = said.get(first, {})
    apart = sorted(r for r, s in said.items() if s.get("units") != lead.get("units"))
    if apart:
        return {"keep": f"rank {apart[0]}'s units or starting buckets differ from rank {first}'s"}
    failed = sorted(r for r, s in said.items() if "failed" in s)
    if failed:
        return {"keep": f"rank {failed[0]} could not measure: {said[failed[0]]['failed']}"}
    if "backward_ns" not in lead:
        return {"keep": f"rank {first} stated no measurement"}
    return {"backward_ns": lead["backward_ns"], "last": lead.get("last")}


def check_durations(values: Any, units: int) -> list[int]:
    """The measured backward of each unit, checked (the door for a
    measurement: Note [Buckets chosen by cost])."""
    if not isinstance(values, list) or len(values) != units:
        raise MeasurementError(f"bucket_cap_mb='auto' needs one backward time per unit ({units}), got {values!r}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise MeasurementError(
                f"bucket_cap_mb='auto' measured unit {i}'s backward as {v!r} ns; a time must be a finite number above 0"
            )
    return [int(v) for v in values]


def probe_buffers(ddp: Any, sizes: Sequence[int]) -> list[torch.Tensor]:
    """The probe's buffers: three sizes from the smallest unit's bytes to
    all the gradients' (at most PROBE_MAX_BYTES), on DDP's device."""
    low = max(PROBE_MIN_BYTES, min(sizes))
    high = max(low, min(sum(sizes), PROBE_MAX_BYTES))
    middle = max(4, round(math.sqrt(low * high)) // 4 * 4)
    device = next(iter(ddp_parameters(ddp))).device
    return [torch.zeros(max(1, n // 4), dtype=torch.float32, device=device) for n in sorted({low, middle, high})]


def probe(ddp: Any, buffers: Sequence[torch.Tensor]) -> dict[str, Any]:
    """Times an allreduce of each buffer on ddp's process group (every rank
    calls it at the same point), and how much the largest slows compute
    running beside it (compute_slowdown); takes the slowest rank's figures
    (an allreduce MAX), and fits the line through the times
    (fit_allreduce)."""
    group = ddp.process_group
    device = buffers[0].device
    times = []
    for tensor in buffers:
        dist.all_reduce(tensor, group=group)  # warm the path for this size
        runs = []
        for _ in range(PROBE_REPEATS):
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            _sync(device)
            runs.append(time.perf_counter() - t0)
        times.append(statistics.median(runs))
    slowdown = compute_slowdown(buffers[-1], times[-1], group)
    slowest = torch.tensor([*times, slowdown], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    *times, slowdown = slowest.tolist()
    points = [(t.numel() * 4, float(s)) for t, s in zip(buffers, times)]
    for nbytes, seconds in points:
        if not math.isfinite(seconds) or seconds <= 0:
            raise MeasurementError(f"bucket_cap_mb='auto' timed an allreduce of {nbytes} bytes as {seconds!r} s")
    fit = fit_allreduce(points)
    return {"latency_ns": fit["latency_ns"], "bytes_per_second": fit["bytes_per_second"],
            "slowdown_permille": round(1000 * min(MAX_SLOWDOWN, max(1.0, slowdown))),
            "probe": [[b, round(s * 1e9)] for b, s in points], "method": fit["method"]}


def compute_slowdown(buffer: torch.Tensor, allreduce_s: float, group: Any) -> float:
    """How many times longer a matrix product takes on this rank while an
    allreduce of buffer (allreduce_s long) runs beside it: gloo's sends
    take the rank's cores, NCCL's kernels the GPU's memory bandwidth (Note
    [Buckets chosen by cost], "The slowdown"). One allreduce, on every rank;
    1.0 where the allreduce is too short to time work beside it."""
    device = buffer.device
    a = torch.randn(256, 256, device=device)
    out = torch.empty_like(a)

    def work(n: int) -> float:
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            torch.mm(a, a, out=out)
        _sync(device)
        return time.perf_counter() - t0

    one = max(work(1), work(1), 1e-7)
    n = max(1, min(10_000, int(min(allreduce_s / 2, SLOWDOWN_MAX_S) / one)))
    alone = work(n)
    handle = dist.all_reduce(buffer, group=group, async_op=True)
    beside = work(n)
    handle.wait()
    _sync(device)
    if allreduce_s < SLOWDOWN_MIN_S or alone <= 0:
        return 1.0
    return beside / alone


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def predict(backward_ns: Sequence[int], unit_bytes: Sequence[int], cost: dict[str, Any],
            starts: Sequence[int] | None) -> dict[str, Any]:
    """The planner's timeline (Note [Timeline] in planner/timeline.go) of
    buckets starting at these units, or, starts None, of the buckets it
    predicts fastest."""
    request = {
        "backward_ns": list(backward_ns), "bytes": list(unit_bytes),
        "allreduce": {"latency_ns": cost["latency_ns"], "bytes_per_second": cost["bytes_per_second"]},
        "launch_ns": 0, "slowdown_permille": cost.get("slowdown_permille", 1000),
    }
    if starts is not None:
        request["starts"] = list(starts)
    try:
        return _native.timeline(request)
    except _native.PlannerError as exc:
        raise MeasurementError(f"bucket_cap_mb='auto': the timeline model refused the measurements: {exc}") from exc


def cache_dir() -> Path:
    """Where rank 0 keeps its last choices: GODDP_CACHE_DIR, else goddp's
    folder under XDG_CACHE_HOME (~/.cache)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "goddp"


def load_last(path: Path, sizes: Sequence[int]) -> dict[str, Any] | None:
    """The last run's record at path (remember), None where there is none
    or it is not one of these units (said at DEBUG)."""
    try:
        last = json.loads(path.read_text(encoding="utf-8"))
        if not (last["unit_bytes"] == list(sizes) and _counts(last["backward_ns"], len(sizes))
                and _counts(last["caps"]) and _counts([last["bytes_per_second"]])
                and isinstance(last["latency_ns"], int) and last["latency_ns"] >= 0):
            raise ValueError("not a record of this module's units")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):  # another goddp's file, a torn write: chosen afresh
        logger.debug("goddp: bucket_cap_mb='auto' ignores %s", path, exc_info=True)
        return None
    return {k: last[k] for k in ("unit_bytes", "backward_ns", "caps", "latency_ns", "bytes_per_second")}


def _counts(values: Any, length: int | None = None) -> bool:
    """A list of ints above 0 (of that length)."""
    return (isinstance(values, list) and (length is None or len(values) == length)
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values))


def remember(path: Path, unit_bytes: Sequence[int], backward_ns: Sequence[int], cost: dict[str, Any],
             caps: Sequence[int]) -> None:
    """Keeps this run's measurements and buckets at path for the next run."""
    record = {"unit_bytes": list(unit_bytes), "backward_ns": list(backward_ns), "caps": list(caps),
              "latency_ns": cost["latency_ns"], "bytes_per_second": cost["bytes_per_second"]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{socket.gethostname()}-{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        temporary.replace(path)
    except OSError:  # a read-only home: the next run chooses afresh, which is all this costs
        logger.debug("goddp: bucket_cap_mb='auto' could not remember its choice at %s", path, exc_info=True)


def similar(last: dict[str, Any], backward_ns: Sequence[int], sizes: Sequence[int], cost: dict[str, Any]) -> bool:
    """Whether this run measured what the last did, within DRIFT: the same
    units, each unit's backward, and an allreduce of all the bytes."""
    if list(last["unit_bytes"]) != list(sizes):
        return False
    total = sum(sizes)
    return all(_near(a, b) for a, b in zip(backward_ns, last["backward_ns"])) and _near(
        _allreduce_ns(cost, total), _allreduce_ns(last, total)
    )


def _near(value: float, reference: float) -> bool:
    return abs(value - reference) <= DRIFT * reference


def _allreduce_ns(cost: dict[str, Any], nbytes: int) -> float:
    return cost["latency_ns"] + nbytes * 1e9 / cost["bytes_per_second"]


def _summary(timeline: dict[str, Any]) -> dict[str, Any]:
    return {k: timeline[k] for k in ("step_ns", "backward_ns", "exposed_ns")}


def _size(nbytes: int) -> str:
    return f"{nbytes / MIB:.2f} MiB" if nbytes >= MIB // 4 else f"{nbytes / 1024:.0f} KiB"


def _caps(caps: Sequence[int]) -> str:
    return "[" + ", ".join(_size(c) for c in caps) + "]"
