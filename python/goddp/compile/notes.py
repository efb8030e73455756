"""The INFO lines a graph's plan deserves (goddp.compile.pipeline logs them).

Note [A plan's notes]: besides its table, a graph's plan deserves a few
INFO lines, each at most once per DDP module (goddp.ddp.settings keeps the
"once"): DDP's own buckets will not follow the cuts, and why (alignment
asked for and refused, a stand-in module); the graph is one of a forward
planned across graphs (every such graph says so); find_unused_parameters=True
without alignment; and how declaration-order caps were made. They follow
from the plan and from facts the shim read (PlanFacts); the words are
goddp's users' (tests/python/ranks/goldens/words.golden).
"""

from __future__ import annotations

import dataclasses

from goddp.native.plan import DECLARATION_GROUPS, READY_GROUPS


@dataclasses.dataclass(frozen=True)
class PlanFacts:
    """What a plan's notes follow from.

    mode, align_requested: the user's options (mode, align_buckets).
    ddp_bucket_order: DDP's own bucket order, as the plan says it.
    aligned, caps_order: the plan's caps align DDP's buckets, and the order
        they were made for ("ready" or "declaration").
    alignment, merged_cuts, num_pieces: the plan's alignment in words, its
        merged cuts and pieces.
    not_aligned: why DDP's buckets are not the pieces (None: they are).
    stand_in: the module is no real DDP (not_aligned says so).
    part_of_forward: the graph holds part of DDP's parameters; frame names it.
    """

    mode: str
    align_requested: bool
    ddp_bucket_order: str
    aligned: bool
    caps_order: str
    alignment: str
    merged_cuts: int
    num_pieces: int
    not_aligned: str | None
    stand_in: bool
    part_of_forward: bool
    frame: str


@dataclasses.dataclass(frozen=True)
class PlanNote:
    """One INFO line; once: at most once per DDP module (else every time)."""

    text: str
    once: bool


UNALIGNED_DECLARATION = (
    "goddp: this DDP module has find_unused_parameters=True and static_graph=False, so DDP "
    "never rebuilds its buckets: they stay in parameter declaration order while goddp's "
    "cuts follow gradient-ready order, and align_buckets is off. Cuts still overlap "
    "communication, but buckets may not close exactly at them."
)


def settings_note(facts: PlanFacts) -> str | None:
    """The line logged only at a DDP module's first plan (None for none)."""
    if facts.ddp_bucket_order == "declaration" and facts.mode == "ddp" and not facts.align_requested:
        return UNALIGNED_DECLARATION
    return None


def plan_notes(facts: PlanFacts) -> list[PlanNote]:
    """The plan's other notes, in order (Note [A plan's notes])."""
    notes = []
    if facts.stand_in:
        notes.append(PlanNote(f"goddp: {facts.not_aligned}", once=True))
    elif facts.part_of_forward:
        notes.append(PlanNote(f"goddp: {facts.frame}: {facts.not_aligned}", once=False))
    elif facts.not_aligned is not None and facts.align_requested:
        notes.append(PlanNote(f"goddp: DDP keeps its own buckets, which may straddle the cuts: {facts.not_aligned}", once=True))
    if facts.aligned and facts.caps_order == "declaration":
        text = (
            "goddp: find_unused_parameters=True: DDP never rebuilds its buckets and keeps the ones it "
            f"fills in declaration order, so goddp gives it caps for that order ({facts.alignment})"
        )
        if facts.alignment == DECLARATION_GROUPS:
            text += (
                "; its parameters span several (dtype, device) groups, which DDP buckets apart against the "
                "same caps, so every group's j-th bucket gets cap j"
            )
            if facts.merged_cuts:
                text += (
                    f"; no bucket launches at {facts.merged_cuts} of the cuts under those caps, so those pieces "
                    f"were merged ({facts.num_pieces} pieces remain)"
                )
        elif facts.merged_cuts:
            text += (
                f"; no bucket could start at {facts.merged_cuts} of the cuts, so those pieces were merged "
                f"({facts.num_pieces} pieces remain)"
            )
        notes.append(PlanNote(text, once=True))
    if facts.aligned and facts.alignment == READY_GROUPS:
        text = (
            "goddp: the parameters span several (dtype, device) groups, which DDP buckets apart against "
            "the same caps, so goddp gives every group's j-th bucket cap j; a group's bucket that no such cap "
            "closes at a cut is launched after every closed one (docs/limits.md)"
        )
        if facts.merged_cuts:
            text += (
                f"; no group's bucket closes at {facts.merged_cuts} of the cuts (each runs on to a later cut or "
                "stays open; the pieces stay)"
            )
        notes.append(PlanNote(text, once=True))
    return notes
