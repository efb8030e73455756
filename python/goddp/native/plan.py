"""Plans: the request to the Go planner and its answer, as Python objects.

Nothing here decides anything: the Go planner does, in one call per graph
(planner/decide.go, Note [One call]). This module packs the request (the
graph's arrays plus what the user and the DDP module said,
``PlanRequest``), calls ``extension.plan_graph`` and turns the flat reply
into a ``GraphPlan`` that names nodes, pieces and parameters. The reply's
fields are goddp_plan's (csrc/goddp.h); ``GraphPlan`` keeps their names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import fx, nn

from goddp.native import extension as _native
from goddp.graph.export import ExportedGraph, export_graph, parameter_names, with_ddp_positions
from goddp.options import check_ddp_mode_only, check_max_pieces, check_mode

MIB = 1 << 20

MODE_CODES = {"ddp": _native.MODE_DDP, "torch": _native.MODE_TORCH}
# enum goddp_bucket_order: the order DDP fills the buckets it reduces with;
# "declaration" when it never rebuilds them (see Note [Declaration order]
# in planner/declorder.go).
BUCKET_ORDER_CODES = {"ready": _native.ORDER_READY, "declaration": _native.ORDER_DECLARATION}
BUCKET_ORDER_NAMES = {code: name for name, code in BUCKET_ORDER_CODES.items()}
# enum goddp_edges: option edges (planner/edges.go, Note [Edges]).
EDGE_CODES = {"compile": _native.EDGES_COMPILE, "auto": _native.EDGES_AUTO, "eager": _native.EDGES_EAGER}


@dataclass(frozen=True)
class AlignmentFacts:
    """Facts about a DDP module that refuse alignment, as goddp.ddp.refusals
    reads them; which one (if any) refuses is the planner's decision, in its
    words (Note [Alignment refusals] in planner/refusals.go)."""

    no_per_bucket_caps: bool = False  # this torch's DDP keeps none (torch < 2.9)
    python_reducer: bool = False
    mixed_precision: bool = False
    builtin_comm_hook: bool = False
    delays_allreduce: bool = False  # delay_all_reduce_named_params
    several_param_groups: bool = False  # (dtype, device) groups

    def flags(self) -> int:
        """The goddp_ddp.flags bits."""
        bits = (
            (self.no_per_bucket_caps, _native.DDP_NO_PER_BUCKET_CAPS),
            (self.python_reducer, _native.DDP_PYTHON_REDUCER),
            (self.mixed_precision, _native.DDP_MIXED_PRECISION),
            (self.builtin_comm_hook, _native.DDP_BUILTIN_COMM_HOOK),
            (self.delays_allreduce, _native.DDP_DELAYS_ALLREDUCE),
            (self.several_param_groups, _native.DDP_SEVERAL_PARAM_GROUPS),
        )
        return sum(bit for fact, bit in bits if fact)


@dataclass(frozen=True)
class DDPRequest:
    """What the planner needs to know about the DDP module (goddp_ddp): its
    own bucket settings and flags, read by goddp.ddp.settings, and, when
    goddp asks to align DDP's buckets, how many parameters it reduces."""

    bucket_cap_bytes: int
    first_bucket_cap_bytes: int | None  # None: this torch keeps none
    bucket_caps_bytes: tuple[int, ...] = ()
    cap_is_default: bool = False
    find_unused_parameters: bool = False
    static_graph: bool = False
    num_params: int = 0  # 0: unknown (no coverage check)
    facts: AlignmentFacts = AlignmentFacts()

    def to_native(self) -> dict[str, Any]:
        flags = (
            (_native.DDP_FIND_UNUSED_PARAMETERS if self.find_unused_parameters else 0)
            | (_native.DDP_STATIC_GRAPH if self.static_graph else 0)
            | (_native.DDP_CAP_IS_DEFAULT if self.cap_is_default else 0)
            | self.facts.flags()
        )
        return {
            "bucket_cap_bytes": int(self.bucket_cap_bytes),
            "first_bucket_cap_bytes": None if self.first_bucket_cap_bytes is None else int(self.first_bucket_cap_bytes),
            "bucket_caps_bytes": [int(c) for c in self.bucket_caps_bytes],
            "flags": flags,
            "num_params": int(self.num_params),
        }


