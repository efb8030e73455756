"""goddp.ranks.group.round_error: the text of a round that did not settle
(Note [Rounds that did not settle]), for every meeting and ending; the
texts users read are pinned in testdata/round_words.golden."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _golden import check_golden
from goddp.ranks.group import Group, round_error
from goddp.ranks.store_round import GAVE_UP, Ended

GOLDEN = Path(__file__).resolve().parent / "testdata" / "round_words.golden"
ENV = "GODDP_PLAN_CHECK_TIMEOUT"
GROUP = Group(name="0", ranks=(0, 1, 2), rank=1, timeout_s=1800.0)
MEETINGS = ("first step", "install", "auto", "enter", "leave")
# How a round ends: outcome, complete.
ENDS = {"waited": (f"{GAVE_UP}1", False), "late": (f"{GAVE_UP}0", True), "refused": ("refused", True)}


def ended(outcome: str, complete: bool, said: dict[int, str], waited_s: float = 1799.6) -> Ended:
    """outcome: the round's decision, or "gave up: rank r"."""
    if outcome.startswith(GAVE_UP):
        return Ended(None, said, complete, waited_s, stopped_by=int(outcome[len(GAVE_UP):]))
    return Ended(outcome, said, complete, waited_s)


SEEN = {1: "ok"}
WAITED_RULE = (
    "Every rank of a DDP module must run its first training step within 1800 s of the first; a rank that crashed, "
    "or one still compiling then, stops here (raise the limit with GODDP_PLAN_CHECK_TIMEOUT=<seconds> or the "
    "process group's timeout)."
)
WHERE = "a DDP module (process group '0', ranks [0, 1, 2])"


@pytest.mark.parametrize(
    "meeting, keeps, end, want",
    [
        ("first step", False, ended("go", True, SEEN), None),
        ("leave", False, ended("go", True, SEEN), None),
        ("first step", False, ended(f"{GAVE_UP}1", False, SEEN),
         f"goddp: rank 1 waited 1800 s at the first training step of {WHERE} for rank(s) [0, 2], which never arrived. "
         + WAITED_RULE),
        ("first step", True, ended(f"{GAVE_UP}0", True, SEEN),
         f"goddp: rank 1 reached the first training step of {WHERE} after the others had stopped waiting for it "
         "(gave up: rank 0), 1800 s after the first arrival; it keeps DDP's own buckets, as they do. Every rank keeps "
         "DDP's own buckets and trains on (Note [A round given up] in goddp.ranks.verdict); GODDP_PLAN_CHECK_TIMEOUT=<seconds> "
         "sets how long the ranks wait for each other here."),
        ("auto", True, ended(f"{GAVE_UP}0", True, SEEN),
         f"goddp: rank 1 reached the bucket_cap_mb='auto' decision of {WHERE} after the others had "
         "stopped waiting for it (gave up: rank 0), 1800 s after the first arrival; it keeps its starting buckets, "
         "as they do. Every rank keeps the buckets it started with and trains on; GODDP_PLAN_CHECK_TIMEOUT=<seconds> "
         "sets how long the ranks wait for each other here."),
        ("install", False, ended(f"{GAVE_UP}0", True, SEEN),
         f"goddp: rank 1 reached installing DDP's new buckets of {WHERE} after the others had stopped waiting for it "
         "(gave up: rank 0), 1800 s after the first arrival; it stops too rather than go on alone. " + WAITED_RULE),
        ("enter", False, ended("refused", True, {2: "no", 0: "ok", 1: "a forward ran"}),
         "goddp.trace: cannot enter the trace (rank 1: a forward ran; rank 2: no)"),
        ("leave", False, ended(f"{GAVE_UP}1", False, {}),
         f"goddp.trace: rank 1 waited 1800 s at leaving the trace of {WHERE} for rank(s) [0, 1, 2], which never "
         "arrived. Every rank must leave it at the same step"),
    ],
    ids=["go", "trace go", "waited", "late, keeps", "auto, late", "install, late", "trace refused", "trace waited"],
)
def test_each_ending_gets_its_text(meeting, keeps, end, want):
    assert round_error(meeting, GROUP, end, keeps, ENV) == want


