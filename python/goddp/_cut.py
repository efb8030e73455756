"""Cutting a graph into pieces along a plan.

Each piece's fx.Graph is built directly from the planner's partition map and
crossing values: one pass over the nodes, copying each into its piece with
``Graph.node_copy``. There is no split_module and no re-discovery of
dependencies in Python.

Two kinds of value never cross a cut even when the planner lists them:
- the context objects returned by ``_enter_autocast`` (not tensors): a piece
  that starts inside an autocast region enters it again itself and every
  piece leaves the regions it is inside before returning;
- ``get_attr`` values: a piece reads the attribute from the root module.

Grad mode works the same way: a piece that starts after a
``_set_grad_enabled`` node sets that mode first, and a piece that ends in a
mode other than the one the graph was entered with restores it, so that each
piece is self-contained and can be compiled on its own. The last piece ends
in whatever state the whole graph ends in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from goddp._export import ExportedGraph
from goddp._plan import GraphPlan


class CutError(RuntimeError):
    """The plan cannot be applied to the graph (a goddp bug, or a graph shape
    goddp does not support); the backend falls back to the whole graph."""


_SET_GRAD = torch._C._set_grad_enabled
_ENTER_AUTOCAST = torch.amp.autocast_mode._enter_autocast
_EXIT_AUTOCAST = torch.amp.autocast_mode._exit_autocast


def _is_call(node: fx.Node, target: Any) -> bool:
    return node.op == "call_function" and node.target is target


@dataclass
class Piece:
    """One piece: its GraphModule and the original nodes it reads and yields,
    in the order of its placeholders and of its output tuple."""

    index: int
    gm: fx.GraphModule
    input_nodes: list[fx.Node]
    output_nodes: list[fx.Node]


def _carries_value(node: fx.Node) -> bool:
    """Whether a node's value may be passed between pieces."""
    return node.op != "get_attr" and not _is_call(node, _ENTER_AUTOCAST)


