"""Repeated blocks: the planner's block assignment on real Dynamo graphs
(Note [Block rule]), and recognising identical pieces (goddp.graph.blocks)."""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

import goddp
from goddp.graph.blocks import backward_order, group_pieces, piece_signature
from _fx_util import dynamo_graph, module_path
from models import SquareStack, TiedEmbeddingLM, TransformerStack


def block_ids(gm: fx.GraphModule) -> list[int]:
    """Per node, the planner's repeated block (-1: none)."""
    ids = goddp.plan_graph_module(gm, block_cuts=True).node_block_ids
    return [-1] * len(gm.graph.nodes) if ids is None else ids


def test_transformer_blocks_are_found():
    gm = dynamo_graph(TransformerStack(width=32, heads=2, depth=3), torch.randn(2, 4, 32))
    nodes = list(gm.graph.nodes)
    ids = block_ids(gm)
    assert len(ids) == len(nodes)
    seen = []
    for node, block in zip(nodes, ids):
        if node.op in ("placeholder", "output"):
            assert block == -1
            continue
        path = module_path(node)
        if ".blocks." in path:
            # numbered in order of appearance, one id per layer
            assert block == int(path.rsplit(".", 1)[1]), (node.name, path, block)
            if not seen or seen[-1] != block:
                seen.append(block)
        else:
            assert block == -1, (node.name, path)
    assert seen == [0, 1, 2]


def test_repeated_single_layers_are_not_blocks():
    # A Linear is one node: a piece per Linear would be all overhead.
    gm = dynamo_graph(SquareStack(width=16, depth=4), torch.randn(2, 16))
    assert set(block_ids(gm)) == {-1}


def test_nested_blocks_use_the_outermost_level():
    # TiedEmbeddingLM repeats Feedforward blocks (three nodes each); the
    # residual add between them belongs to no block.
    gm = dynamo_graph(TiedEmbeddingLM(vocab=64, width=16), torch.randint(64, (2, 4)))
    nodes = list(gm.graph.nodes)
    ids = block_ids(gm)
    by_block: dict[int, set[str]] = {}
    for node, block in zip(nodes, ids):
        if block >= 0:
            by_block.setdefault(block, set()).add(module_path(node))
    assert sorted(by_block) == [0, 1]
    for block, paths in by_block.items():
        assert paths == {f"L['self'].body.{block}"}


def test_no_module_stack_means_no_blocks():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.relu, (x,)))
    assert goddp.plan_graph_module(fx.GraphModule(nn.Module(), graph), block_cuts=True).node_block_ids is None


def _linear_piece(names: tuple[str, str, str, str], fn=torch.nn.functional.linear) -> fx.GraphModule:
    graph = fx.Graph()
    x, w, b = (graph.placeholder(n) for n in names[:3])
    y = graph.call_function(fn, (x, w, b))
    z = graph.call_function(operator.add, (y, x), name=names[3])
    graph.output((z,))
    return fx.GraphModule(nn.Module(), graph)


def _inputs(width=8, batch=2, x_requires_grad=True):
    x = torch.randn(batch, width, requires_grad=x_requires_grad)
    return [x, nn.Parameter(torch.randn(width, width)), nn.Parameter(torch.randn(width))]


def test_signature_ignores_names_only():
    a = _linear_piece(("x", "l_blocks_0_w", "l_blocks_0_b", "add"))
    b = _linear_piece(("h", "l_blocks_1_w", "l_blocks_1_b", "add_7"))
    sig = piece_signature(a, _inputs())
    assert sig is not None
    assert piece_signature(b, _inputs()) == sig
    # another target, another shape, another grad requirement: not the same
    assert piece_signature(_linear_piece(("x", "w", "b", "add"), fn=torch.addmm), _inputs()) != sig
    assert piece_signature(b, _inputs(width=4)) != sig
    assert piece_signature(b, _inputs(x_requires_grad=False)) != sig
    # a plain tensor where a parameter was
    plain = _inputs()
    plain[1] = plain[1].detach()
    assert piece_signature(b, plain) != sig


def test_signature_tells_inputs_that_are_one_object():
    piece = _linear_piece(("x", "w", "b", "add"))
    x, w, b = _inputs()
    square = nn.Parameter(torch.randn(8, 8))
    assert piece_signature(piece, [square, square, b]) != piece_signature(piece, [square.detach().clone(), square, b])


def test_pieces_reading_different_attributes_never_match():
    def attr_piece(value):
        root = nn.Module()
        root.register_buffer("scale", value)
        graph = fx.Graph()
        x = graph.placeholder("x")
        s = graph.get_attr("scale")
        graph.output((graph.call_function(operator.mul, (x, s)),))
        return fx.GraphModule(root, graph)

    x = [torch.randn(3)]
    assert piece_signature(attr_piece(torch.ones(3)), x) != piece_signature(attr_piece(torch.ones(3)), x)


def test_grouping_and_backward_order():
    sigs = [("pre",), ("block",), ("block",), None, ("block",), ("tail",)]
    leaders = group_pieces(sigs)
    assert leaders == [0, 1, 1, 3, 1, 5]
    # backward meets the tail first, then the block callable at its last
    # piece (4), then piece 3, the preamble last
    assert backward_order(leaders) == [5, 1, 3, 0]
    # interleaved classes: A B B A compiles A's backward first
    assert backward_order(group_pieces([("a",), ("b",), ("b",), ("a",)])) == [0, 1]
