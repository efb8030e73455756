"""goddp.trace's text and picture: the summary table and launch timelines."""

from __future__ import annotations

import os
from typing import Any, Sequence

from goddp.tracing.recorder import DURING_BACKWARD_MARGIN, TraceError, median_step, step_stats, verdict


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**17 else f"{n / 2**10:.1f} KiB"


def format_summary(record: dict[str, Any]) -> str:
    steps = record["steps"]
    lines = [
        f"goddp.trace: {record['module']}, rank {record['rank']} of DDP ranks {record['ranks'] or [record['rank']]}, "
        f"{len(steps)} step(s), comm hook: {record['comm_hook']}"
    ]
    plans = record.get("goddp_plans") or []
    if plans:
        for plan in plans:
            lines.append(
                f"goddp plan {plan['fingerprint']}: {plan['num_pieces']} piece(s), {len(plan['bucket_bytes'])} "
                f"bucket(s), mode {plan['mode']}" + (f", fallback: {plan['fallback']}" if plan.get("fallback") else "")
            )
    else:
        lines.append("goddp plan: none (not compiled by goddp)")
    bucket_graphs = _forward_lines(plans, lines)
    step = median_step(steps)
    if step is None:
        lines.append("verdict: " + verdict(steps))
        return "\n".join(lines)
    end = step["compute_end_s"]
    lines.append(f"median step ({steps.index(step)}), times in ms from backward start; backward compute ends at {end * 1e3:.1f}")
    if bucket_graphs is not None and len(bucket_graphs) != len(step["buckets"]):
        bucket_graphs = None  # DDP's buckets are not the forward's layout
    graph_column = f" {'graph':>5}" if bucket_graphs is not None else ""
    lines.append(
        f"  {'bucket':>6} {'bytes':>11} {'params':>6}{graph_column} {'launch':>8} {'duration':>8} {'done':>8}  during backward"
    )
    margin = DURING_BACKWARD_MARGIN * end
    for k, b in enumerate(step["buckets"]):
        graph = f" {bucket_graphs[k]:>5}" if bucket_graphs is not None else ""
        lines.append(
            f"  {b['index']:>6} {_mib(b['bytes']):>11} {b['params']:>6}{graph} {b['launch_s'] * 1e3:>8.1f} "
            f"{(b['done_s'] - b['launch_s']) * 1e3:>8.1f} {b['done_s'] * 1e3:>8.1f}  "
            f"{'yes' if b['launch_s'] <= end - margin else 'no'}"
        )
    lines.append("per step (ms):")
    lines.append(f"  {'step':>4} {'backward':>9} {'last done':>9} {'exposed':>8} {'overlapped':>10} {'buckets':>8}")
    for i, s in enumerate(steps):
        st = step_stats(s)
        lines.append(
            f"  {i:>4} {st['backward_s'] * 1e3:>9.1f} {st['last_done_s'] * 1e3:>9.1f} {st['exposed_s'] * 1e3:>8.1f} "
            f"{st['overlapped']:>10.0%} {st['launched_during_backward']:>3}/{st['buckets']:<4}"
        )
    if record.get("dropped_steps"):
        lines.append(f"  ({record['dropped_steps']} older step(s) dropped)")
    lines.append("verdict: " + verdict(steps))
    return "\n".join(lines)


def _forward_lines(plans: Sequence[dict[str, Any]], lines: list[str]) -> list[int] | None:
    """The line naming the graphs of a forward planned together
    (goddp.ranks.forward), if any; returns, per DDP bucket, the graph whose
    cut closes it (None unless DDP's buckets follow that layout)."""
    forward = next((p["forward"] for p in plans if p.get("forward")), None)
    if forward is None:
        return None
    graphs = forward.get("graphs") or []
    if not forward.get("aligned"):
        lines.append(f"goddp forward: {len(graphs)} graph(s) planned together, DDP keeps its buckets: {forward.get('reason')}")
        return None
    lines.append(
        f"goddp forward: {len(graphs)} graph(s) planned together, DDP's buckets close at the cuts of each "
        "(column graph: the graph, in forward order, whose piece closes the bucket): "
        + "; ".join(f"graph {g}: {text}" for g, text in enumerate(graphs))
    )
    return list(forward.get("bucket_graphs") or [])


def _pyplot():
    try:
        import matplotlib  # lazy: an optional dependency (goddp[plot]), needed by plot() alone

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy, as above
    except ImportError as exc:  # pragma: no cover - matplotlib is a dev requirement
        raise TraceError("goddp.trace: plot() needs matplotlib (pip install 'goddp[plot]')") from exc
    return plt


def plot_steps(
    path: str | os.PathLike,
    rows: Sequence[tuple[str, dict[str, Any] | None]],
    title: str = "",
    colors: str | Sequence[str] = "#2e9e5b",
) -> str:
    """Writes a PNG with one launch-timeline row per (label, step dict);
    rows without a step are left out. Returns the path."""
    plt = _pyplot()
    if not isinstance(colors, str):
        colors = [c for c, (_, s) in zip(colors, rows) if s is not None]
    rows = [(label, s) for label, s in rows if s is not None]
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * max(2, len(rows)) + 1.4))
    draw_launch_rows(ax, rows, colors)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def draw_launch_rows(ax: Any, rows: Sequence[tuple[str, dict[str, Any]]], color: str | Sequence[str] = "#2e9e5b") -> None:
    """Draws launch timelines on a matplotlib axis, one row per (label, step
    dict): grey from backward start to its compute end, one coloured bar per
    bucket from launch to completion (labelled with its size when there are
    few), a black tick where ``loss.backward()`` returned. Shared by
    ``Trace.plot`` and the benchmark's launch_timelines.png."""
    colors = [color] * len(rows) if isinstance(color, str) else list(color)
    for y, ((label, step), c) in enumerate(zip(rows, colors)):
        ax.barh(y, step["compute_end_s"], height=0.7, color="#d0d0d0")
        buckets = step["buckets"]
        k = max(1, len(buckets))
        for i, b in enumerate(sorted(buckets, key=lambda b: b["launch_s"])):
            off = -0.3 + 0.6 * (i + 0.5) / k
            ax.barh(y + off, max(b["done_s"] - b["launch_s"], 1e-6), left=b["launch_s"], height=0.55 / k, color=c)
            if k <= 8:
                ax.text(b["done_s"], y + off, f" {b['bytes'] / 2**20:.1f}M", va="center", fontsize=5)
        if step.get("finalized_s") is not None:
            ax.plot([step["finalized_s"]] * 2, [y - 0.4, y + 0.4], color="k", lw=1)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(
        "seconds since backward started; grey: backward compute, bars: one bucket's allreduce each,\n"
        "launch to completion; black tick: backward returned",
        fontsize=6,
    )
    ax.grid(axis="x", alpha=0.3)
