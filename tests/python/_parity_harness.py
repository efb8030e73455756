"""Helpers for goddp's parity tests: capture Dynamo graphs of DDP-wrapped zoo
models, run torch's own DDPOptimizer on them as an oracle, and read the
buckets that eager DDP really builds.

Nothing here imports goddp, so the oracles can be checked on their own.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn
from torch._dynamo.backends.distributed import DDPOptimizer

from models import ZooEntry


# --------------------------------------------------------------------------
# Process group


def ensure_process_group() -> None:
    """Make sure a default process group exists.

    An existing group (from tests/python/conftest.py, or an earlier test) is
    used as is. Under torchrun the group is formed from torchrun's
    environment; in a plain process a 1-rank gloo group is created from a
    file store in a fresh temporary directory, so no port can collide.
    """
    if dist.is_initialized():
        return
    if "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        return
    import tempfile

    store_file = os.path.join(tempfile.mkdtemp(prefix="goddp_pg_"), "store")
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=0, world_size=1)


# --------------------------------------------------------------------------
# Capturing the Dynamo graphs that a DDP forward produces


@dataclasses.dataclass
class CapturedFrame:
    """One Dynamo graph (one frame) of a DDP-wrapped model."""

    gm: fx.GraphModule
    example_inputs: list
    # placeholder node name -> fully qualified parameter name in the wrapped
    # model (only for placeholders that hold the model's parameters)
    placeholder_fqns: dict[str, str]

    def param_placeholder_names(self) -> list[str]:
        return list(self.placeholder_fqns)


class _FrameLocals(dict):
    """Stands in for a compiled frame's locals when evaluating a Dynamo
    source: every zoo frame (forward and resume functions alike) reaches its
    parameters through its local `self`, the module wrapped by DDP."""

    def __init__(self, module: nn.Module):
        super().__init__(self=module)

    def __missing__(self, key):
        raise LookupError(f"local {key!r} is not the wrapped module")


def placeholder_fqns(gm: fx.GraphModule, module: nn.Module) -> dict[str, str]:
    """Map each parameter placeholder of gm to the parameter's name in module.

    The placeholder's Dynamo source (e.g. L['self']._modules['fc']._parameters
    ['weight']) is evaluated against the real module, and the resulting
    object is looked up by identity among module's parameters. This goes
    through Dynamo's own bookkeeping rather than guessing from mangled
    placeholder names.
    """
    by_id = {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}
    locals_ = _FrameLocals(module)
    result = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node, "_dynamo_source", None)
        if source is None:
            continue
        expr = source.name() if callable(source.name) else source.name
        try:
            value = eval(expr, {"L": locals_, "G": {}})  # noqa: S307 - Dynamo's own source text
        except (LookupError, AttributeError, NameError):
            continue
        if isinstance(value, nn.Parameter) and id(value) in by_id:
            result[node.name] = by_id[id(value)]
    return result


def capture_frames(ddp_model: nn.Module, inputs: tuple) -> list[CapturedFrame]:
    """Compile ddp_model with a recording backend and run one forward.

    torch._dynamo.config.optimize_ddp is held off, so each frame arrives
    whole (torch's DDPOptimizer would otherwise split it before the backend
    sees it). The recording backend returns the graph's own forward, so the
    forward still produces real outputs.
    """
    frames: list[CapturedFrame] = []
    inner = ddp_model.module

    def record(gm, example_inputs, **_):
        frames.append(CapturedFrame(gm, list(example_inputs), placeholder_fqns(gm, inner)))
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(optimize_ddp=False):
            compiled = torch.compile(ddp_model, backend=record)
            with torch.no_grad():
                compiled(*inputs)
    finally:
        torch._dynamo.reset()
    return frames


# --------------------------------------------------------------------------
# torch's own DDPOptimizer as the oracle


@dataclasses.dataclass
class OraclePlan:
    """What torch's DDPOptimizer decided for one graph, in forward order."""

    num_pieces: int
    node_pieces: dict[str, int]  # node name -> piece, for every non-placeholder, non-output node
    piece_params: list[list[str]]  # per piece: FQNs in the order counted (a shared parameter may repeat)
    piece_bytes: list[int]


