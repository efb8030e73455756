"""One DDP bucket layout across the graphs of a forward (goddp.ranks.forward,
Note [Graphs of one forward]): a graph break in the middle of the model
leaves DDP's parameters in two graphs; at the module's next training call
the ranks (here one) combine both graphs' buckets, and DDP's rebuilt
buckets close at the cuts of both. A graph that first runs later follows
and never re-buckets training. Numerics stay bitwise those of eager DDP
(aot_eager pieces)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp

WIDTH = 64
CAP_MB = 0.03
STEPS = 5


@pytest.fixture(autouse=True)
def _group(dist_group, native_module):
    return dist_group


class BrokenHalves(nn.Module):
    """Six Linear layers, a graph break, six more; `late` adds a branch
    (its own graph) from the step the test sets it."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.first = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(6))
        self.second = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(6))
        self.how = how
        self.late = False

    def forward(self, x):
        for layer in self.first:
            x = torch.tanh(layer(x))
        if self.how == "print":
            print("between the halves")
        elif self.how == "graph_break":
            torch._dynamo.graph_break()
        elif self.how == "item_branch":
            x = x * 2 if x.sum().item() > 0 else x - 1
        if self.late:
            x = x + x.detach().mean()
            torch._dynamo.graph_break()
        for layer in self.second:
            x = torch.tanh(layer(x))
        return x


def rebuilt(ddp) -> tuple[list[int], list[set[int]]]:
    """DDP's own account of its rebuilt buckets: sizes (bytes) and, per
    bucket, the DDP positions of its parameters."""
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets"), data
    sizes = [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]
    members = [set(int(p) for p in b.split()) for b in data["rebuilt_per_bucket_param_indices"].split(", ")]
    return sizes, members


def train(how: str, order: str = "compile(DDP)", late_from: int | None = None, steps: int = STEPS):
    torch.manual_seed(0)
    base = BrokenHalves(how)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    backend = goddp.backend(inner="aot_eager")
    if order == "compile(DDP)":
        ddp = DDP(model, bucket_cap_mb=CAP_MB)
        compiled = torch.compile(ddp, backend=backend)
    else:
        ddp = DDP(torch.compile(model, backend=backend), bucket_cap_mb=CAP_MB)
        compiled = ddp
    eager = DDP(reference, bucket_cap_mb=CAP_MB)
    reducers = []  # DDP's reducer after each step
    for step in range(steps):
        if late_from is not None and step == late_from:
            model.late = reference.late = True
        x = torch.randn(4, WIDTH)
        if step % 2:
            x = -x - 0.5
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        out = compiled(x)
        out.square().sum().backward()
        ref = eager(x)
        ref.square().sum().backward()
        assert torch.equal(out, ref), f"step {step}"
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad), f"step {step}: {name}"
        reducers.append(id(ddp.reducer))
    return ddp, reducers


def bucket_sets(plan) -> list[set[str]]:
    """A plan's buckets in DDP order, each as the set of its parameters."""
    return [set(b["param_names"]) for b in plan["buckets"]]


def model_plans():
    return [p for p in goddp.last_plans() if p["graph"]["num_params"]]


@pytest.mark.parametrize("how", ["print", "graph_break", "item_branch"])
def test_a_break_in_the_middle_aligns_ddp_buckets_across_both_graphs(how, caplog):
    caplog.set_level(logging.INFO, logger="goddp")
    ddp, _ = train(how)
    plans = model_plans()
    assert len(plans) >= 2, plans
    together = [p for p in plans if p["forward"] is not None]
    assert len(together) == 2, plans
    first, second = sorted(together, key=lambda p: p["forward"]["position"])
    assert first["forward"]["graphs"] == second["forward"]["graphs"] and len(first["forward"]["graphs"]) == 2
    assert all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in together)
    assert all(p["fallback"] is None and p["num_pieces"] > 1 for p in together)
    # The combined layout: the second graph's buckets first (DDP order).
    bucket_graphs = first["forward"]["bucket_graphs"]
    assert bucket_graphs == sorted(bucket_graphs, reverse=True) and set(bucket_graphs) == {0, 1}
    caps = first["plan_check"]["caps"]
    sizes, members = rebuilt(ddp)
    assert sizes == caps
    # Each rebuilt bucket holds the parameters of one piece of one graph.
    names = [n for n, _ in ddp.module.named_parameters()]
    piece_of = {}
    for g, plan in enumerate((first, second)):
        for piece in plan["pieces"]:
            for name in piece["param_names"]:
                piece_of[name] = (g, piece["index"])
    for bucket in members:
        assert len({piece_of[names[p]] for p in bucket}) == 1, (bucket, piece_of)
    assert "planning the 2 graph(s) of this DDP module's first training forward together" in caplog.text


