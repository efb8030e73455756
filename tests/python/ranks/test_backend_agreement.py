"""goddp.ranks.agreement.agree as a later caller uses it (goddp issue 17: the
graphs of one forward planned together): a first agreement that defers
(LATER), then the module's next training call decides for good and DDP's
buckets follow (Note [Agreeing on DDP's layout]). One rank: the mechanism,
not the exchange (the 2-rank suites cover that)."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from goddp.ddp.state import state_of
from goddp.ranks import agreement as _agreement
from goddp.ranks.layout import layout_of
from goddp.ranks.verdict import INSTALL, LATER, Statement
from models import SquareStack

WIDTH, DEPTH = 128, 6
PER_LAYER = (WIDTH * WIDTH + WIDTH) * 4


def _rebuilt_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets"), data
    return [int(x) for x in data["rebuilt_bucket_sizes"].split(", ")]


def _train(ddp, steps=4):
    grads = []
    for step in range(steps):
        ddp.zero_grad(set_to_none=True)
        ddp(torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(step))).square().sum().backward()
        grads.append([p.grad.clone() for p in ddp.parameters()])
    return grads


def test_a_deferred_agreement_installs_at_the_next_training_call(dist_group):
    torch.manual_seed(0)
    eager = DDP(SquareStack(WIDTH, DEPTH), bucket_cap_mb=0.25)
    torch.manual_seed(0)
    model = SquareStack(WIDTH, DEPTH)
    ddp = DDP(model, bucket_cap_mb=0.25)
    # three buckets of two layers each, last layers first (gradient-ready order)
    names = [[f"layers.{k}.bias", f"layers.{k}.weight"] for k in reversed(range(DEPTH))]
    buckets = [names[0] + names[1], names[2] + names[3], names[4] + names[5]]
    positions = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    layout = layout_of(buckets, [2 * PER_LAYER] * 3, "ready", positions)
    reports = []

    def report(plan_check, ddp_buckets):
        reports.append((plan_check["action"], ddp_buckets["aligned"]))

    def at_training_call(module, args):
        if not torch.is_grad_enabled():
            return
        if _agreement.decided(ddp) is None:
            _agreement.agree(ddp, Statement(layout=None, later=True), report)
        elif _agreement.round_due(ddp):
            _agreement.agree(ddp, Statement(layout=layout, digest=layout.digest()), report, may_defer=False)

    model.register_forward_pre_hook(at_training_call)
    got, want = _train(ddp), _train(eager)
    assert reports == [(LATER, False), (INSTALL, True)]
    assert not _agreement.round_due(ddp)
    assert state_of(ddp).aligned_caps == layout.caps
    assert _rebuilt_sizes(ddp) == list(layout.caps)
    for step, (g, w) in enumerate(zip(got, want)):
        assert all(torch.equal(a, b) for a, b in zip(g, w)), f"step {step}: gradients differ from eager DDP"


def test_a_planner_error_combining_a_forward_is_a_statement_without_a_layout(monkeypatch):
    """A rank whose planner call fails must still bring a statement to the
    round the other ranks hold (Note [Graphs of one forward]): no layout,
    and why, so that every rank keeps DDP's buckets alike."""
    from goddp.ranks import forward as _forward
    from goddp.ranks.layout import Layout

    def broken(*arrays):
        raise RuntimeError("goddp planner: panic in CombineForward")

    monkeypatch.setattr(_forward._native, "combine_forward", broken)
    layout = Layout(((0,),), (4,), "ready", "b")
    members = [_forward.Member(layout, None, f"graph {k}", lambda *a: None, lambda info: None) for k in range(2)]
    combined = _forward.combine(members, [torch.empty(4, dtype=torch.uint8)] * 2)
    assert combined.layout is None and combined.digest is None
    assert "could not combine the forward's layouts (RuntimeError: goddp planner: panic" in combined.reason
    assert combined.info == {"graphs": ["graph 0", "graph 1"]}
    assert combined.note == f"goddp: {combined.reason}"
