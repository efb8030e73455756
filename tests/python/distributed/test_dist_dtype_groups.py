"""Parameters of several (dtype, device) groups: DDP's buckets close at
the cuts in every group, and such models train as eager DDP does.

DDP buckets each (dtype, device) group apart, and walks the one list of
per-bucket caps anew for each group: bucket j of every group is closed
against cap j (``_compute_bucket_assignment_by_size`` in torch's
reducer.cpp, which DDP's first bucketing and its rebuild both call). The
first case checks that rule, which the planner's Note [Several dtype
groups] (planner/keys.go) plans by, against the function itself
(``dist._compute_bucket_assignment_by_size``) on random parameters. The
second shows what it means for the bench's kind of model with one block in
bf16: no cap closes both the bf16 block's bucket and the float32 group's
first one at a cut, so the plan leaves the bf16 bucket open (DDP launches
it last, still holding that block's gradients alone). The two-rank cases
(pytest under torchrun, gloo, CPU; a plain pytest run launches this file
under torchrun itself) train models with a block, the first block or the
head in bf16 or fp16, and a bf16 model with fp32 norms in every block:
cut, DDP's buckets closing where the plan says, rebuilt equal to the plan's on
both ranks, bitwise equal to eager DDP (aot_eager), also when rank 0 first
evaluates another batch size, and with static_graph or a built-in hook on
bucket views; a wide bf16 head, whose per-group caps would launch later
than DDP's own buckets, keeps DDP's buckets, with the reason. Under
find_unused_parameters=True (DDP keeps the buckets it fills in
declaration order, sorted by first parameter: the third case checks that
rule against torch) the same models are aligned per group as well, but
for the fp32 norms, where DDP's own buckets launch earlier.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from _dist_util import assert_file_passes_under_torchrun, fresh, needs_two_ranks, rank
from models import TransformerStack

HALF = 1  # the block in bf16
OPTIONS = {"inner": "aot_eager", "strict": True, "log_plan": False}
CAP_MB = 0.125
STEPS = 3
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------
# DDP's rule, read from the function it calls


def walk_per_group(sizes, dtypes, caps, order):
    """The rule as goddp reads it: gradients in `order`, each (dtype) group
    fills its own bucket and closes it when its bytes reach the group's
    current cap; each group starts at caps[0] and moves to the next cap
    (staying at the last) after each bucket it closes. Returns the closed
    buckets in the order they closed, each with its cap, and the groups'
    unclosed buckets."""
    position: dict[torch.dtype, int] = {}
    open_: dict[torch.dtype, tuple[list[int], int]] = {}
    closed = []
    for i in order:
        key = dtypes[i]
        indices, size = open_.get(key, ([], 0))
        indices, size = indices + [i], size + sizes[i]
        cap = caps[position.get(key, 0)]
        if size >= cap:
            closed.append((indices, cap))
            position[key] = min(position.get(key, 0) + 1, len(caps) - 1)
            indices, size = [], 0
        open_[key] = (indices, size)
    return closed, [indices for indices, _ in open_.values() if indices]


def random_case(rng: random.Random):
    """1 to 12 tensors of up to 3 dtypes, their byte sizes, and 1 to 4 caps."""
    n = rng.randint(1, 12)
    dtypes = [rng.choice(DTYPES[: rng.randint(1, 3)]) for _ in range(n)]
    tensors = [torch.empty(rng.randint(1, 8), dtype=d) for d in dtypes]
    sizes = [t.numel() * t.element_size() for t in tensors]
    caps = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
    return n, dtypes, tensors, sizes, caps


def test_ddp_walks_its_caps_anew_for_each_dtype_group():
    rng = random.Random(0)
    for case in range(300):
        n, dtypes, tensors, sizes, caps = random_case(rng)
        order = list(range(n))
        rng.shuffle(order)
        # The rebuild: tensors in gradient-ready order, labelled with their
        # indices; buckets come closed-first, in closing order, the groups'
        # unclosed buckets after them (in no order goddp can know).
        got, limits = dist._compute_bucket_assignment_by_size(
            [tensors[i] for i in order], caps, [False] * n, order)
        closed, rest = walk_per_group(sizes, dtypes, caps, order)
        what = f"case {case}: sizes {sizes}, dtypes {dtypes}, caps {caps}, order {order}"
        assert got[: len(closed)] == [b for b, _ in closed], what
        assert limits[: len(closed)] == [c for _, c in closed], what
        assert sorted(got[len(closed):]) == sorted(rest), what


def test_ddp_lists_its_first_buckets_by_first_parameter():
    """DDP's first bucketing (no gradient-ready order: under
    find_unused_parameters=True the only one): the same walk per group in
    declaration order, the buckets of every group then listed by their
    first parameter (DDP reverses that list). Note [Declaration order per
    group] in planner/declorder.go plans by it."""
    rng = random.Random(1)
    for case in range(300):
        n, dtypes, tensors, sizes, caps = random_case(rng)
        got, _ = dist._compute_bucket_assignment_by_size(tensors, caps, [False] * n)
        closed, rest = walk_per_group(sizes, dtypes, caps, range(n))
        want = sorted([b for b, _ in closed] + rest, key=lambda b: b[0])
        assert got == want, f"case {case}: sizes {sizes}, dtypes {dtypes}, caps {caps}"


def _half_stack(seed: int = 0, part=HALF, dtype=torch.bfloat16) -> nn.Module:
    torch.manual_seed(seed)
    return HalfBlockStack(part, dtype)


class HalfBlockStack(nn.Module):
    """The bench's kind of model (TransformerStack: blocks and a head) with
    one part (a block's index, or "head") in another dtype: parameters of
    two dtypes."""

    def __init__(self, part=HALF, dtype=torch.bfloat16) -> None:
        super().__init__()
        self.part, self.dtype = part, dtype
        self.stack = TransformerStack()
        (self.stack.head if part == "head" else self.stack.blocks[part]).to(dtype)

    def forward(self, x):
        for i, block in enumerate(self.stack.blocks):
            x = block(x.to(self.dtype)).float() if i == self.part else block(x)
        if self.part == "head":
            return self.stack.head(x.to(self.dtype)).float()
        return self.stack.head(x)


def test_no_caps_close_both_groups_of_a_bf16_block_at_the_cuts():
    """The pieces at the blocks (gradients ready last block first): the
    bf16 group's one bucket (block HALF) is closed against cap 0, as is the
    float32 group's first bucket (the head and the blocks after HALF, or
    more with cuts merged). A bucket closes at its piece's last gradient,
    whatever the order inside the piece, only if its cap lies in (total -
    smallest gradient, total]: the bf16 interval meets no float32 one, so
    the plan leaves the bf16 bucket open (the two-rank cases below)."""
    model = _half_stack()
    blocks = model.stack.blocks
    ready = [list(model.stack.head.parameters())] + [list(blocks[i].parameters()) for i in reversed(range(len(blocks)))]
    pieces = [ready[0] + ready[1]] + ready[2:]  # the head goes with the last block

    def interval(params):
        sizes = [p.numel() * p.element_size() for p in params]
        return sum(sizes) - min(sizes), sum(sizes)

    bf16 = interval([p for piece in pieces for p in piece if p.dtype == torch.bfloat16])
    float32 = [p for piece in pieces for p in piece if p.dtype == torch.float32]
    boundaries = []  # each float32 prefix that ends at a piece boundary (cuts merged or not)
    for k in range(1, len(pieces) + 1):
        prefix = [p for piece in pieces[:k] for p in piece if p.dtype == torch.float32]
        if prefix and (not boundaries or len(prefix) > boundaries[-1][0]):
            boundaries.append((len(prefix), interval(prefix)))
    assert boundaries and all(hi <= bf16[0] or lo >= bf16[1] for _, (lo, hi) in boundaries), (bf16, boundaries)

    # What DDP's rule (test above) makes of the two choices: with cap 0 at
    # the end of the float32 group's first piece, the bf16 bucket never
    # closes (DDP puts it after every closed bucket: it launches at the end
    # of backward); at the end of the bf16 block, the float32 group's first
    # bucket closes inside its piece. Neither closes that bucket at a cut.
    order = [p for piece in pieces for p in piece]
    sizes = [p.numel() * p.element_size() for p in order]
    dtypes = [p.dtype for p in order]
    first_f32 = [i for i, p in enumerate(order) if p.dtype == torch.float32][: len(
        [p for p in pieces[0] if p.dtype == torch.float32])]
    half = [i for i, p in enumerate(order) if p.dtype == torch.bfloat16]
    for cap0, missed in ((boundaries[0][1][1], half), (bf16[1], first_f32)):
        closed, _ = walk_per_group(sizes, dtypes, [cap0, 1 << 40], range(len(order)))
        assert closed and all(b != missed for b, _ in closed), (cap0, closed)


# --------------------------------------------------------------------------
# Two ranks: aligned per group, and trains as eager DDP

class Float32Norm(nn.Module):
    """A LayerNorm kept in float32 inside a bf16 model."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x.float()).to(x.dtype)


