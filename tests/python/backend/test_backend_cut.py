"""The goddp backend end to end in one process: what it hands the inner
compiler, and that the cut graph computes exactly what the whole graph does.

DDP needs a process group: the ``dist_group`` fixture gives a 1-rank gloo
group (or the torchrun group when run under torchrun). Dynamo does not
compile frames inside torch.nn, so every model here is our own nn.Module.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._dynamo.backends.registry import lookup_backend
from torch.nn.parallel import DistributedDataParallel as DDP

import goddp
import goddp.compile.pipeline
from models import SquareStack

LAYER_BYTES_64 = 64 * 64 * 4 + 64 * 4  # one Linear(64, 64) in float32


MLP = SquareStack


class RecordingCompiler:
    """An inner compiler that remembers every graph it is given."""

    def __init__(self, inner: str = "aot_eager") -> None:
        self.graphs: list[fx.GraphModule] = []
        self.example_inputs: list[list] = []
        self._inner = lookup_backend(inner)

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        return self._inner(gm, example_inputs)


def seeded(model_cls, *args, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return model_cls(*args, **kwargs)


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def run_step(model, x):
    out = model(x)
    loss = out.float().pow(2).sum() if isinstance(out, torch.Tensor) else sum(o.float().pow(2).sum() for o in out)
    loss.backward()
    return out


def non_placeholder_targets(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


# --------------------------------------------------------------------------


def test_mlp_split_into_several_pieces_matches_unsplit_bitwise(dist_group, native_module):
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    base = seeded(MLP)
    split_model, whole_model, eager_model = (copy.deepcopy(base) for _ in range(3))

    recorder = RecordingCompiler("aot_eager")
    # DDP closes a bucket once it reaches the cap: two layers per bucket,
    # three pieces for six layers.
    cap_mb = 1.5 * LAYER_BYTES_64 / 2**20
    split = torch.compile(
        DDP(split_model, bucket_cap_mb=cap_mb),
        backend=goddp.backend(inner=recorder),
    )
    out_split = run_step(split, x)

    with torch._dynamo.config.patch(optimize_ddp=False):
        whole = torch.compile(DDP(whole_model, bucket_cap_mb=cap_mb), backend="aot_eager")
        out_whole = run_step(whole, x)
    out_eager = run_step(eager_model, x)

    plans = goddp.last_plans()
    assert len(plans) == 1
    assert plans[0]["fallback"] is None
    assert plans[0]["num_pieces"] == 3
    # Every rank of DDP's group said which plan it runs (at the first training call).
    check = plans[0]["plan_check"]
    assert check["size"] == len(check["ranks"]) == dist_group.world_size
    assert {r["fingerprint"] for r in check["ranks"]} == {f"{plans[0]['fingerprint']:016x}"}
    # pieces 1 and 2 are the same two layers, fed by a value that needs a
    # gradient: one compile serves both (piece 0 reads the input, which
    # needs none, so it is a different graph)
    assert len(recorder.graphs) == plans[0]["distinct_pieces"] == 2
    assert plans[0]["reused_pieces"] == 1

    assert torch.equal(out_split, out_whole)
    torch.testing.assert_close(out_split, out_eager)
    split_grads, whole_grads, eager_grads = grads(split_model), grads(whole_model), grads(eager_model)
    assert split_grads.keys() == whole_grads.keys() == eager_grads.keys()
    assert len(split_grads) == 12
    for name in split_grads:
        assert torch.equal(split_grads[name], whole_grads[name]), name
        torch.testing.assert_close(split_grads[name], eager_grads[name])


def test_pieces_follow_the_planner_exactly(dist_group, native_module):
    base = seeded(MLP, 32, 5)
    model = copy.deepcopy(base)
    captured: list[fx.GraphModule] = []
    recorder = RecordingCompiler("aot_eager")
    configured = goddp.backend(inner=recorder, mode="torch", bucket_cap_mb=0.004)

    def capture_then_goddp(gm, example_inputs, **kwargs):
        captured.append(gm)
        return configured(gm, example_inputs, **kwargs)

    ddp = DDP(model, bucket_cap_mb=0.004)
    compiled = torch.compile(ddp, backend=capture_then_goddp)
    run_step(compiled, torch.randn(4, 32))

    (record,) = goddp.last_plans()
    assert record["mode"] == "torch"
    assert len(captured) == 1
    # Planning the captured graph again gives the same plan.
    plan = goddp.plan_graph_module(
        captured[0],
        mode="torch",
        bucket_cap_bytes=int(0.004 * 2**20),
        first_bucket_cap_bytes=int(0.004 * 2**20),
        param_names=ddp,
    )
    assert plan.fingerprint == record["fingerprint"]
    assert plan.num_pieces == record["num_pieces"] == len(recorder.graphs) > 1

    for p, piece_gm in enumerate(recorder.graphs):
        placeholders = [n.name for n in piece_gm.graph.nodes if n.op == "placeholder"]
        assert placeholders == plan.piece_inputs[p] == record["pieces"][p]["inputs"]
        (output_node,) = [n for n in piece_gm.graph.nodes if n.op == "output"]
        assert [n.name for n in output_node.args[0]] == plan.piece_outputs[p]
        # Every original node the plan puts in piece p is in its graph.
        expected_nodes = {name for name, q in plan.node_pieces.items() if q == p}
        assert expected_nodes <= {n.name for n in piece_gm.graph.nodes}
        # Example inputs: real/fake tensors shaped like the crossing values.
        assert len(recorder.example_inputs[p]) == len(placeholders)

    # Parameter names are the DDP-wrapped module's FQNs.
    named = {name for name, _ in model.named_parameters()}
    for bucket in plan.buckets:
        assert set(bucket.param_names) <= named
    assert {n for names in plan.piece_param_names() for n in names} == named


class Regions(nn.Module):
    """Autocast and no_grad regions long enough to be cut through."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(5))

    def forward(self, x):
        l0, l1, l2, l3, l4 = self.layers
        x = torch.relu(l0(x))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = l1(x)
            b = torch.relu(l2(a))
            c = l3(b)
        h = c.float()
        with torch.no_grad():
            s = l1(h)
            s = torch.tanh(l2(s))
        return l4(h + s.float()), c


