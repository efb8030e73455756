"""goddp.measure: the measurement hooks of the benchmarks (bench/).

Benchmarks drive goddp through its public API (``goddp.backend``,
``goddp.last_plans()``, ``goddp.trace``). What they need beyond it is here,
and bench/ imports nothing else of goddp's. Each hook is a documented
benchmark switch or probe: off until a benchmark turns it on, and checked, so
that when the code it reaches into moves the hook raises MeasureHookError
instead of letting a benchmark measure something else.
tests/python/package/test_measure.py exercises every hook and checks that bench/
imports no other goddp name.

- ``PieceReuseOff``: compile every piece on its own, even where block cuts
  found identical pieces that goddp would compile once (what the inner
  compiler's own caches give instead; bench.compile_overhead's
  ``goddp_each``).
- ``PieceRanges(mode)``: the stitched callables goddp builds meanwhile name
  their pieces in profiler traces as mode says: "off", never (the stitched
  loop without Note [Piece ranges] in goddp.tools.ranges); "always", even
  with no profiler recording (what the ranges would cost ungated);
  bench.range_cost measures both beside what goddp does.
- ``first_use_nodes(gm)``: each parameter's first using node, as the
  planner counts nodes (bench.declaration_order).
- ``plan_exchange(...)``: one round of the cross-rank exchange the plan
  check makes at a DDP module's first training step (bench.agreement_cost,
  bench.round_scale).
- ``timeline(request)``: the planner's timeline model of a step
  (goddp_timeline, Note [Timeline] in planner/timeline.go), JSON-shaped in
  and out (bench.simulate).
- ``ddp_starts(sizes)``, ``DDP_CAP``, ``DDP_FIRST_CAP``: DDP's default
  buckets over gradients in ready order, as goddp.trace's prediction
  draws them (bench.simulate).
- ``MIB``: bytes per MiB, as goddp's caps count them.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Sequence

from torch import fx

from goddp.compile import pipeline
from goddp.graph import blocks, stitch
from goddp.graph.export import export_graph
from goddp.graph.nodes import is_compute
from goddp.native import extension
from goddp.options import MIB
from goddp.ranks.group import Group
from goddp.ranks.layout import Layout
from goddp.ranks.store_round import exchange
from goddp.ranks.verdict import Statement
from goddp.tools import ranges
from goddp.tracing.prediction import DDP_CAP, DDP_FIRST_CAP, ddp_starts  # noqa: F401 (hooks for bench/)


class MeasureHookError(RuntimeError):
    """A measurement hook no longer reaches what it switches or reads."""


class _Switch:
    """A benchmark switch: while on, module.name (a function goddp's code
    calls through that global) is replaced by self._replacement. A subclass
    names the module, the global, where the function it must still be is
    defined (home, a module with the same name), and the two
    MeasureHookError texts: moved (on() finds the call gone) and unused
    (check_used() after no call while on)."""

    module: types.ModuleType
    name: str
    home: types.ModuleType
    moved: str
    unused: str

    def __init__(self) -> None:
        self.calls = 0
        self._saved: Callable[..., Any] | None = None

    def on(self) -> Any:
        target = getattr(self.module, self.name, None)
        if target is not getattr(self.home, self.name) or not _module_calls(self.module, self.name):
            raise MeasureHookError(self.moved)
        if self._saved is None:
            self._saved = target
            setattr(self.module, self.name, self._replacement)
        return self

    def off(self) -> None:
        if self._saved is not None:
            setattr(self.module, self.name, self._saved)
        self._saved = None

    def check_used(self) -> None:
        if self.calls == 0:
            raise MeasureHookError(self.unused)

    def _replacement(self, *args: Any) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self.on()

    def __exit__(self, *exc: Any) -> None:
        self.off()


class PieceReuseOff(_Switch):
    """While on, every piece goddp compiles gets its own inner compile: the
    grouping of identical pieces (goddp.graph.blocks.group_pieces, as the
    compile pipeline calls it) puts each piece in a group of its own. Eager
    edge pieces stay eager. Plans, cuts and buckets do not change.

        with measure.PieceReuseOff() as switch:
            compiled(*inputs)          # the first call compiles
        switch.check_used()            # raises unless goddp grouped pieces through it

    ``on()`` / ``off()`` do the same for a whole process. ``on()`` raises
    MeasureHookError when the pipeline no longer groups pieces through that
    function; ``check_used()`` when it was not called while on (so the
    switch had no effect on what was measured).
    """

    module, name, home = pipeline, "group_pieces", blocks
    moved = (
        "goddp.measure.PieceReuseOff: goddp.compile.pipeline no longer groups identical pieces "
        "through goddp.graph.blocks.group_pieces; move this hook to where the grouping is now"
    )
    unused = (
        "goddp.measure.PieceReuseOff was on, but goddp never grouped pieces through it: what was "
        "measured is not goddp without piece reuse (no block cuts, or the grouping moved)"
    )

    def _replacement(self, signatures: Sequence[Any]) -> list[int]:
        self.calls += 1
        return list(range(len(signatures)))


class PieceRanges(_Switch):
    """While on, each stitched callable goddp builds (goddp.graph.stitch,
    through goddp.tools.ranges.piece_ranges) ranges its pieces as mode says:
    "off", never (no ranged steps: the plain loop, without even the check
    whether a profiler records); "always", on every call, profiler or not.
    Plans, pieces and compiled code do not change.

        with measure.PieceRanges("off") as switch:
            compiled(*inputs)          # the first call compiles and stitches
        switch.check_used()            # raises unless goddp stitched through it

    ``on()`` raises MeasureHookError when the stitcher no longer asks
    piece_ranges for its ranged steps; ``check_used()`` when nothing was
    stitched while on.
    """

    MODES = ("off", "always")
    module, name, home = stitch, "piece_ranges", ranges
    moved = (
        "goddp.measure.PieceRanges: goddp.graph.stitch no longer makes its ranged steps through "
        "goddp.tools.ranges.piece_ranges; move this hook to where they are made now"
    )
    unused = (
        "goddp.measure.PieceRanges was on, but goddp stitched no pieces through it: what was measured "
        "is not goddp with its ranges switched (no cut graph, or the stitcher moved)"
    )

    def __init__(self, mode: str) -> None:
        if mode not in self.MODES:
            raise ValueError(f"goddp.measure.PieceRanges: mode must be one of {self.MODES}, got {mode!r}")
        super().__init__()
        self.mode = mode

    def _replacement(self, steps: Sequence[tuple], labels: Sequence[str] | None) -> Any:
        self.calls += 1
        made = None if self.mode == "off" or self._saved is None else self._saved(steps, labels)
        return None if made is None else dataclasses.replace(made, wanted=lambda: True)


def _module_calls(module: types.ModuleType, name: str) -> bool:
    """Whether some function or method defined in module refers to the
    global name."""

    def codes(obj: Any):
        if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
            yield obj.__code__
        elif isinstance(obj, type) and obj.__module__ == module.__name__:
            for member in vars(obj).values():
                yield from codes(member)

    def names(code: types.CodeType):
        yield from code.co_names
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from names(const)

    return any(name in names(code) for obj in vars(module).values() for code in codes(obj))


def first_use_nodes(gm: fx.GraphModule) -> dict[str, int]:
    """Parameter name -> index (in goddp's export of gm, the planner's node
    order) of the first node that uses it and does work (neither placeholder
    nor output, as the planner counts nodes). Names are the DDP module's
    parameter names, recovered from Dynamo's sources."""
    exported = export_graph(gm)
    arrays = exported.arrays
    offsets, params = arrays["node_param_offsets"], arrays["node_params"]
    first: dict[str, int] = {}
    for i, node in enumerate(exported.nodes):
        if not is_compute(node):
            continue
        for k in range(offsets[i], offsets[i + 1]):
            first.setdefault(exported.param_names[params[k]], i)
    return first


