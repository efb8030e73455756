"""Compiling the pieces of one cut graph: the per-piece helpers.

torch's DDPOptimizer (torch/_dynamo/backends/distributed.py) keeps its
per-submodule compilation apart from its coordinator; so does goddp. Here:
each piece's example inputs, the compile loop (each distinct piece once),
and the two settings that must hold while pieces compile (aot_autograd's
per-piece forward metadata, Inductor's output strides).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import fx

from goddp.graph.blocks import backward_order
from goddp.graph.cut import Piece
from goddp.graph.nodes import example_value

try:
    from torch._dynamo.backends.distributed import DDPOptimizerContext
except ImportError:  # a torch without it: pieces keep Dynamo's one metadata entry
    DDPOptimizerContext = None

logger = logging.getLogger("goddp")

# What may cross a cut: the inner compilers take tensors and symbolic
# scalars only.
CROSSING_TYPES = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def piece_example_inputs(
    gm: fx.GraphModule, example_inputs: Sequence[Any], pieces: Sequence[Piece]
) -> list[list[Any]]:
    """Example inputs per piece: the graph's own example inputs for its
    placeholders, Dynamo's fake values (node.meta) for values from earlier
    pieces. Nothing is re-run under fake tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise RuntimeError(
            f"graph has {len(placeholders)} placeholders but {len(example_inputs)} example inputs"
        )
    known = dict(zip(placeholders, example_inputs))
    result = []
    for piece in pieces:
        values = []
        for node in piece.input_nodes:
            if node in known:
                values.append(known[node])
                continue
            value = example_value(node)
            if not isinstance(value, CROSSING_TYPES):
                # A tuple from a multi-output op whose getitems landed in a
                # later piece, for instance.
                raise RuntimeError(
                    f"value {node.name!r} of type {type(value).__name__} would cross a cut; "
                    "only tensors and scalars can"
                )
            values.append(value)
        result.append(values)
    return result


def compile_pieces(
    inner: Callable[..., Any],
    pieces: Sequence[Piece],
    piece_inputs: Sequence[Sequence[Any]],
    same_as: Sequence[int] | None = None,
    eager: Sequence[int] = (),
    guard: Callable[..., ContextManager[None]] | None = None,
) -> list[Callable[..., Any]]:
    """Compiles each piece with inner, in forward order; a piece whose
    same_as names an earlier piece reuses that piece's compiled callable
    (goddp.graph.blocks), and a piece in eager runs its GraphModule as it is
    (the edges, see Note [Edges] in planner/edges.go; an eager piece neither leads nor
    follows another). Logs a line per piece compiled or left eager at INFO.
    Each piece compiles inside ``guard("compile", piece=i, pieces=n)``
    (goddp.compile.fallback.Stages.guard: a failure names the piece); the
    settings below are restored either way."""
    guard = guard or _no_guard
    if same_as is None:
        same_as = list(range(len(pieces)))
    distinct = sum(1 for p, leader in enumerate(same_as) if p == leader and p not in eager)
    compiled: list[Callable[..., Any]] = []
    start = time.perf_counter()
    with inductor_keeps_output_strides(), piece_metadata_tracking() as metadata:
        for piece, inputs, leader in zip(pieces, piece_inputs, same_as):
            if leader != piece.index:
                compiled.append(compiled[leader])
                continue
            if piece.index in eager:
                compiled.append(piece.gm.forward)
                logger.info(
                    "goddp: piece %d (%d nodes) runs eagerly: it lies outside the repeated blocks "
                    "(option edges='compile' compiles it)",
                    piece.index,
                    len(piece.gm.graph.nodes),
                )
                continue
            piece_start = time.perf_counter()
            with guard("compile", piece=piece.index, pieces=len(pieces)):
                compiled.append(inner(piece.gm, inputs))
            metadata.after_compile(leader)
            uses = same_as.count(leader)
            logger.info(
                "goddp: compiled piece %d (%d of %d to compile, %d nodes%s) in %.1fs, %.1fs so far",
                piece.index,
                len(metadata.compiled),
                distinct,
                len(piece.gm.graph.nodes),
                f", used by {uses} pieces" if uses > 1 else "",
                time.perf_counter() - piece_start,
                time.perf_counter() - start,
            )
        metadata.finish(backward_order(same_as))
    return compiled


