"""bucket_cap_mb="auto": DDP's buckets chosen by what a step costs.

Note [Buckets chosen by cost]: a DDP module compiled with bucket_cap_mb="auto" starts from the layout
goddp installs with the module's own cap, at its first training call, as
always (Note [Agreeing on DDP's layout] in goddp.ranks.agreement).

Units. The module's graph is planned once more so that every piece closes
a bucket: those buckets, in DDP order (backward order), are the units,
each with the bytes of the gradients it completes. They are kept only when
that plan cuts the very pieces that were compiled, so a choice of buckets
is a choice of runs of consecutive pieces: only DDP's caps change, nothing
is compiled again. Note [Auto's units] says how the pieces are cut. A
forward split over several graphs, a module inside Join, or a plan whose
pieces move with the cap keeps the starting layout, and says why.

Measured. Training calls WARMUP_CALLS + 1 to WARMUP_CALLS + MEASURED_CALLS
of the module time, on each rank, each unit's backward: from the start of
the graph's backward (a pre-hook on its outputs' autograd nodes) to the
accumulation of the unit's last gradient (what DDP's reducer waits for: a
post-accumulate-grad hook per parameter), differenced, the median over the
steps. Those durations include what overlapped communication costs the
backward under the starting layout, so the model is given no slowdown.

Where the ranks meet: the training call after the last measured one, which
every rank reaches (Note [Where the ranks meet]). Every wait is bounded:
1. one store round (goddp.ranks.store_round.exchange): rank 0 states its
   unit times; every other rank that it measured, in a fixed statement, so
   that the round reads two statements whatever the group's size. A rank
   that could not measure, or a round that does not settle within its
   bound, keeps the starting layout on every rank;
2. the probe: every rank, now known to be at this call, times allreduces
   of PROBE_SIZES sizes on DDP's process group, and an allreduce (MAX) of
   those times gives every rank the same numbers: the slowest rank's, as
   the step waits for it too. A line of latency plus bytes over bandwidth
   is fitted to them (goddp.tools.timing.fit_allreduce);
3. every rank runs the planner's timeline search (Note [Timeline] in
   planner/timeline.go) on those same numbers, plans the graph with the
   chosen runs' byte totals as DDP's caps, and proposes that layout to the
   module's agreement (goddp.ranks.agreement.agree), which confirms that
   every rank proposed the same and installs it on every rank or none.

Stability: the chosen layout replaces the starting one only when its
predicted step is shorter by MARGIN or more. And rank 0 remembers, per
module shape and group size, what it measured and which buckets it ended
with (a JSON file under GODDP_CACHE_DIR, by default ~/.cache/goddp); its
statement carries that record, so that every rank reads the same one.
When this run's unit times and its allreduce of all the bytes are each
within DRIFT of the last run's, the last run's buckets are this run's
choice: the same model on the same machine ends with the same buckets
run after run, unless its measurements moved by more than DRIFT.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
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
from goddp.ranks.agreement import agree
from goddp.ranks.group import group_of, store_for
from goddp.ranks.layout import Layout
from goddp.ranks.verdict import INSTALL, Statement
from goddp.ranks.store_round import (
    RanksMissingError,
    agreement_key,
    exchange,
    first_round_timeout_s,
    model_key,
    timeout_s,
)
from goddp.tools.timing import Stamp, fit_allreduce, now, seconds_between

logger = logging.getLogger("goddp")

# Note [Auto's units]: with block cuts a piece starts at every block
# whatever the cap, so a cap of one byte makes every piece a unit. A graph
# without block runs is cut by bytes: under "auto" it is compiled with
# buckets of unit_bytes(total) (at least UNIT_MIN_BYTES, and at most
# MAX_UNITS of them), so that its pieces, and so its units, are finer than
# any bucket auto is likely to choose, and few enough to compile.
UNIT_MIN_BYTES = MIB
MAX_UNITS = 64


def unit_bytes(total: int) -> int:
    """The cap that cuts a graph of total gradient bytes into auto's units
    (Note [Auto's units])."""
    return max(UNIT_MIN_BYTES, -(-total // MAX_UNITS))


WARMUP_CALLS = 2  # the install call, and the first on DDP's rebuilt buckets
MEASURED_CALLS = 3
MARGIN = 0.03  # Note [Buckets chosen by cost], "Stability"
DRIFT = 0.10  # and there: measurements this close to the last run's keep its buckets
CACHE_ENV = "GODDP_CACHE_DIR"
PROBE_REPEATS = 3
PROBE_MAX_BYTES = 32 * MIB
PROBE_MIN_BYTES = 4096


class MeasurementError(ValueError):
    """A measurement the timeline model cannot take (a time of 0, NaN or
    less, a size of 0): the starting layout stays."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A layout auto could install: the plan's DDP caps, its Layout, and
    its buckets' bytes (DDP order)."""

    caps: tuple[int, ...]
    layout: Layout
    bytes: tuple[int, ...]


# A graph planned with given per-bucket caps, as a Candidate; None where the
# plan cuts other pieces than the compiled ones.
Replan = Callable[[Sequence[int]], "Candidate | None"]


@dataclasses.dataclass
class _Step:
    cuda: bool
    start: "float | Stamp | None" = None
    ready: dict[int, "float | Stamp"] = dataclasses.field(default_factory=dict)  # unit -> its last gradient


class AutoBuckets:
    """One DDP module's bucket_cap_mb="auto" (Note [Buckets chosen by
    cost]), from its graph's compile to its one decision. record: the plan
    record's dict its outcome goes in (GraphRecord.auto_buckets)."""

    def __init__(self, units: Sequence[tuple[int, ...]], unit_bytes: Sequence[int], start: Layout,
                 replan: Replan, report: Callable[[dict[str, Any]], None]) -> None:
        self.units = [tuple(u) for u in units]
        self.unit_bytes = [int(b) for b in unit_bytes]
        self.start = start
        self._replan = replan
        self._report = report
        self.calls = 0
        self.model: str | None = None  # its parameters' key (store_round.model_key), read when it decides
        self.durations: list[list[int]] = []  # per measured step, per unit (ns)
        self.pending = True
        self._step: _Step | None = None
        self._handles: list[Any] = []
        self.outcome: dict[str, Any] = {"state": "measuring", "units": len(self.units), "start": {"caps": list(start.caps)}}
        report(self.outcome)

    # -- the calls

    def at_call(self, ddp: Any) -> None:
        """The gate at each training call of the module while pending."""
        self.calls += 1
        self._close_step()
        decision = state_of(ddp).decision
        if decision is None or decision.action != INSTALL:
            return self._keep("the ranks kept DDP's own buckets at the first training call")
        if self.calls == 1 and _join.inside_join(ddp):
            return self._keep("the first training step ran inside Join, where not every rank is certain to reach a call")
        if self.calls <= WARMUP_CALLS:
            return
        if self.calls <= WARMUP_CALLS + MEASURED_CALLS:
            if not self._handles:
                self._hook(ddp)
            self._step = _Step(cuda=next(iter(ddp_parameters(ddp))).is_cuda)
            return
        self._unhook()
        if _join.inside_join(ddp):
            return self._keep("the module entered Join before goddp decided")
        self.pending = False
        self._decide(ddp)

    def after_call(self, outputs: Any) -> None:
        """The stitched graph's outputs at a measured call: its backward's start."""
        step = self._step
        if step is None:
            return
        fired = [False]

        def started(grad_outputs: Any) -> None:
            if not fired[0]:
                fired[0] = True
                step.start = now(step.cuda)

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
        times = [step.start] + [step.ready[u] for u in range(len(self.units))]
        self.durations.append([max(1, round(seconds_between(b, a) * 1e9)) for a, b in zip(times, times[1:])])

    def measured(self) -> list[int] | None:
        """Each unit's backward (ns), the median over the measured steps that
        saw every unit; None when none did."""
        steps = [d for d in self.durations if d]
        if not steps:
            return None
        return [round(statistics.median(s[u] for s in steps)) for u in range(len(self.units))]

    # -- deciding

    def _decide(self, ddp: Any) -> None:
        group = group_of(ddp, timeout_s)
        group = dataclasses.replace(group, timeout_s=first_round_timeout_s(group))
        durations = self.measured()
        leader = group.rank == min(group.ranks)
        self.model = _model_key(ddp)
        if durations is None:
            mine = {"failed": "no measured step saw every unit's gradients"}
        elif leader:
            mine = {"backward_ns": durations, "last": load_last(self.cache_file(group), len(self.units))}
        else:
            mine = {"measured": True}
        key = f"{agreement_key(group.name, self.model)}/auto"

        def verdict(payloads: Any) -> dict[str, Any]:
            said = {r: json.loads(p) for r, p in payloads.items()}
            failed = sorted(r for r, s in said.items() if "failed" in s)
            if failed:
                return {"keep": f"rank {failed[0]} could not measure: {said[failed[0]]['failed']}"}
            lead = said.get(min(group.ranks), {})
            if "backward_ns" not in lead:
                return {"keep": f"rank {min(group.ranks)} stated no measurement"}
            return {"backward_ns": lead["backward_ns"], "last": lead.get("last")}

        try:
            decided = exchange(store_for(group), key, group, json.dumps(mine, sort_keys=True), verdict,
                               "auto", "reach the training step where bucket_cap_mb='auto' decides", keeps=True)
        except RanksMissingError as exc:
            logger.warning("%s", exc)
            return self._keep("the ranks did not all reach the call where bucket_cap_mb='auto' decides")
        if "keep" in decided:
            return self._keep(decided["keep"])
        try:
            backward = check_durations(decided["backward_ns"], len(self.units))
            starts = self.start_starts()
            if starts is None:
                return self._keep("the starting buckets are not runs of its units")
            cost = probe(ddp, self.unit_bytes)
            start = predict(backward, self.unit_bytes, cost, starts)
            chosen = predict(backward, self.unit_bytes, cost, None)
            last = decided.get("last")
            last_starts = None if last is None else self.starts_of(last["caps"])
            if last_starts is not None and similar(last, backward, self.unit_bytes, cost):
                chosen = predict(backward, self.unit_bytes, cost, last_starts)
                self.outcome["last_run"] = f"its buckets, measured within {DRIFT:.0%} of this run"
            elif last is not None:
                self.outcome["last_run"] = f"measured more than {DRIFT:.0%} apart from this run: chosen afresh"
        except MeasurementError as exc:
            return self._keep(str(exc))
        chosen_caps = [b["bytes"] for b in chosen["buckets"]]
        gain = 1 - chosen["step_ns"] / start["step_ns"] if start["step_ns"] else 0.0
        self.outcome.update(
            state="decided", measured_calls=[WARMUP_CALLS + 1, WARMUP_CALLS + MEASURED_CALLS],
            backward_ns=backward, unit_bytes=self.unit_bytes, allreduce=cost,
            start={"caps": list(self.start.caps), **_summary(start)}, chosen={"caps": chosen_caps, **_summary(chosen)},
            predicted_gain=round(gain, 4),
        )
        logger.info(
            "goddp: bucket_cap_mb='auto' measured calls %d-%d (rank %d's backward: %.1f ms over %d units) and "
            "allreduces of %s (slowest rank: %.3f ms + %.0f MB/s)%s",
            WARMUP_CALLS + 1, WARMUP_CALLS + MEASURED_CALLS, min(group.ranks), sum(backward) / 1e6, len(backward),
            ", ".join(_size(b) for b, _ in cost["probe"]), cost["latency_ns"] / 1e6, cost["bytes_per_second"] / 1e6,
            f"; the last run on rank {min(group.ranks)}'s machine: {self.outcome['last_run']}" if "last_run" in self.outcome else "",
        )
        installed = self._install(ddp, chosen_caps, gain, start, chosen)
        if leader:
            remember(self.cache_file(group), self.unit_bytes, backward, cost, chosen_caps if installed else list(self.start.caps))

    def _install(self, ddp: Any, caps: list[int], gain: float, start: dict[str, Any], chosen: dict[str, Any]) -> bool:
        """Installs caps on every rank when they beat the start by MARGIN;
        whether it did."""
        if caps == list(self.start.caps):
            self._keep("the starting buckets predict the least step already")
            return False
        if gain < MARGIN:
            self._keep(
                f"its best buckets ({_caps(caps)}) predict a step {gain:.1%} shorter than "
                f"the starting ones ({_caps(self.start.caps)}), under the {MARGIN:.0%} margin"
            )
            return False
        candidate = self._replan(caps)
        if candidate is None:
            self._keep("the planner cuts other pieces with the chosen caps")
            return False
        previous = state_of(ddp).decision
        statement = Statement(layout=candidate.layout, digest=candidate.layout.digest(), pieces=len(self.units))
        decision = agree(ddp, statement, self._agreement_report, may_defer=False)
        if decision.action != INSTALL:
            state_of(ddp).decision = previous
            self._keep(f"the ranks did not install it: {decision.reason}")
            return False
        self.outcome.update(installed=True, reason=None)
        logger.info(
            "goddp: bucket_cap_mb='auto' installed %d buckets (%s) for %d (%s): predicted step %.2f -> %.2f ms "
            "(%.1f%% shorter), exposed communication %.2f -> %.2f ms",
            len(candidate.caps), _caps(candidate.caps), len(self.start.caps), _caps(self.start.caps),
            start["step_ns"] / 1e6, chosen["step_ns"] / 1e6, 100 * gain, start["exposed_ns"] / 1e6, chosen["exposed_ns"] / 1e6,
        )
        self._report(self.outcome)
        return True

    def cache_file(self, group: Any) -> Path:
        """Where rank 0 remembers this module's last choice (Note [Buckets
        chosen by cost], "Stability")."""
        return cache_dir() / f"auto-{self.model}-{len(group.ranks)}ranks.json"

    def starts_of(self, caps: Sequence[int]) -> list[int] | None:
        """Bucket caps (bytes, DDP order) as unit starts; None where they
        are not runs of these units."""
        ends, size, k = [], 0, 0
        for cap in caps:
            while k < len(self.unit_bytes) and size < cap:
                size += self.unit_bytes[k]
                k += 1
            if size != cap:
                return None
            ends.append(k)
            size = 0
        return ends[:-1] if ends and ends[-1] == len(self.unit_bytes) else None

    def _agreement_report(self, plan_check: dict[str, Any], ddp_buckets: dict[str, Any]) -> None:
        self.outcome["agreement"] = {"plan_check": plan_check, "ddp_buckets": ddp_buckets}

    def start_starts(self) -> list[int] | None:
        """The starting layout's buckets as unit starts; None where they are
        not runs of consecutive units."""
        unit_of = {p: u for u, positions in enumerate(self.units) for p in positions}
        starts, first = [], 0
        for bucket in self.start.buckets:
            units = {unit_of.get(p, -1) for p in bucket}
            if units != set(range(first, first + len(units))):
                return None
            first += len(units)
            starts.append(first)
        return starts[:-1] if first == len(self.units) else None

    def _keep(self, reason: str) -> None:
        self._unhook()
        self.pending = False
        self.outcome.update(state="decided", installed=False, reason=reason)
        logger.info("goddp: bucket_cap_mb='auto' keeps the starting buckets (%s): %s", _caps(self.start.caps), reason)
        self._report(self.outcome)


def _model_key(ddp: Any) -> str:
    return model_key([(tuple(p.shape), str(p.dtype)) for p in ddp_parameters(ddp)])


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


def probe(ddp: Any, unit_bytes: Sequence[int]) -> dict[str, Any]:
    """Times allreduces of three sizes on ddp's process group (every rank
    must call it at the same point), the slowest rank's time for each, and
    the line through them (fit_allreduce)."""
    total = sum(unit_bytes)
    low = max(PROBE_MIN_BYTES, min(unit_bytes))
    high = max(low, min(total, PROBE_MAX_BYTES))
    sizes = sorted({low, round(math.sqrt(low * high)) // 4 * 4 or 4, high})
    device = next(iter(ddp_parameters(ddp))).device
    group = ddp.process_group
    times = []
    for nbytes in sizes:
        tensor = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dist.all_reduce(tensor, group=group)  # warm the path for this size
        runs = []
        for _ in range(PROBE_REPEATS):
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            _sync(device)
            runs.append(time.perf_counter() - t0)
        times.append(statistics.median(runs))
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    points = [(b, float(t)) for b, t in zip(sizes, slowest.tolist())]
    for b, t in points:
        if not math.isfinite(t) or t <= 0:
            raise MeasurementError(f"bucket_cap_mb='auto' timed an allreduce of {b} bytes as {t!r} s")
    fit = fit_allreduce(points)
    return {"latency_ns": fit["latency_ns"], "bytes_per_second": fit["bytes_per_second"],
            "probe": [[b, round(t * 1e9)] for b, t in points], "method": fit["method"]}


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
        "launch_ns": 0, "slowdown_permille": 1000,
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


def load_last(path: Path, units: int) -> dict[str, Any] | None:
    """The last run's record at path (remember), None where there is none
    or it is not one (said at DEBUG)."""
    try:
        last = json.loads(path.read_text(encoding="utf-8"))
        ints = lambda v: isinstance(v, list) and all(isinstance(x, int) and x > 0 for x in v)  # noqa: E731
        if not (ints(last["unit_bytes"]) and len(last["unit_bytes"]) == units and ints(last["backward_ns"])
                and len(last["backward_ns"]) == units and ints(last["caps"])
                and isinstance(last["latency_ns"], int) and ints([last["bytes_per_second"]])):
            raise ValueError("not a record of this module's units")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):  # another goddp's file, a torn write: chosen afresh
        logger.debug("goddp: bucket_cap_mb='auto' ignores %s", path, exc_info=True)
        return None
    return {k: last[k] for k in ("unit_bytes", "backward_ns", "caps", "latency_ns", "bytes_per_second")}


def remember(path: Path, unit_bytes: Sequence[int], backward_ns: Sequence[int], cost: dict[str, Any],
             caps: Sequence[int]) -> None:
    """Keeps this run's measurements and buckets at path for the next run."""
    record = {"unit_bytes": list(unit_bytes), "backward_ns": list(backward_ns), "caps": list(caps),
              "latency_ns": cost["latency_ns"], "bytes_per_second": cost["bytes_per_second"]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        temporary.replace(path)
    except OSError:  # a read-only home: the next run chooses afresh, which is all this costs
        logger.debug("goddp: bucket_cap_mb='auto' could not remember its choice at %s", path, exc_info=True)


def similar(last: dict[str, Any], backward_ns: Sequence[int], unit_bytes: Sequence[int], cost: dict[str, Any]) -> bool:
    """Whether this run measured what the last did, within DRIFT: the same
    units, each unit's backward, and an allreduce of all the bytes."""
    if list(last["unit_bytes"]) != list(unit_bytes):
        return False
    near = lambda a, b: abs(a - b) <= DRIFT * b  # noqa: E731
    total = sum(unit_bytes)
    line = lambda c: c["latency_ns"] + total * 1e9 / c["bytes_per_second"]  # noqa: E731
    return all(near(a, b) for a, b in zip(backward_ns, last["backward_ns"])) and near(line(cost), line(last))


def _summary(timeline: dict[str, Any]) -> dict[str, Any]:
    return {k: timeline[k] for k in ("step_ns", "backward_ns", "exposed_ns")}


def _size(nbytes: int) -> str:
    return f"{nbytes / MIB:.2f} MiB" if nbytes >= MIB // 4 else f"{nbytes / 1024:.0f} KiB"


def _caps(caps: Sequence[int]) -> str:
    return "[" + ", ".join(_size(c) for c in caps) + "]"
