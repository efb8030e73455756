"""align_buckets under find_unused_parameters=True: DDP never rebuilds its
buckets there and keeps the ones it fills in declaration order, so goddp
gives it caps for that order (planner/declorder.go), merging the pieces
that the declaration order interleaves. Checked against the buckets DDP
reports and the gradients of eager DDP, on one rank. Ranks that declare
differently are test_dist_rank_safety's; two ranks training with
declaration-order caps, test_dist_checkpoint's find_unused case."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.ddp.align import install_bucket_caps
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


class HeadFirst(nn.Module):
    """A stack whose last layer is declared first, as a classifier head
    defined before the body: declaration and forward order disagree."""

    def __init__(self, depth: int = 6) -> None:
        super().__init__()
        self.head = nn.Linear(WIDTH, WIDTH)
        self.body = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(depth - 1))

    def forward(self, x):
        for layer in self.body:
            x = torch.relu(layer(x))
        return self.head(x)


def _train_both(build, steps: int = 3, **ddp_kwargs):
    """Eager DDP and goddp-compiled DDP from the same weights; asserts equal
    gradients every step and returns the compiled DDP module."""
    torch.manual_seed(0)
    base = build()
    eager, ddp = DDP(build(), **ddp_kwargs), DDP(build(), **ddp_kwargs)
    eager.module.load_state_dict(base.state_dict())
    ddp.module.load_state_dict(base.state_dict())
    compiled = torch.compile(
        ddp, backend="goddp", options={"inner": "aot_eager", "log_plan": False, "strict": True}
    )
    for step in range(steps):
        x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(100 * dist.get_rank() + step))
        eager.zero_grad()
        ddp.zero_grad()
        eager(x).square().sum().backward()
        compiled(x).square().sum().backward()
        for a, b in zip(eager.parameters(), ddp.parameters()):
            assert torch.equal(a.grad, b.grad)
    return ddp


def test_goddp_aligns_find_unused_ddp_in_declaration_order():
    ddp = _train_both(lambda: SquareStack(WIDTH, 6), bucket_cap_mb=0.125, find_unused_parameters=True)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is True, plan["ddp_buckets"]
    assert plan["alignment"] == "declaration-order caps"
    assert plan["num_pieces"] >= 3 and plan["merged_cuts"] == 0
    assert _bucket_sizes(ddp) == [b["bytes"] for b in plan["buckets"]]
    # DDP walks the caps first-declared first: the reverse of DDP order.
    assert plan["ddp_caps"] == [b["bytes"] for b in plan["buckets"]][::-1]


def test_goddp_cuts_only_where_a_declaration_order_bucket_can_start():
    """The head, declared first but used last, shares the first layer's
    bucket (the last DDP launches); no bucket can start when the head's own
    piece ends, so that one cut goes and every other stays."""
    ddp = _train_both(HeadFirst, bucket_cap_mb=0.06, find_unused_parameters=True)
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"]["aligned"] is True, plan["ddp_buckets"]
    assert plan["alignment"] == "declaration-order caps, pieces merged"
    assert plan["merged_cuts"] == 1 and plan["num_pieces"] == 5
    first_launched_last = plan["buckets"][-1]["param_names"]
    assert {"head.weight", "body.0.weight"} <= set(first_launched_last)
    assert _bucket_sizes(ddp) == [b["bytes"] for b in plan["buckets"]]


@pytest.mark.parametrize(
    ("ddp_kwargs", "noted"),
    [({"find_unused_parameters": True}, True), ({"find_unused_parameters": True, "static_graph": True}, False), ({}, False)],
)
def test_the_declaration_order_note_follows_the_planners_ddp_bucket_order(caplog, ddp_kwargs, noted):
    """Without align_buckets, the INFO note that DDP's own buckets stay in
    declaration order comes from the plan's ddp_bucket_order (the planner's
    rule from DDP's flags), not from a rule of Python's own."""
    torch.manual_seed(0)
    ddp = DDP(SquareStack(depth=4, width=WIDTH), bucket_cap_mb=0.125, **ddp_kwargs)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "align_buckets": False, "log_plan": False})
    caplog.set_level(logging.INFO, logger="goddp")
    compiled(torch.randn(4, WIDTH)).sum().backward()
    (plan,) = goddp.last_plans()
    assert plan["num_pieces"] > 1
    assert ("stay in parameter declaration order" in caplog.text) is noted
