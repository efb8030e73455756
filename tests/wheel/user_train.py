"""A user's two-rank training script, run by test_user_path.py from a
directory outside the checkout, with goddp installed from the wheel alone.

    python -m torch.distributed.run --standalone --nproc_per_node=2 user_train.py OUT_DIR

It trains a small MLP twice from the same weights on the same per-rank
batches (the last one short, as a DataLoader's last batch is): once as
eager DDP, once compiled with backend="goddp" (found through the wheel's
entry point; the script never imports goddp to compile). Each rank writes
OUT_DIR/rank<N>.json with what the test asserts.
"""

import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH, DEPTH = 96, 6
BATCHES = [8, 8, 8, 5]  # an uneven last batch


class Regressor(nn.Module):
    # A model class of its own, as scripts have: Dynamo compiles nothing of
    # a bare nn.Sequential under DDP (its forward is torch's own code, where
    # Dynamo does not start a frame).
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def make_model():
    torch.manual_seed(0)
    return Regressor()


def batches(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(n, WIDTH, generator=g), torch.randn(n, 1, generator=g)) for n in BATCHES]


def train(model, data):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(out_dir):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = batches(rank)
    # Small buckets, so that DDP has several and goddp cuts between them.
    eager = DDP(make_model(), bucket_cap_mb=0.05)
    eager_losses = train(eager, data)

    ddp = DDP(make_model(), bucket_cap_mb=0.05)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": rank == 0})
    goddp_losses = train(compiled, data)
    with torch.no_grad():  # an evaluation step, as training scripts have
        compiled(torch.randn(3, WIDTH))

    import goddp  # only now, to read what it did
    import goddp.native.extension

    plans = goddp.last_plans()
    logging_data = ddp._get_ddp_logging_data()
    diffs = [(a - b).abs().max().item() for a, b in zip(eager.parameters(), ddp.parameters())]
    result = {
        "goddp_file": goddp.__file__,
        "goddp_version": goddp.__version__,
        "library_file": goddp.native.extension.load().path if goddp.native.extension.is_loaded() else None,
        "sys_path": sys.path,
        "go_on_path": shutil.which("go"),
        "cwd": os.getcwd(),
        "torch": torch.__version__,
        "pieces": [p["num_pieces"] for p in plans],
        "aligned": [(p["ddp_buckets"] or {}).get("aligned") for p in plans],
        "fallbacks": [p["fallback"] for p in plans],
        "plan_bucket_bytes": [b["bytes"] for b in plans[0]["buckets"]] if plans else [],
        "rebuilt_bucket_sizes": str(logging_data.get("rebuilt_bucket_sizes", "")),
        "max_param_diff": max(diffs),
        "eager_losses": eager_losses,
        "goddp_losses": goddp_losses,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()
    # Leave without Python's finalization: Note [Leaving a gloo rank] in
    # tests/python/_dist_util.py (this script runs outside the checkout).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
