"""The suites' own rules: tests/README.md lists every file, and "under
torchrun" has one definition."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

import _dist_util
import conftest

HERE = Path(__file__).resolve().parents[1]
README = HERE.parent / "README.md"


def test_readme_lists_every_test_file_once():
    listed = re.findall(r"^\| `(test_\w+\.py)` \|", README.read_text(encoding="utf-8"), flags=re.M)
    on_disk = sorted(p.name for p in HERE.glob("*/test_*.py"))
    assert sorted(listed) == on_disk, "tests/README.md's Groups table must list each tests/python/*/test_*.py once"
    assert list(HERE.glob("test_*.py")) == [], "every test file sits in its group's folder"


def test_each_file_sits_in_the_folder_its_row_names():
    rows = re.findall(r"^\| `(test_\w+\.py)` \|.*\| `(\w+)/` \|\s*$", README.read_text(encoding="utf-8"), flags=re.M)
    assert rows and all((HERE / folder / name).is_file() for name, folder in rows), rows


def test_readme_names_every_helper():
    text = README.read_text(encoding="utf-8")
    helpers = [p.name for p in HERE.glob("*.py") if not p.name.startswith("test_")]
    assert [h for h in helpers if f"`{h}`" not in text] == []


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, False),
        ({"WORLD_SIZE": "1"}, False),
        ({"WORLD_SIZE": "2", "RANK": "1"}, True),
        ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "1"}, True),
        ({"LOCAL_WORLD_SIZE": "1"}, True),
    ],
)
def test_under_torchrun(monkeypatch, env, expected):
    for var in ("WORLD_SIZE", "RANK", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert _dist_util.under_torchrun() is expected


def test_one_definition_of_under_torchrun():
    assert conftest.under_torchrun is _dist_util.under_torchrun
    defined = []
    for path in list(HERE.glob("*.py")) + list(HERE.glob("*/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and "under_torchrun" in node.name and not node.name.startswith("test_"):
                defined.append(f"{path.name}:{node.name}")
    assert sorted(defined) == ["_dist_util.py:assert_file_passes_under_torchrun", "_dist_util.py:run_file_under_torchrun", "_dist_util.py:under_torchrun"]


def test_pytest_recurses_into_every_group_folder(pytestconfig):
    """pytest skips folders matching norecursedirs (its default lists
    `dist` and `build`): a group folder so named would silently drop its
    suites from a plain `pytest tests/python`."""
    patterns = pytestconfig.getini("norecursedirs")
    folders = sorted(p.name for p in HERE.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert folders, HERE
    assert [f for f in folders if any(fnmatch.fnmatch(f, pattern) for pattern in patterns)] == []


class _Report:
    def __init__(self, nodeid, outcome, when="call", longrepr=None):
        self.nodeid, self.outcome, self.when, self.longrepr = nodeid, outcome, when, longrepr
        self.passed, self.failed, self.skipped = outcome == "passed", outcome == "failed", outcome == "skipped"


class _Item:
    def __init__(self, nodeid, single_process=False):
        self.nodeid, self._single = nodeid, single_process

    def get_closest_marker(self, name):
        return object() if name == "single_process" and self._single else None


def _rank_cases(collect=(), items=(), ran=()):
    cases = _dist_util.RankCases()
    for report in collect:
        cases.collected(report)
    for report in ran:
        cases.ran(report)
    cases.items(items)
    return cases


D = "tests/python/distributed/"


def test_a_two_rank_file_that_passes_a_case_is_fine():
    """Note [Every two-rank file passes a case]: one case passed, the
    launcher-only file (single_process) and other folders' files ask nothing."""
    cases = _rank_cases(
        items=[_Item(D + "test_dist_a.py::t1"), _Item(D + "test_dist_a.py::t2"),
               _Item(D + "test_dist_elastic.py::t", single_process=True), _Item("tests/python/x/test_b.py::t")],
        ran=[_Report(D + "test_dist_a.py::t1", "passed", "setup"), _Report(D + "test_dist_a.py::t1", "passed"),
             _Report(D + "test_dist_a.py::t2", "skipped", "setup")],
    )
    assert cases.problems() == []
    assert cases.passed() == [D + "test_dist_a.py::t1"]


def test_a_two_rank_file_whose_cases_all_skip_fails():
    cases = _rank_cases(items=[_Item(D + "test_dist_a.py::t1")], ran=[_Report(D + "test_dist_a.py::t1", "skipped", "setup")])
    assert cases.problems() == [f"{D}test_dist_a.py: none of its 1 cases passed on rank 0 (t1 skipped)"]


def test_a_two_rank_file_skipped_at_collection_fails():
    """A module-level importorskip: pytest collects nothing from the file."""
    why = (D + "test_dist_a.py", 2, "Skipped: could not import 'x'")
    cases = _rank_cases(collect=[_Report(D + "test_dist_a.py", "skipped", "collect", why), _Report("tests/python/x/test_b.py", "skipped", "collect", why)])
    assert cases.problems() == [f"could not be collected: {D}test_dist_a.py: Skipped: could not import 'x'"]


def test_a_case_whose_teardown_fails_did_not_pass():
    cases = _rank_cases(items=[_Item(D + "test_dist_a.py::t1")],
                        ran=[_Report(D + "test_dist_a.py::t1", "passed"), _Report(D + "test_dist_a.py::t1", "failed", "teardown")])
    assert cases.passed() == [] and cases.problems()


def test_every_launcher_runs_only_in_a_plain_pytest():
    """A launcher (a call to assert_file_passes_under_torchrun) inside
    torchrun would skip there and count as a case that did not pass."""
    unmarked = []
    for path in HERE.glob("*/test_dist_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and "assert_file_passes_under_torchrun" in ast.unparse(node):
                marks = [ast.unparse(d) for d in node.decorator_list]
                if "pytest.mark.single_process" not in marks:
                    unmarked.append(f"{path.name}::{node.name}")
    assert unmarked == []
