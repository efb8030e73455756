"""The agreement rounds among real ranks, whatever their number: the plan
check at a DDP module's first training call (goddp.ranks.agreement.agree,
its install round included) and goddp.trace's enter and leave, through
torchrun's store (Note [A round that does not grow with the group] in
goddp.ranks.store_round).

Each case runs inside every rank under torchrun, on a group of its own, and
holds for any number of ranks; a plain pytest run launches this file under
torchrun with 2 ranks and with 4 (test_rounds_under_torchrun). The last
rank is the one that differs, never comes or comes late. Small models, no
compile: the statements are made by hand, as the compile pipeline makes
them.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank, short_timeout_group
from goddp.ddp.state import state_of
from goddp.ranks import agreement
from goddp.ranks.layout import layout_of
from goddp.ranks.store_round import TIMEOUT_ENV
from goddp.ranks.verdict import INSTALL, KEEP, PlanMismatchError, Statement
from models import SquareStack

WIDTH, DEPTH = 16, 4
PER_LAYER = (WIDTH * WIDTH + WIDTH) * 4
WAIT_S = "1.5"  # the first round's bound where a rank is missing on purpose
# The groups' own timeout. Also the watchdog of the bounded-wait case: a rank
# that waited on it, not on WAIT_S, would take this long (forty times WAIT_S:
# no machine is that slow).
GROUP_TIMEOUT_S = 60


def _last() -> int:
    return dist.get_world_size() - 1


def _layers(*order):
    return [n for k in order for n in (f"layers.{k}.bias", f"layers.{k}.weight")]


def _statement(model, differs=False, strict=False) -> Statement:
    """Two buckets of two layers each, in gradient-ready order; differs:
    the layers paired otherwise (another layout)."""
    buckets = [_layers(3, 1), _layers(2, 0)] if differs else [_layers(3, 2), _layers(1, 0)]
    positions = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    layout = layout_of(buckets, [2 * PER_LAYER] * 2, "ready", positions)
    return Statement(layout=layout, digest=layout.digest(), strict=strict, fingerprint=0xF00D + rank(), pieces=2)


def _run(statement_of=None, before=lambda: None, steps=2):
    """A fresh DDP on a group of its own; statement_of(model): this rank's
    statement, agreed at the module's first training call (None: this rank
    never comes to the agreement). Returns (ddp, decisions, gradients of
    each step, the group)."""
    group = short_timeout_group(GROUP_TIMEOUT_S)
    torch.manual_seed(0)
    model = SquareStack(WIDTH, DEPTH)
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.25)
    decisions = []
    if statement_of is not None:
        statement = statement_of(model)

        def at_training_call(module, args):
            if agreement.decided(ddp) is None:
                before()
                decisions.append(agreement.agree(ddp, statement, lambda plan_check, buckets: None))

        model.register_forward_pre_hook(at_training_call)
    grads = []
    for step in range(steps):
        ddp.zero_grad(set_to_none=True)
        ddp(torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(10 * rank() + step))).square().sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in ddp.parameters()]))
    return ddp, decisions, grads, group


def _everyone(value, group):
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def _assert_trained_alike(grads, group):
    """DDP averaged every gradient: each rank holds the same ones (buckets
    that did not pair up across ranks would have failed or differed)."""
    for g in grads:
        assert all(torch.equal(g, other) for other in _everyone(g, group))


@needs_two_ranks
def test_ranks_that_agree_install_the_layout_on_every_rank(dist_group):
    ddp, (decision,), grads, group = _run(_statement)
    assert decision.action == INSTALL and state_of(ddp).aligned_caps == decision.caps
    assert [r["rank"] for r in decision.summary()["ranks"]] == list(range(dist.get_world_size()))
    _assert_trained_alike(grads, group)


# the rank, the bucket and the parameters where the last rank's layout differs
_DIFFERENCE = "bucket 0: rank {last} holds [layers.1.bias, layers.1.weight] where rank 0 holds [layers.2.bias, layers.2.weight]"


@needs_two_ranks
def test_ranks_that_differ_keep_ddp_buckets_and_name_who_differs(dist_group):
    ddp, (decision,), grads, group = _run(lambda m: _statement(m, differs=rank() == _last()))
    assert decision.action == KEEP and decision.disagreed and state_of(ddp).aligned_caps is None
    assert decision.reason.startswith(f"the ranks' layouts differ: {_DIFFERENCE.format(last=_last())}"), decision.reason
    assert len(set(_everyone(decision.reason, group))) == 1
    _assert_trained_alike(grads, group)


@needs_two_ranks
def test_layouts_that_differ_raise_on_every_rank_under_strict(dist_group):
    with pytest.raises(PlanMismatchError) as raised:
        _run(lambda m: _statement(m, differs=rank() == _last(), strict=rank() == _last()))
    message = str(raised.value)
    assert f"proposed different layouts for DDP's buckets ({_DIFFERENCE.format(last=_last())})" in message, message
    for r in range(dist.get_world_size()):
        assert f"rank {r}: plan {0xF00D + r:016x}" in message, message
    assert len(set(_everyone(message, short_timeout_group(GROUP_TIMEOUT_S)))) == 1


@needs_two_ranks
def test_a_rank_that_never_comes_costs_a_bounded_wait_and_every_rank_keeps(dist_group, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, WAIT_S)
    started = time.monotonic()
    ddp, decisions, grads, group = _run(None if rank() == _last() else _statement)
    assert state_of(ddp).aligned_caps is None
    _assert_trained_alike(grads, group)  # the missing rank's DDP buckets pair with everyone's
    if rank() == _last():
        assert decisions == []
        return
    (decision,) = decisions
    assert decision.action == KEEP
    assert f"rank(s) [{_last()}] did not come to the agreement within the bounded wait" in decision.reason, decision.reason
    assert time.monotonic() - started < GROUP_TIMEOUT_S, "the wait was the group's timeout, not the bounded wait"


@needs_two_ranks
def test_a_latecomer_after_the_others_gave_up_keeps_as_they_do(dist_group, monkeypatch, caplog):
    monkeypatch.setenv(TIMEOUT_ENV, WAIT_S)
    late = rank() == _last()
    with caplog.at_level("WARNING", logger="goddp"):
        ddp, (decision,), grads, group = _run(_statement, before=lambda: time.sleep(4) if late else None)
    assert decision.action == KEEP and state_of(ddp).aligned_caps is None
    _assert_trained_alike(grads, group)
    if late:
        assert "stopped waiting before this rank had seen every rank's statement" in decision.reason, decision.reason
        assert "after the others had stopped waiting for it (gave up: rank " in caplog.text, caplog.text
    else:
        assert f"rank(s) [{_last()}] did not come to the agreement within the bounded wait" in decision.reason


@needs_two_ranks
def test_every_rank_enters_and_leaves_a_trace(dist_group):
    group = short_timeout_group(GROUP_TIMEOUT_S)
    torch.manual_seed(0)
    ddp = DDP(SquareStack(WIDTH, DEPTH), process_group=group)
    with goddp.trace(ddp, timeout=30) as tr:
        ddp(torch.randn(4, WIDTH)).sum().backward()
    records = tr.to_dict(gather=True)["ranks"]
    assert sorted(records) == [str(r) for r in range(dist.get_world_size())]
    assert all(len(r["steps"]) == 1 for r in records.values())



@pytest.mark.single_process
@pytest.mark.parametrize("nproc", [2, 4])
def test_rounds_under_torchrun(nproc):
    """Plain pytest: run this file's cases under torchrun, 2 ranks and 4."""
    assert_file_passes_under_torchrun(__file__, timeout=300, nproc=nproc)
