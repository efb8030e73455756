"""Ranks whose layouts for DDP's buckets differ, under strict=True: every
rank stops before a collective.

Two ranks that set the same DDP module's buckets differently would issue
bucket allreduces that do not pair up and hang. Here rank 1 runs a
genuinely different model: the same parameters (so DDP's own shape check at
construction passes) applied in the opposite order, so its buckets would
hold other parameters. Under strict=True every rank raises
PlanMismatchError naming what differs, and again at every later call;
without it every rank keeps DDP's own buckets and trains on
(test_dist_rank_layouts.py, in both modes). Ranks with the same model agree.

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group
from goddp.ranks.verdict import PlanMismatchError


@pytest.fixture(scope="module")
def group(dist_group):
    return short_timeout_group(60)


class Stack(nn.Module):
    """Square layers, applied last-to-first when `reverse`."""

    def __init__(self, reverse: bool) -> None:
        super().__init__()
        self.reverse = reverse
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(6))

    def forward(self, x):
        for layer in reversed(self.layers) if self.reverse else self.layers:
            x = torch.relu(layer(x))
        return x


def _compile(group, mode, reverse, strict=False):
    torch.manual_seed(0)
    ddp = DDP(Stack(reverse), process_group=group, bucket_cap_mb=0.03)
    options = {"inner": "aot_eager", "mode": mode, "log_plan": False, "strict": strict}
    return torch.compile(ddp, backend="goddp", options=options)


@needs_two_ranks
def test_a_different_model_on_one_rank_raises_on_every_rank_under_strict(group):
    torch._dynamo.reset()
    goddp.clear_plans()
    compiled = _compile(group, "ddp", reverse=rank() == 1, strict=True)
    messages = []
    for _ in range(2):
        with pytest.raises(PlanMismatchError) as raised:
            compiled(torch.randn(8, 64)).sum().backward()
        messages.append(str(raised.value))
    message = messages[0]
    assert messages[1] == message  # every later call stops too
    assert "proposed different layouts for DDP's buckets (bucket 0: rank 1 holds [" in message
    (plan,) = goddp.last_plans()
    # it names every rank's plan, so the user can see who disagreed (and
    # every rank was heard: the round settled, nobody waited on a timeout)
    for r, fingerprint in enumerate(_gather(plan["fingerprint"], group)):
        assert f"rank {r}: plan {fingerprint:016x}" in message, message
    assert len(set(_gather(message, group))) == 1, message  # the same error on every rank
    torch._dynamo.reset()


@needs_two_ranks
def test_the_same_model_agrees(group):
    torch._dynamo.reset()
    goddp.clear_plans()
    _compile(group, "ddp", reverse=False)(torch.randn(8, 64)).sum().backward()
    (plan,) = goddp.last_plans()
    assert plan["num_pieces"] > 1 and plan["ddp_buckets"]["aligned"]
    assert {r["fingerprint"] for r in plan["plan_check"]["ranks"]} == {f"{plan['fingerprint']:016x}"}
    assert len(set(_gather(plan["fingerprint"], group))) == 1
    torch._dynamo.reset()


def _gather(value, group):
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


@pytest.mark.single_process
def test_fingerprint_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=240)
