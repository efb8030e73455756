"""Two-rank training with goddp gives eager DDP's numbers.

Inside each rank (pytest under torchrun, 2 ranks, gloo, CPU) a zoo model is
trained for a few SGD-with-momentum steps twice, from the same initial
weights and with the same per-rank batches (different on each rank): once
as eager DDP, once as DDP compiled with the goddp backend. The losses of
every step, the final parameters and the buffers must be equal: bitwise
with the aot_eager inner compiler (it runs the very aten kernels eager
runs), within float tolerance with Inductor (it fuses and reorders).

Each run also checks that goddp really cut the graph (more than one piece,
buckets planned) and that the inner compiler was really called once per
distinct piece (identical blocks share one compile).

A plain pytest run launches the same file under torchrun itself (see
test_numerics_under_torchrun).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import goddp
from _dist_util import assert_file_passes_under_torchrun, needs_two_ranks, rank
from models import ZOO

STEPS = 4
LR, MOMENTUM = 0.05, 0.9

# (model, goddp mode, inner compiler): every model in both modes with
# aot_eager; Inductor on a few (its CPU compiles are slow).
CASES = [(name, mode, "aot_eager") for name in ("mlp", "transformer", "tied", "conv_bn", "blocks") for mode in ("ddp", "torch")]
CASES += [("mlp", "ddp", "inductor"), ("transformer", "torch", "inductor"), ("blocks", "ddp", "inductor")]


def train(ddp_model, entry, forward, steps=STEPS):
    """Run `steps` optimizer steps; returns the loss of each step."""
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = entry.loss(forward(*entry.make_inputs(100 * rank() + step)))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    return losses


def goddp_options(mode, inner):
    # strict: a planning or piece-compile failure must fail the test, not
    # silently fall back to the whole graph
    return {"inner": inner, "mode": mode, "strict": True, "log_plan": False}


@needs_two_ranks
@pytest.mark.parametrize(("name", "mode", "inner"), CASES, ids=[f"{n}-{m}-{i}" for n, m, i in CASES])
def test_goddp_training_equals_eager_ddp(group, name, mode, inner):
    entry = ZOO[name]
    if inner == "inductor":
        pytest.importorskip("torch._inductor")

    eager = entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=entry.ddp_cap_mb)
    eager_losses = train(eager, entry, eager)

    torch._dynamo.reset()
    goddp.clear_plans()
    compiles_before = counters["aot_autograd"]["total"]
    compiled_ddp = entry.wrap(entry.build(seed=0), process_group=group, bucket_cap_mb=entry.ddp_cap_mb)
    compiled = torch.compile(compiled_ddp, backend="goddp", options=goddp_options(mode, inner))
    goddp_losses = train(compiled_ddp, entry, compiled)

    plans = goddp.last_plans()
    assert plans, "goddp planned nothing: the backend was not used"
    assert all(p["mode"] == mode for p in plans)
    pieces = sum(p["num_pieces"] for p in plans)
    assert max(p["num_pieces"] for p in plans) > 1, f"goddp did not split: {plans}"
    # each distinct piece but the eager edges went through AOTAutograd
    # (aot_eager and Inductor both use it) exactly once; identical pieces
    # share it
    distinct = sum(p["distinct_pieces"] - p["eager_pieces"] for p in plans)
    assert counters["aot_autograd"]["total"] - compiles_before == distinct
    if name == "blocks" and mode == "ddp":
        assert distinct < pieces, "the transformer stack's identical blocks were compiled more than once"
        assert sum(p["eager_pieces"] for p in plans) == 1, "the head (an edge) should run eagerly"

    exact = inner == "aot_eager"

    def same(a, b):
        return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-4, atol=1e-5)

    assert len(goddp_losses) == len(eager_losses) == STEPS
    for step, (got, want) in enumerate(zip(goddp_losses, eager_losses)):
        assert same(got, want), f"step {step}: loss {got.item()!r} != eager DDP {want.item()!r}"
    want_state = eager.module.state_dict()
    for key, got in compiled_ddp.module.state_dict().items():
        assert same(got, want_state[key]), f"{key} differs from eager DDP after {STEPS} steps"
    torch._dynamo.reset()


@pytest.mark.single_process
def test_numerics_under_torchrun():
    """Plain pytest: run this file's two-rank cases under torchrun."""
    assert_file_passes_under_torchrun(__file__, timeout=540)
