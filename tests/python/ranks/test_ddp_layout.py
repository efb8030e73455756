"""goddp.ranks.layout: what the ranks of a DDP module agree on, and its digest
from the Go planner (planner/layout.go pins the same value)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from goddp.ranks.layout import Layout, build_id, layout_of

SAMPLE = Layout(buckets=((5, 4), (3, 2), (1, 0)), caps=(4352, 16640, 16900), order="ready", build="goddp 0.1.0 abi 5")
# TestLayoutDigestPinned in planner/layout_test.go
PINNED = 0x6D741D53F90D3F02


def test_the_digest_is_the_planners(native_module):
    assert SAMPLE.digest() == PINNED


def test_the_digest_is_the_same_in_another_process(native_module):
    code = (
        "from goddp.ranks.layout import Layout; "
        "print(Layout(buckets=((5, 4), (3, 2), (1, 0)), caps=(4352, 16640, 16900), order='ready', "
        "build='goddp 0.1.0 abi 5').digest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == PINNED


@pytest.mark.parametrize(
    "change",
    [
        {"buckets": ((4, 5), (3, 2), (1, 0))},
        {"buckets": ((5, 4, 3), (2,), (1, 0))},
        {"caps": (4352, 16641, 16900)},
        {"order": "declaration"},
        {"build": build_id() + "x"},
    ],
)
def test_what_ddp_communicates_changes_the_digest(native_module, change):
    assert dataclasses.replace(SAMPLE, **change).digest() != PINNED


def test_a_layout_no_ddp_could_have_is_refused(native_module):
    from goddp.native.extension import load

    with pytest.raises(load().PlannerError, match="DDP position 4 is in layout buckets 0 and 1"):
        Layout(buckets=((5, 4), (4, 2)), caps=(1, 1), order="ready", build="b").digest()


def test_round_trip():
    assert Layout.from_dict(SAMPLE.to_dict()) == SAMPLE


def _difference(first, second):
    """What the verdict says differs, rank 1 (second) against rank 0 (first):
    goddp.ranks.verdict's layout_difference (testdata/agree_wording.golden has
    more)."""
    from goddp.ranks.plan_check import Statement, decide

    said = {0: Statement(first, digest=first.digest(), fingerprint=1),
            1: Statement(second, digest=second.digest(), fingerprint=1)}
    names = {p: f"layers.{p}.weight" for p in range(6)}.__getitem__
    reason = decide(said, names).reason
    prefix = "the ranks' layouts differ: "
    assert reason.startswith(prefix), reason
    return reason[len(prefix):]


def test_the_verdict_says_what_differs(native_module):
    other = Layout(buckets=((1, 0), (3, 2), (5, 4)), caps=SAMPLE.caps, order="ready", build=SAMPLE.build)
    said = _difference(other, SAMPLE)
    assert said == "bucket 0: rank 1 holds [layers.5.weight, layers.4.weight] where rank 0 holds [layers.1.weight, layers.0.weight]", said
    swapped = Layout(((4, 5), (3, 2), (1, 0)), SAMPLE.caps, "ready", SAMPLE.build)
    assert _difference(swapped, SAMPLE) == "bucket 0: rank 1 orders its parameters [layers.5.weight, layers.4.weight], rank 0 [layers.4.weight, layers.5.weight]"
    assert _difference(Layout(SAMPLE.buckets, (1, 2, 3), "ready", SAMPLE.build), SAMPLE) == (
        "rank 1 gives DDP caps [4352, 16640, 16900] bytes, rank 0 [1, 2, 3]")
    fewer = Layout(((5, 4), (3, 2, 1, 0)), (1, 2), "ready", SAMPLE.build)
    assert _difference(fewer, SAMPLE).startswith("bucket 1: rank 1 holds nothing else where rank 0 holds [layers.1.weight")
    assert _difference(dataclasses.replace(SAMPLE, build="goddp 'x'"), SAMPLE) == (
        "rank 1 was made by 'goddp 0.1.0 abi 5', rank 0 by \"goddp 'x'\"")
    from goddp.ranks.plan_check import INSTALL, Statement, decide

    same = {r: Statement(SAMPLE, digest=SAMPLE.digest(), fingerprint=1) for r in (0, 1)}
    assert decide(same).action == INSTALL


def test_a_digest_that_is_not_the_layouts_is_refused(native_module):
    """Equal digests must mean equal layouts: the verdict recomputes each
    rank's digest through the planner (Note [What the verdict refuses] in
    goddp.ranks.verdict)."""
    from goddp.ranks.plan_check import Statement, decide

    other = dataclasses.replace(SAMPLE, caps=(1, 2, 3))
    said = {0: Statement(SAMPLE, digest=SAMPLE.digest()), 1: Statement(other, digest=SAMPLE.digest())}
    with pytest.raises(ValueError, match="rank 1 gave layout digest"):
        decide(said)
    with pytest.raises(ValueError, match="rank 0 gave a layout digest without a layout"):
        decide({0: Statement(None, digest=1), 1: Statement(None, digest=1)})


def test_layout_of_names_positions():
    layout = layout_of([["b", "a"], ["c"]], [1, 10], "ready", {"a": 0, "b": 1, "c": 2})
    assert layout.buckets == ((1, 0), (2,)) and layout.caps == (1, 10) and layout.build == build_id()
    with pytest.raises(ValueError, match="want one of"):
        layout_of([["a"]], [1], "sideways", {"a": 0})
