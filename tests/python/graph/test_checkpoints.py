"""Checkpoint bodies without the planner (Note [Checkpoint bodies]): block
facts through bodies, body identity, and where a split is refused."""

from __future__ import annotations

import functools
import operator

import pytest
import torch
import torch.utils.checkpoint as cp
from torch import fx

from goddp.graph.blocks import piece_signature
from goddp.graph.export import export_graph, module_stack
from goddp.compile.plan import plan_graph_module
from goddp.graph import checkpoints as _checkpoints
from goddp.graph.checkpoints import BodyBuckets, policy_key, split_checkpoints
from checkpoint_models import SAVED_OPS, build, make_tokens, sac_context
from test_blocks import dynamo_graph

CHECKPOINT = torch.ops.higher_order.tag_activation_checkpoint


def canonical(value):
    return ("object", value)


class TestPolicyKey:
    def test_partials_compare_by_function_and_arguments(self):
        assert policy_key(sac_context(list(SAVED_OPS)), canonical) == policy_key(sac_context(SAVED_OPS), canonical)
        assert policy_key(sac_context(SAVED_OPS[:1]), canonical) != policy_key(sac_context(SAVED_OPS), canonical)

        def other(ctx, op, *args, **kwargs):
            return cp.CheckpointPolicy.PREFER_RECOMPUTE

        assert policy_key(sac_context(other), canonical) != policy_key(sac_context(SAVED_OPS), canonical)
        assert policy_key(functools.partial(other, 1), canonical) != policy_key(functools.partial(other, 2), canonical)


def planner_blocks(gm):
    plan = plan_graph_module(gm, block_cuts=True)
    return plan.node_block_ids or [-1] * len(gm.graph.nodes)


def body_facts(gm):
    """The exported body facts (Note [Body stacks]) in plain form: per node
    the call it belongs to, and per node the module paths of its body nodes'
    stacks."""
    arrays = export_graph(gm).arrays
    data, offsets = arrays["module_strings"], arrays["module_string_offsets"]
    text = [data[offsets[k]:offsets[k + 1]].decode() for k in range(len(offsets) - 1)]
    node_body, stack = arrays["node_body_offsets"], arrays["body_stack_offsets"]
    paths = arrays["body_stack_paths"]
    bodies = [
        [[text[paths[e]] for e in range(stack[k], stack[k + 1])] for k in range(node_body[i], node_body[i + 1])]
        for i in range(len(node_body) - 1)
    ]
    return list(arrays["node_hop_calls"]), bodies


class TestBlocksThroughBodies:
    def test_each_checkpoint_call_joins_its_block(self, native_module):
        gm = dynamo_graph(build("per_block", "residual"), make_tokens(0))
        nodes = list(gm.graph.nodes)
        # a call has no module stack of its own
        calls = [i for i, n in enumerate(nodes) if n.target is CHECKPOINT]
        assert all(module_stack(nodes[i]) == [] for i in calls)
        belongs, bodies = body_facts(gm)
        for k, i in enumerate(calls):
            members = [nodes.index(nodes[i].args[0]), i, *(nodes.index(r) for r in nodes[i].users)]
            assert sorted(j for j, c in enumerate(belongs) if c == i) == sorted(members)
            assert bodies[i] and all(f"L['self'].blocks.{k}" in stack for stack in bodies[i] if stack)
        assert all(not bodies[i] for i in range(len(nodes)) if i not in calls)
        ids = planner_blocks(gm)
        assert [ids[i] for i in calls] == [0, 1, 2, 3]
        for i in calls:
            body_attr, results = nodes[i].args[0], list(nodes[i].users)
            assert ids[nodes.index(body_attr)] == ids[i]
            assert all(ids[nodes.index(r)] == ids[i] for r in results)

    def test_a_call_spanning_blocks_belongs_to_none(self, native_module):
        gm = dynamo_graph(build("whole", "residual"), make_tokens(0))
        nodes = list(gm.graph.nodes)
        (call,) = [n for n in nodes if n.target is CHECKPOINT]
        _, bodies = body_facts(gm)
        assert {s[0] for s in bodies[nodes.index(call)] if s} == {f"L['self'].blocks.{k}" for k in range(4)}
        assert set(planner_blocks(gm)) == {-1}
        # its body alone holds the four blocks
        assert sorted(set(planner_blocks(getattr(gm, call.args[0].target))) - {-1}) == [0, 1, 2, 3]

    def test_bodies_compare_by_structure_names_aside(self):
        gm = dynamo_graph(build("per_block", "residual"), make_tokens(0))
        calls = [n for n in gm.graph.nodes if n.target is CHECKPOINT]
        sigs = []
        for call in calls:
            piece = fx.Graph()
            env = {}
            for value in call.args[1:]:
                env[value] = piece.placeholder(value.name)
            get = piece.get_attr(call.args[0].target)
            out = piece.call_function(CHECKPOINT, (get, *[env[v] for v in call.args[1:]]), dict(call.kwargs))
            piece.output((piece.call_function(operator.getitem, (out, 0)),))
            piece_gm = fx.GraphModule(gm, piece)
            inputs = [torch.randn(2, 8, 64, requires_grad=True)] + [
                torch.nn.Parameter(torch.randn(v.meta["example_value"].shape)) for v in call.args[2:]
            ]
            sigs.append(piece_signature(piece_gm, inputs))
        assert all(s is not None for s in sigs)
        assert len(set(sigs)) == 1
        # the body names differ; the bodies are distinct objects
        assert len({c.args[0].target for c in calls}) == len(calls)


