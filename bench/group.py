"""The process group of a one-process benchmark."""

from __future__ import annotations

import os
import tempfile

import torch.distributed as dist


def one_rank_group(prefix: str = "goddp_bench_") -> None:
    """A default gloo group of one rank over a FileStore in a new temporary
    folder (no ports), for the benchmarks that time one process."""
    store = os.path.join(tempfile.mkdtemp(prefix=prefix), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