def cut_graph(
    gm: fx.GraphModule,
    exported: ExportedGraph,
    plan: GraphPlan,
    *,
    entry_grad_enabled: bool,
) -> list[Piece]:
    """Builds one GraphModule per piece of plan. gm is not modified.

    entry_grad_enabled is the grad mode the graph runs under (the mode at
    compile time: Dynamo guards on it).
    """
    nodes = exported.nodes
    partitions = plan.node_partition_list
    num_pieces = plan.num_pieces
    if len(partitions) != len(nodes):
        raise CutError("plan does not match the graph's node count")

    graphs = [fx.Graph() for _ in range(num_pieces)]
    envs: list[dict[fx.Node, fx.Node]] = [{} for _ in range(num_pieces)]
    inputs: list[list[fx.Node]] = [[] for _ in range(num_pieces)]
    output_node = nodes[-1] if nodes and nodes[-1].op == "output" else None
    if output_node is None:
        raise CutError("graph has no output node at its end")

    # Placeholders for the crossing values, in the planner's order.
    for p in range(num_pieces):
        graph, env = graphs[p], envs[p]
        for idx in plan.piece_input_indices[p]:
            source = nodes[idx]
            if not _carries_value(source):
                continue
            placeholder = graph.placeholder(source.name)
            placeholder.meta = copy.copy(source.meta)
            # aot_autograd reads Dynamo's source of each graph input; values
            # made by an earlier piece have none.
            placeholder._dynamo_source = getattr(source, "_dynamo_source", None) if source.op == "placeholder" else None
            env[source] = placeholder
            inputs[p].append(source)

    def lookup(piece: int, value: fx.Node) -> fx.Node:
        mapped = envs[piece].get(value)
        if mapped is not None:
            return mapped
        if value.op == "get_attr":
            local = graphs[piece].node_copy(value)
            envs[piece][value] = local
            return local
        raise CutError(
            f"piece {piece} reads {value.name!r}, which the plan neither places in it "
            "nor lists among its inputs"
        )

    active_autocasts: list[fx.Node] = []  # entered and not yet exited, outermost first
    grad_mode: bool | None = None  # set by the last _set_grad_enabled node, None before any

    def open_piece(p: int) -> None:
        graph, env = graphs[p], envs[p]
        if grad_mode is not None:
            graph.call_function(_SET_GRAD, (grad_mode,))
        for enter in active_autocasts:
            env[enter] = graph.node_copy(enter, lambda n: lookup(p, n))

    def close_piece(p: int) -> None:
        if p == num_pieces - 1:
            # The last piece ends where the graph ends, in whatever state
            # the graph itself leaves.
            return
        graph, env = graphs[p], envs[p]
        for enter in reversed(active_autocasts):
            graph.call_function(_EXIT_AUTOCAST, (env[enter],))
        if grad_mode is not None and grad_mode != entry_grad_enabled:
            graph.call_function(_SET_GRAD, (entry_grad_enabled,))

    node_index = exported.node_index
    returned = set(output_node.all_input_nodes)
    current = -1
    for i, node in enumerate(nodes):
        piece = partitions[i]
        if node.op in ("placeholder", "output"):
            if piece != -1:
                raise CutError(f"plan puts {node.op} {node.name!r} in piece {piece}")
            continue
        if not 0 <= piece < num_pieces:
            raise CutError(f"plan puts node {node.name!r} in piece {piece} of {num_pieces}")
        if piece != current:
            if piece < current:
                raise CutError(
                    f"plan is not contiguous: node {node.name!r} goes back to piece {piece} after piece {current}"
                )
            if current >= 0:
                close_piece(current)
            if piece > current + 1:
                raise CutError(f"plan leaves piece {current + 1} empty")
            current = piece
            open_piece(piece)

        if node.op == "get_attr" and node not in returned and not any(
            partitions[node_index[user]] == piece for user in node.users
        ):
            # Only later pieces read it, and they fetch it themselves.
            continue
        copied = graphs[piece].node_copy(node, lambda n: lookup(piece, n))
        envs[piece][node] = copied
        if _is_call(node, _SET_GRAD):
            grad_mode = bool(node.args[0])
        elif _is_call(node, _ENTER_AUTOCAST):
            active_autocasts.append(node)
        elif _is_call(node, _EXIT_AUTOCAST):
            entered = node.args[0]
            if entered in active_autocasts:
                active_autocasts.remove(entered)
    if current >= 0:
        close_piece(current)
    if current != num_pieces - 1:
        raise CutError(f"plan has {num_pieces} pieces but nodes fill only {current + 1}")

    # Outputs: the planner's list, less values that never cross (a get_attr
    # stays only if the graph's own output returns it).
    outputs: list[list[fx.Node]] = []
    for p in range(num_pieces):
        yielded = [
            nodes[idx]
            for idx in plan.piece_output_indices[p]
            if _carries_value(nodes[idx]) or (nodes[idx].op == "get_attr" and nodes[idx] in returned)
        ]
        for value in yielded:
            if value not in envs[p]:
                raise CutError(f"piece {p} is to yield {value.name!r}, which it does not compute")
        graphs[p].output(tuple(envs[p][value] for value in yielded))
        outputs.append(yielded)

    # Every value the output node returns must come from a placeholder or
    # from some piece's outputs.
    available = {n for n in nodes if n.op == "placeholder"}
    for yielded in outputs:
        available.update(yielded)
    for value in returned:
        if value not in available:
            raise CutError(f"the graph returns {value.name!r}, which no piece yields")

    pieces = []
    param_name_to_source = getattr(gm, "_param_name_to_source", None)
    for p in range(num_pieces):
        piece_gm = fx.GraphModule(gm, graphs[p], class_name=f"GoddpPiece{p}")
        # Dynamo's metadata, so the inner compiler treats the piece as a
        # Dynamo graph (compile id, static parameter inputs, names).
        piece_gm.meta = dict(getattr(gm, "meta", {}))
        if param_name_to_source is not None:
            piece_gm._param_name_to_source = param_name_to_source
        shape_env = getattr(gm, "shape_env", None)
        if shape_env is not None:
            piece_gm.shape_env = shape_env
        pieces.append(Piece(p, piece_gm, inputs[p], outputs[p]))
    return pieces
