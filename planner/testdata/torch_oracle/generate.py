"""Generates cases.json: random FX graphs together with the buckets that the
installed torch's own DDPOptimizer chooses for them.

planner's TestTorchOracle replans every case in ModeTorch and must match
torch exactly, so `go test ./planner` checks fidelity to real torch without
torch installed. The graphs mix every construct DDPOptimizer treats
specially: parameter placeholders (used once, several times, or nested in a
list), call_module nodes (modules called twice, modules without
parameters), call_method nodes on module outputs, on parameters and on
plain values, get_attr parameters, frozen, ignored and storage-sharing
parameters, nodes with no users, and preambles without parameters. They
are encoded by goddp's production exporter (../exported_json.py).

Regenerate (deterministic for a given torch) with:
    .venv/bin/python planner/testdata/torch_oracle/generate.py
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from unittest import mock

import torch
from torch import fx, nn
from torch._dynamo.backends.distributed import DDPOptimizer

from goddp.graph.export import export_graph

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exported_json import graph_json  # noqa: E402  (planner/testdata)
from oracle_records import write_records  # noqa: E402

NUM_CASES = 150


def combine(*args):
    """Stands for any op; the graphs are planned, never run."""
    raise NotImplementedError


class _StopAfterBucketing(Exception):
    """Raised in place of split_module: the buckets are decided by then."""


def make_param(rng: random.Random, name: str) -> nn.Parameter:
    numel = rng.choice([0, 1, 3, 8, 16, 40, 100])
    if rng.random() < 0.2:
        # A view into a larger storage: storage bytes exceed numel * 4.
        base = torch.zeros(numel + rng.choice([1, 8, 32]))
        p = nn.Parameter(base[:numel])
    else:
        p = nn.Parameter(torch.zeros(numel))
    if rng.random() < 0.15:
        p.requires_grad_(False)
    if rng.random() < 0.1:
        p._ddp_ignored = True
    return p


def random_case(rng: random.Random):
    root = nn.Module()
    params: list[nn.Parameter] = []  # the parameter table
    names: list[str] = []

    def register(p: nn.Parameter, name: str) -> int:
        params.append(p)
        names.append(name)
        return len(params) - 1

    # Submodules for call_module (one has no parameters at all).
    modules = []
    for m in range(rng.randint(0, 3)):
        mod = nn.Module()
        for k in range(rng.randint(0, 2)):
            setattr(mod, f"w{k}", make_param(rng, ""))
        root.add_module(f"m{m}", mod)
        modules.append((f"m{m}", mod))
    # Parameters reached by get_attr.
    attrs = []
    for a in range(rng.randint(0, 2)):
        p = make_param(rng, "")
        root.register_parameter(f"a{a}", p)
        attrs.append(f"a{a}")

    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.zeros(2)
    holders = []
    for k in range(rng.randint(0, 5)):
        p = make_param(rng, "")
        node = graph.placeholder(f"l_p{k}_")
        node.meta["example_value"] = p
        holders.append(node)
    values = [x]  # nodes usable as ordinary inputs
    compute = []
    for k in range(rng.randint(3, 30)):
        kind = rng.random()
        pick = lambda: rng.choice(values)
        if kind < 0.15 and modules:
            target, _ = rng.choice(modules)
            node = graph.call_module(target, (pick(),))
        elif kind < 0.35:
            receiver = rng.choice(values + holders + compute) if rng.random() < 0.7 else pick()
            args = [receiver]
            if holders and rng.random() < 0.6:
                args.append(rng.choice(holders))
            node = graph.call_method("mul", tuple(args))
        elif kind < 0.45 and attrs:
            node = graph.get_attr(rng.choice(attrs))
        else:
            args = [pick()]
            for _ in range(rng.randint(0, 2)):
                if holders and rng.random() < 0.7:
                    args.append(rng.choice(holders))
                else:
                    args.append(pick())
            if holders and rng.random() < 0.15:
                args.append([rng.choice(holders)])  # nested: torch does not count it
            node = graph.call_function(combine, tuple(args))
        compute.append(node)
        # Some nodes are never read (in-place style tails and dead ends).
        if rng.random() < 0.85:
            values.append(node)
    outs = [n for n in rng.sample(values, k=min(len(values), rng.randint(1, 3)))]
    graph.output(tuple(outs))
    gm = fx.GraphModule(root, graph)
    cap = rng.randint(1, 300)
    first = rng.randint(1, cap)
    return gm, cap, first


def export(gm: fx.GraphModule):
    """The planner's Graph for gm, encoded by goddp's own exporter (the
    way DDPOptimizer reads it), with the node index and parameter table."""
    exported = export_graph(gm)
    return graph_json(exported, dtype=False), exported.node_index, exported.params


def torch_buckets(gm, cap, first):
    opt = DDPOptimizer(bucket_bytes_cap=cap, backend_compile_fn=lambda g, ex: g.forward, first_bucket_cap=first)
    with mock.patch("torch.fx.passes.split_module.split_module", side_effect=_StopAfterBucketing):
        try:
            opt.compile_fn(gm, [])
        except _StopAfterBucketing:
            pass
    return opt.buckets


def main():
    # torch warns about every extended bucket; the cases want many of them.
    logging.getLogger("torch._dynamo.backends.distributed").setLevel(logging.ERROR)
    rng = random.Random(20240611)
    cases = []
    while len(cases) < NUM_CASES:
        gm, cap, first = random_case(rng)
        graph, index, table = export(gm)
        try:
            buckets = torch_buckets(gm, cap, first)
        except AssertionError as err:
            # torch asserts on a size-0 preamble holding zero-byte
            # parameters; goddp plans such graphs anyway.
            print("skipped a case torch rejects:", err)
            continue
        nb = len(buckets)
        node_piece = [-1] * len(index)
        expected = []
        for k, b in enumerate(buckets):
            for n in b.nodes:
                node_piece[index[n]] = k
        # DDP order: the bucket torch built first (the last piece) first.
        for k in reversed(range(nb)):
            b = buckets[k]
            if not b.nodes:
                continue  # a graph without compute nodes: no pieces
            seen, listed = set(), []
            for pid in b.param_ids:
                if pid not in seen:
                    seen.add(pid)
                    listed.append(pid)
            expected.append({
                "bytes": b.size,
                "param_ids": listed,
                "extended": b.opcount_increased_to_capture_external_output > 0,
            })
        # Map torch's id(param) to the planner's parameter index.
        id_to_index = {id(p): i for i, p in enumerate(table)}
        for b in expected:
            b["params"] = [id_to_index[pid] for pid in b.pop("param_ids")]
        cases.append({
            "cap": cap,
            "first_cap": first,
            "graph": graph,
            "want": {"node_pieces": node_piece, "buckets": expected},
        })
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json")
    write_records(path, cases)  # planner/testdata/oracle_records.py: which releases they hold for


if __name__ == "__main__":
    main()
