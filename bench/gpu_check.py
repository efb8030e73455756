"""`make gpu-check`: goddp on a CUDA GPU, in one command and a short table.

    .venv/bin/python -m bench.gpu_check [--quick] [--out DIR]

Two jobs, each in processes of its own (bench/demo.py does the training):
  single  1 rank, NCCL, CUDA tensors, Inductor: the bench's GPT under eager
          DDP, torch.compile(DDP) unsplit, torch's DDPOptimizer, regional
          compilation and goddp: first step (fresh Inductor cache each),
          steady step, peak memory of one step (CUDA's allocator, only on
          a GPU), goddp.trace (CUDA-timed), parameters against eager
          DDP's; then a bf16 autocast run of eager DDP, unsplit (on a GPU)
          and goddp.
  pair    2 ranks on the one GPU, Inductor: NCCL first; NCCL refuses two
          ranks on one device, and then the job runs again over gloo with
          CUDA tensors (the table says which ran).
  mixed   2 ranks on the one GPU (the backend the pair ran on), aot_eager:
          DDP's own mixed_precision (bf16 parameters, fp32 reduction) under
          eager DDP and goddp: goddp's parameters against eager DDP's, and
          what goddp did with DDP's buckets. CUDA only: torch's DDP makes a
          stream for it, which gloo on the CPU cannot.
Without CUDA the same jobs run on the CPU over gloo (the mixed job is
skipped, and the table says why), the table says that the GPU was skipped, and the exit status is 0 unless a check failed
(--quick: the tiny GPT and aot_eager, for the test of this path).
Exit status: 0 when every check passed (or was skipped), 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP_MESSAGE = "no CUDA device: the GPU checks were skipped; the same jobs ran on the CPU"
MIXED_LABEL = "2 ranks, DDP mixed_precision (bf16 params, fp32 reduce)"
MIXED_SKIPPED = "skipped: DDP's mixed_precision needs CUDA (torch's DDP creates a stream for it)"


# --------------------------------------------------------------------------
# Worker (one rank, started by _launch with torchrun's environment variables)


def _mixed_worker(args, device: str) -> dict:
    """The mixed job on this rank: eager DDP and goddp, each DDP with
    mixed_precision, three SGD steps on the same batches; the final (fp32)
    parameters compared, and goddp's word on DDP's buckets."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.nn.parallel.distributed import _MixedPrecision

    import goddp

    def train(compiled: bool):
        torch.manual_seed(0)
        model = nn.Sequential(*[layer for _ in range(6) for layer in (nn.Linear(256, 256), nn.ReLU())]).to(device)
        mixed = _MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                buffer_dtype=torch.bfloat16)
        ddp = DDP(model, bucket_cap_mb=0.25, mixed_precision=mixed)
        forward = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager"}) if compiled else ddp
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + dist.get_rank())
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            forward(torch.randn(16, 256, generator=gen).to(device)).float().square().mean().backward()
            optimizer.step()
        return [p.detach().float().clone() for p in ddp.parameters()]

    want = train(False)
    goddp.clear_plans()
    got = train(True)
    diff = max((a - b).abs().max().item() for a, b in zip(got, want))
    plans = [p for p in goddp.last_plans() if p.get("plan_check") is not None]
    numerics = {"goddp": {"max_abs_diff": diff, "bitwise": all(torch.equal(a, b) for a, b in zip(got, want)),
                          "close": all(torch.allclose(a, b, rtol=1e-2, atol=1e-3) for a, b in zip(got, want)),
                          "exact_expected": False}}
    return {"numerics": numerics, "failures": [] if plans else ["goddp made no plan inside DDP"],
            "ddp_buckets": plans[0]["ddp_buckets"] if plans else None,
            "pieces": plans[0]["num_pieces"] if plans else None}


