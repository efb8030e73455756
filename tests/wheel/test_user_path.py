"""The user's path: goddp from the wheel alone, on a machine without Go.

`make test-wheel` (part of `make test`) builds dist/goddp-*.whl first and
names it in GODDP_WHEEL. Each test makes a fresh venv (no system site
packages), borrows torch from the running interpreter's environment through
a .pth file that names a directory of links to everything in that
environment but goddp (so the only goddp there is the one installed from the
wheel or the sdist), and runs with no Go on PATH.

- test_wheel_trains_two_ranks_outside_the_checkout: `pip install --no-index
  --no-deps` the wheel, then a 2-rank torchrun training from a directory
  outside the checkout (user_train.py): goddp must import from that venv,
  cut, align DDP's buckets to the pieces, and give eager DDP's parameters.
- test_sdist_without_go_fails_at_once_and_points_to_the_wheel: installing
  the sdist where Go is missing fails in seconds, naming Go and the wheel.
  Where Go is, installing the sdist builds the Go core: `make wheel` does
  just that (pip wheel of the sdist), so a broken sdist fails there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from _built import one_built

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def borrowed_site() -> Path:
    """The running environment's site-packages (torch and its dependencies,
    setuptools), for a .pth line in the fresh venv.

    It is named as it is, not through a directory of links to its entries:
    Dynamo tells torch's own files from user code by their paths, and a link
    makes torch's files look like user code. A directory named in a .pth file
    is only appended to sys.path: its own .pth files (the development
    install's editable goddp among them) are not processed, and the venv's
    own site-packages, where the wheel installs goddp, comes first. The test
    asserts that goddp did come from there."""
    import torch

    return Path(torch.__file__).resolve().parents[1]


def _path_without_go() -> str:
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not os.path.exists(os.path.join(d, "go"))]
    return os.pathsep.join(keep)


def _clean_env(venv: Path, *, with_go: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GO", "VIRTUAL_ENV", "PIP_"))}
    path = os.environ.get("PATH", "") if with_go else _path_without_go()
    env["PATH"] = os.pathsep.join([str(venv / "bin"), path])
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _make_venv(tmp_path: Path, borrowed: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "borrowed-torch.pth").write_text(f"{borrowed}\n")
    return venv


def _run(cmd, env, cwd, timeout) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_wheel_trains_two_ranks_outside_the_checkout(tmp_path, borrowed_site):
    wheel = one_built("goddp-*.whl", "wheel", "GODDP_WHEEL")
    venv = _make_venv(tmp_path, borrowed_site)
    env = _clean_env(venv, with_go=False)
    py = venv / "bin" / "python"
    work = tmp_path / "job"  # outside the checkout: the checkout's python/ is not importable from here
    work.mkdir()
    assert ROOT not in work.parents
    shutil.copy(HERE / "user_train.py", work / "train.py")

    check = _run([py, "-c", "import shutil; print(shutil.which('go'))"], env, work, 60)
    assert check.stdout.strip() == "None", check
    install = _run([py, "-m", "pip", "install", "--no-index", "--no-deps", wheel], env, work, 300)
    assert install.returncode == 0, install.stdout + install.stderr

    out = tmp_path / "out"
    out.mkdir()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    train = _run(
        [py, "-m", "torch.distributed.run", "--nproc_per_node=2", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=localhost:{port}", "train.py", out],
        env, work, 600,
    )
    assert train.returncode == 0, train.stdout[-4000:] + train.stderr[-8000:]

    site = next((venv / "lib").glob("python3*/site-packages")).resolve()
    for rank in (0, 1):
        r = json.loads((out / f"rank{rank}.json").read_text())
        assert Path(r["goddp_file"]).resolve().is_relative_to(site), r["goddp_file"]
        assert Path(r["library_file"]).resolve().is_relative_to(site), r["library_file"]
        assert r["go_on_path"] is None and Path(r["cwd"]) == work
        assert str(ROOT / "python") not in r["sys_path"] and str(work) not in r["sys_path"][1:], r["sys_path"]
        assert r["pieces"] and all(n > 1 for n in r["pieces"]), r  # cut, in every graph (the short batch's too)
        assert r["fallbacks"] == [None] * len(r["pieces"]), r["fallbacks"]
        assert r["aligned"][0] is True, r["aligned"]
        assert [int(x) for x in r["rebuilt_bucket_sizes"].split(", ")] == r["plan_bucket_bytes"], r
        assert r["max_param_diff"] <= 1e-6, r["max_param_diff"]
        assert r["goddp_losses"] == pytest.approx(r["eager_losses"], rel=1e-5, abs=1e-7)
    # The wheel, and its Go library, are what got installed.
    assert r["goddp_version"] in wheel.name


def _pip_install_sdist(venv: Path, sdist: Path, env, cwd) -> subprocess.CompletedProcess:
    # setuptools comes from the borrowed site, so no index is needed.
    return _run([venv / "bin" / "python", "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation", sdist],
                env, cwd, 600)


def test_sdist_without_go_fails_at_once_and_points_to_the_wheel(tmp_path, borrowed_site):
    sdist = one_built("goddp-*.tar.gz", "sdist", "GODDP_SDIST")
    venv = _make_venv(tmp_path, borrowed_site)
    result = _pip_install_sdist(venv, sdist, _clean_env(venv, with_go=False), tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "needs the Go toolchain" in output and "'go' was not found" in output, output
    assert "https://go.dev/dl" in output and "prebuilt goddp wheel" in output, output
    assert not list((venv / "lib").glob("python3*/site-packages/goddp")), "a goddp was installed anyway"
    # At once: before anything is compiled (setup.py says "goddp: <go> build
    # ..." as it starts Go, and the C compiler runs only after it).
    assert "build -buildmode=c-archive" not in output and "goddp_module.c" not in output, output
