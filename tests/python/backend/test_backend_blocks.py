"""Block-aligned cuts end to end: goddp cuts a model of repeated blocks at
block boundaries, compiles each distinct piece once, and trains exactly
like eager DDP.

Runs in one process (1-rank gloo group); test_dist_numerics trains block
cuts on two ranks.
"""

from __future__ import annotations

import logging

import pytest
import torch

import goddp
from models import ZOO, SquareStack
from _fx_util import CountingCompiler, dynamo_graph, module_path


def train(entry, forward, steps=2, seed_base=0):
    losses = []
    return_params = None
    for step in range(steps):
        loss = entry.loss(forward(*entry.make_inputs(seed_base + step)))
        loss.backward()
        losses.append(loss.detach().clone())
    return losses, return_params


def compiled_blocks(dist_group, **options):
    entry = ZOO["blocks"]
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    counting = CountingCompiler()
    opts = {"inner": counting, "strict": True, "log_plan": True, **options}
    return entry, ddp, torch.compile(ddp, backend="goddp", options=opts), counting


def test_identical_blocks_compile_once_and_train_like_eager_ddp(dist_group, caplog):
    entry = ZOO["blocks"]
    eager = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    eager_losses, _ = train(entry, eager, seed_base=10 * dist_group.rank)

    _, ddp, compiled, counting = compiled_blocks(dist_group)
    with caplog.at_level(logging.INFO, logger="goddp"):
        losses, _ = train(entry, compiled, seed_base=10 * dist_group.rank)

    (plan,) = goddp.last_plans()
    # three blocks and the head; block 0 reads the graph input, which needs
    # no gradient, so it differs from blocks 1 and 2, which are one graph;
    # the head (an edge, smaller than a block) runs eagerly
    assert plan["num_pieces"] == 4
    assert [p["same_as"] for p in plan["pieces"]] == [0, 1, 1, 3]
    assert [p["eager"] for p in plan["pieces"]] == [False, False, False, True]
    assert (plan["distinct_pieces"], plan["reused_pieces"], plan["eager_pieces"]) == (3, 1, 1)
    assert len(counting.graphs) == 2, "the inner compiler ran once per distinct piece but the eager edge"
    # the progress lines and the plan table say so
    messages = [r.getMessage() for r in caplog.records]
    progress = [m for m in messages if "goddp: compiled piece" in m]
    assert len(progress) == 2 and "used by 2 pieces" in progress[1], progress
    assert any("goddp: piece 3" in m and "runs eagerly" in m for m in messages), messages
    table = [m for m in messages if "distinct pieces=3 reused=1" in m]
    assert table and "2=1" in table[0] and "eager pieces" in table[0], table

    # same losses and gradients as eager DDP, bit for bit (aot_eager)
    for got, want in zip(losses, eager_losses):
        assert torch.equal(got, want)
    for (name, p), q in zip(ddp.module.named_parameters(), eager.module.parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("edges, eager_pieces", [("compile", []), ("eager", [3])])
def test_edges_option_decides_what_runs_the_head(dist_group, edges, eager_pieces):
    entry, ddp, compiled, counting = compiled_blocks(dist_group, edges=edges)
    train(entry, compiled, steps=1)
    (plan,) = goddp.last_plans()
    assert [p["index"] for p in plan["pieces"] if p["eager"]] == eager_pieces
    assert plan["eager_pieces"] == len(eager_pieces)
    assert len(counting.graphs) == plan["distinct_pieces"] - len(eager_pieces)
    # whether the head is compiled changes no cut and no bucket
    assert plan["num_pieces"] == 4 and plan["ddp_buckets"]["aligned"]


def test_tied_edges_run_eagerly_and_train_like_eager_ddp(dist_group):
    # The tied LM: the embedding (preamble) and the norm and tied projection
    # (tail) are both edges, and share the embedding's weight. Run eagerly
    # whatever they cost (edges="eager"; what "auto" picks:
    # test_backend_edges.py).
    entry = ZOO["tied"]
    eager = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    eager_losses, _ = train(entry, eager, seed_base=10 * dist_group.rank)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    counting = CountingCompiler()
    compiled = torch.compile(ddp, backend="goddp", options={"inner": counting, "strict": True, "log_plan": False, "edges": "eager"})
    losses, _ = train(entry, compiled, seed_base=10 * dist_group.rank)
    (plan,) = goddp.last_plans()
    eager_pieces = [p["index"] for p in plan["pieces"] if p["eager"]]
    assert eager_pieces == [0, plan["num_pieces"] - 1], plan["pieces"]
    assert len(counting.graphs) == plan["distinct_pieces"] - 2
    for got, want in zip(losses, eager_losses):
        assert torch.equal(got, want)
    for (name, p), q in zip(ddp.module.named_parameters(), eager.module.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_cuts_fall_on_block_boundaries(dist_group):
    # The zoo's transformer stack as Dynamo captures it, planned with block
    # cuts: each block is exactly one piece, the head the last one.
    entry = ZOO["blocks"]
    gm = dynamo_graph(entry.build(seed=0), *entry.make_inputs(0))
    nodes = list(gm.graph.nodes)
    blocks = goddp.plan_graph_module(gm, block_cuts=True).node_block_ids  # the planner's block rule
    assert blocks is not None and max(blocks) == 2
    for cap in (entry.cap_bytes, 10 * entry.cap_bytes, 2**30):
        plan = goddp.plan_graph_module(gm, bucket_cap_bytes=cap, align_buckets=True, block_cuts=True)
        assert plan.num_pieces == 4, cap
        for node, block in zip(nodes, blocks):
            piece = plan.node_pieces[node.name]
            if node.op in ("placeholder", "output"):
                continue
            if block >= 0:
                assert module_path(node).startswith(f"L['self'].blocks.{block}")
                assert piece == block, (node.name, block, piece)
            else:
                assert piece == 3 and module_path(node).startswith("L['self'].head"), node.name
        # buckets close at piece boundaries: each holds whole pieces
        pieces_of = plan.piece_param_names()
        covered = [p for b in plan.buckets for p in range(b.piece, 4) if set(pieces_of[p]) <= set(b.param_names)]
        assert sorted(covered) == sorted(set(covered)) == [0, 1, 2, 3], cap


def test_blocks_larger_than_the_cap_get_a_bucket_each(dist_group):
    # the zoo's DDP cap is 0.125 MiB; a block holds 195 KiB
    entry, ddp, compiled, _ = compiled_blocks(dist_group)
    train(entry, compiled, steps=1)
    (plan,) = goddp.last_plans()
    block_bytes = sum(p.numel() * p.element_size() for p in ddp.module.blocks[0].parameters())
    assert block_bytes > 0.125 * 2**20
    assert plan["ddp_buckets"]["aligned"], plan["ddp_buckets"]
    sizes = [b["bytes"] for b in plan["buckets"]]
    head_bytes = sum(p.numel() * p.element_size() for p in ddp.module.head.parameters())
    # DDP order: the head joins block 2 (nearer the cap than alone), then
    # one bucket per block, never split
    assert sizes == [block_bytes + head_bytes, block_bytes, block_bytes]
    assert [b["piece"] for b in plan["buckets"]] == [2, 1, 0]


def test_block_cuts_off_cuts_by_bytes(dist_group):
    entry, ddp, compiled, counting = compiled_blocks(dist_group, block_cuts=False)
    train(entry, compiled, steps=1)
    (plan,) = goddp.last_plans()
    assert not plan["block_cuts"]
    assert plan["distinct_pieces"] == plan["num_pieces"] == len(counting.graphs)
    # byte-driven cuts fall inside blocks: some block's parameters span two pieces
    spans = {}
    for piece in plan["pieces"]:
        for name in piece["param_names"]:
            if name.startswith("blocks."):
                spans.setdefault(name.split(".")[1], set()).add(piece["index"])
    assert any(len(pieces) > 1 for pieces in spans.values()), spans


def test_no_repeated_blocks_change_nothing(dist_group):
    plans = []
    for block_cuts in (True, False):
        torch._dynamo.reset()
        goddp.clear_plans()
        torch.manual_seed(0)
        model = SquareStack(width=64, depth=6)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.02)
        options = {"inner": "aot_eager", "block_cuts": block_cuts, "log_plan": False}
        compiled = torch.compile(ddp, backend="goddp", options=options)
        compiled(torch.randn(4, 64)).sum().backward()
        (plan,) = goddp.last_plans()
        plans.append(plan)
    on, off = plans
    assert on["num_pieces"] > 1
    assert on["fingerprint"] == off["fingerprint"]
    assert on["buckets"] == off["buckets"]


@pytest.mark.inductor
def test_inductor_close_to_eager_ddp(dist_group):
    entry = ZOO["blocks"]
    eager = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    eager_losses, _ = train(entry, eager, steps=1, seed_base=10 * dist_group.rank)
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    options = {"inner": "inductor", "strict": True, "log_plan": False, "edges": "compile"}
    compiled = torch.compile(ddp, backend="goddp", options=options)
    losses, _ = train(entry, compiled, steps=1, seed_base=10 * dist_group.rank)
    (plan,) = goddp.last_plans()
    assert plan["reused_pieces"] == 1 and plan["eager_pieces"] == 0
    assert torch.allclose(losses[0], eager_losses[0], rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(ddp.module.named_parameters(), eager.module.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-3, atol=1e-5), name
