"""Shared fixtures for goddp's Python tests.

- ``dist_group``: a default process group for DDP. In a plain pytest process
  it is a 1-rank gloo group over a FileStore in a temporary directory (no
  ports); under ``torchrun ... -m pytest`` it is formed from torchrun's
  environment (RANK, WORLD_SIZE, MASTER_ADDR, ...). A group that already
  exists is reused.
- ``planner``: makes sure plans can be made: the real Go planner through
  goddp._native when the extension is built, otherwise (while the
  extension is still being written) a small stand-in defined here, with a
  warning. Tests that must exercise the real extension use
  ``native_module`` instead, which skips when it is unavailable.
- every test starts with a fresh Dynamo cache and no recorded plans.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from array import array
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

REPO_ROOT = Path(__file__).resolve().parents[2]
_PYTHON_SRC = REPO_ROOT / "python"
if str(_PYTHON_SRC) not in sys.path:
    # Lets the suites run from a checkout before `pip install -e .`.
    sys.path.insert(0, str(_PYTHON_SRC))

import goddp  # noqa: E402  (after the path tweak)


@dataclass(frozen=True)
class DistGroup:
    rank: int
    world_size: int


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


@pytest.fixture(scope="session")
def dist_group():
    """The default process group (see module doc); destroyed at session end
    only if this fixture created it."""
    created = False
    if not dist.is_initialized():
        if _under_torchrun():
            dist.init_process_group("gloo")
        else:
            store_dir = tempfile.mkdtemp(prefix="goddp_pg_")
            dist.init_process_group(
                "gloo", init_method=f"file://{os.path.join(store_dir, 'store')}", rank=0, world_size=1
            )
        created = True
    yield DistGroup(dist.get_rank(), dist.get_world_size())
    if created and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _fresh_dynamo_and_plans():
    torch._dynamo.reset()
    goddp.clear_plans()
    yield
    torch._dynamo.reset()


# --------------------------------------------------------------------------
# Native extension, or a stand-in while it does not exist yet


def _native_status() -> tuple[object | None, str]:
    try:
        from goddp import _native

        module = _native.load()
    except Exception as exc:  # not built yet, or not importable
        return None, f"{type(exc).__name__}: {exc}"
    return module, ""


@pytest.fixture(scope="session")
def native_module():
    """goddp._goddp, loaded; skips the test when it is not built."""
    module, why = _native_status()
    if module is None:
        pytest.skip(f"goddp native extension unavailable ({why}); build it with `make install`")
    return module


def standin_plan(graph: dict, config: dict) -> dict:
    """A deliberately simple planner used only by tests while the extension
    is missing: walks nodes backwards, counts each parameter once at its last
    use, closes a piece when the cap is reached. Enough to exercise export,
    cutting and stitching; the real rules live in planner/."""
    n = graph["num_nodes"]
    ops = graph["node_ops"]
    param_off, params = graph["node_param_offsets"], graph["node_params"]
    user_off, users = graph["node_user_offsets"], graph["node_users"]
    sizes = graph["param_bytes"]
    flags = graph["param_flags"]
    cap, first = config["bucket_cap_bytes"], config["first_bucket_cap_bytes"]

    reverse_piece = [-1] * n
    bucket_params: list[list[int]] = [[]]
    bucket_bytes = [0]
    seen: set[int] = set()
    for i in reversed(range(n)):
        if ops[i] in (0, 5):
            continue
        limit = first if len(bucket_bytes) == 1 else cap
        if bucket_bytes[-1] >= limit:
            bucket_params.append([])
            bucket_bytes.append(0)
        for k in range(param_off[i], param_off[i + 1]):
            p = params[k]
            if p not in seen and flags[p] & 1 and not flags[p] & 2:
                seen.add(p)
                bucket_bytes[-1] += sizes[p]
                bucket_params[-1].append(p)
        reverse_piece[i] = len(bucket_bytes) - 1
    if len(bucket_bytes) > 1 and bucket_bytes[-1] == 0:
        last = len(bucket_bytes) - 1
        reverse_piece = [last - 1 if r == last else r for r in reverse_piece]
        bucket_bytes.pop()
        bucket_params.pop()
    count = len(bucket_bytes)
    piece = [count - 1 - r if r >= 0 else -1 for r in reverse_piece]
    inputs = [set() for _ in range(count)]
    outputs = [set() for _ in range(count)]
    for i in range(n):
        for k in range(user_off[i], user_off[i + 1]):
            u = users[k]
            if ops[u] == 5:
                if piece[i] >= 0:
                    outputs[piece[i]].add(i)
            elif piece[u] != piece[i]:
                inputs[piece[u]].add(i)
                if piece[i] >= 0:
                    outputs[piece[i]].add(i)

    def csr(lists):
        offsets, values = array("q", [0]), array("i")
        for items in lists:
            values.extend(sorted(items))
            offsets.append(len(values))
        return offsets.tobytes(), values.tobytes()

    b_off, b_val = csr([sorted(b) for b in bucket_params])
    in_off, in_val = csr(inputs)
    out_off, out_val = csr(outputs)
    return {
        "fingerprint": hash((tuple(piece), cap, first)) & 0xFFFFFFFFFFFFFFFF,
        "num_nodes": n,
        "num_partitions": count,
        "num_buckets": count,
        "node_partitions": array("i", piece).tobytes(),
        "bucket_bytes": array("q", bucket_bytes).tobytes(),
        "bucket_partitions": array("i", [count - 1 - b for b in range(count)]).tobytes(),
        "bucket_node_begin": array("q", [0] * count).tobytes(),
        "bucket_node_end": array("q", [0] * count).tobytes(),
        "bucket_extended": bytes(count),
        "bucket_param_offsets": b_off,
        "bucket_params": b_val,
        "partition_input_offsets": in_off,
        "partition_inputs": in_val,
        "partition_output_offsets": out_off,
        "partition_outputs": out_val,
    }


@pytest.fixture
def planner(monkeypatch):
    """Returns "native" or "standin" (see module doc)."""
    module, why = _native_status()
    if module is not None:
        return "native"
    warnings.warn(f"goddp native extension unavailable ({why}); using the test stand-in planner")
    import goddp._backend
    import goddp._plan
    from goddp._plan import native_config

    def call_standin(exported, mode, caps):
        return standin_plan(exported.arrays, native_config(mode, caps))

    monkeypatch.setattr(goddp._plan, "call_planner", call_standin)
    monkeypatch.setattr(goddp._backend, "call_planner", call_standin)
    return "standin"
