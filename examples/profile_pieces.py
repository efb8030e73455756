"""Your own torch.profiler loop around a goddp-compiled DDP model, on CPU with gloo.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/profile_pieces.py
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 examples/profile_pieces.py \\
        --goddp-trace --plot docs/profiler_ranges.png

Each rank writes ``profile_rank<r>.json``, a Chrome trace to open in
Perfetto (ui.perfetto.dev) or chrome://tracing. goddp names its pieces
there: ``goddp piece 3 (block 1) forward`` and ``... backward`` (nothing to
switch on: the ranges run while a profiler records). torch's process group
adds one ``gloo:all_reduce`` range per bucket on its own thread; with
``--goddp-trace`` the steps also run inside ``goddp.trace``, whose comm hook
names each bucket's allreduce on the training thread, ``goddp bucket 2
allreduce``, from launch to completion. ``--plot`` draws rank 0's profiled
step from the trace's events with matplotlib: the pieces' forward and
backward ranges and the allreduces, one row each. ``--compile-times``
prints torch's ``compile_times()`` after the first steps, goddp's phases
among them (``goddp.plan``, ...). Under ``TORCH_TRACE=<dir>`` tlparse then
finds goddp's artifacts beside each compile id (docs/tools.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Tower(nn.Module):
    """An embedding, six identical blocks, a head: goddp cuts it at the
    blocks and compiles one block's piece for all six."""

    def __init__(self, vocab: int = 512, width: int = 256, depth: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--inner", default="aot_eager")
    ap.add_argument("--goddp-trace", action="store_true", help="also name each bucket's allreduce (goddp.trace)")
    ap.add_argument("--plot", help="draw rank 0's profiled step to this PNG")
    ap.add_argument("--compile-times", action="store_true", help="print torch's compile_times() after compiling")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = DDP(Tower(), bucket_cap_mb=1)
    model = torch.compile(ddp, backend="goddp", options={"inner": args.inner})
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    tokens = torch.randint(512, (8, 64), generator=torch.Generator().manual_seed(rank))

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()

    for _ in range(2):  # compile, agree on DDP's buckets, let DDP rebuild them
        train_step()
    if args.compile_times and rank == 0:
        print(torch._dynamo.utils.compile_times())  # goddp's phases are the goddp.* rows
    path = f"profile_rank{rank}.json"
    traced = goddp.trace(model) if args.goddp_trace else contextlib.nullcontext()
    with traced:
        # The profiler loop as torch documents it: skip one step, warm up one, record the rest.
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.steps - 2),
            on_trace_ready=lambda prof: prof.export_chrome_trace(path),
        ) as prof:
            for _ in range(args.steps):
                train_step()
                prof.step()
    print(f"rank {rank}: wrote {path}")
    if args.plot and rank == 0:
        plot(path, args.plot)
        print(f"rank {rank}: drew {args.plot}")
    dist.destroy_process_group()


def plot(trace_path: str, png: str) -> None:
    """The last profiled step's goddp ranges and allreduces, from the
    Chrome trace's complete events (ph "X": ts and dur in microseconds)."""
    import matplotlib  # only for --plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # only for --plot

    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    last = max(steps, key=lambda e: e["ts"])
    start, end = last["ts"], last["ts"] + last["dur"]
    rows = {
        "piece forward": [e for e in events if e["name"].startswith("goddp piece") and e["name"].endswith("forward")],
        "piece backward": [e for e in events if e["name"].startswith("goddp piece") and e["name"].endswith("backward")],
        "goddp bucket allreduce": [e for e in events if e["name"].startswith("goddp bucket")],
        "gloo:all_reduce (gloo's thread)": [e for e in events if e["name"] == "gloo:all_reduce"],
    }
    rows = {k: [e for e in v if start <= e["ts"] < end] for k, v in rows.items() if v}
    colors = {"forward": "tab:blue", "backward": "tab:orange", "allreduce": "tab:green", "gloo": "tab:gray"}
    fig, ax = plt.subplots(figsize=(11, 1 + 0.7 * len(rows)))
    for y, (row, found) in enumerate(reversed(list(rows.items()))):
        color = next(c for key, c in colors.items() if key in row)
        for e in found:
            left, width = (e["ts"] - start) / 1e3, e["dur"] / 1e3
            ax.broken_barh([(left, width)], (y - 0.35, 0.7), facecolors=color, edgecolors="white", linewidth=0.5)
            label = e["name"].replace("goddp ", "").replace(" forward", "").replace(" backward", "")
            label = label.replace(" allreduce", "").replace("piece ", "p").replace("bucket ", "b")
            if width > (end - start) / 1e3 / 60 and e["name"].startswith("goddp"):
                ax.text(left + width / 2, y, label.split(" (")[0], ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(reversed(list(rows))))
    ax.set_xlabel("ms from the start of the profiled step (rank 0)")
    ax.set_title("torch.profiler trace of one goddp step: pieces (p) and DDP buckets' allreduces (b)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(png) or ".", exist_ok=True)
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    main()
