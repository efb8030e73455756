"""goddp.ranks.verdict: every branch of Note [The agreement verdict], the
install round, a round given up, what a Round refuses, the wording users
read (testdata/agree_wording.golden), and the verdict against a naive
reference and whatever the order the statements came in (hypothesis)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _agree_util import A, B, CAPS, failed, group, keeps, later, layout, lost, name_of, proposes, strict
from _golden import check_golden
from goddp.ranks.verdict import INSTALL, KEEP, LATER, PeerFailedError, PlanMismatchError, Round, Statement

GOLDENS = Path(__file__).resolve().parent / "testdata"
PEER_FAILED, PLAN_MISMATCH = "peer_failed", "plan_mismatch"
_KINDS = {PeerFailedError: PEER_FAILED, PlanMismatchError: PLAN_MISMATCH}


def ranked(*statements: Statement, ranks=None) -> dict[int, Statement]:
    """Statements of ranks 0, 1, ... (or of ranks), in that insertion order."""
    return dict(zip(range(len(statements)) if ranks is None else ranks, statements))


def layout_rank(decision) -> int | None:
    """The lowest rank that proposed the layout the decision installs."""
    if decision.layout is None:
        return None
    return min(r for r, s in decision.statements.items() if s.layout == decision.layout)


def outcome(said: dict[int, Statement], may_defer: bool = True, **round_kw):
    """The verdict, or (error kind, message) where every rank raises."""
    try:
        return Round(said, name_of, **round_kw).propose(may_defer)
    except (PeerFailedError, PlanMismatchError) as exc:
        return _KINDS[type(exc)], str(exc)


OTHER_PLAN = dataclasses.replace(proposes(), fingerprint=0xABD)

# name, may_defer, statements, error kind or action, layout rank, disagreed, reason prefix ("-": None)
VERDICTS = [
    ("same layout everywhere installs", True, ranked(proposes(), proposes(), proposes()), INSTALL, 0, False, "-"),
    ("plans that differ with one layout install", True, ranked(OTHER_PLAN, proposes()), INSTALL, 0, False, "-"),
    ("one rank alone installs", False, ranked(proposes(), ranks=[4]), INSTALL, 4, False, "-"),
    ("strict alone is no error when layouts agree", True, ranked(strict(proposes()), strict(proposes())), INSTALL, 0, False, "-"),
    ("a lost reducer stops everyone", True, ranked(proposes(), lost(proposes(), "injected")), PEER_FAILED, None, False, ""),
    ("a lost reducer beats strict and later", True,
     ranked(strict(proposes()), later(proposes()), lost(proposes(B), "x")), PEER_FAILED, None, False, ""),
    ("strict differing layouts raise", True, ranked(proposes(), strict(proposes()), proposes(B)), PLAN_MISMATCH, None, False, ""),
    ("strict mismatch beats later", True, ranked(strict(proposes()), proposes(B), later(proposes())), PLAN_MISMATCH, None, False, ""),
    ("later defers", True, ranked(proposes(), later(proposes())), LATER, None, False, "some rank will propose"),
    ("later with differing layouts still defers", True,
     ranked(proposes(), proposes(B), later(proposes())), LATER, None, False, "some rank will propose"),
    ("later at the deferred round keeps", False, ranked(proposes(), later(proposes())), KEEP, None, True,
     "the ranks did not all propose the same layout: rank 0: plan"),
    ("differing layouts keep, naming them", True, ranked(proposes(), proposes(B)), KEEP, None, True,
     "the ranks' layouts differ: bucket 0: rank 1 holds [layers.3.weight]"),
    ("one fallback keeps and lists everyone", True, ranked(proposes(), keeps("fallback: x"), proposes()), KEEP, None, True,
     "the ranks did not all propose the same layout: rank 0: plan 0000000000000abc, 3 pieces; "
     "proposes DDP buckets [4096, 8192, 1024] bytes (layout "),
    ("the same no everywhere is no disagreement", True, ranked(keeps("align_buckets=False"), keeps("align_buckets=False")),
     KEEP, None, False, "align_buckets=False"),
    ("the same no without words", True, ranked(Statement(None), Statement(None)), KEEP, None, False, "-"),
    ("a failed plan is no mismatch", True, ranked(proposes(), failed()), KEEP, None, True, "the ranks did not all propose"),
    ("the same reason, one plan failed, disagrees", True, ranked(keeps("fallback: planning failed"), failed()), KEEP, None, True,
     "the ranks did not all propose"),
]


@pytest.mark.parametrize("name, may_defer, said, want, want_rank, disagreed, reason", VERDICTS, ids=[v[0] for v in VERDICTS])
def test_every_branch_of_the_verdict(native_module, name, may_defer, said, want, want_rank, disagreed, reason):
    got = outcome(said, may_defer)
    if want in (PEER_FAILED, PLAN_MISMATCH):
        assert isinstance(got, tuple) and got[0] == want and got[1].startswith("goddp: "), got
        return
    assert (got.action, layout_rank(got), got.disagreed) == (want, want_rank, disagreed)
    assert got.reason is None if reason == "-" else got.reason.startswith(reason), got.reason
    record = got.record
    assert record["aligned"] is (want == INSTALL) and record["action"] == want and record["reason"] == got.reason
    assert [r["rank"] for r in record["ranks"]] == sorted(said)
    if want == INSTALL:
        assert record["caps"] == list(CAPS) and record["layout_digest"] == f"{A.digest():016x}"
    else:
        assert record["caps"] is None and record["layout_digest"] is None


def test_the_install_round():
    said = ranked(proposes(), proposes())
    stands = Round(said).confirm({0: {}, 1: {"failed": None, "lost": None}})
    assert stands == Round(said).propose(False) and stands.action == INSTALL and layout_rank(stands) == 0
    kept = Round(said).confirm({1: {"failed": "no per-bucket caps"}, 0: {"failed": "boom"}})
    assert (kept.action, kept.disagreed, kept.layout) == (KEEP, True, None)
    assert kept.reason == "the ranks agreed, but rank 0: boom; rank 1: no per-bucket caps"
    assert kept.record["aligned"] is False and kept.record["caps"] is None
    assert Round(said).confirm({0: {"failed": ""}, 1: {"lost": ""}}).action == INSTALL  # empty words say nothing
    with pytest.raises(PeerFailedError) as info:
        Round(said).confirm({0: {"failed": "boom"}, 1: {"lost": "gone"}})
    assert str(info.value) == (
        "goddp: DDP's reducer could not be rebuilt on rank 1 (gone); every rank stops rather than train without gradient allreduces"
    )
    with pytest.raises(ValueError, match="agree on one layout"):
        Round(ranked(proposes(), proposes(B))).confirm({0: {}, 1: {}})
    with pytest.raises(ValueError, match="agree on one layout"):
        Round(ranked(proposes(), lost(proposes(), "x"))).confirm({0: {}, 1: {}})


_BAD_CAPS = layout((-5, 3, 1), (5, 4), (3, 2), (1, 0))
_OTHER_CAPS = layout((1, 2, 3), (5, 4), (3, 2), (1, 0))

# name, statements, install reports (None: a propose round), what the error says
MALFORMED = [
    ("no statement", {}, None, "at least one statement"),
    ("a negative rank", ranked(proposes(), proposes(), ranks=[-1, 1]), None, "rank -1 is not a rank"),
    ("a digest without a layout everywhere", ranked(Statement(None, digest=1), Statement(None, digest=1)), None,
     "rank 0 gave a layout digest without a layout"),
    ("a layout without a digest", ranked(proposes(), Statement(A)), None, "rank 1 gave a layout without its digest"),
    ("a negative piece count", ranked(proposes(), dataclasses.replace(keeps("a"), pieces=-2)), None, "rank 1 runs -2 pieces"),
    ("a digest that is not the layout's", ranked(proposes(), dataclasses.replace(proposes(_OTHER_CAPS), digest=A.digest())), None,
     "rank 1 gave layout digest"),
    ("a digest off by one", ranked(dataclasses.replace(proposes(), digest=A.digest() ^ 1)), None, "rank 0 gave layout digest"),
    ("a layout no DDP module could have", ranked(proposes(), Statement(_BAD_CAPS, digest=A.digest())), None,
     "rank 1 proposed a layout no DDP module could have"),
    ("a negative position", ranked(proposes(), Statement(layout((1,), (-1,)), digest=A.digest())), None,
     "rank 1 proposed a layout no DDP module could have"),
    ("an unknown order", ranked(proposes(), Statement(dataclasses.replace(A, order="sideways"), digest=A.digest())), None,
     "rank 1 proposed a layout of bucket order 'sideways'"),
    ("an install report from a rank without a statement", ranked(proposes(), proposes()), {0: {}, 1: {}, 7: {"failed": "x"}},
     "a report from rank 7, which made no statement"),
    ("an install report missing", ranked(proposes(), proposes()), {0: {}}, "no report from rank 1"),
    ("no install report at all", ranked(proposes(), proposes()), {}, "no report from rank 0"),
]


@pytest.mark.parametrize("name, said, installed, want", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_statements_no_rank_could_have_made_are_refused(native_module, name, said, installed, want):
    with pytest.raises(ValueError, match="^goddp: ") as info:
        round_ = Round(said, name_of)
        round_.propose(True) if installed is None else round_.confirm(installed)
    assert want in str(info.value)


@pytest.mark.parametrize(
    "stopped_by, missing, said, want",
    [
        (-1, [], ranked(proposes()), "negative rank"),
        (0, [-2], ranked(proposes()), "negative rank"),
        (0, [1], ranked(proposes(), proposes()), "rank 1 is both missing and heard from"),
    ],
)
def test_a_malformed_given_up_round_is_refused(stopped_by, missing, said, want):
    with pytest.raises(ValueError, match=want):
        Round(said).given_up(stopped_by, missing)


def test_a_group_of_no_rank_is_refused():
    with pytest.raises(ValueError, match="process group 'g' has 0 ranks"):
        Round(ranked(proposes()), group=group("g", 0))


def test_a_round_given_up_keeps_everywhere():
    """The early rank saw only itself; the latecomer saw everyone, but the
    round was settled as given up: both keep (Note [A round given up])."""
    early = Round(ranked(proposes()), name_of).given_up(0, [2, 1])
    late = Round(ranked(proposes(), proposes(), proposes()), name_of).given_up(0, [])
    for v in (early, late):
        assert (v.action, v.layout, v.disagreed, v.record["aligned"]) == (KEEP, None, True, False)
        assert v.reason.endswith("; every rank keeps DDP's own buckets and trains on")
    assert early.reason.startswith(
        "rank(s) [1 2] did not come to the agreement within the bounded wait (rank 0 stopped waiting first)")
    assert late.reason.startswith("rank 0 stopped waiting before this rank had seen every rank's statement")
    # Without the round given up the latecomer's statements would install.
    assert Round(ranked(proposes(), proposes(), proposes())).propose(True).action == INSTALL


def test_ranks_far_apart_sort_in_rank_order():
    big = 2**63 - 1
    v = Round({big: proposes(), 0: proposes(), big - 1: proposes(), 5: proposes()}).propose(True)
    assert [r["rank"] for r in v.record["ranks"]] == [0, 5, big - 1, big]
    assert layout_rank(v) == 0


def test_the_outcome_line_of_each_kind_of_verdict():
    g = group("default_pg", 2)
    at = lambda *said, may_defer=True: Round(ranked(*said), name_of, g).propose(may_defer).log  # noqa: E731
    where = "2 rank(s) of process group 'default_pg'"
    assert at(proposes(), proposes()) == (
        20, f"goddp: DDP's 3 buckets now close at piece boundaries on all {where} (per-bucket caps [4096, 8192, 1024] bytes)")
    # Several dtype groups share the caps: the buckets are counted.
    groups = dataclasses.replace(A, buckets=((0,), (1,), (2,), (3,)), caps=(4096, 8192))
    assert at(proposes(groups), proposes(groups)) == (
        20, f"goddp: DDP's 4 buckets of several dtype groups now follow the pieces on all {where} "
        "(per-bucket caps [4096, 8192] bytes)")
    assert at(proposes(), later(proposes())) == (
        20, f"goddp: the {where} decide DDP's buckets at the module's next training call")
    assert at(keeps("align_buckets=False"), keeps("align_buckets=False")) == (
        20, f"goddp: DDP keeps its own buckets on all {where}: align_buckets=False")
    level, text = at(proposes(), keeps("x"))
    assert level == 30 and text.endswith(". Gradients stay exact; only the overlap of allreduces with backward is smaller.")
    assert at(Statement(None), Statement(None))[1].endswith("'default_pg': None")
    assert Round(ranked(proposes())).propose(True).log is None


# --------------------------------------------------------------------------
# The wording users read


def render_agree_wording() -> str:
    declaration = dataclasses.replace(A, order="declaration")
    other_build = dataclasses.replace(A, build="goddp 'next'")
    many = layout((1, 2), (0, 1, 2, 3, 4), (5,))
    many_other = layout((1, 2), (5,), (0, 1, 2, 3, 4))
    fewer = layout((1, 2), (5, 4), (3, 2, 1, 0))
    two_buckets = layout((1, 2), (5, 4), (3, 2))
    other_caps = layout((1, 2, 3), (5, 4), (3, 2), (1, 0))
    swapped = layout(CAPS, (4, 5), (3, 2), (1, 0))
    unnamed = layout(CAPS, (5, 40), (3, 2), (1, 0))
    cases = [
        ("install", True, ranked(proposes(), proposes(), ranks=[1, 0])),
        ("buckets hold others", True, ranked(proposes(), proposes(B), proposes())),
        ("order within a bucket", True, ranked(proposes(), proposes(swapped))),
        ("more than three names", True, ranked(proposes(many), proposes(many_other))),
        ("fewer buckets", True, ranked(proposes(), proposes(fewer))),
        ("more buckets", True, ranked(proposes(fewer), proposes())),
        ("a bucket missing", True, ranked(proposes(), proposes(two_buckets))),
        ("a bucket more", True, ranked(proposes(two_buckets), proposes())),
        ("caps", True, ranked(proposes(), proposes(other_caps))),
        ("bucket order", True, ranked(proposes(), proposes(declaration))),
        ("build", True, ranked(proposes(), proposes(other_build))),
        ("unnamed position", True, ranked(proposes(), proposes(unnamed))),
        ("strict mismatch", True, ranked(strict(proposes()), proposes(B), later(proposes()), failed())),
        ("lost", True, ranked(lost(proposes(), "injected"), proposes(), lost(proposes(), "rebuild failed"), ranks=[3, 0, 1])),
        ("later", True, ranked(proposes(), later(proposes()))),
        ("later, deferred to", False, ranked(proposes(), later(proposes()), failed(), ranks=[0, 1, 3])),
        ("the same no", True, ranked(keeps("align_buckets=False"), keeps("align_buckets=False"), ranks=[1, 0])),
    ]
    out = []
    for name, may_defer, said in cases:
        got = outcome(said, may_defer)
        out.append(f"== {name}\n")
        if isinstance(got, tuple):
            out.append(f"error {got[0]}: {got[1]}\n")
            continue
        rank = -1 if got.layout is None else layout_rank(got)
        out.append(f"{got.action} layout_rank={rank} disagreed={str(got.disagreed).lower()}\nreason: {got.reason}\n")
    return "".join(out)


def test_the_wording(native_module):
    check_golden(GOLDENS / "agree_wording.golden", render_agree_wording())


def test_the_wording_is_the_same_in_another_process(native_module):
    """Another interpreter, with another hash seed (so other set orders of
    strings), words every verdict byte for byte alike."""
    here = Path(__file__).resolve()
    code = (
        f"import sys; sys.path[:0] = [{str(here.parent)!r}, {str(here.parents[1])!r}]; "
        "import test_verdict; sys.stdout.write(test_verdict.render_agree_wording())"
    )
    ours = render_agree_wording()
    seed = "4243" if os.environ.get("PYTHONHASHSEED") == "4242" else "4242"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert theirs == ours


# --------------------------------------------------------------------------
# Against a naive reference, in any order of arrival

_LAYOUTS = (A, B, layout((7, 7, 7), (5, 4), (3, 2), (1, 0)))


@st.composite
def statements(draw) -> dict[int, Statement]:
    """1-4 ranks out of 0-7, each proposing one of three layouts, nothing
    (with or without a reason), or later; maybe strict, maybe lost, maybe
    with a failed plan."""
    ranks = draw(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True))
    said = {}
    for r in ranks:
        kind = draw(st.integers(0, 5))
        if kind < 3:
            s = Statement(_LAYOUTS[kind], digest=_LAYOUTS[kind].digest())
        elif kind == 3:
            s = Statement(None, reason=draw(st.sampled_from(["align_buckets=False", "fallback: x"])))
        elif kind == 4:
            s = Statement(None, later=True)
        else:
            s = Statement(None)
        said[r] = dataclasses.replace(
            s,
            fingerprint=draw(st.none() | st.integers(0, 2)),
            pieces=draw(st.integers(1, 3)),
            strict=draw(st.integers(0, 3)) == 0,
            lost="lost" if draw(st.integers(0, 9)) == 0 else None,
        )
    return said


def naive_outcome(said: dict[int, Statement], may_defer: bool) -> str:
    """The verdict as README.md states it, the obvious way: lost -> peer
    failed; differing layouts and strict -> mismatch; later and may defer ->
    later; every rank with the same digest -> install; else keep."""
    values = said.values()
    digests = {s.digest for s in values if s.layout is not None}
    if any(s.lost is not None for s in values):
        return PEER_FAILED
    if len(digests) > 1 and any(s.strict for s in values):
        return PLAN_MISMATCH
    if may_defer and any(s.later for s in values):
        return LATER
    if all(s.digest is not None for s in values) and len(digests) == 1:
        return INSTALL
    return KEEP


@settings(max_examples=300, deadline=None)
@given(said=statements(), may_defer=st.booleans())
def test_the_verdict_matches_the_naive_reference(native_module, said, may_defer):
    got = outcome(said, may_defer)
    want = naive_outcome(said, may_defer)
    if isinstance(got, tuple):
        assert got[0] == want
        return
    assert got.action == want
    if got.action == INSTALL:
        assert layout_rank(got) == min(said) and got.layout == said[min(said)].layout
    if got.action == KEEP and got.disagreed and got.reason.startswith("the ranks did not"):
        for r in said:  # every rank that says something the others do not is named
            assert f"rank {r}: " in got.reason


@settings(max_examples=200, deadline=None)
@given(said=statements(), may_defer=st.booleans(), data=st.data())
def test_the_verdict_is_the_same_on_every_rank_whatever_the_order_of_arrival(native_module, said, may_defer, data):
    """Each rank reads the statements in the order they came to it; every
    rank's verdict (and its record and line, or its error) is the same."""
    g = group("pg", 8)
    want = outcome(said, may_defer, group=g)
    for _ in range(3):
        order = data.draw(st.permutations(sorted(said)))
        assert outcome({r: said[r] for r in order}, may_defer, group=g) == want


@settings(max_examples=200, deadline=None)
@given(said=statements(), data=st.data())
def test_a_round_given_up_is_keep_on_every_rank_whatever_each_saw(native_module, said, data):
    """Each rank saw some of the statements (its own among them), in any
    order; the round was given up: every rank keeps DDP's buckets
    (Note [A round given up]), and the reason says only what that rank saw."""
    ranks = sorted(said)
    stopped_by = data.draw(st.sampled_from(ranks))
    for me in ranks:
        seen = data.draw(st.lists(st.sampled_from(ranks), unique=True).map(lambda rs, me=me: sorted({me, *rs})))
        came_late = data.draw(st.booleans())
        missing = [] if came_late else [r for r in ranks if r not in seen]
        view = {r: said[r] for r in data.draw(st.permutations(seen))}
        verdict = Round(view, name_of, group("pg", 8)).given_up(stopped_by, missing)
        assert (verdict.action, verdict.layout, verdict.record["aligned"]) == (KEEP, None, False)
        assert [r["rank"] for r in verdict.record["ranks"]] == seen
        assert verdict.log[0] == 30 and verdict.reason in verdict.log[1]