def test_compile_inside_ddp_aligns_across_graphs_too():
    ddp, _ = train("graph_break", order="DDP(compile)")
    together = [p for p in model_plans() if p["forward"] is not None]
    assert len(together) == 2 and all(p["ddp_buckets"]["aligned"] for p in together)
    sizes, _ = rebuilt(ddp)
    assert sizes == together[0]["plan_check"]["caps"]


def test_a_branch_whose_graph_appears_only_at_step_3_never_rebuckets_training(caplog):
    caplog.set_level(logging.INFO, logger="goddp")
    ddp, reducers = train("graph_break", late_from=2, steps=6)
    # One new reducer, at the agreement of step 2 (index 1); none after the
    # branch, and DDP's rebuilt buckets are the combined ones.
    assert reducers[0] != reducers[1] and reducers[1:] == [reducers[1]] * (len(reducers) - 1)
    together = [p for p in model_plans() if p["forward"] is not None]
    assert len(together) == 2 and all(p["ddp_buckets"]["aligned"] for p in together)
    assert rebuilt(ddp)[0] == together[0]["plan_check"]["caps"]
    # The branch's graph of the second half holds the parameters of the
    # combined layout's first buckets and is cut where they close (Note [A
    # later graph's part of the layout] in goddp.ranks.layout).
    late = [p for p in model_plans() if p["forward"] is None]
    assert late, model_plans()
    second = max(together, key=lambda p: p["forward"]["position"])
    for plan in late:
        assert plan["ddp_buckets"] == {"aligned": True, "reason": None}
        assert plan["plan_check"]["followed"]
        assert bucket_sets(plan) == bucket_sets(second)
    names = [n for n, _ in ddp.module.named_parameters()]
    rebuilt_sets = [{names[p] for p in b} for b in rebuilt(ddp)[1]]
    assert rebuilt_sets[: len(second["buckets"])] == bucket_sets(second)


def test_a_forward_without_a_break_keeps_aligning_at_its_first_call():
    """The single-graph path is unchanged: aligned at step 1's call, no
    forward record."""
    ddp, reducers = train("none", steps=3)
    (plan,) = model_plans()
    assert plan["forward"] is None and plan["ddp_buckets"]["aligned"] is True
    assert reducers == [reducers[0]] * 3  # the new reducer came at step 1's call
    sizes, _ = rebuilt(ddp)
    assert sizes == plan["ddp_caps"]


def test_the_trace_shows_buckets_closing_at_the_cuts_of_both_graphs():
    torch.manual_seed(0)
    model = BrokenHalves("graph_break")
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    compiled = torch.compile(ddp, backend=goddp.backend(inner="aot_eager", log_plan=False))
    for _ in range(3):
        compiled(torch.randn(4, WIDTH)).sum().backward()
    with goddp.trace(compiled) as tr:
        for _ in range(2):
            compiled(torch.randn(4, WIDTH)).sum().backward()
    text = tr.summary()
    assert "goddp forward: 2 graph(s) planned together, DDP's buckets close at the cuts of each" in text, text
    together = [p for p in model_plans() if p["forward"] is not None]
    bucket_graphs = together[0]["forward"]["bucket_graphs"]
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit() and "KiB" in line]
    # bucket, bytes, unit, params, graph, ...
    assert [int(r[4]) for r in rows[: len(bucket_graphs)]] == bucket_graphs, text


class TiedAcrossTheBreak(nn.Module):
    """The first layer's weight is used again after the graph break: its
    gradient completes in the first graph's backward (planner/forward.go)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.second = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x):
        for layer in self.first:
            x = torch.tanh(layer(x))
        torch._dynamo.graph_break()
        for layer in self.second:
            x = torch.tanh(layer(x))
        return torch.tanh(x @ self.first[0].weight.t())


def test_a_weight_tied_across_the_break_is_counted_in_the_earliest_graph():
    torch.manual_seed(0)
    base = TiedAcrossTheBreak()
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    ddp = DDP(model, bucket_cap_mb=CAP_MB)
    compiled = torch.compile(ddp, backend=goddp.backend(inner="aot_eager", log_plan=False))
    eager = DDP(reference, bucket_cap_mb=CAP_MB)
    for step in range(4):
        x = torch.randn(4, WIDTH)
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        compiled(x).square().sum().backward()
        eager(x).square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert torch.equal(p.grad, q.grad), f"step {step}: {name}"
    together = [p for p in model_plans() if p["forward"] is not None]
    assert len(together) == 2 and all(p["ddp_buckets"]["aligned"] for p in together), model_plans()
    assert together[0]["forward"]["moved"] == 1
    sizes, members = rebuilt(ddp)
    assert sizes == together[0]["plan_check"]["caps"]
    names = [n for n, _ in ddp.module.named_parameters()]
    tied = names.index("first.0.weight")
    (home,) = [b for b in members if tied in b]
    assert all(names[p].startswith("first.") for p in home), [names[p] for p in home]