def test_autocast_and_no_grad_regions_crossing_cuts(dist_group, native_module):
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(2))
    base = seeded(Regions)
    split_model, whole_model, eager_model = (copy.deepcopy(base) for _ in range(3))
    recorder = RecordingCompiler("aot_eager")
    # torch mode counts a parameter at every use, and a tiny cap makes every
    # node with parameters close a bucket: cuts land inside both regions.
    split = torch.compile(
        DDP(split_model, bucket_cap_mb=0.001, find_unused_parameters=False),
        backend=goddp.backend(inner=recorder, mode="torch"),
    )
    out_split, c_split = split(x)
    (out_split.sum() + c_split.float().sum()).backward()

    with torch._dynamo.config.patch(optimize_ddp=False):
        whole = torch.compile(DDP(whole_model, bucket_cap_mb=0.001), backend="aot_eager")
        out_whole, c_whole = whole(x)
        (out_whole.sum() + c_whole.float().sum()).backward()
    out_eager, c_eager = eager_model(x)
    (out_eager.sum() + c_eager.float().sum()).backward()

    (record,) = goddp.last_plans()
    assert record["fallback"] is None and record["num_pieces"] >= 4

    # Some piece re-enters autocast at its start, and some piece starts by
    # switching grad off again: the cuts really cross both regions.
    firsts = [non_placeholder_targets(gm)[0] for gm in recorder.graphs]
    assert torch.amp.autocast_mode._enter_autocast in firsts
    assert torch._C._set_grad_enabled in firsts
    # Each piece leaves every autocast region it enters.
    for gm in recorder.graphs:
        targets = non_placeholder_targets(gm)
        assert targets.count(torch.amp.autocast_mode._enter_autocast) == targets.count(
            torch.amp.autocast_mode._exit_autocast
        )

    assert c_split.dtype == torch.bfloat16 and out_split.dtype == torch.float32
    assert torch.equal(out_split, out_whole) and torch.equal(c_split, c_whole)
    torch.testing.assert_close(out_split, out_eager)
    split_grads, whole_grads = grads(split_model), grads(whole_model)
    assert split_grads.keys() == whole_grads.keys() == grads(eager_model).keys()
    for name, grad in split_grads.items():
        assert torch.equal(grad, whole_grads[name]), name
    # Grad mode is back to normal after the compiled call.
    assert torch.is_grad_enabled()


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        g = torch.relu(self.b(h))
        return {"logits": self.c(g), "hidden": (h, g)}, x.shape[0]


