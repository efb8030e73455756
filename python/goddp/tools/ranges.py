"""goddp's pieces and buckets as named ranges in torch.profiler traces.

Note [Piece ranges]: while a torch.profiler records (``profiling()``),
the stitched callable (goddp.graph.stitch) runs each piece through
``RangedPiece``, which names it in the trace: ``goddp piece 3 (block 1)
forward`` around the piece's call, and ``goddp piece 3 (block 1) backward``
around its backward. A compiled piece's backward is one autograd node (the
inner compiler's ``CompiledFunctionBackward``): the one node among the
outputs' ``grad_fn`` whose inputs are the piece's inputs (``_spans``). Its
pre-hook opens the range and its post-hook closes it, so the range is that
node's run exactly, and the allreduces DDP launches from the gradients'
accumulators right after it fall outside it. A piece run as many nodes (an
eager edge, an inner compiler without a single backward node) has no such
node: its range opens at the first of its outputs' nodes to run and closes
when the next piece's backward range opens or backward ends. A range is
opened and closed on the thread that runs the nodes (the autograd engine's,
for every node of one backward), with ``record_function`` used outside a
``with`` block.

Under goddp.trace each bucket's allreduce is a range as well, ``goddp
bucket 2 allreduce``, from the comm hook's launch to the completion of its
future (``allreduce_range``, from goddp.tracing.recorder's hook; torch's
process group adds its own ``gloo:all_reduce`` or ``nccl:all_reduce``
ranges with or without goddp.trace).

Cost with the profiler off: one ``torch.autograd._profiler_enabled()``
call per stitched call, and the plain loop runs (bench.range_cost measures
it against a stitched callable without ranges).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Sequence

import torch
from torch.autograd.profiler import record_function

# A C function: what torch's own record_function users test first.
profiling: Callable[[], bool] = torch.autograd._profiler_enabled


def piece_blocks(plan: Any, nodes: Sequence[Any]) -> list[list[int]]:
    """Per piece, the repeated blocks its nodes belong to (the planner's
    node_block_ids; [] outside any block, or without block cuts)."""
    blocks: list[set[int]] = [set() for _ in range(plan.num_pieces)]
    ids = plan.node_block_ids
    if ids is not None:
        for node, block in zip(nodes, ids):
            piece = plan.node_pieces.get(node.name)
            if block >= 0 and piece is not None:
                blocks[piece].add(block)
    return [sorted(b) for b in blocks]


def piece_label(index: int, blocks: Sequence[int]) -> str:
    """"goddp piece 3 (block 1)": the piece and its blocks."""
    if not blocks:
        return f"goddp piece {index}"
    if len(blocks) == 1:
        return f"goddp piece {index} (block {blocks[0]})"
    if list(blocks) == list(range(blocks[0], blocks[-1] + 1)):
        return f"goddp piece {index} (blocks {blocks[0]}-{blocks[-1]})"
    return f"goddp piece {index} (blocks {', '.join(map(str, blocks))})"


def piece_labels(plan: Any, nodes: Sequence[Any]) -> list[str]:
    """Each piece's label, in order (goddp.native.plan.GraphPlan, and the
    exported graph's nodes in the planner's order)."""
    return [piece_label(p, blocks) for p, blocks in enumerate(piece_blocks(plan, nodes))]


# --------------------------------------------------------------------------
# Backward ranges


class _Open(threading.local):
    span: "_Span | None" = None


# The open-ended range (a piece without one backward node) on this thread.
_open = _Open()


class _Span:
    """One backward range; begin and end take any hook arguments."""

    __slots__ = ("name", "open_ended", "record", "closed")

    def __init__(self, name: str, open_ended: bool) -> None:
        self.name = name
        self.open_ended = open_ended
        self.record: Any = None
        self.closed = False

    def begin(self, *unused: Any) -> None:
        if self.record is not None:  # another node of the same piece
            return
        previous = _open.span
        if previous is not None:
            previous.end()
        self.record = record_function(self.name).__enter__()
        if self.open_ended:
            _open.span = self
            torch.autograd.Variable._execution_engine.queue_callback(self.end)

    def end(self, *unused: Any) -> None:
        if self.record is None or self.closed:
            return
        self.closed = True
        if _open.span is self:
            _open.span = None
        self.record.__exit__(None, None, None)


def _spans(node: Any, input_nodes: set[int]) -> bool:
    """Whether node's inputs are the piece's inputs: their grad_fns, a
    leaf's accumulator, or nothing (no gradient)."""
    for nxt, _ in node.next_functions:
        if nxt is None or id(nxt) in input_nodes or hasattr(nxt, "variable"):
            continue
        return False
    return True


def _hook_backward(args: Sequence[Any], results: Sequence[Any], name: str) -> None:
    nodes: dict[int, Any] = {}
    for value in results:
        if isinstance(value, torch.Tensor) and value.grad_fn is not None:
            nodes.setdefault(id(value.grad_fn), value.grad_fn)
    if not nodes:
        return
    inputs = {id(a.grad_fn) for a in args if isinstance(a, torch.Tensor) and a.grad_fn is not None}
    whole = [n for n in nodes.values() if _spans(n, inputs)]
    if len(whole) == 1:
        span = _Span(name, open_ended=False)
        whole[0].register_prehook(span.begin)
        whole[0].register_hook(span.end)
        return
    span = _Span(name, open_ended=True)
    for node in nodes.values():
        node.register_prehook(span.begin)


class RangedPiece:
    """A piece's compiled callable, named in the profiler's trace (Note
    [Piece ranges])."""

    __slots__ = ("fn", "forward_name", "backward_name")

    def __init__(self, fn: Callable[..., Any], label: str) -> None:
        self.fn = fn
        self.forward_name = f"{label} forward"
        self.backward_name = f"{label} backward"

    def __call__(self, *args: Any) -> Any:
        with record_function(self.forward_name):
            results = self.fn(*args)
        if torch.is_grad_enabled():
            _hook_backward(args, results, self.backward_name)
        return results


@dataclasses.dataclass(frozen=True)
class Ranged:
    """The stitched steps with every piece a RangedPiece, and when to run
    them instead of the plain ones (while a profiler records)."""

    steps: tuple
    wanted: Callable[[], bool] = profiling


def piece_ranges(steps: Sequence[tuple], labels: Sequence[str] | None) -> Ranged | None:
    """The stitched callable's steps ((fn, gather, writes, releases) each)
    with each fn ranged under its piece's label; None without labels."""
    if labels is None:
        return None
    return Ranged(tuple((RangedPiece(fn, label), *rest) for (fn, *rest), label in zip(steps, labels)))


# --------------------------------------------------------------------------
# Bucket ranges (goddp.trace)


def allreduce_range(index: int, reduce: Callable[[], Any]) -> Any:
    """reduce()'s future, its launch to its completion named ``goddp bucket
    <index> allreduce`` while a profiler records."""
    if not profiling():
        return reduce()
    record = record_function(f"goddp bucket {index} allreduce").__enter__()
    try:
        future = reduce()
    except BaseException:
        record.__exit__(None, None, None)
        raise
    return record._call_end_callbacks_on_future(future)
