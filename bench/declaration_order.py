"""DDP with find_unused_parameters=True: two ways for goddp to match its buckets.

    .venv/bin/python -m bench.declaration_order

With find_unused_parameters=True (the Hugging Face Trainer's default) DDP
never rebuilds its buckets; it keeps the ones it fills in parameter
declaration order at construction. goddp can

- **caps** (what goddp does): give DDP per-bucket caps under which those
  declaration-order buckets are exactly goddp's pieces, merging the pieces
  whose parameters the declaration order interleaves (see
  Note [Declaration order] in planner/declorder.go);
- **DDP's buckets**: leave DDP's caps alone (25 MiB, 1 MiB for the
  first-declared bucket by default) and cut where DDP's real buckets become
  ready.

Both are evaluated on graphs captured by Dynamo (no compile, no training)
with one figure of merit, from the planner's first-use nodes: DDP launches
its buckets strictly in order, bucket k once buckets 0..k are all ready, so
bucket k starts when backward passes the earliest first use among them. A
bucket that can start only when backward reaches the model's first
parameter-using node waits for the end of backward: its bytes are
"exposed". "launches" counts the allreduces that start while backward still
runs; "pieces" the pieces each way needs (DDP's buckets: one per distinct
launch point).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

import goddp
from bench.group import one_rank_group
from goddp.measure import MIB, first_use_nodes

_captured: list = []


def _capture(gm, example_inputs):
    _captured.append(gm)
    return gm.forward


def capture(model: nn.Module, *inputs) -> torch.fx.GraphModule:
    torch._dynamo.reset()
    _captured.clear()
    torch.compile(model, backend=_capture)(*inputs)
    graphs = [g for g in _captured if any(n.op == "placeholder" for n in g.graph.nodes)]
    return max(graphs, key=lambda g: len(g.graph.nodes))


def ddp_parameter_list(model: nn.Module) -> list[nn.Parameter]:
    """DDP's own parameter order (DistributedDataParallel._build_params_for_reducer)."""
    seen, out = set(), []
    for _, module in model.named_modules():
        for _, p in module.named_parameters(recurse=False):
            if p.requires_grad and p not in seen:
                seen.add(p)
                out.append(p)
    return out


def launches(buckets: list[list[str]], first: dict[str, int], sizes: dict[str, int]) -> list[tuple[int, int]]:
    """(bytes, launch node) per bucket in DDP order: DDP starts bucket k once
    buckets 0..k are complete, i.e. when backward passes the earliest first
    use among them."""
    out, earliest = [], None
    for bucket in buckets:
        nodes = [first[n] for n in bucket if n in first]
        if nodes:
            earliest = min(nodes) if earliest is None else min(earliest, min(nodes))
        out.append((sum(sizes[n] for n in bucket), earliest))
    return out


def summarise(name: str, rows: list[tuple[int, int]], end_node: int, pieces: int) -> str:
    total = sum(b for b, _ in rows)
    exposed = sum(b for b, node in rows if node == end_node)
    early = sum(1 for _, node in rows if node != end_node)
    return (f"  {name:<13} buckets={len(rows):>3} pieces={pieces:>3} launches before backward ends={early:>3} "
            f"exposed={exposed / MIB:7.2f} MiB of {total / MIB:7.2f} ({100 * exposed / max(total, 1):5.1f}%)")


def evaluate(label: str, model: nn.Module, inputs: tuple, cap_mb: float | None) -> None:
    gm = capture(model, *inputs)
    params = ddp_parameter_list(model)
    name_of = {id(p): n for n, p in model.named_parameters()}
    names = [name_of[id(p)] for p in params]
    sizes = {name_of[id(p)]: p.numel() * p.element_size() for p in params}
    first = first_use_nodes(gm)
    assert set(first) == set(names), sorted(set(first) ^ set(names))
    end_node = min(first.values())
    cap = int(cap_mb * MIB) if cap_mb else None
    plan = goddp.plan_graph_module(
        gm, bucket_cap_bytes=cap, param_names=model, align_buckets=True, declaration_order=names
    )
    caps_rows = launches([list(b.param_names) for b in plan.buckets], first, sizes)

    # DDP's own construction-time buckets, computed by DDP's own function.
    full = cap or 25 * MIB
    first_cap = cap if cap else dist._DEFAULT_FIRST_BUCKET_BYTES
    limits = [first_cap, full] if first_cap < full else [full]
    indices, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    ddp_rows = launches([[names[i] for i in bucket] for bucket in reversed(indices)], first, sizes)
    print(f"{label} (cap {cap_mb or 25} MiB, {len(gm.graph.nodes)} nodes, alignment: {plan.alignment}, "
          f"{plan.merged_cuts} cuts merged)")
    print(summarise("caps", caps_rows, end_node, plan.num_pieces))
    print(summarise("DDP's buckets", ddp_rows, end_node, len({node for _, node in ddp_rows})))


class Stack(nn.Module):
    """Linear layers; `order` says in which order they are declared."""

    def __init__(self, width: int, depth: int, order: list[int]) -> None:
        super().__init__()
        self._order = order
        for k in order:
            self.add_module(f"layer{k}", nn.Linear(width, width))

    def forward(self, x):
        for k in range(len(self._order)):
            x = torch.relu(getattr(self, f"layer{k}")(x))
        return x


def gpt2(layers: int, width: int, vocab: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=width, n_layer=layers, n_head=8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    torch.manual_seed(0)
    one_rank_group()
    torch._dynamo.config.optimize_ddp = False
    depth, width = 8, 1024
    x = torch.randn(4, width)
    evaluate("Linear stack, declared in forward order", Stack(width, depth, list(range(depth))), (x,), 8)
    evaluate("Linear stack, last layer declared first", Stack(width, depth, [depth - 1, *range(depth - 1)]), (x,), 8)
    evaluate("Linear stack, second half declared first", Stack(width, depth, [*range(depth // 2, depth), *range(depth // 2)]), (x,), 8)
    ids = torch.randint(0, 8192, (2, 64))
    evaluate("GPT-2, 6 layers, d=512, vocab 8192 (HF)", gpt2(6, 512, 8192), (ids,), None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