@dataclass(frozen=True)
class PlanRequest:
    """One planning request besides the graph: the user's settings (None:
    not given, the planner fills it in, Note [Cap defaults] in
    planner/settings.go) and the DDP module's, when planning inside one.

    align_buckets asks for DDP's buckets to be set to the pieces; the reply
    says whether they are (GraphPlan.caps.align_buckets, not_aligned).
    bucket_order is an explicit choice without a DDP module; with one the
    planner derives it from DDP's flags. edges: "compile", "auto" or
    "eager" (option edges)."""

    mode: str = "ddp"
    bucket_cap_bytes: int | None = None
    first_bucket_cap_bytes: int | None = None
    bucket_caps_bytes: tuple[int, ...] = ()
    max_pieces: int | None = None
    align_buckets: bool = False
    bucket_order: str = "ready"
    block_cuts: bool = False
    edges: str = "compile"
    ddp: DDPRequest | None = None
    # Every bucket under the bucket cap (Note [Uniform caps] in
    # planner/regions.go): one checkpoint body planned alone.
    uniform_caps: bool = False

    def to_native(self) -> dict[str, Any]:
        """The goddp_config fields for extension.plan_graph."""
        return {
            "mode": MODE_CODES[self.mode],
            "bucket_cap_bytes": None if self.bucket_cap_bytes is None else int(self.bucket_cap_bytes),
            "first_bucket_cap_bytes": None if self.first_bucket_cap_bytes is None else int(self.first_bucket_cap_bytes),
            "bucket_caps_bytes": [int(c) for c in self.bucket_caps_bytes],
            "max_pieces": int(self.max_pieces or 0),
            "align_buckets": int(self.align_buckets),
            "bucket_order": BUCKET_ORDER_CODES[self.bucket_order],
            "block_cuts": int(self.block_cuts),
            "edges": EDGE_CODES[self.edges],
            "ddp": None if self.ddp is None else self.ddp.to_native(),
            "uniform_caps": int(self.uniform_caps),
        }

    def to_dict(self) -> dict[str, Any]:
        """The "caps" of a record whose graph was never planned: what was
        asked, under PlanSettings' keys (None where only a plan says)."""
        return {
            "bucket_cap_bytes": self.bucket_cap_bytes,
            "first_bucket_cap_bytes": self.first_bucket_cap_bytes,
            "bucket_caps_bytes": list(self.bucket_caps_bytes),
            "max_pieces": self.max_pieces,
            "align_buckets": False,
            "bucket_order": self.bucket_order,
        }


