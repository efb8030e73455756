"""Golden files of the Python suites: a test compares the text it renders
with its file, or rewrites the file when GODDP_UPDATE_GOLDENS=1 (then
read the diff before committing it)."""

from __future__ import annotations

import os
from pathlib import Path

UPDATE_ENV = "GODDP_UPDATE_GOLDENS"


def check_golden(path: Path, got: str) -> None:
    """Asserts that `got` is the text of `path`, or writes it there under
    GODDP_UPDATE_GOLDENS=1."""
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    assert path.is_file(), f"{path} is missing (run with {UPDATE_ENV}=1 to write it)"
    assert got == path.read_text(encoding="utf-8"), f"{path.name} differs (run with {UPDATE_ENV}=1 if intended)"
