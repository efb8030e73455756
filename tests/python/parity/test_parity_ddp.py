"""ddp mode against DDP itself: goddp's "ddp" plan predicts the buckets that
DistributedDataParallel really builds.

For each zoo model, eager DDP runs a few iterations so that its reducer
rebuilds its buckets in gradient-ready order; ddp._get_ddp_logging_data()
then reports them (sizes, and indices into DDP's parameter list, see
_parity_harness.ddp_rebuilt_buckets). goddp.plan_graph_module(mode="ddp") on
the model's captured Dynamo graph, given the caps DDP uses, must list the
same buckets: same order, same byte counts, same parameters.

DDP's caps are checked in three settings:
- DDP's defaults: 25 MiB buckets and a 1 MiB first bucket;
- an explicit bucket_cap_mb: DDP then uses it for the first bucket too;
- per-bucket caps (bucket_cap_mb_list), the last cap repeating.

Exclusions (each also asserted below, so that it is noticed if it changes):
- find_unused_parameters=True (without static_graph): DDP never rebuilds
  its buckets; they keep declaration order, which no forward-graph plan
  follows (asserted in test_find_unused_parameters_is_a_known_exclusion).
  static_graph=True rebuilds (one iteration later) and is compared.
- graph_break: Dynamo compiles two frames and goddp plans each one alone,
  while DDP buckets the whole model; with DDP's default caps DDP's first
  bucket straddles the frame boundary. With explicit caps that close at
  every layer the per-frame plans, later frame first, do add up to DDP's.
- autocast: DDP's order is the eager autograd engine's gradient-ready order.
  Inside a CPU autocast region a layer's weight gradient becomes ready
  before its bias gradient (the reverse of float32 layers), which nothing in
  the forward graph shows; buckets then close one parameter apart.

The last tests show where torch's mode (torch's DDPOptimizer rules) departs
from DDP and ddp mode does not.
"""

from __future__ import annotations

import pytest
import torch

import goddp
from _parity_harness import (
    capture_frames,
    ddp_rebuilt_buckets,
    train_eager_ddp,
)
from models import MIB, ZOO

pytestmark = pytest.mark.single_process

DDP_DEFAULT_CAP = 25 * MIB
DDP_DEFAULT_FIRST_CAP = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@pytest.fixture(scope="module", autouse=True)
def _process_group(dist_group):
    """DDP needs a process group: conftest's (1-rank gloo here)."""
    return dist_group


def _mib_to_bytes(mb: float) -> int:
    return int(mb * MIB)  # DDP's own conversion


def ddp_settings(entry):
    """name -> (DDP kwargs, goddp plan kwargs) describing the same caps."""
    cap_list = [entry.ddp_cap_mb / 2, entry.ddp_cap_mb * 2, entry.ddp_cap_mb]
    return {
        "defaults": ({}, dict(bucket_cap_bytes=DDP_DEFAULT_CAP, first_bucket_cap_bytes=DDP_DEFAULT_FIRST_CAP)),
        "explicit_cap": (
            {"bucket_cap_mb": entry.ddp_cap_mb},
            dict(
                bucket_cap_bytes=_mib_to_bytes(entry.ddp_cap_mb),
                first_bucket_cap_bytes=_mib_to_bytes(entry.ddp_cap_mb),
            ),
        ),
        "static_graph": (
            {"static_graph": True, "bucket_cap_mb": entry.ddp_cap_mb},
            dict(
                bucket_cap_bytes=_mib_to_bytes(entry.ddp_cap_mb),
                first_bucket_cap_bytes=_mib_to_bytes(entry.ddp_cap_mb),
            ),
        ),
        "cap_list": (
            {"bucket_cap_mb_list": cap_list},
            dict(
                bucket_cap_bytes=_mib_to_bytes(max(cap_list)),
                first_bucket_cap_bytes=_mib_to_bytes(cap_list[0]),
                bucket_caps_bytes=tuple(_mib_to_bytes(c) for c in cap_list),
            ),
        ),
    }


_frames_cache: dict[str, list] = {}
_ddp_cache: dict[tuple, list] = {}


def frames_of(name: str):
    """The captured Dynamo frames of a zoo model (captured once per module)."""
    if name not in _frames_cache:
        entry = ZOO[name]
        _frames_cache[name] = capture_frames(entry.wrap(entry.build()), entry.make_inputs(0))
    return _frames_cache[name]


def goddp_buckets(name: str, mode: str, **plan_kwargs):
    """goddp's buckets for the whole model, DDP order, as (bytes, param set).

    Frames are planned separately; the later frame's buckets come first,
    because its gradients are ready first.
    """
    buckets = []
    for frame in reversed(frames_of(name)):
        plan = goddp.plan_graph_module(frame.gm, mode=mode, ignored=ZOO[name].ignored, **plan_kwargs)
        buckets += [(b.bytes, frozenset(b.param_names)) for b in plan.buckets]
    return buckets


