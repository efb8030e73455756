"""Training inside DDP's Join context (uneven inputs) under goddp (Note
[Meeting under Join] in goddp.ranks.join).

Inside each rank (pytest under torchrun, gloo, CPU; 2 ranks, and 4), the
bench's kind of model (a stack of transformer blocks) trains with the whole
loop inside ``with Join([ddp]):``, each rank with its own number of batches,
with goddp (aot_eager) and as eager DDP under Join with the same batches:
losses, gradients and the final weights equal (bitwise on 2 ranks). The ranks meet at
the second training call (every rank runs it) and align; a rank that joins
later shadows the aligned buckets (DDP's buckets are the plan's on every
rank). Where a rank joins before the ranks could meet (one batch, or none),
no rank waits: DDP's buckets stay inside Join and the ranks align at the
first training call after it that every rank said it runs (DDP keeps its
Join allreduce after the context ends). find_unused_parameters=True too.
A forward split by a graph break holds its second round the same way: at
the third call where every rank runs it, else after Join, with no rank
waiting, also where its first round came before Join.
A plain pytest run launches this file under torchrun itself, with 2 ranks
and with 4.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join

import goddp
from goddp.ddp import private
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks, rank, short_timeout_group
from models import ZOO

ENTRY = ZOO["blocks"]
OPTIONS = {"inner": "aot_eager", "strict": True, "log_plan": False}
GROUP_TIMEOUT_S = 120.0
CHECK = "_check_global_requires_backward_grad_sync"


@pytest.fixture(scope="module")
def group(dist_group):
    return short_timeout_group(GROUP_TIMEOUT_S)


def _ddp(group, entry=ENTRY, cap_mb=None, **kwargs):
    cap_mb = entry.ddp_cap_mb if cap_mb is None else cap_mb
    return entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=cap_mb, **kwargs)


def _batches(count: int, first: int = 0, entry=ENTRY):
    return [entry.make_inputs(100 * rank() + step) for step in range(first, first + count)]


def _train(ddp, forward, batches, join=True, entry=ENTRY, **join_kwargs):
    """SGD with momentum over batches (inside Join([ddp]) when join): the
    losses, the gradients after each backward, and the weights after."""
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], []

    def loop():
        for inputs in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = entry.loss(forward(*inputs))
            loss.backward()
            grads.append([p.grad.clone() for p in ddp.parameters()])
            optimizer.step()
            losses.append(loss.detach().clone())

    if join:
        with Join([ddp], **join_kwargs):
            loop()
    else:
        loop()
    return losses, grads, [p.detach().clone() for p in ddp.parameters()]


def _compiled(ddp):
    return torch.compile(ddp, backend="goddp", options=OPTIONS)


def _assert_bitwise(got, want, what):
    """Bitwise on 2 ranks; on more, gloo sums a bucket in chunks whose
    bounds move with the buckets, so the order of a sum (its last bits)
    does too."""
    same = torch.equal if dist.get_world_size() == 2 else (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-7))
    assert len(got) == len(want), what
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g if isinstance(g, list) else [g], w if isinstance(w, list) else [w])):
            assert same(a, b), f"{what}, step {step}, tensor {i}: max diff {(a - b).abs().max().item()}"


def _assert_same(got, want):
    """(losses, gradients, weights) of _train, bitwise."""
    for g, w, what in zip(got, want, ("loss", "gradient", "final weight")):
        _assert_bitwise(g if what != "final weight" else [g], w if what != "final weight" else [w], what)


def _ddp_bucket_sizes(ddp) -> list[int]:
    """The bytes of DDP's buckets now, in the reducer's order (DDP's
    logging data says a rebuild one forward late)."""
    parameters = private.ddp_parameters(ddp)
    return [sum(parameters[i].numel() * parameters[i].element_size() for i in b) for b in private.current_buckets(ddp)]


def _decided_plan() -> dict:
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans, goddp.last_plans()
    return plans[0]


def _assert_aligned(ddp, declaration=False) -> None:
    """Aligned on this rank, and DDP's buckets equal on every rank."""
    plan = _decided_plan()
    assert plan["fallback"] is None and plan["num_pieces"] > 2, plan
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["plan_check"]["size"] == dist.get_world_size()
    want = plan["ddp_caps"][::-1] if declaration else [b["bytes"] for b in plan["buckets"]]
    assert _ddp_bucket_sizes(ddp) == want
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, _ddp_bucket_sizes(ddp))
    assert all(s == sizes[0] for s in sizes), sizes
    assert CHECK not in vars(ddp), "DDP's own Join allreduce is back once decided"


