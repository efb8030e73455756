"""goddp.native.extension, the cffi binding to the Go planner
libgoddp.so, and its lazy loader.

Covered: the header's constants, the dict/buffer API and its errors (the
binding's own: buffer types; the library's: every length, through the
spans), a Go panic surfacing as PlannerError, the plan of a toy graph,
calls from several threads, the GIL being released while Go plans, fork
safety in both directions, and that `import goddp` leaves the Go runtime
unloaded.

Tests that plan a valid graph need the real planner.Build.
"""

from __future__ import annotations


import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import types
from array import array

import cffi
import pytest

import _testhooks
from _fork_util import wait_for_child
from goddp.native import extension as _native

pytestmark = pytest.mark.single_process

WEIGHT_BYTES = 4_000_000  # Linear(1000, 1000) fp32 weight
BIAS_BYTES = 4_000
CAP_BYTES = 4_000_000
FIRST_CAP_BYTES = 1_000_000
# A watchdog against a hang (threads that deadlock, a child that never ends,
# a GIL never given back), never a measure of speed.
WATCHDOG_S = 120.0


@pytest.fixture(scope="module")
def ext():
    return _native.load()


# --------------------------------------------------------------------------
# Graph builders


def chain_graph(layers: int, weight_bytes: int = WEIGHT_BYTES, bias_bytes: int = BIAS_BYTES) -> dict:
    """The forward graph of `layers` Linear layers with ReLU, as Dynamo lays
    it out: placeholders x, w0, b0, w1, b1, ... first, then linear_i (params
    w_i, b_i as positional placeholders) and relu_i per layer, then output.

    Node indices (L = layers): x = 0, w_i = 1 + 2i, b_i = 2 + 2i,
    linear_i = 2L + 1 + 2i, relu_i = 2L + 2 + 2i, output = 4L + 1.
    Users: x -> linear_0; w_i, b_i -> linear_i; every compute node j -> j + 1
    (linear_i -> relu_i, relu_i -> linear_{i+1}, the last relu -> output).

    Arrays are built with array arithmetic rather than per-node Python
    loops, so that graphs of a million nodes take well under a second.
    """
    L = layers
    num_nodes = 4 * L + 2
    first_compute = 2 * L + 1
    ops = (
        array("i", [_native.OP_PLACEHOLDER]) * first_compute
        + array("i", [_native.OP_CALL_FUNCTION]) * (2 * L)
        + array("i", [_native.OP_OUTPUT])
    )

    def twice(values: array) -> array:
        """[a, b, ...] -> [a, a, b, b, ...]"""
        out = array(values.typecode, bytes(2 * len(values) * values.itemsize))
        out[0::2] = values
        out[1::2] = values
        return out

    # Only linear_i holds parameters: (w_i, b_i). Offsets stay 0 through the
    # placeholders, then reach 2(i+1) at linear_i and keep it at relu_i.
    param_offsets = (
        array("q", bytes(8 * (first_compute + 1)))
        + twice(array("q", range(2, 2 * L + 1, 2)))
        + array("q", [2 * L])  # after the output
    )
    linears = array("i", range(first_compute, num_nodes - 1, 2))
    users = array("i", [first_compute]) + twice(linears) + array("i", range(first_compute + 1, num_nodes))
    # One user per node except the output.
    user_offsets = array("q", range(num_nodes)) + array("q", [num_nodes - 1])

    names = [b"layers.%d.%s" % (i // 2, b"bias" if i % 2 else b"weight") for i in range(2 * L)]
    sizes = array("q", [weight_bytes, bias_bytes]) * L
    return {
        "num_nodes": num_nodes,
        "node_ops": ops,
        "node_module_ids": array("i", [-1]) * num_nodes,
        "node_param_offsets": param_offsets,
        "node_params": array("i", range(2 * L)),
        "node_param_refs": bytes([_native.REF_ARG]) * (2 * L),
        "node_user_offsets": user_offsets,
        "node_users": users,
        "num_params": 2 * L,
        "param_bytes": sizes,
        "param_storage_bytes": array("q", sizes),
        "param_dtypes": array("i", [0]) * (2 * L),
        "param_devices": array("i", [0]) * (2 * L),
        "param_flags": array("I", [_native.PARAM_REQUIRES_GRAD]) * (2 * L),
        "param_name_offsets": array("q", itertools.accumulate(map(len, names), initial=0)),
        "param_names": b"".join(names),
    }


def test_chain_graph_layout():
    """The builder's arrays, spelled out for two layers."""
    g = chain_graph(2)
    assert g["num_nodes"] == 10
    assert g["node_ops"].tolist() == [0, 0, 0, 0, 0, 3, 3, 3, 3, 5]
    assert g["node_param_offsets"].tolist() == [0, 0, 0, 0, 0, 0, 2, 2, 4, 4, 4]
    assert g["node_params"].tolist() == [0, 1, 2, 3]
    assert g["node_user_offsets"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9]
    #                                 x  w0 b0 w1 b1 l0 r0 l1 r1
    assert g["node_users"].tolist() == [5, 5, 5, 7, 7, 6, 7, 8, 9]
    assert g["param_names"] == b"layers.0.weightlayers.0.biaslayers.1.weightlayers.1.bias"
    assert g["param_name_offsets"].tolist() == [0, 15, 28, 43, 56]
    assert g["param_bytes"].tolist() == [WEIGHT_BYTES, BIAS_BYTES] * 2


def toy_config(mode: int = _native.MODE_DDP, **overrides) -> dict:
    cfg = {
        "mode": mode,
        "bucket_cap_bytes": CAP_BYTES,
        "first_bucket_cap_bytes": FIRST_CAP_BYTES,
        "bucket_caps_bytes": [],
        "max_pieces": 0,
    }
    cfg.update(overrides)
    return cfg


def unpack(data: bytes, typecode: str) -> list[int]:
    a = array(typecode)
    a.frombytes(data)
    return a.tolist()


def csr(offsets: bytes, values: bytes) -> list[list[int]]:
    offs, vals = unpack(offsets, "q"), unpack(values, "i")
    return [vals[offs[i] : offs[i + 1]] for i in range(len(offs) - 1)]


# --------------------------------------------------------------------------
# Module surface


def _fields(struct: str) -> list[str]:
    return [name for name, _ in _native.ffi.typeof(struct).fields]


def test_constants_are_the_headers(ext):
    """Every constant of goddp.h's declarations (each #define and enum
    value, as the C compiler reads it) is the binding's, under its name
    without GODDP_; the library loaded is of the header's ABI."""
    text = _native.declarations()
    defined = {m[0]: int(m[1].rstrip("u"), 0) for m in re.findall(r"#define GODDP_(\w+) (\w+)", text)}
    enumerated = {m[0]: int(m[1]) for m in re.findall(r"^\s*GODDP_(\w+) = (\d+)", text, re.M)}
    assert len(defined) + len(enumerated) == 51
    for name, value in {**defined, **enumerated}.items():
        assert getattr(_native, name) == value, name
    assert ext.abi_version() == _native.ABI_VERSION == defined["ABI_VERSION"]


def test_the_builders_use_the_structs_fields():
    # chain_graph and toy_config leave out the optional fields.
    assert set(chain_graph(1)) < set(_fields("goddp_graph"))
    assert set(toy_config()) < set(_fields("goddp_config"))


def test_node_weights_are_checked(ext):
    """node_weights (ABI 7, optional, Note [Node weights]): None plans as
    absent; a wrong length or a negative weight is refused."""
    graph = chain_graph(2)
    cfg = toy_config()
    plain = ext.plan_graph(graph, cfg)
    n = graph["num_nodes"]
    assert ext.plan_graph({**graph, "node_weights": None}, cfg) == plain
    # Read with the module stacks, and checked there, by the library.
    with pytest.raises(ext.PlannerError, match=f"node_weights has {n - 1} items; the counts and offsets say {n}"):
        ext.plan_graph({**with_stacks(graph, 2), "node_weights": array("i", [1] * (n - 1))}, cfg)


def test_node_costs_are_checked(ext):
    """node_flops and node_bytes (ABI 12, optional, both or neither, Note
    [Edge costs]): absent plans as before; one without the other, a wrong
    length or a negative cost is refused, naming the key."""
    graph = chain_graph(2)
    cfg = toy_config()
    plain = ext.plan_graph(graph, cfg)
    n = graph["num_nodes"]
    costs = {"node_flops": array("q", [0] * n), "node_bytes": array("q", [1] * n)}
    assert ext.plan_graph({**graph, **costs}, cfg) == plain
    with pytest.raises(ext.PlannerError, match="node_flops and node_bytes go together: give both or neither"):
        ext.plan_graph({**graph, "node_bytes": costs["node_bytes"]}, cfg)
    with pytest.raises(ext.PlannerError, match=f"node_flops has {n + 1} items; the counts and offsets say {n}"):
        ext.plan_graph({**graph, **costs, "node_flops": array("q", [0] * (n + 1))}, cfg)
    with pytest.raises(ext.PlannerError, match="node 1: NodeBytes is -3"):
        ext.plan_graph({**graph, **costs, "node_bytes": array("q", [0, -3] + [0] * (n - 2))}, cfg)


def test_node_block_ids_cut_at_blocks(ext):
    """node_block_ids (ABI 4, optional): with every layer a block, a cap
    above the whole model still cuts at every layer; None or absent plans
    as before; a wrong length is refused, naming the key."""
    layers = 3
    graph = chain_graph(layers)
    cfg = toy_config(bucket_cap_bytes=1 << 40, first_bucket_cap_bytes=1 << 40, align_buckets=True)
    plain = ext.plan_graph(graph, cfg)
    assert plain["num_pieces"] == 1
    assert ext.plan_graph({**graph, "node_block_ids": None}, cfg) == plain
    first_compute = 2 * layers + 1
    blocks = array("i", [-1]) * graph["num_nodes"]
    for layer in range(layers):
        blocks[first_compute + 2 * layer] = blocks[first_compute + 2 * layer + 1] = layer
    plan = ext.plan_graph({**graph, "node_block_ids": blocks}, cfg)
    assert plan["num_pieces"] == layers and plan["num_buckets"] == 1
    pieces = array("i", plan["node_pieces"]).tolist()
    assert pieces[first_compute:-1] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ext.PlannerError, match="node_block_ids has 13 items") as info:
        ext.plan_graph({**graph, "node_block_ids": blocks[1:]}, cfg)
    assert info.value.code == _native.ERR_INVALID_GRAPH


STACK_KEYS = ("module_string_offsets", "module_strings", "node_stack_offsets", "node_stack_paths", "node_stack_types")


def with_stacks(graph: dict, layers: int) -> dict:
    """chain_graph with module stacks (ABI 6): every node inside the model,
    layer i's linear and relu inside L['self'].layers.<i> as well."""
    strings = ["L['self']", "Model", "Block"] + [f"L['self'].layers.{i}" for i in range(layers)]
    offsets, data = array("q", [0]), b""
    for text in strings:
        data += text.encode()
        offsets.append(len(data))
    stack_offsets, paths, types = array("q", [0]), array("i"), array("i")
    first_compute = 2 * layers + 1
    for node in range(graph["num_nodes"]):
        paths.append(0), types.append(1)
        if first_compute <= node < first_compute + 2 * layers:
            paths.append(3 + (node - first_compute) // 2), types.append(2)
        stack_offsets.append(len(paths))
    return {**graph, "module_string_offsets": offsets, "module_strings": data, "node_stack_offsets": stack_offsets,
            "node_stack_paths": paths, "node_stack_types": types}


BODY_KEYS = ("node_hop_calls", "node_body_offsets", "body_stack_offsets", "body_stack_paths", "body_stack_types")


def with_bodies(graph: dict, layers: int) -> dict:
    """with_stacks, but each layer as if one higher-order-op call (ABI 10,
    Note [Body stacks]): its linear the call, whose body holds two nodes
    inside L['self'].layers.<i>, its relu the call's companion; no node of a
    layer has a stack of its own beyond the model."""
    graph = with_stacks(graph, layers)
    first_compute = 2 * layers + 1
    stack_offsets, paths, types = array("q", [0]), array("i"), array("i")
    calls, body_offsets, body_stacks = array("i"), array("q", [0]), array("q", [0])
    body_paths, body_types = array("i"), array("i")
    for node in range(graph["num_nodes"]):
        paths.append(0), types.append(1)
        stack_offsets.append(len(paths))
        inside = first_compute <= node < first_compute + 2 * layers
        calls.append(first_compute + 2 * ((node - first_compute) // 2) if inside else -1)
        if calls[-1] == node:
            for _ in range(2):
                body_paths.extend([0, 3 + (node - first_compute) // 2]), body_types.extend([1, 2])
                body_stacks.append(len(body_paths))
        body_offsets.append(len(body_stacks) - 1)
    return {**graph, "node_stack_offsets": stack_offsets, "node_stack_paths": paths, "node_stack_types": types,
            "node_hop_calls": calls, "node_body_offsets": body_offsets, "body_stack_offsets": body_stacks,
            "body_stack_paths": body_paths, "body_stack_types": body_types}


def test_body_facts_cross_the_extension(ext):
    """The body facts (ABI 10, optional): the planner sees each call's stack
    through its body as the stacks it stands for say; all five or none, with
    the module stacks, lengths that agree, and the planner's checks named."""
    layers = 3
    cfg = toy_config(bucket_cap_bytes=1 << 40, first_bucket_cap_bytes=1 << 40, block_cuts=1)
    graph = with_bodies(chain_graph(layers), layers)
    plan = ext.plan_graph(graph, cfg)
    assert unpack(plan["node_block_ids"], "i")[2 * layers + 1: -1] == [0, 0, 1, 1, 2, 2]
    assert plan["fingerprint"] == ext.plan_graph(with_stacks(chain_graph(layers), layers), cfg)["fingerprint"]
    assert ext.plan_graph({**graph, **dict.fromkeys(BODY_KEYS)}, cfg)["node_block_ids"] is None
    with pytest.raises(ext.PlannerError, match="body_stack_types is NULL but its length is 12"):
        ext.plan_graph({**graph, "body_stack_types": None}, cfg)
    with pytest.raises(ext.PlannerError, match="node_hop_calls without module stacks"):
        ext.plan_graph({**{k: v for k, v in graph.items() if k not in STACK_KEYS}}, cfg)
    with pytest.raises(ext.PlannerError, match=r"body_stack_paths has 11 items; the counts and offsets say 12"):
        ext.plan_graph({**graph, "body_stack_paths": graph["body_stack_paths"][1:]}, cfg)
    calls = array("i", graph["node_hop_calls"])
    calls[2 * layers + 2] = 2 * layers + 4  # a relu, which is no call
    with pytest.raises(ext.PlannerError, match="node 8 belongs to node 10, which is no call") as info:
        ext.plan_graph({**graph, "node_hop_calls": calls}, cfg)
    assert info.value.code == _native.ERR_INVALID_GRAPH
    with pytest.raises(ext.PlannerError, match="both node weights and body facts"):
        ext.plan_graph({**graph, "node_weights": array("i", [1] * graph["num_nodes"])}, cfg)


def test_uniform_caps_cross_the_extension(ext):
    """ABI 9: config['uniform_caps'] gives every bucket the cap (Note
    [Uniform caps]): DDP's default 1 MiB first-bucket cap gives way."""
    graph = chain_graph(3)
    ddp = {"bucket_cap_bytes": 25 << 20, "first_bucket_cap_bytes": None, "flags": _native.DDP_CAP_IS_DEFAULT}
    cfg = toy_config(bucket_cap_bytes=None, first_bucket_cap_bytes=None, ddp=ddp)
    assert ext.plan_graph(graph, cfg)["first_bucket_cap_bytes"] == 1 << 20
    assert ext.plan_graph(graph, {**cfg, "uniform_caps": True})["first_bucket_cap_bytes"] == 25 << 20
    with pytest.raises(ext.PlannerError, match="UniformCaps is not supported in ModeTorch"):
        ext.plan_graph(graph, {**cfg, "uniform_caps": 1, "mode": _native.MODE_TORCH})


def test_checkpoint_regions_cross_the_extension(ext):
    """ABI 9: checkpoint_regions is the planner's (Note [Uniform caps]):
    with uniform_caps, a body of several pieces and no block runs is to be
    split; one bucket, or no uniform_caps, is not."""
    graph = chain_graph(3)
    split = ext.plan_graph(graph, {**toy_config(), "uniform_caps": True})
    assert split["num_pieces"] >= 2 and split["block_runs"] is False
    assert split["checkpoint_regions"] is True
    assert ext.plan_graph(graph, toy_config())["checkpoint_regions"] is False
    whole = ext.plan_graph(graph, {**toy_config(bucket_cap_bytes=1 << 30, first_bucket_cap_bytes=1 << 30), "uniform_caps": True})
    assert whole["num_pieces"] == 1 and whole["checkpoint_regions"] is False


def test_decisions_cross_the_extension(ext):
    """ABI 6: caps left to the planner (None) inside a DDP module, module
    stacks, and the decisions in the reply: DDP's caps, a piece per block,
    each piece's parameters, the counted parameters, the alignment and
    its reason, as codes and numbers (ABI 11)."""
    layers = 3
    graph = with_stacks(chain_graph(layers), layers)
    graph["param_ddp_positions"] = array("i", range(2 * layers))
    ddp = {"bucket_cap_bytes": 1 << 40, "first_bucket_cap_bytes": None, "num_params": 2 * layers}
    cfg = toy_config(bucket_cap_bytes=None, first_bucket_cap_bytes=None, align_buckets=True, block_cuts=1,
                     edges=_native.EDGES_AUTO, ddp=ddp)
    plan = ext.plan_graph(graph, cfg)
    assert (plan["bucket_cap_bytes"], plan["first_bucket_cap_bytes"]) == (1 << 40, 1 << 40)
    assert plan["num_pieces"] == layers and plan["align_buckets"] is True
    assert (plan["align_reason"], plan["aligned_params"]) == (_native.REASON_ALIGNED, 0)
    assert plan["alignment"] == _native.ALIGN_READY
    assert plan["num_counted_params"] == 2 * layers
    assert csr(plan["piece_param_offsets"], plan["piece_params"]) == [[0, 1], [2, 3], [4, 5]]
    assert unpack(plan["node_block_ids"], "i")[2 * layers + 1: -1] == [0, 0, 1, 1, 2, 2]
    assert unpack(plan["eager_pieces"], "i") == []
    # DDP reduces one more parameter than the graph uses (a graph break):
    # the aligned plan is kept for the forward's combined layout, not DDP's.
    plan = ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "num_params": 2 * layers + 1}})
    assert plan["align_reason"] == _native.REASON_PART_OF_FORWARD and plan["align_buckets"] is False
    assert plan["aligned_params"] == 6
    assert plan["alignment"] == _native.ALIGN_READY
    # A fact about DDP refuses alignment; with several, the first of Note
    # [Alignment refusals].
    flags = ddp.get("flags", 0)
    plan = ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "flags": flags | _native.DDP_MIXED_PRECISION}})
    assert plan["align_reason"] == _native.REASON_MIXED_PRECISION and plan["align_buckets"] is False
    assert plan["aligned_params"] == 0
    both = flags | _native.DDP_BUILTIN_COMM_HOOK | _native.DDP_MIXED_PRECISION
    plan = ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "flags": both}})
    assert plan["align_reason"] == _native.REASON_MIXED_PRECISION
    # static_graph refuses nothing (Note [Alignment refusals])
    plan = ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "flags": flags | _native.DDP_STATIC_GRAPH}})
    assert plan["align_reason"] == _native.REASON_ALIGNED
    # Bad input is named.
    with pytest.raises(ext.PlannerError, match="ddp.flags = 0x200 has unknown bits") as info:
        ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "flags": 0x200}})
    assert info.value.code == _native.ERR_INVALID_CONFIG
    with pytest.raises(ext.PlannerError, match="DDP's bucket cap is 0 bytes"):
        ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "bucket_cap_bytes": 0}})
    with pytest.raises(ValueError, match="unknown key.*'cap'"):
        ext.plan_graph(graph, {**cfg, "ddp": {**ddp, "cap": 1}})
    with pytest.raises(TypeError, match=r"config\['ddp'\] must be a dict or None"):
        ext.plan_graph(graph, {**cfg, "ddp": 5})
    with pytest.raises(ext.PlannerError, match="node_stack_types is NULL"):
        ext.plan_graph({**graph, "node_stack_types": None}, cfg)
    with pytest.raises(ext.PlannerError, match="node_stack_paths has 1 items"):
        ext.plan_graph({**graph, "node_stack_paths": array("i", [0])}, cfg)
    bad = {**graph, "node_stack_paths": array("i", [99]) * len(graph["node_stack_paths"])}
    with pytest.raises(ext.PlannerError, match="path string 99 out of range") as info:
        ext.plan_graph(bad, cfg)
    assert info.value.code == _native.ERR_INVALID_GRAPH


