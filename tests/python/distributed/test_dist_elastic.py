"""An elastic restart (torchrun --max-restarts=1) keeps goddp working.

In the first attempt the last rank dies after one compiled training step,
or before its first training call while the other waits for it in the
agreement; torchrun stops the others and starts every rank again. The restarted run
must agree afresh (the agreement's store keys are the new attempt's, never
the dead one's), align DDP's buckets on every rank and train exactly as
eager DDP does, with default settings and no timeout override.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _dist_util import REPO_ROOT, under_torchrun, worker_result_path

WORKER = Path(__file__).resolve().parents[1] / "_elastic_worker.py"


@pytest.mark.single_process
@pytest.mark.parametrize("when", ["after-step", "before-agreement"])
def test_a_restarted_run_agrees_aligns_and_trains(when):
    if under_torchrun():
        pytest.skip("launches torchrun itself")
    with tempfile.TemporaryDirectory() as out:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.setdefault("OMP_NUM_THREADS", "1")
        port = 20000 + random.randrange(20000)
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{port}", str(WORKER), out, when,
        ]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=420)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output[-6000:]
        results = [json.loads(worker_result_path(out, r).read_text()) for r in range(2)]
    for r, result in enumerate(results):
        assert result["attempt"] == 1, (r, result)
        assert result["losses"] == result["eager"], (r, result)
        assert result["pieces"] > 1, (r, result)
        assert result["aligned"] is True, (r, result)
        assert result["ddp_bucket_sizes"] == result["plan_bucket_sizes"], (r, result)
    assert results[0]["ddp_bucket_sizes"] == results[1]["ddp_bucket_sizes"]