def _worker(args) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from bench import demo

    import goddp  # noqa: F401  (switches optimize_ddp off first)

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.pg_timeout))
    out: dict = {"jobs": {}}
    try:
        device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
        size, inner = ("smoke", "aot_eager") if args.quick else ("demo", "inductor")
        rounds, trace_steps = (1, 2) if args.quick else (3, 3)
        # Several buckets in either size (the tiny GPT has 0.5 MiB of gradients).
        cap = 0.125 if args.quick else demo.Setup.bucket_cap_mb
        runs = []
        if args.worker == "mixed":
            out["jobs"]["mixed"] = _mixed_worker(args, device)
        elif args.worker == "single":
            every = ("eager_ddp", "compiled", "torch_ddpopt", "regional", "goddp")
            if args.quick:
                every = ("eager_ddp", "compiled", "goddp")
            runs.append(("fp32", demo.Setup(size=size, inner=inner, variants=every, rounds=rounds,
                                            trace_steps=trace_steps, device=device, bucket_cap_mb=cap)))
            # The unsplit graph as well on a GPU; on a CPU that compile costs more than the 3 minutes allow.
            bf16 = ("eager_ddp", "compiled", "goddp") if cuda and not args.quick else ("eager_ddp", "goddp")
            runs.append(("bf16", demo.Setup(size=size, inner=inner, variants=bf16,
                                            rounds=1, trace_steps=2, device=device, autocast=torch.bfloat16,
                                            fresh_caches=False, update_share=0.1, bucket_cap_mb=cap)))
        else:
            runs.append(("pair", demo.Setup(size=size, inner=inner, variants=("eager_ddp", "goddp"), rounds=1,
                                            trace_steps=trace_steps, device=device, fresh_caches=False,
                                            bucket_cap_mb=cap)))
        for label, setup in runs:
            res = demo.run(setup)
            out["jobs"][label] = {
                "report": demo.report(res),
                "failures": demo.failures(res),
                "first": res["first"],
                "steady_median_s": {n: _median(t) for n, t in res["steps"].items()},
                "step_peak_mib": res.get("step_peak_mib") or {},
                "numerics": res["numerics"],
                "trace": {n: {k: t.get(k) for k in ("exposed_median_s", "exposed_share_median")}
                          | ({"launched": t["stats"]["launched_during_backward"], "buckets": t["stats"]["buckets"],
                              "backward_s": t["stats"]["backward_s"]} if t.get("stats") else {})
                          for n, t in res["launches"].items()},
                "plans": len(res["plans"]),
                "goddp_log": res["goddp_log"],
            }
        out["world"] = dist.get_world_size()
        out["backend"] = dist.get_backend()
        out["device"] = torch.cuda.get_device_name() if cuda else "cpu"
        dist.barrier()  # rank 0 hosts the store: nobody leaves before the others are done
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(args.result).write_text(json.dumps(out, default=str))
    return 0


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


