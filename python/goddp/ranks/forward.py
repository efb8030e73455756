"""One DDP bucket layout for the graphs of a forward (a graph break splits
DDP's parameters over several Dynamo graphs).

Note [Graphs of one forward]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A graph break (``print()``, ``torch._dynamo.graph_break()``, a branch on
``.item()``) makes Dynamo compile one forward as several graphs; goddp cuts
each, but no single graph holds all of DDP's parameters, so no single plan
can give DDP caps. goddp plans the graphs of the module's first training
forward together:

1. At the module's first training call (the first graph's), every rank
   whose graph holds only part of DDP's parameters says so (a Statement with
   ``later=True``), and the ranks decide LATER on every rank alike
   (goddp.ranks.agreement, Note [Agreeing on DDP's layout]). Each rank then
   records, in call order, every graph whose first training call falls in
   that same forward, with its aligned buckets (by DDP position).
2. At the module's next training forward, the first call of any of its
   graphs holds the second agreement: each rank combines its recorded
   graphs into one layout (``combine``: a graph without a layout, or in
   declaration order, refuses the whole forward; the combining is the Go
   planner's, ``goddp_combine_forward`` in planner/forward.go: the later
   graph's buckets first, since DDP's backward runs it first; a parameter
   of several graphs counted in the earliest; with parameters of several
   (dtype, device) groups each graph keeps its buckets whole and the
   combined ones are split by group, cap j every group's j-th bucket's:
   Note [Several dtype groups] in planner/keys.go),
   and the ranks install it on all of them or on none, before any of that
   step's allreduces. DDP rebuilds its buckets after that step's backward,
   so they close at the cuts of every graph from the step after.
3. A graph that first runs after that (a recompile of a resume frame, a
   branch taken at step 3) follows the decision and never re-buckets
   training: it is cut where the installed buckets close where its
   parameters are a part of them (Note [A later graph's part of the layout]
   in goddp.ranks.layout), else it runs its own pieces inside DDP's
   buckets, which may then straddle its cuts (less overlap, the same
   gradients); its plan record says which.

Forwards are told apart by a forward pre-hook on the DDP module that counts
its grad-enabled calls; every rank of a DDP module runs the same number of
them, so the second agreement comes at the same call on every rank, however
each rank's graphs look. The hook is removed once the module has decided.
A graph holding no parameter of DDP's is never part of a forward's record
(goddp.compile.pipeline compiles it whole, with no gate).

What stays alone: DDP with ``find_unused_parameters=True`` (its buckets
follow declaration order, never rebuilt); forwards whose graphs between them
miss some of DDP's parameters (DDP buckets those too); a forward where some
graph fell back or cannot align (goddp.ddp.refusals); parameters of several
groups whose combined buckets would launch later than DDP's own
(groups_later, with the caps the graphs were planned with); ranks whose
combined layouts differ (every rank keeps DDP's buckets, one WARNING).
"""

from __future__ import annotations

import array
import dataclasses
import logging
import re
from typing import Any, Callable

import torch

from goddp.ddp.state import state_of
from goddp.native import extension as _native
from goddp.native.plan import not_aligned_words
from goddp.ranks.layout import Layout, build_id

logger = logging.getLogger("goddp")


@dataclasses.dataclass
class Member:
    """One graph of the recorded forward: its aligned layout (or why it has
    none), how to name it, how to report to its plan record, and the caps
    it was planned with (goddp.native.plan.PlanSettings: DDP's own, by
    which the combining weighs several groups' buckets)."""

    layout: Layout | None
    reason: str | None
    describe: str
    report: Callable[[dict[str, Any], dict[str, Any]], None]
    note: Callable[[dict[str, Any]], None]
    caps: Any = None


@dataclasses.dataclass
class ForwardRecord:
    """The recorded forward (a DDP module's state holds it while it runs):
    its members, and how many grad-enabled forwards began since."""

    members: list[Member] = dataclasses.field(default_factory=list)
    keys: set[int] = dataclasses.field(default_factory=set)
    forwards: int = 0
    hook: Any = None


@dataclasses.dataclass(frozen=True)
class Combined:
    """A forward's one layout and its digest, or why none (reason); what the
    plan records keep of it (info); and the INFO line that says so."""

    layout: Layout | None
    digest: int | None
    reason: str | None
    info: dict[str, Any]
    note: str


@torch.compiler.disable
def _count_forward(module: Any, args: Any) -> None:
    record = state_of(module).forward
    if record is not None and torch.is_grad_enabled():
        record.forwards += 1


def start(ddp: Any) -> None:
    """Starts recording ddp's forward (inside it: the hook counts the next)."""
    state = state_of(ddp)
    if state.forward is None:
        state.forward = ForwardRecord()
        state.forward.hook = ddp.register_forward_pre_hook(_count_forward)


def in_recorded_forward(ddp: Any) -> bool:
    record = state_of(ddp).forward
    return record is not None and record.forwards == 0


def join(ddp: Any, key: int, member: Member) -> None:
    """Adds a graph (key: its gate's id) to the recorded forward, once."""
    record = state_of(ddp).forward
    if key not in record.keys:
        record.keys.add(key)
        record.members.append(member)


def recorded(ddp: Any) -> list[Member]:
    """The members recorded so far, in call order (the recording goes on)."""
    record = state_of(ddp).forward
    return [] if record is None else list(record.members)


