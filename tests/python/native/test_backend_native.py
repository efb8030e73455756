"""The backend's use of the Go planner: panics, threads, fork.

These need the real extension (``native_module`` skips without it)."""

from __future__ import annotations

import copy
import os
import threading

import torch
from torch import fx, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import goddp
from goddp.native import extension as _native
from goddp.graph.export import export_graph
from goddp.native.plan import PlanRequest
import _testhooks
from _fork_util import wait_for_child
from models import SquareStack


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


def test_go_panic_becomes_a_planner_error_and_the_process_survives():
    # Only the test build of the extension has debug_panic; see _testhooks.py.
    out = _testhooks.run(
        """
        import pytest, torch
        import goddp
        from test_backend_native import Stack, capture_dynamo_graph

        with pytest.raises(ext.PlannerError) as info:
            ext.debug_panic()
        assert info.value.code == 4
        assert isinstance(info.value, RuntimeError)
        # The planner still works afterwards.
        torch.manual_seed(0)
        gm = capture_dynamo_graph(Stack(16, 3), torch.randn(2, 16))
        # Each Linear(16, 16) (1088 bytes) fills a 1000-byte bucket by itself.
        plan = goddp.plan_graph_module(gm, bucket_cap_bytes=1000, first_bucket_cap_bytes=1000)
        assert plan.num_pieces == 3
        print("pieces", plan.num_pieces)
        """
    )
    assert out.split() == ["pieces", "3"]


def test_plan_graph_module_from_four_threads_gives_identical_plans(native_module):
    torch.manual_seed(0)
    gm = capture_dynamo_graph(Stack(32, 8), torch.randn(2, 32))
    expected = goddp.plan_graph_module(gm, bucket_cap_bytes=9000, first_bucket_cap_bytes=4500)
    assert expected.num_pieces > 2

    results: list = [None] * 4
    errors: list = []
    barrier = threading.Barrier(4)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            plans = [
                goddp.plan_graph_module(gm, bucket_cap_bytes=9000, first_bucket_cap_bytes=4500) for _ in range(20)
            ]
            results[i] = {(p.fingerprint, p.num_pieces, tuple(map(tuple, p.piece_inputs))) for p in plans}
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert all(not t.is_alive() for t in threads)
    want = {(expected.fingerprint, expected.num_pieces, tuple(map(tuple, expected.piece_inputs)))}
    assert results == [want] * 4


def test_forked_child_calling_the_planner_gets_a_clear_error(native_module):
    torch.manual_seed(0)
    gm = capture_dynamo_graph(Stack(16, 2), torch.randn(2, 16))
    exported = export_graph(gm)
    config = PlanRequest("ddp", bucket_cap_bytes=1000, first_bucket_cap_bytes=1000).to_native()
    _native.plan_graph(exported.arrays, config)  # Go is running in the parent
    assert _native.is_loaded()

    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 3
        try:
            _native.plan_graph(exported.arrays, config)
            code = 2  # returned a plan: the fork guard failed
        except native_module.ForkedChildError as exc:
            code = 0 if "fork" in str(exc).lower() else 4
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    exit_code = wait_for_child(pid, timeout=30)
    assert exit_code == 0, {1: "other exception", 2: "planned in the child", 4: "unclear message"}.get(exit_code)


def test_fork_dataloader_workers_train_with_goddp_after_go_started(dist_group, native_module):
    torch.manual_seed(0)
    base = Stack(16, 4)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.002), backend=goddp.backend(inner="aot_eager", check_plans=False)
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
