"""A short 2-rank CPU training run with goddp, against eager DDP.

    torchrun --standalone --nproc_per_node=2 examples/train_demo.py

Each rank trains the same MLP under DistributedDataParallel (gloo) twice:
eagerly, then compiled with ``backend="goddp"``. Rank 0 prints goddp's plan
table (through the "goddp" logger), the step times of both runs and the
largest difference between the two runs' final parameters, which must be
tiny: goddp changes where the graph is cut, never what it computes.

It ends with ``goddp.trace`` of a few more steps of each run: when each
DDP bucket's allreduce started and finished relative to backward, eager DDP
next to goddp (``--plot overlap.png`` also draws both timelines).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.tracing import median_step


class MLP(nn.Module):
    """A stack of Linear+ReLU layers. A module of our own: Dynamo does not
    compile frames inside torch.nn, so a bare nn.Sequential under DDP would
    run eagerly."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], warmup: int) -> list[float]:
    """Runs one SGD step per batch and returns the step times after warm-up."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for step, (x, y) in enumerate(batches):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1e3:8.1f} ms   min {min(times) * 1e3:8.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--inner", default="aot_eager", help="goddp's inner compiler (inductor, aot_eager, eager)")
    parser.add_argument("--mode", default="ddp", choices=goddp.backend.MODES)
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--trace-steps", type=int, default=3, help="steps recorded by goddp.trace per run")
    parser.add_argument("--plot", metavar="PNG", help="draw both runs' launch timelines (rank 0) to this file")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.basicConfig(level=logging.WARNING, format=f"[rank {rank}] %(message)s")
    if rank == 0:
        logging.getLogger("goddp").setLevel(logging.INFO)

    torch.manual_seed(0)
    base = MLP(args.width, args.depth)
    # Different data on each rank, as in real data-parallel training.
    gen = torch.Generator().manual_seed(1000 + rank)
    warmup = 2
    batches = [
        (torch.randn(args.batch, args.width, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen))
        for _ in range(warmup + args.steps)
    ]

    eager = DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_cap_mb)
    eager_times = train(eager, batches, warmup)

    compiled_model = DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_cap_mb)
    compiled = torch.compile(compiled_model, backend="goddp", options={"inner": args.inner, "mode": args.mode})
    start = time.perf_counter()
    goddp_times = train(compiled, batches, warmup)
    total = time.perf_counter() - start

    plans = goddp.last_plans()
    drift = max((a - b).abs().max().item() for a, b in zip(eager.parameters(), compiled_model.parameters()))

    # A few more steps of each run under goddp.trace (every rank enters it).
    traces = {}
    for label, model in (("eager DDP", eager), ("goddp", compiled)):
        with goddp.trace(model) as tr:
            train(model, batches[: args.trace_steps], warmup=0)
        traces[label] = tr
    if rank == 0:
        pieces = plans[-1]["num_pieces"] if plans else 0
        print()
        print(f"goddp: {len(plans)} graph(s) planned, {pieces} piece(s); inner={args.inner} mode={args.mode}")
        print(f"eager DDP        {summary(eager_times)}")
        print(f"goddp compiled   {summary(goddp_times)}   (first {warmup} steps incl. compile: "
              f"{total - sum(goddp_times):.1f} s)")
        print(f"max |param difference| after {len(batches)} steps: {drift:.3g}")
        for label, tr in traces.items():
            print(f"\n=== goddp.trace of {label} ===")
            print(tr.summary())
        print()
        for label, tr in traces.items():
            print(f"{label:>10}: {tr.to_dict()['verdict']}")
        if args.plot:
            from goddp.tracing import plot_steps

            rows = [(label, median_step(tr.to_dict()["steps"])) for label, tr in traces.items()]
            plot_steps(args.plot, rows, title=f"{args.depth}x{args.width} MLP, batch {args.batch}, 2 ranks, gloo: "
                       "median traced step", colors=["#6d8fb3", "#2e9e5b"])
            print(f"launch timelines written to {args.plot}")
    dist.destroy_process_group()
    if not plans or plans[-1]["num_pieces"] < 2:
        raise SystemExit("goddp did not split the graph: something is wrong")


if __name__ == "__main__":
    main()
