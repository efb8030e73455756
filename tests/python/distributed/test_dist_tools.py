"""goddp inside torch's own tools (docs/tools.md): tlparse over a TORCH_TRACE,
compile_times(), torch.profiler ranges, compiled autograd.

The two-rank cases run inside each rank under torchrun (a plain pytest run
launches this file under torchrun itself, see test_tools_under_torchrun).
One module fixture compiles and trains once for the tlparse, compile-time
and profiler cases. The Python-reducer case runs in processes of its own
(_compiled_autograd_worker.py: that mode changes Dynamo's inlining for the
rest of a process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._dynamo.backends.registry import lookup_backend
from torch._dynamo.utils import compilation_time_metrics, compile_times
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.compile import compiled_autograd
from goddp.reports.records import TIMING_KEYS
from goddp.tools import structured
from _dist_util import (
    REPO_ROOT,
    assert_file_passes_under_torchrun,
    needs_two_ranks,
    rank,
    under_torchrun,
    worker_result_path,
)

WORKER = Path(__file__).resolve().parents[1] / "_compiled_autograd_worker.py"
PHASES = [f"goddp.{key}" for key in TIMING_KEYS] + ["goddp.agreement"]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 64)
        self.down = nn.Linear(64, 64)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Blocks(nn.Module):
    """An input layer, three identical blocks, an output layer: block cuts
    give five pieces, the middle three one compiled callable, the edges eager."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(64, 8)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class FailsFirst:
    """aot_eager, except that its first call (goddp's first piece) raises."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("inner compiler failed on purpose")
        return lookup_backend("aot_eager")(gm, example_inputs)


@contextlib.contextmanager
def torch_trace(directory: Path):
    """What TORCH_TRACE=directory sets up at import: torch's structured
    trace handler on its trace log (here for the block only)."""
    from torch._logging import _internal  # torch's own handler and formatter, test-only

    handler = _internal.LazyTraceHandler(str(directory))
    handler.setFormatter(_internal.TorchLogsFormatter(trace=True))
    _internal.trace_log.addHandler(handler)
    try:
        yield
    finally:
        _internal.trace_log.removeHandler(handler)
        handler.close()


def train_step(forward, x):
    forward(x).pow(2).sum().backward()


def tlparse(log: Path, out: Path) -> dict:
    """tlparse's output folder for log, its compile_directory.json (the
    artifacts per compile id, urls relative to the folder) and index.html."""
    exe = shutil.which("tlparse", path=str(Path(sys.executable).parent)) or shutil.which("tlparse")
    if exe is None:
        pytest.skip("tlparse is not installed (requirements-dev.txt pins it)")
    proc = subprocess.run([exe, str(log), "-o", str(out), "--no-browser", "--overwrite"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {
        "out": out,
        "directory": json.loads((out / "compile_directory.json").read_text()),
        "index": (out / "index.html").read_text(),
    }


@pytest.fixture(scope="module")
def observed(group, tmp_path_factory):
    """One compile and a few steps of Blocks and of a Tiny whose first piece
    fails to compile, under a structured trace; then a step of Blocks under
    goddp.trace and torch.profiler."""
    torch._dynamo.reset()
    goddp.clear_plans()
    before = {key: len(compilation_time_metrics.get(key, [])) for key in PHASES}
    trace_dir = tmp_path_factory.mktemp(f"torch_trace_rank{rank()}")
    torch.manual_seed(0)
    ddp = DDP(Blocks(), bucket_cap_mb=0.02, process_group=group)
    compiled = torch.compile(ddp, backend=goddp.backend(inner="aot_eager", log_plan=False))
    torch.manual_seed(1)
    failing = DDP(Tiny(), bucket_cap_mb=0.001, process_group=group)
    failing_compiled = torch.compile(failing, backend=goddp.backend(inner=FailsFirst(), log_plan=False))
    with torch_trace(trace_dir), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning, on purpose
        train_step(compiled, torch.randn(8, 32))
        train_step(failing_compiled, torch.randn(4, 16))
    plans = goddp.last_plans()
    # Read now: every test starts with torch._dynamo.reset(), which clears them.
    metrics = {key: compilation_time_metrics.get(key, [])[before[key]:] for key in PHASES}
    listed, _ = compile_times(repr="csv", aggregate=True)
    (log,) = trace_dir.glob("*.log")
    parsed = tlparse(log, tmp_path_factory.mktemp(f"tl_out_rank{rank()}"))

    train_step(compiled, torch.randn(8, 32))  # DDP rebuilds its buckets under goddp's caps
    with goddp.trace(compiled), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train_step(compiled, torch.randn(8, 32))
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()]
    return types.SimpleNamespace(plans=plans, metrics=metrics, listed=listed, log=log, events=events, **parsed)


def artifacts(directory: dict, compile_id: str) -> dict[str, str]:
    """tlparse's artifacts of a compile id: name without its number -> url."""
    listed = directory[f"[{compile_id}]"]["artifacts"]
    return {a["name"].rsplit("_", 1)[0]: a["url"] for a in listed}


