"""The built extension goddp._goddp and setup.py's Go checks.

The extension must be one self-contained shared object: the Go planner is
linked in statically, libpython is not a dependency (the interpreter
provides its symbols), and the only exported symbol is PyInit__goddp, so
that the Go runtime's and the bridge's symbols cannot clash with another Go
library in the same process.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys

import pytest

import _testhooks

pytestmark = pytest.mark.single_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def extension_path() -> str:
    # find_spec locates the file without loading it (and the Go runtime).
    spec = importlib.util.find_spec("goddp._goddp")
    assert spec is not None and spec.origin, "goddp._goddp is not built; run `make install`"
    return spec.origin


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} (binutils) is not installed")
    return path


def test_needed_libraries_exclude_libpython(extension_path):
    out = subprocess.run(
        [_tool("readelf"), "-d", extension_path], capture_output=True, text=True, check=True
    ).stdout
    needed = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert needed, out
    assert not [n for n in needed if "python" in n], needed
    # Only the C library family: Go's runtime needs nothing else here.
    assert all(n.split(".so")[0] in {"libc", "libpthread", "libdl", "libm", "ld-linux-x86-64"} for n in needed), needed


def test_only_the_module_init_is_exported(extension_path):
    out = subprocess.run(
        [_tool("nm"), "-D", "--defined-only", extension_path], capture_output=True, text=True, check=True
    ).stdout
    symbols = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert symbols == ["PyInit__goddp"], symbols


def test_go_symbols_are_linked_in(extension_path):
    """The planner is really inside the .so (statically), not expected from
    some other library at run time."""
    out = subprocess.run(
        [_tool("nm"), "-D", "--undefined-only", extension_path], capture_output=True, text=True, check=True
    ).stdout
    assert "goddp_plan_graph" not in out
    with open(extension_path, "rb") as f:
        assert b"github.com/goddp/goddp/planner" in f.read()


def test_the_panic_hook_does_not_ship(extension_path):
    """goddp_debug_panic is compiled only into the test build (Go tag
    goddp_testhooks). Go records every function's name in the binary, so the
    name's absence means the code is absent; the test build, which has the
    hook, shows that the check can see it."""
    with open(extension_path, "rb") as f:
        shipped = f.read()
    assert b"goddp_debug_panic" not in shipped and b"panicOnPurpose" not in shipped
    with open(_testhooks.extension_path(), "rb") as f:
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
