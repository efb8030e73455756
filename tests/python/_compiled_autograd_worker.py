"""One rank of test_dist_tools.py's Python-reducer case, in a process of its
own: optimize_ddp="python_reducer" changes Dynamo's inlining rules for
DDP's forward for the rest of a process (DDP's constructor adds DDP's
module to them, and whether that takes effect depends on what Dynamo has
cached before), which no other test may see.

    python _compiled_autograd_worker.py <out> <rank> <world size> <store file>

With compiled autograd on and optimize_ddp="python_reducer", goddp says
once at INFO that compiled autograd schedules DDP's allreduces and gives
each graph to the inner compiler uncut; three compiled training steps run
(the third recompiles DDP's forward for another batch size), and the ranks'
weights stay equal (the allreduces ran). Writes what it saw
to <out>/rank<r>.json.
"""

from __future__ import annotations

import logging
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import report_and_leave
from models import Tower


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


class Seen:
    """goddp, noting each graph it receives and each graph its inner
    compiler (which runs the graph as it is) receives."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.compiled: list[int] = []
        self._goddp = goddp.backend(inner=self._inner)

    def _inner(self, gm, example_inputs):
        self.compiled.append(id(gm))
        return gm.forward

    def __call__(self, gm, example_inputs, **kwargs):
        self.received.append(id(gm))
        return self._goddp(gm, example_inputs, **kwargs)


def python_reducer(lines: Lines) -> dict:
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch.manual_seed(0)
    ddp = DDP(Tower(depth=4), bucket_cap_mb=0.005)
    before = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    seen = Seen()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)

    @torch.compile(backend=seen)
    def step(x):
        loss = ddp(x).pow(2).sum()
        loss.backward()
        return loss.detach()

    losses = []
    for i in range(2):
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(step(torch.randn(4, 32, generator=torch.Generator().manual_seed(10 * dist.get_rank() + i)))))
        optimizer.step()
    # Another batch size: Dynamo compiles DDP's forward again, and goddp says nothing more.
    optimizer.zero_grad(set_to_none=True)
    step(torch.randn(6, 32))
    optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    return {
        "info": [text for level, text in lines.lines if level == "INFO" and "compiled autograd" in text],
        "warnings": [text for level, text in lines.lines if level == "WARNING"],
        "received": len(seen.received),
        "uncut": seen.compiled == seen.received,
        "plans": len(goddp.last_plans()),
        "losses": losses,
        "weights_equal": all(torch.equal(gathered[0], g) for g in gathered),
        "weights_moved": not torch.equal(weights, before),
    }


def main(out: str, rank: int, world_size: int, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    torch._dynamo.config.compiled_autograd = True
    lines = Lines()
    logger = logging.getLogger("goddp")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    report_and_leave(out, rank, python_reducer(lines))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
