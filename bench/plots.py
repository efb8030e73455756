"""Matplotlib figures for the bench results (PNG, no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench import variants  # noqa: E402

COLORS = {
    "compute_only": "#9e9e9e", "eager_ddp": "#6d8fb3", "compiled": "#3b5b92", "regional": "#8e5bb5",
    "torch_ddpopt": "#1f3a5f", "goddp_torch": "#e07b39", "goddp_ddp": "#2e9e5b",
    "goddp_ddp_traced": "#7fc99b", "goddp_bytes": "#b3a12e", "goddp_compile_edges": "#c0504d",
}


def _grid(n: int, width: float = 5.0, height: float = 3.6):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _job_title(s: dict) -> str:
    return (f"{s['name']}\n{s['workload']['description']}, {s['job']['inner']}, "
            f"{s['job'].get('rate', 'unshaped')}")


def step_times(summaries: list[dict], path: Path) -> None:
    """Per job: the distribution of step times of every variant."""
    fig, axes = _grid(len(summaries))
    for ax, s in zip(axes, summaries):
        names = list(s["variants"])
        data = [s["variants"][n]["samples"] for n in names]
        box = ax.boxplot(data, patch_artist=True, widths=0.6, showfliers=True)
        for patch, n in zip(box["boxes"], names):
            patch.set_facecolor(COLORS.get(n, "#cccccc"))
            patch.set_alpha(0.8)
        if "ideal" in s:
            ax.axhline(s["ideal"], color="#2e9e5b", ls="--", lw=1, label="ideal step")
            ax.axhline(s["compute_step"] + s["t_comm"], color="#b33", ls=":", lw=1,
                       label="compute + comm (no overlap)")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xticks(range(1, len(names) + 1), [s["variants"][n]["label"] for n in names],
                      rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("step time (s), slower rank")
        ax.set_ylim(bottom=0)
        # One stalled step (seen: 20 s among 4 s steps) would flatten the
        # boxes; clip the axis and say so.
        flat = sorted(x for d in data for x in d)
        if flat:
            p95 = flat[int(0.95 * (len(flat) - 1))]
            if flat[-1] > 1.5 * p95:
                ax.set_ylim(top=1.3 * p95)
                ax.text(0.01, 0.98, f"clipped: max {flat[-1]:.1f}s", transform=ax.transAxes,
                        fontsize=6, va="top", color="#b33")
        ax.set_title(_job_title(s), fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Step time per variant\n(box: quartiles; whiskers: 1.5 IQR)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def launch_timelines(summaries: list[dict], path: Path) -> None:
    """Per job and variant: backward compute and each bucket's allreduce, as
    recorded by goddp.trace and drawn by goddp.tracing.draw_launch_rows
    (grey: backward compute; coloured: each bucket from launch to
    completion; black tick: backward returned)."""
    from goddp.tracing import draw_launch_rows

    jobs = [s for s in summaries if any((r.get("launch") or {}).get("trace") for r in s["variants"].values())]
    if not jobs:
        return
    fig, axes = _grid(len(jobs), width=6.0, height=3.2)
    for ax, s in zip(axes, jobs):
        names = [n for n, r in s["variants"].items() if (r.get("launch") or {}).get("trace")]
        draw_launch_rows(ax, [(s["variants"][n]["label"], s["variants"][n]["launch"]["trace"]) for n in names],
                         [COLORS.get(n, "#444") for n in names])
        ax.set_title(_job_title(s), fontsize=8)
    fig.suptitle("When each bucket's allreduce runs\n(grey: backward compute; colour: one bar per bucket, "
                 "launch to completion)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ratios_vs_torch(summaries: list[dict], path: Path) -> None:
    """Paired per-round ratios to torch's DDPOptimizer: below 1 is faster."""
    rows = []
    for s in summaries:
        for n, r in s["variants"].items():
            if "vs_torch" in r and r["vs_torch"]["n"]:
                rows.append((s["name"], n, r["label"], r["vs_torch"]))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.5))
    for i, (job, n, label, vt) in enumerate(rows):
        ax.errorbar(vt["median"], i, xerr=[[vt["median"] - vt["min"]], [vt["max"] - vt["median"]]],
                    fmt="o", color=COLORS.get(n, "k"), capsize=3)
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(rows)), [f"{job}: {label}" for job, _, label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"step time / {variants.SPECS[variants.BASELINE].label} (same round); "
                  "dot median, bar min-max over rounds")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def regimes(summaries: list[dict], path: Path) -> None:
    """Gain from splitting vs how compute-bound the job is."""
    pts = [s for s in summaries if "ideal" in s and "compiled" in s["variants"]]
    if len(pts) < 2:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in ("torch_ddpopt", "goddp_torch", "goddp_ddp"):
        xs, ys, labels = [], [], []
        for s in pts:
            if n in s["variants"]:
                b = s["variants"]["compute_only"]["bwd"]
                xs.append(b / s["t_comm"])
                ys.append(s["variants"]["compiled"]["step"]["median"] / s["variants"][n]["step"]["median"])
                labels.append(s["name"])
        if xs:
            ax.scatter(xs, ys, color=COLORS[n], label=variants.SPECS[n].label)
            for x, y, lab in zip(xs, ys, labels):
                ax.annotate(lab, (x, y), fontsize=6, alpha=0.7)
    ax.axhline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("backward compute / allreduce time of all gradients (B / T_comm)")
    ax.set_ylabel("speed-up over compiled unsplit (median step)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


TOOL_COLORS = {"unsplit": "#9e9e9e", "torch": "#1f3a5f", "goddp_torch": "#e07b39", "goddp_ddp": "#2e9e5b"}


def compile_phases(results: list[dict], path: Path) -> None:
    """Per-phase cost of each splitter at each graph size, Dynamo's capture
    left out (it is the same for every tool and dwarfs the rest); the first
    call's total is written above each bar. Right: peak RSS growth."""
    if not results:
        return
    phases: list[str] = []
    for r in results:
        phases += [k for k in r.get("phases", {}) if k != "dynamo" and k not in phases]
    palette = plt.get_cmap("tab20").colors
    fig, (ax, ax_mem) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 1.4]})
    labels = [f"{r['tool']}\n{r['nodes']} nodes" for r in results]
    x = range(len(results))
    bottoms = [0.0] * len(results)
    for k, phase in enumerate(phases):
        vals = [r.get("phases", {}).get(phase, 0.0) for r in results]
        if any(vals):
            ax.bar(x, vals, bottom=bottoms, label=phase, color=palette[k % len(palette)])
            bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i, r in enumerate(results):
        ax.text(i, bottoms[i], f"{bottoms[i]:.2f}s\n(1st call {r['first_call_s']:.1f}s)",
                ha="center", va="bottom", fontsize=6)
    ax.set_xticks(list(x), labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("seconds (Dynamo capture excluded)")
    ax.set_title("Splitter cost by phase, trivial inner compiler", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(top=max(bottoms) * 1.18 or 1.0)
    mem = [r.get("peak_rss_delta_mib", float("nan")) for r in results]
    ax_mem.bar(list(x), mem, color=[TOOL_COLORS.get(r["tool"], "#444") for r in results])
    ax_mem.set_xticks(list(x), labels, fontsize=6, rotation=45, ha="right")
    ax_mem.set_ylabel("peak RSS growth during the first call (MiB)")
    ax_mem.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compile_vs_depth(results: list[dict], path: Path) -> None:
    """End-to-end compile time against model depth, one line per tool:
    median with the min-max range of the repeats as error bars."""
    tools: dict[str, list[dict]] = {}
    for r in results:
        if r.get("layers"):
            tools.setdefault(r["tool"], []).append(r)
    if not tools:
        return
    colors = {**COLORS, "unsplit": COLORS["compiled"], "torch": COLORS["torch_ddpopt"], "goddp_bytes": "#b3a12e"}
    labels = {"unsplit": "compiled, unsplit", "regional": "regional (blocks compiled), eager DDP",
              "torch": "torch DDPOptimizer", "goddp_ddp": "goddp (block cuts)", "goddp_bytes": "goddp (byte cuts)",
              "goddp_torch": "goddp torch mode", "goddp_compile_edges": "goddp (edges compiled)"}
    fig, ax = plt.subplots(figsize=(6, 4))
    for tool, recs in tools.items():
        recs = sorted(recs, key=lambda r: r["layers"])
        xs = [r["layers"] for r in recs]
        key = "compile_cpu_s" if all("compile_cpu_s" in r for r in recs) else "compile_s"
        runs = "compile_cpu_runs_s" if key == "compile_cpu_s" else "compile_runs_s"
        ys = [r[key] for r in recs]
        lo = [max(0.0, y - min(r.get(runs) or [y])) for y, r in zip(ys, recs)]
        hi = [max(0.0, max(r.get(runs) or [y]) - y) for y, r in zip(ys, recs)]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=labels.get(tool, tool),
                    color=colors.get(tool, "#444444"))
    ax.set_xlabel("layers")
    ax.set_ylabel("compile CPU time (s): first step minus a steady step")
    ax.set_xticks(sorted({r["layers"] for recs in tools.values() for r in recs}))
    ax.set_ylim(bottom=0)
    ax.set_title(f"{results[0].get('model')}: compile time against depth (1 rank)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
