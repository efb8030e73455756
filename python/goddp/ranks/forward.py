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
   graphs into one layout in the Go planner (``combine_forward``,
   planner/forward.go: the later graph's buckets first, since DDP's backward
   runs it first; a parameter of several graphs counted in the earliest),
   and the ranks install it on all of them or on none, before any of that
   step's allreduces. DDP rebuilds its buckets after that step's backward,
   so they close at the cuts of every graph from the step after.
3. A graph that first runs after that (a branch taken at step 3) follows the
   decision and never re-buckets training: it runs its own pieces inside
   DDP's buckets, which may then straddle its cuts (less overlap, the same
   gradients); its plan record says so.

Forwards are told apart by a forward pre-hook on the DDP module that counts
its grad-enabled calls; every rank of a DDP module runs the same number of
them, so the second agreement comes at the same call on every rank, however
each rank's graphs look. The hook is removed once the module has decided.
A graph holding no parameter of DDP's is never part of a forward's record
(goddp.compile.pipeline compiles it whole, with no gate).

What stays alone: DDP with ``find_unused_parameters=True`` (its buckets
follow declaration order, never rebuilt); forwards whose graphs between them
miss some of DDP's parameters (DDP buckets those too); a forward where some
graph fell back or cannot align (goddp.ddp.refusals); ranks whose
combined layouts differ (every rank keeps DDP's buckets, one WARNING).
"""

from __future__ import annotations

import array
import dataclasses
import logging
import weakref
from typing import Any, Callable

import torch

from goddp.native import extension as _native
from goddp.ranks.layout import Layout, build_id

logger = logging.getLogger("goddp")

FORWARDS_ATTR = "_goddp_forwards"


@dataclasses.dataclass
class Member:
    """One graph of the recorded forward: its aligned layout (or why it has
    none), how to name it, and how to report to its plan record."""

    layout: Layout | None
    reason: str | None
    describe: str
    report: Callable[[dict[str, Any], dict[str, Any]], None]
    note: Callable[[dict[str, Any]], None]


@dataclasses.dataclass
class ForwardRecord:
    forward: int
    members: list[Member] = dataclasses.field(default_factory=list)
    keys: set[int] = dataclasses.field(default_factory=set)
    hook: Any = None


_records: "weakref.WeakKeyDictionary[Any, ForwardRecord]" = weakref.WeakKeyDictionary()


@torch.compiler.disable
def _count_forward(module: Any, args: Any) -> None:
    if torch.is_grad_enabled():
        module.__dict__[FORWARDS_ATTR] = module.__dict__.get(FORWARDS_ATTR, 0) + 1


def forwards(ddp: Any) -> int:
    """How many grad-enabled forwards of ddp the hook has counted."""
    return ddp.__dict__.get(FORWARDS_ATTR, 0)


def start(ddp: Any) -> None:
    """Starts recording ddp's forward (inside it: the hook counts the next)."""
    if ddp in _records:
        return
    hook = ddp.register_forward_pre_hook(_count_forward)
    _records[ddp] = ForwardRecord(forward=forwards(ddp), hook=hook)


def in_recorded_forward(ddp: Any) -> bool:
    record = _records.get(ddp)
    return record is not None and record.forward == forwards(ddp)


def join(ddp: Any, key: int, member: Member) -> None:
    """Adds a graph (key: its gate's id) to the recorded forward, once."""
    record = _records[ddp]
    if key not in record.keys:
        record.keys.add(key)
        record.members.append(member)


def finish(ddp: Any) -> list[Member]:
    """Ends the recording: the members, in call order; removes the hook."""
    record = _records.pop(ddp, None)
    if record is None:
        return []
    if record.hook is not None:
        record.hook.remove()
    ddp.__dict__.pop(FORWARDS_ATTR, None)
    return record.members


def combine(members: list[Member], param_bytes: list[int]) -> tuple[Layout | None, str | None, dict[str, Any]]:
    """The one layout for the members (Note [Graphs of one forward]), or
    None and why; and what to record of it. param_bytes: the byte size of
    each of DDP's parameters, by DDP position."""

    info: dict[str, Any] = {"graphs": [m.describe for m in members]}
    missing = [m for m in members if m.layout is None]
    if missing:
        return None, f"a graph of the forward has no layout to combine ({missing[0].describe}: {missing[0].reason})", info
    if {m.layout.order for m in members} != {"ready"}:
        return None, "the forward's graphs are bucketed in declaration order, which DDP never rebuilds", info
    graph_offsets, bucket_offsets, params = [0], [0], []
    for m in members:
        for bucket in m.layout.buckets:
            params.extend(bucket)
            bucket_offsets.append(len(params))
        graph_offsets.append(len(bucket_offsets) - 1)
    try:
        reply = _native.combine_forward(
            array.array("q", param_bytes),
            array.array("q", graph_offsets),
            array.array("q", bucket_offsets),
            array.array("i", params),
        )
    except _native.load().PlannerError as exc:
        text = str(exc).strip().splitlines()
        return None, text[0] if text else type(exc).__name__, info
    caps = array.array("q", reply["ddp_caps"]).tolist()
    offsets = array.array("q", reply["bucket_param_offsets"]).tolist()
    positions = array.array("i", reply["bucket_params"]).tolist()
    buckets = tuple(tuple(positions[offsets[k] : offsets[k + 1]]) for k in range(len(caps)))
    info.update(
        bucket_graphs=array.array("i", reply["bucket_graphs"]).tolist(),
        moved=reply["moved"],
        dropped=reply["dropped"],
    )
    return Layout(buckets=buckets, caps=tuple(caps), order="ready", build=build_id()), None, info
