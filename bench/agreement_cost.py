"""What goddp's cross-rank agreement costs, against a barrier on the same group.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 -m bench.agreement_cost [--rounds 200]

goddp exchanges one statement per rank per DDP module and run, through the
default c10d store (goddp.measure.plan_exchange). This times that exchange,
interleaved round by round with a gloo ``dist.barrier()`` on the same ranks
(the cheapest collective a user would know), and prints medians, spreads and
the ratio. Rank 0 prints.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

from goddp.measure import plan_exchange


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    store = _get_default_store()
    exchange = plan_exchange(store, "goddp/bench", rank, range(size), timeout_s=60)
    times: dict[str, list[float]] = {"exchange": [], "barrier": []}
    for round_ in range(args.rounds):
        order = ("exchange", "barrier") if round_ % 2 == 0 else ("barrier", "exchange")
        for what in order:
            dist.barrier()  # start together
            started = time.perf_counter()
            if what == "exchange":
                exchange()
            else:
                dist.barrier()
            times[what].append(time.perf_counter() - started)
    if rank == 0:
        for what, values in times.items():
            q = statistics.quantiles(values, n=10)
            print(
                f"{what:9s} median {1e3 * statistics.median(values):7.3f} ms  "
                f"p10 {1e3 * q[0]:7.3f}  p90 {1e3 * q[-1]:7.3f}  (n={len(values)})"
            )
        ratio = statistics.median(times["exchange"]) / statistics.median(times["barrier"])
        print(f"exchange / barrier: {ratio:.2f}x (ranks={size}, store={type(store).__name__})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
