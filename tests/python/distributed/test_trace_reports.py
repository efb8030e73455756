"""goddp.trace's figures (goddp.tracing.figures, Note [Trace figures]) and
plans (Note [A trace's plans] in goddp.tracing.session), without a process
group: normalization, each figure, the median step and the verdict
table-driven, a golden summary (testdata/trace_summary.golden,
GODDP_UPDATE_GOLDENS=1 rewrites it), busy time, overlapped share and
exposed communication against a naive sweep over random steps, and the
plans' selection against an ordered map over random records."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from _golden import check_golden, golden_path
from goddp.tracing import figures
from goddp.tracing.session import traced_plans


def bucket(index, nbytes, launch, done, **extra):
    return {"index": index, "bytes": nbytes, "params": 1, "launch_s": launch, "done_s": done, **extra}


@pytest.mark.parametrize(
    "step, end, order, done, start_seen, finalized",
    [
        pytest.param({"start_seen": True, "compute_end_s": 1.0, "finalized_s": 1.5,
                      "buckets": [bucket(2, 1, 0.5, 0.9), bucket(1, 1, 0.5, 0.8), bucket(0, 1, 0.1, 0.3)]},
                     1.0, [0, 1, 2], [0.3, 0.8, 0.9], True, 1.5, id="launch order, ties by index"),
        pytest.param({"buckets": [bucket(0, 1, 0.0, 0.2), bucket(1, 1, 0.4, None)]},
                     0.4, [0, 1], [0.2, 0.4], False, None, id="no compute end: the last launch"),
        pytest.param({"compute_end_s": 0.3, "buckets": [bucket(0, 1, 0.5, None), bucket(1, 1, 0.1, 0.2)]},
                     0.5, [1, 0], [0.2, 0.3], False, None,
                     id="a compute end before the last launch moves to it, an unfinished bucket is done at the recorded end"),
        pytest.param({"compute_end_s": None, "buckets": []}, 0.0, [], [], False, None, id="no buckets, no end"),
    ],
)
def test_normalize(step, end, order, done, start_seen, finalized):
    n = figures.normalize_step(step)
    assert n["compute_end_s"] == end
    assert [b["index"] for b in n["buckets"]] == order
    assert [b["done_s"] for b in n["buckets"]] == done
    assert all(b["param_names"] == [] for b in n["buckets"])
    assert (n["start_seen"], n["finalized_s"]) == (start_seen, finalized)
    assert figures.normalize_step(n) == n, "normalizing twice changes nothing"


def test_normalized_step_keys():
    """A step dict holds the recorded fields only, in one order; keys it
    does not read are left out."""
    n = figures.normalize_step({"verdict": "", "compute_end_s": None,
                                "buckets": [bucket(0, 8, 0.5, None, extra=1, param_names=None)]})
    assert list(n) == ["start_seen", "compute_end_s", "finalized_s", "buckets"]
    assert n["buckets"] == [{"index": 0, "bytes": 8, "params": 1, "param_names": [], "launch_s": 0.5, "done_s": 0.5}]
    rep = figures.report({"module": "M", "steps": [n]})
    assert list(rep) == ["steps", "step_stats", "median_step", "verdict", "prediction", "summary"]
    assert list(rep["step_stats"][0]) == ["backward_s", "last_done_s", "exposed_s", "comm_busy_s", "overlapped", "buckets",
                                          "launched_during_backward", "head_start_s"]
    json.dumps(rep, allow_nan=False)


@pytest.mark.parametrize(
    "step, want",
    [
        pytest.param({"compute_end_s": 1.0, "buckets": [bucket(0, 100, 0.25, 0.75), bucket(1, 300, 0.5, 1.25), bucket(2, 100, 0.99, 1.5)]},
                     dict(backward_s=1.0, last_done_s=1.5, exposed_s=0.5, comm_busy_s=1.25, overlapped=0.75 / 1.25, buckets=3,
                          launched_during_backward=2, head_start_s=(100 * 0.75 + 300 * 0.5 + 100 * 0.01) / 500),
                     id="overlapping, one late"),
        pytest.param({"compute_end_s": 2.0, "buckets": [bucket(0, 1, 0.0, 0.5), bucket(1, 1, 1.0, 1.5)]},
                     dict(backward_s=2.0, last_done_s=1.5, exposed_s=0.0, comm_busy_s=1.0, overlapped=1.0, buckets=2,
                          launched_during_backward=2, head_start_s=1.5),
                     id="a gap between allreduces is not busy"),
        pytest.param({"compute_end_s": 1.0, "buckets": [bucket(0, 8, 1.0, 3.0)]},
                     dict(backward_s=1.0, last_done_s=3.0, exposed_s=2.0, comm_busy_s=2.0, overlapped=0.0, buckets=1,
                          launched_during_backward=0, head_start_s=0.0),
                     id="all after backward"),
        pytest.param({"compute_end_s": 1.0, "buckets": [bucket(0, 0, 0.5, 0.5)]},
                     dict(backward_s=1.0, last_done_s=0.5, exposed_s=0.0, comm_busy_s=0.0, overlapped=1.0, buckets=1,
                          launched_during_backward=1, head_start_s=0.0),
                     id="nothing in flight: fully overlapped, no head start"),
        pytest.param({"compute_end_s": 1.0, "buckets": [bucket(0, 4, 0.95, 1.0)]},
                     dict(backward_s=1.0, last_done_s=1.0, exposed_s=0.0, comm_busy_s=0.05, overlapped=1.0, buckets=1,
                          launched_during_backward=1, head_start_s=0.05),
                     id="exactly at the margin counts as during backward"),
        pytest.param({"compute_end_s": 1.0, "buckets": []},
                     dict(backward_s=1.0, last_done_s=1.0, exposed_s=0.0, comm_busy_s=0.0, overlapped=1.0, buckets=0,
                          launched_during_backward=0, head_start_s=0.0),
                     id="no buckets"),
    ],
)
def test_step_stats(step, want):
    got = figures.step_stats(step)
    assert got == pytest.approx(want, abs=1e-12)
    assert list(got) == list(want)


def test_median_and_verdict():
    def step(end, overlap):
        # one bucket in flight from end-overlap to end+(1-overlap): that share before the end
        return {"compute_end_s": end, "buckets": [bucket(0, 1, end - overlap, end + 1 - overlap)]}

    assert figures.median_step([]) is None
    assert figures.verdict([]) == "no step with a DDP allreduce was recorded"
    steps = [step(3, 0.5), step(1, 0.25), step(2, 1), step(2, 0.75)]
    assert figures.median_step(steps) is steps[3], "the upper of the two middle backward times, equal ones in record order"
    assert figures.report({"steps": steps})["median_step"] == 3
    # exposed shares 0.5, 0.75, 0, 0.25: median 0.375, printed half to even
    assert figures.verdict(steps) == "1 of 1 buckets launched before backward ended; 38% of communication exposed"


def test_summary_golden():
    """The summary of a two-step record with a forward planned across
    graphs, of the same with a fallback and DDP keeping its buckets, and of
    one without steps or plans."""
    rec = {
        "rank": 1, "ranks": [0, 1], "module": "GPT", "comm_hook": "DDP's default allreduce", "dropped_steps": 2,
        "goddp_plans": [{"fingerprint": "00000000000000ab", "mode": "ddp", "num_pieces": 3, "bucket_bytes": [1, 2],
                         "forward": {"graphs": ["frame f", "frame g [0/1]"], "aligned": True, "bucket_graphs": [1, 0]}}],
        "steps": [
            {"start_seen": True, "compute_end_s": 0.012,
             "buckets": [bucket(1, 3 << 20, 0.0111, 0.02), bucket(0, 1 << 16, 0.004, 0.006)]},
            {"start_seen": True, "compute_end_s": 0.010,
             "buckets": [bucket(0, 1 << 16, 0.002, None), bucket(1, 3 << 20, 0.009, 0.0105)]},
        ],
    }
    text = figures.format_summary(rec) + "\n\n"
    unaligned = dict(rec, goddp_plans=[{"fallback": "why", "forward": {"graphs": ["frame f"]}}])
    text += figures.format_summary(unaligned) + "\n\n"
    text += figures.format_summary({"module": "Net", "comm_hook": "hook"}) + "\n"
    check_golden(golden_path(__file__, "trace_summary"), text)


def test_summary_names_the_median_step_by_its_first_occurrence():
    step = {"compute_end_s": 1.0, "buckets": [bucket(0, 1, 0.5, 0.75)]}
    text = figures.format_summary({"module": "M", "steps": [step, dict(step), dict(step)]})
    assert "median step (0)," in text and "per step (ms):" in text


def test_forward_without_matching_buckets_has_no_graph_column():
    """bucket_graphs that are not one per bucket of the median step: DDP's
    buckets are not the forward's layout, so no graph column."""
    step = {"compute_end_s": 1.0, "buckets": [bucket(0, 1, 0.5, 0.75)]}
    forward = {"graphs": ["f", "g"], "aligned": True, "bucket_graphs": [0, 1]}
    lines = figures.format_summary({"module": "M", "steps": [step], "goddp_plans": [{"forward": forward}]}).split("\n")
    assert lines[4].split() == ["bucket", "bytes", "params", "launch", "duration", "done", "during", "backward"]
    lines = figures.format_summary({"module": "M", "steps": [step], "goddp_plans": [{"forward": dict(forward, bucket_graphs=[1])}]}).split("\n")
    assert lines[4].split()[3] == "graph" and lines[5].split()[4] == "1"