@contextlib.contextmanager
def _no_guard(stage: str, **details: Any) -> Iterator[None]:
    yield


def log_pieces(pieces: Sequence[Piece]) -> None:
    if not logger.isEnabledFor(logging.DEBUG):
        return
    for piece in pieces:
        logger.debug("goddp: piece %d graph:\n%s", piece.index, piece.gm.graph)


class PieceMetadata:
    """What piece_metadata_tracking yields: call after_compile(leader) after
    each compiled callable (named by its first piece), then finish(order)
    with the order in which their backwards will compile
    (goddp.graph.blocks.backward_order)."""

    def __init__(self, tracing: Any = None, per_piece: Any = None, previous_meta: Any = None) -> None:
        self._tracing = tracing
        self._per_piece = per_piece
        self._last_seen = previous_meta
        self._meta: dict[int, Any] = {}
        self.compiled: list[int] = []

    def after_compile(self, leader: int) -> None:
        self.compiled.append(leader)
        if self._per_piece is None:
            return
        meta = self._tracing.fw_metadata
        if meta is not None and meta is not self._last_seen:
            self._meta[leader] = meta
            self._last_seen = meta

    def finish(self, backward_order: Sequence[int]) -> None:
        # aot_autograd takes metadata_per_bucket[curr_bucket] at each lazy
        # backward compile and then counts down, so the list runs in the
        # reverse of the backward compile order.
        if self._per_piece is None:
            return
        metas = [self._meta[leader] for leader in reversed(backward_order) if leader in self._meta]
        self._per_piece.metadata_per_bucket = metas
        self._per_piece.curr_bucket = len(metas) - 1


@contextlib.contextmanager
def piece_metadata_tracking() -> Iterator[PieceMetadata]:
    """Keeps one forward-metadata entry per compiled callable on Dynamo's
    TracingContext.

    Note [Backward metadata]: aot_autograd compiles each piece's backward
    lazily, at the first backward, in reverse piece order, and reads the
    forward metadata from the tracing context; with several pieces under one
    Dynamo graph that would be the last piece's. torch provides
    DDPOptimizerContext for exactly this (one Dynamo graph, many aot graphs):
    it hands out entries by a counter that goes down by one per backward
    compile. goddp fills it, one entry per compiled callable (identical
    pieces share one callable, hence one backward compile), in the reverse
    of goddp.graph.blocks.backward_order, so that each backward compile gets
    its own. On an exception the context is restored so a whole-graph
    fallback compiles cleanly.
    """
    tracing = torch._guards.TracingContext.try_get()
    context_cls = None
    if tracing is not None and hasattr(tracing, "ddp_optimizer_ctx"):
        context_cls = DDPOptimizerContext
    if context_cls is None:
        yield PieceMetadata()
        return

    previous_ctx = tracing.ddp_optimizer_ctx
    previous_meta = tracing.fw_metadata
    per_piece = context_cls()
    tracing.ddp_optimizer_ctx = per_piece
    try:
        yield PieceMetadata(tracing, per_piece, previous_meta)
    except BaseException:
        tracing.ddp_optimizer_ctx = previous_ctx
        tracing.fw_metadata = previous_meta
        raise


@contextlib.contextmanager
def inductor_keeps_output_strides() -> Iterator[None]:
    """Pieces get Dynamo's (eager) strides as the example strides of values
    made by earlier pieces; Inductor honours them only with
    keep_output_stride (its default), so goddp keeps it on while compiling
    pieces."""
    config = sys.modules.get("torch._inductor.config")
    if config is None or getattr(config, "keep_output_stride", True):
        yield
        return
    logger.info("goddp: compiling pieces with torch._inductor.config.keep_output_stride=True")
    with config.patch(keep_output_stride=True):
        yield
