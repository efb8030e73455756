"""goddp.trace's own cost per step, without a link: interleaved steps of two
identical DDP copies in one process (a 1-rank gloo group, so the allreduce
is nearly free and the trace's Python work is as visible as it can be), one
of them inside goddp.trace.

    .venv/bin/python -m bench.trace_cost [--steps 300] [--buckets-mb 0.25]

Prints the median step of each and the median of the paired differences
(traced minus untraced, same step index): the absolute cost per step, to
compare with real step times. The step benchmark's traced variant gives
the ratio on a real link (bench.run ... --variants goddp_ddp goddp_ddp_traced).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench import models
from bench.group import one_rank_group


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.25)
    args = ap.parse_args(argv)
    import goddp

    torch.set_num_threads(1)
    one_rank_group("goddp_cost_")
    base = models.MLPStack(256, 8)
    plain, traced = (DDP(copy.deepcopy(base), bucket_cap_mb=args.bucket_cap_mb) for _ in range(2))
    x = torch.randn(32, 256)

    def step(ddp) -> float:
        t = time.perf_counter()
        ddp.zero_grad(set_to_none=True)
        ddp(x).sum().backward()
        return time.perf_counter() - t

    for ddp in (plain, traced):
        for _ in range(5):
            step(ddp)
    times = {"plain": [], "traced": []}
    with goddp.trace(traced, max_steps=args.steps) as tr:
        for i in range(args.steps):
            order = (("plain", plain), ("traced", traced)) if i % 2 else (("traced", traced), ("plain", plain))
            for name, ddp in order:
                times[name].append(step(ddp))
    buckets = len(tr.to_dict()["steps"][-1]["buckets"])
    diffs = [t - p for t, p in zip(times["traced"], times["plain"])]
    med = statistics.median(times["plain"])
    print(f"{args.steps} interleaved steps, {buckets} buckets per step: untraced median {med * 1e3:.2f} ms, "
          f"traced median {statistics.median(times['traced']) * 1e3:.2f} ms; paired difference median "
          f"{statistics.median(diffs) * 1e6:.0f} us ({statistics.median(diffs) / med:.1%} of this tiny step)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
