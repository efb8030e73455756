"""The agreement's lines (Note [The agreement's lines] in goddp.ranks.verdict)
as users read them (testdata/words.golden): each round's outcome line, a
forward planned across graphs (goddp.ranks.forward.combine: its refusals,
and its layout against a naive reference, hypothesis), a later graph of a
decided module (goddp.ranks.agreement.follow) and a plan's notes
(goddp.compile.notes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _agree_util import A, B, failed, group, keeps, later, layout, name_of, proposes
from _golden import check_golden
from goddp.compile.notes import PlanFacts, plan_notes, settings_note
from goddp.ranks.agreement import FOLLOWED, follow
from goddp.ranks.forward import Member, combine
from goddp.ranks.layout import Layout, build_id
from goddp.ranks.verdict import INSTALL, KEEP, LATER, Decision, Round

GOLDENS = Path(__file__).resolve().parent / "testdata"


def member(describe: str, *buckets, order: str = "ready") -> Member:
    """A graph of a forward whose aligned plan has these buckets."""
    return Member(layout((0,) * len(buckets), *buckets, order=order), None, describe, lambda *a: None, lambda info: None)


def no_layout(describe: str, reason: str | None) -> Member:
    return Member(None, reason, describe, lambda *a: None, lambda info: None)


def log_text(line) -> str:
    if line is None:
        return "(none)"
    level, text = line
    return f"{'WARNING' if level == 30 else 'INFO'} {text}"


def facts(**kw) -> PlanFacts:
    base = dict(mode="ddp", align_requested=False, ddp_bucket_order="ready", aligned=False, caps_order="ready",
                alignment="", merged_cuts=0, num_pieces=0, not_aligned=None, stand_in=False, part_of_forward=False, frame="")
    return PlanFacts(**{**base, **kw})


def decision(action: str, reason: str | None = None, decided: Layout | None = None) -> Decision:
    return Decision(action, decided, reason, False, {})


FOLLOWS = [
    ("later", decision(LATER), A, None),
    ("keep", decision(KEEP, "align_buckets=False"), A, None),
    ("keep, no reason", decision(KEEP), None, None),
    ("install, the same layout", decision(INSTALL, decided=A), layout(A.caps, *A.buckets), None),
    ("install, another layout", decision(INSTALL, decided=A), B, None),
    ("install, none", decision(INSTALL, decided=A), None, None),
    ("install, a part", decision(INSTALL, decided=A), None, B),
    ("install, mine before the part", decision(INSTALL, decided=A), B, A),
    ("install, a part that is installed buckets", decision(INSTALL, decided=A), None, layout((1, 1), (2, 3), (0, 1))),
    ("install, a part of two buckets in one", decision(INSTALL, decided=A), None, layout((1,), (5, 4, 3, 2))),
]


def render_words() -> str:
    out = []
    two = {1: proposes(), 0: proposes()}
    rounds = [
        ("install", lambda r: r(two).propose(True)),
        ("installed", lambda r: r(two).confirm({0: {}, 1: {}})),
        ("install failed", lambda r: r(two).confirm({0: {}, 1: {"failed": "boom"}})),
        ("later", lambda r: r({0: proposes(), 1: later(proposes())}).propose(True)),
        ("differ", lambda r: r({0: proposes(), 1: proposes(B)}).propose(True)),
        ("the same no", lambda r: r({1: keeps("align_buckets=False"), 0: keeps("align_buckets=False")}).propose(True)),
        ("said different things", lambda r: r({0: proposes(), 1: later(proposes()), 3: failed()}).propose(False)),
        ("given up", lambda r: r({0: proposes()}).given_up(0, [1])),
    ]
    for g in (group("0", 2), group("it's", 1)):
        for name, run in rounds:
            verdict = run(lambda said, g=g: Round(said, name_of, g))
            out.append(f"== round {name} (group {json.dumps(g.name)})\n{log_text(verdict.log)}\n")
    forwards = [
        ("two graphs", [4, 4, 8], [member("graph 0 (2 pieces)", (1,), (0,)), member("graph 1 (1 piece)", (2,))]),
        ("tied weight", [4, 4, 8], [member("a", (1, 0)), member("b", (2,), (0,))]),
        ("no layout", [4], [member("a", (0,)), no_layout("a graph", "no plan")]),
        ("declaration", [4], [member("a", (0,), order="declaration")]),
        ("a parameter in none", [4, 4], [member("a", (0,))]),
        ("a position twice", [4, 4], [member("a", (0,), (0, 1))]),
        ("undigestible", [], [member("a")]),
        ("no member", [4], []),
    ]
    for name, param_bytes, members in forwards:
        out.append(f"== forward {name}\nINFO {combine(members, tensors(param_bytes)).note}\n")
    why = "static_graph=True: DDP's buckets are fixed"
    notes = [
        ("aligned, ready", facts(align_requested=True, aligned=True)),
        ("find_unused, align off", facts(ddp_bucket_order="declaration", caps_order="declaration")),
        ("find_unused, torch mode", facts(mode="torch", ddp_bucket_order="declaration")),
        ("refused", facts(align_requested=True, not_aligned=why)),
        ("not asked", facts(not_aligned="align_buckets=False")),
        ("stand-in", facts(align_requested=True, stand_in=True, not_aligned="not a DDP module")),
        ("part of a forward", facts(align_requested=True, part_of_forward=True, frame="frame f (a.py:3)", not_aligned="part")),
        ("declaration caps", facts(align_requested=True, ddp_bucket_order="declaration", aligned=True, caps_order="declaration",
                                   alignment="declaration-order caps", num_pieces=4)),
        ("declaration caps, merged", facts(align_requested=True, ddp_bucket_order="declaration", aligned=True,
                                           caps_order="declaration", alignment="declaration-order caps, pieces merged",
                                           merged_cuts=2, num_pieces=3)),
    ]
    for name, f in notes:
        out.append(f"== notes {name}\nsettings: {settings_note(f) or ''}\n")
        out.extend(f"once={str(n.once).lower()} {n.text}\n" for n in plan_notes(f))
    for name, decided, mine, part in FOLLOWS:
        plan_check, ddp_buckets, line = follow(decided, mine, part)
        out.append(
            f"== follow {name}\ninstalled={str(plan_check['aligned']).lower()} "
            f"aligned={str(ddp_buckets['aligned']).lower()} reason: {ddp_buckets['reason']}\n"
            f"{log_text(None if line is None else (20, line))}\n"
        )
    return "".join(out)


def test_the_words(native_module):
    check_golden(GOLDENS / "words.golden", render_words())


# --------------------------------------------------------------------------
# A forward planned across graphs

REFUSALS = [
    ("no layout", [member("g0", (0,)), no_layout("g1", "fallback: x"), no_layout("g2", None)],
     "a graph of the forward has no layout to combine (g1: fallback: x)"),
    ("no layout, no reason", [no_layout("g0", None)], "a graph of the forward has no layout to combine (g0: None)"),
    ("no layout before the order", [member("g0", (0,), order="declaration"), no_layout("g1", "r")],
     "a graph of the forward has no layout to combine (g1: r)"),
    ("declaration", [member("g0", (0, 1)), member("g1", (2,), order="declaration")],
     "the forward's graphs are bucketed in declaration order, which DDP never rebuilds"),
    ("no member", [], "the forward's graphs are bucketed in declaration order, which DDP never rebuilds"),
    ("combine's error", [member("g0", (0,))],
     "planner: the forward's 1 graphs use 1 of DDP's 3 parameters (DDP position 1 is in none of them): DDP buckets the "
     "others too, so no caps can close its buckets at the cuts"),
]


@pytest.mark.parametrize("name, members, want", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_of_a_forward(native_module, name, members, want):
    got = combine(members, tensors([4, 4, 8]))
    assert (got.layout, got.digest, got.reason) == (None, None, want)
    assert got.info == {"graphs": [m.describe for m in members]}
    assert got.note.endswith(f"; no layout: {want}"), got.note


def test_a_forward_combines_into_the_planners_layout(native_module):
    got = combine([member("g0", (1,), (0,)), member("g1", (2, 0))], tensors([4, 4, 8]))
    want = Layout(((2,), (1,), (0,)), (8, 4, 4), "ready", build_id())
    assert got.reason is None and got.layout == want and got.digest == want.digest()
    assert got.info == {"graphs": ["g0", "g1"], "bucket_graphs": [1, 0, 0], "moved": 1, "dropped": 0,
                        "merged_cuts": 0}
    assert got.note == (
        "goddp: planning the 2 graph(s) of this DDP module's first training forward together: g0; g1; DDP buckets [8, 4, 4] bytes"
    )


def test_a_combined_layout_the_digest_refuses_is_refused(native_module):
    got = combine([member("g0")], [])
    assert got.layout is None and got.reason.startswith("could not state DDP's layout (PlannerError: ")
    assert got.info["bucket_graphs"] == []  # the planner combined it


def tensors(param_bytes: list[int]) -> list[torch.Tensor]:
    """DDP's parameters as combine reads them: one group, of these bytes."""
    return [torch.empty(b, dtype=torch.uint8) for b in param_bytes]