@dataclass(frozen=True)
class PlanSettings:
    """What a plan stands for besides the graph, as the planner resolved it:
    the bucket caps in bytes and the ddp-mode settings that shape pieces
    (reported under the "caps" key of plan dicts, and as GraphPlan.caps).
    align_buckets says whether DDP's buckets are to be set to the pieces."""

    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    bucket_caps_bytes: tuple[int, ...] = ()
    max_pieces: int | None = None
    # ddp mode: one bucket per piece with its exact byte total, to be
    # installed as DDP's per-bucket caps (docs/align.md).
    align_buckets: bool = False
    # "ready" or "declaration" (BUCKET_ORDER_CODES).
    bucket_order: str = "ready"

    @classmethod
    def from_reply(cls, raw: Mapping[str, Any]) -> "PlanSettings":
        return cls(
            bucket_cap_bytes=int(raw["bucket_cap_bytes"]),
            first_bucket_cap_bytes=int(raw["first_bucket_cap_bytes"]),
            bucket_caps_bytes=tuple(_ints(raw["bucket_caps_bytes"], "q")),
            max_pieces=int(raw["max_pieces"]) or None,
            align_buckets=bool(raw["align_buckets"]),
            bucket_order=BUCKET_ORDER_NAMES[int(raw["bucket_order"])],
        )

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
    caps: the PlanSettings the plan stands for (resolved caps, max_pieces,
        align_buckets: whether DDP's buckets are to be the pieces).
    piece_inputs / piece_outputs: per piece, the names of the nodes that cross
        into / out of it (the planner's crossing values, ascending node order).
    alignment: how the buckets relate to DDP's, in the planner's words
        (Alignment.String, goddp_plan.alignment_name): "none" (predicted),
        "ready-order caps" (for DDP's rebuild), "declaration-order caps"
        (for the buckets DDP keeps under find_unused_parameters=True), or
        "declaration-order caps, pieces merged" (merged_cuts cuts dropped
        where no bucket could start).
    ddp_caps: when aligned, the per-bucket caps (bytes, each at least 1) to
        give DDP, in the order DDP walks them.
    not_aligned: why DDP's buckets are not the pieces, in the planner's
        words (goddp_plan.align_detail; align_reason its code), None when
        they are.
    piece_params: per piece in forward order, its parameters' names in
        forward order (goddp_plan.piece_params; see piece_param_names).
    num_counted_params: the parameters of the graph that DDP reduces.
    eager_pieces: the edge pieces to run eagerly (option edges).
    node_block_ids: per node, its repeated block (-1: none), None when the
        planner found no blocks (or block cuts are off).
    ddp_bucket_order: the order in which the DDP module fills its own
        buckets, from its flags, aligned or not ("ready" outside DDP;
        goddp_plan.ddp_bucket_order).
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
    not_aligned: str | None = None
    align_reason: int = _native.REASON_OFF
    piece_params: list[list[str]] = field(default_factory=list, repr=False)
    num_counted_params: int = 0
    eager_pieces: list[int] = field(default_factory=list)
    node_block_ids: list[int] | None = field(default=None, repr=False)
    ddp_bucket_order: str = "ready"
    # Index form of the crossing values, for the cutter (not public API).
    piece_input_indices: list[list[int]] = field(default_factory=list, repr=False)
    piece_output_indices: list[list[int]] = field(default_factory=list, repr=False)

    def piece_param_names(self) -> list[list[str]]:
        """Per piece in forward order, the names of its parameters in forward
        order. ddp mode: the bucketed parameters first used in the piece (a
        bucket may span several pieces). torch mode: the parameters of the
        bucket the piece completes, as torch counts them (a tied weight in
        each bucket that uses it)."""
        return [list(names) for names in self.piece_params]

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


def call_planner(exported: ExportedGraph, request: PlanRequest) -> dict[str, Any]:
    """Runs the Go planner, once. Loads the extension on first use (never at
    import, so that fork-based workers created before it are unaffected)."""
    return _native.plan_graph(exported.arrays, request.to_native())


def plan(exported: ExportedGraph, request: PlanRequest) -> GraphPlan:
    """Plans an exported graph: one call into the planner, decoded."""
    return decode_plan(call_planner(exported, request), exported, request.mode)


def decode_plan(raw: Mapping[str, Any], exported: ExportedGraph, mode: str) -> GraphPlan:
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
    bucket_param_lists = _csr(_ints(raw["bucket_param_offsets"], "q"), _ints(raw["bucket_params"], "i"), num_buckets)
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
    piece_params = _csr(_ints(raw["piece_param_offsets"], "q"), _ints(raw["piece_params"], "i"), num_pieces)
    nodes = exported.nodes
    reason = int(raw["align_reason"])
    blocks = raw["node_block_ids"]
    return GraphPlan(
        fingerprint=int(raw["fingerprint"]),
        mode=mode,
        num_pieces=num_pieces,
        node_pieces={node.name: piece_of_node[i] for i, node in enumerate(nodes)},
        buckets=buckets,
        caps=PlanSettings.from_reply(raw),
        piece_inputs=[[nodes[i].name for i in ins] for ins in inputs],
        piece_outputs=[[nodes[i].name for i in outs] for outs in outputs],
        piece_input_indices=inputs,
        piece_output_indices=outputs,
        alignment=str(raw["alignment_name"]),
        ddp_caps=_ints(raw["ddp_caps"], "q"),
        merged_cuts=int(raw["merged_cuts"]),
        not_aligned=None if reason == _native.REASON_ALIGNED else str(raw["align_detail"]),
        align_reason=reason,
        piece_params=[[names[i] for i in ids] for ids in piece_params],
        num_counted_params=int(raw["num_counted_params"]),
        eager_pieces=_ints(raw["eager_pieces"], "i"),
        node_block_ids=None if blocks is None else _ints(blocks, "i"),
        ddp_bucket_order=BUCKET_ORDER_NAMES[int(raw["ddp_bucket_order"])],
    )


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
    (goddp._goddp.PlannerError) for an invalid graph or caps.
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
