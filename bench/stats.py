"""Small statistics and table helpers shared by every bench script."""

from __future__ import annotations

import math
import os
import resource
import time
from contextlib import contextmanager
from typing import Iterable, Sequence

import numpy as np


def summarize(values: Iterable[float]) -> dict:
    """Median, p10/p90, min/max and count; empty input gives NaNs."""
    xs = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if xs.size == 0:
        nan = float("nan")
        return {"n": 0, "median": nan, "p10": nan, "p90": nan, "min": nan, "max": nan}
    return {
        "n": int(xs.size),
        "median": float(np.median(xs)),
        "p10": float(np.percentile(xs, 10)),
        "p90": float(np.percentile(xs, 90)),
        "min": float(xs.min()),
        "max": float(xs.max()),
    }


def median(values: Iterable[float]) -> float:
    return summarize(values)["median"]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> dict:
    """Least-squares y = a + b*x, with R^2. Used for allreduce time vs bytes."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return {"a": float(a), "b": float(b), "r2": r2}


def paired_ratios(numer: dict[int, float], denom: dict[int, float]) -> dict:
    """Ratios numer[r]/denom[r] over the rounds r both have, summarized.

    Pairing within a round cancels slow drifts of the shared machine, which
    are often larger than the differences between variants.
    """
    ratios = [numer[r] / denom[r] for r in sorted(numer) if r in denom and denom[r] > 0]
    out = summarize(ratios)
    out["wins"] = sum(1 for q in ratios if q < 1.0)
    out["values"] = ratios
    return out


@contextmanager
def cpu_clock():
    """Wall, process user/system and machine-wide busy CPU seconds of a block.

    Process times cover every thread, gloo's included. The machine-wide
    figures (from /proc/stat) also catch the kernel's network work, much of
    which runs in softirq context outside any process.
    """
    rec: dict = {}
    r0, s0, t0 = resource.getrusage(resource.RUSAGE_SELF), _proc_stat(), time.perf_counter()
    try:
        yield rec
    finally:
        t1, r1, s1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), _proc_stat()
        rec["wall"] = t1 - t0
        rec["user"] = r1.ru_utime - r0.ru_utime
        rec["sys"] = r1.ru_stime - r0.ru_stime
        if s0 and s1:
            rec.update({f"machine_{k}": s1[k] - s0[k] for k in s0})


_PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _proc_stat() -> dict | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:1 + len(_PROC_STAT_FIELDS)]
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return {k: int(v) / hz for k, v in zip(_PROC_STAT_FIELDS, fields)}


class RssSampler:
    """Peak growth of this process's resident set over a `with` block.

    Samples /proc/self/statm from a thread every `interval` seconds, so a
    large transient before the block (building a model) does not mask what
    the block itself adds, as ru_maxrss would.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.peak_delta_mib = 0.0

    def __enter__(self):
        import threading

        self._base = _current_rss_mib()
        self._peak = self._base
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(self.interval):
                self._peak = max(self._peak, _current_rss_mib())

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, _current_rss_mib())
        self.peak_delta_mib = self._peak - self._base
        return False


def _current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def max_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def fmt_s(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1000:.0f}ms" if abs(x) < 1 else f"{x:.2f}s"


def fmt_ratio(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.3f}"


def fmt_bytes(n: float) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024.0
    return str(n)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> str:
    """A plain, aligned text table (first column left, the rest right)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)
