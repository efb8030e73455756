"""Runs code against the test build of libgoddp.so, the only one with
goddp_debug_panic (Go tag goddp_testhooks; `make testhooks` builds it into
build/testhooks/libgoddp.so).

The code runs in a child interpreter because the test build carries a Go
runtime of its own, and the parent may already have loaded the shipped one:
one process gets one Go runtime. The child loads the test build through the
binding's loader (goddp.native.extension.load(path)) before anything loads
the shipped one, so goddp.native.extension and the backend use it as they
would the real one; `ext` is that Library, with debug_panic() bound from
goddp.h's "cdef testhooks" region.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIBRARY = os.path.join(ROOT, "build", "testhooks", "libgoddp.so")

_PRELUDE = """\
from goddp.native import extension as _native
ext = _native.load({path!r})
_native.ffi.cdef(_native.declarations("cdef testhooks"))
ext.debug_panic = lambda: ext._go(ext.lib.goddp_debug_panic)
"""


def library_path() -> str:
    """The test build's file; fails the test (never skips) when it is not
    built, because the panic tests are the proof that panics are recovered."""
    if not os.path.exists(LIBRARY):
        pytest.fail(f"the test build of libgoddp.so is not at {LIBRARY}; build it with `make testhooks`")
    return LIBRARY


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
        [sys.executable, "-c", _PRELUDE.format(path=library_path()) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=HERE,
    )
    assert proc.returncode == 0, f"child exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout
