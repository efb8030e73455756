"""`make demo`: goddp against what a user would run instead, on 2 CPU ranks.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 -m bench.demo [--plot overlap.png]

The bench's small GPT (bench/models.py, the "demo" size) is trained under
DistributedDataParallel (gloo) by every alternative a user has, each on its
own copy of the model, all compiled with Inductor:

    eager DDP            the reference (no compile)
    compiled, unsplit    torch.compile(DDP(m)) with optimize_ddp off
    torch DDPOptimizer   torch.compile(DDP(m)), torch's own graph splitter
    regional             each transformer block compiled alone, eager DDP
    goddp                torch.compile(DDP(m), backend="goddp")

For each it reports the first step (which compiles; every variant compiles
with an empty, fresh Inductor cache, so nothing one compiled serves another),
the steady step time (the variants interleaved round-robin, a barrier before
every step), the communication left exposed after backward (goddp.trace)
and how far its final parameters are from eager DDP's. A goddp run with the
aot_eager inner compiler shows the bitwise case. It ends with goddp's plan
table. Note [What two CPU ranks show] says what this machine can tell.

The same code runs the GPU check (bench/gpu_check.py) with CUDA tensors.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bench import models, probes, stats, variants

# Note [What two CPU ranks show]
# Both ranks and all of gloo's work share the machine's cores: an allreduce
# in flight takes CPU from the backward it is meant to overlap, so
# overlapping cannot make a step much faster here, and loopback moves bytes
# at memory speed, so there is little communication to hide. What the run
# does show: how long each alternative takes to compile (first step), its
# steady step time on this machine, when its allreduces start (goddp.trace;
# coarse for a model this small, whose backward is short next to DDP's own
# gradient copies), and that the numbers stay eager DDP's. What it cannot
# show: the step time on a real network or GPU, where communication runs
# beside compute; the benchmark over a shaped link (bench/README.md) and the
# GPU check (make gpu-check) measure those.

# (name, VariantSpec of bench.variants, inner compiler override or None)
DEMO_VARIANTS = (
    ("eager_ddp", "eager_ddp", None),
    ("compiled", "compiled", None),
    ("torch_ddpopt", "torch_ddpopt", None),
    ("regional", "regional", None),
    ("goddp", "goddp_ddp", None),
    ("goddp_aot_eager", "goddp_ddp", "aot_eager"),
)
LABELS = {
    "eager_ddp": "eager DDP (no compile)",
    "compiled": "torch.compile(DDP), unsplit",
    "torch_ddpopt": "torch's DDPOptimizer",
    "regional": "regional (blocks), eager DDP",
    "goddp": "goddp",
    "goddp_aot_eager": "goddp, aot_eager inner",
}
REFERENCE = "eager_ddp"
HEADLINE = "goddp"


@dataclass
class Setup:
    """What one comparison runs; the demo's defaults fit in 3 minutes on 2 shared cores."""

    size: str = "demo"
    inner: str = "inductor"
    variants: tuple = tuple(v[0] for v in DEMO_VARIANTS)
    warmup: int = 3  # steps per variant before timing, the first one compiles
    rounds: int = 4  # interleaved rounds
    steps_per_round: int = 2
    trace_steps: int = 5
    bucket_cap_mb: float = 2.0
    lr: float = 0.05
    device: str = "cpu"
    autocast: torch.dtype | None = None
    fresh_caches: bool = True
    # Parameters against eager DDP's with a fusing inner compiler (aot_eager
    # must be bitwise equal); autocast runs need looser ones.
    rtol: float = 1e-4
    atol: float = 1e-5
    # Autocast: close when no parameter is further from eager DDP's than
    # this share of the largest update (a rank whose allreduce went missing
    # lands about a whole update away).
    update_share: float | None = None
    overrides: dict = field(default_factory=dict)


