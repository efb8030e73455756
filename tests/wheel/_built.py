"""The distributions the wheel suites test: the one `make wheel`/`make sdist`
left in dist/, or the one an environment variable names."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def one_built(pattern: str, what: str, env_var: str) -> Path:
    """The file env_var names, else the one dist/ file matching pattern;
    fails the test unless there is exactly one such file."""
    named = os.environ.get(env_var)
    found = [named] if named else sorted(glob.glob(str(ROOT / "dist" / pattern)))
    if len(found) != 1 or not os.path.isfile(found[0]):
        pytest.fail(f"expected one {what} (set {env_var}, or run `make {what}`); found {found}")
    return Path(found[0]).resolve()


def built_wheel() -> Path:
    return one_built("goddp-*.whl", "wheel", "GODDP_WHEEL")