def real_ddp_buckets(name: str, **ddp_kwargs):
    """The buckets eager DDP rebuilds for a zoo model (computed once per
    model and setting)."""
    key = (name, repr(sorted(ddp_kwargs.items())))
    if key not in _ddp_cache:
        ddp = train_eager_ddp(ZOO[name], **ddp_kwargs)
        logged = [(b.bytes, frozenset(b.params)) for b in ddp_rebuilt_buckets(ddp)]
        # DDP's logging data must describe the buckets DDP really reduced
        # (seen by a comm hook in the last iteration), or it is no oracle
        reduced = [(size, frozenset(params)) for _, size, params in ddp.buckets_seen_last_iteration]
        assert logged == reduced, f"DDP's logging data {logged} disagrees with its reduced buckets {reduced}"
        _ddp_cache[key] = logged
    return _ddp_cache[key]


PARITY_CASES = [
    (name, setting)
    for name, entry in ZOO.items()
    for setting in ("defaults", "explicit_cap", "static_graph", "cap_list")
    if not (name == "graph_break" and setting != "explicit_cap")
    if name != "autocast"
    if not (entry.big and setting in ("cap_list", "static_graph"))
]


@pytest.mark.parametrize(("name", "setting"), PARITY_CASES, ids=[f"{n}-{s}" for n, s in PARITY_CASES])
def test_ddp_mode_buckets_equal_ddp_rebuilt_buckets(name, setting):
    ddp_kwargs, plan_kwargs = ddp_settings(ZOO[name])[setting]
    expected = real_ddp_buckets(name, **ddp_kwargs)
    assert goddp_buckets(name, "ddp", **plan_kwargs) == expected


def test_graph_break_with_default_caps_is_a_known_exclusion():
    """Per-frame planning cannot reproduce a DDP bucket that spans frames."""
    ddp_kwargs, plan_kwargs = ddp_settings(ZOO["graph_break"])["defaults"]
    expected = real_ddp_buckets("graph_break", **ddp_kwargs)
    first_frame_params = {n for n, _ in ZOO["graph_break"].build().named_parameters() if not n.startswith("second.")}
    spanning = [params for _, params in expected if params & first_frame_params and params - first_frame_params]
    assert spanning, "DDP no longer builds a bucket across the graph break: include this case in the parity test"
    assert goddp_buckets("graph_break", "ddp", **plan_kwargs) != expected


def test_find_unused_parameters_is_a_known_exclusion():
    """With find_unused_parameters DDP keeps its initial buckets, built in
    reverse declaration order with caps [first cap, cap]."""
    ddp = train_eager_ddp(ZOO["mlp"], find_unused_parameters=True)
    assert not ddp._get_ddp_logging_data().get("has_rebuilt_buckets")
    reduced = [(size, frozenset(params)) for _, size, params in ddp.buckets_seen_last_iteration]
    caps = dict(bucket_cap_bytes=DDP_DEFAULT_CAP, first_bucket_cap_bytes=DDP_DEFAULT_FIRST_CAP)
    assert goddp_buckets("mlp", "ddp", **caps) != reduced


def test_autocast_is_a_known_exclusion():
    """In eager autocast layers DDP sees each weight gradient before its
    bias; goddp orders them as in float32 layers. Same parameters, same
    bytes in all, buckets one parameter apart."""
    ddp_kwargs, plan_kwargs = ddp_settings(ZOO["autocast"])["explicit_cap"]
    expected = real_ddp_buckets("autocast", **ddp_kwargs)
    assert (262144, frozenset({"hidden.3.weight"})) in expected, (
        "DDP's gradient order under autocast changed: include autocast in the parity test"
    )
    got = goddp_buckets("autocast", "ddp", **plan_kwargs)
    assert got != expected
    assert frozenset().union(*(p for _, p in got)) == frozenset().union(*(p for _, p in expected))
    assert sum(b for b, _ in got) == sum(b for b, _ in expected)


# --------------------------------------------------------------------------
# The same through the backend: goddp reads the caps (first-bucket cap,
# per-bucket caps, ignored parameters) from the DDP module itself

BACKEND_CASES = [
    (name, setting)
    for name in ("mlp", "tied", "ignored", "checkpoint", "conv_bn")
    for setting in ("defaults", "explicit_cap", "static_graph", "cap_list")
]