def test_exceptions_are_runtime_errors(ext):
    assert issubclass(ext.PlannerError, RuntimeError)
    assert issubclass(ext.ForkedChildError, RuntimeError)


def test_debug_panic_becomes_planner_error():
    # Only the test build has the hook; see _testhooks.py.
    out = _testhooks.run(
        """
        import pytest
        from goddp.native import extension as _native
        assert _native.load() is ext
        with pytest.raises(ext.PlannerError) as info:
            ext.debug_panic()
        assert info.value.code == _native.ERR_PANIC
        assert "deliberate panic" in str(info.value)
        assert "panicOnPurpose" in str(info.value)  # the stack names the culprit
        # The process and the Go runtime are intact afterwards: it plans,
        # and a second panic is recovered as the first was.
        assert ext.abi_version() == _native.ABI_VERSION
        from test_native import chain_graph, toy_config
        assert ext.plan_graph(chain_graph(3), toy_config())["num_pieces"] == 3
        with pytest.raises(ext.PlannerError) as again:
            ext.debug_panic()
        assert again.value.code == _native.ERR_PANIC
        print("checked")
        """
    )
    assert out.split() == ["checked"]


def test_shipped_library_has_no_panic_hook(ext):
    """The shipped library has no goddp_debug_panic symbol (the test build,
    _testhooks, has)."""
    ffi = cffi.FFI()
    ffi.cdef(_native.declarations("cdef testhooks").replace("goddp_status", "int"))
    with pytest.raises(AttributeError, match="goddp_debug_panic"):
        ffi.dlopen(ext.path).goddp_debug_panic