def test_output_structure_is_preserved(dist_group, native_module):
    x = torch.randn(4, 16)
    base = seeded(DictOut)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.0005),
        backend=goddp.backend(inner="aot_eager", mode="torch"),
    )
    out, batch = compiled(x)
    ref, ref_batch = reference(x)
    assert goddp.last_plans()[-1]["num_pieces"] > 1
    assert batch == ref_batch == 4
    assert set(out) == {"logits", "hidden"}
    assert isinstance(out["hidden"], tuple) and len(out["hidden"]) == 2
    assert torch.equal(out["logits"], ref["logits"])
    assert torch.equal(out["hidden"][1], ref["hidden"][1])


def test_outside_ddp_the_whole_graph_goes_to_the_inner_compiler_untouched(native_module, monkeypatch):
    calls = []
    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", lambda *a: calls.append(a))
    received: list[fx.GraphModule] = []
    recorder = RecordingCompiler("aot_eager")
    configured = goddp.backend(inner=recorder)

    def capture(gm, example_inputs, **kwargs):
        received.append(gm)
        return configured(gm, example_inputs, **kwargs)

    model = seeded(MLP, 16, 3)
    out = torch.compile(model, backend=capture)(torch.randn(2, 16))
    assert out.shape == (2, 16)
    assert len(received) == 1 and len(recorder.graphs) == 1
    assert recorder.graphs[0] is received[0]
    assert calls == []
    assert goddp.last_plans() == []


def test_each_frame_is_planned_exactly_once(dist_group, native_module, monkeypatch):
    calls = []
    real = goddp.compile.pipeline.call_planner

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(goddp.compile.pipeline, "call_planner", counting)
    model = seeded(MLP, 32, 4)
    compiled = torch.compile(DDP(model, bucket_cap_mb=0.004), backend=goddp.backend(inner="aot_eager"))
    for _ in range(3):
        run_step(compiled, torch.randn(4, 32))
    assert len(calls) == 1
    assert len(goddp.last_plans()) == 1


def test_ddp_optimizer_pieces_are_refused_with_the_fix_in_the_message(dist_group, native_module):
    # DDPOptimizer needs caps of at least 1 MiB: layers of just over 1 MiB.
    model = seeded(MLP, 512, 3)
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=1), backend=goddp.backend(inner="aot_eager")
    )
    with torch._dynamo.config.patch(optimize_ddp=True):
        with pytest.raises(Exception) as info:
            compiled(torch.randn(2, 512))
    assert "torch._dynamo.config.optimize_ddp = False" in str(info.value)
    assert "DDPOptimizer" in str(info.value)


def test_refusal_of_a_graph_marked_by_ddp_optimizer():
    gm = fx.symbolic_trace(MLP(8, 1))
    gm.compile_subgraph_reason = "DDPOptimizer intentional graph-break (See Note [DDPOptimizer])."
    with pytest.raises(RuntimeError, match=r"torch\._dynamo\.config\.optimize_ddp = False"):
        goddp.backend.goddp_backend(gm, [torch.randn(1, 8)])


