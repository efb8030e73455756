"""goddp.trace's figures, made by the planner from the recorded times
(planner/trace.go, Note [Trace figures]; goddp_trace_report): the steps
normalized, each step's exposed communication and overlapped share, the
median step, the verdict and the summary text. Pure arithmetic on step
dicts (``StepRecord.to_dict``); the bench uses it too."""

from __future__ import annotations

from typing import Any, Sequence

from goddp.native import extension as _native


def report(record: dict[str, Any]) -> dict[str, Any]:
    """Everything derived from a record (Trace.to_dict, or as much of it as
    a figure needs): steps, step_stats, median_step (-1: none), verdict,
    summary."""
    return _native.trace_report(record)


def normalized(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recorded steps (seconds from backward start, a compute end or a
    completion possibly None) as step dicts: a compute end, every bucket
    done, buckets in launch order."""
    return report({"steps": list(steps)})["steps"]


def step_stats(step: dict[str, Any]) -> dict[str, Any]:
    """Figures of one step dict: backward_s, last_done_s, exposed_s,
    comm_busy_s, overlapped, buckets, launched_during_backward,
    head_start_s."""
    return report({"steps": [step]})["step_stats"][0]


def median_step(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The step with the median backward time (the upper one of two)."""
    index = report({"steps": list(steps)})["median_step"]
    return None if index < 0 else steps[index]


def verdict(steps: Sequence[dict[str, Any]]) -> str:
    """One line: buckets launched during backward (median step) and the
    median share of communication left exposed."""
    return report({"steps": list(steps)})["verdict"]


def format_summary(record: dict[str, Any]) -> str:
    """The readable summary of one rank's record (Trace.summary)."""
    return report(record)["summary"]
