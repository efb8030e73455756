"""goddp.trace's plans (Note [A trace's plans] in goddp.tracing.session),
without a process group: the selection and projection, and the selection
against an ordered map over random records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from goddp.tracing.session import traced_plans


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
