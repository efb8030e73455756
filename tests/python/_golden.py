"""Golden files: expected text kept beside a test, in its folder's
``testdata/``. ``GODDP_UPDATE_GOLDENS=1`` rewrites them from what the code
now gives (review the diff before committing)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

UPDATE_ENV = "GODDP_UPDATE_GOLDENS"


def check_golden(test_file: str, name: str, got: str) -> None:
    """Asserts that got is testdata/<name>.golden beside test_file, byte for
    byte (or writes it, under GODDP_UPDATE_GOLDENS=1)."""
    path = Path(test_file).resolve().parent / "testdata" / f"{name}.golden"
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_bytes(got.encode("utf-8"))
        return
    assert path.is_file(), f"{path} is missing (run with {UPDATE_ENV}=1 to create it)"
    want = path.read_bytes().decode("utf-8")
    if got != want:
        diff = "\n".join(difflib.unified_diff(want.split("\n"), got.split("\n"), "golden", "got", lineterm=""))
        raise AssertionError(f"{path.name} differs (run with {UPDATE_ENV}=1 if intended):\n{diff}")
