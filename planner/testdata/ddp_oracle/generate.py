"""Generates cases.json: small models, their forward graphs in the planner's
form, and the buckets that the installed torch's DistributedDataParallel
really rebuilt for them after its first iteration.

planner's TestDDPOracle plans every graph in ModeDDP with the same caps and
must list the same buckets (order, parameters, bytes), so `go test
./planner` checks ModeDDP's prediction against real DDP without torch
installed. One process, a 1-rank gloo group; a few seconds on a CPU.

Graphs come from torch.fx.symbolic_trace (call_module nodes with module
references, call_method/call_function nodes for the rest), encoded by
goddp's production exporter (../exported_json.py). The parameter table is
named_parameters() order.

Regenerate (deterministic for a given torch) with:
    .venv/bin/python planner/testdata/ddp_oracle/generate.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.parallel import DistributedDataParallel as DDP

from goddp.graph.export import export_graph, parameter_names

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from exported_json import graph_json  # noqa: E402  (planner/testdata)
from oracle_records import write_records  # noqa: E402

MIB = 1 << 20


class LinearStack(nn.Module):
    def __init__(self, sizes, dtypes=None):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.dtypes = dtypes or [torch.float32] * len(self.layers)
        for layer, dt in zip(self.layers, self.dtypes):
            layer.to(dt)

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            x = layer(x.to(self.dtypes[k]))
            if k + 1 < len(self.layers):
                x = F.relu(x)
        return x.float()


class Reordered(nn.Module):
    """Declares its layers in the reverse of the order it calls them."""

    def __init__(self):
        super().__init__()
        self.last = nn.Linear(128, 16)
        self.middle = nn.Linear(128, 128)
        self.first = nn.Linear(32, 128)

    def forward(self, x):
        return self.last(F.relu(self.middle(F.relu(self.first(x)))))


class Tied(nn.Module):
    """Embedding and output head share one weight."""

    def __init__(self, vocab=1000, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mid = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(F.relu(self.mid(self.embed(tokens))))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, depth=3, width=64):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def float_input(*shape):
    return lambda: (torch.randn(*shape),)


CASES = [
    # name, model factory, input factory, DDP keyword arguments, ignored names
    ("six_linear_512", lambda: LinearStack([512] * 7), float_input(8, 512), {}, ()),
    ("toy_5000", lambda: LinearStack([10, 5000, 5000, 5000, 5]), float_input(4, 10), {}, ()),
    ("linear_cap_mb", lambda: LinearStack([256] * 9), float_input(8, 256), {"bucket_cap_mb": 0.5}, ()),
    ("reordered", Reordered, float_input(8, 32), {"bucket_cap_mb": 0.05}, ()),
    ("tied", Tied, lambda: (torch.randint(0, 1000, (4, 8)),), {"bucket_cap_mb": 0.2}, ()),
    ("mixed_dtype", lambda: LinearStack([256] * 7, [torch.float32, torch.bfloat16] * 3), float_input(8, 256),
     {"bucket_cap_mb": 0.3}, ()),
    ("bucket_cap_list", lambda: LinearStack([256] * 9), float_input(8, 256),
     {"bucket_cap_mb_list": [0.25, 1, 0.5]}, ()),
    ("ignored", lambda: LinearStack([256] * 6), float_input(8, 256), {"bucket_cap_mb": 0.3},
     ("layers.2.weight", "layers.4.bias")),
    ("transformer", Transformer, float_input(2, 8, 64), {"bucket_cap_mb": 0.1}, ()),
    ("transformer_default", Transformer, float_input(2, 8, 64), {}, ()),
]


def export(gm: fx.GraphModule, model: nn.Module, ignored) -> dict:
    """The planner's Graph for gm, encoded by goddp's own exporter.
    Parameters are numbered in named_parameters() order, so a shared
    parameter appears once."""
    names = parameter_names(model)
    exported = export_graph(gm, param_name_of=lambda p: names.get(id(p)), ignored_names=ignored)
    position = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    order = sorted(range(len(exported.params)), key=lambda i: position[exported.param_names[i]])
    return graph_json(exported, param_order=order)


def ddp_param_names(model: nn.Module, ignored) -> list[str]:
    """DDP's own parameter list, which its bucket indices refer to."""
    seen, names = set(), []
    for module_name, sub in model.named_modules():
        for param_name, p in sub.named_parameters(recurse=False):
            fqn = f"{module_name}.{param_name}" if module_name else param_name
            if not p.requires_grad or fqn in ignored or id(p) in seen:
                continue
            seen.add(id(p))
            names.append(fqn)
    return names


def caps_of(ddp_kwargs) -> dict:
    """The caps DDP uses for its rebuild, as planner Config fields."""
    if "bucket_cap_mb_list" in ddp_kwargs:
        caps = [int(mb * MIB) for mb in ddp_kwargs["bucket_cap_mb_list"]]
        return {"cap": max(caps), "first_cap": max(caps), "caps": caps}
    if "bucket_cap_mb" in ddp_kwargs:
        cap = int(ddp_kwargs["bucket_cap_mb"] * MIB)
        return {"cap": cap, "first_cap": cap, "caps": []}
    return {"cap": 25 * MIB, "first_cap": dist._DEFAULT_FIRST_BUCKET_BYTES, "caps": []}


def ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def main():
    store = os.path.join(tempfile.mkdtemp(prefix="goddp_oracle_"), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    out = []
    for name, factory, inputs, ddp_kwargs, ignored in CASES:
        torch.manual_seed(0)
        model = factory()
        gm = fx.symbolic_trace(model)
        graph = export(gm, model, ignored)
        if ignored:
            DDP._set_params_and_buffers_to_ignore_for_model(model, list(ignored))
        ddp = DDP(model, **ddp_kwargs)
        for _ in range(3):
            ddp.zero_grad(set_to_none=True)
            ddp(*inputs()).float().square().mean().backward()
        data = ddp._get_ddp_logging_data()
        assert data.get("has_rebuilt_buckets"), name
        sizes = ints(data["rebuilt_bucket_sizes"])
        groups = [ints(grp) for grp in data["rebuilt_per_bucket_param_indices"].split(",")]
        ddp_names = ddp_param_names(model, ignored)
        table_index = {p["name"]: i for i, p in enumerate(graph["params"])}
        buckets = [{"bytes": size, "params": [table_index[ddp_names[i]] for i in grp]}
                   for size, grp in zip(sizes, groups)]
        out.append({"name": name, **caps_of(ddp_kwargs), "graph": graph, "want_buckets": buckets})
        print(f"{name}: {len(buckets)} buckets, sizes {sizes}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json")
    write_records(path, out)  # planner/testdata/oracle_records.py: which releases they hold for
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
