"""The graph-break zoo: forwards that Dynamo compiles as several graphs, and
whether each graph that trains is cut where DDP's installed buckets close.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.graph_breaks

One rank (gloo over a file store, CPU), aot_eager pieces. Each case trains
goddp-compiled DDP beside eager DDP on the same batches and counts the
graphs that ran a training step: those planned with the forward's other
graphs at its first training forward, and the later ones (a recompile of a
resume frame, a branch first taken later; Note [A later graph's part of the
layout] in goddp.ranks.layout). "Cross-frame alignment" counts the cases
whose every training graph is aligned, of the cases where every graph
should be (all but the one whose later graph really differs).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import shutil
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from bench.group import one_rank_group
from bench.stats import table

WIDTH = 512
DEPTH = 6
STEPS = 6


class Zoo(nn.Module):
    """depth Linear-tanh layers in two halves; `how` says what Dynamo breaks
    on between them. The input's sign steers each branch and count taken
    from ``.item()``, so that the test sets which one a step takes."""

    HOWS = ("print", "graph_break", "item_branch", "item_loop", "moving_break", "reversed_branch")

    def __init__(self, how: str, width: int = WIDTH, depth: int = DEPTH) -> None:
        super().__init__()
        if how not in self.HOWS:
            raise ValueError(f"how {how!r}; want one of {self.HOWS}")
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        # item_loop: a layer applied as many times as the .item() count says.
        self.mid = nn.Linear(width, width) if how == "item_loop" else None
        self.how = how

    def forward(self, x):
        sign = x.sum()
        half = len(self.layers) // 2
        if self.how == "moving_break":
            half -= int(sign.item() > 0)  # where the break falls comes from .item()
        for layer in self.layers[:half]:
            x = torch.tanh(layer(x))
        rest = list(self.layers[half:])
        if self.how == "print":
            print(end="")
        elif self.how in ("graph_break", "moving_break"):
            torch._dynamo.graph_break()
        elif self.how == "item_branch":
            x = x * 2 if sign.item() > 0 else x - 1
        elif self.how == "item_loop":
            for _ in range(1 + int(sign.item() > 0)):
                x = torch.tanh(self.mid(x))
        elif self.how == "reversed_branch" and sign.item() <= 0:
            rest.reverse()  # another order: a real difference from the installed buckets
        for layer in rest:
            x = torch.tanh(layer(x))
        return x


@dataclasses.dataclass(frozen=True)
class Case:
    """One zoo forward and how it is trained: DDP's bucket cap in layers (a
    bucket closes once it holds that many layers' bytes), negative(step)
    whether the step's batch is negative (the branches' sign), rows(step)
    the batch size, evaluate(step) whether an evaluation call (model.eval(),
    no_grad) follows the step; differs: a later graph really differs from
    the installed buckets."""

    name: str
    how: str
    cap_layers: float = 1.0
    negative: Callable[[int], bool] = lambda step: step % 2 == 1
    rows: Callable[[int], int] = lambda step: 8
    evaluate: Callable[[int], bool] = lambda step: False
    differs: bool = False


CASES = {
    c.name: c
    for c in [
        Case("print", "print"),
        Case("graph_break", "graph_break"),
        Case("item_branch", "item_branch"),
        Case("item_loop", "item_loop"),
        Case("dynamic_shape", "graph_break", rows=lambda step: 8 if step < 2 else 5 + step % 2),
        Case("eval_between", "item_branch", evaluate=lambda step: step in (0, 1)),
        Case("moving_break", "moving_break", cap_layers=2.1),
        # Not before step 3: DDP rebuilds its buckets from the gradient order
        # of the step after the install (step 2), which must be the installed one.
        Case("reversed_branch", "reversed_branch", negative=lambda step: step in (2, 4), differs=True),
    ]
}
# The cases the issue measured (goddp issue 25, item 5).
MEASURED = ("print", "graph_break", "item_branch", "item_loop")


@dataclasses.dataclass
class Trained:
    """What a case left: the goddp DDP module, every plan record and those
    of the graphs that ran a training step, DDP's reducer after each step,
    and whether every step's gradients were eager DDP's, bitwise."""

    ddp: Any
    records: list[dict[str, Any]]
    plans: list[dict[str, Any]]
    reducers: list[int]
    as_eager: bool


def batch(step: int, rows: int, width: int, negative: bool, seed: int = 0) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed + step)).abs() + 0.1
    return -x if negative else x


def train(case: Case, width: int = WIDTH, depth: int = DEPTH, steps: int = STEPS, process_group=None,
          seed: int = 0, order: str = "compile(DDP(m))") -> Trained:
    """Trains case with goddp and with eager DDP from the same weights on
    the same batches (seed offsets them, per rank), SGD; order:
    "compile(DDP(m))" or "DDP(compile(m))"."""
    torch._dynamo.reset()
    goddp.clear_plans()
    torch.manual_seed(0)
    base = Zoo(case.how, width, depth)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    backend = goddp.backend(inner="aot_eager", log_plan=False)
    cap_mb = case.cap_layers * (width * width + width) * 4 / (1 << 20)
    if order == "compile(DDP(m))":
        ddp = DDP(model, process_group=process_group, bucket_cap_mb=cap_mb)
        forward = torch.compile(ddp, backend=backend)
    else:
        ddp = DDP(torch.compile(model, backend=backend), process_group=process_group, bucket_cap_mb=cap_mb)
        forward = ddp
    eager = DDP(reference, process_group=process_group, bucket_cap_mb=cap_mb)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (model, reference)]
    as_eager, reducers = True, []
    for step in range(steps):
        x = batch(step, case.rows(step), width, case.negative(step), seed)
        for f, opt in zip((forward, eager), optimizers):
            opt.zero_grad(set_to_none=True)
            f(x).square().mean().backward()
        as_eager &= all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
        for opt in optimizers:
            opt.step()
        reducers.append(id(ddp.reducer))
        if case.evaluate(step):
            for m, f in ((model, forward), (reference, eager)):
                m.eval()
                with torch.no_grad():
                    f(x)
                m.train()
    records = goddp.last_plans()
    plans = [p for p in records if p["graph"]["num_params"] and p["plan_check"] is not None]
    return Trained(ddp, records, plans, reducers, as_eager)


def row(case: Case, trained: Trained) -> dict[str, Any]:
    together = [p for p in trained.plans if p["forward"] is not None]
    later = [p for p in trained.plans if p["forward"] is None]
    return {
        "case": case.name,
        "training graphs": len(trained.plans),
        "planned together": f"{sum(p['ddp_buckets']['aligned'] for p in together)}/{len(together)} aligned",
        "later": f"{sum(p['ddp_buckets']['aligned'] for p in later)}/{len(later)} aligned",
        "all aligned": all(p["ddp_buckets"]["aligned"] for p in trained.plans),
        "as eager DDP": trained.as_eager,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    import logging

    logging.getLogger("goddp").setLevel(logging.WARNING)
    torch._logging.set_logs(graph_breaks=False, recompiles=False)
    store = one_rank_group()
    rows = [row(CASES[name], train(CASES[name])) for name in args.cases]
    print(table(list(rows[0]), [list(r.values()) for r in rows]))
    for label, names in (("the measured cases", [n for n in args.cases if n in MEASURED]),
                         ("the zoo", [n for n in args.cases if not CASES[n].differs])):
        if names:
            done = sum(r["all aligned"] for r in rows if r["case"] in names)
            print(f"cross-frame alignment, {label}: {done}/{len(names)}")
    dist.destroy_process_group()
    sys.stdout.flush()
    shutil.rmtree(store, ignore_errors=True)  # os._exit skips atexit
    os._exit(0)  # a gloo worker may abort Python's finalization (tests/python/_dist_util.py, leave_without_finalizing)


if __name__ == "__main__":
    main()
