"""Oracle parity: goddp's "torch" mode cuts each zoo graph exactly where the
installed torch's own DDPOptimizer does.

Each zoo model is wrapped in DDP (1-rank gloo, or the torchrun group) and
compiled with a recording backend while torch._dynamo.config.optimize_ddp is
off, so every Dynamo frame arrives whole. Both planners then run on the same
GraphModule with the same caps: goddp.plan_graph_module(mode="torch") and
torch's DDPOptimizer.compile_fn (see _parity_harness.torch_oracle_plan).
They must agree on the number of pieces, on the piece of every node, on the
parameters each piece counts and on each bucket's byte count.

Two cap settings are checked per model: small explicit caps (several pieces
on every small model) and torch's defaults (25 MiB buckets with
DDPOptimizer's own 1 MiB first bucket).

The first tests check the harness itself against torch, without goddp.
"""

from __future__ import annotations

import collections
from unittest import mock

import pytest
import torch
from torch._dynamo.backends.distributed import DDPOptimizer

import goddp
from _parity_harness import capture_frames, torch_oracle_plan
from models import MIB, ZOO

# torch's DDPOptimizer (and so goddp's torch mode) always uses this first
# bucket cap unless told otherwise.
TORCH_FIRST_CAP = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES

pytestmark = pytest.mark.single_process  # planning only: one process says it all


@pytest.fixture(scope="module", autouse=True)
def _process_group(dist_group):
    """DDP needs a process group: conftest's (1-rank gloo here)."""
    return dist_group


_frames_cache: dict[str, list] = {}


def frames_of(name: str):
    """The captured Dynamo frames of a zoo model (captured once per module)."""
    if name not in _frames_cache:
        entry = ZOO[name]
        ddp = entry.wrap(entry.build())
        frames = capture_frames(ddp, entry.make_inputs(0))
        assert len(frames) == entry.frames, f"{name}: expected {entry.frames} Dynamo frames, got {len(frames)}"
        _frames_cache[name] = frames
    return _frames_cache[name]


# --------------------------------------------------------------------------
# The harness agrees with torch itself


def test_toy_model_splits_into_three_like_torch_says():
    """torch documents that its DDPOptimizer splits the 10-5000-5000-5000-5
    ToyModel into 3 pieces at a 25 MiB cap; the captured-graph oracle must
    reproduce that."""
    (frame,) = frames_of("toy")
    plan = torch_oracle_plan(frame, 25 * MIB, None)
    assert plan.num_pieces == 3
    # forward order: the first Linear alone, the second alone, the third with the output layer
    assert plan.piece_params == [
        ["net.0.weight", "net.0.bias"],
        ["net.2.weight", "net.2.bias"],
        ["net.6.weight", "net.6.bias", "net.4.weight", "net.4.bias"],
    ]


@pytest.mark.parametrize("name", ["mlp", "transformer", "tied", "graph_break"])
def test_harness_oracle_matches_dynamo_own_ddp_optimizer(name):
    """Running DDPOptimizer on a captured graph gives the same pieces as when
    Dynamo runs it itself (optimize_ddp on), for every frame."""
    entry = ZOO[name]
    ddp = entry.wrap(entry.build())  # DDP's default 25 MiB cap
    seen = []
    original = DDPOptimizer.compile_fn

    def recording_compile_fn(self, gm, example_inputs, **kwargs):
        result = original(self, gm, example_inputs, **kwargs)
        seen.append(([sorted(n.name for n in b.nodes) for b in self.buckets], self.bucket_bytes_cap))
        return result

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(optimize_ddp=True), mock.patch.object(
            DDPOptimizer, "compile_fn", recording_compile_fn
        ):
            torch.compile(ddp, backend="eager")(*entry.make_inputs(0))
    finally:
        torch._dynamo.reset()

    frames = frames_of(name)
    assert len(seen) == len(frames)
    for frame, (dynamo_pieces, cap) in zip(frames, seen):
        assert cap == 25 * MIB
        oracle = torch_oracle_plan(frame, cap, None)
        ours = [sorted(n for n, p in oracle.node_pieces.items() if p == i) for i in range(oracle.num_pieces)]
        assert ours == dynamo_pieces


def test_installed_torch_ddp_optimizer_does_not_see_ignored_parameters():
    """A quirk of this torch that goddp's torch mode must reproduce: Dynamo's
    fake copies of parameters lose DDP's `_ddp_ignored` mark, so
    DDPOptimizer counts ignored parameters like any other. The ignored and
    the plain MLP are therefore cut identically."""
    ignored = torch_oracle_plan(frames_of("ignored")[0], ZOO["ignored"].cap_bytes, ZOO["ignored"].first_cap_bytes)
    plain = torch_oracle_plan(frames_of("mlp")[0], ZOO["mlp"].cap_bytes, ZOO["mlp"].first_cap_bytes)
    assert "hidden.2.weight" in [p for piece in ignored.piece_params for p in piece]
    assert ignored.piece_params == plain.piece_params


def test_installed_torch_rejects_ddp_caps_below_its_first_bucket_cap():
    """torch's own path builds DDPOptimizer with DDP's bucket_bytes_cap and a
    fixed 1 MiB first cap, so DDP(bucket_cap_mb < 1) fails to compile there.
    (goddp's ddp mode plans such models: see test_parity_ddp.)"""
    entry = ZOO["mlp"]
    ddp = entry.wrap(entry.build(), bucket_cap_mb=0.25)
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(optimize_ddp=True), pytest.raises(Exception, match="First bucket"):
            torch.compile(ddp, backend="eager")(*entry.make_inputs(0))
    finally:
        torch._dynamo.reset()


