"""align_buckets under find_unused_parameters=True: DDP never rebuilds its
buckets there and keeps the ones it fills in declaration order, so goddp
gives it caps for that order (planner/declorder.go), merging the pieces
that the declaration order interleaves. Checked against the buckets DDP
reports and the gradients of eager DDP; under torchrun on 2 ranks too
(`make pytest-dist`), where any disagreement between the ranks' buckets
would fail gloo's allreduce."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


from goddp._align import install_bucket_caps
from models import SquareStack

WIDTH = 128
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4


@pytest.fixture(autouse=True)
def _group(dist_group):
    return dist_group


def _bucket_sizes(ddp) -> list[int]:
    """The sizes of the buckets DDP reduces with, in DDP order."""
    data = ddp._get_ddp_logging_data()
    sizes = data["rebuilt_bucket_sizes"] if data.get("has_rebuilt_buckets") else data["bucket_sizes"]
    return [int(s) for s in sizes.split(", ")]


def _recording_hook(seen: list, names: dict):
    def hook(state, bucket):
        seen.append([names[id(p)] for p in bucket.parameters()])
        work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    return hook


def test_caps_set_the_buckets_ddp_keeps_under_find_unused_parameters():
    """The mechanism on eager DDP: caps installed inside DDP's forward fill
    DDP's declaration-order buckets, first-declared first, and DDP keeps
    them (it never rebuilds)."""
    torch.manual_seed(0)
    model = SquareStack(WIDTH, 6)
    ddp = DDP(model, find_unused_parameters=True)
    names = {id(p): n for n, p in model.named_parameters()}
    seen: list = []
    ddp.register_comm_hook(None, _recording_hook(seen, names))
    caps = [2 * LAYER_BYTES, 3 * LAYER_BYTES, LAYER_BYTES]  # the order DDP walks them
    installed = []
    model.register_forward_pre_hook(lambda mod, args: installed.append(install_bucket_caps(ddp, caps)))
    for _ in range(3):
        seen.clear()
        ddp(torch.randn(4, WIDTH)).sum().backward()
    assert installed == [True, False, False]
    assert _bucket_sizes(ddp) == caps[::-1]
    layers = [sorted({name.split(".")[1] for name in bucket}) for bucket in seen]
    assert layers == [["5"], ["2", "3", "4"], ["0", "1"]]
