"""goddp.ranks.layout: what the ranks of a DDP module agree on, and its digest
from the Go planner (planner/layout.go pins the same value)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goddp.ranks.layout import Layout, build_id, layout_of

SAMPLE = Layout(buckets=((5, 4), (3, 2), (1, 0)), caps=(4352, 16640, 16900), order="ready", build="goddp 0.1.0 abi 5")
# TestLayoutDigestPinned in planner/layout_test.go
PINNED = 0x6D741D53F90D3F02


def test_the_digest_is_the_planners(native_module):
    assert SAMPLE.digest() == PINNED


def module_layout_digest() -> int:
    """The digest of a module's layout built from its parameter names, as
    the ranks build it (DDP order: the last layer's bucket first)."""
    from models import SquareStack

    names = [name for name, _ in SquareStack(16, 4).named_parameters()]
    positions = dict(zip(names, range(len(names))))
    buckets = [names[i:i + 2][::-1] for i in range(len(names) - 2, -1, -2)]
    return layout_of(buckets, [4352] * len(buckets), "ready", positions).digest()


def test_the_digest_is_the_same_in_another_process(native_module):
    """A module's layout digests alike in this process and in two others
    whose str hashes differ (PYTHONHASHSEED)."""
    import _testhooks

    code = "from test_ddp_layout import module_layout_digest; print(hash('goddp'), module_layout_digest())"
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=_testhooks.child_env(PYTHONHASHSEED=seed), cwd=_testhooks.HERE).stdout.split()
        for seed in ("1", "2024")
    ]
    assert runs[0][0] != runs[1][0], "the seeds did not take: str hashes are equal"
    assert int(runs[0][1]) == int(runs[1][1]) == module_layout_digest()


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
    from goddp.ranks.verdict import Statement, decide

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
    from goddp.ranks.verdict import INSTALL, Statement, decide

    same = {r: Statement(SAMPLE, digest=SAMPLE.digest(), fingerprint=1) for r in (0, 1)}
    assert decide(same).action == INSTALL


def test_a_digest_that_is_not_the_layouts_is_refused(native_module):
    """Equal digests must mean equal layouts: the verdict recomputes each
    rank's digest through the planner (Note [What the verdict refuses] in
    goddp.ranks.verdict)."""
    from goddp.ranks.verdict import Statement, decide

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


# --------------------------------------------------------------------------
# A later graph's part of the installed layout (Note [A later graph's part
# of the layout] in goddp.ranks.layout)

INSTALLED = Layout(((11, 10, 9), (8, 7), (6,), (5, 4, 3), (2, 1, 0)), (1, 1, 1, 1, 1), "ready", "b")


def part(*buckets, order="ready") -> Layout:
    return Layout(tuple(tuple(b) for b in buckets), (1,) * len(buckets), order, "b")


@pytest.mark.parametrize(
    "buckets, shared, run",
    [
        # the resume frame recompiled: the installed layout's first buckets
        ([(11, 10, 9), (8, 7), (6,)], (), range(0, 3)),
        # the first frame recompiled: its last buckets
        ([(5, 4, 3), (2, 1, 0)], (), range(3, 5)),
        ([(6,), (5, 4, 3)], (), range(2, 4)),
        # the whole layout; the order inside a bucket does not matter
        ([(9, 10, 11), (7, 8), (6,), (3, 4, 5), (0, 1, 2)], (), range(0, 5)),
        # two installed buckets in one of the graph's: both close at its end
        ([(11, 10, 9, 8, 7), (6,)], (), None),
        ([(6, 5, 4, 3)], (), None),
        # a bucket boundary moved, buckets in another order, a parameter missing or unknown
        ([(11, 10), (9, 8, 7)], (), None),
        ([(8, 7), (11, 10, 9)], (), None),
        ([(11, 10, 9), (8,)], (), None),
        ([(11, 10, 9, 12)], (), None),
        # a run with a gap
        ([(11, 10, 9), (6,)], (), None),
        # a weight tied across the break: counted in the earliest graph's
        # bucket, later in DDP order; alone in a bucket, the combining drops it
        ([(11, 10, 9, 0), (8, 7)], (0,), range(0, 2)),
        ([(11, 10, 9), (0,), (8, 7)], (0,), range(0, 2)),
        ([(11, 10, 9, 0), (8, 7)], (), None),
        ([(11, 10, 9), (8, 7, 6)], (6,), range(0, 2)),
        # shared, but counted inside the run or before it
        ([(11, 10, 9, 8), (7,)], (8,), None),
        ([(8, 7, 11)], (11,), None),
        ([], (), None),
    ],
)
def test_a_part_is_a_run_of_whole_installed_buckets(buckets, shared, run):
    from goddp.ranks.layout import installed_run

    assert installed_run(INSTALLED, part(*buckets), frozenset(shared)) == run