@needs_two_ranks
def test_tlparse_lists_goddp_artifacts_under_their_compile_ids(observed):
    cut, fell = observed.plans
    assert cut["num_pieces"] == 5 and cut["fallback"] is None, cut
    assert fell["fallback_stage"] == "compile", fell
    names = artifacts(observed.directory, cut["frame"]["compile_id"])
    leaders = sorted({p["same_as"] for p in cut["pieces"]})
    assert leaders == [0, 1, 4]
    want = {"goddp_plan", "goddp_cut_graph", "goddp_piece_reuse", "goddp_agreement"}
    want |= {f"goddp_piece_{p}_graph" for p in leaders}
    assert want <= set(names), sorted(names)
    # reused pieces have no graph of their own
    assert not {"goddp_piece_2_graph", "goddp_piece_3_graph"} & set(names)
    fallback_names = artifacts(observed.directory, fell["frame"]["compile_id"])
    # The pieces were cut before their compile failed: their graphs are there too.
    want_fallback = {"goddp_plan", "goddp_fallback", "goddp_agreement", "goddp_cut_graph", "goddp_piece_0_graph"}
    assert want_fallback <= set(fallback_names), sorted(fallback_names)
    for name in want | {"goddp_fallback"}:
        assert name in observed.index


@needs_two_ranks
def test_the_artifacts_say_what_the_records_say(observed):
    cut, fell = observed.plans
    listing = {cid: {a["name"].rsplit("_", 1)[0]: a for a in v["artifacts"]} for cid, v in observed.directory.items()}
    by_id = listing[f"[{cut['frame']['compile_id']}]"]
    out = observed.out
    plan = json.loads((out / by_id["goddp_plan"]["url"]).read_text())
    assert plan["fingerprint"] == cut["fingerprint"] and plan["plan_check"] is None
    agreement = json.loads((out / by_id["goddp_agreement"]["url"]).read_text())
    assert agreement == {"plan_check": cut["plan_check"], "ddp_buckets": cut["ddp_buckets"]}
    assert agreement["ddp_buckets"]["aligned"] is True and agreement["plan_check"]["size"] == 2
    reuse = json.loads((out / by_id["goddp_piece_reuse"]["url"]).read_text())
    assert [p["same_as"] for p in reuse["pieces"]] == [p["same_as"] for p in cut["pieces"]]
    assert [p["label"] for p in reuse["pieces"]] == [
        "goddp piece 0", "goddp piece 1 (block 0)", "goddp piece 2 (block 1)", "goddp piece 3 (block 2)", "goddp piece 4",
    ]
    program = (out / by_id["goddp_cut_graph"]["url"]).read_text()
    assert "piece_2: goddp piece 2 (block 1), runs the compiled code of piece 1" in program
    assert program.count("self.piece_") == 5
    piece = (out / by_id["goddp_piece_1_graph"]["url"]).read_text()
    assert piece.startswith("# goddp piece 1 (block 0): compiled, run by pieces 1, 2, 3\n") and "relu" in piece
    fell_by_id = listing[f"[{fell['frame']['compile_id']}]"]
    fallback = json.loads((out / fell_by_id["goddp_fallback"]["url"]).read_text())
    assert fallback["stage"] == "compile" and fallback["reason"] == fell["fallback"]
    assert "inner compiler failed on purpose" in fallback["exception"]