def record_example_values(gm: fx.GraphModule, *args) -> None:
    """Fills node.meta["example_value"] the way Dynamo would (with the right
    requires_grad), by running gm once on real inputs."""

    class Recorder(fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            node.meta["example_value"] = result
            return result

    Recorder(gm).run(*args)


class ModuleCalls(nn.Module):
    """Traced with symbolic_trace: call_module nodes, a get_attr parameter
    used by two pieces, and a nested output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x):
        h = torch.relu(self.fc1(x)) * self.scale
        g = self.fc2(h)
        out = self.fc3(g) + self.scale
        return {"out": out, "mid": [h, g]}


def test_call_module_and_get_attr_graphs(dist_group, native_module):
    """Graphs without inlined parameters (call_module, get_attr): goddp_backend
    called directly inside a DDP forward."""
    base = seeded(ModuleCalls)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    gm = fx.symbolic_trace(model)
    x = torch.randn(3, 8)
    record_example_values(gm, x)
    ddp = DDP(model, bucket_cap_mb=0.0002)
    recorder = RecordingCompiler("aot_eager")
    with ddp._inside_ddp_forward():
        compiled = goddp.backend(inner=recorder, mode="torch")(gm, [x])
    (record,) = goddp.last_plans()
    assert record["fallback"] is None
    assert record["num_pieces"] == len(recorder.graphs) >= 3
    # The get_attr parameter is read from the root module in each piece that
    # uses it, never passed between pieces.
    for piece_gm in recorder.graphs:
        placeholders = [n for n in piece_gm.graph.nodes if n.op == "placeholder"]
        assert all(n.name != "scale" for n in placeholders)

    out = compiled(x)
    ref = reference(x)
    assert set(out) == {"out", "mid"} and isinstance(out["mid"], list)
    torch.testing.assert_close(out["out"], ref["out"])
    torch.testing.assert_close(out["mid"][1], ref["mid"][1])
    (out["out"].sum() + out["mid"][0].sum()).backward()
    (ref["out"].sum() + ref["mid"][0].sum()).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


class Transposer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 24)
        self.w = nn.Parameter(torch.randn(8, 24) / 5)

    def forward(self, x):
        t = self.fc(x).t()  # non-contiguous (24, B)
        return torch.mm(self.w, torch.relu(t))


class StrideRecorder:
    """Inductor as the inner compiler, recording the strides of each piece's
    outputs at run time."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []
        self.runtime_strides: list[list[tuple]] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        compiled = lookup_backend("inductor")(gm, example_inputs)
        index = len(self.graphs) - 1

        def run(*args):
            outs = compiled(*args)
            self.runtime_strides.append((index, [o.stride() for o in outs if isinstance(o, torch.Tensor)]))
            return outs

        return run


@pytest.mark.inductor
def test_non_contiguous_value_crossing_a_cut_under_inductor(dist_group, native_module):
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(3))
    base = seeded(Transposer)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    recorder = StrideRecorder()
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.0001),
        backend=goddp.backend(inner=recorder, mode="torch"),
    )
    out = compiled(x)
    out.sum().backward()
    ref = reference(x)
    ref.sum().backward()

    (record,) = goddp.last_plans()
    assert record["num_pieces"] == 2
    first_outputs = [n for n in recorder.graphs[0].graph.nodes if n.op == "output"][0].args[0]
    expected = [tuple(n.meta["example_value"].stride()) for n in first_outputs]
    assert (5, 1) not in expected and (1, 24) in expected  # the transpose crosses
    (index, strides) = recorder.runtime_strides[0]
    assert index == 0 and [tuple(s) for s in strides] == expected
    torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_metadata_saying_no_grad_for_a_value_that_needs_it_fails_loudly(dist_group, native_module):
    """If Dynamo's metadata ever claimed a crossing value needs no grad while
    it does, its gradient would be lost: the first call must raise instead."""
    base = seeded(ModuleCalls)
    model = copy.deepcopy(base)
    gm = fx.symbolic_trace(model)
    x = torch.randn(3, 8)
    record_example_values(gm, x)
    for node in gm.graph.nodes:
        if node.name == "fc2":  # crosses from the second piece to the third
            node.meta["example_value"] = node.meta["example_value"].detach()
    ddp = DDP(model, bucket_cap_mb=0.0002)
    with ddp._inside_ddp_forward():
        compiled = goddp.backend(inner="aot_eager", mode="torch")(gm, [x])
    assert goddp.last_plans()[-1]["num_pieces"] >= 3
    with pytest.raises(RuntimeError, match="'fc2' passed between pieces requires grad"):
        compiled(x)


class Reshaping(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        batch = x.shape[0]
        for layer in self.layers:
            x = torch.relu(layer(x)).reshape(batch, -1)
        return x.view(batch, 4, 4).sum(1) * batch


def test_dynamic_shapes_symbolic_sizes_cross_cuts(dist_group, native_module):
    base = seeded(Reshaping)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    recorder = RecordingCompiler("aot_eager")
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.001),
        backend=goddp.backend(inner=recorder, mode="torch"),
        dynamic=True,
    )
    for batch in (3, 5, 7):
        x = torch.randn(batch, 16)
        out, ref = compiled(x), reference(x)
        out.sum().backward()
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
            p.grad = q.grad = None
    (record,) = goddp.last_plans()  # one graph serves every batch size
    assert record["num_pieces"] == 4 == len(recorder.graphs)
    # Every piece reads the symbolic batch size.
    for gm, inputs in zip(recorder.graphs, recorder.example_inputs):
        assert any(isinstance(v, torch.SymInt) for v in inputs)


