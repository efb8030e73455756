"""Instrumentation of the two graph splitters being compared.

torch's DDPOptimizer records no timings, so `DDPOptimizerProbe` wraps the
functions its `compile_fn` calls, in place, for the duration of a `with`
block, and derives the phases from the timestamps:

    bucketing   compile_fn start -> split_module start (includes bucket logging)
    split       split_module itself
    metadata    split_module end -> SubmodCompiler.run start (metadata
                propagation and the debug strings built even when logging is off)
    propagate   SubmodCompiler.run minus the inner compiler's own time: running
                each piece under fake tensors to get the next piece's inputs
    inner       time inside the inner compiler for all pieces
    stitch      SubmodCompiler.run end -> compile_fn return (recompile)

goddp records its own phases in `goddp.last_plans()[-1]["timings"]`;
`goddp_plans()` reads them without assuming more than a list of dicts.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch
import torch.fx.passes.split_module as split_module_mod
from torch._dynamo.backends import distributed as ddp_backend


class DDPOptimizerProbe:
    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._active: dict | None = None

    @contextlib.contextmanager
    def installed(self):
        orig_compile = ddp_backend.DDPOptimizer.compile_fn
        orig_split = split_module_mod.split_module
        orig_run = ddp_backend.SubmodCompiler.run
        probe = self

        @functools.wraps(orig_compile)
        def compile_fn(opt_self, gm, example_inputs, **kw):
            rec = {"t_start": time.perf_counter(), "inner": 0.0, "inner_calls": 0,
                   "graph_nodes": len(gm.graph.nodes)}
            inner = opt_self.backend_compile_fn

            def timed_inner(*a, **k):
                t = time.perf_counter()
                try:
                    return inner(*a, **k)
                finally:
                    rec["inner"] += time.perf_counter() - t
                    rec["inner_calls"] += 1

            opt_self.backend_compile_fn = timed_inner
            probe._active = rec
            try:
                return orig_compile(opt_self, gm, example_inputs, **kw)
            finally:
                rec["t_end"] = time.perf_counter()
                opt_self.backend_compile_fn = inner
                probe._active = None
                rec["buckets"] = [
                    {"bytes": b.size, "params": len(b.params), "nodes": len(b.nodes),
                     "extended": b.opcount_increased_to_capture_external_output > 0}
                    for b in getattr(opt_self, "buckets", [])
                ]

                rec["bucket_cap"] = opt_self.bucket_bytes_cap
                rec["first_bucket_cap"] = opt_self.first_bucket_cap
                probe.calls.append(_phases(rec))

        @functools.wraps(orig_split)
        def split_module(*a, **k):
            rec = probe._active
            if rec is not None:
                rec["t_split_start"] = time.perf_counter()
            try:
                return orig_split(*a, **k)
            finally:
                if rec is not None:
                    rec["t_split_end"] = time.perf_counter()

        @functools.wraps(orig_run)
        def run(interp_self, *a, **k):
            rec = probe._active
            if rec is not None:
                rec["t_run_start"] = time.perf_counter()
            try:
                return orig_run(interp_self, *a, **k)
            finally:
                if rec is not None:
                    rec["t_run_end"] = time.perf_counter()

        ddp_backend.DDPOptimizer.compile_fn = compile_fn
        split_module_mod.split_module = split_module
        ddp_backend.SubmodCompiler.run = run
        try:
            yield self
        finally:
            ddp_backend.DDPOptimizer.compile_fn = orig_compile
            split_module_mod.split_module = orig_split
            ddp_backend.SubmodCompiler.run = orig_run


def _phases(rec: dict) -> dict:
    start, end = rec["t_start"], rec["t_end"]
    out = {k: rec[k] for k in ("graph_nodes", "buckets", "bucket_cap", "first_bucket_cap",
                               "inner_calls")}
    if "t_split_start" not in rec:  # a single bucket: torch skips splitting
        out["phases"] = {"bucketing": end - start - rec["inner"], "inner": rec["inner"]}
    else:
        run_start = rec.get("t_run_start", rec["t_split_end"])
        run_end = rec.get("t_run_end", run_start)
        out["phases"] = {
            "bucketing": rec["t_split_start"] - start,
            "split": rec["t_split_end"] - rec["t_split_start"],
            "metadata": run_start - rec["t_split_end"],
            "propagate": (run_end - run_start) - rec["inner"],
            "inner": rec["inner"],
            "stitch": end - run_end,
        }
    out["total"] = end - start
    return out


def goddp_module():
    """The goddp package if it imports and registers its backend, else None."""
    try:
        import goddp  # noqa: F401  (import registers the backend)
    except Exception:  # noqa: BLE001 - any failure means "not available yet"
        return None
    from torch._dynamo import list_backends

    if "goddp" not in list_backends(exclude_tags=()):
        return None
    return goddp


def goddp_plans() -> list[dict]:
    """A copy of goddp's recorded plans (empty if goddp is unavailable)."""
    goddp = goddp_module()
    if goddp is None or not hasattr(goddp, "last_plans"):
        return []
    return [dict(p) for p in goddp.last_plans()]


