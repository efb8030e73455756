"""Golden files of the Python suites: text a test renders, compared with
the file beside it. GODDP_UPDATE_GOLDENS=1 rewrites the files instead (after
an intended change of words; review the diff)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

UPDATE_ENV = "GODDP_UPDATE_GOLDENS"


def check_golden(path: Path, got: str) -> None:
    """Asserts that path holds got, or writes it there under GODDP_UPDATE_GOLDENS=1."""
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    assert path.is_file(), f"{path} is missing; {UPDATE_ENV}=1 writes it"
    want = path.read_text(encoding="utf-8")
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), "rendered", n=1))
        raise AssertionError(f"{path.name} differs from what the test renders ({UPDATE_ENV}=1 rewrites it):\n{diff}")