# --------------------------------------------------------------------------
# goddp's torch mode against the oracle

CAP_SETTINGS = {
    # small caps chosen per model so that several pieces appear
    "small_caps": lambda entry: (entry.cap_bytes, entry.first_cap_bytes),
    # torch's defaults: 25 MiB buckets, DDPOptimizer's implicit 1 MiB first bucket
    "torch_defaults": lambda entry: (25 * MIB, None),
}

FRAME_CASES = [(name, i) for name, entry in ZOO.items() for i in range(entry.frames)]


def _goddp_piece_params(plan) -> list[collections.Counter]:
    return [collections.Counter(names) for names in plan.piece_param_names()]


@pytest.mark.parametrize("caps", list(CAP_SETTINGS))
@pytest.mark.parametrize(("name", "frame_index"), FRAME_CASES, ids=[f"{n}-frame{i}" for n, i in FRAME_CASES])
def test_torch_mode_cuts_equal_torch_ddp_optimizer(name, frame_index, caps):
    entry = ZOO[name]
    frame = frames_of(name)[frame_index]
    cap, first_cap = CAP_SETTINGS[caps](entry)

    # goddp plans first: the oracle's split must not be able to influence it.
    plan = goddp.plan_graph_module(
        frame.gm,
        mode="torch",
        bucket_cap_bytes=cap,
        first_bucket_cap_bytes=TORCH_FIRST_CAP if first_cap is None else first_cap,
    )
    oracle = torch_oracle_plan(frame, cap, first_cap)

    if caps == "small_caps":
        assert oracle.num_pieces > 1, "caps too large to test anything: fix the zoo entry"
    assert plan.num_pieces == oracle.num_pieces
    # every node torch assigns, goddp assigns to the same piece
    goddp_nodes = {n: plan.node_pieces[n] for n in oracle.node_pieces}
    assert goddp_nodes == oracle.node_pieces
    # the same parameters are counted in each piece (a shared parameter
    # counts in every piece that uses it, as torch counts it)
    assert _goddp_piece_params(plan) == [collections.Counter(p) for p in oracle.piece_params]
    # bucket bytes: goddp lists buckets in DDP order (last piece first)
    assert [b.bytes for b in plan.buckets] == list(reversed(oracle.piece_bytes))
    assert [b.piece for b in plan.buckets] == list(reversed(range(oracle.num_pieces)))


# --------------------------------------------------------------------------
# The same through the backend: goddp reads the caps from the DDP module


def _recorded_torch_pieces(ddp, inputs):
    """Let Dynamo run torch's own DDPOptimizer on ddp's frames and return,
    per frame, its pieces' parameter counts (FQN Counters, forward order)."""
    frames_params = []
    original = DDPOptimizer.compile_fn

    def recording_compile_fn(self, gm, example_inputs, **kwargs):
        from _parity_harness import placeholder_fqns

        fqns = placeholder_fqns(gm, ddp.module)
        by_id = {id(n.meta["example_value"]): fqns[n.name] for n in gm.graph.find_nodes(op="placeholder") if n.name in fqns}
        result = original(self, gm, example_inputs, **kwargs)
        frames_params.append([collections.Counter(by_id[i] for i in b.param_ids) for b in self.buckets])
        return result

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(optimize_ddp=True), mock.patch.object(
            DDPOptimizer, "compile_fn", recording_compile_fn
        ):
            torch.compile(ddp, backend="eager")(*inputs)
    finally:
        torch._dynamo.reset()
    return frames_params


BACKEND_CASES = [
    "mlp",
    "tied",
    "checkpoint",
    "graph_break",
    "conv_bn",
    pytest.param(
        "ignored",
        marks=pytest.mark.xfail(
            strict=True,
            reason="goddp's backend passes DDP's ignored names to torch mode, so it honours them; the "
            "installed torch's DDPOptimizer does not see them (test_installed_torch_ddp_optimizer_"
            "does_not_see_ignored_parameters). Reported to the shim owner.",
        ),
    ),
]


@pytest.mark.parametrize("name", BACKEND_CASES)
def test_backend_torch_mode_matches_dynamo_ddp_optimizer(name):
    """torch.compile(ddp, backend="goddp", mode torch) cuts every frame where
    torch's own DDPOptimizer cuts it when Dynamo runs it on the same DDP
    module. DDP's cap is 2 MiB here (torch's path rejects caps under its
    1 MiB first bucket)."""
    entry = ZOO[name]
    ddp = entry.wrap(entry.build(), bucket_cap_mb=2)
    expected = _recorded_torch_pieces(ddp, entry.make_inputs(0))

    goddp.clear_plans()
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "eager", "mode": "torch", "log_plan": False})
    compiled(*entry.make_inputs(0))
    plans = goddp.last_plans()
    assert [p["mode"] for p in plans] == ["torch"] * entry.frames
    assert max(p["num_pieces"] for p in plans) > 1, "nothing to compare: every frame is one piece"
    got = [[collections.Counter(piece["param_names"]) for piece in p["pieces"]] for p in plans]
    assert got == expected