def summarize_goddp_plan(plan: dict) -> dict:
    """The fields of a goddp plan record that the bench reports.

    goddp records (see goddp.last_plans): num_pieces, buckets (DDP
    order, each with bytes), timings (export, plan, cut, example_inputs,
    compile, stitch), fallback, graph (num_nodes, num_params), caps, mode.
    """
    buckets = plan.get("buckets") or []
    return {
        "mode": plan.get("mode"),
        "num_pieces": plan.get("num_pieces"),
        "distinct_pieces": plan.get("distinct_pieces"),
        "eager_pieces": plan.get("eager_pieces"),
        "bucket_bytes": [b.get("bytes") for b in buckets if isinstance(b, dict)],
        "extended": sum(1 for b in buckets if isinstance(b, dict) and b.get("extended")),
        "timings": _jsonable(plan.get("timings") or {}),
        "fallback": plan.get("fallback"),
        "graph_nodes": (plan.get("graph") or {}).get("num_nodes"),
        "caps": _jsonable(plan.get("caps")),
        "fingerprint": plan.get("fingerprint"),
    }


def summarize_auto_buckets(record: dict) -> dict:
    """A plan record's auto_buckets (goddp.last_plans) without the
    agreement round's details: what bucket_cap_mb="auto" measured, chose
    and installed."""
    return _jsonable({k: v for k, v in record.items() if k != "agreement"})


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, torch.Tensor) and v.numel() < 10000:
        return v.tolist()
    return repr(v)


class SavedActivations:
    """What saved_activation_bytes returns: the bytes and the step's result."""

    def __init__(self, nbytes: int, result) -> None:
        self.nbytes = nbytes
        self.result = result


def saved_activation_bytes(forward, params) -> SavedActivations:
    """Bytes of the distinct storages autograd keeps for backward while
    forward() runs, parameters left out: the activation memory that
    checkpointing trims (deterministic, unlike a process's RSS). Compiled
    graphs save through their autograd.Function, so they count like eager;
    an eager torch.utils.checkpoint region hides its own."""
    import torch

    param_storages = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_storages:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = forward()
    return SavedActivations(sum(seen.values()), result)


class StepPeak:
    """What step_peak_bytes returns: the peak bytes above the step's start,
    where they were counted, and the step's result."""

    def __init__(self, nbytes: int, source: str, result) -> None:
        self.nbytes = nbytes
        self.source = source
        self.result = result


def step_peak_bytes(step, device=None) -> StepPeak:
    """Peak bytes the allocator holds above its level at the start while
    step() runs (a training step: forward and backward). See
    Note [Step peak memory].

    device: a CUDA device measures with the caching allocator's own peak
    statistics; None or the CPU with the CPU allocator's accounting as torch's
    profiler reports it."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        return _cuda_step_peak(step, dev)
    if dev.type != "cpu":
        raise ValueError(f"step_peak_bytes: device {dev} is neither cpu nor cuda")
    return _cpu_step_peak(step)


def _cuda_step_peak(step, dev) -> StepPeak:
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    result = step()
    torch.cuda.synchronize(dev)
    return StepPeak(max(0, torch.cuda.max_memory_allocated(dev) - base), "torch.cuda.max_memory_allocated", result)


def _cpu_step_peak(step) -> StepPeak:
    import json
    import tempfile
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
    with tempfile.TemporaryDirectory(prefix="goddp-peak-") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    cpu = sorted((e for e in events if e.get("name") == "[memory]"
                  and (e.get("args") or {}).get("Device Type") == _CPU_DEVICE_TYPE),
                 key=lambda e: e["ts"])
    if not cpu:
        return StepPeak(0, "profiler [memory] events (none)", result)
    first = cpu[0]["args"]
    base = first["Total Allocated"] - first["Bytes"]
    peak = max(e["args"]["Total Allocated"] for e in cpu)
    return StepPeak(max(0, peak - base), "torch.profiler [memory] Total Allocated", result)


# The "Device Type" of a [memory] event in a chrome trace: c10's DeviceType
# numbering, in which the CPU is 0.
_CPU_DEVICE_TYPE = 0

# Note [Step peak memory]
# ~~~~~~~~~~~~~~~~~~~~~~~
# saved_activation_bytes counts what autograd keeps from forward to backward;
# a step's peak also holds what backward recomputes, the gradients it is
# building and the temporaries of either pass, so the bench measures it too.
# Each count is the allocator's own: on CUDA the caching allocator's peak
# statistics (reset before the step; the peak minus the bytes allocated at the
# start). On the CPU, torch's profiler with profile_memory=True records one
# "[memory]" event per allocation and free, each carrying "Total Allocated",
# the bytes c10's CPU allocator counts as live (torch.profiler.profile's public
# export_chrome_trace writes them; the events' objects do not expose that
# total). The allocator counts only blocks allocated while profiling is on, so
# the level before the first event (its total less its own bytes) is the
# baseline, and the peak is the largest total above it: the step's own
# allocations at their fullest. Unlike the CUDA figure, a block allocated
# before the step and freed during it does not lower the CPU figure (torch
# does not know its size), and allocations on threads the profiler does not
# follow are not seen (the bench runs with one intra-op thread; CPU backward
# runs on the calling thread).
