"""One rank of the step benchmark; started by torchrun (see bench/step_bench.py).

    torchrun ... -m bench.step_worker --job JOB.json --out RANK_DIR

Phases, all in one process so that every variant sees the same machine:
  1. link: allreduce time over several sizes (for the a + b*bytes fit), the
     CPU it burns, and how much a concurrent allreduce slows compute down;
  2. build and warm up (compile) every variant on its own model copy;
  3. profile: each variant's compute split into forward/backward/optimizer,
     under no_sync so that no communication is mixed in;
  4. rounds: all variants interleaved round-robin (the order rotates each
     round), a few steps each, a barrier before every step so that the ranks
     start together, and the link's qdisc counters read around each block.
Each rank writes its raw measurements to RANK_DIR/rank<r>.json; the driver
merges the ranks (taking the slower one per step) and does the statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import sys
import time
import traceback
from pathlib import Path

import torch
import torch._dynamo
import torch.distributed as dist

from bench import link, models, probes, stats, variants

MiB = 1 << 20


def log(rank: int, job: str, msg: str) -> None:
    if rank == 0:
        print(f"[{job}] {msg}", flush=True)


def time_allreduces(job: dict, when: str) -> list[dict]:
    """Allreduce wall time over the configured sizes (for the a + b*bytes fit)."""
    points = []
    for mib in job["link_sizes_mib"]:
        nbytes = int(mib * MiB)
        buf = torch.zeros(nbytes // 4)
        dist.all_reduce(buf)  # first use of a size allocates gloo buffers
        for _ in range(job["link_reps"]):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(buf)
            points.append({"bytes": nbytes, "seconds": time.perf_counter() - t, "when": when})
    return points


def measure_link(job: dict, rank: int) -> dict:
    """Allreduce time vs size, CPU cost of communicating, and interference."""
    sizes = [int(s * MiB) for s in job["link_sizes_mib"]]
    reps = job["link_reps"]
    out = {"points": time_allreduces(job, "before")}

    # CPU burnt while transferring the largest size (all threads of this
    # process, plus the machine-wide view that includes softirq work).
    buf = torch.zeros(sizes[-1] // 4)
    dist.barrier()
    with stats.cpu_clock() as cpu:
        for _ in range(reps):
            dist.all_reduce(buf)
    out["cpu_during_allreduce"] = {**cpu, "bytes_each": sizes[-1], "count": reps}

    # Interference: the same compute alone and while an allreduce is in flight.
    # Each rank is pinned to one core, so gloo's threads and the kernel's
    # network work compete with the compute thread for it.
    a = torch.randn(384, 384)
    def compute(n):
        t = time.perf_counter()
        for _ in range(n):
            a @ a
        return time.perf_counter() - t
    compute(20)
    per = compute(50) / 50
    n = max(10, int(job["interference_compute_s"] / per))
    alone = min(compute(n) for _ in range(2))
    dist.barrier()
    t = time.perf_counter()
    dist.all_reduce(buf)
    comm_alone = time.perf_counter() - t
    dist.barrier()
    t = time.perf_counter()
    work = dist.all_reduce(buf, async_op=True)
    with_comm = compute(n)
    work.wait()
    comm_with = time.perf_counter() - t
    out["interference"] = {
        "compute_alone_s": alone, "compute_during_allreduce_s": with_comm,
        "allreduce_alone_s": comm_alone, "allreduce_during_compute_s": comm_with,
        "bytes": sizes[-1], "matmuls": n,
    }
    return out


def step_prediction(record: dict) -> dict:
    """From a goddp.trace record of one step: the timeline model's
    predicted exposed communication beside the measured one, the fitted
    allreduce cost, and per bucket the predicted and measured completion
    (Note [Trace prediction] in goddp.tracing.prediction)."""
    pred = record.get("prediction") or {}
    if "buckets" not in pred:
        return {"unavailable": pred.get("unavailable", "no prediction")}
    keep = ("exposed_s", "measured_exposed_s", "exposed_error_s", "backward_s", "step_s")
    return {**{k: pred.get(k) for k in keep},
            "fit": {k: pred["fit"].get(k) for k in ("latency_ns", "bytes_per_second", "method", "note")},
            "left_out": len(pred.get("left_out") or []),
            "buckets": [{k: b.get(k) for k in ("bytes", "launch_s", "predicted_start_s", "done_s",
                                                "predicted_done_s", "done_error_s")} for b in pred["buckets"]],
            "caps": [{k: c.get(k) for k in ("key", "bucket_bytes", "exposed_s", "step_s")} for c in pred["caps"]],
            "measured": {k: (record.get("step_stats") or [{}])[0].get(k)
                         for k in ("exposed_s", "backward_s", "last_done_s", "overlapped")}}


def run(job: dict, out_dir: Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    name = job["name"]
    device = link.current_device() if job.get("link") else None
    torch.set_num_threads(1)
    # Every compiled variant compiles the one forward code object with its
    # own backend object; more than Dynamo's default of 8 (the auto jobs)
    # would leave the later ones running eagerly.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(job["variants"]))

    workload = models.build(job["model"], job["size"], seed=0, **job.get("overrides", {}))
    result: dict = {
        "rank": rank, "world": world, "job": job, "device": device,
        "workload": {"description": workload.description, "grad_bytes": workload.grad_bytes,
                     **workload.meta},
        "env": {"torch": torch.__version__, "python": platform.python_version(),
                "affinity": sorted(os.sched_getaffinity(0)),
                "omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME")},
        "variants": {},
    }
    log(rank, name, f"{workload.description}: {workload.grad_bytes / MiB:.1f} MiB of gradients, "
                    f"inner={job['inner']}, world={world}, link device={device}")

    t = time.perf_counter()
    result["link"] = measure_link(job, rank)
    fit = stats.fit_line([p["bytes"] for p in result["link"]["points"]],
                         [p["seconds"] for p in result["link"]["points"]])
    log(rank, name, f"link measured in {time.perf_counter() - t:.1f}s: allreduce = "
                    f"{fit['a'] * 1e3:.1f}ms + bytes / {1 / fit['b'] / MiB:.0f} MiB/s")

    # Pay Dynamo's and the inner compiler's one-time start-up costs before
    # timing any variant's compile, so the first variant is not penalised.
    t = time.perf_counter()
    variants.warm_compiler(job["inner"])
    log(rank, name, f"compiler start-up paid in {time.perf_counter() - t:.1f}s")

    ddp_kwargs = {"bucket_cap_mb": job["bucket_cap_mb"]} if job.get("bucket_cap_mb") else {}
    if job.get("find_unused_parameters"):
        ddp_kwargs["find_unused_parameters"] = True
    probe = probes.DDPOptimizerProbe()
    built: list[variants.Variant] = []
    with probe.installed():
        for vname in job["variants"]:
            spec = variants.SPECS[vname]
            t = time.perf_counter()
            probe_calls = len(probe.calls)
            try:
                v = variants.make_variant(spec, workload.model, job["inner"], ddp_kwargs)
                variants.warm_up(v, workload, job["warmup"])
            except Exception as err:  # noqa: BLE001 - report, keep the other variants
                # A failure on one rank only would hang the other in a
                # collective, so both ranks must agree to skip.
                msg = f"{type(err).__name__}: {err}"
                result["variants"][vname] = {"error": msg, "traceback": traceback.format_exc()}
                log(rank, name, f"{vname}: FAILED to build/compile: {msg}")
                if rank == 0:
                    traceback.print_exc()
                continue
            finally:
                # Agree across ranks on whether this variant is usable.
                flag = torch.tensor([0 if vname in result["variants"] else 1])
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if int(flag) == 0:
                if vname not in result["variants"]:
                    result["variants"][vname] = {"error": "failed on the other rank"}
                continue
            v.info["compile_wall_s"] = time.perf_counter() - t
            v.info["graphs_after_warmup"] = v.compiled_graphs()
            v.info["ddp_buckets"] = variants.ddp_buckets(v.ddp)
            if v.backend is not None:
                v.info["backend_seconds"] = v.backend.seconds
                v.info["graph_nodes"] = list(v.backend.graphs)
            if len(probe.calls) > probe_calls:
                v.info["ddp_optimizer"] = probe.calls[probe_calls:]
            built.append(v)
            log(rank, name, f"{vname}: ready in {v.info['compile_wall_s']:.1f}s "
                            f"(first step {v.info['first_step_s']:.2f}s, "
                            f"graphs compiled: {v.compiled_graphs()})")

    # Compute profile: forward / backward / optimizer of every variant
    # without communication, interleaved.
    profile = {v.name: [] for v in built}
    for i in range(job["profile_steps"]):
        for v in built:
            dist.barrier()
            profile[v.name].append(v.step(workload, no_sync=True))
    log(rank, name, "compute profile (median fwd/bwd/opt, no communication): " + ", ".join(
        f"{n} {stats.fmt_s(stats.median(r['fwd'] for r in p))}/"
        f"{stats.fmt_s(stats.median(r['bwd'] for r in p))}/"
        f"{stats.fmt_s(stats.median(r['opt'] for r in p))}" for n, p in profile.items()))

    steps = {v.name: [] for v in built}
    link_bytes = {v.name: [] for v in built}
    rounds, per_round = job["rounds"], job["steps_per_round"]
    # Traced variants run every timed step inside goddp.trace; entering and
    # leaving are collective, so every rank does it here in the same order.
    traces = contextlib.ExitStack()
    for v in built:
        if v.spec.traced:
            traces.enter_context(probes.goddp_module().trace(v.ddp))
    t_rounds = time.perf_counter()
    for r in range(rounds):
        order = built[r % len(built):] + built[:r % len(built)]
        for v in order:
            before = link.qdisc_counters(device) if device else None
            for _ in range(per_round):
                # Entering and leaving goddp.trace are collective: outside
                # the step's own clock, in the same order on every rank.
                traced = (probes.goddp_module().trace(v.ddp) if v.spec.traced_each_step
                          else contextlib.nullcontext())
                with traced as tr:
                    dist.barrier()
                    ru0 = resource.getrusage(resource.RUSAGE_SELF)
                    rec = v.step(workload)
                    ru1 = resource.getrusage(resource.RUSAGE_SELF)
                rec.update(round=r, user=ru1.ru_utime - ru0.ru_utime, sys=ru1.ru_stime - ru0.ru_stime)
                if tr is not None:
                    rec["prediction"] = step_prediction(tr.to_dict())
                steps[v.name].append(rec)
            if before is not None:
                after = link.qdisc_counters(device)
                link_bytes[v.name].append({
                    "round": r, "steps": per_round,
                    "qdisc_bytes": after["bytes"] - before["bytes"],
                    "iface_bytes": (after["iface_tx_bytes"] - before["iface_tx_bytes"])
                    if after["iface_tx_bytes"] is not None else None,
                    "drops": after["drops"] - before["drops"],
                })
        elapsed = time.perf_counter() - t_rounds
        eta = elapsed / (r + 1) * (rounds - r - 1)
        log(rank, name, f"round {r + 1}/{rounds} ({elapsed:.0f}s, ~{eta:.0f}s left): " + "  ".join(
            f"{v.name} {stats.fmt_s(stats.median(s['total'] for s in steps[v.name] if s['round'] == r))}"
            for v in built))

    traces.close()

    # The link again, so that the fit averages over the run's drift.
    result["link"]["points"] += time_allreduces(job, "after")

    # When each bucket launches (goddp.trace, which leaves DDP as it was).
    launches = {}
    for v in built:
        dist.barrier()
        try:
            launches[v.name] = variants.trace_launches(v, workload, job["trace_steps"])
        except Exception as err:  # noqa: BLE001 - a diagnostic must not lose the measurements
            launches[v.name] = {"error": f"{type(err).__name__}: {err}"}
    log(rank, name, "head start of the average gradient byte's allreduce before backward compute ended: "
        + ", ".join(f"{n} {stats.fmt_s(t['head_start_s'])}" for n, t in launches.items() if "head_start_s" in t))

    # Each variant's peak memory over one step without communication
    # (bench.probes.step_peak_bytes, Note [Step peak memory]).
    peaks = {}
    for v in built:
        dist.barrier()
        device = next(v.ddp.module.parameters()).device
        peaks[v.name] = probes.step_peak_bytes(lambda: v.step(workload, no_sync=True), device).nbytes / MiB
    log(rank, name, "step peak memory (one step without communication): "
        + ", ".join(f"{n} {m:.1f} MiB" for n, m in peaks.items()))

    for v in built:
        graphs_now = v.compiled_graphs()
        result["variants"][v.name] = {
            "label": v.spec.label, "info": v.info, "profile": profile[v.name],
            "steps": steps[v.name], "link_bytes": link_bytes[v.name],
            "recompiled": graphs_now != v.info.get("graphs_after_warmup"),
            # DDP publishes its rebuilt buckets only after a few iterations.
            "ddp_buckets_end": variants.ddp_buckets(v.ddp),
            "launch": launches[v.name],
            "graphs_at_end": graphs_now,
            "step_peak_mib": peaks[v.name],
        }
    result["max_rss_mib"] = stats.max_rss_mib()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", required=True, help="job description (JSON file written by the driver)")
    ap.add_argument("--out", required=True, help="directory for rank<r>.json")
    args = ap.parse_args(argv)
    job = json.loads(Path(args.job).read_text())
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # torchrun starts workers in their own session; the driver uses this to
    # stop exactly this process if torchrun itself cannot.
    (out_dir / f"worker{os.environ.get('RANK', '0')}.pid").write_text(str(os.getpid()))
    # goddp switches optimize_ddp off when imported; import it up front so
    # that this happens before any variant sets its own value.
    probes.goddp_module()
    dist.init_process_group("gloo")
    try:
        result = run(job, out_dir)
        (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