def _hand_made(ops, blocks, meta=True):
    """An outer graph with one checkpoint call whose body runs ops (each
    (kind, target, arg indices) over earlier body values, 0 = the input);
    blocks gives each body node's block."""
    body = fx.Graph()
    values = [body.placeholder("x")]
    for kind, target, args in ops:
        call = body.call_function if kind == "f" else body.call_method
        values.append(call(target, tuple(values[a] for a in args)))
    body.output((values[-1],))
    if meta:
        for n in body.nodes:
            n.meta["example_value"] = torch.empty(2)
    body_gm = fx.GraphModule({}, body)
    outer = fx.Graph()
    x = outer.placeholder("x")
    get = outer.get_attr("body")
    hop = outer.call_function(CHECKPOINT, (get, x), {"use_reentrant": False})
    outer.output((outer.call_function(operator.getitem, (hop, 0)),))
    gm = fx.GraphModule({"body": body_gm}, outer)
    return gm, hop, lambda g: list(blocks)


def plan_split(gm, call, body_blocks, body_buckets=None):
    """The planner's decision for one checkpoint call, the outer graph
    taken as not cut at block runs (what split_checkpoints decides for
    each call, including those it neither splits nor reports)."""
    splits, _ = _checkpoints._decide(gm, [call], body_blocks, body_buckets, lambda g: False)
    return splits[0]


class TestSplitDecisions:
    def test_split_into_regions(self):
        gm, hop, blocks = _hand_made([("f", torch.relu, (0,)), ("f", torch.neg, (1,)), ("f", torch.sin, (2,))],
                                     [-1, 0, 1, 1, -1])
        split = plan_split(gm, hop, blocks)
        assert split.regions is not None and len(split.regions) == 2
        assert [len(r.nodes) for r in split.regions] == [1, 2]
        new, splits = split_checkpoints(gm, blocks)
        assert new is not gm and len(splits) == 1
        calls = [n for n in new.graph.nodes if n.target is CHECKPOINT]
        assert len(calls) == 2
        x = torch.randn(2)
        assert torch.equal(new(x)[0], gm.body(x)[0])
        # gm itself is left as it was
        assert len([n for n in gm.graph.nodes if n.target is CHECKPOINT]) == 1

    @pytest.mark.parametrize(
        ("ops", "blocks", "reason"),
        [
            ([("f", torch.relu, (0,)), ("m", "add_", (1,)), ("f", torch.neg, (2,))], [-1, 0, 1, 1, -1],
             "writes a value from before its region"),
            ([("f", torch.relu, (0,)), ("f", torch.nn.functional.dropout, (1,)), ("f", torch.neg, (2,))],
             [-1, 0, 1, 1, -1], "random op"),
            ([("f", torch.relu, (0,)), ("f", torch.neg, (1,))], [-1, 0, 0, -1], "fewer than two blocks"),
            ([("f", torch.relu, (0,)), ("f", torch._C._set_grad_enabled, ()), ("f", torch.neg, (1,))],
             [-1, 0, 1, 1, -1], "grad mode or autocast"),
        ],
        ids=["mutation", "dropout", "one-block", "grad-mode"],
    )
    def test_kept_whole(self, ops, blocks, reason):
        gm, hop, body_blocks = _hand_made(ops, blocks)
        split = plan_split(gm, hop, body_blocks)
        assert split.regions is None and reason in split.reason, split.reason
        new, _ = split_checkpoints(gm, body_blocks)
        assert new is gm

    def test_non_tensor_crossing_keeps_whole(self):
        gm, hop, blocks = _hand_made([("m", "size", (0,)), ("f", torch.neg, (0,)), ("f", operator.mul, (2, 1))],
                                     [-1, 0, 1, 1, -1])
        body = gm.body
        size = [n for n in body.graph.nodes if n.target == "size"][0]
        size.meta["example_value"] = torch.Size([2])
        split = plan_split(gm, hop, blocks)
        assert split.regions is None and "Size value would cross" in split.reason, split.reason


