"""Helpers for goddp's multi-rank tests.

Those tests run their checks inside each rank when pytest itself runs under
torchrun (``torchrun --nproc_per_node=2 -m pytest tests/python/*/test_dist_*.py``).
Under a plain pytest they skip those checks and instead launch that same
torchrun command as a subprocess, with a hard timeout, so a plain run covers
them too, and a torchrun run does not pay for them twice.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parents[2]


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def under_torchrun() -> bool:
    """Whether this pytest process is one rank of a launch: torchrun (which
    sets TORCHELASTIC_RUN_ID and LOCAL_WORLD_SIZE, even for one process), or
    another launcher that sets the env:// variables for several ranks. The
    one definition of the suites (conftest's dist_group forms its process
    group from the environment then; the launching tests skip)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_WORLD_SIZE" in os.environ or world_size() > 1


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


needs_two_ranks = pytest.mark.skipif(
    world_size() < 2,
    reason="runs inside each rank under torchrun; a plain pytest runs it through test_*_under_torchrun",
)


def leave_without_finalizing(code: int) -> None:
    """Ends a rank's process now, with exit status code, skipping Python's
    finalization.

    Note [Leaving a gloo rank]: DDP keeps its gloo process group alive past
    destroy_process_group, and a gloo worker thread that drops its last work
    while Python finalizes tries to take the GIL, is ended by Python and
    aborts the process ("terminate called without an active exception"; a
    torch race, pytorch/pytorch#179291, seen in the elastic test about once
    in ten runs). A rank that has said all it has to say leaves with
    os._exit instead."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def worker_result_path(out: str | Path, rank: int) -> Path:
    """Where a worker process of a test (_elastic_worker.py,
    _compiled_autograd_worker.py) leaves what rank saw, for the test to read."""
    return Path(out, f"rank{rank}.json")


def report_and_leave(out: str | Path, rank: int, result: dict, before_leaving=lambda: None) -> None:
    """A worker's last act: writes result where worker_result_path says,
    calls before_leaving, and leaves (Note [Leaving a gloo rank])."""
    worker_result_path(out, rank).write_text(json.dumps(result))
    before_leaving()
    leave_without_finalizing(0)


def short_timeout_group(seconds: float = 60.0):
    """A new gloo group over all ranks whose collectives give up after
    `seconds` instead of the default 30 minutes, so a disagreement between
    ranks fails the test instead of hanging it. Every rank must call it."""
    from _parity_harness import ensure_process_group

    ensure_process_group()
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))


def run_file_under_torchrun(test_file: str, nproc: int = 2, timeout: float = 300.0, extra_env=None):
    """Run one test file under torchrun with nproc ranks (gloo, CPU).

    Returns (returncode, combined output). A run that exceeds `timeout` is
    killed, process group and all, and reported as a failure by the caller.
    """
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra_env or {})
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", test_file,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return None, out + f"\n[killed after {timeout:.0f} s]"
    return proc.returncode, out


def passed_counts(output: str) -> list[int]:
    """The 'N passed' counts of each rank's pytest summary line."""
    return [int(m) for m in re.findall(r"(\d+) passed", output)]


# Set by `make test` (Makefile), never by the library.
TORCHRUN_LATER_ENV = "GODDP_TESTS_TORCHRUN_LATER"


def assert_file_passes_under_torchrun(test_file: str, *, cases_per_rank: int, timeout: float, nproc: int = 2) -> None:
    """For a plain pytest run: run test_file's multi-rank cases under
    torchrun with nproc ranks and require every rank to pass all of them.
    Inside torchrun those cases already ran in this process, so this skips."""
    if under_torchrun():
        pytest.skip("already inside torchrun: the cases above ran in this process")
    if os.environ.get(TORCHRUN_LATER_ENV) == "1" and nproc == 2:
        # `make test` runs every test_dist_* file under torchrun (two
        # ranks) in its pytest-dist step; launching them here
        # too would run each two-rank case twice. Other sizes run here.
        pytest.skip("make test runs this file's two-rank cases under torchrun in pytest-dist")
    returncode, output = run_file_under_torchrun(test_file, nproc=nproc, timeout=timeout)
    assert returncode == 0, output[-6000:]
    # Every rank ran every case (the launching test itself skips inside torchrun).
    assert passed_counts(output) == [cases_per_rank] * nproc, output[-6000:]
