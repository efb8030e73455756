"""goddp.trace's picture: launch timelines (goddp.tracing.figures writes
the summary text)."""

from __future__ import annotations

import os
from typing import Any, Sequence

from goddp.tracing.recorder import TraceError

MEASURED_COLOR = "#2e9e5b"
PREDICTED_COLOR = "#7b5ea7"  # the timeline model's rows (Trace.plot)


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
    colors: str | Sequence[str] = MEASURED_COLOR,
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


def draw_launch_rows(ax: Any, rows: Sequence[tuple[str, dict[str, Any]]], color: str | Sequence[str] = MEASURED_COLOR) -> None:
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
