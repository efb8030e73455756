"""The training-step variants the step benchmark compares.

Each variant owns its own copy of the model, its own DDP wrapper and its own
optimizer, so all of them can live in one process and be interleaved.

Two details keep the variants honest in one process:
  * Dynamo reads `optimize_ddp` when it converts a frame, so every call of a
    variant runs under that variant's own setting (`Variant.config()`);
    importing goddp switches the global setting off.
  * All compiled copies share one forward code object. Each torch-side
    variant therefore gets its own backend object (`CountingBackend`):
    Dynamo's cache never hands one backend's graph to another, and the count
    of compiled graphs proves the variant really compiled (and split).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field

import torch
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel as DDP

from bench import models, probes


@dataclass(frozen=True)
class VariantSpec:
    name: str
    label: str
    kind: str  # "eager", "compiled", "regional" or "goddp"
    optimize_ddp: bool = False
    no_sync: bool = False
    goddp_mode: str | None = None
    # Timed inside goddp.trace (entered after warm-up, left after the
    # rounds): its ratio to the same variant untraced is the trace's overhead.
    traced: bool = False
    # Each timed step inside its own goddp.trace (entered before the step's
    # barrier): the trace's prediction of that step (its timeline model fed
    # with that step's launches and allreduces) is kept beside the measured
    # exposed communication, per step.
    traced_each_step: bool = False
    goddp_options: tuple = ()  # extra goddp options as (key, value) pairs


SPECS = {s.name: s for s in (
    VariantSpec("compute_only", "compute only (no_sync)", "compiled", no_sync=True),
    VariantSpec("eager_ddp", "eager DDP", "eager"),
    VariantSpec("compiled", "compiled, unsplit", "compiled"),
    VariantSpec("regional", "regional (blocks compiled), eager DDP", "regional"),
    VariantSpec("torch_ddpopt", "torch DDPOptimizer", "compiled", optimize_ddp=True),
    VariantSpec("goddp_torch", "goddp torch mode", "goddp", goddp_mode="torch"),
    VariantSpec("goddp_ddp", "goddp ddp mode", "goddp", goddp_mode="ddp"),
    VariantSpec("goddp_ddp_traced", "goddp ddp mode, traced", "goddp", goddp_mode="ddp", traced=True),
    VariantSpec("goddp_bytes", "goddp ddp mode, byte cuts", "goddp", goddp_mode="ddp",
                goddp_options=(("block_cuts", False),)),
    VariantSpec("goddp_compile_edges", "goddp ddp mode, edges compiled", "goddp", goddp_mode="ddp",
                goddp_options=(("edges", "compile"),)),
    # DDP's own buckets under goddp's cuts: what a model of several dtype
    # groups got before their buckets were aligned (docs/limits.md).
    VariantSpec("goddp_unaligned", "goddp ddp mode, DDP's own buckets", "goddp", goddp_mode="ddp",
                goddp_options=(("align_buckets", False),)),
    # bucket_cap_mb="auto" against fixed caps (docs/auto-buckets.md): a job
    # running these needs a warm-up past AUTO_DECIDES training calls.
    VariantSpec("goddp_auto", 'goddp bucket_cap_mb="auto"', "goddp", goddp_mode="ddp",
                goddp_options=(("bucket_cap_mb", "auto"),)),
    *(VariantSpec(f"goddp_cap{c}", f"goddp bucket_cap_mb={c}", "goddp", goddp_mode="ddp",
                  goddp_options=(("bucket_cap_mb", c),)) for c in (1, 4, 16, 25, 64)),
    VariantSpec("goddp_auto_predicted", 'goddp bucket_cap_mb="auto", each step traced', "goddp",
                goddp_mode="ddp", traced_each_step=True, goddp_options=(("bucket_cap_mb", "auto"),)),
    VariantSpec("goddp_cap25_predicted", "goddp bucket_cap_mb=25, each step traced", "goddp",
                goddp_mode="ddp", traced_each_step=True, goddp_options=(("bucket_cap_mb", 25),)),
)}
# bucket_cap_mb="auto" decides at this training step, the forward after
# its warm-up and measured synchronised backwards (goddp.ranks.auto); the
# warm-up of a job with an auto variant runs past it, and a step more on
# the installed buckets.
AUTO_DECIDES = 6
AUTO_VARIANTS = ["goddp_auto", "goddp_cap1", "goddp_cap4", "goddp_cap16", "goddp_cap25", "goddp_cap64",
                 "torch_ddpopt"]
FIXED_CAPS = {f"goddp_cap{c}": c for c in (1, 4, 16, 25, 64)}
# Variants that run only where a job or --variants names them.
OPT_IN = ("goddp_auto", *FIXED_CAPS, "goddp_auto_predicted", "goddp_cap25_predicted", "goddp_unaligned")
# Each traced variant is compared with this untraced twin.
TRACED_TWIN = {"goddp_ddp_traced": "goddp_ddp", "goddp_auto_predicted": "goddp_auto",
               "goddp_cap25_predicted": "goddp_cap25"}
ALL = list(SPECS)
BASELINE = "torch_ddpopt"
# Variants that apply only to models built from repeated blocks of our own.
NEEDS_BLOCKS = ("regional", "goddp_bytes", "goddp_compile_edges")


def regional_compile(model: torch.nn.Module, backend) -> int:
    """Regional compilation, what an informed user picks instead of compiling
    the whole DDP model: every block of every nn.ModuleList whose class is
    our own (not torch.nn's, whose frames Dynamo does not compile) is
    compiled alone, in place, with one shared backend object, so that
    Dynamo compiles the block's code once and reuses it for every block;
    DDP around the model stays eager. Returns the number of blocks."""
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for block in module:
                if not type(block).__module__.startswith("torch.nn"):
                    block.compile(backend=backend)
                    count += 1
    if count == 0:
        raise ValueError(f"{type(model).__name__} has no repeated blocks of its own to compile regionally")
    return count


class CountingBackend:
    """Delegates to a named Dynamo backend and counts the graphs it compiles."""

    def __init__(self, inner: str) -> None:
        self.inner = inner
        self.graphs: list[int] = []  # FX node count of each compiled graph
        self.seconds = 0.0

    def __call__(self, gm, example_inputs, **kwargs):
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs.append(len(gm.graph.nodes))
        t = time.perf_counter()
        try:
            return lookup_backend(self.inner)(gm, example_inputs, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t


@dataclass
class Variant:
    spec: VariantSpec
    ddp: DDP
    runner: object
    optimizer: torch.optim.Optimizer
    backend: CountingBackend | None = None
    info: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    def config(self):
        if self.spec.kind == "eager":
            return contextlib.nullcontext()
        return torch._dynamo.config.patch(optimize_ddp=self.spec.optimize_ddp)

    def step(self, workload, no_sync: bool | None = None) -> dict:
        """One training step; returns its phase times in seconds."""
        sync_off = self.spec.no_sync if no_sync is None else no_sync
        t1 = time.perf_counter()
        # no_sync must cover the forward: DDP decides there whether to reduce.
        with self.config(), (self.ddp.no_sync() if sync_off else contextlib.nullcontext()):
            loss = workload.loss(self.runner(*workload.inputs))
            t2 = time.perf_counter()
            loss.backward()  # returns once DDP's allreduces are done
            t3 = time.perf_counter()
        self.optimizer.step()
        # Gradients are dropped at the end of the step rather than the start
        # of the next, so the variants waiting their turn hold none (GPT-2
        # small: 0.5 GB per variant and rank).
        self.optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        return {"total": t4 - t1, "fwd": t2 - t1, "bwd": t3 - t2, "opt": t4 - t3}

    def compiled_graphs(self) -> int | None:
        """How many graphs this variant's backend compiled (None for eager)."""
        if self.backend is not None:
            return len(self.backend.graphs)
        return None


def make_variant(spec: VariantSpec, base_model: torch.nn.Module, inner: str,
                 ddp_kwargs: dict, lr: float = 1e-4) -> Variant:
    model = copy.deepcopy(base_model)
    ddp = DDP(model, **ddp_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    backend = None
    if spec.kind == "eager":
        runner = ddp
    elif spec.kind == "compiled":
        backend = CountingBackend(inner)
        runner = torch.compile(ddp, backend=backend)
    elif spec.kind == "regional":
        backend = CountingBackend(inner)
        regional_compile(model, backend)
        runner = ddp
    elif spec.kind == "goddp":
        if probes.goddp_module() is None:
            raise RuntimeError("goddp is not importable or has not registered its backend")
        # goddp accepts a callable inner compiler: counting its calls shows
        # how many pieces were really compiled.
        backend = CountingBackend(inner)
        options = {"inner": backend, "mode": spec.goddp_mode, **dict(spec.goddp_options)}
        runner = torch.compile(ddp, backend="goddp", options=options)
    else:
        raise ValueError(spec.kind)
    return Variant(spec, ddp, runner, optimizer, backend)


def warm_up(variant: Variant, workload, steps: int) -> dict:
    """Compile (first call) and settle DDP's bucket rebuild; returns what was seen."""
    plans_before = len(probes.goddp_plans()) if variant.spec.kind == "goddp" else 0
    times = [variant.step(workload)["total"] for _ in range(max(1, steps))]
    info = {"first_step_s": times[0], "warm_steps_s": times[1:]}
    if variant.spec.kind == "goddp":
        plans = probes.goddp_plans()[plans_before:]
        info["goddp_plans"] = [probes.summarize_goddp_plan(p) for p in plans]
        info["goddp_fallbacks"] = [p["fallback"] for p in plans if p.get("fallback")]
        auto = [p["auto_buckets"] for p in plans if p.get("auto_buckets")]
        if auto:
            info["auto_buckets"] = probes.summarize_auto_buckets(auto[-1])
    variant.info.update(info)
    return info


def warm_compiler(inner: str, device: str = "cpu") -> None:
    """Compile and run a throwaway module so that one-time start-up costs
    (imports, caches, the C++ toolchain probe, on a GPU its runtime and
    kernel compiler) do not land on a variant."""
    model = models.MLPStack(8, 2).to(device)
    compiled = torch.compile(model, backend=CountingBackend(inner))
    compiled(torch.randn(2, 8, device=device)).sum().backward()


def trace_launches(variant: Variant, workload, steps: int) -> dict:
    """When does each DDP bucket's allreduce start, relative to backward?

    Runs `steps` extra steps under goddp.trace (every rank calls this for
    the same variants in the same order: entering and leaving the trace is
    collective). The timing logic and its figures are goddp.tracing's; this
    keeps the median step (by backward time) and its head start: the
    byte-weighted mean of how long before the end of backward compute each
    byte's allreduce started, about 0 for an unsplit graph.
    """
    if variant.spec.no_sync:
        return {}
    goddp = probes.goddp_module()
    if goddp is None:
        return {"error": "goddp is not importable: goddp.trace records the launches"}
    from goddp import tracing

    with goddp.trace(variant.ddp) as tr:
        for _ in range(steps):
            variant.step(workload)
    traces = tr.to_dict()["steps"]
    if not traces:
        return {"error": "no bucket was launched"}
    best = tracing.median_step(traces)
    figures = tracing.step_stats(best)
    end = best["compute_end_s"]
    return {"head_start_s": figures["head_start_s"],
            "head_start_of_backward": figures["head_start_s"] / end if end > 0 else float("nan"),
            "launch_points": len({round(b["launch_s"] / max(end, 1e-9), 2) for b in best["buckets"]}),
            "overlapped": figures["overlapped"], "exposed_s": figures["exposed_s"],
            "trace": best, "all_head_starts_s": [tracing.step_stats(t)["head_start_s"] for t in traces],
            "all_step_stats": [tracing.step_stats(t) for t in traces]}


def ddp_buckets(ddp: DDP) -> dict:
    """The buckets DDP itself built (after its first-iteration rebuild)."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception as err:  # noqa: BLE001 - logging data is best effort
        return {"error": repr(err)}
    keep = ("rebuilt_bucket_sizes", "rebuilt_per_bucket_param_indices", "has_rebuilt_buckets",
            "bucket_cap_bytes", "bucket_sizes", "num_buckets_reduced")
    return {k: data[k] for k in keep if k in data}
