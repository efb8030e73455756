"""Repeated module blocks: compiling each distinct piece once.

Models built from repeated blocks (transformer layers) give pieces that are
the same graph when goddp cuts at block boundaries. The planner finds the
blocks from each node's module stack (planner/modstack.go, Note [Block
rule]), cuts at them (planner/blocks.go) and picks the edge pieces that run
eagerly (planner/edges.go, Note [Edges]). What needs torch objects is here:

- ``piece_signature``: a key that is equal for two pieces exactly when one
  compiled callable can serve both: same nodes, targets, constants and
  wiring, and same input metadata, names aside.

Why reuse the compiled callable rather than make the pieces' code identical
and let Inductor's caches hit: reuse skips AOTAutograd's tracing and
partitioning and Inductor's lowering of every repeat, works with caches
off, and costs nothing at run time, since every call of an aot_autograd
callable creates its own autograd node (gradients stay per piece). The
one shared state is the per-piece forward metadata that aot_autograd's lazy
backward compile reads (``backward_order``; see Note [Backward metadata] in
goddp.compile.pieces).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx, nn

from goddp.graph import checkpoints as _checkpoints
from goddp.graph.nodes import resolve_attr

# --------------------------------------------------------------------------
# Piece identity


class _Unshareable(Exception):
    """A piece holds something whose equality cannot be judged safely."""


def _canonical(value: Any, index: dict[fx.Node, int]) -> Any:
    if isinstance(value, fx.Node):
        return ("node", index[value])
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_canonical(v, index) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _canonical(v, index)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _canonical((value.start, value.stop, value.step), index))
    if isinstance(value, torch.Tensor):
        # A tensor constant baked into the graph: shared only if it is the
        # very same tensor.
        return ("tensor", id(value))
    if value is None or isinstance(value, (bool, int, float, str, complex, torch.dtype, torch.device,
                                           torch.layout, torch.memory_format)):
        return (type(value).__name__, value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(value))
    try:
        hash(value)
    except TypeError:
        raise _Unshareable(f"argument of type {type(value).__name__}") from None
    return ("object", type(value).__qualname__, value)


def _input_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (
            "tensor",
            isinstance(value, nn.Parameter),
            tuple(str(s) for s in value.shape),
            tuple(str(s) for s in value.stride()),
            str(value.storage_offset()),
            value.dtype,
            value.device,
            value.layout,
            value.requires_grad,
            value.is_leaf,
            value._is_view(),
        )
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", type(value).__name__, str(value))
    return ("value", type(value).__name__, value)


def _target_key(gm: fx.GraphModule, node: fx.Node) -> Any:
    """What a node's target contributes to its piece's signature: a body
    (a GraphModule attribute: a checkpoint's) by its structure, recursively
    (Note [Checkpoint bodies]); other attributes and submodules by identity."""
    if node.op == "get_attr":
        value = resolve_attr(gm, str(node.target))
        if isinstance(value, fx.GraphModule):
            return ("body", _checkpoints.graph_key(value, _canonical, _target_key))
        return ("attr", id(value))
    if node.op == "call_module":
        return ("module", id(gm.get_submodule(str(node.target))))
    return node.target


def piece_signature(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple | None:
    """A hashable key, equal for pieces that one compiled callable can serve,
    or None when this piece must be compiled on its own.

    The key covers every node's op, target and arguments (other nodes by
    position, constants by value), attribute and submodule references by
    object identity (so pieces that read different parameters through
    get_attr never match), and each example input's metadata (shape,
    strides, dtype, device, grad requirement, whether it is a parameter),
    plus which inputs are the same object. Node names are left out: they
    differ from block to block. A checkpoint's body counts by its structure
    and its checkpoint policy (see _target_key).
    """
    try:
        entries, _ = _checkpoints.node_entries(gm, _canonical, _target_key)
        first_seen: dict[int, int] = {}
        inputs = []
        for i, value in enumerate(example_inputs):
            same = first_seen.setdefault(id(value), i)
            inputs.append((_input_meta(value), same))
        key = (entries, tuple(inputs))
        hash(key)
    except (_Unshareable, TypeError, AttributeError, RuntimeError):
        return None
    return key


def group_pieces(signatures: Sequence[tuple | None]) -> list[int]:
    """For each piece, the index of the first piece with the same signature
    (itself when it is the first, or when its signature is None)."""
    first: dict[tuple, int] = {}
    leaders = []
    for i, sig in enumerate(signatures):
        leaders.append(i if sig is None else first.setdefault(sig, i))
    return leaders


def backward_order(leaders: Sequence[int]) -> list[int]:
    """The compiled callables (named by their leader piece) in the order in
    which aot_autograd will compile their backward: backward runs the pieces
    last to first and compiles a callable's backward at its first backward
    call, i.e. at the callable's last piece in forward order (why it
    matters: see Note [Backward metadata] in goddp.compile.pieces).
    """
    last: dict[int, int] = {}
    for piece, leader in enumerate(leaders):
        last[leader] = piece
    return sorted(last, key=lambda leader: last[leader], reverse=True)