@pytest.mark.parametrize(("name", "setting"), BACKEND_CASES, ids=[f"{n}-{s}" for n, s in BACKEND_CASES])
def test_backend_ddp_mode_plans_ddp_rebuilt_buckets(name, setting):
    entry = ZOO[name]
    ddp_kwargs, _ = ddp_settings(entry)[setting]
    expected = real_ddp_buckets(name, **ddp_kwargs)

    ddp = entry.wrap(entry.build(), **ddp_kwargs)
    goddp.clear_plans()
    # align_buckets=False: the plan's buckets are goddp's prediction of what
    # DDP rebuilds on its own (with alignment, goddp sets DDP's buckets).
    options = {"inner": "eager", "log_plan": False, "align_buckets": False}
    torch.compile(ddp, backend="goddp", options=options)(*entry.make_inputs(0))
    (plan,) = goddp.last_plans()
    assert plan["mode"] == "ddp"
    assert [(b["bytes"], frozenset(b["param_names"])) for b in plan["buckets"]] == expected


# --------------------------------------------------------------------------
# Where torch's rules (goddp's torch mode) and DDP part ways


def test_explicit_cap_torch_mode_keeps_a_1mib_first_bucket_ddp_mode_does_not():
    """DDP(bucket_cap_mb=X) uses X for its first bucket too; torch's
    DDPOptimizer still closes its first bucket at 1 MiB."""
    name, cap_mb = "checkpoint", 2.0  # 2.4 MiB of parameters
    expected = real_ddp_buckets(name, bucket_cap_mb=cap_mb)
    cap = _mib_to_bytes(cap_mb)
    torch_mode = goddp_buckets(name, "torch", bucket_cap_bytes=cap, first_bucket_cap_bytes=DDP_DEFAULT_FIRST_CAP)
    ddp_mode = goddp_buckets(name, "ddp", bucket_cap_bytes=cap, first_bucket_cap_bytes=cap)
    assert ddp_mode == expected
    assert len(expected) == 2 and expected[0][0] >= cap
    assert torch_mode != expected
    assert DDP_DEFAULT_FIRST_CAP <= torch_mode[0][0] < cap


def test_shared_weight_counted_twice_by_torch_mode_once_by_ddp_mode():
    """The tied embedding is counted at both of its uses by torch's rules
    (so the first bucket closes early and the total is inflated), once by
    DDP, whose single default bucket holds every parameter."""
    name = "tied"
    expected = real_ddp_buckets(name)
    model = ZOO[name].build()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert expected == [(total, frozenset(n for n, _ in model.named_parameters()))]

    caps = dict(bucket_cap_bytes=DDP_DEFAULT_CAP, first_bucket_cap_bytes=DDP_DEFAULT_FIRST_CAP)
    assert goddp_buckets(name, "ddp", **caps) == expected
    torch_mode = goddp_buckets(name, "torch", **caps)
    assert len(torch_mode) == 2
    embed_bytes = model.embed.weight.numel() * model.embed.weight.element_size()
    assert sum(b for b, _ in torch_mode) == total + embed_bytes


# --------------------------------------------------------------------------
# What DDP does on the compiled model


@pytest.mark.parametrize("block_cuts", [False, True], ids=["byte_cuts", "block_cuts"])
@pytest.mark.parametrize("name", ["mlp", "transformer", "tied", "conv_bn"])
def test_ddp_rebuilds_the_planned_buckets_on_the_goddp_compiled_model(name, block_cuts):
    """DDP rebuilds its buckets from the gradient-ready order it observes in
    its first iteration. On a compiled model a piece's gradients all arrive
    together, in the autograd engine's own order, so left alone DDP's rebuilt
    buckets straddle the cuts (torch's DDPOptimizer has that problem). With
    align_buckets (the ddp-mode default) goddp installs each piece's exact
    byte total as DDP's per-bucket caps: every rebuilt bucket must then be
    exactly one piece's parameters, as the plan says. With block cuts a
    bucket may span several consecutive pieces, but still closes at a piece
    boundary (docs/align.md)."""
    entry = ZOO[name]
    ddp = entry.wrap(entry.build(), bucket_cap_mb=entry.ddp_cap_mb)
    goddp.clear_plans()
    options = {"inner": "aot_eager", "log_plan": False, "block_cuts": block_cuts}
    compiled = torch.compile(ddp, backend="goddp", options=options)
    for step in range(3):
        entry.loss(compiled(*entry.make_inputs(step))).backward()
    (plan,) = goddp.last_plans()
    assert plan["ddp_buckets"] == {"aligned": True, "reason": None}
    assert plan["num_pieces"] > 1
    completing = [b["piece"] for b in plan["buckets"]]
    if not block_cuts:
        # One bucket per piece, bucket 0 the last piece.
        assert completing == list(reversed(range(plan["num_pieces"])))
    else:
        # Buckets close at piece boundaries, last piece first, down to piece 0.
        assert completing == sorted(set(completing), reverse=True) and completing[-1] == 0
    assert plan["ddp_caps"] == [b["bytes"] for b in plan["buckets"]]
    planned = [(b["bytes"], frozenset(b["param_names"])) for b in plan["buckets"]]
    assert [(b.bytes, frozenset(b.params)) for b in ddp_rebuilt_buckets(ddp)] == planned