def torch_oracle_plan(frame: CapturedFrame, bucket_cap_bytes: int, first_bucket_cap_bytes: int | None) -> OraclePlan:
    """Run torch's DDPOptimizer on frame.gm and report its pieces.

    first_bucket_cap_bytes=None leaves torch's own default (1 MiB). The
    DDPOptimizer's inner compiler is the identity, so this only costs the
    split and one fake-tensor propagation.
    """
    optimizer = DDPOptimizer(
        bucket_bytes_cap=bucket_cap_bytes,
        backend_compile_fn=lambda gm, example_inputs, **_: gm.forward,
        first_bucket_cap=first_bucket_cap_bytes,
    )
    graph_before = str(frame.gm.graph)
    optimizer.compile_fn(frame.gm, frame.example_inputs)
    # the frame is planned again by goddp and by later oracle calls
    assert str(frame.gm.graph) == graph_before, "torch's DDPOptimizer modified the captured graph"
    buckets = optimizer.buckets  # index 0 is the first piece in forward order

    # DDPOptimizer names parameters by placeholder target and records the ids
    # of the placeholders' example values; map those back to FQNs.
    fqn_by_example_id = {}
    for node in frame.gm.graph.find_nodes(op="placeholder"):
        if node.name in frame.placeholder_fqns:
            fqn_by_example_id[id(node.meta["example_value"])] = frame.placeholder_fqns[node.name]

    node_pieces = {}
    piece_params = []
    for piece, bucket in enumerate(buckets):
        for node in bucket.nodes:
            node_pieces[node.name] = piece
        piece_params.append([fqn_by_example_id[i] for i in bucket.param_ids])
    return OraclePlan(len(buckets), node_pieces, piece_params, [b.size for b in buckets])


# --------------------------------------------------------------------------
# The buckets eager DDP really builds


@dataclasses.dataclass(frozen=True)
class DDPBucket:
    bytes: int
    params: tuple[str, ...]  # FQNs in the order DDP lists them (gradient-ready order)


def ddp_parameter_fqns(module: nn.Module, ignored: tuple = ()) -> list[str]:
    """DDP's parameter list, by name, in DDP's own order.

    DDP builds it by walking named_modules() and each module's direct
    parameters, keeping those that require grad and are not ignored, and
    dropping repeats of a shared parameter (first occurrence wins).
    rebuilt_per_bucket_param_indices indexes into this list.
    """
    seen = set()
    names = []
    for module_name, sub in module.named_modules():
        for param_name, param in sub.named_parameters(recurse=False):
            fqn = f"{module_name}.{param_name}" if module_name else param_name
            if not param.requires_grad or fqn in ignored or param in seen:
                continue
            seen.add(param)
            names.append(fqn)
    return names


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()]


def train_eager_ddp(entry: ZooEntry, iterations: int = 4, seed: int = 0, **ddp_kwargs):
    """Run `iterations` forward/backward passes of eager DDP on entry's model
    and return the DDP module. DDP rebuilds its buckets once, at the start
    of the second iteration (the third with static_graph), so 4 leave the
    last iteration running on the rebuilt buckets.

    A recording comm hook stores, in ddp.buckets_seen_last_iteration, the
    buckets DDP really reduced in the last iteration: (index, bytes,
    parameter FQNs), an observation independent of DDP's logging data.
    """
    ensure_process_group()
    model = entry.build(seed)
    ddp = entry.wrap(model, **ddp_kwargs)
    names = {p: n for n, p in model.named_parameters()}
    seen = []

    def recording_hook(state, bucket):
        seen.append((bucket.index(), bucket.buffer().numel() * bucket.buffer().element_size(),
                     tuple(names[p] for p in bucket.parameters())))
        # no reduction: the tests read bucket layouts, not gradients
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    ddp.register_comm_hook(None, recording_hook)
    for step in range(iterations):
        seen.clear()
        ddp.zero_grad(set_to_none=True)
        entry.loss(ddp(*entry.make_inputs(1000 + step))).backward()
    ddp.buckets_seen_last_iteration = sorted(seen)
    return ddp


def ddp_rebuilt_buckets(ddp) -> list[DDPBucket]:
    """The buckets DDP rebuilt after its first iteration, in DDP order
    (bucket 0 holds the gradients that became ready first)."""
    data = ddp._get_ddp_logging_data()
    if not data.get("has_rebuilt_buckets"):
        raise AssertionError(f"DDP has not rebuilt its buckets: {data}")
    sizes = _csv_ints(data["rebuilt_bucket_sizes"])
    groups = [_csv_ints(g) for g in data["rebuilt_per_bucket_param_indices"].split(",")]
    if len(sizes) != len(groups):
        raise AssertionError(f"DDP logging data disagrees with itself: {sizes} vs {groups}")
    names = ddp_parameter_fqns(ddp.module, tuple(ddp.parameters_to_ignore))
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(len(names))):
        raise AssertionError(f"rebuilt buckets cover indices {covered}, DDP has {len(names)} parameters: {names}")
    return [DDPBucket(size, tuple(names[i] for i in group)) for size, group in zip(sizes, groups)]
