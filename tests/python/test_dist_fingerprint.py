"""Ranks that plan differently are stopped before their first collective.

goddp compares plan fingerprints across ranks (check_plans) before a
compiled graph runs: two ranks cutting the same graph differently would
issue bucket allreduces that do not pair up and hang. The tests here patch
goddp._plan_check.published_fingerprint so that one rank publishes a
perturbed plan; every rank must then raise a RuntimeError that speaks of the
fingerprint mismatch, promptly (the DDP group here times out after 60 s, and
a plain pytest run kills the whole torchrun after a few minutes).

A plain pytest run launches this file under torchrun itself.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import goddp
import goddp._plan_check as plan_check
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group
from models import ZOO

PERTURBED_RANK = 1


@pytest.fixture(scope="module")
def group(dist_group):
    return short_timeout_group(60)


def _compile_and_step(group, mode):
    entry = ZOO["mlp"]
    ddp = entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=entry.ddp_cap_mb)
    options = {"inner": "aot_eager", "mode": mode, "check_plans": True, "log_plan": False}
    compiled = torch.compile(ddp, backend="goddp", options=options)
    entry.loss(compiled(*entry.make_inputs(rank()))).backward()


@needs_two_ranks
@pytest.mark.parametrize("mode", ["ddp", "torch"])
def test_perturbed_plan_raises_on_every_rank(group, monkeypatch, mode):
    monkeypatch.setattr(
        plan_check, "published_fingerprint", lambda fp, r: fp ^ 1 if r == PERTURBED_RANK else fp
    )
    # were a rank never to publish its plan, the others would give up waiting after this
    monkeypatch.setenv("GODDP_PLAN_CHECK_TIMEOUT", "30")
    torch._dynamo.reset()
    goddp.clear_plans()
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        _compile_and_step(group, mode)
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "fingerprint" in message.lower(), message
    # it names every rank's plan, so the user can see who disagreed
    assert all(f"rank {r}" in message for r in range(dist.get_world_size(group))), message
    # every rank saw the error (this collective runs on a healthy group)
    outcomes = [None] * dist.get_world_size(group)
    dist.all_gather_object(outcomes, ("fingerprint" in message.lower(), round(elapsed, 1)), group=group)
    assert all(ok for ok, _ in outcomes), outcomes
    assert elapsed < 45, f"the mismatch took {elapsed:.0f} s to surface: something waited on a timeout"
    torch._dynamo.reset()


@needs_two_ranks
def test_unperturbed_plans_agree(group, monkeypatch):
    """The same compile without the perturbation passes the check on both ranks."""
    torch._dynamo.reset()
    goddp.clear_plans()
    _compile_and_step(group, "ddp")
    plans = goddp.last_plans()
    assert plans and plans[0]["num_pieces"] > 1
    fingerprints = [None] * dist.get_world_size(group)
    dist.all_gather_object(fingerprints, [p["fingerprint"] for p in plans], group=group)
    assert fingerprints[0] == fingerprints[1]
    torch._dynamo.reset()


@pytest.mark.single_process
def test_fingerprint_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, cases_per_rank=3, timeout=240)
