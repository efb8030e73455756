"""Planning one graph: its exported arrays and a request in, the decoded
GraphPlan out (one call into the planner, planner/decide.go, Note [One
call]); and ``plan_graph_module``, planning without compiling.

goddp.native.plan holds the request's and the reply's types and their
conversion; this module adds what needs the graph (goddp.graph.export)
and the options (goddp.options).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch
from torch import fx, nn

from goddp.graph.export import ExportedGraph, export_graph, parameter_names, with_ddp_positions
from goddp.native import extension as _native
from goddp.native.plan import DDPRequest, GraphPlan, PlanRequest
from goddp.native.plan import decode_plan as _decode
from goddp.options import Options, check_ddp_mode_only, check_max_pieces, check_mode


def request_for(options: Options, ddp: DDPRequest | None, align: bool = False) -> PlanRequest:
    """What the planner is told besides the graph: the user's options (None:
    not given, Note [Cap defaults] in planner/settings.go), in bytes, and
    the DDP module's settings; align asks for DDP's buckets to be the
    pieces."""
    return PlanRequest(
        mode=options.mode,
        bucket_cap_bytes=options.bucket_cap_bytes,
        first_bucket_cap_bytes=options.first_bucket_cap_bytes,
        max_pieces=options.max_pieces,
        align_buckets=align,
        block_cuts=options.cuts_at_blocks,
        edges=options.edge_policy,
        ddp=ddp,
    )


def call_planner(exported: ExportedGraph, request: PlanRequest) -> dict[str, Any]:
    """Runs the Go planner, once. Loads the extension on first use (never at
    import, so that fork-based workers created before it are unaffected)."""
    return _native.plan_graph(exported.arrays, request.to_native())


def decode_plan(raw: Mapping[str, Any], exported: ExportedGraph, request: PlanRequest) -> GraphPlan:
    """The planner's reply for exported under request, as a GraphPlan."""
    return _decode(raw, [node.name for node in exported.nodes], exported.param_names, request)


def plan(exported: ExportedGraph, request: PlanRequest) -> GraphPlan:
    """Plans an exported graph: one call into the planner, decoded."""
    return decode_plan(call_planner(exported, request), exported, request)


def _name_lookup(param_names: Any) -> Callable[[torch.Tensor], str | None] | None:
    if param_names is None:
        return None
    if isinstance(param_names, nn.parallel.DistributedDataParallel):
        param_names = param_names.module
    if isinstance(param_names, nn.Module):
        by_id = parameter_names(param_names)
    elif isinstance(param_names, Mapping):
        by_id = {id(k): v for k, v in param_names.items()}
    else:
        raise TypeError(
            "param_names must be None, an nn.Module (names from named_parameters()) "
            f"or a mapping from parameter to name, got {type(param_names).__name__}"
        )
    return lambda p: by_id.get(id(p))


def plan_graph_module(
    gm: fx.GraphModule,
    *,
    mode: str = "ddp",
    bucket_cap_bytes: int | None = None,
    first_bucket_cap_bytes: int | None = None,
    bucket_caps_bytes: Iterable[int] = (),
    ignored: Iterable[str] = (),
    max_pieces: int | None = None,
    param_names: Any = None,
    align_buckets: bool = False,
    block_cuts: bool = False,
    declaration_order: Iterable[str] | None = None,
) -> GraphPlan:
    """Plans a Dynamo-captured GraphModule without compiling anything.

    mode: "ddp" (DDP's rebuilt buckets) or "torch" (torch's DDPOptimizer).
    bucket_cap_bytes: the bucket cap; default DDP's 25 MiB.
    first_bucket_cap_bytes: default as DDP computes it (1 MiB with the
        default cap, else the cap) in ddp mode, 1 MiB (at most the cap) in
        torch mode.
    bucket_caps_bytes: optional per-bucket caps in DDP order (ddp mode).
    ignored: FQNs DDP ignores (parameters marked ``_ddp_ignored`` are
        ignored as well).
    max_pieces: at most this many pieces (ddp mode); None for no limit.
    param_names: where parameter names come from: an nn.Module (or DDP
        wrapper) whose named_parameters() name them, or a mapping
        parameter -> name; by default Dynamo's sources, then node names.
    align_buckets: ddp mode: one bucket per piece, holding exactly the
        parameters first used in that piece (docs/align.md).
    block_cuts: ddp mode: cut at the boundaries of repeated module blocks,
        as the backend does by default (Note [Block rule] in
        planner/modstack.go).
    declaration_order: the names of DDP's parameters in DDP's own order
        (``goddp.ddp.declaration.ddp_parameter_names(ddp)``) when DDP never
        rebuilds its buckets (find_unused_parameters=True without
        static_graph): with align_buckets, the plan then aligns DDP's
        declaration-order buckets (GraphPlan.alignment, ddp_caps).

    Raises ValueError for a bad mode or max_pieces; the planner's errors
    (goddp.native.extension.PlannerError) for an invalid graph or caps.
    """
    check_mode(mode)
    check_ddp_mode_only(mode, check_max_pieces(max_pieces), align_buckets, block_cuts)
    request = PlanRequest(
        mode=mode,
        bucket_cap_bytes=bucket_cap_bytes,
        first_bucket_cap_bytes=first_bucket_cap_bytes,
        bucket_caps_bytes=tuple(int(c) for c in bucket_caps_bytes),
        max_pieces=max_pieces,
        align_buckets=align_buckets,
        bucket_order="ready" if declaration_order is None else "declaration",
        block_cuts=block_cuts,
    )
    exported = export_graph(gm, param_name_of=_name_lookup(param_names), ignored_names=ignored)
    if declaration_order is not None:
        exported = with_ddp_positions(exported, list(declaration_order))
    return plan(exported, request)
