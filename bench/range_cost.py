"""What goddp's profiler ranges cost with no profiler recording: interleaved
steps of three identical goddp-compiled DDP copies in one process (a 1-rank
gloo group, so the allreduce is nearly free and any Python cost of the
ranges is as visible as it can be):

- "no ranges": the stitched loop without them (goddp.measure.PieceRanges("off"));
- "ranges": what goddp ships, the ranged loop only while a profiler records
  (one torch.autograd._profiler_enabled() call per stitched call);
- "ranges, ungated": the ranged loop on every call (PieceRanges("always")):
  a record_function per piece forward and hooks on each piece's backward.

    .venv/bin/python -m bench.range_cost [--steps 400] [--layers 8]

The GPT of bench.models ("tiny" preset, --layers blocks: one piece per block
plus the two edges), aot_eager, block cuts. Prints per variant the median
step and its p10-p90 spread, and the median of the paired differences to
"no ranges" (same step index, the variants' order rotated each step) with
their p10-p90.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench import models
from bench.group import one_rank_group
from bench.stats import summarize

VARIANTS = ("no ranges", "ranges", "ranges, ungated")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.05)
    args = ap.parse_args(argv)
    import goddp
    from goddp import measure

    torch.set_num_threads(1)
    one_rank_group("goddp_ranges_")
    work = models.build("gpt", "tiny", n_layer=args.layers)
    switches = {"no ranges": measure.PieceRanges("off"), "ranges": None, "ranges, ungated": measure.PieceRanges("always")}
    steps = {}
    for name in VARIANTS:
        ddp = DDP(copy.deepcopy(work.model), bucket_cap_mb=args.bucket_cap_mb)
        compiled = torch.compile(ddp, backend=goddp.backend(inner="aot_eager", log_plan=False))
        switch = switches[name]

        def step(ddp=ddp, compiled=compiled) -> float:
            t = time.perf_counter()
            ddp.zero_grad(set_to_none=True)
            work.loss(compiled(*work.inputs)).backward()
            return time.perf_counter() - t

        with switch if switch is not None else contextlib.nullcontext():
            step()  # compiles and stitches
        if switch is not None:
            switch.check_used()
        for _ in range(5):
            step()
        steps[name] = step
    plan = goddp.last_plans()[-1]
    times = {name: [] for name in VARIANTS}
    for i in range(args.steps):
        order = VARIANTS[i % 3:] + VARIANTS[:i % 3]
        for name in order:
            times[name].append(steps[name]())
    base = times["no ranges"]
    print(f"{args.steps} interleaved steps of a {args.layers}-block GPT ({plan['num_pieces']} pieces, "
          f"{len(plan['buckets'])} buckets), 1 rank, aot_eager, no profiler recording:")
    for name in VARIANTS:
        s = summarize(times[name])
        line = f"  {name:16} median {s['median'] * 1e3:7.3f} ms (p10-p90 {s['p10'] * 1e3:.3f}-{s['p90'] * 1e3:.3f})"
        if name != "no ranges":
            d = summarize([t - b for t, b in zip(times[name], base)])
            line += (f"; paired difference median {d['median'] * 1e6:+.1f} us (p10-p90 {d['p10'] * 1e6:+.1f}"
                     f" to {d['p90'] * 1e6:+.1f}), {d['median'] / summarize(base)['median']:+.2%}")
        print(line)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