def finish(ddp: Any) -> list[Member]:
    """Ends the recording: the members, in call order; removes the hook."""
    state = state_of(ddp)
    record, state.forward = state.forward, None
    if record is None:
        return []
    record.hook.remove()
    return record.members


def shared(members: list[Member]) -> frozenset[int]:
    """The DDP positions that several members' layouts hold (a weight tied
    across a break: the combining counts it in the earliest graph)."""
    seen: set[int] = set()
    twice: set[int] = set()
    for m in members:
        held = set() if m.layout is None else {p for bucket in m.layout.buckets for p in bucket}
        twice |= seen & held
        seen |= held
    return frozenset(twice)


def combine(members: list[Member], parameters: list[Any]) -> Combined:
    """The one layout for the members (Note [Graphs of one forward]), or
    None and why, and the line that says so (Note [The agreement's lines] in
    goddp.ranks.verdict). parameters: DDP's parameters, by DDP position
    (``ddp_parameters``). Never raises: a rank whose planner call fails
    still brings a statement (no layout, and why) to the round the other
    ranks hold, so that every rank keeps DDP's buckets alike."""
    try:
        return _Forward(members, parameters).combined()
    except Exception as exc:  # no layout: DDP's buckets serve, on every rank alike (see above)
        logger.debug("goddp: could not combine the forward's layouts", exc_info=True)
        why = f"could not combine the forward's layouts ({type(exc).__name__}: {exc})"
        return Combined(None, None, why, {"graphs": [m.describe for m in members]}, f"goddp: {why}")


class _Forward:
    """The steps of combine: refuse, combine, state the digest, say so."""

    def __init__(self, members: list[Member], parameters: list[Any]) -> None:
        self.members = members
        self.param_bytes = [p.numel() * p.element_size() for p in parameters]
        # Each parameter's (dtype, device) group, numbered by first
        # appearance in DDP's list: the same on every rank.
        groups: dict[tuple[Any, Any], int] = {}
        self.param_keys = [groups.setdefault((p.dtype, p.device), len(groups)) for p in parameters]
        self.info: dict[str, Any] = {"graphs": [m.describe for m in members]}

    def combined(self) -> Combined:
        layout, digest, refusal = None, None, self.refusal()
        if refusal is None:
            layout, refusal = self.layout()
        if layout is not None:
            try:
                digest = layout.digest()
            except _native.load().PlannerError as exc:
                layout, refusal = None, f"could not state DDP's layout (PlannerError: {exc})"
        how = f"DDP buckets {list(layout.caps)} bytes" if layout is not None else f"no layout: {refusal}"
        note = (
            f"goddp: planning the {len(self.members)} graph(s) of this DDP module's first training forward "
            f"together: {'; '.join(self.info['graphs'])}; {how}"
        )
        return Combined(layout, digest, refusal, self.info, note)

    def refusal(self) -> str | None:
        """Why the members cannot be combined, before looking at their
        buckets: a member without a layout (the first such), or an order
        other than "ready" (which also refuses a forward of no graph)."""
        for m in self.members:
            if m.layout is None:
                return f"a graph of the forward has no layout to combine ({m.describe}: {m.reason})"
        if not self.members or any(m.layout.order != "ready" for m in self.members):
            return "the forward's graphs are bucketed in declaration order, which DDP never rebuilds"
        return None

    def layout(self) -> tuple[Layout | None, str | None]:
        """The planner's combined layout ("ready" order, this build), or
        its refusal: the first line of its error."""
        graph_offsets, bucket_offsets, params = [0], [0], []
        for m in self.members:
            for bucket in m.layout.buckets:
                params.extend(bucket)
                bucket_offsets.append(len(params))
            graph_offsets.append(len(bucket_offsets) - 1)
        # The caps the members were planned with, DDP's own unless goddp's
        # options set others; none where they differ (no launch check).
        planned = {(c.bucket_cap_bytes, c.first_bucket_cap_bytes, c.bucket_caps_bytes)
                   for c in (m.caps for m in self.members) if c is not None}
        own = None
        if len(planned) == 1:
            cap, first, caps = planned.pop()
            own = {"bucket_cap_bytes": cap, "first_bucket_cap_bytes": first, "bucket_caps_bytes": list(caps)}
        try:
            reply = _native.combine_forward(
                array.array("q", self.param_bytes),
                array.array("q", graph_offsets),
                array.array("q", bucket_offsets),
                array.array("i", params),
                array.array("i", self.param_keys) if len(set(self.param_keys)) > 1 else None,
                own,
            )
        except _native.load().PlannerError as exc:
            return None, re.split(r"[\r\n]", str(exc).strip())[0] or "PlannerError"
        caps = array.array("q", reply["ddp_caps"]).tolist()
        offsets = array.array("q", reply["bucket_param_offsets"]).tolist()
        positions = array.array("i", reply["bucket_params"]).tolist()
        self.info.update(
            bucket_graphs=array.array("i", reply["bucket_graphs"]).tolist(),
            moved=reply["moved"],
            dropped=reply["dropped"],
            merged_cuts=reply["merged_cuts"],
        )
        if reply["groups_later"]:
            return None, not_aligned_words(_native.REASON_GROUPS_LATER)
        buckets = tuple(tuple(positions[offsets[k] : offsets[k + 1]]) for k in range(reply["num_buckets"]))
        return Layout(buckets=buckets, caps=tuple(caps), order="ready", build=build_id()), None