def test_set_max_procs_round_trip(ext):
    original = _native.set_max_procs(0)
    assert original >= 1
    try:
        assert _native.set_max_procs(3) == original
        assert _native.set_max_procs(-1) == 3  # n <= 0 only queries
        assert _native.set_max_procs(0) == 3
    finally:
        _native.set_max_procs(original)
    with pytest.raises(ValueError, match="int32"):
        ext.set_max_procs(2**40)
    with pytest.raises(TypeError):
        ext.set_max_procs("2")


def test_a_stale_library_is_refused_at_load():
    """A library built for another ABI than the header's (a stale build) is
    refused with a message naming both versions, before any plan could be
    misread."""
    code = textwrap.dedent(
        """
        from goddp.native import extension
        built, extension.ABI_VERSION = extension.ABI_VERSION, 5  # as if the header had moved on
        try:
            extension.load()
        except ImportError as e:
            print("refused" if f"ABI {built}, this Python package needs ABI 5" in str(e) else e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["refused"], out


def test_load_is_cached_across_threads():
    results = []
    threads = [threading.Thread(target=lambda: results.append(_native.load())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(m is results[0] for m in results)
    assert _native.is_loaded()


# --------------------------------------------------------------------------
# Planning


@pytest.mark.parametrize("mode", [_native.MODE_DDP, _native.MODE_TORCH], ids=["ddp", "torch"])
def test_toy_graph_plan(ext, mode):
    plan = _native.plan_graph(chain_graph(3), toy_config(mode))
    assert list(plan) == _fields("goddp_plan")
    scalars = ("num_", "fingerprint", "alignment", "merged_cuts", "bucket_cap_bytes", "first_bucket_cap_bytes",
               "max_pieces", "align_", "aligned_params", "bucket_order", "ddp_bucket_order", "block_runs",
               "checkpoint_regions")
    assert all(isinstance(plan[k], bytes) for k in plan if not k.startswith(scalars) and k != "node_block_ids")
    assert all(isinstance(plan[k], int) for k in plan if k.startswith(scalars))
    assert not any(isinstance(v, str) for v in plan.values()), "replies are numbers and codes, never sentences"
    assert plan["node_block_ids"] is None  # no module stacks, no blocks
    assert plan["block_runs"] is False and plan["checkpoint_regions"] is False
    assert plan["num_nodes"] == 14
    assert plan["num_pieces"] == 3
    assert plan["num_buckets"] == 3
    # x, w0..b2 (0-6) and the output (13) belong to no piece; layer i is piece i.
    assert unpack(plan["node_pieces"], "i") == [-1] * 7 + [0, 0, 1, 1, 2, 2] + [-1]
    # Buckets in DDP order: the last layer's gradients are ready first.
    assert unpack(plan["bucket_bytes"], "q") == [WEIGHT_BYTES + BIAS_BYTES] * 3
    assert unpack(plan["bucket_pieces"], "i") == [2, 1, 0]
    assert unpack(plan["bucket_node_begin"], "q") == [11, 9, 7]
    if mode == _native.MODE_DDP:  # the span of its parameters' first uses: linear_i
        assert unpack(plan["bucket_node_end"], "q") == [12, 10, 8]
    else:  # torch's bucket is the whole node range: linear_i and relu_i
        assert unpack(plan["bucket_node_end"], "q") == [13, 11, 9]
    assert plan["bucket_extended"] == bytes(3)
    assert [sorted(b) for b in csr(plan["bucket_param_offsets"], plan["bucket_params"])] == [[4, 5], [2, 3], [0, 1]]
    assert csr(plan["piece_input_offsets"], plan["piece_inputs"]) == [[0, 1, 2], [3, 4, 8], [5, 6, 10]]
    assert csr(plan["piece_output_offsets"], plan["piece_outputs"]) == [[8], [10], [12]]
    # Identical input, identical fingerprint.
    assert _native.plan_graph(chain_graph(3), toy_config(mode))["fingerprint"] == plan["fingerprint"]


def _first_use_bytes_per_piece(graph: dict, plan: dict) -> list[int]:
    """Bytes of the parameters first used in each piece, from the graph's
    arrays and the plan's node_pieces."""
    parts = unpack(plan["node_pieces"], "i")
    offsets, params = graph["node_param_offsets"], graph["node_params"]
    per_piece = [0] * plan["num_pieces"]
    seen = set()
    for node, piece in enumerate(parts):
        if piece < 0:
            continue
        for p in params[offsets[node] : offsets[node + 1]]:
            if p not in seen:
                seen.add(p)
                per_piece[piece] += graph["param_bytes"][p]
    return per_piece


def test_align_buckets_gives_one_bucket_per_piece(ext):
    """A first cap of one bias and a cap of one weight close two buckets in
    the last layer: four predicted buckets over three pieces. With
    align_buckets there is one bucket per piece (DDP order) holding exactly
    its parameters' bytes: the per-bucket caps to hand to DDP."""
    graph = chain_graph(3)
    caps = dict(bucket_cap_bytes=WEIGHT_BYTES, first_bucket_cap_bytes=BIAS_BYTES)
    plain = ext.plan_graph(graph, toy_config(**caps))
    assert (plain["num_pieces"], plain["num_buckets"]) == (3, 4)
    for align in (True, 1):
        plan = ext.plan_graph(graph, toy_config(align_buckets=align, **caps))
        assert plan["num_buckets"] == plan["num_pieces"] == 3
        assert plan["node_pieces"] == plain["node_pieces"]
        assert unpack(plan["bucket_pieces"], "i") == [2, 1, 0]
        per_piece = _first_use_bytes_per_piece(graph, plan)
        assert unpack(plan["bucket_bytes"], "q") == per_piece[::-1] == [WEIGHT_BYTES + BIAS_BYTES] * 3
        assert csr(plan["bucket_param_offsets"], plan["bucket_params"]) == [[5, 4], [3, 2], [1, 0]]
        assert plan["fingerprint"] != plain["fingerprint"]
    # Off, explicitly, is the same as leaving the key out.
    assert ext.plan_graph(graph, toy_config(align_buckets=False, **caps)) == plain
    assert ext.plan_graph(graph, toy_config(align_buckets=0, **caps)) == plain


def test_align_buckets_refusals(ext):
    with pytest.raises(ext.PlannerError, match="ModeTorch") as info:
        ext.plan_graph(chain_graph(2), toy_config(_native.MODE_TORCH, align_buckets=True))
    assert info.value.code == _native.ERR_INVALID_CONFIG
    graph = chain_graph(2)
    graph["param_dtypes"][3] = 7  # layers.1.bias in another dtype
    # Each group gets its caps, in either order (planner/keys.go,
    # planner/declorder.go): cap j is every group's j-th bucket's.
    split = ext.plan_graph(graph, toy_config(align_buckets=True))
    assert split["alignment"] == _native.ALIGN_READY_GROUPS
    graph["param_ddp_positions"] = array("i", range(4))
    declared = ext.plan_graph(graph, toy_config(align_buckets=True, bucket_order=_native.ORDER_DECLARATION))
    assert declared["alignment"] == _native.ALIGN_DECLARATION_GROUPS
    assert declared["num_ddp_caps"] < len(unpack(declared["bucket_bytes"], "q"))
    with pytest.raises(TypeError, match=r"config\['align_buckets'\] must be an int"):
        ext.plan_graph(chain_graph(2), toy_config(align_buckets="yes"))
    with pytest.raises(TypeError, match=r"config\['align_buckets'\] must be an int"):
        ext.plan_graph(chain_graph(2), toy_config(align_buckets=None))


def test_declaration_order_crosses_the_extension(ext):
    """bucket_order and param_ddp_positions go in, alignment, ddp_caps and
    merged_cuts come back: declared in forward order the caps list the
    pieces forward-first; with the last layer declared first it joins the
    first layer's bucket and its own cut goes; positions are optional only
    outside declaration order."""
    graph = chain_graph(3)
    caps = dict(bucket_cap_bytes=WEIGHT_BYTES, first_bucket_cap_bytes=BIAS_BYTES, align_buckets=True)
    ready = ext.plan_graph(graph, toy_config(**caps))
    assert (ready["alignment"], ready["merged_cuts"]) == (1, 0)
    assert unpack(ready["ddp_caps"], "q") == unpack(ready["bucket_bytes"], "q")

    graph["param_ddp_positions"] = array("i", range(6))
    plan = ext.plan_graph(graph, toy_config(bucket_order=1, **caps))
    assert (plan["alignment"], plan["merged_cuts"], plan["num_pieces"]) == (2, 0, 3)
    assert plan["node_pieces"] == ready["node_pieces"]
    assert unpack(plan["ddp_caps"], "q") == unpack(plan["bucket_bytes"], "q")[::-1]

    graph["param_ddp_positions"] = array("i", [2, 3, 4, 5, 0, 1])  # layer 2 declared first
    plan = ext.plan_graph(graph, toy_config(bucket_order=1, **caps))
    assert (plan["alignment"], plan["merged_cuts"], plan["num_pieces"]) == (3, 1, 2)
    assert unpack(plan["ddp_caps"], "q") == [2 * (WEIGHT_BYTES + BIAS_BYTES), WEIGHT_BYTES + BIAS_BYTES]

    graph["param_ddp_positions"] = None
    with pytest.raises(ext.PlannerError, match="has no DDP position") as info:
        ext.plan_graph(graph, toy_config(bucket_order=1, **caps))
    assert info.value.code == _native.ERR_INVALID_GRAPH
    assert ext.plan_graph(graph, toy_config(**caps)) == ready
    graph["param_ddp_positions"] = array("i", range(5))
    with pytest.raises(ext.PlannerError, match="param_ddp_positions has 5 items"):
        ext.plan_graph(graph, toy_config(bucket_order=1, **caps))
    graph["param_ddp_positions"] = array("d", range(6))
    with pytest.raises(ValueError, match="param_ddp_positions"):
        ext.plan_graph(graph, toy_config(bucket_order=1, **caps))
    with pytest.raises(ext.PlannerError, match="unknown bucket order 9"):
        ext.plan_graph(chain_graph(3), toy_config(bucket_order=9, **caps))


def test_fingerprint_depends_on_the_caps(ext):
    a = ext.plan_graph(chain_graph(3), toy_config())
    b = ext.plan_graph(chain_graph(3), toy_config(bucket_cap_bytes=CAP_BYTES * 3))
    assert a["fingerprint"] != b["fingerprint"]


def test_accepts_any_integer_buffer(ext):
    """memoryviews and bytearrays of the right item size work like array."""
    graph = chain_graph(3)
    reference = ext.plan_graph(graph, toy_config())
    graph["node_ops"] = memoryview(bytearray(graph["node_ops"].tobytes())).cast("i")
    graph["node_param_refs"] = bytearray(graph["node_param_refs"])
    graph["param_flags"] = memoryview(graph["param_flags"])
    graph["param_names"] = memoryview(graph["param_names"])
    cfg = toy_config(bucket_caps_bytes=())
    assert ext.plan_graph(graph=graph, config=cfg) == reference


@pytest.mark.parametrize(("key", "named"), [("bucket_cap_bytes", "the user's bucket cap"),
                                            ("first_bucket_cap_bytes", "the user's first-bucket cap")])
def test_negative_cap_is_invalid_config(ext, key, named):
    """The error names the cap that is wrong, and its value."""
    with pytest.raises(ext.PlannerError) as info:
        ext.plan_graph(chain_graph(3), toy_config(**{key: -1}))
    assert info.value.code == _native.ERR_INVALID_CONFIG
    assert f"{named} is -1 bytes" in str(info.value)


@pytest.mark.parametrize("key", ["bucket_cap_bytes", "first_bucket_cap_bytes"])
def test_not_given_is_none_and_only_none(ext, key):
    """ABI 11: a cap not given is None in Python and GODDP_CAP_NOT_GIVEN at
    the ABI, converted in one place (the binding): None plans with the
    defaults (Note [Cap defaults]); a given cap of that value is refused
    rather than read as not given, in the config and in config['ddp']."""
    default = ext.plan_graph(chain_graph(3), toy_config(bucket_cap_bytes=None, first_bucket_cap_bytes=None))
    assert (default["bucket_cap_bytes"], default["first_bucket_cap_bytes"]) == (25 << 20, 1 << 20)
    with pytest.raises(ValueError, match=rf"config\['{key}'\] is 0 bytes; a cap must be > 0 \(None: not given\)"):
        ext.plan_graph(chain_graph(3), toy_config(**{key: _native.CAP_NOT_GIVEN}))
    ddp = {"bucket_cap_bytes": 1 << 20, "first_bucket_cap_bytes": _native.CAP_NOT_GIVEN}
    if key == "first_bucket_cap_bytes":
        with pytest.raises(ValueError, match=r"config\['ddp'\]\['first_bucket_cap_bytes'\] is 0 bytes"):
            ext.plan_graph(chain_graph(3), toy_config(ddp=ddp))


def test_backward_edge_is_invalid_graph(ext):
    graph = chain_graph(3)
    users = graph["node_users"]
    users[len(users) - 1] = 2  # relu_2 "used by" placeholder b0: an edge backwards
    with pytest.raises(ext.PlannerError) as info:
        ext.plan_graph(graph, toy_config())
    assert info.value.code == _native.ERR_INVALID_GRAPH


# --------------------------------------------------------------------------
# Malformed input: what cannot become a C array is refused by the binding;
# every count, length and offset by the library, naming the field.


def test_unknown_and_missing_graph_keys(ext):
    graph = chain_graph(2)
    graph["node_colour"] = b""
    with pytest.raises(ValueError, match="graph has unknown key.*'node_colour'"):
        ext.plan_graph(graph, toy_config())
    del graph["node_colour"], graph["node_users"]
    with pytest.raises(ext.PlannerError, match="node_users is NULL") as info:
        ext.plan_graph(graph, toy_config())
    assert info.value.code == _native.ERR_INVALID_GRAPH
    with pytest.raises(ValueError, match="graph has unknown key.*'spans'"):  # the binding's to fill in
        ext.plan_graph({**chain_graph(2), "spans": None}, toy_config())


def test_unknown_config_keys(ext):
    with pytest.raises(ValueError, match="unknown key.*'bucket_cap_mb'"):
        ext.plan_graph(chain_graph(2), toy_config(bucket_cap_mb=25))


def test_wrong_container_types(ext):
    with pytest.raises(TypeError, match="graph must be a dict"):
        ext.plan_graph([], toy_config())
    with pytest.raises(TypeError, match="config must be a dict"):
        ext.plan_graph(chain_graph(1), None)
    with pytest.raises(TypeError, match=r"config\['mode'\] must be an int"):
        ext.plan_graph(chain_graph(1), toy_config(mode="ddp"))
    with pytest.raises(TypeError, match=r"bucket_caps_bytes"):
        ext.plan_graph(chain_graph(1), toy_config(bucket_caps_bytes=b"\x01"))
    with pytest.raises(ValueError, match=r"bucket_caps_bytes'\]\[1\]"):
        ext.plan_graph(chain_graph(1), toy_config(bucket_caps_bytes=[1, 2**70]))


def _edit(graph, **fields):
    graph.update(fields)
    return graph


MALFORMED = {
    # field named in the error -> a graph with that field broken: those that
    # cannot be a C array of the field's type are refused by the binding
    # (TypeError, ValueError), the rest by the library (PlannerError)
    "node_ops (item size)": ("node_ops", lambda g: _edit(g, node_ops=array("q", g["node_ops"]))),
    "node_ops (length)": ("node_ops", lambda g: _edit(g, node_ops=g["node_ops"][:-1])),
    "node_module_ids (float)": ("node_module_ids", lambda g: _edit(g, node_module_ids=array("f", g["node_module_ids"]))),
    "node_param_offsets (length)": ("node_param_offsets", lambda g: _edit(g, node_param_offsets=g["node_param_offsets"][:-1])),
    "node_params (vs offsets)": ("node_params", lambda g: _edit(g, node_params=g["node_params"] + array("i", [0]))),
    "node_param_refs (item size)": ("node_param_refs", lambda g: _edit(g, node_param_refs=array("i", list(g["node_param_refs"])))),
    "node_users (vs offsets)": ("node_users", lambda g: _edit(g, node_users=g["node_users"][1:])),
    "node_user_offsets (negative)": (
        "node_user_offsets",
        lambda g: _edit(g, node_user_offsets=array("q", [0] * (len(g["node_user_offsets"]) - 1) + [-4])),
    ),
    "param_bytes (length)": ("param_bytes", lambda g: _edit(g, param_bytes=g["param_bytes"] + array("q", [1]))),
    "param_storage_bytes (item size)": ("param_storage_bytes", lambda g: _edit(g, param_storage_bytes=array("i", g["param_storage_bytes"]))),
    "param_flags (item size)": ("param_flags", lambda g: _edit(g, param_flags=bytes(len(g["param_flags"])))),
    "param_names (vs offsets)": ("param_names", lambda g: _edit(g, param_names=g["param_names"] + b"x")),
    "param_dtypes (not C-contiguous)": ("param_dtypes", lambda g: _edit(g, param_dtypes=memoryview(array("i", [0] * 2 * len(g["param_dtypes"])))[::2])),
    "param_devices (not a buffer)": ("param_devices", lambda g: _edit(g, param_devices=list(g["param_devices"]))),
    "num_nodes (negative)": ("num_nodes", lambda g: _edit(g, num_nodes=-1)),
    "num_params (vs arrays)": ("param_", lambda g: _edit(g, num_params=g["num_params"] + 1)),
}


BINDING_REFUSES = ("item size", "float", "not C-contiguous", "not a buffer")


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_arrays_name_the_field(ext, case):
    field, breaker = MALFORMED[case]
    graph = breaker(chain_graph(3))
    with pytest.raises((ValueError, TypeError, ext.PlannerError)) as info:
        ext.plan_graph(graph, toy_config())
    assert field in str(info.value)
    if "not a buffer" in case:
        assert info.type is TypeError
    elif any(kind in case for kind in BINDING_REFUSES):
        assert info.type is ValueError
    else:
        assert info.type is ext.PlannerError and info.value.code == _native.ERR_INVALID_GRAPH


def test_buffers_are_released_after_the_call(ext):
    """An exported array cannot be resized; after plan_graph returns, a
    plan, a refusal at the door or the planner's error, the caller can
    resize it again (append raises BufferError while a view is held)."""
    graph = chain_graph(2)
    with pytest.raises(ext.PlannerError):  # refused by the library: node_ops holds one node less
        ext.plan_graph(_edit(graph, num_nodes=graph["num_nodes"] + 1), toy_config())
    graph["num_nodes"] -= 1
    graph["node_ops"].append(0)
    graph["node_ops"].pop()
    assert ext.plan_graph(graph, toy_config())["num_pieces"] == 2  # planned
    graph["param_bytes"].append(1)
    graph["param_bytes"].pop()
    with pytest.raises(ext.PlannerError):  # refused by the planner
        ext.plan_graph(graph, toy_config(bucket_cap_bytes=-1))
    graph["node_users"].append(0)


# --------------------------------------------------------------------------
# Threads and the GIL


def test_concurrent_plans_agree(ext):
    """Four threads plan at once, released together (the GIL is released
    while Go plans, so their calls overlap): every plan equals the one
    planned alone."""
    graph = chain_graph(200, weight_bytes=40_000, bias_bytes=400)
    cfg = toy_config(bucket_cap_bytes=400_000, first_bucket_cap_bytes=100_000)
    expected = ext.plan_graph(graph, cfg)
    assert expected["num_pieces"] > 2
    results: list = []
    errors: list = []
    barrier = threading.Barrier(4)

    def worker():
        try:
            barrier.wait(timeout=WATCHDOG_S)
            for _ in range(10):
                results.append(ext.plan_graph(graph, cfg))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WATCHDOG_S)
    assert not any(t.is_alive() for t in threads), f"threads still planning after the {WATCHDOG_S:.0f} s watchdog"
    assert not errors, errors
    assert len(results) == 40
    assert all(r == expected for r in results)