class TestBucketSplitDecisions:
    """Splitting at the pieces of the body's own bucket plan (BodyBuckets,
    the planner's in the backend), only where the planner does not cut the
    outer graph at block runs (Note [Checkpoint bodies])."""

    OPS = [("f", torch.relu, (0,)), ("f", torch.neg, (1,)), ("f", torch.sin, (2,))]

    @staticmethod
    def no_blocks(g):
        return [-1] * len(g.graph.nodes)

    @staticmethod
    def bytes_cut(g):  # the planner's block_runs: not cut at block runs
        return False

    @staticmethod
    def buckets(pieces):
        # the planner's checkpoint_regions, for a body without blocks
        regions = len({p for p in pieces if p >= 0}) >= 2
        return lambda gm, call, body: BodyBuckets(list(pieces), 3 << 20, 1 << 20, 3, regions)

    def test_split_at_the_body_pieces(self):
        gm, hop, _ = _hand_made(self.OPS, [])
        new, splits = split_checkpoints(gm, self.no_blocks, self.buckets([-1, 0, 1, 1, -1]), self.bytes_cut)
        (split,) = splits
        assert split.boundary == "bucket" and [len(r.nodes) for r in split.regions] == [1, 2]
        assert "holds 3 MiB of DDP's parameters, 3 buckets under the 1 MiB bucket cap" in split.describe()
        assert "split into 2 checkpoint regions at bucket boundaries" in split.describe()
        assert len([n for n in new.graph.nodes if n.target is CHECKPOINT]) == 2
        x = torch.randn(2)
        assert torch.equal(new(x)[0], gm.body(x)[0])

    def test_one_piece_is_left_alone_unmentioned(self):
        gm, hop, _ = _hand_made(self.OPS, [])
        new, splits = split_checkpoints(gm, self.no_blocks, self.buckets([-1, 0, 0, 0, -1]), self.bytes_cut)
        assert new is gm and splits == []

    def test_a_graph_cut_at_block_runs_is_not_split_at_buckets(self):
        """The planner's word (block_runs) for the outer graph decides, not
        the blocks Python sees: two outer blocks that the planner does not
        cut at (declaration order) still split; no blocks that it does cut
        at (as it says) do not."""
        gm, hop, _ = _hand_made(self.OPS, [])
        asked = []

        def two_blocks(g):  # the outer graph holds two blocks, the body none
            return [-1, 0, 1, 1] if g is gm else [-1] * len(g.graph.nodes)

        def planner_says(answer):
            return lambda g: asked.append(g) or answer

        new, splits = split_checkpoints(gm, two_blocks, self.buckets([-1, 0, 1, 1, -1]), planner_says(True))
        assert new is gm and splits == [] and asked == [gm]
        new, (split,) = split_checkpoints(gm, two_blocks, self.buckets([-1, 0, 1, 1, -1]), planner_says(False))
        assert split.boundary == "bucket" and len(split.regions) == 2

    def test_body_buckets_needs_the_planners_word(self):
        gm, hop, _ = _hand_made(self.OPS, [])
        with pytest.raises(ValueError, match="cut_at_blocks"):
            split_checkpoints(gm, self.no_blocks, self.buckets([-1, 0, 1, 1, -1]))

    def test_kept_whole_says_bytes_cap_and_reason(self):
        ops = [("f", torch.relu, (0,)), ("f", torch.nn.functional.dropout, (1,)), ("f", torch.neg, (2,))]
        gm, hop, _ = _hand_made(ops, [])
        new, (split,) = split_checkpoints(gm, self.no_blocks, self.buckets([-1, 0, 1, 1, -1]), self.bytes_cut)
        assert new is gm and split.regions is None
        text = split.describe()
        assert "holds 3 MiB of DDP's parameters" in text and "kept whole" in text and "random op" in text, text