@needs_two_ranks
def test_compile_times_list_goddp_phases(observed):
    assert set(PHASES) <= set(observed.listed), observed.listed
    cut, fell = observed.plans
    # Each phase that ran, timed around goddp's own timing of it (the
    # fallback's compile twice: the piece that failed, then the whole graph):
    # torch's entry holds at least goddp's time, and not the whole compile.
    # The slack above is torch's bookkeeping of each entry (with TORCH_TRACE
    # a trace event: up to about 20 ms seen on a loaded machine), allowed 5
    # times over, so that a busy machine does not fail the test.
    for key in TIMING_KEYS:
        ran = sum(p["timings"][key] for p in (cut, fell))
        got = observed.metrics[f"goddp.{key}"]
        assert len(got) >= sum(1 for p in (cut, fell) if p["timings"][key] > 0), (key, got)
        assert ran - 1e-4 <= sum(got) <= 1.2 * ran + 0.1 * len(got), (key, got, ran)
    # The agreement of each DDP module, at its first training call: the
    # record's seconds (to the millisecond) hold torch's time of the round,
    # and its bookkeeping, with the same slack below.
    got = observed.metrics["goddp.agreement"]
    assert len(got) == 2
    said = cut["plan_check"]["seconds"] + fell["plan_check"]["seconds"]
    assert said - 0.1 * len(got) <= sum(got) <= said + 0.001 * len(got), (got, said)
    # ... and in the compile's trace events (tlparse's chromium_events.json)
    events = json.loads((observed.out / "chromium_events.json").read_text())
    assert {"goddp.export", "goddp.plan", "goddp.cut", "goddp.stitch"} <= {e.get("name") for e in events}


@needs_two_ranks
def test_profiler_names_each_pieces_forward_and_backward_and_each_bucket(observed):
    cut = observed.plans[0]
    labels = [
        "goddp piece 0", "goddp piece 1 (block 0)", "goddp piece 2 (block 1)", "goddp piece 3 (block 2)", "goddp piece 4",
    ]
    names = [name for name, _, _ in observed.events]
    for label in labels:
        assert names.count(f"{label} forward") == 1, label
        assert names.count(f"{label} backward") == 1, label
    for bucket in range(len(cut["buckets"])):
        assert names.count(f"goddp bucket {bucket} allreduce") == 1, bucket

    def span(name):
        ((start, end),) = [(s, e) for n, s, e in observed.events if n == name]
        return start, end

    # A compiled piece's backward range is its one backward node's run.
    nodes = [(s, e) for n, s, e in observed.events if n == "CompiledFunctionBackward"]
    for label in labels[1:4]:
        start, end = span(f"{label} backward")
        assert sum(1 for s, e in nodes if start <= s and e <= end) == 1, label
    # Backward runs the pieces in reverse; each range closes before the next opens.
    starts = [span(f"{label} backward") for label in reversed(labels)]
    assert all(a[1] <= b[0] for a, b in zip(starts, starts[1:])), starts
    forwards = [span(f"{label} forward") for label in labels]
    assert all(a[1] <= b[0] for a, b in zip(forwards, forwards[1:])), forwards
    assert forwards[-1][1] <= starts[0][0]


