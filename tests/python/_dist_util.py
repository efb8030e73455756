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
import tempfile
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


def fresh() -> None:
    """Dynamo and goddp's plan records as at the start of a test (conftest
    does this between tests): between the eager and the compiled run of
    one test."""
    import torch._dynamo

    import goddp

    torch._dynamo.reset()
    goddp.clear_plans()


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


# Set by `make test` (scripts/test_all.sh), never by the library.
TORCHRUN_LATER_ENV = "GODDP_TESTS_TORCHRUN_LATER"
# Set by the launcher below: the folder where each rank writes what it ran.
RANK_REPORTS_ENV = "GODDP_TESTS_RANK_REPORTS"


def rank_report_path(folder: str | Path, rank: int) -> Path:
    return Path(folder, f"rank{rank}.report.json")


class RankCases:
    """What one rank of a torchrun'd pytest collected and how each case
    ended (conftest's hooks feed it under torchrun).

    Note [Every two-rank file passes a case]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    torchrun's exit status says only that no case failed: a test_dist_*
    file whose cases all skip on a rank (a module-level importorskip, a
    WORLD_SIZE that never reached the rank) would pass unnoticed. So under
    torchrun each rank, at the end of its session, fails the run when a
    test_dist_* file could not be collected, or holds cases that may run
    here (not single_process) and passed none of them (`make pytest-dist`,
    and so `make test`). The launchers (assert_file_passes_under_torchrun)
    ask more: every such case passes on every rank, the cases being what
    pytest itself collected in that run, never a hand count that can go
    stale."""

    def __init__(self) -> None:
        self.expected: list[str] = []
        self.outcomes: dict[str, str] = {}
        self.uncollected: list[str] = []

    @staticmethod
    def is_two_rank_file(nodeid: str) -> bool:
        return re.fullmatch(r"test_dist_\w+\.py", Path(nodeid.split("::")[0]).name) is not None

    def collected(self, report) -> None:
        if report.skipped and self.is_two_rank_file(report.nodeid):
            why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
            self.uncollected.append(f"{report.nodeid}: {why}")

    def items(self, items) -> None:
        self.expected = [item.nodeid for item in items if not item.get_closest_marker("single_process")]

    def ran(self, report) -> None:
        # A case passed if its call passed and none of its phases failed or skipped.
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped:
            self.outcomes.setdefault(report.nodeid, "skipped")
        elif report.when == "call":
            self.outcomes.setdefault(report.nodeid, "passed")

    def passed(self) -> list[str]:
        return [nodeid for nodeid in self.expected if self.outcomes.get(nodeid) == "passed"]

    def problems(self) -> list[str]:
        """Why this rank's run must fail though no case failed (the Note)."""
        found = [f"could not be collected: {u}" for u in self.uncollected]
        files = {}
        for nodeid in self.expected:
            if self.is_two_rank_file(nodeid):
                files.setdefault(nodeid.split("::")[0], []).append(nodeid)
        passed = set(self.passed())
        for path, cases in sorted(files.items()):
            if not passed.intersection(cases):
                found.append(f"{path}: none of its {len(cases)} cases passed on rank {rank()} ({self._ends(cases)})")
        return found

    def _ends(self, cases) -> str:
        return ", ".join(f"{c.split('::', 1)[-1]} {self.outcomes.get(c, 'not run')}" for c in cases)

    def report(self) -> dict:
        return {"rank": rank(), "expected": self.expected, "outcomes": self.outcomes,
                "uncollected": self.uncollected}


def assert_file_passes_under_torchrun(test_file: str, *, timeout: float, nproc: int = 2) -> None:
    """For a plain pytest run: run test_file under torchrun with nproc ranks
    and require every rank to pass every case pytest collected there that may
    run under torchrun (Note [Every two-rank file passes a case]).
    Inside torchrun those cases already ran in this process, so this skips."""
    if under_torchrun():
        pytest.skip("already inside torchrun: the cases above ran in this process")
    if os.environ.get(TORCHRUN_LATER_ENV) == "1" and nproc == 2:
        # `make test` runs every test_dist_* file under torchrun (two
        # ranks) in its pytest-dist step; launching them here
        # too would run each two-rank case twice. Other sizes run here.
        pytest.skip("make test runs this file's two-rank cases under torchrun in pytest-dist")
    with tempfile.TemporaryDirectory(prefix="goddp_ranks_") as folder:
        returncode, output = run_file_under_torchrun(
            test_file, nproc=nproc, timeout=timeout, extra_env={RANK_REPORTS_ENV: folder}
        )
        assert returncode == 0, output[-6000:]
        reports = []
        for r in range(nproc):
            path = rank_report_path(folder, r)
            assert path.is_file(), f"rank {r} wrote no report\n{output[-6000:]}"
            reports.append(json.loads(path.read_text()))
    for report in reports:
        expected, outcomes = report["expected"], report["outcomes"]
        assert expected, f"rank {report['rank']} collected no case of {test_file}: {report['uncollected']}"
        not_passed = {nodeid: outcomes.get(nodeid, "not run") for nodeid in expected if outcomes.get(nodeid) != "passed"}
        assert not_passed == {}, f"rank {report['rank']}: {not_passed}\n{output[-6000:]}"
    assert all(report["expected"] == reports[0]["expected"] for report in reports), [r["expected"] for r in reports]