def naive_busy(spans, end):
    """Cuts the time line at every interval end and keeps the pieces some
    interval covers: the busy time, and its part before end."""
    cuts = sorted({t for span in spans for t in span} | {end})
    total = before = 0.0
    for lo, hi in zip(cuts, cuts[1:]):
        mid = (lo + hi) / 2
        if any(start <= mid <= stop and start < stop for start, stop in spans):
            total += hi - lo
            if hi <= end:
                before += hi - lo
    return total, before


# Times on a 1/64 s grid: exact in floating point, so the sweep and the
# figures agree to rounding.
grid = st.integers(0, 255).map(lambda k: k / 64)


@settings(max_examples=500, deadline=None)
@given(end=grid, pairs=st.lists(st.tuples(grid, st.integers(0, 127)), max_size=8))
def test_figures_match_a_naive_sweep(end, pairs):
    step = {"compute_end_s": end, "buckets": [bucket(k, size, launch, launch + size / 64) for k, (launch, size) in enumerate(pairs)]}
    spans = [(b["launch_s"], b["done_s"]) for b in step["buckets"]]
    n = figures.normalize_step(step)
    st_ = figures.step_stats(step)
    total, before = naive_busy(spans, n["compute_end_s"])
    assert st_["comm_busy_s"] == pytest.approx(total, abs=1e-9)
    assert st_["overlapped"] == (pytest.approx(before / total, abs=1e-9) if total > 0 else 1.0)
    assert 0.0 <= st_["overlapped"] <= 1.0
    last_done = max((stop for _, stop in spans), default=None)
    assert st_["exposed_s"] == (max(0.0, last_done - n["compute_end_s"]) if spans else 0.0)