class Bf16WithFloat32Norms(nn.Module):
    """The usual recipe: weights in bf16, norms in float32: every block
    holds both groups."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = TransformerStack().to(torch.bfloat16)
        for block in self.stack.blocks:
            block.norm1, block.norm2 = Float32Norm(64), Float32Norm(64)

    def forward(self, x):
        return self.stack(x.to(torch.bfloat16)).float()


class WideBf16Head(nn.Module):
    """float32 blocks and a wide bf16 head with a bias (520 KiB, the blocks
    about 200 KiB each): the head's bucket closes only against a cap near
    its own bytes, which no run of blocks meets."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = TransformerStack()
        self.stack.head = nn.Linear(64, 4096).to(torch.bfloat16)

    def forward(self, x):
        for block in self.stack.blocks:
            x = block(x)
        return self.stack.head(x.to(torch.bfloat16)).float()


def _build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "fp32-norms":
        return Bf16WithFloat32Norms()
    if kind == "wide-bf16-head":
        return WideBf16Head()
    return HalfBlockStack(*MODELS[kind])


MODELS = {
    "bf16-block": (HALF, torch.bfloat16),
    "fp16-first-block": (0, torch.float16),
    "bf16-head": ("head", torch.bfloat16),
    "fp32-norms": (None, torch.bfloat16),
}