def naive_combine(members: list[Member], param_bytes: list[int]) -> tuple[str, object]:
    """Note [Graphs of one forward], the obvious way: ("refused", what) for
    a member without a layout or not in "ready" order (or none), a
    parameter in no graph; else ("layout", (buckets, caps, moved, dropped)):
    the later graph's buckets first, a parameter of several graphs kept in
    the earliest, a bucket left empty dropped, each cap its bucket's bytes
    but at least one."""
    for m in members:
        if m.layout is None:
            return "refused", f"({m.describe}: "
    if not members or {m.layout.order for m in members} != {"ready"}:
        return "refused", "declaration order"
    earliest: dict[int, int] = {}
    for g, m in enumerate(members):
        for bucket in m.layout.buckets:
            for p in bucket:
                earliest.setdefault(p, g)
    if set(earliest) != set(range(len(param_bytes))):
        return "refused", "is in none of them"
    buckets, moved, dropped = [], 0, 0
    for g in reversed(range(len(members))):
        for bucket in members[g].layout.buckets:
            kept = tuple(p for p in bucket if earliest[p] == g)
            moved += len(bucket) - len(kept)
            if kept:
                buckets.append(kept)
            else:
                dropped += 1
    caps = tuple(max(1, sum(param_bytes[p] for p in b)) for b in buckets)
    return "layout", (tuple(buckets), caps, moved, dropped)


