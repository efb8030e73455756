"""One worker of test_dist_elastic.py, run by torchrun --max-restarts=1.

Trains a small model as eager DDP and as goddp-compiled DDP from the same
weights. In the first attempt the last rank dies (argv[2]: "after-step",
after one compiled step; "before-agreement", before its first training call,
while the others wait for it there); in the restarted attempt every rank
trains to the end and writes what it saw to <out>/rank<r>.json.

The process group's store is the agent's, prefixed by the attempt: torch
2.15 shares the agent's store across attempts without a prefix, and gloo's
own rendezvous then reads the dead attempt's addresses (a torch matter,
not goddp's; eager DDP fails the same way).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import report_and_leave
from models import Tower

STEPS = 3


def train(compiled: bool, die_after: int | None) -> tuple[DDP, list[float]]:
    torch.manual_seed(0)
    ddp = DDP(Tower(depth=5), bucket_cap_mb=0.01)
    forward = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False}) if compiled else ddp
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        if die_after == 0:
            os._exit(17)
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(8, 32, generator=torch.Generator().manual_seed(100 * dist.get_rank() + step))
        loss = forward(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if die_after is not None and step + 1 == die_after:
            sys.stdout.flush()
            os._exit(17)
    return ddp, losses


def main(out: str, when: str) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store, rank, world_size = next(dist.rendezvous("env://"))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt/{attempt}", store), rank=rank, world_size=world_size)
    dies = attempt == 0 and rank == world_size - 1
    _, eager = train(compiled=False, die_after=None)
    ddp, losses = train(compiled=True, die_after=({"after-step": 1, "before-agreement": 0}[when] if dies else None))
    data = ddp._get_ddp_logging_data()
    sizes = data["rebuilt_bucket_sizes"] if data.get("has_rebuilt_buckets") else data["bucket_sizes"]
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    result = {
        "attempt": attempt, "eager": eager, "losses": losses, "pieces": plan["num_pieces"],
        "aligned": plan["ddp_buckets"]["aligned"], "reason": plan["ddp_buckets"]["reason"],
        "ddp_bucket_sizes": [int(s) for s in sizes.split(", ")],
        "plan_bucket_sizes": [b["bytes"] for b in plan["buckets"]],
    }
    report_and_leave(out, rank, result, before_leaving=dist.destroy_process_group)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
