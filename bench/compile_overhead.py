"""Compile overhead of splitting: goddp's cut-and-compile path vs torch's DDPOptimizer.

    .venv/bin/python -m bench.compile_overhead [--nodes 1000 4000 16000] [--e2e gpt:quick]

Synthetic graph: a deep stack of small Linear + tanh layers (about 4 FX
nodes per layer), captured by Dynamo under a one-rank gloo DDP forward, with
bucket_cap_mb=1 so that the graph falls into hundreds of buckets (8 layers
each). The inner compiler is trivial (returns gm.forward), so what is timed
is the splitter itself. Every (tool, size) runs in a fresh process, which
gives a clean peak-memory figure (ru_maxrss growth across the compile).

Tools:
  unsplit       optimize_ddp=False: Dynamo's capture alone, the common floor
  torch         torch's DDPOptimizer, phases timed by bench.probes
  goddp_torch   goddp, torch mode: phases from goddp.last_plans()[-1]["timings"]
  goddp_ddp     goddp, ddp mode
  regional      (--e2e only) each repeated block compiled alone, eager DDP
  goddp_bytes   (--e2e only) goddp, ddp mode, block-aligned cuts off
  goddp_compile_edges
                (--e2e only) goddp, ddp mode, its edge pieces (before the
                first block, after the last) compiled too (edges="compile")
  goddp_each    (--e2e only) goddp with block cuts, but every piece compiled
                on its own (no shared callable): what Inductor's own caches
                give for identical pieces
  goddp_canon   (--e2e only) as goddp_each, node names made canonical first
                (v0, v1, ...) so that identical pieces are identical code

--checkpoint block|stack (several allowed) trains the --e2e GPT with
activation checkpointing per block or around the whole stack; each record
then also has the activations autograd saves in a steady forward
("saved act. MiB", parameters left out: what recomputation trims) and the
RSS growth over that step. Every --e2e record also has the peak memory of
two more steady steps, forward and backward (the allocator's peak above
the step's start, bench.probes.step_peak_bytes, Note [Step peak memory]):
"peak MiB" with the gradients of the last step kept (backward adds into
them), "peak MiB, grads None" with them set to None first, as a training
loop's zero_grad(set_to_none=True) leaves them (backward then allocates
every gradient); the report gives goddp's and regional's over unsplit's.
The checkpointed depth rows of the README:

    .venv/bin/python -m bench.compile_overhead --nodes --e2e gpt:quick \
        --layers 4 8 16 --checkpoint block --tools unsplit regional goddp_ddp \
        --repeat 2 --core 0 --out bench/results/compile-depth-ckpt.json

"dynamo" in the phase list is the first call's wall time minus everything
the splitter reports, i.e. Dynamo's tracing plus one real forward.

--e2e MODEL:SIZE also times a real inductor compile of a bench model end to
end (first forward, first backward) for the same tools, each in a fresh
process with a fresh, empty Inductor cache directory (--caches off turns
Inductor's FX graph and AOTAutograd caches off altogether). --layers N ...
repeats it at several depths (GPT); --repeat interleaves the repeats.

The depth table of the README:

    .venv/bin/python -m bench.compile_overhead --nodes --e2e gpt:quick \
        --layers 4 8 16 --tools unsplit regional torch goddp_ddp goddp_compile_edges \
        --repeat 3 --core 0 --out bench/results/compile-depth.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import stats

TOOLS = ("unsplit", "torch", "goddp_torch", "goddp_ddp")
# Tools of the end-to-end compile only: regional compilation (each block
# compiled alone, eager DDP) needs a model of blocks and a real compiler;
# goddp_bytes is goddp's ddp mode with block-aligned cuts turned off, and
# goddp_compile_edges with its edge pieces compiled.
E2E_TOOLS = ("regional", "goddp_bytes", "goddp_compile_edges", "goddp_each", "goddp_canon")
TRIVIAL = "bench_trivial"
# The two step peaks of an --e2e record: gradients kept from the last step
# (backward adds into them), and set to None first, as a training loop's
# optimizer.zero_grad(set_to_none=True) leaves them.
PEAKS = {"step_peak_mib": "grads kept", "step_peak_fresh_grads_mib": "grads None"}
LAYER_WIDTH = 192  # 148 KiB per layer: 8 layers fill DDPOptimizer's 1 MiB minimum cap


# ------------------------------------------------------------------ child

def _child(args) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench import models, probes
    from bench.group import one_rank_group

    torch.set_num_threads(1)
    goddp = probes.goddp_module()  # import first: it turns optimize_ddp off
    if args.tool.startswith("goddp") and goddp is None:
        return {"tool": args.tool, "nodes": args.nodes, "error": "goddp unavailable"}

    compiled_graph_nodes: list[int] = []

    @torch._dynamo.register_backend(name=TRIVIAL)
    def trivial(gm, example_inputs, **_):
        compiled_graph_nodes.append(len(gm.graph.nodes))
        return gm.forward

    args.compiled_graph_nodes = compiled_graph_nodes

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    one_rank_group("goddp-bench-store-")
    try:
        if args.e2e:
            return _e2e(args, torch, DDP, models, probes)
        wl = models.deep_stack(args.nodes, width=LAYER_WIDTH, batch=4)
        ddp = DDP(wl.model, bucket_cap_mb=1)
        return _compile_once(args, torch, ddp, wl, TRIVIAL, probes)
    finally:
        dist.destroy_process_group()


def _canonical_names(gm):
    """Renames every node of gm v0, v1, ... (placeholders too), so that
    pieces that differ only in names become the same code."""
    for i, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            node.target = f"v{i}"
        if node.op != "output":
            node.name = f"v{i}"
    gm.recompile()
    return gm


# The PieceReuseOff switch goddp_each and goddp_canon turn on (goddp.measure).
_REUSE_OFF: list = []


def _compiled(torch, ddp, tool: str, inner: str):
    if tool in ("goddp_each", "goddp_canon"):
        # goddp's reuse of one callable off (for this whole process), to
        # measure what the inner compiler's caches give instead.
        from torch._dynamo.backends.registry import lookup_backend

        from goddp import measure

        _REUSE_OFF.append(measure.PieceReuseOff().on())
        named = lookup_backend(inner)

        def each(gm, example_inputs):
            return named(_canonical_names(gm) if tool == "goddp_canon" else gm, example_inputs)

        return torch.compile(ddp, backend="goddp", options={"inner": each, "mode": "ddp"})
    if tool == "goddp_bytes":
        return torch.compile(ddp, backend="goddp", options={"inner": inner, "mode": "ddp", "block_cuts": False})
    if tool == "goddp_compile_edges":
        return torch.compile(ddp, backend="goddp", options={"inner": inner, "mode": "ddp", "edges": "compile"})
    if tool.startswith("goddp"):
        return torch.compile(ddp, backend="goddp", options={"inner": inner, "mode": tool.split("_")[1]})
    if tool == "regional":
        from bench import variants

        variants.regional_compile(ddp.module, variants.CountingBackend(inner))
        return ddp
    return torch.compile(ddp, backend=inner)


def _compile_once(args, torch, ddp, wl, inner: str, probes) -> dict:
    probe = probes.DDPOptimizerProbe()
    plans0 = len(probes.goddp_plans())
    compiled = _compiled(torch, ddp, args.tool, inner)
    with probe.installed(), torch._dynamo.config.patch(optimize_ddp=args.tool == "torch"), \
            stats.RssSampler() as rss:
        t = time.perf_counter()
        out = compiled(*wl.inputs)
        first_call = time.perf_counter() - t
    rec = {"tool": args.tool, "nodes": args.nodes, "first_call_s": first_call,
           "peak_rss_delta_mib": rss.peak_delta_mib,
           "params_mib": wl.grad_bytes / 2**20, "layers": len(wl.model.layers)}
    phases: dict = {}
    if args.tool == "torch" and probe.calls:
        call = probe.calls[-1]
        phases = dict(call["phases"])
        rec.update(graph_nodes=call["graph_nodes"], pieces=len(call["buckets"]))
    elif args.tool.startswith("goddp"):
        plans = probes.goddp_plans()[plans0:]
        if plans:
            p = probes.summarize_goddp_plan(plans[-1])
            phases = {k: float(v) for k, v in (p.get("timings") or {}).items()
                      if isinstance(v, (int, float))}
            rec.update(pieces=p.get("num_pieces"), graph_nodes=p.get("graph_nodes"), goddp_plan=p)
            if p.get("fallback"):
                rec["error"] = f"goddp fell back to the whole graph: {p['fallback']}"
        else:
            rec["error"] = "goddp recorded no plan"
    elif args.tool == "unsplit":
        rec.update(graph_nodes=sum(args.compiled_graph_nodes), pieces=len(args.compiled_graph_nodes))
    splitter = sum(phases.values())
    rec["phases"] = {"dynamo": first_call - splitter, **phases}
    rec["splitter_s"] = splitter
    del out
    return rec


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children
    (Inductor runs the C++ compiler as child processes)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _e2e(args, torch, DDP, models, probes) -> dict:
    name, size = args.e2e.split(":")
    overrides = {"n_layer": args.layers} if args.layers else {}
    if args.checkpoint != "none":
        overrides["checkpoint"] = args.checkpoint
    wl = models.build(name, size, **overrides)
    # default caps, as a user would, unless --bucket-cap-mb says otherwise
    ddp = DDP(wl.model) if args.bucket_cap_mb is None else DDP(wl.model, bucket_cap_mb=args.bucket_cap_mb)
    plans0 = len(probes.goddp_plans())
    compiled = _compiled(torch, ddp, args.tool, "inductor")
    with torch._dynamo.config.patch(optimize_ddp=args.tool == "torch"), stats.RssSampler() as rss:
        c0 = _cpu_seconds()
        t0 = time.perf_counter()
        loss = wl.loss(compiled(*wl.inputs))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        for switch in _REUSE_OFF:
            switch.check_used()  # else this run measured goddp with reuse
        c1 = _cpu_seconds()
        steady, steady_cpu = [], []
        for _ in range(args.steady):
            s, cs = time.perf_counter(), _cpu_seconds()
            wl.loss(compiled(*wl.inputs)).backward()
            steady.append(time.perf_counter() - s)
            steady_cpu.append(_cpu_seconds() - cs)
        with stats.RssSampler() as step_rss:
            saved = probes.saved_activation_bytes(lambda: wl.loss(compiled(*wl.inputs)), wl.model.parameters())
            saved.result.backward()
        # Two more steady steps, unhooked, for the allocator's peak (Note [Step peak memory]):
        # gradients kept from the last step (backward adds into them), then set to None
        # first, as optimizer.zero_grad(set_to_none=True) leaves them in a training loop.
        peak = probes.step_peak_bytes(lambda: wl.loss(compiled(*wl.inputs)).backward())
        for p in wl.model.parameters():
            p.grad = None
        peak_fresh = probes.step_peak_bytes(lambda: wl.loss(compiled(*wl.inputs)).backward())
    rec = {"tool": args.tool, "model": args.e2e, "layers": args.layers, "checkpoint": args.checkpoint,
           "bucket_cap_mb": args.bucket_cap_mb, "first_forward_s": t1 - t0, "first_backward_s": t2 - t1,
           "steady_step_s": stats.median(steady), "steady_step_cpu_s": stats.median(steady_cpu),
           "peak_rss_delta_mib": rss.peak_delta_mib,
           "saved_activations_mib": saved.nbytes / 2**20, "step_peak_rss_delta_mib": step_rss.peak_delta_mib,
           "step_peak_mib": peak.nbytes / 2**20, "step_peak_fresh_grads_mib": peak_fresh.nbytes / 2**20,
           "step_peak_source": peak.source}
    rec["compile_s"] = rec["first_forward_s"] + rec["first_backward_s"] - rec["steady_step_s"]
    # CPU seconds (this process and the compilers it ran): on a shared
    # machine far less noisy than wall time, which waits for other jobs.
    rec["compile_cpu_s"] = (c1 - c0) - stats.median(steady_cpu)
    plans = probes.goddp_plans()[plans0:]
    if plans:
        p = probes.summarize_goddp_plan(plans[-1])
        rec["pieces"] = p.get("num_pieces")
        rec["fallback"] = p.get("fallback")
        rec["distinct_pieces"] = p.get("distinct_pieces")
        rec["eager_pieces"] = p.get("eager_pieces")
    return rec


# ------------------------------------------------------------------ parent

def _run_child(extra: list[str], timeout: float, core: int | None, caches: str = "off") -> dict:
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    if caches == "off":
        env.update(TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    with tempfile.TemporaryDirectory(prefix="goddp-bench-") as tmp:
        env["TORCHINDUCTOR_CACHE_DIR"] = tmp
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "bench.compile_overhead", "--child", "--out", str(out), *extra]
        if core is not None:
            cmd = ["taskset", "-c", str(core), *cmd]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f}s"}
        if proc.returncode != 0 or not out.exists():
            return {"error": f"exit {proc.returncode}: " + proc.stderr.strip()[-2000:]}
        return json.loads(out.read_text())


def _ckpt_text(checkpoint: str | None) -> str:
    return f" ckpt/{checkpoint}" if checkpoint and checkpoint != "none" else ""


def run(nodes: list[int], tools: list[str], e2e: list[str], repeat: int = 1, timeout: float = 1800,
        core: int | None = 0, log=print, layer_counts: list[int] | None = None, caches: str = "off",
        checkpoints: list[str] | None = None, bucket_cap_mb: float | None = None, steady: int = 3) -> dict:
    """Every (tool, size) in its own process, `repeat` times with the tools
    interleaved; each record keeps the median of its repeats (and all runs).
    checkpoints: the --e2e GPT's activation checkpointing variants;
    bucket_cap_mb: the --e2e DDP module's (None: DDP's default)."""
    checkpoints = checkpoints or ["none"]
    runs: dict[tuple, list[dict]] = {}
    jobs = [(rep, n, t) for rep in range(repeat) for n in nodes for t in tools if t not in E2E_TOOLS]
    t_start = time.perf_counter()
    for i, (rep, n, tool) in enumerate(jobs):
        rec = _run_child(["--nodes", str(n), "--tool", tool], timeout, core)
        rec.setdefault("tool", tool)
        rec.setdefault("nodes", n)
        runs.setdefault((n, tool), []).append(rec)
        log(f"[compile {i + 1}/{len(jobs)}, {time.perf_counter() - t_start:.0f}s] {tool} at {n} nodes: "
            + (rec["error"].splitlines()[-1] if "error" in rec else
               f"first call {rec['first_call_s']:.2f}s, splitter {rec['splitter_s']:.2f}s, "
               f"pieces {rec.get('pieces')}, peak RSS +{rec['peak_rss_delta_mib']:.0f} MiB"))
    synthetic = [_median_record(recs) for recs in runs.values()]
    e2e_runs: dict[tuple, list[dict]] = {}
    e2e_jobs = [(rep, model, layers, ckpt, tool) for rep in range(repeat) for model in e2e
                for layers in (layer_counts or [None]) for ckpt in checkpoints for tool in tools]
    for i, (rep, model, layers, ckpt, tool) in enumerate(e2e_jobs):
        extra = ["--e2e", model, "--tool", tool, "--checkpoint", ckpt] + (["--layers", str(layers)] if layers else [])
        extra += ["--bucket-cap-mb", str(bucket_cap_mb)] if bucket_cap_mb is not None else []
        extra += ["--steady", str(steady)]
        rec = _run_child(extra, timeout, core, caches)
        rec.setdefault("tool", tool)
        rec.setdefault("model", model)
        rec.setdefault("layers", layers)
        rec.setdefault("checkpoint", ckpt)
        e2e_runs.setdefault((model, layers, ckpt, tool), []).append(rec)
        log(f"[compile e2e {i + 1}/{len(e2e_jobs)}, {time.perf_counter() - t_start:.0f}s] {tool} {model}"
            + (f" {layers} layers" if layers else "") + _ckpt_text(ckpt) + ": "
            + (rec["error"].splitlines()[-1] if "error" in rec else
               f"compile {rec['compile_s']:.1f}s, CPU {rec.get('compile_cpu_s', float('nan')):.1f}s "
               f"(fwd {rec['first_forward_s']:.1f}s, "
               f"bwd {rec['first_backward_s']:.1f}s), steady step {rec['steady_step_s'] * 1e3:.0f}ms, "
               f"pieces {rec.get('pieces')} ({rec.get('distinct_pieces')} distinct, "
               f"{rec.get('eager_pieces') or 0} eager), saved activations {rec['saved_activations_mib']:.1f} MiB, "
               f"step peak {rec.get('step_peak_mib', float('nan')):.1f} MiB "
               f"({rec.get('step_peak_fresh_grads_mib', float('nan')):.1f} MiB from grads None)"))
    end_to_end = [_median_e2e(recs) for recs in e2e_runs.values()]
    return {"synthetic": synthetic, "e2e": end_to_end, "repeat": repeat, "caches": caches}


def _median_e2e(recs: list[dict]) -> dict:
    ok = [r for r in recs if "error" not in r]
    if not ok:
        return recs[-1]
    out = dict(ok[0])
    for key in ("compile_s", "compile_cpu_s", "first_forward_s", "first_backward_s", "steady_step_s",
                "peak_rss_delta_mib", "saved_activations_mib", "step_peak_rss_delta_mib", *PEAKS):
        if all(key in r for r in ok):
            out[key] = stats.median(r[key] for r in ok)
    for key in PEAKS:
        out[_runs_key(key)] = [r[key] for r in ok if key in r]
    out["compile_runs_s"] = [r["compile_s"] for r in ok]
    out["compile_cpu_runs_s"] = [r["compile_cpu_s"] for r in ok if "compile_cpu_s" in r]
    out["failed_runs"] = len(recs) - len(ok)
    out["runs"] = recs  # in order of the repeats (bench.edges pairs them)
    return out


def _median_record(recs: list[dict]) -> dict:
    ok = [r for r in recs if "error" not in r]
    if not ok:
        return recs[-1]
    out = dict(ok[0])
    for key in ("first_call_s", "splitter_s", "peak_rss_delta_mib"):
        out[key] = stats.median(r[key] for r in ok)
    out["phases"] = {k: stats.median(r["phases"].get(k, 0.0) for r in ok) for k in ok[0]["phases"]}
    out["first_call_runs_s"] = [r["first_call_s"] for r in ok]
    out["failed_runs"] = len(recs) - len(ok)
    return out


def report(res: dict) -> str:
    ok = [r for r in res["synthetic"] if "error" not in r]
    phases: list[str] = []
    for r in ok:
        phases += [k for k in r["phases"] if k not in phases]
    rows = []
    for r in res["synthetic"]:
        if "error" in r:
            rows.append([f"{r['tool']} @ {r['nodes']}", "FAILED: " + r["error"].splitlines()[-1][:60]]
                        + [""] * (len(phases) + 3))
            continue
        rows.append([f"{r['tool']} @ {r['nodes']}", r.get("graph_nodes", "-"), r.get("pieces", "-")]
                    + [stats.fmt_s(r["phases"].get(p)) for p in phases]
                    + [stats.fmt_s(r["first_call_s"]) + _runs_text(r), f"{r['peak_rss_delta_mib']:.0f}"])
    out = [stats.table(["tool @ target nodes", "graph nodes", "pieces", *phases, "first call", "RSS+ MiB"],
                       rows, title="== compile overhead, trivial inner compiler ==")]
    by_size: dict[int, dict] = {}
    for r in ok:
        by_size.setdefault(r["nodes"], {})[r["tool"]] = r
    for n, tools in sorted(by_size.items()):
        if "torch" in tools:
            for g in ("goddp_torch", "goddp_ddp"):
                if g in tools and tools["torch"]["splitter_s"] > 0:
                    q = tools[g]["splitter_s"] / tools["torch"]["splitter_s"]
                    out.append(f"{n} nodes: {g} splitter time / torch's = {q:.3f}"
                               + (" SLOWER" if q > 1 else ""))
    if res["e2e"]:
        out.append(e2e_report(res))
    return "\n".join(out)


def e2e_report(res: dict) -> str:
    """The end-to-end table: compile time (median [min-max] over the
    repeats) per model, depth and tool, then each goddp tool's ratio to the
    unsplit compile and to regional compilation at the same depth."""
    caches = "fresh caches" if res.get("caches", "off") == "fresh" else "caches off"
    rows = []
    for r in res["e2e"]:
        where = (f"{r['tool']} {r.get('model')}" + (f" {r['layers']}L" if r.get("layers") else "")
                 + _ckpt_text(r.get("checkpoint")))
        if "error" in r:
            rows.append([where, "FAILED: " + r["error"].splitlines()[-1][:60], "", "", "", "", "", "", "", "", ""])
            continue
        runs = r.get("compile_runs_s") or []
        spread = f" [{stats.fmt_s(min(runs))}-{stats.fmt_s(max(runs))}]" if len(runs) > 1 else ""
        pieces = r.get("pieces")
        cpu_runs = r.get("compile_cpu_runs_s") or []
        cpu = stats.fmt_s(r["compile_cpu_s"]) if "compile_cpu_s" in r else "-"
        if len(cpu_runs) > 1:
            cpu += f" [{stats.fmt_s(min(cpu_runs))}-{stats.fmt_s(max(cpu_runs))}]"
        rows.append([where, stats.fmt_s(r["compile_s"]) + spread, cpu, stats.fmt_s(r["first_forward_s"]),
                     stats.fmt_s(r["first_backward_s"]), stats.fmt_s(r["steady_step_s"]),
                     "-" if pieces is None else
                     f"{pieces} ({r.get('distinct_pieces') or '?'} distinct, {r.get('eager_pieces') or 0} eager)",
                     f"{r['peak_rss_delta_mib']:.0f}",
                     f"{r['saved_activations_mib']:.1f}" if "saved_activations_mib" in r else "-",
                     *(_peak_text(r, key) for key in PEAKS)])
    out = [stats.table(["tool model depth", "compile (wall)", "compile (CPU)", "1st fwd", "1st bwd", "steady step", "pieces", "RSS+ MiB",
                        "saved act. MiB", "peak MiB", "peak MiB, grads None"],
                       rows, title=f"== end-to-end inductor compile (1 rank, {caches}, {res.get('repeat', 1)} runs each) ==")]
    by_case: dict[tuple, dict] = {}
    for r in res["e2e"]:
        if "error" not in r:
            by_case.setdefault((r["model"], r.get("layers"), r.get("checkpoint")), {})[r["tool"]] = r
    for (model, layers, ckpt), tools in by_case.items():
        where = f"{model}" + (f" {layers}L" if layers else "") + _ckpt_text(ckpt)
        for g in ("goddp_ddp", "goddp_bytes", "goddp_torch"):
            for base in ("compiled_unsplit", "regional", "torch"):
                key = "unsplit" if base == "compiled_unsplit" else base
                if g in tools and key in tools and tools[key]["compile_s"] > 0:
                    q = tools[g]["compile_s"] / tools[key]["compile_s"]
                    line = f"{where}: {g} compile / {key} = {q:.2f} (wall)"
                    if tools[g].get("compile_cpu_s") and tools[key].get("compile_cpu_s"):
                        line += f", {tools[g]['compile_cpu_s'] / tools[key]['compile_cpu_s']:.2f} (CPU)"
                    out.append(line)
        if "goddp_ddp" in tools and "unsplit" in tools and tools["unsplit"].get("saved_activations_mib"):
            q = tools["goddp_ddp"]["saved_activations_mib"] / tools["unsplit"]["saved_activations_mib"]
            out.append(f"{where}: goddp_ddp saved activations / unsplit = {q:.2f}")
        for key, what in PEAKS.items():
            for g in ("goddp_ddp", "regional"):
                q = peak_ratio(tools.get(g), tools.get("unsplit"), key)
                if q is not None:
                    out.append(f"{where}: {g} step peak / unsplit ({what}) = {q['median']:.2f}"
                               + (f" [{q['min']:.2f}-{q['max']:.2f}]" if q["n"] > 1 else "")
                               + f" ({tools[g][key]:.1f} / {tools['unsplit'][key]:.1f} MiB)")
    return "\n".join(out)


def _runs_key(key: str) -> str:
    return key.replace("_mib", "_runs_mib")


def _peak_text(r: dict, key: str) -> str:
    if key not in r:
        return "-"
    runs = r.get(_runs_key(key)) or []
    return f"{r[key]:.1f}" + (f" [{min(runs):.1f}-{max(runs):.1f}]" if len(runs) > 1 else "")


def peak_ratio(tool: dict | None, base: dict | None, key: str = "step_peak_mib") -> dict | None:
    """tool's step peak (key: one of PEAKS) over base's, per repeat where
    both have it (repeats are interleaved, so repeat i of each ran side by
    side), summarized; None where either lacks that peak."""
    if not tool or not base or not base.get(key) or key not in tool:
        return None
    num, den = tool.get(_runs_key(key)) or [], base.get(_runs_key(key)) or []
    if len(num) != len(den) or not num:
        num, den = [tool[key]], [base[key]]
    out = stats.summarize(a / b for a, b in zip(num, den) if b > 0)
    out["median_of_medians"] = tool[key] / base[key]
    return out


def _runs_text(r: dict) -> str:
    runs = r.get("first_call_runs_s") or []
    return f" [{stats.fmt_s(min(runs))}-{stats.fmt_s(max(runs))}]" if len(runs) > 1 else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="*", default=[1000, 4000, 16000])
    ap.add_argument("--tools", nargs="*", default=list(TOOLS), choices=TOOLS + E2E_TOOLS)
    ap.add_argument("--layers", type=int, nargs="*", default=[], help="--e2e model depths (n_layer), e.g. 4 8 16")
    ap.add_argument("--caches", choices=("fresh", "off"), default="fresh",
                    help="--e2e: Inductor caches on in a fresh directory per run (as a user's first run), or off")
    ap.add_argument("--e2e", nargs="*", default=[], help="MODEL:SIZE, e.g. gpt:quick")
    ap.add_argument("--checkpoint", nargs="*", default=["none"], choices=("none", "block", "stack"),
                    help="--e2e GPT: activation checkpointing per block, around the whole stack, or none "
                         "(several: each is a case of its own)")
    ap.add_argument("--bucket-cap-mb", type=float, default=None,
                    help="--e2e: the DDP module's bucket_cap_mb (default: DDP's own); e.g. --layers 1 "
                         "--checkpoint stack with a cap below a block's parameters: a checkpoint split at buckets")
    ap.add_argument("--steady", type=int, default=3, help="--e2e: steady steps timed after the first (their median)")
    ap.add_argument("--out", help="JSON output (parent: all results; child: one record)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    ap.add_argument("--repeat", type=int, default=1, help="runs per (tool, size), interleaved; medians reported")
    ap.add_argument("--core", type=int, default=0, help="CPU core the measured processes are pinned to")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tool", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.nodes = args.nodes[0] if args.nodes else 0
        args.e2e = args.e2e[0] if args.e2e else None
        args.layers = args.layers[0] if args.layers else None
        args.checkpoint = args.checkpoint[0] if args.checkpoint else "none"
        Path(args.out).write_text(json.dumps(_child(args)))
        return 0
    res = run(args.nodes, args.tools, args.e2e, args.repeat, args.timeout, core=args.core,
              layer_counts=args.layers, caches=args.caches, checkpoints=args.checkpoint,
              bucket_cap_mb=args.bucket_cap_mb, steady=args.steady)
    print(report(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
        from bench import plots
        if res["synthetic"]:
            plots.compile_phases([r for r in res["synthetic"] if "error" not in r],
                                 Path(args.out).with_suffix(".png"))
        if args.layers:
            plots.compile_vs_depth([r for r in res["e2e"] if "error" not in r],
                                   Path(args.out).with_name(Path(args.out).stem + "-depth.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
