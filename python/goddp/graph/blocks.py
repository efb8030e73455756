"""Repeated module blocks: finding them in a Dynamo graph, and compiling
each distinct piece once.

Models built from repeated blocks (transformer layers) give pieces that are
the same graph when goddp cuts at block boundaries (the planner does that,
see planner/blocks.go). Two facts are gathered here:

- ``block_ids``: per node, which instance of a repeated block it belongs to,
  read from Dynamo's ``node.meta["nn_module_stack"]``;
- ``piece_signature``: a key that is equal for two pieces exactly when one
  compiled callable can serve both: same nodes, targets, constants and
  wiring, and same input metadata, names aside.

Why reuse the compiled callable rather than make the pieces' code identical
and let Inductor's caches hit: reuse skips AOTAutograd's tracing and
partitioning and Inductor's lowering of every repeat, works with caches
off, and costs nothing at run time, since every call of an aot_autograd
callable creates its own autograd node (gradients stay per piece). The
one shared state is the per-piece forward metadata that aot_autograd's lazy
backward compile reads from DDPOptimizerContext (see ``backward_order``).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import torch
from torch import fx, nn

from goddp.graph.nodes import is_compute, resolve_attr

# A module path that ends in an index: "L['self'].blocks.3" or "...blocks[3]".
_INDEXED_PATH = re.compile(r"^(?P<parent>.+?)(?:\.(?P<dot>\d+)|\[(?P<bracket>\d+)\])$")

# A block must span at least this many compute nodes per instance on
# average: a repeated nn.Linear (one node) is a layer, not a block, and a
# piece per Linear would only add per-piece overhead.
MIN_BLOCK_NODES = 2


def _type_key(kind: Any) -> str:
    if isinstance(kind, type):
        return f"{kind.__module__}.{kind.__qualname__}"
    return str(kind)


def _stack_entries(node: fx.Node) -> list[tuple[tuple[str, str], str]]:
    """((parent path, type), path) for each indexed module on node's module
    stack, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    entries = []
    for value in stack.values():
        try:
            path, kind = value[0], value[1]
        except (TypeError, IndexError):
            continue
        match = _INDEXED_PATH.match(str(path))
        if match is not None:
            entries.append(((match.group("parent"), _type_key(kind)), str(path)))
    return entries


def block_ids(nodes: Sequence[fx.Node]) -> list[int]:
    """Per node, the repeated block instance it belongs to (numbered in order
    of first appearance), or -1.

    A repeated block is a module reached by index from a container
    (``blocks.0``, ``blocks.1``, ...) whose siblings of the same type also
    appear in the graph: at least two instances, spanning at least
    MIN_BLOCK_NODES compute nodes each on average. A node belongs to the
    outermost such module on its stack. Placeholders and the output belong
    to none. Only graph facts are used, so every rank numbers alike.
    """
    stacks: list[list[tuple[tuple[str, str], str]]] = []
    members: dict[tuple[str, str], dict[str, int]] = {}
    for node in nodes:
        if not is_compute(node):
            stacks.append([])
            continue
        entries = _stack_entries(node)
        stacks.append(entries)
        for key, path in entries:
            counts = members.setdefault(key, {})
            counts[path] = counts.get(path, 0) + 1
    repeated = {
        key
        for key, counts in members.items()
        if len(counts) >= 2 and sum(counts.values()) >= MIN_BLOCK_NODES * len(counts)
    }
    numbers: dict[str, int] = {}
    result = []
    for entries in stacks:
        block = -1
        for key, path in entries:
            if key in repeated:
                block = numbers.setdefault(path, len(numbers))
                break
        result.append(block)
    return result


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


