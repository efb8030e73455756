"""Shared fixtures for goddp's Python tests.

- ``dist_group``: a default process group for DDP. In a plain pytest process
  it is a 1-rank gloo group over a FileStore in a temporary directory (no
  ports); under ``torchrun ... -m pytest`` it is formed from torchrun's
  environment (RANK, WORLD_SIZE, MASTER_ADDR, ...). A group that already
  exists is reused. "Under torchrun" is _dist_util.under_torchrun, the one
  definition; tests marked ``single_process`` skip there.
- ``native_module``: the binding's Library (libgoddp.so), loaded; fails
  the test when the library is not built.
- every test starts with a fresh Dynamo cache and no recorded plans.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parents[2]
_PYTHON_SRC = REPO_ROOT / "python"
if str(_PYTHON_SRC) not in sys.path:
    # Lets the suites run from a checkout before `pip install -e .`.
    sys.path.insert(0, str(_PYTHON_SRC))

_HELPERS = str(Path(__file__).resolve().parent)
if _HELPERS not in sys.path:
    # The group folders' tests import the helpers beside this file.
    sys.path.insert(0, _HELPERS)

if str(REPO_ROOT) not in sys.path:
    # The suites use bench's measures (checkpoint_models, gpu_check) wherever
    # pytest starts; last, so that nothing there shadows an installed module.
    sys.path.append(str(REPO_ROOT))

import goddp  # noqa: E402  (after the path tweaks)
from _dist_util import (  # noqa: E402
    RANK_REPORTS_ENV,
    RankCases,
    leave_without_finalizing,
    rank,
    rank_report_path,
    short_timeout_group,
    under_torchrun,
)


@dataclass(frozen=True)
class DistGroup:
    rank: int
    world_size: int


@pytest.fixture(scope="session")
def dist_group():
    """The default process group (see module doc); destroyed at session end
    only if this fixture created it."""
    created = False
    if not dist.is_initialized():
        if under_torchrun():
            dist.init_process_group("gloo")
        else:
            store_dir = tempfile.mkdtemp(prefix="goddp_pg_")
            dist.init_process_group(
                "gloo", init_method=f"file://{os.path.join(store_dir, 'store')}", rank=0, world_size=1
            )
        created = True
    yield DistGroup(dist.get_rank(), dist.get_world_size())
    if created and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def group(dist_group):
    """A group over every rank whose collectives give up after 120 s (a
    file needing another bound defines its own)."""
    return short_timeout_group(120)


_session_status: int | None = None
# Under torchrun: what this rank collected and ran (Note [Every two-rank file passes a case]).
_rank_cases = RankCases() if under_torchrun() else None


def pytest_collectreport(report):
    if _rank_cases is not None:
        _rank_cases.collected(report)


def pytest_runtest_logreport(report):
    if _rank_cases is not None:
        _rank_cases.ran(report)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """Under torchrun: a test_dist_* file that passed no case on this rank
    fails the run (Note [Every two-rank file passes a case]); the launchers'
    folder gets this rank's report. Then the status is kept for
    pytest_unconfigure."""
    global _session_status
    _check_rank_cases(session)
    _session_status = int(session.exitstatus)


def _check_rank_cases(session):
    if _rank_cases is None or session.config.option.collectonly:
        return
    _rank_cases.items(session.items)
    folder = os.environ.get(RANK_REPORTS_ENV)
    if folder:
        rank_report_path(folder, rank()).write_text(json.dumps(_rank_cases.report()))
    problems = _rank_cases.problems()
    if problems and session.exitstatus == pytest.ExitCode.OK:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write("\n")
        reporter.write_sep("=", "goddp: a two-rank file passed no case on this rank", red=True)
        for line in problems:
            reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Under torchrun, a rank leaves once pytest and its plugins have
    reported (Note [Leaving a gloo rank] in _dist_util)."""
    if under_torchrun() and _session_status is not None:
        leave_without_finalizing(_session_status)


def pytest_collection_modifyitems(config, items):
    if not under_torchrun():
        return
    skip = pytest.mark.skip(reason="single_process: runs only in a plain (non-torchrun) pytest process")
    for item in items:
        if item.get_closest_marker("single_process"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_plans():
    torch._dynamo.reset()
    goddp.clear_plans()
    yield
    torch._dynamo.reset()


# --------------------------------------------------------------------------
# The Go library


@pytest.fixture(scope="session")
def native_module():
    """The Library of goddp.native.extension, loaded (the Go planner). A
    missing library fails the test rather than skipping it: every backend
    test needs the real planner."""
    try:
        from goddp.native import extension as _native

        return _native.load()
    except Exception as exc:
        pytest.fail(
            f"goddp's Go library unavailable ({type(exc).__name__}: {exc}); "
            "build it with `make install` (or `pip install --no-build-isolation -e .`)"
        )
