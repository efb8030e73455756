"""goddp.trace's figures, from the recorded times: the steps normalized,
each step's exposed communication and overlapped share, the median step,
the verdict and the summary text (Note [Trace figures]). Pure arithmetic
and formatting on step dicts (``StepRecord.to_dict``); the bench uses it
too."""

from __future__ import annotations

from typing import Any, Sequence

from goddp.tracing.prediction import predict

# Note [Trace figures]: a step's backward compute ends when autograd ran
# its last node (compute_end_s). Exposed communication is the time from
# that end to the last allreduce's completion, 0 when they all completed
# before. The overlapped share is the part of the time during which some
# allreduce was in flight (the union of the launch-to-done intervals) that
# lies before the compute end; 1 when nothing was in flight. A bucket
# counts as launched during backward when backward still had at least
# DURING_BACKWARD_MARGIN of its duration left: the last bucket is always
# launched just before the end (an unsplit compiled graph launches none
# before its single backward node has finished). The head start weighs
# how long before the compute end each byte's allreduce started, with no
# threshold: about 0 for an unsplit graph. The median step is the one
# with the median backward time (the upper of two).

# The share of backward that must be left for a launch to count as during
# backward (Note [Trace figures]).
DURING_BACKWARD_MARGIN = 0.05


def normalize_step(step: dict[str, Any]) -> dict[str, Any]:
    """A recorded step (seconds from backward start; its compute end or a
    bucket's completion possibly None) as a step dict: the compute end is
    the last launch when none was seen, and never before it; a bucket whose
    future never completed is done at the recorded compute end; buckets in
    launch order (ties by index). Normalizing twice changes nothing."""
    buckets = step.get("buckets") or []
    last_launch = max((float(b.get("launch_s", 0.0)) for b in buckets), default=0.0)
    recorded_end = step.get("compute_end_s")
    end = last_launch if recorded_end is None else float(recorded_end)
    finalized = step.get("finalized_s")
    out = [_normalize_bucket(b, end) for b in buckets]
    out.sort(key=lambda b: (b["launch_s"], b["index"]))
    return {
        "start_seen": bool(step.get("start_seen", False)),
        "compute_end_s": max(end, last_launch),
        "finalized_s": None if finalized is None else float(finalized),
        "buckets": out,
    }


def _normalize_bucket(bucket: dict[str, Any], end: float) -> dict[str, Any]:
    done = bucket.get("done_s")
    return {
        "index": bucket.get("index", 0),
        "bytes": bucket.get("bytes", 0),
        "params": bucket.get("params", 0),
        "param_names": list(bucket.get("param_names") or []),
        "launch_s": float(bucket.get("launch_s", 0.0)),
        "done_s": end if done is None else float(done),
    }