def piece_signature(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> tuple | None:
    """A hashable key, equal for pieces that one compiled callable can serve,
    or None when this piece must be compiled on its own.

    The key covers every node's op, target and arguments (other nodes by
    position, constants by value), attribute and submodule references by
    object identity (so pieces that read different parameters through
    get_attr never match), and each example input's metadata (shape,
    strides, dtype, device, grad requirement, whether it is a parameter),
    plus which inputs are the same object. Node names are left out: they
    differ from block to block.
    """
    index: dict[fx.Node, int] = {}
    entries: list[Any] = []
    try:
        for i, node in enumerate(gm.graph.nodes):
            index[node] = i
            if node.op == "placeholder":
                entries.append(("placeholder",))
                continue
            if node.op == "get_attr":
                target: Any = ("attr", id(resolve_attr(gm, str(node.target))))
            elif node.op == "call_module":
                target = ("module", id(gm.get_submodule(str(node.target))))
            else:
                target = node.target
            entries.append((node.op, target, _canonical(node.args, index), _canonical(node.kwargs, index)))
        first_seen: dict[int, int] = {}
        inputs = []
        for i, value in enumerate(example_inputs):
            same = first_seen.setdefault(id(value), i)
            inputs.append((_input_meta(value), same))
        key = (tuple(entries), tuple(inputs))
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
    call, i.e. at the callable's last piece in forward order.

    DDPOptimizerContext hands out forward metadata by a counter that goes
    down by one per backward compile; goddp lists the metadata in the
    reverse of this order so that each backward compile gets its own.
    """
    last: dict[int, int] = {}
    for piece, leader in enumerate(leaders):
        last[leader] = piece
    return sorted(last, key=lambda leader: last[leader], reverse=True)


# --------------------------------------------------------------------------
# Edges
#
# A graph with repeated blocks has, outside them, a preamble before the first
# block (embeddings) and a tail after the last (final norm, head); the pieces
# that lie wholly there are its edges (with block cuts, at most two). Each is
# a distinct graph, so compiling it costs about what compiling a block does
# (on CPU most of it is the C++ compiler, once per kernel of forward and
# backward), while it runs once per step against the blocks' many. Regional
# compilation, the alternative users weigh goddp against, runs them eagerly
# for that reason. goddp does too, by default, for an edge no bigger than the
# mean block (in compute nodes); a larger edge holds enough work for the inner
# compiler's fusion to matter, and is compiled. Node counts do not weigh cost:
# a large-vocabulary head is a few nodes and runs eagerly, which costs little
# since its matmul is an extern kernel either way. README.md ("Repeated
# blocks: compile time against depth") has the measurement. Running a piece
# eagerly changes nothing DDP communicates, so ranks need not agree on it.


def edge_pieces(
    nodes: Sequence[fx.Node],
    node_blocks: Sequence[int] | None,
    node_pieces: Sequence[int],
    policy: str,
) -> list[int]:
    """The pieces to run eagerly under option ``edges`` (policy: "auto",
    "compile" or "eager"), ascending: the pieces whose compute nodes all lie
    before the first node of a repeated block or after the last, in a graph
    that has repeated blocks (node_blocks, per node, from block_ids; None
    when it has none); "auto" keeps only those no bigger than the mean
    block. node_pieces is each node's piece (-1 for none)."""
    if policy == "compile" or node_blocks is None:
        return []
    in_block = [i for i, (node, block) in enumerate(zip(nodes, node_blocks)) if block >= 0 and is_compute(node)]
    if not in_block:
        return []
    first, last = in_block[0], in_block[-1]
    block_size: dict[int, int] = {}
    piece_size: dict[int, int] = {}
    inside: set[int] = set()
    for i, (node, block, piece) in enumerate(zip(nodes, node_blocks, node_pieces)):
        if piece < 0 or not is_compute(node):
            continue
        piece_size[piece] = piece_size.get(piece, 0) + 1
        if block >= 0:
            block_size[block] = block_size.get(block, 0) + 1
        if first <= i <= last:
            inside.add(piece)
    edges = sorted(p for p in piece_size if p not in inside)
    if policy == "eager":
        return edges
    mean_block = sum(block_size.values()) / len(block_size)
    return [p for p in edges if piece_size[p] <= mean_block]