@pytest.mark.parametrize(
    "meeting, keeps, end, env, want",
    [
        ("lunch", False, ended("go", True, SEEN), ENV, "meeting 'lunch'"),
        ("install", True, ended(f"{GAVE_UP}0", True, SEEN), ENV, "only the first-step and auto rounds keep"),
        ("enter", True, ended("go", True, SEEN), ENV, "only the first-step and auto rounds keep"),
        ("first step", False, ended("refused", True, SEEN), ENV, "ended in 'refused'"),
        ("install", False, ended("go", True, SEEN), "", "needs the name of its timeout's variable"),
    ],
)
def test_a_meeting_or_ending_no_caller_has_is_refused(meeting, keeps, end, env, want):
    with pytest.raises(ValueError, match=want):
        round_error(meeting, GROUP, end, keeps, env)


def test_the_words_users_read():
    """Every meeting and ending, once (GODDP_UPDATE_GOLDENS=1 rewrites the
    golden file)."""
    group = Group(name="it's", ranks=(0, 1, 2), rank=1, timeout_s=12.5)
    out = []
    for meeting in MEETINGS:
        for keeps in {"first step": (False, True), "auto": (True,)}.get(meeting, (False,)):
            for name, (outcome, complete) in ENDS.items():
                if name == "refused" and meeting in ("first step", "install", "auto"):
                    continue
                text = round_error(meeting, group, ended(outcome, complete, {1: "ok", 2: "not traced here"}, 12.5),
                                   keeps, ENV)
                out.append(f"== {meeting} keeps={str(keeps).lower()} {name}\n{text}\n")
    check_golden(GOLDEN, "".join(out))


def naive_missing(ranks: list[int], said: dict[int, str]) -> list[int]:
    """The group's ranks no statement names, the obvious way."""
    out = []
    for rank in ranks:
        found = False
        for r in said:
            found = found or r == rank
        if not found:
            out.append(rank)
    return out


@st.composite
def rounds(draw):
    ranks = draw(st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True))  # in the group's order
    said = {r: v for r in ranks if (v := draw(st.sampled_from([None, "ok", "no", "x; y"]))) is not None}
    timeout = draw(st.floats(0.001, 1e7, allow_nan=False, allow_infinity=False))
    return Group(name="g", ranks=tuple(ranks), rank=ranks[0], timeout_s=timeout), said


@settings(max_examples=300, deadline=None)
@given(rounds(), st.sampled_from(MEETINGS), st.booleans(), st.floats(0, 1e7))
def test_a_round_names_exactly_the_ranks_the_note_says(group_said, meeting, complete, waited):
    """Note [Rounds that did not settle] read literally: a rank that waited
    names the ranks it never heard from, in the group's order; a late rank
    names the outcome it followed; a refused trace round lists each rank
    that did not say "ok", by rank."""
    group, said = group_said
    text = round_error(meeting, group, ended(f"{GAVE_UP}0", complete, said, waited), False, "E")
    if complete:
        assert f"after the others had stopped waiting for it (gave up: rank 0), {group.timeout_s:g} s after" in text
    else:
        assert f" waited {waited:.0f} s at " in text
        assert f"for rank(s) {naive_missing(list(group.ranks), said)}, which never arrived" in text
    if meeting in ("enter", "leave"):
        reasons = []
        for r in sorted(said):
            if said[r] != "ok":
                reasons.append(f"rank {r}: {said[r]}")
        refused = round_error(meeting, group, ended("refused", True, said), False, "E")
        assert refused == f"goddp.trace: cannot {meeting} the trace ({'; '.join(reasons)})"
