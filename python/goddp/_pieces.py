"""Compiling the pieces of one cut graph: the per-piece helpers.

torch's DDPOptimizer (torch/_dynamo/backends/distributed.py) keeps its
per-submodule compilation apart from its coordinator; so does goddp. Here:
each piece's example inputs, the compile loop, and the two settings that
must hold while pieces compile (aot_autograd's per-piece forward metadata,
Inductor's output strides).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import fx

from goddp._cut import Piece
from goddp._export import example_value

logger = logging.getLogger("goddp")

# What may cross a cut: the inner compilers take tensors and symbolic
# scalars only.
CROSSING_TYPES = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


class PieceCompileError(Exception):
    """The inner compiler failed on one piece (the cause is chained)."""


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
    inner: Callable[..., Any], pieces: Sequence[Piece], piece_inputs: Sequence[Sequence[Any]]
) -> list[Callable[..., Any]]:
    """Compiles each piece with inner, in forward order. Raises
    PieceCompileError naming the piece, with the inner compiler's exception
    as its cause; the settings below are restored either way."""
    compiled = []
    with inductor_keeps_output_strides(), piece_metadata_tracking() as after_piece:
        for piece, inputs in zip(pieces, piece_inputs):
            try:
                compiled.append(inner(piece.gm, inputs))
            except Exception as exc:
                raise PieceCompileError(f"compiling piece {piece.index} of {len(pieces)} failed") from exc
            after_piece()
    return compiled


def log_pieces(pieces: Sequence[Piece]) -> None:
    if not logger.isEnabledFor(logging.DEBUG):
        return
    for piece in pieces:
        logger.debug("goddp: piece %d graph:\n%s", piece.index, piece.gm.graph)


@contextlib.contextmanager
def piece_metadata_tracking() -> Iterator[Callable[[], None]]:
    """Keeps one forward-metadata entry per piece on Dynamo's TracingContext.

    aot_autograd compiles each piece's backward lazily, at the first backward,
    in reverse piece order, and reads the forward metadata from the tracing
    context; with several pieces under one Dynamo graph that would be the
    last piece's. torch provides DDPOptimizerContext for exactly this (one
    Dynamo graph, many aot graphs), and goddp fills it the same way.
    Yields a function to call after each piece compiles. On an exception the
    context is restored so a whole-graph fallback compiles cleanly.
    """
    tracing = torch._guards.TracingContext.try_get()
    context_cls = None
    if tracing is not None and hasattr(tracing, "ddp_optimizer_ctx"):
        try:
            from torch._dynamo.backends.distributed import DDPOptimizerContext as context_cls
        except ImportError:
            context_cls = None
    if context_cls is None:
        yield lambda: None
        return

    previous_ctx = tracing.ddp_optimizer_ctx
    previous_meta = tracing.fw_metadata
    per_piece = context_cls()
    tracing.ddp_optimizer_ctx = per_piece
    last_seen = [previous_meta]

    def after_piece() -> None:
        meta = tracing.fw_metadata
        if meta is not None and meta is not last_seen[0]:
            per_piece.curr_bucket += 1
            per_piece.metadata_per_bucket.append(meta)
            last_seen[0] = meta

    try:
        yield after_piece
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
