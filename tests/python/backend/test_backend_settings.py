"""Reading the DDP module's settings, turning them into caps, and exporting
parameters (names, flags) the way the planner needs them."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import fx, nn
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
from goddp.compile.inner import resolve_inner
from goddp.ddp.settings import DDPSettings, read_ddp_settings
from goddp.graph.export import export_graph, name_from_dynamo_source
from goddp.native.extension import PARAM_DDP_IGNORED, PARAM_REQUIRES_GRAD
from goddp.compile.plan import plan, request_for
from goddp.native.plan import PlanSettings
from goddp.options import INT64_MAX, parse_options

MIB = 1 << 20


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 8)
        self.head = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))

    def forward(self, x):
        return self.head(torch.relu(self.enc(x)))


def caps_for(settings: DDPSettings, options) -> PlanSettings:
    """The caps the planner resolves for a DDP module's settings and the
    user's options (planner/settings.go, Note [Cap defaults]), read off the
    plan of a small graph."""
    graphs = []

    def capture(gm, example_inputs, **_):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(Two(), backend=capture)(torch.randn(2, 8))
    torch._dynamo.reset()
    return plan(export_graph(graphs[0]), request_for(options, settings.request())).caps


def test_default_ddp_caps(dist_group, native_module):
    settings = read_ddp_settings(DDP(Two()))
    own = settings.own
    assert own.bucket_cap_bytes == 25 * MIB
    assert own.cap_is_default
    assert own.first_bucket_cap_bytes in (1 * MIB, None)  # None: this torch keeps none
    assert own.bucket_caps_bytes == ()
    caps = caps_for(settings, parse_options({}))
    assert (caps.bucket_cap_bytes, caps.first_bucket_cap_bytes) == (25 * MIB, 1 * MIB)
    assert not own.find_unused_parameters and not own.static_graph


def test_explicit_bucket_cap_is_also_the_first_cap_in_ddp_mode(dist_group, native_module):
    settings = read_ddp_settings(DDP(Two(), bucket_cap_mb=10, static_graph=True))
    assert settings.own.bucket_cap_bytes == 10 * MIB and not settings.own.cap_is_default
    assert settings.own.static_graph
    ddp_caps = caps_for(settings, parse_options({}))
    assert (ddp_caps.bucket_cap_bytes, ddp_caps.first_bucket_cap_bytes) == (10 * MIB, 10 * MIB)
    # torch mode follows DDPOptimizer: 1 MiB first bucket whatever DDP says.
    torch_caps = caps_for(settings, parse_options({"mode": "torch"}))
    assert (torch_caps.bucket_cap_bytes, torch_caps.first_bucket_cap_bytes) == (10 * MIB, 1 * MIB)


def test_per_bucket_caps_are_read_and_dropped_when_the_cap_is_overridden(dist_group, native_module):
    settings = read_ddp_settings(DDP(Two(), bucket_cap_mb_list=[1, 4]))
    assert settings.own.bucket_caps_bytes == (1 * MIB, 4 * MIB)
    assert caps_for(settings, parse_options({})).bucket_caps_bytes == (1 * MIB, 4 * MIB)
    overridden = caps_for(settings, parse_options({"bucket_cap_mb": 2}))
    assert overridden.bucket_caps_bytes == ()
    assert overridden.bucket_cap_bytes == 2 * MIB
    assert overridden.first_bucket_cap_bytes == 2 * MIB


def test_option_overrides(dist_group, native_module):
    settings = read_ddp_settings(DDP(Two()))
    caps = caps_for(settings, parse_options({"bucket_cap_mb": 0.5, "first_bucket_cap_mb": 0.25, "max_pieces": 3}))
    assert (caps.bucket_cap_bytes, caps.first_bucket_cap_bytes, caps.max_pieces) == (MIB // 2, MIB // 4, 3)
    # A cap below DDP's first-bucket cap clamps the first cap.
    caps = caps_for(settings, parse_options({"bucket_cap_mb": 0.5}))
    assert caps.first_bucket_cap_bytes == MIB // 2


def test_the_planner_takes_every_cap_and_limit_the_options_accept(dist_group, native_module):
    # goddp.options' bounds are the planner's: the extremes plan.
    settings = read_ddp_settings(DDP(Two()))
    low = caps_for(settings, parse_options({"bucket_cap_mb": 2.0**-20, "max_pieces": INT64_MAX}))
    assert (low.bucket_cap_bytes, low.first_bucket_cap_bytes, low.max_pieces) == (1, 1, INT64_MAX)
    high = caps_for(settings, parse_options({"bucket_cap_mb": 2**43 - 2.0**-10}))
    assert high.bucket_cap_bytes == (1 << 63) - 1024


def _zero_cap(ddp):
    ddp.bucket_bytes_cap = 0  # changed after DDP was built
    return ddp


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: DDP(Two(), bucket_cap_mb=1e-7), "its bucket cap (bucket_bytes_cap) is 0 bytes"),
        (lambda: DDP(Two(), bucket_cap_mb_list=[1, 1e-7]), "its per-bucket cap 1 (from bucket_cap_mb_list) is 0 bytes"),
        (lambda: _zero_cap(DDP(Two())), "its bucket cap (bucket_bytes_cap) is 0 bytes"),
    ],
)
def test_a_ddp_cap_the_planner_refuses_is_a_value_error(dist_group, make, fragment):
    with pytest.raises(ValueError, match="goddp cannot plan inside this DDP module") as info:
        read_ddp_settings(make())
    assert fragment in str(info.value) and "2**-20 (1 byte)" in str(info.value)


def test_a_ddp_cap_of_0_bytes_fails_the_compile_not_the_plan(dist_group, native_module):
    # At the first call, named; never a "planning failed" fallback.
    torch._dynamo.reset()
    compiled = torch.compile(DDP(Two(), bucket_cap_mb=1e-7), backend=goddp.backend(inner="aot_eager"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(Exception, match="its bucket cap \\(bucket_bytes_cap\\) is 0 bytes"):
            compiled(torch.randn(2, 8))
    assert not [w for w in caught if "planning failed" in str(w.message)]
    torch._dynamo.reset()


def test_ignored_parameters_are_flagged_and_left_out_of_buckets(dist_group, native_module):
    torch.manual_seed(0)
    model = Two()
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["enc.weight"])
    model.head[1].bias.requires_grad_(False)
    ddp = DDP(model)
    settings = read_ddp_settings(ddp)
    assert "enc.weight" in settings.ignored_names

    graphs = []

    def capture(gm, example_inputs, **_):
        graphs.append(gm)
        return gm.forward

    torch.compile(model, backend=capture)(torch.randn(2, 8))
    exported = export_graph(graphs[0], param_name_of=settings.param_name_of, ignored_names=settings.ignored_names)
    flags = dict(zip(exported.param_names, exported.arrays["param_flags"]))
    assert set(flags) == {name for name, _ in model.named_parameters()}
    assert flags["enc.weight"] == PARAM_REQUIRES_GRAD | PARAM_DDP_IGNORED
    assert flags["head.1.bias"] == 0
    assert flags["enc.bias"] == PARAM_REQUIRES_GRAD

    plan = goddp.plan_graph_module(graphs[0], param_names=ddp, ignored=settings.ignored_names)
    bucketed = {n for b in plan.buckets for n in b.param_names}
    assert "enc.weight" not in bucketed and "head.1.bias" not in bucketed
    assert {"enc.bias", "head.0.weight", "head.1.weight"} <= bucketed


def test_export_arrays_describe_the_graph(native_module):
    torch.manual_seed(0)
    model = Two()
    graphs = []

    def capture(gm, example_inputs, **_):
        graphs.append(gm)
        return gm.forward

    torch.compile(model, backend=capture)(torch.randn(2, 8))
    gm = graphs[0]
    exported = export_graph(gm)
    arrays = exported.arrays
    nodes = list(gm.graph.nodes)
    assert arrays["num_nodes"] == len(nodes)
    assert list(arrays["node_ops"]) == [
        {"placeholder": 0, "get_attr": 1, "call_module": 2, "call_function": 3, "call_method": 4, "output": 5}[n.op]
        for n in nodes
    ]
    # Users: CSR, ascending, always after the node.
    offsets, users = arrays["node_user_offsets"], arrays["node_users"]
    for i, node in enumerate(nodes):
        mine = list(users[offsets[i]: offsets[i + 1]])
        assert mine == sorted(nodes.index(u) for u in node.users)
        assert all(u > i for u in mine)
    # Names recovered from Dynamo's sources without a DDP module.
    assert sorted(exported.param_names) == sorted(name for name, _ in model.named_parameters())
    assert arrays["param_names"] == b"".join(n.encode() for n in exported.param_names)
    # Parameters are referenced positionally by the linear calls.
    refs = list(arrays["node_param_refs"])
    assert refs and set(refs) == {0}
    sizes = dict(zip(exported.param_names, arrays["param_bytes"]))
    assert sizes["head.1.weight"] == 2 * 8 * 4
    assert list(arrays["param_dtypes"]) == [0] * 6 and list(arrays["param_devices"]) == [0] * 6


@pytest.mark.parametrize(
    "source, expected",
    [
        ("L['self']._modules['enc']._parameters['weight']", "enc.weight"),
        ("L['self']._modules['head']._modules['1']._parameters['bias']", "head.1.bias"),
        ("L['self'].head.w", "head.w"),
        ("L['x']", None),
        ("G['something'] + 1", None),
    ],
)
def test_names_from_dynamo_sources(source, expected):
    assert name_from_dynamo_source(source) == expected


def test_export_of_call_module_and_get_attr_references():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return self.fc(x) * self.w + self.fc(x)

    gm = fx.symbolic_trace(Mixed())
    exported = export_graph(gm)
    arrays = exported.arrays
    nodes = list(gm.graph.nodes)
    refs_per_node = {
        nodes[i].name: [
            (exported.param_names[arrays["node_params"][k]], arrays["node_param_refs"][k])
            for k in range(arrays["node_param_offsets"][i], arrays["node_param_offsets"][i + 1])
        ]
        for i in range(len(nodes))
    }
    assert refs_per_node["fc"] == [("fc.weight", 2), ("fc.bias", 2)]
    assert refs_per_node["fc_1"] == [("fc.weight", 2), ("fc.bias", 2)]
    assert refs_per_node["w"] == [("w", 3)]
    module_ids = list(arrays["node_module_ids"])
    assert module_ids[nodes.index(next(n for n in nodes if n.name == "fc"))] == 0
    assert module_ids[nodes.index(next(n for n in nodes if n.name == "fc_1"))] == 0
    assert module_ids.count(-1) == len(nodes) - 2


def test_inner_resolution_forwards_torch_compile_mode_to_inductor():
    inner = resolve_inner(parse_options({}).with_compile_mode("max-autotune-no-cudagraphs"))
    assert isinstance(inner, torch._TorchCompileInductorWrapper)
    assert inner.config.get("max_autotune") is True
    inner = resolve_inner(parse_options({"inner_options": {"max_autotune": True}}))
    assert isinstance(inner, torch._TorchCompileInductorWrapper) and inner.config["max_autotune"] is True
    from torch._dynamo.backends.registry import lookup_backend

    assert resolve_inner(parse_options({"inner": "aot_eager"})) is lookup_backend("aot_eager")


def test_call_method_parameter_args_count_only_on_a_named_receiver():
    """torch's DDPOptimizer counts a method call's parameter arguments only
    when the receiver's target is a name: w.mul(x) counts (receiver is the
    placeholder w), relu(x).mul(w) does not (receiver is a call_function)."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    w = graph.placeholder("w")
    h = graph.call_function(torch.relu, (x,))
    named = graph.call_method("mul", (w, x))
    unnamed = graph.call_method("mul", (h, w))
    graph.output((named, unnamed))
    weight = nn.Parameter(torch.ones(4))
    for node, value in ((x, torch.ones(4)), (w, weight)):
        node.meta["example_value"] = value
    gm = fx.GraphModule(nn.Module(), graph)
    exported = export_graph(gm)
    arrays = exported.arrays
    nodes = list(gm.graph.nodes)

    def refs(node):
        i = nodes.index(node)
        lo, hi = arrays["node_param_offsets"][i], arrays["node_param_offsets"][i + 1]
        return list(arrays["node_param_refs"][lo:hi])

    assert refs(named) == [0]  # REF_ARG
    assert refs(unnamed) == [1]  # REF_OTHER: still a use in ddp mode