def test_structured_trace_costs_nothing_without_torch_trace(dist_group, monkeypatch):
    """Without a handler on torch's trace log goddp writes and formats
    nothing; with one, it writes its artifacts."""
    from torch._logging import _internal  # the trace log trace_structured checks, test-only

    written = []
    monkeypatch.setattr(structured, "_artifact", lambda name, *args, **kwargs: written.append(name))
    monkeypatch.setattr(structured, "_cut_program", lambda *args: pytest.fail("formatted without a trace"))
    monkeypatch.setattr(_internal.trace_log, "handlers", [])
    ddp = DDP(Tiny(), bucket_cap_mb=0.001)
    compiled = torch.compile(ddp, backend=goddp.backend(inner=lambda gm, example_inputs: gm.forward, log_plan=False))
    train_step(compiled, torch.randn(4, 16))
    assert goddp.last_plans()[0]["num_pieces"] == 3 and written == []

    monkeypatch.setattr(_internal.trace_log, "handlers", [logging.NullHandler()])
    torch._dynamo.reset()
    train_step(compiled, torch.randn(4, 16))
    assert {"goddp_plan", "goddp_cut_graph", "goddp_piece_reuse", "goddp_agreement"} <= set(written), written


@needs_two_ranks
@torch._dynamo.config.patch(compiled_autograd=True)  # not monkeypatch: it would delete the setting on undo
def test_compiled_autograd_with_cpp_reducer_warns_once_and_torch_refuses(group, caplog):
    """goddp's warning says what torch does: a compiled backward raises."""
    torch.manual_seed(0)
    ddp = DDP(Tiny(), bucket_cap_mb=0.001, process_group=group)
    compiled = torch.compile(ddp, backend=goddp.backend(inner=lambda gm, example_inputs: gm.forward, log_plan=False))
    with caplog.at_level(logging.WARNING, logger="goddp"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_step(compiled, torch.randn(4, 16))  # an eager backward: compiled autograd leaves it alone
        train_step(compiled, torch.randn(6, 16))  # a second graph of the module
    said = [str(w.message) for w in caught if str(w.message) == compiled_autograd.CPP_REDUCER]
    assert len(said) == 1 and [r.getMessage() for r in caplog.records].count(compiled_autograd.CPP_REDUCER) == 1
    assert len(goddp.last_plans()) == 2 and goddp.last_plans()[0]["num_pieces"] > 1

    @torch.compile(backend="eager")
    def step(x):
        compiled(x).sum().backward()

    with pytest.raises(Exception, match="Compiled autograd is not compatible with C\\+\\+ DDP Reducer"):
        step(torch.randn(4, 16))
    assert "Compiled autograd is not compatible with C++ DDP Reducer" in compiled_autograd.CPP_REDUCER


@pytest.mark.single_process
def test_python_reducer_goes_uncut_and_trains(tmp_path):
    """Two ranks in processes of their own (see the module doc), over a
    FileStore."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "python"), str(WORKER.parent), env.get("PYTHONPATH", "")])
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen([sys.executable, str(WORKER), str(tmp_path), str(r), "2", str(store)], cwd=REPO_ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        for r in (0, 1)
    ]
    outputs = []
    for proc in ranks:
        try:
            outputs.append(proc.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for other in ranks:
                os.killpg(other.pid, 9)
            pytest.fail("the Python-reducer workers did not finish within 300 s")
    assert [proc.returncode for proc in ranks] == [0, 0], "\n".join(outputs)[-6000:]
    for r in (0, 1):
        seen = json.loads(worker_result_path(tmp_path, r).read_text())
        assert seen["info"] == [
            "goddp: optimize_ddp='python_reducer' lets compiled autograd schedule DDP's allreduces; "
            "compiling the whole graph without cuts"
        ], seen
        assert seen["warnings"] == [] and seen["plans"] == 0
        # the forward twice (two batch sizes), compiled autograd's backward: each uncut, said once
        assert seen["received"] >= 3 and seen["uncut"], seen
        assert seen["weights_moved"] and seen["weights_equal"], seen


@pytest.mark.single_process
def test_tools_under_torchrun():
    """Plain pytest: run this file's cases under torchrun, 2 ranks."""
    if under_torchrun():
        pytest.skip("already inside torchrun")
    assert_file_passes_under_torchrun(__file__, timeout=540)