def test_a_part_in_another_order_is_no_run():
    from goddp.ranks.layout import installed_run

    assert installed_run(INSTALLED, part((11, 10, 9), order="declaration")) is None


@pytest.mark.parametrize(
    "positions, shared, run",
    [
        ([11, 10, 9, 8, 7, 6], (), range(0, 3)),
        ([6, 5, 4, 3, 2, 1, 0], (), range(2, 5)),
        ([11, 10, 9, 8, 7, 0], (0,), range(0, 2)),
        ([11, 10, 9, 8, 7, 0], (), None),
        ([11, 10, 9, 8], (), None),
        ([11, 10, 9, 13], (), None),
        ([], (), None),
    ],
)
def test_the_run_a_graphs_parameters_cover(positions, shared, run):
    from goddp.ranks.layout import covering_run

    assert covering_run(INSTALLED, positions, frozenset(shared)) == run


def _naive_run(installed, buckets, shared):
    """Every candidate run, tried: the first (the longest from the first
    start) whose buckets are the graph's buckets as sets, with the shared
    parameters counted after it taken out and the buckets that leaves empty
    dropped (an empty bucket of the graph's own matches none)."""
    home = {p: k for k, b in enumerate(installed.buckets) for p in b}
    params = [p for b in buckets for p in b]
    if not params or any(p not in home for p in params):
        return None
    n = len(installed.buckets)
    for s in range(n):
        for e in range(n, s, -1):
            kept = [set(b) - {p for p in b if p in shared and home[p] >= e} for b in buckets]
            if [b for b in kept if b] == [set(b) for b in installed.buckets[s:e]] and all(
                b or o for b, o in zip(kept, buckets)
            ):
                return range(s, e)
    return None


def _naive_covering(installed, positions, shared):
    """The longest run from the first bucket positions touch whose buckets
    are all positions, the shared parameters counted after it aside."""
    home = {p: k for k, b in enumerate(installed.buckets) for p in b}
    positions = set(positions)
    if not positions or any(p not in home for p in positions):
        return None
    s = min(home[p] for p in positions)
    for e in range(len(installed.buckets), s, -1):
        run = set().union(*map(set, installed.buckets[s:e]))
        if run <= positions and all(p in shared and home[p] >= e for p in positions - run):
            return range(s, e)
    return None


@st.composite
def _installed_and_part(draw):
    n = draw(st.integers(1, 8))
    order = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=n - 1))) if n > 1 else []
    edges = [0, *cuts, n]
    installed = Layout(tuple(tuple(order[a:b]) for a, b in zip(edges, edges[1:])), (1,) * (len(edges) - 1), "ready", "b")
    # A graph's buckets: some installed run, regrouped or not, perhaps with
    # a parameter moved, dropped or added, some parameters shared.
    k = len(installed.buckets)
    s = draw(st.integers(0, k - 1))
    e = draw(st.integers(s + 1, k))
    params = [p for b in installed.buckets[s:e] for p in b]
    extra = draw(st.lists(st.integers(0, n), max_size=2, unique=True))
    params = list(dict.fromkeys([*params, *extra]))
    if draw(st.booleans()) and len(params) > 1:
        params.pop(draw(st.integers(0, len(params) - 1)))
    regroup = draw(st.booleans())
    if regroup:
        inner = sorted(draw(st.sets(st.integers(1, max(1, len(params) - 1)), max_size=3))) if len(params) > 1 else []
        bounds = [0, *inner, len(params)]
        buckets = [params[a:b] for a, b in zip(bounds, bounds[1:]) if params[a:b]]
    else:
        buckets = [list(b) for b in installed.buckets[s:e]]
        for p in extra:
            if p not in params[: len(params) - len(extra)]:
                buckets.insert(draw(st.integers(0, len(buckets))), [p])
    buckets = [draw(st.permutations(b)) for b in buckets]
    shared = frozenset(draw(st.sets(st.sampled_from(range(n + 1)), max_size=3)))
    return installed, buckets, shared


@settings(max_examples=400, deadline=None)
@given(_installed_and_part())
def test_a_part_against_a_naive_reference(case):
    from goddp.ranks.layout import covering_run, installed_run

    installed, buckets, shared = case
    assert installed_run(installed, part(*buckets), shared) == _naive_run(installed, buckets, shared)
    positions = [p for b in buckets for p in b]
    assert covering_run(installed, positions, shared) == _naive_covering(installed, positions, shared)