def test_a_tuple_crossing_a_cut_falls_back_to_the_whole_graph(dist_group, native_module):
    """A symbolic_trace graph where a chunk() tuple is split from its getitem
    users: not passable between pieces, so goddp compiles the whole graph."""

    class Chunky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l0 = nn.Linear(16, 16)
            self.l1 = nn.Linear(8, 8)
            self.l2 = nn.Linear(8, 8)

        def forward(self, x):
            parts = torch.relu(self.l0(x)).chunk(2, dim=1)
            a = self.l1(parts[0])
            return (a + self.l2(parts[1]),)  # tuple outputs, like Dynamo's graphs

    base = seeded(Chunky)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    gm = fx.symbolic_trace(model)
    # Move each getitem next to its user, as a hand-written graph might.
    for node in list(gm.graph.nodes):
        if node.target is operator.getitem:
            next(iter(node.users)).prepend(node)
    gm.recompile()
    x = torch.randn(3, 16)
    record_example_values(gm, x)
    ddp = DDP(model, bucket_cap_mb=0.0001)
    with ddp._inside_ddp_forward():
        with pytest.warns(RuntimeWarning, match="'chunk' of type tuple would cross a cut"):
            compiled = goddp.backend(inner="aot_eager", mode="torch")(gm, [x])
    assert "'chunk' of type tuple" in goddp.last_plans()[-1]["fallback"]
    (out,) = compiled(x)
    out.sum().backward()
    (ref,) = reference(x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize(("align_buckets", "num_buckets"), [(False, 6), (True, 2)])
def test_max_pieces_caps_the_piece_count(dist_group, native_module, align_buckets, num_buckets):
    base = seeded(MLP, 32, 6)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    recorder = RecordingCompiler("aot_eager")
    # Each layer alone fills a bucket; max_pieces merges them into two pieces.
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.001),
        backend=goddp.backend(inner=recorder, max_pieces=2, align_buckets=align_buckets),
    )
    x = torch.randn(4, 32)
    out, ref = run_step(compiled, x), run_step(reference, x)
    (record,) = goddp.last_plans()
    assert record["num_pieces"] == 2 == len(recorder.graphs)
    assert record["caps"]["max_pieces"] == 2
    # Left alone, DDP keeps one bucket per layer; aligned, DDP's buckets are
    # the two pieces (gradients of one piece are ready together anyway).
    assert len(record["buckets"]) == num_buckets
    torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


class InPlace(nn.Module):
    """In-place ops (ReLU(inplace=True), +=) on values made by earlier pieces."""

    def __init__(self) -> None:
        super().__init__()
        self.l0 = nn.Linear(16, 16)
        self.l1 = nn.Linear(16, 16)
        self.l2 = nn.Linear(16, 16)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = self.l0(x)
        h2 = self.l1(x)
        h = self.act(h)
        g = self.l2(h2)
        g += h2 * 2
        return g + h


def test_in_place_ops_on_values_from_earlier_pieces(dist_group, native_module):
    base = seeded(InPlace)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    recorder = RecordingCompiler("aot_eager")
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.0001),
        backend=goddp.backend(inner=recorder, mode="torch"),
    )
    x = torch.randn(3, 16)
    out, ref = run_step(compiled, x), run_step(reference, x)
    (record,) = goddp.last_plans()
    assert record["fallback"] is None and record["num_pieces"] == 3
    # The in-place relu reads a value made by the first piece.
    relu_piece = next(gm for gm in recorder.graphs if any(n.target is F.relu for n in gm.graph.nodes))
    relu_node = next(n for n in relu_piece.graph.nodes if n.target is F.relu)
    assert relu_node.kwargs.get("inplace") is True and relu_node.args[0].op == "placeholder"
    torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


class CheckpointedBlocks(nn.Module):
    """Activation checkpointing: higher-order op calls whose bodies are
    get_attr submodules of the Dynamo graph."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 16)
            self.b = nn.Linear(16, 16)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(self.Block() for _ in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return x


def test_activation_checkpointing_bodies_travel_with_their_calls(dist_group, native_module):
    base = seeded(CheckpointedBlocks)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    recorder = RecordingCompiler("aot_eager")
    compiled = torch.compile(
        DDP(model, bucket_cap_mb=0.0001), backend=goddp.backend(inner=recorder)
    )
    x = torch.randn(3, 16)
    out, ref = run_step(compiled, x), run_step(reference, x)
    (record,) = goddp.last_plans()
    assert record["fallback"] is None and record["num_pieces"] == 4
    # Blocks 1-3 are one graph (Note [Checkpoint bodies]); block 0 reads the
    # input, which needs no gradient.
    assert len(recorder.graphs) == record["distinct_pieces"] == 2
    for gm in recorder.graphs:
        bodies = [n for n in gm.graph.nodes if n.op == "get_attr"]
        # Each piece holds exactly the body its checkpoint call uses.
        assert len(bodies) == 1 and len(bodies[0].users) == 1
        assert isinstance(getattr(gm, bodies[0].target), fx.GraphModule)
    torch.testing.assert_close(out, ref)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
