"""goddp benchmarks: step time over a shaped two-host link, and compile overhead.

    .venv/bin/python -m bench.run --quick        # < 10 min on 2 quiet cores
    .venv/bin/python -m bench.run --full         # about 3 h; see --list
    .venv/bin/python -m bench.run --full --only step --models mlp --inners aot_eager
    .venv/bin/python -m bench.run --full --only step --jobs mlp-b256-aot-cap25
    .venv/bin/python -m bench.run --tiny --no-link   # harness smoke test, ~2 min
    .venv/bin/python -m bench.run --quick --only step --jobs mlp-b256-aot --variants goddp_ddp goddp_ddp_traced
                                                     # goddp.trace's overhead (traced / untraced, paired)

Needs root (network namespaces, tc). Everything it creates (namespaces,
veth pair, worker processes) is removed on exit, Ctrl-C or SIGTERM.

Writes bench/results/<time>-<mode>/: summary.json, report.txt,
step_times.png, ratios_vs_torch.png, regimes.png, launch_timelines.png,
compile_phases.png and
raw/ (per-rank JSON and logs of every job).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

from bench import analysis, compile_overhead, link as linkmod, plots, stats, step_bench, variants

RESULTS = Path(__file__).resolve().parent / "results"

# How much each mode measures. Steps per variant after warm-up = rounds * steps_per_round.
MODES = {
    "tiny": dict(size="tiny", rounds=2, steps_per_round=2, warmup=3, profile_steps=2, trace_steps=2,
                 link_sizes_mib=[1, 4], link_reps=2, interference_compute_s=0.1,
                 compile_nodes=[400], compile_e2e=[], compile_repeat=1),
    "quick": dict(size="quick", rounds=4, steps_per_round=2, warmup=3, profile_steps=3, trace_steps=3,
                  link_sizes_mib=[1, 8, 32], link_reps=2, interference_compute_s=0.3,
                  compile_nodes=[1000, 4000], compile_e2e=[], compile_repeat=1),
    "full": dict(size="full", rounds=8, steps_per_round=3, warmup=3, profile_steps=5, trace_steps=3,
                 link_sizes_mib=[1, 4, 16, 64], link_reps=3, interference_compute_s=0.5,
                 compile_nodes=[1000, 4000, 16000], compile_e2e=["gpt:quick"], compile_repeat=2),
}

# The variants of the regime and alignment sweeps: enough to see whether
# and how much splitting helps, without paying for every variant.
SWEEP_VARIANTS = ["compute_only", "compiled", "torch_ddpopt", "goddp_torch", "goddp_ddp"]


def plan_jobs(mode: str, rate: str, models: list[str], inners: list[str]) -> list[dict]:
    """The step-benchmark jobs of a mode (before --models/--inners filtering)."""
    m = MODES[mode]
    common = {k: m[k] for k in ("rounds", "steps_per_round", "warmup", "profile_steps", "trace_steps",
                                "link_sizes_mib", "link_reps", "interference_compute_s")}

    def job(name, model, inner, overrides=None, job_rate=rate, var=None, cap=None, size=None, opt_in=False,
            **more):
        default = [v for v in variants.ALL if (model == "gpt" or v not in variants.NEEDS_BLOCKS)
                   and v not in variants.OPT_IN]
        return dict(name=name, model=model, size=size or m["size"], overrides=overrides or {},
                    inner=inner, rate=job_rate, variants=var or default,
                    bucket_cap_mb=cap, timeout_s=7200, opt_in=opt_in, **{**common, **more})

    jobs = []
    if mode == "tiny":
        jobs.append(job("tiny-mlp", "mlp", "aot_eager"))
        jobs.append(job("tiny-gpt", "gpt", "inductor"))
        jobs.append(job("tiny-conv", "conv", "aot_eager"))
    elif mode == "quick":
        # A job near balance (backward ~ allreduce), where splitting matters
        # most, and a small transformer with a tied embedding. aot_eager
        # only: one inductor compile costs about a minute per variant here.
        jobs.append(job("mlp-b256-aot", "mlp", "aot_eager", {"batch": 256}))
        jobs.append(job("gpt-quick-aot", "gpt", "aot_eager"))
        # Named with --jobs only (about 10 minutes): the step time of the
        # compile-time trade-offs of repeated blocks (README, "Repeated
        # blocks"), with Inductor at the depth the compile table uses.
        jobs.append(job("gpt-8l-ind", "gpt", "inductor", {"n_layer": 8}, opt_in=True))
        # Activation checkpointing per block (README, "Activation
        # checkpointing"): goddp against the unsplit compile and regional
        # compilation with the same checkpointing; opt-in like the above.
        ckpt_variants = ["compiled", "regional", "goddp_ddp", "eager_ddp"]
        jobs.append(job("gpt-quick-aot-ckpt", "gpt", "aot_eager", {"checkpoint": "block"}, var=ckpt_variants,
                        opt_in=True))
        jobs.append(job("gpt-8l-ind-ckpt", "gpt", "inductor", {"n_layer": 8, "checkpoint": "block"},
                        var=ckpt_variants, opt_in=True))
        # bucket_cap_mb="auto" against fixed caps and torch's DDPOptimizer
        # (issue 36; docs/benchmarks.md): the MLP (8x1024^2, batch
        # 2048, 32 MiB of gradients) on three links, the GPT at 250 Mbit/s.
        # The warm-up runs past auto's deciding call; the *_predicted
        # variants trace each step for the timeline model's prediction.
        # Opt-in, like the above.
        auto_warmup = variants.AUTO_DECIDES + 2
        predicted = ["goddp_auto_predicted", "goddp_cap25_predicted"]
        for r, extra in (("250mbit", predicted), ("100mbit", []), ("1gbit", predicted)):
            jobs.append(job(f"mlp1k-auto-{r}", "mlp", "aot_eager", {"width": 1024, "depth": 8, "batch": 2048},
                            job_rate=r, var=["compute_only", *variants.AUTO_VARIANTS, *extra], opt_in=True,
                            warmup=auto_warmup, rounds=5))
        jobs.append(job("gpt-auto-250mbit", "gpt", "aot_eager", job_rate="250mbit",
                        var=["compute_only", *variants.AUTO_VARIANTS], opt_in=True, warmup=auto_warmup, rounds=4))
        # Two dtype groups (docs/limits.md): the MLP above with layers 1 and
        # 4 in bf16, DDP's buckets aligned per group against DDP's own.
        jobs.append(job("mlp1k-bf16-250mbit", "mlp", "aot_eager",
                        {"width": 1024, "depth": 8, "batch": 2048, "half": [1, 4]}, job_rate="250mbit",
                        var=["compute_only", "eager_ddp", "torch_ddpopt", "goddp_ddp", "goddp_unaligned"],
                        opt_in=True, rounds=5))
        # The same under find_unused_parameters=True: DDP keeps its
        # declaration-order buckets, aligned per group (Note [Declaration
        # order per group]).
        jobs.append(job("mlp1k-bf16-fu-250mbit", "mlp", "aot_eager",
                        {"width": 1024, "depth": 8, "batch": 2048, "half": [1, 4]}, job_rate="250mbit",
                        var=["compute_only", "eager_ddp", "torch_ddpopt", "goddp_ddp", "goddp_unaligned"],
                        opt_in=True, rounds=5, find_unused_parameters=True))
    else:
        for model in ("mlp", "gpt", "conv"):
            for inner in ("aot_eager", "inductor"):
                short = "aot" if inner == "aot_eager" else "ind"
                jobs.append(job(f"{model}-{short}", model, inner))
        # Regimes: the work per step at 1 Gbit/s (batch 32 in mlp-aot is
        # communication-bound, 1024 about balanced), and the link rate at
        # batch 1024: 250 Mbit/s is communication-bound but leaves most of
        # the core idle during transfer; 4 Gbit/s is compute-bound.
        for batch in (256, 1024):
            jobs.append(job(f"mlp-b{batch}-aot", "mlp", "aot_eager", {"batch": batch}, var=SWEEP_VARIANTS))
        for r in ("250mbit", "4gbit"):
            jobs.append(job(f"mlp-b1024-aot-{r}", "mlp", "aot_eager", {"batch": 1024}, job_rate=r,
                            var=SWEEP_VARIANTS))
        # Alignment: an explicit bucket_cap_mb makes DDP's first bucket as
        # large as the others (torch's DDPOptimizer still assumes 1 MiB);
        # a small cap gives more, smaller buckets.
        for cap in (25, 4):
            jobs.append(job(f"mlp-b256-aot-cap{cap}", "mlp", "aot_eager", {"batch": 256}, cap=cap,
                            var=SWEEP_VARIANTS))
    return [j for j in jobs if j["model"] in models and j["inner"] in inners]


def _progress(t0: float, done: int, total: int, what: str) -> None:
    el = time.perf_counter() - t0
    print(f"\n### [{done + 1}/{total}] {what} (elapsed {el / 60:.1f} min)", flush=True)


def run_steps(jobs: list[dict], out: Path, use_link: bool, default_rate: str) -> list[dict]:
    summaries = []
    t0 = time.perf_counter()

    def go(names):
        for i, job in enumerate(jobs):
            _progress(t0, i, len(jobs), f"step job {job['name']} at {job['rate'] if names else 'loopback'}")
            if names and job["rate"] != default_rate:
                linkmod.set_rate(job["rate"])
            try:
                ranks = step_bench.run_job(job, out / "raw" / job["name"], names, port=29500 + 7 * i)
            except Exception as err:  # noqa: BLE001 - one failed job must not lose the others
                print(f"!!! job {job['name']} failed: {err}", flush=True)
                summaries.append({"name": job["name"], "job": job, "error": str(err)})
                continue
            finally:
                if names and job["rate"] != default_rate:
                    linkmod.set_rate(default_rate)
            s = analysis.summarize_job(ranks)
            if not names:
                s["job"]["rate"] = "loopback, unshaped"
            summaries.append(s)
            print(analysis.job_table(s), flush=True)
            _save(out, summaries, None)

    if use_link:
        with linkmod.shaped_link(default_rate) as names:
            print(f"link up: {names.namespaces[0]}({names.addresses[0]}, {names.devices[0]}) <-> "
                  f"{names.namespaces[1]}({names.addresses[1]}, {names.devices[1]}), tbf {default_rate}",
                  flush=True)
            go(names)
        print("link down", flush=True)
    else:
        go(None)
    return summaries


def _save(out: Path, summaries: list[dict], compile_res: dict | None) -> None:
    doc = {"steps": summaries, "compile": compile_res}
    (out / "summary.json").write_text(json.dumps(doc, indent=1, default=str))


def overview(summaries: list[dict]) -> str:
    """Cross-job tables: goddp vs torch, and where splitting helps."""
    ok = [s for s in summaries if "variants" in s]
    lines = []
    rows = []
    for s in ok:
        for n in ("goddp_torch", "goddp_ddp"):
            r = s["variants"].get(n)
            if r and r.get("vs_torch") and r["vs_torch"]["n"]:
                vt = r["vs_torch"]
                base = s["variants"][variants.BASELINE]
                rows.append([s["name"], r["label"] + (" (FELL BACK)" if r.get("fallbacks") else ""),
                             f"{vt['median']:.3f}",
                             f"{vt['min']:.3f}-{vt['max']:.3f}", f"{vt['wins']}/{vt['n']}",
                             f"{r['first_step_s'] / base['first_step_s']:.2f}",
                             ", ".join(w for w, bad in (("step SLOWER", vt["median"] > 1.0),
                                                        ("compile SLOWER", r["first_step_s"] > base["first_step_s"]))
                                       if bad)])
            elif s["failed"].get(n):
                rows.append([s["name"], variants.SPECS[n].label, "FAILED", "", "", "", ""])
    if rows:
        lines.append(stats.table(
            ["job", "variant", "step / torch DDPOptimizer", "range over rounds", "rounds faster",
             "first step / torch's", ""], rows,
            title="== goddp vs torch's DDPOptimizer (paired per round; < 1 is faster) =="))
    rows = []
    for s in ok:
        if "ideal" not in s or "compiled" not in s["variants"]:
            continue
        unsplit = s["variants"]["compiled"]["step"]["median"]
        b = s["variants"]["compute_only"]["bwd"]
        cells = [s["name"], s["job"]["rate"], s["regime"], f"{b / s['t_comm']:.2f}",
                 f"{s['cpu']['compute_slowdown_during_allreduce']:.2f}x",
                 stats.fmt_s(s["ideal"]), stats.fmt_s(s["cpu_bound"]), stats.fmt_s(unsplit)]
        for n in ("torch_ddpopt", "goddp_torch", "goddp_ddp"):
            r = s["variants"].get(n)
            cells.append("-" if not r else f"{unsplit / r['step']['median']:.2f}x "
                                            f"({r['step']['median'] / s['bound']:.2f} bound)")
        rows.append(cells)
    if rows:
        lines.append(stats.table(
            ["job", "link", "regime", "B/T_comm", "compute slowdown in comm", "ideal", "CPU bound", "unsplit",
             "torch DDPOpt", "goddp torch",
             "goddp ddp"], rows,
            title="== where splitting helps: speed-up over compiled unsplit (and step / max(ideal, CPU bound)) =="))
    failed = [s for s in summaries if "error" in s]
    for s in failed:
        lines.append(f"job {s['name']} FAILED: {s['error'].splitlines()[0]}")
    return "\n\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="mode", action="store_const", const="quick")
    g.add_argument("--full", dest="mode", action="store_const", const="full")
    g.add_argument("--tiny", dest="mode", action="store_const", const="tiny", help="harness smoke test")
    ap.add_argument("--rate", default="1gbit", help="tbf rate of the link (default 1gbit)")
    ap.add_argument("--only", choices=("step", "compile"), help="run one of the two benchmarks")
    ap.add_argument("--models", nargs="*", default=["mlp", "gpt", "conv"])
    ap.add_argument("--inners", nargs="*", default=["aot_eager", "inductor"])
    ap.add_argument("--jobs", nargs="*", help="run only these step jobs (names from --list)")
    ap.add_argument("--rounds", type=int, help="override the mode's rounds")
    ap.add_argument("--warmup", type=int, help="override the jobs' warm-up steps per variant")
    ap.add_argument("--variants", nargs="*", choices=variants.ALL,
                    help="run only these variants (opt-in ones, such as goddp_auto, in any job)")
    ap.add_argument("--no-link", action="store_true", help="development: ranks over loopback, unshaped")
    ap.add_argument("--out", type=Path, help="output directory (default bench/results/<time>-<mode>)")
    ap.add_argument("--list", action="store_true", help="print the jobs and exit")
    ap.add_argument("--reanalyze", type=Path, metavar="DIR",
                    help="redo tables, report and plots of an earlier run from its raw/ files")
    args = ap.parse_args(argv)
    mode = args.mode or "quick"
    if args.reanalyze:
        return reanalyze(args.reanalyze)

    jobs = [] if args.only == "compile" else plan_jobs(mode, args.rate, args.models, args.inners)
    if args.jobs:
        unknown = set(args.jobs) - {j["name"] for j in jobs}
        if unknown:
            print(f"unknown job(s) {sorted(unknown)}; see --list", file=sys.stderr)
            return 2
        jobs = [j for j in jobs if j["name"] in args.jobs]
    else:
        jobs = [j for j in jobs if not j["opt_in"]]
    if args.rounds:
        for j in jobs:
            j["rounds"] = args.rounds
    if args.warmup:
        for j in jobs:
            j["warmup"] = args.warmup
    if args.variants:
        for j in jobs:
            # Opt-in variants (variants.OPT_IN) run where named, in any job.
            j["variants"] = ([v for v in j["variants"] if v in args.variants]
                             + [v for v in args.variants if v in variants.OPT_IN and v not in j["variants"]])
    if args.list:
        for j in jobs:
            print(f"{j['name']:24s} {j['model']}/{j['size']} {j['overrides']} inner={j['inner']} "
                  f"rate={j['rate']} cap={j['bucket_cap_mb']} variants={','.join(j['variants'])} "
                  f"steps={j['rounds']}x{j['steps_per_round']}")
        return 0
    if jobs and not args.no_link and os.geteuid() != 0:
        print("the shaped link needs root (ip netns, tc); use --no-link for a loopback run", file=sys.stderr)
        return 2

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"{stamp}-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"goddp bench, mode {mode}: {len(jobs)} step jobs; results in {out}", flush=True)
    t0 = time.perf_counter()

    summaries = run_steps(jobs, out, not args.no_link, args.rate) if jobs else []
    compile_res = None
    if args.only != "step":
        print(f"\n### compile overhead (elapsed {(time.perf_counter() - t0) / 60:.1f} min)", flush=True)
        m = MODES[mode]
        compile_res = compile_overhead.run(m["compile_nodes"], list(compile_overhead.TOOLS), m["compile_e2e"],
                                           repeat=m["compile_repeat"])
    _save(out, summaries, compile_res)
    finish(out, summaries, compile_res)
    print(f"\ndone in {(time.perf_counter() - t0) / 60:.1f} min; results, plots and report in {out}", flush=True)
    return 0


def reanalyze(out: Path) -> int:
    """Rebuild summary.json, report.txt and the plots from raw/ (no measuring)."""
    previous = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    rates = {s["name"]: s["job"].get("rate") for s in previous.get("steps", [])}
    order = {name: i for i, name in enumerate(rates)}  # the run's own job order
    summaries = []
    job_dirs = [p for p in (out / "raw").iterdir() if (p / "rank1.json").exists()]
    for job_dir in sorted(job_dirs, key=lambda p: (order.get(p.name, len(order)), p.name)):
        ranks = [json.loads((job_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
        s = analysis.summarize_job(ranks)
        s["job"]["rate"] = rates.get(s["name"]) or s["job"].get("rate") or "unshaped"
        summaries.append(s)
    compile_res = previous.get("compile")
    _save(out, summaries, compile_res)
    finish(out, summaries, compile_res)
    return 0


def finish(out: Path, summaries: list[dict], compile_res: dict | None) -> None:
    """Write report.txt and the plots, and print the report."""
    texts = [analysis.job_table(s) for s in summaries if "variants" in s]
    texts.append(overview(summaries))
    if compile_res:
        texts.append(compile_overhead.report(compile_res))
    report = "\n\n".join(t for t in texts if t)
    (out / "report.txt").write_text(report + "\n")
    ok = [s for s in summaries if "variants" in s]
    if ok:
        plots.step_times(ok, out / "step_times.png")
        plots.ratios_vs_torch(ok, out / "ratios_vs_torch.png")
        plots.regimes(ok, out / "regimes.png")
        plots.launch_timelines(ok, out / "launch_timelines.png")
    if compile_res:
        plots.compile_phases([r for r in compile_res["synthetic"] if "error" not in r],
                             out / "compile_phases.png")
    print("\n" + "=" * 100 + "\n" + report, flush=True)


if __name__ == "__main__":
    sys.exit(main())
