"""The wheel's one abi3 extension serves every CPython >= 3.10.

The extension is taken out of dist/goddp-*.whl (GODDP_WHEEL, set by `make
test-wheel`) and loaded by file, without torch, into each CPython >= 3.10
found on this machine (on PATH as python3.N, or under pyenv). Each plans the
same two-layer graph; all must return the same plan, the running
interpreter's included. An interpreter older than 3.10 must refuse the
wheel's tag.
"""

from __future__ import annotations

import glob
import json
import os
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
spec = importlib.util.spec_from_file_location("goddp._goddp", sys.argv[1])
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
names = [b"l0.weight", b"l0.bias", b"l1.weight", b"l1.bias"]
offsets, total = [0], 0
for n in names:
    total += len(n)
    offsets.append(total)
graph = {
    "num_nodes": 10,
    "node_ops": array("i", [ext.OP_PLACEHOLDER] * 5 + [ext.OP_CALL_FUNCTION] * 4 + [ext.OP_OUTPUT]),
    "node_module_ids": array("i", [-1] * 10),
    "node_param_offsets": array("q", [0, 0, 0, 0, 0, 0, 2, 2, 4, 4, 4]),
    "node_params": array("i", [0, 1, 2, 3]),
    "node_param_refs": bytes([ext.REF_ARG] * 4),
    "node_user_offsets": array("q", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9]),
    "node_users": array("i", [5, 5, 5, 7, 7, 6, 7, 8, 9]),
    "num_params": 4,
    "param_bytes": array("q", [4000, 40] * 2),
    "param_storage_bytes": array("q", [4000, 40] * 2),
    "param_dtypes": array("i", [0] * 4),
    "param_devices": array("i", [0] * 4),
    "param_flags": array("I", [ext.PARAM_REQUIRES_GRAD] * 4),
    "param_name_offsets": array("q", offsets),
    "param_names": b"".join(names),
}
config = {"mode": ext.MODE_DDP, "bucket_cap_bytes": 4040, "first_bucket_cap_bytes": 4040,
          "bucket_caps_bytes": [], "max_pieces": 0}
plan = ext.plan_graph(graph, config)
print(json.dumps({"abi": ext.abi_version(), "python": "%d.%d" % sys.version_info[:2],
                  "plan": {k: (v.hex() if isinstance(v, bytes) else v) for k, v in sorted(plan.items())}}))
"""


def _interpreters() -> dict[str, str]:
    """Every CPython found here, by "major.minor" (each one runs)."""
    candidates = [sys.executable]
    candidates += [shutil.which(f"python3.{minor}") for minor in range(8, 16)]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", "3.*", "bin", "python3")))
    found: dict[str, str] = {}
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys, platform; print('%d.%d' % sys.version_info[:2], platform.python_implementation())"],
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


def test_one_extension_plans_alike_on_every_cpython_from_3_10(tmp_path):
    wheel = built_wheel()
    with zipfile.ZipFile(wheel) as zf:
        (member,) = [n for n in zf.namelist() if n.startswith("goddp/_goddp") and n.endswith(".so")]
        assert member == "goddp/_goddp.abi3.so", member
        so = zf.extract(member, tmp_path)
    interpreters = {v: exe for v, exe in _interpreters().items() if _key(v) >= (3, 10)}
    if len(interpreters) < 2:
        pytest.skip(f"only {sorted(interpreters)} found; the check needs another CPython >= 3.10")
    results = {}
    for version, exe in sorted(interpreters.items(), key=lambda kv: _key(kv[0])):
        proc = subprocess.run([exe, "-c", PLAN, so], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 0, f"CPython {version} ({exe}):\n{proc.stderr}"
        results[version] = json.loads(proc.stdout)
        assert results[version]["python"] == version
    plans = {v: r["plan"] for v, r in results.items()}
    first = next(iter(plans.values()))
    assert first["num_pieces"] > 1, first
    assert all(p == first for p in plans.values()), plans
    print(f"one plan on CPython {', '.join(plans)}")


def test_the_wheel_tag_is_cp310_abi3():
    name = built_wheel().name
    assert "-cp310-abi3-" in name, name
    # pip's own tag logic: every CPython from 3.10 up accepts cp310-abi3, older ones do not.
    from packaging.tags import cpython_tags

    def accepts(minor: int) -> bool:
        return any(str(t).startswith("cp310-abi3-") for t in cpython_tags((3, minor), platforms=["any"]))

    assert all(accepts(m) for m in range(10, 15)) and not accepts(9)