def plan_record(fingerprint, module, *sizes, **fields):
    """A plan record of module with buckets of the given bytes."""
    buckets = [{"bytes": b, "param_names": [f"p{b}"]} for b in sizes]
    return {"fingerprint": fingerprint, "mode": "ddp", "buckets": buckets, "ddp_module": {"key": module, "type": "M"}, **fields}


def traced(fingerprint, *sizes, **fields):
    return {"fingerprint": fingerprint, "mode": "ddp", "num_pieces": None, "bucket_bytes": list(sizes),
            "bucket_param_names": [[f"p{b}"] for b in sizes], "ddp_buckets": None, "fallback": None,
            "ddp_module": {"key": "M#0", "type": "M"}, "forward": None, **fields}


def test_traced_plans_select_and_project():
    """The module's records with buckets, one per fingerprint (the latest
    wins and moves last), the fingerprint in hex."""
    records = [
        plan_record(1, "M#0", 8), plan_record(2, "M#1", 8), plan_record(3, "M#0"), plan_record(None, "M#0", 4),
        plan_record(1, "M#0", 16, 32, forward={"z": 1, "a": 2}), plan_record(1 << 63, "M#0", 2), {"fingerprint": 5},
        {"buckets": [{"bytes": 1}], "ddp_module": None},
    ]
    assert traced_plans("M#0", records) == [
        traced(None, 4), traced("0000000000000001", 16, 32, forward={"z": 1, "a": 2}), traced("8000000000000000", 2),
    ]
    assert traced_plans("nobody", records) == []
    # Buckets without names, and the record's own values as they are.
    got = traced_plans("M#0", [{"fingerprint": 255, "buckets": [{"bytes": 8}], "ddp_module": {"key": "M#0"}, "fallback": "f"}])
    assert got == [{"fingerprint": "00000000000000ff", "mode": None, "num_pieces": None, "bucket_bytes": [8],
                    "bucket_param_names": [[]], "ddp_buckets": None, "fallback": "f", "ddp_module": {"key": "M#0"}, "forward": None}]


def test_traced_plans_refuse_a_record_they_cannot_read():
    """A selected record whose buckets have no bytes fails (the trace then
    lists no plans: session._attributed_plans); another module's is not read."""
    with pytest.raises(KeyError):
        traced_plans("M", [{"buckets": [{"param_names": []}], "ddp_module": {"key": "M"}}])
    assert traced_plans("M", [{"buckets": [{"param_names": []}], "ddp_module": {"key": "N"}}]) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, 1, 2, 3]), st.sampled_from(["A#0", "A#1"]),
                          st.lists(st.integers(0, 99), max_size=2)), max_size=12))
def test_traced_plans_match_an_ordered_map(drawn):
    """Against the obvious reference: a list that drops a fingerprint's
    entry and appends it again."""
    records = [plan_record(fp, module, *sizes) for fp, module, sizes in drawn]
    want: list[tuple] = []
    for fp, module, sizes in drawn:
        if module == "A#0" and sizes:
            want = [w for w in want if w[0] != fp] + [(fp, sizes)]
    got = traced_plans("A#0", records)
    assert [(p["fingerprint"], p["bucket_bytes"]) for p in got] == [
        (None if fp is None else f"{fp:016x}", sizes) for fp, sizes in want
    ]
