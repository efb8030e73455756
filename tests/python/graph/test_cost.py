"""The node costs goddp estimates from Dynamo's shapes (goddp.graph.cost;
Note [Edge costs] in planner/edges.go), checked op by op against what the
op does: a matrix product's flops, a view's nothing, a gather's rows."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.utils import flop_counter

from _fx_util import dynamo_graph
from goddp.graph.cost import graph_costs, node_cost

F32 = 4


def costs_by_name(module, *inputs):
    gm = dynamo_graph(module, *inputs)
    nodes = list(gm.graph.nodes)
    flops, nbytes = graph_costs(gm, nodes)
    return gm, {n.name: (f, b) for n, f, b in zip(nodes, flops, nbytes)}


class Ops(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.emb = nn.Embedding(100, 8)
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x, idx, img):
        h = self.fc(x)  # (6, 32)
        v = h.view(3, 64).t()  # views
        s = torch.softmax(h, -1)
        m = x @ torch.ones(16, 5)
        e = self.emb(idx)  # (6, 8)
        c = self.conv(img)  # (1, 4, 6, 6)
        return s.sum() + v.sum() + m.sum() + e.sum() + c.sum()


def test_each_op_costs_what_it_does():
    x, idx, img = torch.randn(6, 16), torch.randint(100, (6,)), torch.randn(1, 3, 8, 8)
    _, cost = costs_by_name(Ops(), x, idx, img)
    by_target = {}
    for name, c in cost.items():
        by_target.setdefault(name.rstrip("_0123456789"), []).append(c)
    # a linear layer: 2 * M * K * N flops of its kernel, no unfused bytes
    assert cost["h"] == (2 * 6 * 16 * 32, 0)
    # a matmul: the same from its operands' shapes
    assert cost["m"] == (2 * 6 * 16 * 5, 0)
    # views move nothing
    assert cost["v"] == (0, 0) and cost["view"] == (0, 0)
    # softmax reads its input and writes its output, unfused
    assert cost["s"] == (0, 2 * 6 * 32 * F32)
    # a gather writes its rows and reads them and its indices, not the table
    assert cost["e"] == (0, 2 * 6 * 8 * F32 + 6 * 8)
    # a convolution: torch's own formula
    conv = flop_counter.conv_flop_count([1, 3, 8, 8], [4, 3, 3, 3], [1, 4, 6, 6])
    assert cost["c"] == (conv, 0)
    # placeholders and the output cost nothing
    assert cost["output"] == (0, 0) and cost["l_x_"] == (0, 0)


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_attention_costs_torch_formula():
    q = torch.randn(2, 4, 16, 8)
    _, cost = costs_by_name(Attention(), q, q, q)
    (flops, nbytes), = [c for c in cost.values() if c != (0, 0)]
    assert flops == flop_counter.sdpa_flop_count([2, 4, 16, 8], [2, 4, 16, 8], [2, 4, 16, 8]) > 0
    assert nbytes == 0


class Checkpointed(nn.Module):
    def __init__(self, checkpoint):
        super().__init__()
        self.fc1, self.fc2, self.checkpoint = nn.Linear(8, 8), nn.Linear(8, 8), checkpoint

    def block(self, x):
        return torch.tanh(self.fc2(torch.relu(self.fc1(x))))

    def forward(self, x):
        if self.checkpoint:
            return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


def test_a_checkpoint_costs_its_body():
    x = torch.randn(4, 8)
    _, plain = costs_by_name(Checkpointed(False), x)
    gm, ckpt = costs_by_name(Checkpointed(True), x)
    totals = [tuple(map(sum, zip(*c.values()))) for c in (plain, ckpt)]
    assert totals[0] == totals[1] and totals[0][0] == 2 * (2 * 4 * 8 * 8) and totals[0][1] > 0
    calls = [n for n in gm.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]
    assert len(calls) == 1 and node_cost(gm, calls[0]) == totals[1]


def test_symbolic_shapes_cost_their_hints():
    torch._dynamo.reset()
    graphs = []
    fn = torch.compile(lambda a: torch.softmax(a, -1), backend=lambda gm, ex: graphs.append(gm) or gm, dynamic=True)
    fn(torch.randn(5, 7))
    (gm,) = graphs
    flops, nbytes = graph_costs(gm, list(gm.graph.nodes))
    assert sum(flops) == 0 and sum(nbytes) == 2 * 5 * 7 * F32


class Modules(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.act = nn.Linear(16, 32), nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))


def test_module_calls_cost_like_their_functions():
    """A graph that keeps call_module nodes (fx's own tracer; values recorded
    by running it): a Linear costs its kernel, a module without weights
    (ReLU) its memory."""
    gm = torch.fx.symbolic_trace(Modules())

    class Record(torch.fx.Interpreter):
        def run_node(self, n):
            n.meta["example_value"] = out = super().run_node(n)
            return out

    Record(gm).run(torch.randn(6, 16))
    nodes = list(gm.graph.nodes)
    cost = dict(zip((n.name for n in nodes), zip(*graph_costs(gm, nodes))))
    assert [n.op for n in nodes].count("call_module") == 2
    assert cost["fc"] == (2 * 6 * 16 * 32, 0)
    assert cost["act"] == (0, 2 * 6 * 32 * F32)
