"""bench.probes' step peak memory: a step whose peak is known by construction."""

from __future__ import annotations

import pytest
import torch

from bench import probes

MIB = 1 << 20


def _temporary(nbytes: int):
    """A step that holds an nbytes temporary at its fullest and keeps nothing."""

    def step():
        t = torch.empty(nbytes, dtype=torch.uint8)
        t.fill_(1)
        return int(t[0])

    return step


@pytest.mark.parametrize("mib", [4, 16])
def test_cpu_peak_is_the_temporary(mib):
    peak = probes.step_peak_bytes(_temporary(mib * MIB))
    assert peak.result == 1
    assert "profiler" in peak.source
    assert mib * MIB <= peak.nbytes < mib * MIB + MIB // 4


def test_cpu_peak_leaves_out_what_was_live_before():
    kept = torch.ones(32 * MIB, dtype=torch.uint8)  # live across the step, before it
    peak = probes.step_peak_bytes(_temporary(2 * MIB))
    assert 2 * MIB <= peak.nbytes < 2 * MIB + MIB // 4
    del kept


def test_cpu_peak_baseline_after_an_earlier_measure():
    """Blocks allocated while an earlier measure ran stay in the allocator's
    count: the baseline is the level at this step's start, not zero. The
    step first frees the earlier measure's 8 MiB (the level drops below the
    start), then holds a 12 MiB temporary: 4 MiB above the start, never 12
    (a baseline at the step's lowest level) nor 12 + 8."""
    kept = []
    probes.step_peak_bytes(lambda: kept.append(torch.ones(8 * MIB, dtype=torch.uint8)))

    def step():
        kept.clear()
        return _temporary(12 * MIB)()

    peak = probes.step_peak_bytes(step)
    assert 4 * MIB <= peak.nbytes < 4 * MIB + MIB // 4


def test_cpu_peak_of_a_training_step():
    """Forward saves exp's output (n floats) for backward; backward builds the
    input's gradient (n floats) while that output is still held: the peak is
    two tensors of n floats. Freeing the last step's gradient inside the step
    (it was allocated while the previous measure ran) lowers the level below
    the start first, and the peak above the start is one tensor."""
    n = 1 << 20  # 4 MiB of float32
    x = torch.randn(n, requires_grad=True)

    def step(free_grad_inside: bool):
        if free_grad_inside:
            x.grad = None
        x.exp().sum().backward()
        return x.grad is not None

    probes.step_peak_bytes(lambda: step(True))  # warm up; leaves a gradient allocated while measured
    x.grad = None
    peak = probes.step_peak_bytes(lambda: step(False))
    assert peak.result
    assert 2 * 4 * n <= peak.nbytes < 2 * 4 * n + MIB // 4
    peak = probes.step_peak_bytes(lambda: step(True))
    assert 4 * n <= peak.nbytes < 4 * n + MIB // 4


def test_peak_of_another_device_is_refused():
    with pytest.raises(ValueError, match="neither cpu nor cuda"):
        probes.step_peak_bytes(lambda: None, device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_is_the_temporary():
    def step():
        t = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda")
        t.fill_(1)
        return int(t[0])

    peak = probes.step_peak_bytes(step, device="cuda")
    assert 8 * MIB <= peak.nbytes < 8 * MIB + MIB // 4


def test_cuda_path_with_a_stand_in_allocator(monkeypatch):
    """Without a GPU: the CUDA path resets the peak before the step, reads
    the level at the start and the peak after a synchronize, with stand-ins
    for torch.cuda's statistics."""
    calls = []
    state = {"allocated": 5 * MIB, "peak": 9 * MIB}

    def reset(dev):
        calls.append("reset")
        state["peak"] = state["allocated"]

    def step():
        calls.append("step")
        state["peak"] = max(state["peak"], state["allocated"] + 7 * MIB)
        return "done"

    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev: state["peak"])
    peak = probes.step_peak_bytes(step, device="cuda:0")
    assert (peak.nbytes, peak.result) == (7 * MIB, "done")
    assert calls == ["sync", "reset", "step", "sync"]
    assert peak.source == "torch.cuda.max_memory_allocated"


def test_compile_bench_reports_each_peak_and_its_ratio_to_unsplit():
    from bench import compile_overhead as co

    def rec(tool, kept, fresh):
        r = {"tool": tool, "model": "gpt:quick", "layers": 8, "checkpoint": "stack", "compile_s": 10.0,
             "first_forward_s": 6.0, "first_backward_s": 5.0, "steady_step_s": 1.0, "peak_rss_delta_mib": 300.0,
             "saved_activations_mib": 9.0}
        runs = [dict(r, step_peak_mib=k, step_peak_fresh_grads_mib=f) for k, f in zip(kept, fresh)]
        return co._median_e2e(runs)

    res = {"e2e": [rec("unsplit", [80.0, 80.0, 100.0], [90.0, 90.0, 90.0]),
                   rec("goddp_ddp", [40.0, 44.0, 40.0], [99.0, 99.0, 99.0])], "repeat": 3}
    text = co.e2e_report(res)
    assert "peak MiB, grads None" in text
    assert "80.0 [80.0-100.0]" in text  # median [min-max] of the repeats
    # paired per repeat: 40/80, 44/80, 40/100
    assert "goddp_ddp step peak / unsplit (grads kept) = 0.50 [0.40-0.55] (40.0 / 80.0 MiB)" in text
    assert "goddp_ddp step peak / unsplit (grads None) = 1.10 [1.10-1.10] (99.0 / 90.0 MiB)" in text
    assert co.peak_ratio(res["e2e"][1], {"tool": "unsplit"}) is None
