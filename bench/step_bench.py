"""Launch one step-benchmark job: two torchrun ranks across the shaped link.

Each rank runs in its own network namespace, pinned to its own core, with
gloo bound to that namespace's veth end, so every gradient byte crosses the
tbf-shaped link. Rank 0's progress lines are streamed with a prefix; rank 1
writes to a log file that is shown if anything fails.

With link=None (development only) both ranks run on the host over loopback,
unshaped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import link as linkmod

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def _rank_env(device: str) -> dict:
    env = dict(os.environ)
    env.update({
        "GLOO_SOCKET_IFNAME": device,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # One compile thread: each rank has one core, and inductor's worker
        # pool would fork/spawn processes that only compete for it.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        # No cross-variant or cross-run compile caches: compile times stay
        # comparable and every variant really compiles.
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _rank_command(rank: int, job_path: Path, out_dir: Path, master: str, port: int) -> list[str]:
    core = rank % os.cpu_count()
    return [
        "taskset", "-c", str(core), TORCHRUN,
        "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}",
        f"--master_addr={master}", f"--master_port={port}",
        "-m", "bench.step_worker", "--job", str(job_path), "--out", str(out_dir),
    ]


def _stream(pipe, prefix: str, sink) -> None:
    for line in iter(pipe.readline, ""):
        print(prefix + line, end="", flush=True)
        sink.write(line)
        sink.flush()


def run_job(job: dict, out_dir: Path, link: linkmod.LinkNames | None, port: int) -> list[dict]:
    """Run `job` on both ranks; return the two ranks' results (rank order)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    job_path = out_dir / "job.json"
    job_path.write_text(json.dumps({**job, "link": link is not None}, indent=1))
    cache_dir = out_dir / "inductor-cache"
    procs, logs, threads = [], [], []
    try:
        for rank in (0, 1):
            master = link.addresses[0] if link else "127.0.0.1"
            device = link.devices[rank] if link else "lo"
            cmd = _rank_command(rank, job_path, out_dir, master, port)
            if link:
                cmd = linkmod.in_namespace(rank, cmd, link)
            env = _rank_env(device)
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / f"rank{rank}")
            log = open(out_dir / f"rank{rank}.log", "w")
            logs.append(log)
            # Own session per rank: a timeout or Ctrl-C can then end exactly
            # the processes this job started, and nothing else.
            p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, start_new_session=True)
            procs.append(p)
            if rank == 0:
                t = threading.Thread(target=_stream, args=(p.stdout, "  ", log), daemon=True)
            else:
                t = threading.Thread(target=lambda p=p, log=log: [log.write(x) for x in p.stdout],
                                     daemon=True)
            t.start()
            threads.append(t)
        deadline = time.monotonic() + job["timeout_s"]
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job['name']} exceeded {job['timeout_s']}s")
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                # The other rank is now stuck in a collective; give it a
                # moment to fail on its own, then stop it.
                time.sleep(10)
                break
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=5)
        codes = [p.poll() for p in procs]
        if codes != [0, 0]:
            raise RuntimeError(f"job {job['name']} failed: exit codes {codes}; "
                               f"see {out_dir}/rank*.log\n--- rank 1 log tail ---\n"
                               + _tail(out_dir / "rank1.log"))
    finally:
        for p in procs:
            _stop(p)
        for rank in (0, 1):
            _stop_worker(out_dir / f"worker{rank}.pid")
        for log in logs:
            log.close()
        shutil.rmtree(cache_dir, ignore_errors=True)  # compiled kernels: large, not results
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1)]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)  # the session we created for this rank
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _stop_worker(pid_file: Path) -> None:
    """Kill a worker torchrun left behind, if that pid is still our worker."""
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if b"bench.step_worker" in cmdline and str(pid_file.parent).encode() in cmdline:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError:
        return "(no log)"
