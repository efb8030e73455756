"""`make gpu-check` on a machine without CUDA: bench/gpu_check.py runs the
same jobs on the CPU, says that it skipped the GPU, prints its table and
exits 0 (--quick: the tiny GPT with aot_eager, to keep this test cheap).

One case that runs the script as a user would (a fresh process with CUDA
hidden), and one that makes a job fail, to show that the exit status and
the table report it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _run(tmp_path, extra_env=None):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "python"), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "bench.gpu_check", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=400)


@pytest.mark.single_process
def test_without_cuda_it_runs_on_cpu_says_so_and_passes(tmp_path):
    from bench.gpu_check import SKIP_MESSAGE

    proc = _run(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert SKIP_MESSAGE in proc.stdout
    assert "== goddp GPU check: CPU (GPU skipped: CPU run) ==" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("1 rank", "2 ranks"))]
    # fp32 and bf16 on one rank, two ranks: goddp's parameters against eager
    # DDP's in each, and a goddp.trace row each.
    for run in ("1 rank, gloo, CPU, fp32", "1 rank, gloo, CPU, bf16 autocast", "2 ranks, gloo, CPU"):
        mine = [r for r in rows if r.startswith(run)]
        assert any("goddp " in r and r.rstrip().endswith("pass") for r in mine), (run, proc.stdout)
        assert any("goddp.trace of goddp" in r and "launched in backward" in r for r in mine), (run, proc.stdout)
    # DDP's mixed_precision needs CUDA: its row says it was skipped, and why
    from bench.gpu_check import MIXED_LABEL, MIXED_SKIPPED

    assert [r for r in rows if r.startswith(MIXED_LABEL)] and all(
        MIXED_SKIPPED in r and r.rstrip().endswith("skipped") for r in rows if r.startswith(MIXED_LABEL)), proc.stdout
    assert "FAIL" not in proc.stdout
    assert "every check passed" in proc.stdout
    # the first-step / steady-step table and the plan table follow
    assert "== time: GPT" in proc.stdout and "goddp plan: mode=ddp" in proc.stdout


def _fake_jobs(monkeypatch, outcomes):
    """Replaces the job launcher: each call pops the next outcome for its
    (job, backend) and records the call."""
    from bench import gpu_check

    calls = []

    def launch(job, nproc, backend, device, quick, out_dir, timeout):
        calls.append((job, nproc, backend, device))
        return outcomes[(job, backend)]

    monkeypatch.setattr(gpu_check, "_launch", launch)
    return calls


def _passing(jobs, backend):
    num = {"goddp": {"max_abs_diff": 1e-7, "bitwise": False, "close": True, "exact_expected": False}}
    part = {"report": "== time: (report) ==", "failures": [], "numerics": num, "goddp_log": ["goddp plan: (table)"],
            "trace": {"goddp": {"launched": 3, "buckets": 4, "exposed_median_s": 0.001, "exposed_share_median": 0.1}}}
    return {"ok": True, "took_s": 1.0, "backend": backend, "jobs": {j: part for j in jobs}}


def _failed(line):
    return {"ok": False, "took_s": 1.0, "rc": [1, 1], "tail": ["Traceback ...", line]}


def test_a_failing_job_fails_the_check(monkeypatch, capsys, tmp_path):
    import torch

    from bench import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _fake_jobs(monkeypatch, {("single", "gloo"): _passing(("fp32", "bf16"), "gloo"),
                             ("pair", "gloo"): _failed("RuntimeError: the other rank died")})
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "job failed" in out and "RuntimeError: the other rank died" in out
    assert "1 check(s) FAILED" in out and gpu_check.SKIP_MESSAGE in out


def test_a_parameter_mismatch_fails_the_check(monkeypatch, capsys, tmp_path):
    import torch

    from bench import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bad = _passing(("fp32", "bf16"), "gloo")
    bad["jobs"] = {**bad["jobs"], "bf16": {**bad["jobs"]["bf16"], "numerics": {
        "goddp": {"max_abs_diff": 0.5, "bitwise": False, "close": False, "exact_expected": False}}}}
    _fake_jobs(monkeypatch, {("single", "gloo"): bad, ("pair", "gloo"): _passing(("pair",), "gloo")})
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT (max |diff| 0.5)" in out and "bf16 autocast: goddp" in out


def test_on_a_gpu_nccl_is_tried_first_and_gloo_runs_when_it_refuses_two_ranks(monkeypatch, capsys, tmp_path):
    import torch

    from bench import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    calls = _fake_jobs(monkeypatch, {
        ("single", "nccl"): _passing(("fp32", "bf16"), "nccl"),
        ("pair", "nccl"): _failed("torch.distributed.DistBackendError: NCCL error: invalid usage, Duplicate GPU detected"),
        ("pair", "gloo"): _passing(("pair",), "gloo"),
        ("mixed", "gloo"): _passing(("mixed",), "gloo"),
    })
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert calls == [("single", 1, "nccl", "cuda"), ("pair", 2, "nccl", "cuda"), ("pair", 2, "gloo", "cuda"),
                     ("mixed", 2, "gloo", "cuda")]
    out = capsys.readouterr().out
    mixed = [r for r in out.splitlines() if r.startswith(f"{gpu_check.MIXED_LABEL}, gloo")]
    assert any(r.rstrip().endswith("pass") for r in mixed) and gpu_check.MIXED_SKIPPED not in out, out
    assert "NCCL refused two ranks on one device" in out and "Duplicate GPU detected" in out
    assert "2 ranks, gloo, CUDA" in out and gpu_check.SKIP_MESSAGE not in out
    assert "every check passed" in out


def test_on_a_gpu_each_runs_step_peak_memory_is_a_row(monkeypatch, capsys, tmp_path):
    import torch

    from bench import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    single = _passing(("fp32", "bf16"), "nccl")
    single["jobs"] = {**single["jobs"], "fp32": {**single["jobs"]["fp32"],
                                                  "step_peak_mib": {"compiled": 200.0, "goddp": 150.0}}}
    _fake_jobs(monkeypatch, {("single", "nccl"): single, ("pair", "nccl"): _passing(("pair",), "nccl"),
                             ("mixed", "nccl"): _passing(("mixed",), "nccl")})
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if "step peak memory" in r]
    assert len(rows) == 1 and rows[0].startswith("1 rank, nccl, CUDA, fp32"), rows
    assert "torch.compile(DDP), unsplit 200 MiB" in rows[0] and "150 MiB (0.75x unsplit)" in rows[0]