# --------------------------------------------------------------------------
# The whole loop inside Join


@needs_two_ranks
@pytest.mark.parametrize("divide_by_initial_world_size", [True, False], ids=["initial", "effective"])
def test_the_whole_loop_inside_join_aligns_and_trains_as_eager_ddp(group, divide_by_initial_world_size):
    """Rank r has 5 - r batches (rank 1 and up join before the last step;
    with 4 ranks rank 3 joins at the step where DDP rebuilds its buckets to
    goddp's caps, and rebuilds in its shadow alike)."""
    fresh()
    batches = _batches(5 - rank())
    eager = _ddp(group)
    want = _train(eager, eager, batches, divide_by_initial_world_size=divide_by_initial_world_size)
    ddp = _ddp(group)
    got = _train(ddp, _compiled(ddp), batches, divide_by_initial_world_size=divide_by_initial_world_size)
    _assert_aligned(ddp)
    assert _ddp_bucket_sizes(ddp) != _ddp_bucket_sizes(eager), "the case must move DDP's buckets"
    _assert_same(got, want)
    fresh()


@needs_two_ranks
def test_join_with_find_unused_parameters_aligns_in_declaration_order(group):
    fresh()
    batches = _batches(5 - rank())
    eager = _ddp(group, find_unused_parameters=True)
    want = _train(eager, eager, batches)
    ddp = _ddp(group, find_unused_parameters=True)
    got = _train(ddp, _compiled(ddp), batches)
    assert _decided_plan()["alignment"].startswith("declaration-order caps")
    _assert_aligned(ddp, declaration=True)
    _assert_same(got, want)
    fresh()


# --------------------------------------------------------------------------
# A rank that joins before the ranks could meet


@needs_two_ranks
@pytest.mark.parametrize("last_rank_batches", [1, 0], ids=["one_batch", "no_batch"])
def test_a_rank_that_joins_before_the_ranks_meet_makes_nobody_wait(group, last_rank_batches):
    """The last rank has one batch (it joins at the second step) or none
    (goddp never sees the module there inside Join): no training call inside
    Join is one every rank runs, so no rank waits and DDP's buckets stay;
    after Join every rank runs each step and the ranks align."""
    fresh()
    last = rank() == dist.get_world_size() - 1
    inside = _batches(last_rank_batches if last else 4)
    after = _batches(3, first=10)
    eager = _ddp(group)
    want = _train(eager, eager, inside)
    want_after = _train(eager, eager, after, join=False)
    ddp = _ddp(group)
    compiled = _compiled(ddp)
    reducer = ddp.reducer
    started = time.monotonic()
    got = _train(ddp, compiled, inside)
    waited = time.monotonic() - started
    assert waited < GROUP_TIMEOUT_S / 4, f"the loop inside Join took {waited:.0f} s: some rank waited"
    assert ddp.reducer is reducer, "no rank may rebuild inside Join before the ranks met"
    assert all(p["plan_check"] is None for p in goddp.last_plans()), goddp.last_plans()
    _assert_same(got, want)
    got_after = _train(ddp, compiled, after, join=False)
    _assert_aligned(ddp)
    _assert_same(got_after, want_after)
    fresh()


# --------------------------------------------------------------------------
# A forward split over two graphs: its second round waits for a call every
# rank runs too

SPLIT = ZOO["graph_break"]
SPLIT_CAP_MB = 0.4  # two layers a bucket: DDP's own straddle the break