def plan_exchange(
    store: Any, key: str, rank: int, ranks: Sequence[int], timeout_s: float = 60.0,
    fingerprint: int = 0x1234_5678_9ABC_DEF0,
) -> Callable[[], dict[int, str]]:
    """A callable that runs one round of the exchange goddp's plan check makes
    at a DDP module's first training step (goddp.ranks.store_round): every
    rank in ranks publishes a statement of the size a typical layout makes
    (six buckets of four parameters, 1 MiB caps) under key in the c10d
    store and waits, at most timeout_s, for the others'. Returns each rank's
    statement. Every rank must call it the same number of times.
    fingerprint: the plan this rank states (for the record); ranks given
    different ones make statements that differ (bench.round_scale's
    --differ)."""
    group = Group(name=f"measure:{key}", ranks=tuple(ranks), rank=rank, timeout_s=timeout_s)
    layout = Layout(tuple(tuple(range(4 * b, 4 * b + 4)) for b in range(6)), (MIB,) * 6, "ready", "goddp.measure")
    payload = Statement(layout=layout, digest=0x0123_4567_89AB_CDEF, fingerprint=fingerprint, pieces=6).to_json()
    # The round alone: its decision is every rank's statement (the digest is
    # made up, so goddp.ranks.verdict would refuse the layout).
    return lambda: exchange(store, key, group, payload, dict)


__all__ = ["MIB", "MeasureHookError", "PieceRanges", "PieceReuseOff", "first_use_nodes", "plan_exchange"]


def timeline(request: dict[str, Any]) -> dict[str, Any]:
    """The planner's timeline model (Note [Timeline]): predicts a step, or
    with no boundaries given chooses them; see docs/planner.md."""
    return extension.timeline(request)
