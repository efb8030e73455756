"""The two ways to overlap DDP's allreduces with a compiled backward, side by
side on the bench's GPT: goddp's cuts with DDP's C++ reducer, and compiled
autograd with DDP's Python reducer (goddp then passes each graph uncut).

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 \\
        -m bench.compiled_autograd_paths [--size quick] [--steps 20] [--inner aot_eager]

- "goddp cuts, C++ reducer": ``torch.compile(ddp, backend=goddp)``, an
  eager ``loss.backward()``: goddp cuts the forward at DDP's buckets and
  DDP's C++ reducer launches each bucket's allreduce while autograd runs the
  remaining pieces' backward.
- "compiled autograd, Python reducer": ``optimize_ddp = "python_reducer"``
  before the DDP module is built, ``compiled_autograd = True``, and the whole
  step (forward and ``loss.backward()``) under ``torch.compile(backend=goddp)``:
  Dynamo inlines DDP's forward, goddp passes the graph uncut, and compiled
  autograd traces the backward with DDP's allreduces in it.

Both start from the same weights and train on the same batch. The first path is compiled
(its first step) before the Python reducer is switched on: that mode is read
when a DDP module is built and when goddp compiles a graph. Prints, per
path, the first step's time (compiling included) and the later steps'
median and p10-p90 (each step the slower rank's, the paths interleaved),
the graphs the inner compiler compiled, and the loss after the last step.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench import models
from bench.stats import summarize

PATHS = ("goddp cuts, C++ reducer", "compiled autograd, Python reducer")


class Counting:
    """The inner compiler, counting the graphs it compiles."""

    def __init__(self, name: str) -> None:
        from torch._dynamo.backends.registry import lookup_backend  # after torch.compile set up its registry

        self.inner = lookup_backend(name)
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return self.inner(gm, example_inputs)


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="quick")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--inner", default="aot_eager")
    args = ap.parse_args(argv)
    import goddp

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    work = models.build("gpt", args.size)

    def timed(step, i) -> float:
        t = time.perf_counter()
        step(i)
        return slowest(time.perf_counter() - t)

    # goddp's cuts, DDP's C++ reducer, backward outside torch.compile.
    inners = {path: Counting(args.inner) for path in PATHS}
    cut_ddp = DDP(copy.deepcopy(work.model))
    cut_model = torch.compile(cut_ddp, backend=goddp.backend(inner=inners[PATHS[0]], log_plan=False))
    cut_opt = torch.optim.SGD(cut_ddp.parameters(), lr=1e-3)
    losses = {}

    def cut_step(i):
        cut_opt.zero_grad(set_to_none=True)
        loss = work.loss(cut_model(*work.inputs))
        loss.backward()
        cut_opt.step()
        losses[PATHS[0]] = float(loss.detach())

    first = {PATHS[0]: timed(cut_step, 0)}
    plan = goddp.last_plans()[-1]

    # Compiled autograd, DDP's Python reducer, the whole step compiled.
    torch._dynamo.config.optimize_ddp = "python_reducer"
    torch._dynamo.config.compiled_autograd = True
    ca_ddp = DDP(copy.deepcopy(work.model))
    ca_opt = torch.optim.SGD(ca_ddp.parameters(), lr=1e-3)

    @torch.compile(backend=goddp.backend(inner=inners[PATHS[1]], log_plan=False))
    def ca_forward_backward(*inputs):
        loss = work.loss(ca_ddp(*inputs))
        loss.backward()
        return loss.detach()

    def ca_step(i):
        ca_opt.zero_grad(set_to_none=True)
        loss = ca_forward_backward(*work.inputs)
        ca_opt.step()
        losses[PATHS[1]] = float(loss)

    first[PATHS[1]] = timed(ca_step, 0)
    steps = {PATHS[0]: cut_step, PATHS[1]: ca_step}
    times = {path: [] for path in PATHS}
    for i in range(1, args.steps + 1):
        for path in PATHS if i % 2 else PATHS[::-1]:
            times[path].append(timed(steps[path], i))
    if rank == 0:
        print(f"GPT {args.size} ({work.description}), {dist.get_world_size()} ranks, gloo on CPU, inner {args.inner}, "
              f"{args.steps} steps per path, interleaved; goddp's plan: {plan['num_pieces']} pieces, "
              f"{len(plan['buckets'])} buckets, DDP's buckets aligned: {plan['ddp_buckets']['aligned']}")
        for path in PATHS:
            s = summarize(times[path])
            print(f"  {path:34} first step {first[path]:6.2f} s; later steps median {s['median'] * 1e3:7.1f} ms "
                  f"(p10-p90 {s['p10'] * 1e3:.1f}-{s['p90'] * 1e3:.1f}); inner compiled {inners[path].graphs} graphs; "
                  f"loss after the last step {losses[path]:.5f}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