@st.composite
def forwards(draw) -> tuple[list[Member], list[int]]:
    """Up to three graphs over 1-6 parameters of 0, 4 or 8 bytes; each holds
    some of them (none twice) in buckets, or has no layout, or is bucketed
    in declaration order."""
    num_params = draw(st.integers(1, 6))
    param_bytes = draw(st.lists(st.sampled_from([0, 4, 8]), min_size=num_params, max_size=num_params))
    members = []
    for g in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 7)) == 0:
            members.append(no_layout(f"g{g}", None))
            continue
        held = draw(st.permutations(range(num_params)))[: draw(st.integers(0, num_params))]
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(held) - 1)), max_size=3))) if len(held) > 1 else []
        bounds = [0, *[c for c in cuts if c < len(held)], len(held)]
        buckets = [tuple(held[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
        order = "declaration" if draw(st.integers(0, 7)) == 0 else "ready"
        members.append(member(f"g{g}", *buckets, order=order))
    return members, param_bytes


@settings(max_examples=300, deadline=None)
@given(forward=forwards())
def test_a_forwards_layout_matches_the_naive_reference(native_module, forward):
    members, param_bytes = forward
    got = combine(members, tensors(param_bytes))
    kind, want = naive_combine(members, param_bytes)
    assert got.note.startswith(f"goddp: planning the {len(members)} graph(s) "), got.note
    if kind == "refused":
        assert got.layout is None and want in got.reason, (got.reason, want)
        assert got.note.endswith(f"; no layout: {got.reason}")
        return
    buckets, caps, moved, dropped = want
    assert got.reason is None, got.reason
    assert (got.layout.buckets, got.layout.caps, got.layout.order) == (buckets, caps, "ready")
    assert got.digest == got.layout.digest()
    assert (got.info["moved"], got.info["dropped"]) == (moved, dropped)
    assert got.note.endswith(f"; DDP buckets {list(caps)} bytes")


# --------------------------------------------------------------------------
# A later graph, a plan's notes


def _as_sets(the_layout: Layout) -> list[set[int]]:
    return [set(b) for b in the_layout.buckets]


PARTS = [None, A, B, layout((1, 1), (3, 2), (1, 0)), layout((1,), (4, 5)), layout((1,), (5, 4, 3, 2)),
         layout((1, 1), (5, 4), (1, 0))]


@settings(max_examples=200, deadline=None)
@given(
    action=st.sampled_from([INSTALL, KEEP, LATER]),
    mine=st.sampled_from([None, A, B, layout(A.caps, *A.buckets), layout(A.caps, (4, 5), (2, 3), (0, 1))]),
    part=st.sampled_from(PARTS),
    decided=st.sampled_from([A, B, layout(A.caps, *A.buckets)]),
)
def test_a_later_graph_is_aligned_exactly_when_its_buckets_are_installed_ones(native_module, action, mine, part, decided):
    """Aligned: its whole layout is the installed one, or its part a run of
    whole installed buckets, the parameters' order inside a bucket aside
    (Note [A later graph's part of the layout] in goddp.ranks.layout)."""
    plan_check, ddp_buckets, line = follow(decision(action, "why", decided), mine, part)
    installed = _as_sets(decided)
    if mine is not None:
        ours = _as_sets(mine) == installed
    else:
        runs = [installed[s:e] for s in range(len(installed)) for e in range(s + 1, len(installed) + 1)]
        ours = part is not None and _as_sets(part) in runs
    aligned = action == INSTALL and ours
    assert plan_check == {"aligned": action == INSTALL, "followed": FOLLOWED}
    assert ddp_buckets["aligned"] is aligned and (ddp_buckets["reason"] is None) is aligned
    assert (line is not None) is (action == INSTALL and not aligned)


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(["ddp", "torch"]), align_requested=st.booleans(),
    ddp_bucket_order=st.sampled_from(["ready", "declaration"]), aligned=st.booleans(),
    caps_order=st.sampled_from(["ready", "declaration"]), merged_cuts=st.integers(0, 1), num_pieces=st.integers(1, 4),
    not_aligned=st.none() | st.just("why"), stand_in=st.booleans(), part_of_forward=st.booleans(),
)
def test_a_plans_notes_are_the_ones_its_note_lists(**kw):
    f = facts(frame="f", **kw)
    got = plan_notes(f)
    want = []
    if f.stand_in:
        want.append("stand-in")
    elif f.part_of_forward:
        want.append("part")
    elif f.align_requested and f.not_aligned is not None:
        want.append("straddle")
    if f.aligned and f.caps_order == "declaration":
        want.append("declaration")
    assert len(got) == len(want), (f, got)
    for note, kind in zip(got, want):
        assert note.once is (kind != "part")
        if kind == "straddle":
            assert "may straddle the cuts: why" in note.text
        if kind == "declaration":
            assert ("pieces were merged" in note.text) is (f.merged_cuts > 0)
    expect_settings = f.mode == "ddp" and not f.align_requested and f.ddp_bucket_order == "declaration"
    assert (settings_note(f) is not None) is expect_settings