def normalized(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """normalize_step of each step."""
    return [normalize_step(s) for s in steps]


def launched_during_backward(bucket: dict[str, Any], end: float) -> bool:
    """Whether the bucket launched with at least the margin of backward
    left (Note [Trace figures])."""
    return bucket["launch_s"] <= end - DURING_BACKWARD_MARGIN * end


def busy_time(spans: Sequence[tuple[float, float]], end: float) -> tuple[float, float]:
    """The length of the union of the (launch, done) spans, and the part of
    it that lies before end."""
    merged: list[list[float]] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    total = before = 0.0
    for start, stop in merged:
        total += stop - start
        before += max(0.0, min(stop, end) - start)
    return total, before


def _stats(step: dict[str, Any]) -> dict[str, Any]:
    """The figures of a normalized step."""
    end = step["compute_end_s"]
    buckets = step["buckets"]
    last_done = max((b["done_s"] for b in buckets), default=end)
    busy, before = busy_time([(b["launch_s"], b["done_s"]) for b in buckets], end)
    total_bytes = sum(b["bytes"] for b in buckets)
    weighted = 0.0
    for b in buckets:
        weighted += b["bytes"] * (end - b["launch_s"])
    return {
        "backward_s": end,
        "last_done_s": last_done,
        "exposed_s": max(0.0, last_done - end),
        "comm_busy_s": busy,
        "overlapped": before / busy if busy > 0 else 1.0,
        "buckets": len(buckets),
        "launched_during_backward": sum(1 for b in buckets if launched_during_backward(b, end)),
        "head_start_s": weighted / total_bytes if total_bytes != 0 else 0.0,
    }


def step_stats(step: dict[str, Any]) -> dict[str, Any]:
    """Figures of one step dict: backward_s, last_done_s, exposed_s,
    comm_busy_s, overlapped, buckets, launched_during_backward,
    head_start_s."""
    return _stats(normalize_step(step))


def _median_index(steps: Sequence[dict[str, Any]]) -> int:
    """The index of the normalized step with the median backward time (the
    upper one of two, equal ones in order), -1 without steps."""
    if not steps:
        return -1
    order = sorted(range(len(steps)), key=lambda i: steps[i]["compute_end_s"])
    return order[len(order) // 2]


def median_step(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The step with the median backward time (the upper one of two)."""
    index = _median_index(normalized(steps))
    return None if index < 0 else steps[index]


def _percent(share: float) -> str:
    """A share as a whole percentage."""
    return f"{share * 100:.0f}%"


def _verdict(stats: Sequence[dict[str, Any]], median: int) -> str:
    if median < 0:
        return "no step with a DDP allreduce was recorded"
    exposed = sorted(1 - st["overlapped"] for st in stats)
    n = len(exposed)
    middle = exposed[n // 2] if n % 2 else (exposed[n // 2 - 1] + exposed[n // 2]) / 2
    st = stats[median]
    return (
        f"{st['launched_during_backward']} of {st['buckets']} buckets launched before backward ended; "
        f"{_percent(middle)} of communication exposed"
    )


def verdict(steps: Sequence[dict[str, Any]]) -> str:
    """One line: buckets launched during backward (median step) and the
    median share of communication left exposed."""
    steps = normalized(steps)
    return _verdict([_stats(s) for s in steps], _median_index(steps))


def report(record: dict[str, Any]) -> dict[str, Any]:
    """Everything derived from a record (Trace.to_dict, or as much of it as
    a figure needs): steps (normalized), step_stats, median_step (its
    index, -1: none), verdict, prediction (goddp.tracing.prediction),
    summary."""
    steps = normalized(record.get("steps") or [])
    stats = [_stats(s) for s in steps]
    median = _median_index(steps)
    figures = {"steps": steps, "step_stats": stats, "median_step": median, "verdict": _verdict(stats, median)}
    figures["prediction"] = predict(steps, median, stats)
    figures["summary"] = _Summary(record, figures).render()
    return figures


def format_summary(record: dict[str, Any]) -> str:
    """The readable summary of one rank's record (Trace.summary)."""
    return report(record)["summary"]


def _ms(seconds: float | None, width: int, digits: int) -> str:
    """Seconds as milliseconds, or "-" for a time not measured."""
    return f"{'-':>{width}}" if seconds is None else f"{seconds * 1e3:>{width}.{digits}f}"


def _size(n: int) -> str:
    """A bucket's size in MiB, or KiB below 128 KiB."""
    return f"{n / 2**20:.2f} MiB" if n >= 2**17 else f"{n / 2**10:.1f} KiB"


class _Summary:
    """The summary text of one record: the header and plans, the forward
    planned across graphs, the median step's buckets, the steps' figures,
    the verdict."""

    def __init__(self, record: dict[str, Any], figures: dict[str, Any]) -> None:
        self.record = record
        self.figures = figures
        self.plans = record.get("goddp_plans") or []
        self.lines: list[str] = []

    def render(self) -> str:
        self.header()
        graphs = self.forward()
        median = self.figures["median_step"]
        if median >= 0:
            self.median_table(median, graphs)
            self.step_table()
            self.prediction()
        self.lines.append(f"verdict: {self.figures['verdict']}")
        return "\n".join(self.lines)

    def header(self) -> None:
        rec = self.record
        rank = rec.get("rank", 0)
        ranks = ", ".join(str(r) for r in rec.get("ranks") or [rank])
        self.lines.append(
            f"goddp.trace: {rec.get('module', '')}, rank {rank} of DDP ranks [{ranks}], "
            f"{len(rec.get('steps') or [])} step(s), comm hook: {rec.get('comm_hook', '')}"
        )
        if not self.plans:
            self.lines.append("goddp plan: none (not compiled by goddp)")
        for plan in self.plans:
            line = (
                f"goddp plan {plan.get('fingerprint')}: {plan.get('num_pieces')} piece(s), "
                f"{len(plan.get('bucket_bytes') or [])} bucket(s), mode {plan.get('mode')}"
            )
            if plan.get("fallback"):
                line += f", fallback: {plan['fallback']}"
            self.lines.append(line)

    def forward(self) -> list[int] | None:
        """Adds the line naming the graphs of a forward planned together
        (goddp.ranks.forward), if any; returns, per DDP bucket, the graph
        whose cut closes it (None unless DDP's buckets follow that layout)."""
        forward = next((p["forward"] for p in self.plans if p.get("forward") is not None), None)
        if forward is None:
            return None
        graphs = forward.get("graphs") or []
        if not forward.get("aligned"):
            self.lines.append(
                f"goddp forward: {len(graphs)} graph(s) planned together, DDP keeps its buckets: {forward.get('reason')}"
            )
            return None
        self.lines.append(
            f"goddp forward: {len(graphs)} graph(s) planned together, DDP's buckets close at the cuts of each "
            "(column graph: the graph, in forward order, whose piece closes the bucket): "
            + "; ".join(f"graph {g}: {text}" for g, text in enumerate(graphs))
        )
        return list(forward.get("bucket_graphs") or [])

    def median_table(self, median: int, graphs: list[int] | None) -> None:
        """The median step's buckets."""
        steps = self.figures["steps"]
        step = steps[median]
        end = step["compute_end_s"]
        # The record names the median step by its first occurrence.
        first = next(i for i, s in enumerate(steps) if s == step)
        self.lines.append(f"median step ({first}), times in ms from backward start; backward compute ends at {end * 1e3:.1f}")
        if graphs is not None and len(graphs) != len(step["buckets"]):
            graphs = None  # DDP's buckets are not the forward's layout
        column = f" {'graph':>5}" if graphs is not None else ""
        self.lines.append(
            f"  {'bucket':>6} {'bytes':>11} {'params':>6}{column} {'launch':>8} {'duration':>8} {'done':>8}  during backward"
        )
        for k, b in enumerate(step["buckets"]):
            graph = f" {graphs[k]:>5}" if graphs is not None else ""
            during = "yes" if launched_during_backward(b, end) else "no"
            self.lines.append(
                f"  {b['index']:>6} {_size(b['bytes']):>11} {b['params']:>6}{graph} {b['launch_s'] * 1e3:>8.1f} "
                f"{(b['done_s'] - b['launch_s']) * 1e3:>8.1f} {b['done_s'] * 1e3:>8.1f}  {during}"
            )

    def step_table(self) -> None:
        """The figures of every step."""
        self.lines.append("per step (ms):")
        self.lines.append(f"  {'step':>4} {'backward':>9} {'last done':>9} {'exposed':>8} {'overlapped':>10} {'buckets':>8}")
        for i, st in enumerate(self.figures["step_stats"]):
            self.lines.append(
                f"  {i:>4} {st['backward_s'] * 1e3:>9.1f} {st['last_done_s'] * 1e3:>9.1f} {st['exposed_s'] * 1e3:>8.1f} "
                f"{_percent(st['overlapped']):>10} {st['launched_during_backward']:>3}/{st['buckets']:<4}"
            )
        if self.record.get("dropped_steps"):
            self.lines.append(f"  ({self.record['dropped_steps']} older step(s) dropped)")

    def prediction(self) -> None:
        """The planner's prediction beside the median step's measurement,
        and what other caps would give (Note [Trace prediction])."""
        pred = self.figures["prediction"]
        if "unavailable" in pred:
            self.lines.append(f"predicted: none ({pred['unavailable']})")
            return
        self.lines.append(
            f"predicted by the timeline model for step {pred['step']}'s measured inputs (ms from backward start; "
            "error: predicted - measured):"
        )
        self.lines.append(f"  {'bucket':>6} {'bytes':>11} {'launch':>8} {'pred':>8} {'error':>7} {'done':>8} {'pred':>8} {'error':>7}")
        for b in pred["buckets"]:
            self.lines.append(
                f"  {b['index']:>6} {_size(b['bytes']):>11} {b['launch_s'] * 1e3:>8.1f} {b['predicted_launch_s'] * 1e3:>8.1f} "
                f"{b['launch_error_s'] * 1e3:>7.2f} {_ms(b['done_s'], 8, 1)} {b['predicted_done_s'] * 1e3:>8.1f} "
                f"{_ms(b['done_error_s'], 7, 2)}"
            )
        self.lines.append(
            f"  exposed: measured {_ms(pred['measured_exposed_s'], 0, 1)}, predicted {pred['exposed_s'] * 1e3:.1f}, "
            f"error {_ms(pred['exposed_error_s'], 0, 2)}"
        )
        fit = pred["fit"]
        how = f"least squares over {fit['points']} bucket(s)" if not fit["note"] else f"{fit['method']} over {fit['points']} bucket(s): {fit['note']}"
        self.lines.append(
            "  inputs: each bucket's backward estimated as the time from the launch before it"
            f"{'' if pred['start_seen'] else ' (backward start not seen: the first is 1 ns)'}, so predicted launches match by construction;"
        )
        self.lines.append(
            f"  allreduce {fit['latency_ns'] / 1e6:.3f} ms + bytes at {fit['bytes_per_second'] / 1e6:.1f} MB/s ({how}); "
            "launch overhead 0 (inside the latency); compute slowdown 1.0 (not measured)"
        )
        for x in pred["left_out"]:
            self.lines.append(f"  left out of the fit: step {x['step']} bucket {x['index']}: {x['reason']}")
        self.lines.append("what would another cap give? predicted, the measured buckets merged (ms):")
        self.lines.append(f"  {'setting':<36} {'buckets':>7} {'exposed':>8} {'last done':>9}")
        for c in pred["caps"]:
            self.lines.append(
                f"  {c['setting']:<36} {len(c['bucket_bytes']):>7} {c['exposed_s'] * 1e3:>8.1f} {c['step_s'] * 1e3:>9.1f}"
            )
        if self.record.get("dtype_groups", 1) > 1:
            self.lines.append(
                f"  (the parameters span {self.record['dtype_groups']} (dtype, device) groups, which DDP buckets apart: "
                "merges across them are no layout DDP can hold)"
            )
