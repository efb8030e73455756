"""Golden files: expected text kept beside a test, in its folder's
``testdata/``. ``GODDP_UPDATE_GOLDENS=1`` rewrites them from what the code
now gives (review the diff before committing)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

UPDATE_ENV = "GODDP_UPDATE_GOLDENS"


def golden_path(test_file: str, name: str) -> Path:
    """testdata/<name>.golden beside test_file."""
    return Path(test_file).resolve().parent / "testdata" / f"{name}.golden"


def check_golden(path: Path, got: str) -> None:
    """Asserts that path holds got, byte for byte (or writes it there,
    under GODDP_UPDATE_GOLDENS=1)."""
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(got.encode("utf-8"))
        return
    assert path.is_file(), f"{path} is missing (run with {UPDATE_ENV}=1 to create it)"
    want = path.read_bytes().decode("utf-8")
    if got != want:
        diff = "\n".join(difflib.unified_diff(want.split("\n"), got.split("\n"), "golden", "got", lineterm=""))
        raise AssertionError(f"{path.name} differs (run with {UPDATE_ENV}=1 if intended):\n{diff}")
