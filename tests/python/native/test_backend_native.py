"""The backend's use of the Go planner: DataLoader workers forked after Go
started, and plans that do not depend on the interpreter's hash seed.

Panics, threads and a forked child's refusal are test_native.py's, at the
extension. These need the real extension (``native_module`` fails without it)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import torch
from torch import fx, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import goddp
from goddp.native import extension as _native
import _testhooks
from models import SquareStack

# A watchdog against a hung child interpreter, not a measure of speed.
WATCHDOG_S = 600


def Stack(width: int = 32, depth: int = 6) -> nn.Module:
    return SquareStack(width, depth)


def capture_dynamo_graph(model: nn.Module, *inputs) -> fx.GraphModule:
    graphs: list[fx.GraphModule] = []

    def record(gm, example_inputs, **_):
        graphs.append(gm)
        return gm.forward

    torch.compile(model, backend=record)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def test_fork_dataloader_workers_train_with_goddp_after_go_started(dist_group, native_module):
    torch.manual_seed(0)
    base = Stack(16, 4)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.002), backend=goddp.backend(inner="aot_eager")
    )
    data = TensorDataset(torch.randn(24, 16), torch.randn(24, 16))
    # Go is loaded before the workers fork (the first step plans).
    assert _native.load() is native_module and _native.is_loaded()
    loader = DataLoader(data, batch_size=6, num_workers=2, multiprocessing_context="fork")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    steps = 0
    for x, y in loader:
        for m, o in ((compiled, opt), (reference, ref_opt)):
            o.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            o.step()
        steps += 1
    assert steps == 4
    (record,) = goddp.last_plans()
    assert record["fallback"] is None and record["num_pieces"] > 1
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


_PLAN_UNDER_A_HASH_SEED = """
import dataclasses, hashlib, json
import torch
import goddp
from goddp.graph.export import export_graph
from models import TiedEmbeddingLM, TransformerStack
from test_backend_native import capture_dynamo_graph


def digest(value):
    try:
        return hashlib.sha256(bytes(memoryview(value))).hexdigest()
    except TypeError:
        return repr(value)


seen = {"hash": hash("goddp")}
torch.manual_seed(0)
for name, model, batch in [
    ("transformer", TransformerStack(32, 4, 3), torch.randn(2, 8, 32)),
    ("tied", TiedEmbeddingLM(256, 32), torch.randint(0, 256, (2, 8))),
]:
    gm = capture_dynamo_graph(model, batch)
    seen[name + "/export"] = {key: digest(value) for key, value in sorted(export_graph(gm).arrays.items())}
    for mode, options in [("ddp", {"block_cuts": True}), ("ddp", {"align_buckets": True}), ("torch", {})]:
        plan = goddp.plan_graph_module(gm, mode=mode, bucket_cap_bytes=20_000, **options)
        seen[f"{name}/{mode}/{sorted(options)}"] = dataclasses.asdict(plan)
print(json.dumps(seen, default=repr, sort_keys=True))
"""


def test_plans_and_fingerprints_do_not_depend_on_the_hash_seed():
    """Plans are deterministic across processes: two interpreters whose
    str hashes differ (PYTHONHASHSEED) capture the same models with Dynamo,
    export them and plan them, and get the same arrays, plans and
    fingerprints."""
    runs = []
    for seed in ("1", "2024"):
        proc = subprocess.run(
            [sys.executable, "-c", _PLAN_UNDER_A_HASH_SEED], capture_output=True, text=True, timeout=WATCHDOG_S,
            env=_testhooks.child_env(PYTHONHASHSEED=seed, OMP_NUM_THREADS="1"), cwd=_testhooks.HERE,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    a, b = runs
    assert a.pop("hash") != b.pop("hash"), "the seeds did not take: str hashes are equal"
    assert len(a) == 8 and all(plan["fingerprint"] for key, plan in a.items() if "/export" not in key)
    assert a == b
