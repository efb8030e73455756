"""Cutting a graph into pieces along a plan.

Each piece's fx.Graph is built directly from the planner's piece map and
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

from goddp.graph.export import ExportedGraph
from goddp.graph.nodes import is_compute
from goddp.native.plan import GraphPlan


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


class _Cutter:
    """One cut of one graph: the steps of cut_graph, in order, over the
    state they share (a Graph and a node map per piece, and the autocast
    regions and grad mode in force at the node being copied)."""

    def __init__(self, gm: fx.GraphModule, exported: ExportedGraph, plan: GraphPlan, entry_grad_enabled: bool) -> None:
        self.gm = gm
        self.plan = plan
        self.nodes = exported.nodes
        self.node_index = exported.node_index
        self.num_pieces = plan.num_pieces
        self.entry_grad_enabled = entry_grad_enabled
        if len(plan.node_pieces) != len(self.nodes):
            raise CutError("plan does not match the graph's node count")
        try:
            self.piece_of = [plan.node_pieces[node.name] for node in self.nodes]
        except KeyError as missing:
            raise CutError(f"plan has no piece for node {missing}") from None
        self.output_node = self.nodes[-1] if self.nodes and self.nodes[-1].op == "output" else None
        if self.output_node is None:
            raise CutError("graph has no output node at its end")
        self.returned = set(self.output_node.all_input_nodes)
        self.graphs = [fx.Graph() for _ in range(self.num_pieces)]
        self.envs: list[dict[fx.Node, fx.Node]] = [{} for _ in range(self.num_pieces)]
        self.inputs: list[list[fx.Node]] = [[] for _ in range(self.num_pieces)]
        self.outputs: list[list[fx.Node]] = []
        self.active_autocasts: list[fx.Node] = []  # entered and not yet exited, outermost first
        self.grad_mode: bool | None = None  # set by the last _set_grad_enabled node, None before any

    def run(self) -> list[Piece]:
        self.add_input_placeholders()
        self.copy_nodes()
        self.add_outputs()
        self.check_graph_outputs()
        return self.make_pieces()

    def add_input_placeholders(self) -> None:
        """Placeholders for the crossing values, in the planner's order."""
        for p in range(self.num_pieces):
            graph, env = self.graphs[p], self.envs[p]
            for idx in self.plan.piece_input_indices[p]:
                source = self.nodes[idx]
                if not _carries_value(source):
                    continue
                placeholder = graph.placeholder(source.name)
                placeholder.meta = copy.copy(source.meta)
                # aot_autograd reads Dynamo's source of each graph input;
                # values made by an earlier piece have none.
                placeholder._dynamo_source = (
                    getattr(source, "_dynamo_source", None) if source.op == "placeholder" else None
                )
                env[source] = placeholder
                self.inputs[p].append(source)

    def lookup(self, piece: int, value: fx.Node) -> fx.Node:
        """value as piece p sees it: its copy, its placeholder, or (for a
        get_attr) a fresh read of the attribute."""
        mapped = self.envs[piece].get(value)
        if mapped is not None:
            return mapped
        if value.op == "get_attr":
            local = self.graphs[piece].node_copy(value)
            self.envs[piece][value] = local
            return local
        raise CutError(
            f"piece {piece} reads {value.name!r}, which the plan neither places in it "
            "nor lists among its inputs"
        )

    def open_piece(self, p: int) -> None:
        """Re-enters the grad mode and autocast regions in force."""
        graph, env = self.graphs[p], self.envs[p]
        if self.grad_mode is not None:
            graph.call_function(_SET_GRAD, (self.grad_mode,))
        for enter in self.active_autocasts:
            env[enter] = graph.node_copy(enter, lambda n: self.lookup(p, n))

    def close_piece(self, p: int) -> None:
        """Leaves the autocast regions and restores the entry grad mode."""
        if p == self.num_pieces - 1:
            # The last piece ends where the graph ends, in whatever state
            # the graph itself leaves.
            return
        graph, env = self.graphs[p], self.envs[p]
        for enter in reversed(self.active_autocasts):
            graph.call_function(_EXIT_AUTOCAST, (env[enter],))
        if self.grad_mode is not None and self.grad_mode != self.entry_grad_enabled:
            graph.call_function(_SET_GRAD, (self.entry_grad_enabled,))

    def copy_nodes(self) -> None:
        """Copies each compute node into its piece, opening and closing
        pieces as the plan moves on; checks that the plan is contiguous."""
        current = -1
        for node, piece in zip(self.nodes, self.piece_of):
            if not is_compute(node):
                if piece != -1:
                    raise CutError(f"plan puts {node.op} {node.name!r} in piece {piece}")
                continue
            if not 0 <= piece < self.num_pieces:
                raise CutError(f"plan puts node {node.name!r} in piece {piece} of {self.num_pieces}")
            if piece != current:
                self.move_to_piece(node, current, piece)
                current = piece
            self.copy_node(node, piece)
        if current >= 0:
            self.close_piece(current)
        if current != self.num_pieces - 1:
            raise CutError(f"plan has {self.num_pieces} pieces but nodes fill only {current + 1}")

    def move_to_piece(self, node: fx.Node, current: int, piece: int) -> None:
        if piece < current:
            raise CutError(
                f"plan is not contiguous: node {node.name!r} goes back to piece {piece} after piece {current}"
            )
        if current >= 0:
            self.close_piece(current)
        if piece > current + 1:
            raise CutError(f"plan leaves piece {current + 1} empty")
        self.open_piece(piece)

    def copy_node(self, node: fx.Node, piece: int) -> None:
        if node.op == "get_attr" and node not in self.returned and not any(
            self.piece_of[self.node_index[user]] == piece for user in node.users
        ):
            # Only later pieces read it, and they fetch it themselves.
            return
        self.envs[piece][node] = self.graphs[piece].node_copy(node, lambda n: self.lookup(piece, n))
        if _is_call(node, _SET_GRAD):
            self.grad_mode = bool(node.args[0])
        elif _is_call(node, _ENTER_AUTOCAST):
            self.active_autocasts.append(node)
        elif _is_call(node, _EXIT_AUTOCAST):
            entered = node.args[0]
            if entered in self.active_autocasts:
                self.active_autocasts.remove(entered)

    def add_outputs(self) -> None:
        """The planner's outputs, less values that never cross (a get_attr
        stays only if the graph's own output returns it)."""
        nodes = self.nodes
        for p in range(self.num_pieces):
            yielded = [
                nodes[idx]
                for idx in self.plan.piece_output_indices[p]
                if _carries_value(nodes[idx]) or (nodes[idx].op == "get_attr" and nodes[idx] in self.returned)
            ]
            for value in yielded:
                if value not in self.envs[p]:
                    raise CutError(f"piece {p} is to yield {value.name!r}, which it does not compute")
            self.graphs[p].output(tuple(self.envs[p][value] for value in yielded))
            self.outputs.append(yielded)

    def check_graph_outputs(self) -> None:
        """Every value the output node returns must come from a placeholder
        or from some piece's outputs."""
        available = {n for n in self.nodes if n.op == "placeholder"}
        for yielded in self.outputs:
            available.update(yielded)
        for value in self.returned:
            if value not in available:
                raise CutError(f"the graph returns {value.name!r}, which no piece yields")

    def make_pieces(self) -> list[Piece]:
        gm = self.gm
        pieces = []
        param_name_to_source = getattr(gm, "_param_name_to_source", None)
        shape_env = getattr(gm, "shape_env", None)
        for p in range(self.num_pieces):
            piece_gm = fx.GraphModule(gm, self.graphs[p], class_name=f"GoddpPiece{p}")
            # Dynamo's metadata, so the inner compiler treats the piece as a
            # Dynamo graph (compile id, static parameter inputs, names).
            piece_gm.meta = dict(getattr(gm, "meta", {}))
            if param_name_to_source is not None:
                piece_gm._param_name_to_source = param_name_to_source
            if shape_env is not None:
                piece_gm.shape_env = shape_env
            pieces.append(Piece(p, piece_gm, self.inputs[p], self.outputs[p]))
        return pieces


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
    return _Cutter(gm, exported, plan, entry_grad_enabled).run()