def _assert_split_aligned(ddp) -> None:
    """Both graphs' plans aligned with the combined layout, DDP's buckets
    that layout's on every rank, and DDP's own Join allreduce back."""
    from goddp.ranks.agreement import decided

    together = [p for p in goddp.last_plans() if p["forward"] is not None]
    assert len(together) == 2, goddp.last_plans()
    assert all(p["ddp_buckets"] == {"aligned": True, "reason": None} for p in together), together
    assert _ddp_bucket_sizes(ddp) == list(decided(ddp).layout.caps)
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, _ddp_bucket_sizes(ddp))
    assert all(s == sizes[0] for s in sizes), sizes
    assert CHECK not in vars(ddp), "DDP's own Join allreduce is back once decided"


@needs_two_ranks
def test_a_split_forward_inside_join_aligns_at_a_call_every_rank_runs(group):
    """Rank 0 has 4 batches, the others 3: the ranks meet at the second
    call (each rank's graphs so far hold part of DDP's parameters: LATER)
    and hold the second round at the third, which every rank runs; rank 0's
    fourth step runs alone, the others shadowing the aligned buckets."""
    fresh()
    batches = _batches(3 + (rank() == 0), entry=SPLIT)
    eager = _ddp(group, SPLIT, SPLIT_CAP_MB)
    want = _train(eager, eager, batches, entry=SPLIT)
    ddp = _ddp(group, SPLIT, SPLIT_CAP_MB)
    got = _train(ddp, _compiled(ddp), batches, entry=SPLIT)
    _assert_split_aligned(ddp)
    assert _ddp_bucket_sizes(ddp) != _ddp_bucket_sizes(eager), "the case must move DDP's buckets"
    _assert_same(got, want)
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("first_outside", [False, True], ids=["first-round-inside", "first-round-before-join"])
def test_a_split_forwards_second_round_waits_for_no_joined_rank(group, first_outside):
    """The last rank joins before the second round could be held: it has 2
    batches inside Join after the first round there, or none after a first
    round held before Join. No rank waits inside Join and no rank rebuilds
    there; after Join every rank runs each step and the ranks align."""
    fresh()
    last = rank() == dist.get_world_size() - 1
    before = _batches(1, first=20, entry=SPLIT) if first_outside else []
    inside = _batches((0 if first_outside else 2) if last else 4, entry=SPLIT)
    after = _batches(3, first=10, entry=SPLIT)
    eager = _ddp(group, SPLIT, SPLIT_CAP_MB)
    want = [_train(eager, eager, before, join=False, entry=SPLIT), _train(eager, eager, inside, entry=SPLIT),
            _train(eager, eager, after, join=False, entry=SPLIT)]
    ddp = _ddp(group, SPLIT, SPLIT_CAP_MB)
    compiled = _compiled(ddp)
    got = [_train(ddp, compiled, before, join=False, entry=SPLIT)]
    reducer = ddp.reducer
    started = time.monotonic()
    got.append(_train(ddp, compiled, inside, entry=SPLIT))
    waited = time.monotonic() - started
    from goddp.ranks.agreement import decided
    from goddp.ranks.verdict import LATER

    assert decided(ddp).action == LATER, "the first round was held, the second waits for after Join"
    assert waited < GROUP_TIMEOUT_S / 4, f"the loop inside Join took {waited:.0f} s: some rank waited"
    assert ddp.reducer is reducer, "no rank may rebuild inside Join before the second round"
    got.append(_train(ddp, compiled, after, join=False, entry=SPLIT))
    _assert_split_aligned(ddp)
    for g, w in zip(got, want):
        _assert_same(g, w)
    fresh()


@pytest.mark.single_process
@pytest.mark.parametrize("nproc", [2, 4])
def test_join_under_torchrun(nproc):
    """Plain pytest: run this file's cases under torchrun, 2 ranks and 4."""
    assert_file_passes_under_torchrun(__file__, timeout=600, nproc=nproc)
