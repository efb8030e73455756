"""The process group of a one-process benchmark."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch.distributed as dist


def one_rank_group(prefix: str = "goddp_bench_") -> str:
    """A default gloo group of one rank over a FileStore in a new temporary
    folder (no ports), for the benchmarks that time one process. Returns
    the folder; it is removed when the process exits."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'store')}", rank=0, world_size=1)
    return folder
