"""scripts/check_wheel.py, the gate of `make wheel`, refuses bad wheels.

Each case copies the checked wheel from dist/ (GODDP_WHEEL) and breaks one
thing: a newer tag than manylinux_2_28, a tag that is not py3-none, a library
built by this machine's gcc (glibc 2.34 symbols), the test build's library
(the panic hook), a subpackage or the header left out. The check must fail and
name the fault; the wheel as built must pass.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from _built import built_wheel

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = os.path.dirname(sys.executable)


def _check(wheel: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_wheel.py"), str(wheel)],
        capture_output=True, text=True, env=env, timeout=300,
    )


def _rewrite(src: Path, dst: Path, *, drop: str | None = None, replace: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            if item.filename == drop:
                continue
            data = (replace or {}).get(item.filename)
            zout.writestr(item, zin.read(item.filename) if data is None else data)
    return dst


def _built_library(*parts: str) -> bytes:
    found = glob.glob(str(ROOT.joinpath(*parts)))
    if not found:
        pytest.fail(f"{'/'.join(parts)} is not built; run `make install testhooks`")
    return Path(found[0]).read_bytes()


def test_the_built_wheel_passes():
    result = _check(built_wheel())
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'auditwheel: consistent with "manylinux_' in result.stdout


@pytest.mark.parametrize(
    ("case", "fault"),
    [
        ("tag manylinux_2_34", "newer than manylinux_2_28"),
        ("tag cp311-cp311", "is not py3-none"),
        ("gcc-built library", "GLIBC_2.34"),
        ("test-hook library", "test hooks shipped"),
        ("subpackage left out", "packages missing from the wheel: ['goddp/ranks']"),
        ("header left out", "goddp/goddp.h is missing"),
    ],
)
def test_a_bad_wheel_fails_and_names_the_fault(tmp_path, case, fault):
    good = built_wheel()
    so = "goddp/libgoddp.so"
    if case == "tag manylinux_2_34":
        bad = _rewrite(good, tmp_path / good.name.replace("manylinux_2_28", "manylinux_2_34"))
    elif case == "tag cp311-cp311":
        bad = _rewrite(good, tmp_path / good.name.replace("py3-none", "cp311-cp311"))
    elif case == "gcc-built library":
        # `make install` builds the in-place library with this machine's gcc and glibc.
        bad = _rewrite(good, tmp_path / good.name, replace={so: _built_library("python", "goddp", "libgoddp.so")})
    elif case == "test-hook library":
        hooks = _built_library("build", "testhooks", "libgoddp.so")
        bad = _rewrite(good, tmp_path / good.name, replace={so: hooks})
    elif case == "header left out":
        bad = _rewrite(good, tmp_path / good.name, drop="goddp/goddp.h")
    else:
        bad = _rewrite(good, tmp_path / good.name, drop="goddp/ranks/__init__.py")
    result = _check(bad)
    assert result.returncode != 0, result.stdout
    assert fault in result.stderr, result.stderr