def _train(group, compiled: bool, evaluate_first: bool, model_kind="bf16-block", hook=None, **ddp_kwargs):
    fresh()
    model = _build(model_kind)
    ddp = DDP(model, process_group=group, bucket_cap_mb=CAP_MB, **ddp_kwargs)
    if hook is not None:
        ddp._register_builtin_comm_hook(hook)
    forward = torch.compile(ddp, backend="goddp", options=OPTIONS) if compiled else ddp
    if evaluate_first and rank() == 0:
        model.eval()
        with torch.no_grad():
            forward(torch.randn(5, 8, 64, generator=torch.Generator().manual_seed(7)))
        model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(100 * rank() + step))
        loss = forward(x).pow(2).mean()
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        losses.append(loss.detach().clone())
    return ddp, model, losses, grads


def _ddp_buckets(ddp, model) -> list[frozenset[str]]:
    """DDP's buckets now, each as the set of its parameters' names."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [frozenset(names[id(p)] for p in b.parameters()) for b in ddp.reducer._get_zeros_like_grad_buckets()]


def _assert_same_training(got, want) -> None:
    (_, model, losses, grads), (_, eager_model, eager_losses, eager_grads) = got, want
    for step, (g, w) in enumerate(zip(losses, eager_losses)):
        assert torch.equal(g, w), f"loss, step {step}"
    for step, (g, w) in enumerate(zip(grads, eager_grads)):
        for i, (a, b) in enumerate(zip(g, w)):
            assert a.dtype == b.dtype and torch.equal(a, b), f"step {step}, parameter {i}"
    for (name, w), g in zip(eager_model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(g, w), f"{name} differs from eager DDP"


@needs_two_ranks
@pytest.mark.parametrize("evaluate_first", [False, True], ids=["same", "rank0-evaluates-first"])
@pytest.mark.parametrize("model_kind", list(MODELS))
def test_two_dtypes_are_cut_aligned_per_group_and_train_as_eager_ddp(group, model_kind, evaluate_first):
    want = _train(group, False, evaluate_first, model_kind)
    got = _train(group, True, evaluate_first, model_kind)
    ddp, model = got[0], got[1]
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans, goddp.last_plans()
    plan = plans[0]
    assert plan["fallback"] is None and plan["num_pieces"] > 2, plan
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["alignment"] == "ready-order caps per dtype group"
    # Where a bucket closes: at every block's end but the bf16 block's,
    # whose bucket no cap closes with the float32 group's first (above).
    assert plan["merged_cuts"] == (1 if model_kind == "bf16-block" else 0), plan
    if model_kind == "fp32-norms":
        # The norms' one bucket stays open; the bf16 weights close a bucket
        # per block (and the head with the last).
        *weights, norms = plan["buckets"]
        assert all(".norm" in n for n in norms["param_names"]) and len(norms["param_names"]) == 12
        assert len(weights) == 3 and not any(".norm" in n for b in weights for n in b["param_names"])
    planned = sorted(sorted(b["param_names"]) for b in plan["buckets"])
    # DDP rebuilt its buckets to the plan's caps: the same sets, in every
    # group, on both ranks (the order among one piece's buckets is DDP's).
    buckets = _ddp_buckets(ddp, model)
    assert sorted(sorted(b) for b in buckets) == planned, (buckets, planned)
    assert {next(iter(model.get_parameter(n) for n in b)).dtype for b in buckets} == {torch.float32, MODELS[model_kind][1]}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(sorted(b) for b in buckets))
    assert all(b == everyone[0] for b in everyone), everyone
    _assert_same_training(got, want)
    fresh()


@needs_two_ranks
@pytest.mark.parametrize(
    "setting",
    [{"static_graph": True}, {"hook": dist.BuiltinCommHookType.FP16_COMPRESS, "gradient_as_bucket_view": True}],
    ids=["static-graph", "fp16-hook-bucket-view"],
)
@pytest.mark.parametrize("model_kind", ["bf16-block", "fp32-norms"])
def test_two_dtypes_with_other_ddp_settings(group, model_kind, setting):
    """The groups' caps with DDP's other settings: static_graph (DDP records
    its first iteration, then rebuilds to the caps) and a built-in hook with
    bucket views (registered again on the rebuilt reducer)."""
    want = _train(group, False, True, model_kind, **setting)
    got = _train(group, True, True, model_kind, **setting)
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["alignment"] == "ready-order caps per dtype group"
    buckets = _ddp_buckets(got[0], got[1])
    assert sorted(sorted(b) for b in buckets) == sorted(sorted(b["param_names"]) for b in plan["buckets"])
    _assert_same_training(got, want)
    fresh()


@needs_two_ranks
def test_per_group_caps_that_would_launch_later_keep_ddps_buckets(group):
    """The wide bf16 head: caps that close every group's buckets at the cuts
    would leave the head's bucket open and stretch the float32 group's
    first over every block; DDP's own buckets launch earlier, so goddp keeps
    them, says why, and trains as eager DDP."""
    want = _train(group, False, False, "wide-bf16-head")
    got = _train(group, True, False, "wide-bf16-head")
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["fallback"] is None and plan["num_pieces"] > 2, plan
    assert plan["ddp_buckets"]["aligned"] is False
    assert "would launch them later than DDP's own buckets" in plan["ddp_buckets"]["reason"], plan["ddp_buckets"]
    assert plan["alignment"] == "none"
    _assert_same_training(got, want)
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("evaluate_first", [False, True], ids=["same", "rank0-evaluates-first"])
@pytest.mark.parametrize("model_kind", list(MODELS))
def test_two_dtypes_under_find_unused_parameters_are_aligned_per_group(group, model_kind, evaluate_first):
    """DDP fills its buckets in declaration order there, each group apart,
    and never rebuilds: goddp gives it caps for that order, cap j every
    group's j-th bucket's (Note [Declaration order per group]). DDP's
    buckets are the plan's, in the plan's order, on both ranks, and
    training is eager DDP's with the same setting. fp32 norms in every bf16
    block are the exception: declaration order is cut by bytes, not at the
    blocks, and merges to 3 pieces, while DDP's own 128 KiB buckets launch
    about a block each on the block cuts, so goddp keeps DDP's buckets
    (the guard of Decide), says why, and trains as eager DDP."""
    want = _train(group, False, evaluate_first, model_kind, find_unused_parameters=True)
    got = _train(group, True, evaluate_first, model_kind, find_unused_parameters=True)
    ddp, model = got[0], got[1]
    plans = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plans, goddp.last_plans()
    plan = plans[0]
    assert plan["fallback"] is None and plan["num_pieces"] > 1, plan
    if model_kind == "fp32-norms":
        assert plan["ddp_buckets"]["aligned"] is False
        assert "would launch them later than DDP's own buckets" in plan["ddp_buckets"]["reason"], plan["ddp_buckets"]
        assert plan["alignment"] == "none"
        assert _ddp_buckets(ddp, model) == _ddp_buckets(want[0], want[1]), "DDP's own buckets"
        _assert_same_training(got, want)
        fresh()
        return
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["alignment"] == "declaration-order caps per dtype group"
    assert len(plan["ddp_caps"]) < len(plan["buckets"])
    # DDP keeps the buckets it filled with the caps: the plan's, in order.
    buckets = _ddp_buckets(ddp, model)
    assert buckets == [frozenset(b["param_names"]) for b in plan["buckets"]], (buckets, plan["buckets"])
    assert {next(iter(model.get_parameter(n) for n in b)).dtype for b in buckets} == {torch.float32, MODELS[model_kind][1]}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [sorted(b) for b in buckets])
    assert all(b == everyone[0] for b in everyone), everyone
    _assert_same_training(got, want)
    fresh()


@needs_two_ranks
@pytest.mark.parametrize("model_kind", ["bf16-block", "bf16-head"])
def test_two_dtypes_under_find_unused_parameters_with_a_builtin_hook(group, model_kind):
    """find_unused_parameters=True with the FP16_COMPRESS built-in hook on
    bucket views: declaration-order caps per group, the hook registered
    again on the rebuilt reducer, bitwise equal to eager DDP with the same
    hook."""
    setting = {"find_unused_parameters": True, "hook": dist.BuiltinCommHookType.FP16_COMPRESS,
               "gradient_as_bucket_view": True}
    want = _train(group, False, True, model_kind, **setting)
    got = _train(group, True, True, model_kind, **setting)
    (plan,) = [p for p in goddp.last_plans() if p["plan_check"] is not None]
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}, plan["ddp_buckets"]
    assert plan["alignment"] == "declaration-order caps per dtype group"
    assert _ddp_buckets(got[0], got[1]) == [frozenset(b["param_names"]) for b in plan["buckets"]]
    _assert_same_training(got, want)
    fresh()


@pytest.mark.single_process
def test_dtype_groups_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=600)
