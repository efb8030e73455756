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