# --------------------------------------------------------------------------
# Driver


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(job: str, nproc: int, backend: str, device: str, quick: bool, out_dir: Path, timeout: float) -> dict:
    """Runs one job on `nproc` ranks (processes started here with torchrun's
    environment variables, which costs less than a torchrun agent); returns
    its result or its failure."""
    tag = f"{job}-{backend}"
    result, log_path = out_dir / f"{tag}.json", out_dir / f"{tag}.log"
    cmd = [sys.executable, "-m", "bench.gpu_check", "--worker", job, "--backend", backend, "--device", device,
           "--result", str(result)] + (["--quick"] if quick else [])
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc))
    if device == "cpu":
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    t = time.perf_counter()
    rcs: list = []
    with open(log_path, "w") as log:
        procs = [subprocess.Popen(cmd, cwd=REPO, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                 for r in range(nproc)]
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                rcs.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                rcs.append("timeout")
        for proc in procs:  # a rank left waiting for a failed one
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    took = time.perf_counter() - t
    if all(rc == 0 for rc in rcs) and result.exists():
        return {"ok": True, "took_s": took, **json.loads(result.read_text()), "log": str(log_path)}
    tail = log_path.read_text(errors="replace").splitlines()[-40:]
    return {"ok": False, "took_s": took, "rc": rcs, "tail": tail, "log": str(log_path)}


def _refusal(tail: list[str]) -> str:
    """The line that says why a job failed (NCCL's own words if there are)."""
    for needle in ("Duplicate GPU", "ncclInvalidUsage", "NCCL error", "Error: ", "Error", "error"):
        for line in tail:
            if needle in line and "ChildFailedError" not in line:
                return line.strip()[:160]
    return (tail[-1].strip() if tail else "no output")[:160]


def _check_rows(label: str, job: dict, name_of) -> list[list[str]]:
    rows = []
    for name, num in job["numerics"].items():
        if num["bitwise"]:
            verdict = "bitwise equal"
        else:
            verdict = f"{'close' if num['close'] else 'DIFFERENT'} (max |diff| {num['max_abs_diff']:.1g})"
        ok = num["close"] and (num["bitwise"] or not num["exact_expected"])
        rows.append([label, name_of(name), verdict, "pass" if ok else "FAIL"])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny GPT, aot_eager, fewer steps (the test of this script)")
    ap.add_argument("--out", help="directory for the jobs' logs and results (default: a temporary one)")
    ap.add_argument("--worker", choices=("single", "pair", "mixed"), help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--pg-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker(args)

    import torch

    from bench import demo, stats

    t0 = time.perf_counter()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="goddp_gpu_check_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"goddp GPU check, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC: torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, device {name}" + ("" if cuda else f"; {SKIP_MESSAGE}"), flush=True)
    print(f"logs and results in {out_dir}", flush=True)
    quick = args.quick
    limit = 240 if quick else 420

    single_backend = "nccl" if cuda else "gloo"
    print(f"[single] 1 rank, {single_backend}: every alternative, then bf16 autocast ...", flush=True)
    single = _launch("single", 1, single_backend, device, quick, out_dir, limit)
    print(f"[single] {'done' if single['ok'] else 'FAILED'} in {single['took_s']:.0f} s", flush=True)
    pair_note = ""
    if cuda:
        print("[pair] 2 ranks on one GPU over NCCL ...", flush=True)
        pair = _launch("pair", 2, "nccl", device, quick, out_dir, 150)
        if not pair["ok"]:
            pair_note = f"NCCL refused two ranks on one device ({_refusal(pair['tail'])}); ran over gloo with CUDA tensors"
            print(f"[pair] {pair_note}", flush=True)
            pair = _launch("pair", 2, "gloo", device, quick, out_dir, 240)
    else:
        print("[pair] 2 ranks over gloo ...", flush=True)
        pair = _launch("pair", 2, "gloo", device, quick, out_dir, limit)
    print(f"[pair] {'done' if pair['ok'] else 'FAILED'} in {pair['took_s']:.0f} s", flush=True)
    mixed = None
    if cuda:
        mixed_backend = pair.get("backend") or ("gloo" if pair_note else "nccl")
        print(f"[mixed] 2 ranks over {mixed_backend}: DDP mixed_precision ...", flush=True)
        mixed = _launch("mixed", 2, mixed_backend, device, quick, out_dir, 240)
        print(f"[mixed] {'done' if mixed['ok'] else 'FAILED'} in {mixed['took_s']:.0f} s", flush=True)
    else:
        print(f"[mixed] {MIXED_SKIPPED}", flush=True)

    rows: list[list[str]] = []
    failed = []
    where = "CUDA" if cuda else "CPU"
    for label, job, jobname in ((f"1 rank, {single_backend}, {where}, fp32", single, "fp32"),
                                (f"1 rank, {single_backend}, {where}, bf16 autocast", single, "bf16"),
                                (f"2 ranks, {pair.get('backend', '?')}, {where}", pair, "pair")):
        if not job["ok"]:
            rows.append([label, "-", f"job failed (rc {job['rc']}): {_refusal(job['tail'])}", "FAIL"])
            failed.append(label)
            continue
        part = job["jobs"][jobname]
        new = _check_rows(label, part, lambda n: demo.LABELS[n])
        rows += new
        failed += [f"{label}: {r[1]}" for r in new if r[3] == "FAIL"]
        failed += [f"{label}: {f}" for f in part["failures"] if "parameters" not in f]
        peaks = part.get("step_peak_mib") or {}
        if peaks:
            base = peaks.get("compiled")
            rows.append([label, "step peak memory", ", ".join(
                f"{demo.LABELS[n]} {m:.0f} MiB" + (f" ({m / base:.2f}x unsplit)" if base and n != "compiled" else "")
                for n, m in peaks.items()), "recorded"])
        tr = part["trace"].get("goddp", {})
        if "launched" in tr:
            rows.append([label, "goddp.trace of goddp",
                         f"{tr['launched']}/{tr['buckets']} launched in backward, exposed "
                         f"{tr['exposed_median_s'] * 1e3:.1f} ms ({tr['exposed_share_median']:.0%})", "recorded"])
    if mixed is None:
        rows.append([MIXED_LABEL, "-", MIXED_SKIPPED, "skipped"])
    elif not mixed["ok"]:
        rows.append([MIXED_LABEL, "-", f"job failed (rc {mixed['rc']}): {_refusal(mixed['tail'])}", "FAIL"])
        failed.append(MIXED_LABEL)
    else:
        part = mixed["jobs"]["mixed"]
        label = f"{MIXED_LABEL}, {mixed.get('backend', '?')}"
        new = _check_rows(label, part, lambda n: demo.LABELS[n])
        rows += new
        failed += [f"{label}: {r[1]}" for r in new if r[3] == "FAIL"] + [f"{label}: {f}" for f in part["failures"]]
        buckets = part.get("ddp_buckets") or {}
        said = "aligned" if buckets.get("aligned") else f"DDP's own: {buckets.get('reason')}"
        rows.append([label, "DDP's buckets", f"{part.get('pieces')} pieces; {said}", "recorded"])
    print()
    print(stats.table(["run", "variant", "parameters against eager DDP / trace", "check"], rows,
                      title=f"== goddp GPU check: {name}" + ("" if cuda else " (GPU skipped: CPU run)") + " =="))
    if pair_note:
        print(f"2 ranks: {pair_note}")
    if single["ok"]:
        print()
        print(single["jobs"]["fp32"]["report"])
        plan = single["jobs"]["fp32"]["goddp_log"]
        if plan:
            print("\ngoddp's plan (fp32 run):\n" + plan[0])
    print(f"\ngpu check finished in {time.perf_counter() - t0:.0f} s"
          + (f": {len(failed)} check(s) FAILED: " + "; ".join(failed) if failed else ": every check passed")
          + ("" if cuda else f" ({SKIP_MESSAGE})"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