# The demo's GPT, as language-model scripts write it (bench.models.LossLM):
# GPT-2's vocabulary, a tied head and the loss inside forward, so that the
# head weighs what it does in real training (Note [Edge costs]); 2 blocks so
# that goddp's and regional compilation's reuse of one block's compile
# shows, small elsewhere so that Inductor compiles the five variants within
# the demo's budget on 2 shared cores. "smoke" is gpu_check --quick's.
models.PRESETS["nanogpt"].setdefault("demo", dict(vocab=50257, ctx=128, d_model=192, n_layer=2, n_head=4, batch=2))
models.PRESETS["nanogpt"].setdefault("smoke", dict(vocab=512, ctx=32, d_model=64, n_layer=2, n_head=2, batch=2))


def log(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def machine_load() -> str:
    """The machine's load: every figure here depends on it."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def fresh_inductor_cache(root: str):
    """An empty Inductor cache directory (and empty in-memory caches) for
    the block, so that a variant's first step compiles everything itself."""
    from torch._inductor import async_compile
    from torch._inductor import utils as inductor_utils

    fresh = getattr(inductor_utils, "fresh_cache", None) or inductor_utils.fresh_inductor_cache
    # Compile workers keep the cache directories they were started with;
    # the next compile starts new ones, as a user's first compile does.
    shutdown = getattr(async_compile, "shutdown_compile_workers", None)
    if shutdown is not None:
        shutdown()
    # Kept until the run ends: compiled kernels may be loaded lazily.
    with fresh(dir=root, delete=False):
        yield


def build_workload(setup: Setup, rank: int) -> models.Workload:
    """The GPT with the same weights on every rank and a batch of its own
    per rank (as in real data-parallel training: a rank that skipped an
    allreduce would then end with different parameters)."""
    device = torch.device(setup.device)
    wl = models.build("nanogpt", setup.size, seed=0, **setup.overrides)
    data = models.build("nanogpt", setup.size, seed=1000 + rank, **setup.overrides)
    wl.model.to(device)
    wl.inputs = tuple(x.to(device) for x in data.inputs)  # tokens and targets
    wl.loss = lambda loss: loss.float()
    return wl


def _autocast_runner(runner, device: torch.device, dtype: torch.dtype):
    def run(*inputs):
        with torch.autocast(device.type, dtype=dtype):
            return runner(*inputs)

    return run


def timed_step(v: variants.Variant, wl: models.Workload, device: torch.device) -> float:
    _sync(device)
    t = time.perf_counter()
    v.step(wl)
    _sync(device)
    return time.perf_counter() - t


def _capture_goddp_log() -> tuple[logging.Handler, list[str]]:
    """Collects what goddp logs at INFO (its plan table and compile lines)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.INFO)
    logger = logging.getLogger("goddp")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler, lines


def run(setup: Setup) -> dict:
    """Runs the comparison on this rank (every rank calls it alike) and
    returns rank 0's view: per variant its first step, steady steps, trace
    figures, parameter distance to eager DDP; goddp's plan log."""
    import goddp
    from goddp import tracing

    rank = dist.get_rank()
    device = torch.device(setup.device)
    log(f"at the start: {machine_load()}")
    if device.type == "cpu":
        torch.set_num_threads(1)
    wl = build_workload(setup, rank)
    log(f"{wl.description}, {wl.meta['parameters'] / 1e6:.2f}M parameters, "
        f"{wl.grad_bytes / 2**20:.1f} MiB of gradients per step, bucket_cap_mb={setup.bucket_cap_mb}, "
        f"{dist.get_world_size()} ranks ({dist.get_backend()}), device {device}, inner={setup.inner}"
        + (f", autocast {setup.autocast}" if setup.autocast else ""))

    t = time.perf_counter()
    variants.warm_compiler(setup.inner, device=setup.device)
    log(f"compiler start-up paid once, before any variant: {time.perf_counter() - t:.1f} s")

    ddp_kwargs = {"bucket_cap_mb": setup.bucket_cap_mb}
    if device.type == "cuda":
        ddp_kwargs["device_ids"] = [device.index if device.index is not None else torch.cuda.current_device()]
    handler, goddp_lines = _capture_goddp_log()
    cache_root = tempfile.mkdtemp(prefix="goddp_demo_cache_")
    built: dict[str, variants.Variant] = {}
    first: dict[str, float] = {}
    initial = [p.detach().clone() for p in wl.model.parameters()]
    try:
        for name in compile_order(setup.variants):
            spec_name, inner = next((s, i) for n, s, i in DEMO_VARIANTS if n == name)
            spec = variants.SPECS[spec_name]
            cache = fresh_inductor_cache(cache_root) if setup.fresh_caches else contextlib.nullcontext()
            if name == HEADLINE:
                goddp_lines.clear()
            with cache:
                dist.barrier()
                v = variants.make_variant(spec, wl.model, inner or setup.inner, ddp_kwargs, lr=setup.lr)
                if setup.autocast is not None:
                    v.runner = _autocast_runner(v.runner, device, setup.autocast)
                times = [timed_step(v, wl, device) for _ in range(setup.warmup)]
            if name == HEADLINE:
                handler.setLevel(logging.CRITICAL + 1)  # keep the headline's plan log only
            first[name] = times[0]
            built[name] = v
            graphs = v.compiled_graphs()
            log(f"  {LABELS[name]:<30} first step {times[0]:6.2f} s"
                + (f" ({graphs} graph(s) compiled)" if graphs is not None else ""))

        built = {n: built[n] for n in setup.variants if n in built}
        steps: dict[str, list[float]] = {n: [] for n in built}
        order = list(built.items())
        for r in range(setup.rounds):
            k = r % len(order)
            for name, v in order[k:] + order[:k]:
                for _ in range(setup.steps_per_round):
                    dist.barrier()
                    steps[name].append(timed_step(v, wl, device))
        # Steps are timed per rank; the slower rank sets the pace.
        per_round: dict[str, dict[int, float]] = {}
        for n in steps:
            steps[n] = _slowest(steps[n], device)
            k = setup.steps_per_round
            per_round[n] = {r: stats.median(steps[n][r * k:(r + 1) * k]) for r in range(setup.rounds)}
        log(f"  {setup.rounds} interleaved rounds of {setup.steps_per_round} steps per variant done")
        # On a GPU, each variant's peak memory over one more step (Note [Step peak memory]).
        peaks: dict[str, float] = {}
        if device.type == "cuda":
            for name, v in built.items():
                dist.barrier()
                peaks[name] = probes.step_peak_bytes(lambda: v.step(wl), device).nbytes / 2**20

        launches = {}
        for name, v in built.items():
            dist.barrier()
            launches[name] = variants.trace_launches(v, wl, setup.trace_steps)
            if "trace" in launches[name]:
                launches[name]["stats"] = tracing.step_stats(launches[name]["trace"])
                every = launches[name]["all_step_stats"]
                launches[name]["exposed_median_s"] = stats.median(s["exposed_s"] for s in every)
                launches[name]["exposed_share_median"] = stats.median(1 - s["overlapped"] for s in every)
        # goddp.trace's ranks leave through the c10d store: where rank 0
        # hosts it, no rank may exit before all have read the last round.
        dist.barrier()
    finally:
        logging.getLogger("goddp").removeHandler(handler)
        shutil.rmtree(cache_root, ignore_errors=True)

    reference = list(built[REFERENCE].ddp.module.parameters()) if REFERENCE in built else None
    update = max((a - b).abs().max().item() for a, b in zip(reference, initial)) if reference else float("nan")
    numerics = {}
    for name, v in built.items():
        if reference is None or name == REFERENCE:
            continue
        params = list(v.ddp.module.parameters())
        diff = max((a - b).abs().max().item() for a, b in zip(params, reference))
        equal = all(torch.equal(a, b) for a, b in zip(params, reference))
        if setup.update_share is not None:
            close = diff <= setup.update_share * update
        else:
            close = all(torch.allclose(a, b, rtol=setup.rtol, atol=setup.atol) for a, b in zip(params, reference))
        numerics[name] = {"max_abs_diff": diff, "bitwise": equal, "close": close,
                          "exact_expected": (inner_of(name, setup) == "aot_eager" or name == REFERENCE)
                          and setup.autocast is None}
    plans = goddp.last_plans()
    return {"setup": setup, "description": wl.description, "first": first, "steps": steps,
            "per_round": per_round, "launches": launches, "numerics": numerics, "update": update,
            "steps_taken": setup.warmup + setup.rounds * setup.steps_per_round + setup.trace_steps + bool(peaks),
            "graphs": {n: v.compiled_graphs() for n, v in built.items()},
            "goddp_log": list(goddp_lines), "plans": plans, "step_peak_mib": peaks}


def compile_order(names) -> list[str]:
    """The order in which the variants first run: goddp compiles first, so
    that any one-time compiler cost the warm-up did not pay (the first
    lowering of the GPT's kinds of op) falls on goddp, never in its favour."""
    return sorted(names, key=lambda n: (n != REFERENCE, n != HEADLINE))


def inner_of(name: str, setup: Setup) -> str | None:
    spec_name, inner = next((s, i) for n, s, i in DEMO_VARIANTS if n == name)
    if variants.SPECS[spec_name].kind == "eager":
        return None
    return inner or setup.inner


def _slowest(times: list[float], device: torch.device) -> list[float]:
    """Per step, the slower of the ranks' times (every rank calls this)."""
    t = torch.tensor(times, dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def report(res: dict) -> str:
    """Two tables, time and communication, one row per variant."""
    setup: Setup = res["setup"]
    head = res["per_round"].get(HEADLINE)
    n_steps = len(next(iter(res["steps"].values())))
    time_rows, comm_rows = [], []
    for name, times in res["steps"].items():
        s = stats.summarize(times)
        ratio = "-"
        if head and name != HEADLINE:
            ratio = f"{stats.paired_ratios(res['per_round'][name], head)['median']:.2f}"
        graphs = res["graphs"].get(name)
        time_rows.append([LABELS[name], f"{res['first'][name]:.1f} s", "-" if graphs is None else graphs,
                          stats.fmt_s(s["median"]), f"{stats.fmt_s(s['p10'])}-{stats.fmt_s(s['p90'])}", ratio])
        tr = res["launches"].get(name, {})
        st = tr.get("stats")
        num = res["numerics"].get(name)
        if num is None:
            numerics = "(the reference)"
        elif num["bitwise"]:
            numerics = "bitwise equal"
        else:
            numerics = f"{'close' if num['close'] else 'DIFFERENT'}, max |diff| {num['max_abs_diff']:.1g}"
        if st:
            lead = st["head_start_s"] / st["backward_s"] if st["backward_s"] > 0 else float("nan")
            comm_rows.append([LABELS[name], f"{st['backward_s'] * 1e3:.0f} ms",
                              f"{st['launched_during_backward']}/{st['buckets']}", f"{lead:.0%}",
                              f"{tr['exposed_median_s'] * 1e3:.1f} ms", f"{tr['exposed_share_median']:.0%}", numerics])
        else:
            comm_rows.append([LABELS[name], "-", "-", "-", "-", "-", numerics])
    world = dist.get_world_size()
    where = (f"{world} rank{'s' if world > 1 else ''} ({dist.get_backend()}), device {setup.device}"
             + (f", autocast {str(setup.autocast).replace('torch.', '')}" if setup.autocast else ""))
    t1 = stats.table(["variant", "first step", "graphs", "steady step", "p10-p90", "vs goddp"], time_rows,
                     title=f"== time: {res['description']}, {setup.inner}, {where}; {n_steps} steady steps "
                           "per variant, interleaved ==")
    t2 = stats.table(["variant", "backward", "launched in bwd", "head start", "exposed", "exposed share",
                      f"params vs eager DDP ({res['steps_taken']} steps)"], comm_rows,
                     title=f"== communication (goddp.trace, {setup.trace_steps} steps per variant) ==")
    notes = [
        "first step: the step that compiles, each variant with an empty, fresh Inductor cache (goddp compiles first,",
        "  so one-time compiler costs the warm-up missed fall on goddp); graphs: graphs the",
        "  inner compiler compiled (goddp and regional compile one block for all); vs goddp: step time over goddp's,",
        "  paired by round (above 1: slower than goddp); slower rank per step.",
        "backward, launched in bwd, head start: median traced step; head start: how long before backward compute",
        "  ended the average gradient byte's allreduce started, as a share of backward;",
        "  exposed: from the end of backward compute to the last allreduce's completion, median over the steps;",
        "  exposed share: the share of allreduce time not overlapped with backward.",
        f"params vs eager DDP: same start, same per-rank batches, SGD lr {setup.lr} (largest update "
        f"{res['update']:.2g}); bitwise equal expected with aot_eager,",
        ("  close (allclose rtol {setup.rtol:g}, atol {setup.atol:g})".format(setup=setup) if setup.update_share is None
         else f"  close (within {setup.update_share:.0%} of the largest update)")
        + " with Inductor, which fuses and reorders float arithmetic.",
    ]
    return t1 + "\n\n" + t2 + "\n" + "\n".join(notes)


def failures(res: dict) -> list[str]:
    """What must hold for the demo to pass: goddp split the graph, its
    buckets launched during backward, parameters equal/close to eager DDP's."""
    out = []
    plans = res["plans"]
    ran_goddp = any(variants.SPECS[s].kind == "goddp" for n, s, _ in DEMO_VARIANTS if n in res["first"])
    if ran_goddp and (not plans or max(p["num_pieces"] for p in plans) < 2):
        out.append("goddp did not split the graph")
    for name, num in res["numerics"].items():
        if num["exact_expected"] and not num["bitwise"]:
            out.append(f"{LABELS[name]}: parameters are not bitwise equal to eager DDP's")
        elif not num["close"]:
            out.append(f"{LABELS[name]}: parameters differ from eager DDP's (max |diff| {num['max_abs_diff']:.3g})")
    return out


CPU_NOTE = """\
What a 2-rank CPU run can and cannot show (Note [What two CPU ranks show] in bench/demo.py):
  both ranks, gloo's threads and the compute share this machine's cores, and loopback moves bytes at memory
  speed, so an allreduce overlapped with backward still takes CPU from it: splitting cannot make a step much
  faster here, and the steady step times say what each variant's graphs cost on this CPU, within its noise.
  It does show what each alternative costs to compile (first step), that the training stays eager DDP's
  (parameters), and through goddp.trace when each variant's allreduces start. With a model this small the
  backward is short and the launch figures are coarse: the gradient copies DDP makes after an unsplit graph's
  single backward node take long enough here to count as "during backward". Step time on a real network or a
  GPU, where communication runs beside compute, is what bench/ (a shaped link) and `make gpu-check` measure."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", choices=[v[0] for v in DEMO_VARIANTS],
                    default=[v[0] for v in DEMO_VARIANTS])
    ap.add_argument("--rounds", type=int, default=Setup.rounds)
    ap.add_argument("--trace-steps", type=int, default=Setup.trace_steps)
    ap.add_argument("--inner", default=Setup.inner, help="inner compiler of the compiled variants")
    ap.add_argument("--plot", metavar="PNG", help="draw every variant's median traced step (rank 0) to this file")
    args = ap.parse_args(argv)
    if REFERENCE not in args.variants:
        args.variants.insert(0, REFERENCE)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import goddp  # noqa: F401  (switches optimize_ddp off before any variant sets its own)

    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    try:
        setup = Setup(inner=args.inner, variants=tuple(args.variants), rounds=args.rounds,
                      trace_steps=args.trace_steps)
        res = run(setup)
        bad = failures(res)
        if dist.get_rank() == 0:
            print()
            print(report(res))
            print()
            print(CPU_NOTE)
            if args.plot:
                from goddp.tracing import plot_steps

                rows = [(LABELS[n], t.get("trace")) for n, t in res["launches"].items()]
                plot_steps(args.plot, rows, title=f"{res['description']}, 2 ranks, gloo: median traced step")
                print(f"\nlaunch timelines written to {args.plot}")
            print("\ngoddp's plan (what the 'goddp' logger printed at INFO while compiling):")
            print("\n".join(res["goddp_log"]))
            print(f"\ndemo finished in {time.perf_counter() - t0:.0f} s; {machine_load()}"
                  + ("" if not bad else ": FAILED: " + "; ".join(bad)))
    finally:
        dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