# Every method of the binding's Library, by whether it plans. Each that plans must
# release the GIL while Go works (test_every_planning_call_releases_the_gil);
# the others return at once. A new function fails
# test_every_function_is_sorted_by_whether_it_plans until it is sorted here.
def _big_chain_plan(ext):
    graph = chain_graph(25_000, weight_bytes=4096, bias_bytes=64)  # 100,002 nodes
    cfg = toy_config(bucket_cap_bytes=1 << 20, first_bucket_cap_bytes=1 << 20)
    return lambda: ext.plan_graph(graph, cfg)


def _big_forward(ext):
    params = 200_000  # one graph, a bucket every 4 parameters
    args = (array("q", [8]) * params, array("q", [0, params // 4]), array("q", range(0, params + 1, 4)),
            array("i", range(params)))
    return lambda: ext.combine_forward(*args)


def _big_checkpoint_split(ext):
    n = 50_000
    nodes = [{"kind": "placeholder"}] + [{"kind": "compute", "inputs": [i], "carries": True} for i in range(n)]
    call = {"name": "checkpoint", "indexed_only": True, "policy_function": False,
            "nodes": nodes + [{"kind": "output", "inputs": [n]}], "buckets": None}
    request = json.dumps({"calls": [call], "bucket_splits": True, "cut_at_blocks": None, "buckets_planned": False})
    return lambda: ext.checkpoint_split(request)


def _big_timeline(ext):
    units = 2048  # the search is O(units^2) without slowdown
    request = json.dumps({"backward_ns": [1000] * units, "bytes": [4096] * units, "launch_ns": 10,
                          "allreduce": {"latency_ns": 100, "bytes_per_second": 4_000_000_000},
                          "slowdown_permille": 1000})
    return lambda: ext.timeline(request)


PLANNING_CALLS = {"plan_graph": _big_chain_plan, "combine_forward": _big_forward, "checkpoint_split": _big_checkpoint_split,
                  "timeline": _big_timeline}
QUICK_CALLS = {"abi_version", "set_max_procs", "layout_digest", "debug_panic"}


def test_every_function_is_sorted_by_whether_it_plans(ext):
    assert set(_extension_functions(ext)) - {"debug_panic"} <= set(PLANNING_CALLS) | QUICK_CALLS


def _counter_moves_during(call, tries: int, until_moved: bool = False) -> list[int]:
    """How far a pure-Python counter thread advanced across each of `tries`
    runs of call() (fewer when until_moved, once it moved).

    Note [A deterministic GIL probe]: the switch interval is raised far
    beyond the test's length, so no thread is ever made to give up the GIL:
    the counter gives it up at each step (a short sleep), and the calling
    thread only where the C code releases it. The caller reads the counter
    just before the call and just after it with the GIL held throughout,
    so a call that holds the GIL sees the counter unmoved, on any machine,
    however loaded; a call that releases it lets the counter run while Go
    works (whenever the OS schedules it; hence several tries)."""
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1
            time.sleep(1e-4)  # GIL released for long enough that a waiting thread surely takes it

    interval = sys.getswitchinterval()
    sys.setswitchinterval(WATCHDOG_S)
    thread = threading.Thread(target=count, daemon=True)
    moves = []
    try:
        thread.start()
        deadline = time.monotonic() + WATCHDOG_S
        while len(moves) < tries and time.monotonic() < deadline:
            before = counter[0]
            call()
            moves.append(counter[0] - before)
            if until_moved and moves[-1]:
                break
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        thread.join()
    return moves


def test_a_call_that_holds_the_gil_stops_the_counter():
    """The probe's control (Note [A deterministic GIL probe]): pure Python
    work, which never releases the GIL, leaves the counter where it was."""
    moves = _counter_moves_during(lambda: sum(range(2_000_000)), tries=5)
    assert moves == [0] * 5


@pytest.mark.parametrize("name", sorted(PLANNING_CALLS))
def test_every_planning_call_releases_the_gil(ext, name):
    """A call of the binding that plans releases the GIL while Go works
    (cffi releases it around every call): the counter thread moves during
    it (Note [A deterministic GIL probe]). A call that held it (a CPython
    extension without Py_BEGIN_ALLOW_THREADS) leaves it at 0 in every try."""
    call = PLANNING_CALLS[name](ext)
    call()  # a call that raised would prove nothing
    moves = _counter_moves_during(call, tries=20, until_moved=True)
    assert any(moves), f"{name}: the counter never moved during {len(moves)} calls: {moves}"


# --------------------------------------------------------------------------
# fork()


# Arguments that convert for each method of the Library: in a forked child
# every one must refuse before calling Go. A new method without an entry
# here fails test_forked_child_gets_forked_child_error.
_FORK_ARGS = {
    "plan_graph": lambda: (chain_graph(1), toy_config()),
    "abi_version": lambda: (),
    "set_max_procs": lambda: (0,),
    "combine_forward": lambda: (array("q"), array("q", [0, 0]), array("q", [0]), array("i")),
    "layout_digest": lambda: (array("q", [0, 1]).tobytes(), array("i", [0]).tobytes(),
                              array("q", [8]).tobytes(), 0, "build"),
    "checkpoint_split": lambda: ("{}",),
    "timeline": lambda: ("{}",),
    "debug_panic": lambda: (),
}


def _extension_functions(ext) -> list[str]:
    return sorted(n for n in dir(ext) if not n.startswith("_") and isinstance(getattr(ext, n), types.MethodType))


def test_forked_child_gets_forked_child_error(ext):
    names = _extension_functions(ext)
    assert set(names) <= set(_FORK_ARGS), f"no fork case for {sorted(set(names) - set(_FORK_ARGS))}"
    assert len(names) == 7, names
    calls = [(name, lambda n=name: getattr(ext, n)(*_FORK_ARGS[n]())) for name in names] + [
        ("goddp.native.extension.plan_graph", lambda: _native.plan_graph(chain_graph(1), toy_config())),
    ]
    ext.abi_version()  # the Go runtime is certainly running in this process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only Python and the binding's pid check run here
        code = 1
        try:
            os.close(r)
            report = []
            for name, call in calls:
                try:
                    call()
                    report.append(f"{name} returned")
                except ext.ForkedChildError as e:
                    report.append(f"{name} forked:" + str(e))
                except BaseException as e:
                    report.append(f"{name} other:{type(e).__name__}: {e}")
            os.write(w, "\n".join(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    exit_code = wait_for_child(pid, timeout=WATCHDOG_S)  # fails on a child that hangs
    with os.fdopen(r, "rb") as f:
        report = f.read().decode().splitlines()
    assert exit_code == 0
    assert len(report) == len(calls)
    for line in report:
        assert " forked:" in line, report
        assert "forked after it was loaded" in line and "'spawn'" in line
    # The parent is unaffected.
    assert ext.abi_version() == _native.ABI_VERSION


def test_panic_hook_refuses_in_forked_child():
    # debug_panic, like every entry point, refuses in a forked child; only
    # the test build has it (the other entry points are checked above).
    out = _testhooks.run(
        """
        import os
        from _fork_util import wait_for_child
        ext.abi_version()  # the Go runtime is certainly running in this process
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ext.debug_panic()
            except ext.ForkedChildError as e:
                code = 0 if "forked after it was loaded" in str(e) and "'spawn'" in str(e) else 2
            except BaseException:
                code = 3
            finally:
                os._exit(code)
        print("child", wait_for_child(pid, timeout=20))
        """
    )
    assert out.split() == ["child", "0"]


def _run_python(code: str, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_testhooks.child_env(**env),
        cwd=_testhooks.HERE,
    )


def test_child_forked_before_load_can_plan():
    """Fork happens while goddp is imported but Go is not loaded (as with a
    DataLoader worker started early); the child loads Go itself and plans."""
    result = _run_python(
        """
        import os, sys, time
        from goddp.native import extension as _native
        from test_native import chain_graph, toy_config
        assert not _native.is_loaded()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                plan = _native.plan_graph(chain_graph(3), toy_config())
                code = 0 if plan["num_pieces"] == 3 else 2
            except BaseException as e:
                print("child:", type(e).__name__, e, file=sys.stderr)
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            sys.exit("child hung")
        assert os.waitstatus_to_exitcode(status) == 0, status
        # The parent was not affected by the child's Go runtime.
        assert not _native.is_loaded()
        assert _native.plan_graph(chain_graph(3), toy_config())["num_pieces"] == 3
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# --------------------------------------------------------------------------
# Lazy loading


def test_import_goddp_does_not_load_go():
    """Read from the process's memory map: libgoddp.so (and with it the Go
    runtime) is mapped only once load() runs."""
    result = _run_python(
        """
        import goddp
        import goddp.native.extension as native
        def mapped():
            with open("/proc/self/maps") as f:
                return "libgoddp.so" in f.read()
        assert not mapped() and not native.is_loaded(), "import goddp loaded the Go runtime"
        native.load()
        assert mapped() and native.is_loaded()
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_gomaxprocs_from_environment():
    result = _run_python(
        """
        from goddp.native import extension as _native
        _native.load()
        print(_native.set_max_procs(0))
        """,
        GODDP_GOMAXPROCS="3",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3"


def test_bad_gomaxprocs_fails_before_go_loads():
    result = _run_python(
        """
        import sys
        from goddp.native import extension as _native
        try:
            _native.load()
        except ValueError as e:
            assert "GODDP_GOMAXPROCS" in str(e), e
            assert not _native.is_loaded()
            print("ok")
        """,
        GODDP_GOMAXPROCS="lots",
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_checkpoint_split_is_json_in_json_out(ext):
    """goddp_checkpoint_split (csrc/goddp.h): the planner asks, then decides
    (Note [Checkpoint regions] in planner/ckptsplit.go)."""
    nodes = [
        {"kind": "placeholder"},
        {"kind": "compute", "inputs": [0], "carries": True},
        {"kind": "compute", "inputs": [1], "returned": True, "carries": True},
        {"kind": "output", "inputs": [2]},
    ]
    call = {"name": "checkpoint", "indexed_only": True, "policy_function": False, "nodes": nodes, "buckets": None}
    request = {"calls": [call], "bucket_splits": True, "cut_at_blocks": None, "buckets_planned": False}
    assert _native.checkpoint_split(request)["ask"] == "cut_at_blocks"
    reply = _native.checkpoint_split({**request, "cut_at_blocks": False})
    assert reply["ask"] == "buckets" and reply["plan_buckets"] == [0]
    planned = {"pieces": [-1, 0, 1, -1], "param_bytes": 3 << 20, "cap_bytes": 1 << 20, "buckets": 3, "regions": True}
    reply = _native.checkpoint_split(
        {**request, "calls": [{**call, "buckets": planned}], "cut_at_blocks": False, "buckets_planned": True}
    )
    (decided,) = reply["calls"]
    assert reply["ask"] == "" and reply["said"] == [0] and decided["node_regions"] == [-1, 0, 1, -1]
    assert decided["regions"] == [{"inputs": [0], "outputs": [1]}, {"inputs": [1], "outputs": [2]}]
    assert (decided["boundary"], decided["code"], decided["node"], decided["region"]) == ("bucket", "", -1, -1)
    assert not any(isinstance(v, str) and " " in v for v in decided.values()), "codes, never sentences"
    with pytest.raises(ext.PlannerError, match="not valid JSON") as info:
        ext.checkpoint_split("{")
    assert info.value.code == _native.ERR_INVALID_CONFIG
    with pytest.raises(ext.PlannerError, match="does not come before it") as info:
        _native.checkpoint_split({"calls": [{**call, "nodes": [{"kind": "compute", "inputs": [0]}, nodes[-1]]}]})
    assert info.value.code == _native.ERR_INVALID_GRAPH


def test_timeline_is_json_in_json_out(ext):
    """goddp_timeline (csrc/goddp.h; Note [Timeline] in planner/timeline.go):
    three units of 10 ns at 1 ns a byte, chosen and given; a NaN or a 0 ns
    unit is refused at the door."""
    request = {"backward_ns": [10, 10, 10], "bytes": [20, 5, 30], "launch_ns": 1, "slowdown_permille": 1000,
               "allreduce": {"latency_ns": 2, "bytes_per_second": 1_000_000_000}}
    chosen = _native.timeline(request)
    assert (chosen["search"], chosen["step_ns"], chosen["exposed_ns"]) == ("exact", 71, 41)
    assert [(b["first"], b["end"]) for b in chosen["buckets"]] == [(0, 1), (1, 3)]
    given = _native.timeline({**request, "starts": [1, 2]})
    assert (given["search"], given["step_ns"], len(given["buckets"])) == ("none", 74, 3)
    for bad, words in (({"backward_ns": [float("nan"), 10, 10]}, "not valid JSON"),
                       ({"backward_ns": [0, 10, 10]}, "duration 0"),
                       ({"allreduce": {"latency_ns": 2, "bytes_per_second": 0}}, "bandwidth 0")):
        with pytest.raises(ext.PlannerError, match=words) as info:
            _native.timeline({**request, **bad})
        assert info.value.code == _native.ERR_INVALID_CONFIG
