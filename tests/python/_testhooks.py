"""Runs code against the test build of goddp._goddp, the only one with
debug_panic (Go tag goddp_testhooks, C macro GODDP_TESTHOOKS; `make
testhooks` builds it into build/testhooks/ext, see setup.py).

The code runs in a child interpreter because the test build carries a Go
runtime of its own, and the parent may already have loaded the shipped one:
one process gets one Go runtime. The child puts the test build into
sys.modules as goddp._goddp before anything loads it, so goddp.native.extension and
the backend use it as they would the real one.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXT_DIR = os.path.join(ROOT, "build", "testhooks", "ext", "goddp")

_PRELUDE = """\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("goddp._goddp", {path!r})
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
sys.modules["goddp._goddp"] = ext
"""


def extension_path() -> str:
    """The test build's file; fails the test (never skips) when it is not
    built, because the panic tests are the proof that panics are recovered."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(os.path.join(EXT_DIR, "_goddp" + suffix))
        if found:
            return found[0]
    pytest.fail(f"the test build of goddp._goddp is not in {EXT_DIR}; build it with `make testhooks`")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child interpreter that imports the suites'
    modules: the helpers beside this file and every group folder's tests on
    PYTHONPATH (as conftest and pytest give the suites themselves), and no
    GODDP_GOMAXPROCS unless extra sets it."""
    env = dict(os.environ)
    env.pop("GODDP_GOMAXPROCS", None)
    env.update(extra)
    groups = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)) and not d.startswith(("_", ".")))
    folders = [HERE] + [os.path.join(HERE, d) for d in groups]
    env["PYTHONPATH"] = os.pathsep.join(folders + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run(code: str, timeout: float = 300) -> str:
    """Runs code (with `ext` bound to the test build) in a child interpreter
    and returns its stdout; a non-zero exit fails the test with stderr."""
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE.format(path=extension_path()) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=HERE,
    )
    assert proc.returncode == 0, f"child exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout
