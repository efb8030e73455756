"""The wheel's one library serves every CPython >= 3.10.

The goddp package is taken out of dist/goddp-*.whl (GODDP_WHEEL, set by
`make test-wheel`) and its binding (goddp/native/extension.py, beside
libgoddp.so and goddp.h) is loaded by file, without torch, into each
CPython >= 3.10 found on this machine (on PATH as python3.N, or under
pyenv) that has cffi. Each plans the same two-layer graph; all must return
the same plan, the running interpreter's included. The tag, py3-none, is
one that pip takes on every CPython 3.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from _built import built_wheel

ROOT = Path(__file__).resolve().parents[2]

# Plans a 2-layer Linear+ReLU chain (x, w0, b0, w1, b1, linear0, relu0,
# linear1, relu1, output) with a cap that cuts it, and prints the plan.
PLAN = r"""
import importlib.util, json, sys
from array import array
spec = importlib.util.spec_from_file_location("goddp_binding", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
names = [b"l0.weight", b"l0.bias", b"l1.weight", b"l1.bias"]
offsets, total = [0], 0
for n in names:
    total += len(n)
    offsets.append(total)
graph = {
    "num_nodes": 10,
    "node_ops": array("i", [native.OP_PLACEHOLDER] * 5 + [native.OP_CALL_FUNCTION] * 4 + [native.OP_OUTPUT]),
    "node_module_ids": array("i", [-1] * 10),
    "node_param_offsets": array("q", [0, 0, 0, 0, 0, 0, 2, 2, 4, 4, 4]),
    "node_params": array("i", [0, 1, 2, 3]),
    "node_param_refs": bytes([native.REF_ARG] * 4),
    "node_user_offsets": array("q", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9]),
    "node_users": array("i", [5, 5, 5, 7, 7, 6, 7, 8, 9]),
    "num_params": 4,
    "param_bytes": array("q", [4000, 40] * 2),
    "param_storage_bytes": array("q", [4000, 40] * 2),
    "param_dtypes": array("i", [0] * 4),
    "param_devices": array("i", [0] * 4),
    "param_flags": array("I", [native.PARAM_REQUIRES_GRAD] * 4),
    "param_name_offsets": array("q", offsets),
    "param_names": b"".join(names),
}
config = {"mode": native.MODE_DDP, "bucket_cap_bytes": 4040, "first_bucket_cap_bytes": 4040,
          "bucket_caps_bytes": [], "max_pieces": 0}
plan = native.plan_graph(graph, config)
print(json.dumps({"abi": native.load().abi_version(), "python": "%d.%d" % sys.version_info[:2],
                  "plan": {k: (v.hex() if isinstance(v, bytes) else v) for k, v in sorted(plan.items())}}))
"""


def _interpreters() -> dict[str, str]:
    """Every CPython found here that has cffi, by "major.minor" (each one
    runs)."""
    candidates = [sys.executable]
    candidates += [shutil.which(f"python3.{minor}") for minor in range(8, 16)]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.*", "bin", "python3")))
    found: dict[str, str] = {}
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys, platform, cffi; print('%d.%d' % sys.version_info[:2], platform.python_implementation())"],
                capture_output=True, text=True, timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        parts = out.stdout.split()
        if out.returncode == 0 and len(parts) == 2 and parts[1] == "CPython":
            found.setdefault(parts[0], exe)
    return found


def _key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def test_one_library_plans_alike_on_every_cpython_from_3_10(tmp_path):
    wheel = built_wheel()
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path, [n for n in zf.namelist() if n.startswith("goddp/")])
    binding = tmp_path / "goddp" / "native" / "extension.py"
    interpreters = {v: exe for v, exe in _interpreters().items() if _key(v) >= (3, 10)}
    if len(interpreters) < 2:
        pytest.skip(f"only {sorted(interpreters)} found with cffi; the check needs another CPython >= 3.10")
    results = {}
    for version, exe in sorted(interpreters.items(), key=lambda kv: _key(kv[0])):
        proc = subprocess.run([exe, "-c", PLAN, binding], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, f"CPython {version} ({exe}):\n{proc.stderr}"
        results[version] = json.loads(proc.stdout)
        assert results[version]["python"] == version
    plans = {v: r["plan"] for v, r in results.items()}
    first = next(iter(plans.values()))
    assert first["num_pieces"] > 1, first
    assert all(p == first for p in plans.values()), plans
    print(f"one plan on CPython {', '.join(plans)}")


def test_the_running_python_plans_with_the_wheels_library(tmp_path):
    """The check above, on this interpreter alone (it runs where no other
    CPython is found): the wheel's binding, header and library plan."""
    wheel = built_wheel()
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path, [n for n in zf.namelist() if n.startswith("goddp/")])
    proc = subprocess.run([sys.executable, "-c", PLAN, tmp_path / "goddp" / "native" / "extension.py"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    header = (tmp_path / "goddp" / "goddp.h").read_text()
    assert result["abi"] == int(re.search(r"#define GODDP_ABI_VERSION (\d+)", header).group(1)), result
    assert result["plan"]["num_pieces"] > 1, result


def test_the_wheel_tag_is_py3_none():
    name = built_wheel().name
    assert "-py3-none-" in name, name
    # pip's own tag logic: every CPython 3 accepts py3-none (requires-python
    # keeps those before 3.10 out), none of Python 2.
    from packaging.tags import compatible_tags

    def accepts(major: int, minor: int) -> bool:
        return any(str(t).startswith("py3-none-") for t in compatible_tags((major, minor), platforms=["any"]))

    assert all(accepts(3, m) for m in range(10, 15)) and not accepts(2, 7)
