"""The built library python/goddp/libgoddp.so and setup.py's Go checks.

The library must be one self-contained shared object that needs nothing
but glibc (Go's runtime is inside it), exporting goddp.h's functions and no
other goddp_ symbol: the test hook goddp_debug_panic lives only in the test
build.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

import _testhooks
from goddp.native import extension as _native

pytestmark = pytest.mark.single_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def library_path() -> str:
    path = _native.library_path()
    assert os.path.exists(path), "libgoddp.so is not built; run `make install`"
    return path


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) is not installed")
    return path


def test_needed_libraries_are_glibc_only(library_path):
    out = subprocess.run(
        [_tool("readelf"), "-d", library_path], capture_output=True, text=True, check=True
    ).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert needed, out
    # Only the C library family: Go's runtime needs nothing else here.
    assert all(n.split(".so")[0] in {"libc", "libpthread", "libdl", "libm", "ld-linux-x86-64"} for n in needed), needed


def test_it_exports_the_headers_functions(library_path):
    """The goddp_ symbols are exactly the functions that goddp.h declares
    (the binding calls them by name); the rest is Go's cgo glue."""
    out = subprocess.run(
        [_tool("nm"), "-D", "--defined-only", library_path], capture_output=True, text=True, check=True
    ).stdout
    exported = sorted(line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("goddp_"))
    declared = sorted(set(re.findall(r"\b(goddp_\w+)\(", _native.declarations())))
    assert exported == declared and len(declared) == 10, (exported, declared)


def test_go_symbols_are_linked_in(library_path):
    """The planner is really inside the .so, not expected from some other
    library at run time."""
    out = subprocess.run(
        [_tool("nm"), "-D", "--undefined-only", library_path], capture_output=True, text=True, check=True
    ).stdout
    assert "goddp_" not in out
    with open(library_path, "rb") as f:
        assert b"github.com/goddp/goddp/planner" in f.read()


def test_the_panic_hook_does_not_ship(library_path):
    """goddp_debug_panic is compiled only into the test build (Go tag
    goddp_testhooks). Go records every function's name in the binary, so the
    name's absence means the code is absent; the test build, which has the
    hook, shows that the check can see it."""
    with open(library_path, "rb") as f:
        shipped = f.read()
    assert b"goddp_debug_panic" not in shipped and b"panicOnPurpose" not in shipped
    with open(_testhooks.library_path(), "rb") as f:
        assert b"panicOnPurpose" in f.read()


def _run_setup(tmp_path, go: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GO=go)
    return subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "build_ext",
            "--build-lib",
            str(tmp_path / "lib"),
            "--build-temp",
            str(tmp_path / "temp"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_missing_go_is_a_clear_error(tmp_path):
    result = _run_setup(tmp_path, str(tmp_path / "no-such-go"))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "Go toolchain" in output and "was not found" in output and "https://go.dev/dl" in output, output
    assert not (tmp_path / "lib").exists()


def test_old_go_is_a_clear_error(tmp_path):
    fake_go = tmp_path / "go"
    fake_go.write_text('#!/bin/sh\nif [ "$1 $2" = "env GOVERSION" ]; then echo go1.20.3; exit 0; fi\nexit 3\n')
    fake_go.chmod(fake_go.stat().st_mode | stat.S_IEXEC)
    result = _run_setup(tmp_path, str(fake_go))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "go1.20.3" in output and "requires Go 1.26 or newer" in output, output
