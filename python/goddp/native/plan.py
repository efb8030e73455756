"""Plans: the native planner's answer, decoded into Python objects.

Nothing here decides where to cut: the Go planner does. This module packs
the request (graph arrays plus caps), calls ``_native.plan_graph`` and turns
the flat reply into a GraphPlan that names nodes, pieces and parameters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import fx, nn

from goddp.native import extension as _native
from goddp.graph.export import ExportedGraph, export_graph, parameter_names, with_ddp_positions
from goddp.options import check_ddp_mode_only, check_max_pieces, check_mode

MIB = 1 << 20
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB
# torch.distributed._DEFAULT_FIRST_BUCKET_BYTES; spelled out so that planning
# works on torch builds without the distributed package.
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB

MODE_CODES = {"ddp": _native.MODE_DDP, "torch": _native.MODE_TORCH}
# enum goddp_bucket_order: the order DDP fills the buckets it reduces with;
# "declaration" when it never rebuilds them (find_unused_parameters=True
# without static_graph; planner/declorder.go).
BUCKET_ORDER_CODES = {"ready": _native.ORDER_READY, "declaration": _native.ORDER_DECLARATION}
# enum goddp_alignment: how a plan's buckets relate to DDP's.
ALIGNMENT_NAMES = {
    _native.ALIGN_NONE: "none",
    _native.ALIGN_READY: "ready-order caps",
    _native.ALIGN_DECLARATION: "declaration-order caps",
    _native.ALIGN_DECLARATION_MERGED: "declaration-order caps, pieces merged",
}


@dataclass(frozen=True)
class PlanSettings:
    """What a plan was made with besides the graph: the bucket caps in bytes
    and the two ddp-mode settings that shape pieces (reported under the
    "caps" key of plan dicts, and as GraphPlan.caps)."""

    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    bucket_caps_bytes: tuple[int, ...] = ()
    max_pieces: int | None = None
    # ddp mode: one bucket per piece with its exact byte total, to be
    # installed as DDP's per-bucket caps (docs/align.md).
    align_buckets: bool = False
    # "ready" or "declaration" (BUCKET_ORDER_CODES).
    bucket_order: str = "ready"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket_cap_bytes": self.bucket_cap_bytes,
            "first_bucket_cap_bytes": self.first_bucket_cap_bytes,
            "bucket_caps_bytes": list(self.bucket_caps_bytes),
            "max_pieces": self.max_pieces,
            "align_buckets": self.align_buckets,
            "bucket_order": self.bucket_order,
        }


@dataclass(frozen=True)
class BucketInfo:
    """One DDP allreduce bucket of a plan.

    index: position in DDP order (bucket 0 holds the gradients ready first,
        i.e. the parameters used last in forward).
    bytes: the bytes the planner counted for it (numel*element size in ddp
        mode, storage bytes per use in torch mode).
    param_names: fully qualified names, in gradient-ready order.
    piece: the piece whose backward completes the bucket.
    extended: its cut moved so that the piece has an output.
    """

    index: int
    bytes: int
    param_names: tuple[str, ...]
    piece: int
    extended: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "bytes": self.bytes,
            "param_names": list(self.param_names),
            "piece": self.piece,
            "extended": self.extended,
        }


@dataclass
class GraphPlan:
    """Where goddp cuts one graph, as planned by the Go core.

    fingerprint: a 64-bit hash of the plan, equal on every rank for equal
        graphs and settings.
    mode: "ddp" or "torch".
    num_pieces: how many pieces the graph is cut into.
    node_pieces: FX node name -> piece index (-1 for placeholders and output).
    buckets: BucketInfo list in DDP order.
    caps: the PlanSettings used (caps, max_pieces, align_buckets).
    piece_inputs / piece_outputs: per piece, the names of the nodes that cross
        into / out of it (the planner's crossing values, ascending node order).
    alignment: how the buckets relate to DDP's (ALIGNMENT_NAMES): "none"
        (predicted), "ready-order caps" (for DDP's rebuild),
        "declaration-order caps" (for the buckets DDP keeps under
        find_unused_parameters=True), or "declaration-order caps, pieces
        merged" (merged_cuts cuts dropped where no bucket could start).
    ddp_caps: with alignment, the per-bucket caps (bytes) to give DDP, in
        the order DDP walks them.
    """

    fingerprint: int
    mode: str
    num_pieces: int
    node_pieces: dict[str, int]
    buckets: list[BucketInfo]
    caps: PlanSettings
    piece_inputs: list[list[str]] = field(default_factory=list)
    piece_outputs: list[list[str]] = field(default_factory=list)
    alignment: str = "none"
    ddp_caps: list[int] = field(default_factory=list)
    merged_cuts: int = 0
    # Index form of the crossing values, for the cutter (not public API).
    piece_input_indices: list[list[int]] = field(default_factory=list, repr=False)
    piece_output_indices: list[list[int]] = field(default_factory=list, repr=False)
    # ddp mode: per piece, the bucketed parameters first used in it.
    first_use_param_names: list[list[str]] | None = field(default=None, repr=False)

    def piece_param_names(self) -> list[list[str]]:
        """Per piece in forward order, the names of its parameters in forward
        order. ddp mode: the bucketed parameters first used in the piece (a
        bucket may span several pieces). torch mode: the parameters of the
        bucket the piece completes, as torch counts them (a tied weight in
        each bucket that uses it)."""
        if self.first_use_param_names is not None:
            return [list(names) for names in self.first_use_param_names]
        per_piece: list[list[str]] = [[] for _ in range(self.num_pieces)]
        # Buckets are in DDP order (last piece first) and list parameters in
        # gradient-ready order; walking both backwards gives forward order.
        for bucket in reversed(self.buckets):
            if 0 <= bucket.piece < self.num_pieces:
                per_piece[bucket.piece].extend(reversed(bucket.param_names))
        return per_piece

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary (node map omitted: it can be large)."""
        piece_params = self.piece_param_names()
        nodes_per_piece = Counter(self.node_pieces.values())
        pieces = []
        for p in range(self.num_pieces):
            pieces.append(
                {
                    "index": p,
                    "num_nodes": nodes_per_piece.get(p, 0),
                    "inputs": list(self.piece_inputs[p]) if p < len(self.piece_inputs) else [],
                    "outputs": list(self.piece_outputs[p]) if p < len(self.piece_outputs) else [],
                    "param_names": piece_params[p],
                }
            )
        return {
            "fingerprint": self.fingerprint,
            "fingerprint_hex": f"{self.fingerprint:016x}",
            "mode": self.mode,
            "num_pieces": self.num_pieces,
            "caps": self.caps.to_dict(),
            "buckets": [b.to_dict() for b in self.buckets],
            "pieces": pieces,
            "alignment": self.alignment,
            "ddp_caps": list(self.ddp_caps),
            "merged_cuts": self.merged_cuts,
        }


def native_config(mode: str, caps: PlanSettings) -> dict[str, Any]:
    """The goddp_config fields for _native.plan_graph."""
    return {
        "mode": MODE_CODES[mode],
        "bucket_cap_bytes": int(caps.bucket_cap_bytes),
        "first_bucket_cap_bytes": int(caps.first_bucket_cap_bytes),
        "bucket_caps_bytes": [int(c) for c in caps.bucket_caps_bytes],
        "max_pieces": int(caps.max_pieces or 0),
        "align_buckets": int(caps.align_buckets),
        "bucket_order": BUCKET_ORDER_CODES[caps.bucket_order],
    }


def _ints(raw: Any, code: str) -> list[int]:
    if raw is None:
        return []
    if isinstance(raw, (bytes, bytearray, memoryview)):
        view = memoryview(raw)
        if view.nbytes == 0:
            return []
        return view.cast("B").cast(code).tolist()
    return list(raw)


def _csr(offsets: list[int], values: list[int], count: int) -> list[list[int]]:
    if not offsets:
        return [[] for _ in range(count)]
    return [values[offsets[i]: offsets[i + 1]] for i in range(count)]


def call_planner(exported: ExportedGraph, mode: str, caps: PlanSettings) -> dict[str, Any]:
    """Runs the Go planner. Loads the extension on first use (never at import,
    so that fork-based workers created before it are unaffected)."""
    return _native.plan_graph(exported.arrays, native_config(mode, caps))


def decode_plan(raw: Mapping[str, Any], exported: ExportedGraph, mode: str, caps: PlanSettings) -> GraphPlan:
    """Turns the planner's flat reply into a GraphPlan, checking its shape."""
    num_nodes = int(raw["num_nodes"])
    if num_nodes != len(exported.nodes):
        raise RuntimeError(
            f"goddp planner returned {num_nodes} node entries for a graph of {len(exported.nodes)} nodes"
        )
    num_pieces = int(raw["num_pieces"])
    num_buckets = int(raw["num_buckets"])
    piece_of_node = _ints(raw["node_pieces"], "i")
    if len(piece_of_node) != num_nodes:
        raise RuntimeError("goddp planner returned a node_pieces array of the wrong length")

    bucket_bytes = _ints(raw["bucket_bytes"], "q")
    bucket_pieces = _ints(raw["bucket_pieces"], "i")
    bucket_extended = _ints(raw["bucket_extended"], "B")
    bucket_param_offsets = _ints(raw["bucket_param_offsets"], "q")
    bucket_params = _ints(raw["bucket_params"], "i")
    bucket_param_lists = _csr(bucket_param_offsets, bucket_params, num_buckets)
    names = exported.param_names
    buckets = [
        BucketInfo(
            index=b,
            bytes=bucket_bytes[b],
            param_names=tuple(names[i] for i in bucket_param_lists[b]),
            piece=bucket_pieces[b],
            extended=bool(bucket_extended[b]),
        )
        for b in range(num_buckets)
    ]

    inputs = _csr(_ints(raw["piece_input_offsets"], "q"), _ints(raw["piece_inputs"], "i"), num_pieces)
    outputs = _csr(_ints(raw["piece_output_offsets"], "q"), _ints(raw["piece_outputs"], "i"), num_pieces)
    nodes = exported.nodes
    first_use_names = None
    if mode == "ddp":
        first_use_names = _first_use_names(exported, piece_of_node, bucket_param_lists, num_pieces)
    return GraphPlan(
        fingerprint=int(raw["fingerprint"]),
        mode=mode,
        num_pieces=num_pieces,
        node_pieces={node.name: piece_of_node[i] for i, node in enumerate(nodes)},
        buckets=buckets,
        caps=caps,
        piece_inputs=[[nodes[i].name for i in ins] for ins in inputs],
        piece_outputs=[[nodes[i].name for i in outs] for outs in outputs],
        piece_input_indices=inputs,
        piece_output_indices=outputs,
        first_use_param_names=first_use_names,
        alignment=ALIGNMENT_NAMES.get(int(raw.get("alignment", 0)), "unknown"),
        ddp_caps=_ints(raw.get("ddp_caps"), "q"),
        merged_cuts=int(raw.get("merged_cuts", 0)),
    )


def _first_use_names(
    exported: ExportedGraph, piece_of_node: list[int], bucket_params: list[list[int]], num_pieces: int
) -> list[list[str]]:
    """Per piece, the names of the bucketed parameters whose first use (the
    first node referring to them, as ddp mode counts) is in that piece."""
    pending = {i for ids in bucket_params for i in ids}
    per_piece: list[list[str]] = [[] for _ in range(num_pieces)]
    offsets, refs = exported.arrays["node_param_offsets"], exported.arrays["node_params"]
    for node, piece in enumerate(piece_of_node):
        for k in range(offsets[node], offsets[node + 1]):
            p = refs[k]
            if p in pending and piece >= 0:
                per_piece[piece].append(exported.param_names[p])
                pending.discard(p)
    return per_piece


def resolve_caps(
    mode: str,
    bucket_cap_bytes: int | None,
    first_bucket_cap_bytes: int | None,
    bucket_caps_bytes: Iterable[int] = (),
    max_pieces: int | None = None,
    align_buckets: bool = False,
    *,
    ddp_first_bucket_cap_bytes: int | None = None,
) -> PlanSettings:
    """The one place that fills in cap defaults, the way DDP (ddp mode) or
    DDPOptimizer (torch mode) would, without deciding anything about cuts.

    ddp_first_bucket_cap_bytes: the first-bucket cap a real DDP module uses,
    when there is one (goddp.ddp.settings); without it the DDP rule applies.
    """
    cap_given = bucket_cap_bytes is not None
    cap = int(bucket_cap_bytes) if cap_given else DEFAULT_BUCKET_CAP_BYTES
    first = default_first_bucket_cap(
        mode, cap, cap_is_default=not cap_given, ddp_first_bucket_cap_bytes=ddp_first_bucket_cap_bytes
    ) if first_bucket_cap_bytes is None else int(first_bucket_cap_bytes)
    return PlanSettings(cap, first, tuple(int(c) for c in bucket_caps_bytes), max_pieces, align_buckets)


def default_first_bucket_cap(
    mode: str, cap: int, *, cap_is_default: bool, ddp_first_bucket_cap_bytes: int | None = None
) -> int:
    """The first bucket's cap when nobody gave one.

    torch mode: DDPOptimizer always uses 1 MiB (it asserts when that exceeds
    the cap; goddp clamps instead). ddp mode: DDP's own first cap when known,
    else DDP's rule (1 MiB with the default cap, else the cap itself), never
    above the cap.
    """
    if mode == "torch":
        return min(DEFAULT_FIRST_BUCKET_BYTES, cap)
    first = ddp_first_bucket_cap_bytes
    if first is None:
        first = DEFAULT_FIRST_BUCKET_BYTES if cap_is_default else cap
    return min(int(first), cap)


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
        as the backend does by default (goddp.graph.blocks).
    declaration_order: the names of DDP's parameters in DDP's own order
        (``goddp.ddp.declaration.ddp_parameter_names(ddp)``) when DDP never
        rebuilds its buckets (find_unused_parameters=True without
        static_graph): with align_buckets, the plan then aligns DDP's
        declaration-order buckets (GraphPlan.alignment, ddp_caps).

    Raises ValueError for a bad mode or max_pieces; the planner's errors
    (goddp._goddp.PlannerError) for an invalid graph or caps.
    """
    check_mode(mode)
    check_ddp_mode_only(mode, check_max_pieces(max_pieces), align_buckets, block_cuts)
    caps = resolve_caps(mode, bucket_cap_bytes, first_bucket_cap_bytes, bucket_caps_bytes, max_pieces, align_buckets)
    exported = export_graph(gm, param_name_of=_name_lookup(param_names), ignored_names=ignored, block_cuts=block_cuts)
    if declaration_order is not None:
        caps = replace(caps, bucket_order="declaration")
        exported = with_ddp_positions(exported, list(declaration_order))
    return decode_plan(call_planner(exported, mode, caps), exported, mode, caps)

