"""Logging (logger "goddp", TORCH_LOGS) and the plan records of last_plans()."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
import goddp.compile.pipeline

REPO_ROOT = Path(__file__).resolve().parents[3]
TIMING_KEYS = {"export", "plan", "cut", "example_inputs", "identify", "compile", "stitch"}


class Trio(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 32)
        self.third = nn.Linear(32, 32)

    def forward(self, x):
        return self.third(torch.relu(self.second(torch.relu(self.first(x)))))


def compile_trio(**options):
    torch.manual_seed(0)
    model = Trio()
    opts = {"inner": "aot_eager", **options}
    # 0.004 MiB: each Linear(32, 32) (4224 bytes) fills a bucket alone.
    return model, torch.compile(DDP(model, bucket_cap_mb=0.004), backend=goddp.backend(**opts))


def test_plan_table_is_logged_at_info(dist_group, native_module, caplog):
    _, compiled = compile_trio()
    with caplog.at_level(logging.INFO, logger="goddp"):
        compiled(torch.randn(2, 32)).sum().backward()
    tables = [r.getMessage() for r in caplog.records if r.name == "goddp" and r.levelno == logging.INFO]
    table = next(t for t in tables if t.startswith("goddp plan:"))
    assert "mode=ddp" in table and "pieces=3" in table
    lines = table.splitlines()
    assert lines[1].split() == ["bucket", "MiB", "piece", "params"]
    # DDP order: the last layer's bucket first, in the last piece.
    assert lines[2].split()[:3] == ["0", "0.004", "2"] and lines[2].split()[3] in ("third.weight", "third.bias")
    for name in ("first.weight", "second.bias", "third.weight"):
        assert name in table


def test_log_plan_false_logs_no_table(dist_group, native_module, caplog):
    """log_plan=False: the graph is planned and cut as ever, and no table is logged."""
    _, compiled = compile_trio(log_plan=False)
    with caplog.at_level(logging.INFO, logger="goddp"):
        compiled(torch.randn(2, 32))
    (record,) = goddp.last_plans()
    assert record["fallback"] is None and record["num_pieces"] == 3, record
    assert not any(r.getMessage().startswith("goddp plan:") for r in caplog.records)


def test_graphs_are_logged_at_debug(dist_group, native_module, caplog):
    _, compiled = compile_trio()
    with caplog.at_level(logging.DEBUG, logger="goddp"):
        compiled(torch.randn(2, 32))
    messages = [r.getMessage() for r in caplog.records if r.name == "goddp" and r.levelno == logging.DEBUG]
    assert any(m.startswith("goddp: original graph:") for m in messages)
    assert sum(m.startswith("goddp: piece ") for m in messages) == 3


def test_last_plans_are_json_with_fingerprint_and_timings(dist_group, native_module):
    model, compiled = compile_trio()
    compiled(torch.randn(2, 32)).sum().backward()
    plans = goddp.last_plans()
    assert len(plans) == 1
    plan = json.loads(json.dumps(plans[0]))
    assert plan == plans[0]
    assert isinstance(plan["fingerprint"], int) and plan["fingerprint"] > 0
    assert plan["mode"] == "ddp" and plan["fallback"] is None
    assert plan["caps"]["bucket_cap_bytes"] == int(0.004 * 2**20)
    assert set(plan["timings"]) == TIMING_KEYS
    assert all(v >= 0 for v in plan["timings"].values())
    assert plan["timings"]["compile"] > 0 and plan["timings"]["plan"] > 0
    assert plan["num_pieces"] == len(plan["pieces"]) == 3
    assert [b["param_names"] for b in plan["buckets"]] == [
        ["third.bias", "third.weight"],
        ["second.bias", "second.weight"],
        ["first.bias", "first.weight"],
    ]
    assert [b["piece"] for b in plan["buckets"]] == [2, 1, 0]
    assert plan["graph"]["num_params"] == 6
    # Records are copies: changing one does not change the store.
    plans[0]["mode"] = "changed"
    assert goddp.last_plans()[0]["mode"] == "ddp"
    goddp.clear_plans()
    assert goddp.last_plans() == []


def _documented(doc: str, key: str) -> list[str]:
    """The names a "- key: ... a, b, c." item of doc lists after its last colon."""
    item = re.search(rf"^\s*- {key}: (.*?)\.\n", doc, re.M | re.S).group(1)
    return re.findall(r"\w+", item.rsplit(":", 1)[-1].replace("seconds spent in", ""))


def test_last_plans_documents_exactly_the_keys_it_returns(dist_group, native_module, monkeypatch):
    doc = goddp.last_plans.__doc__
    documented = re.findall(r"^\s*- (\w+):", doc, re.M)
    _, compiled = compile_trio()
    compiled(torch.randn(2, 32)).sum().backward()

    def broken_planner(*args):
        raise RuntimeError("planner broke on purpose")

    # A graph that falls back has the same keys.
    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", broken_planner)
    torch._dynamo.reset()
    _, fallback = compile_trio()
    with pytest.warns(RuntimeWarning, match="planning failed"):
        fallback(torch.randn(2, 32))
    planned, failed = goddp.last_plans()
    assert failed["fallback"] is not None and planned["fallback"] is None
    for plan in (planned, failed):
        assert documented == list(plan)
        assert set(_documented(doc, "timings")) == set(plan["timings"]) == TIMING_KEYS
        assert _documented(doc, "caps") == list(plan["caps"])
    assert _documented(doc, "pieces") == list(planned["pieces"][0])
    assert _documented(doc, "buckets") == list(planned["buckets"][0])
    assert _documented(doc, "graph") == ["num_nodes", "num_params"] == list(planned["graph"])
    assert set(planned["ddp_buckets"]) == {"aligned", "reason"}


_TORCH_LOGS_SCRIPT = textwrap.dedent(
    """
    import os, tempfile
    import torch, torch.distributed as dist
    from torch import nn
    import goddp

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(32, 32)
            self.b = nn.Linear(32, 32)
        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    ddp = nn.parallel.DistributedDataParallel(Pair(), bucket_cap_mb=0.004)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "eager"})
    compiled(torch.randn(2, 32)).sum().backward()
    dist.destroy_process_group()
    print("DONE")
    """
)


def _run_with_torch_logs(value: str | None) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "python"), env.get("PYTHONPATH")]))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(var, None)
    env.pop("TORCH_LOGS", None)
    if value is not None:
        env["TORCH_LOGS"] = value
    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_LOGS_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.single_process
def test_torch_logs_goddp_prints_the_plan_table():
    info = _run_with_torch_logs("goddp")
    assert "goddp plan: mode=ddp" in info and "a.weight" in info and "b.bias" in info
    assert "set torch._dynamo.config.optimize_ddp = 'no_optimization'" in info
    assert "goddp: piece 0 graph" not in info

    debug = _run_with_torch_logs("+goddp")
    assert "goddp plan: mode=ddp" in debug
    assert "goddp: piece 0 graph" in debug and "goddp: piece 1 graph" in debug

    quiet = _run_with_torch_logs(None)
    assert "goddp plan:" not in quiet


def test_find_unused_parameters_without_static_graph_is_explained(dist_group, native_module, caplog):
    torch.manual_seed(0)
    ddp = DDP(Trio(), bucket_cap_mb=0.004, find_unused_parameters=True)
    compiled = torch.compile(ddp, backend=goddp.backend(inner="aot_eager"))
    with caplog.at_level(logging.INFO, logger="goddp"):
        compiled(torch.randn(2, 32)).sum().backward()
    assert any("never rebuilds its buckets" in r.getMessage() for r in caplog.records)
