"""Plans: the request to the Go planner and its answer, as Python objects.

Nothing here decides anything: the Go planner does, in one call per graph
(planner/decide.go, Note [One call]). This module is pure conversion: the
request besides the graph (what the user and the DDP module said,
``PlanRequest``) as goddp_config's fields, and the flat reply as a
``GraphPlan`` that names nodes, pieces and parameters, its codes in words
(``not_aligned_words``, ``ALIGNMENT_NAMES``: the reply is numbers and
codes, ABI 11). The reply's fields are goddp_plan's (csrc/goddp.h);
``GraphPlan`` keeps their names. goddp.compile.plan exports, calls and
decodes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from goddp.native import extension as _native

MODE_CODES = {"ddp": _native.MODE_DDP, "torch": _native.MODE_TORCH}
# enum goddp_bucket_order: the order DDP fills the buckets it reduces with;
# "declaration" when it never rebuilds them (see Note [Declaration order]
# in planner/declorder.go).
BUCKET_ORDER_CODES = {"ready": _native.ORDER_READY, "declaration": _native.ORDER_DECLARATION}
BUCKET_ORDER_NAMES = {code: name for name, code in BUCKET_ORDER_CODES.items()}
# enum goddp_edges: option edges (planner/edges.go, Note [Edges]).
EDGE_CODES = {"compile": _native.EDGES_COMPILE, "auto": _native.EDGES_AUTO, "eager": _native.EDGES_EAGER}
# enum goddp_alignment: how a plan's buckets relate to DDP's, as plan records
# and the plan table name it (GraphPlan.alignment).
ALIGNMENT_NAMES = {
    _native.ALIGN_NONE: "none",
    _native.ALIGN_READY: "ready-order caps",
    _native.ALIGN_DECLARATION: "declaration-order caps",
    _native.ALIGN_DECLARATION_MERGED: "declaration-order caps, pieces merged",
    _native.ALIGN_READY_GROUPS: "ready-order caps per dtype group",
    _native.ALIGN_DECLARATION_GROUPS: "declaration-order caps per dtype group",
}
READY_GROUPS = ALIGNMENT_NAMES[_native.ALIGN_READY_GROUPS]
DECLARATION_GROUPS = ALIGNMENT_NAMES[_native.ALIGN_DECLARATION_GROUPS]

# enum goddp_align_reason: why DDP's buckets are not the pieces, as plan
# records and logs say it (GraphPlan.not_aligned; the refusals are Note
# [Alignment refusals] in planner/refusals.go).
_NOT_ALIGNED = {
    _native.REASON_OFF: "off (align_buckets=False or mode='torch')",
    _native.REASON_ONE_PIECE: "one piece: nothing to align",
    _native.REASON_NO_PARAMS: "no parameters in this graph",
    _native.REASON_NO_PER_BUCKET_CAPS: "this torch's DDP has no per-bucket caps (needs torch >= 2.9)",
    _native.REASON_PYTHON_REDUCER: "DDP uses the Python reducer, which has no per-bucket caps",
    _native.REASON_MIXED_PRECISION: "DDP mixed precision is on",
    _native.REASON_BUILTIN_COMM_HOOK: "a built-in comm hook that goddp cannot identify is registered",
    _native.REASON_GROUPS_LATER: (
        "parameters span several (dtype, device) groups, which DDP buckets against shared caps: caps that "
        "close every group's buckets at the cuts would launch them later than DDP's own buckets (docs/limits.md)"
    ),
}


def not_aligned_words(reason: int, aligned_params: int = 0, ddp_params: int = 0) -> str | None:
    """Why DDP's buckets are not the pieces (goddp_plan.align_reason), None
    when they are. aligned_params (goddp_plan.aligned_params) and
    ddp_params (goddp_ddp.num_params) count the parameters of a graph that
    holds only part of DDP's."""
    if reason == _native.REASON_ALIGNED:
        return None
    if reason in (_native.REASON_NOT_COVERED, _native.REASON_PART_OF_FORWARD):
        words = (
            f"the graph uses {aligned_params} of DDP's {ddp_params} parameters (a graph break, or parameters "
            "used outside this graph); DDP buckets the whole model"
        )
        if reason == _native.REASON_PART_OF_FORWARD:
            words += "; planned with the forward's other graphs at the module's next training call"
        return words
    return _NOT_ALIGNED.get(reason, f"unknown reason {reason}")


@dataclass(frozen=True)
class AlignmentFacts:
    """Facts about a DDP module that refuse alignment, as goddp.ddp.refusals
    reads them; which one (if any) refuses is the planner's decision (Note
    [Alignment refusals] in planner/refusals.go), worded by
    not_aligned_words."""

    no_per_bucket_caps: bool = False  # this torch's DDP keeps none (torch < 2.9)
    python_reducer: bool = False
    mixed_precision: bool = False
    builtin_comm_hook: bool = False  # one goddp cannot identify (Note [Built-in comm hooks])

    def flags(self) -> int:
        """The goddp_ddp.flags bits."""
        bits = (
            (self.no_per_bucket_caps, _native.DDP_NO_PER_BUCKET_CAPS),
            (self.python_reducer, _native.DDP_PYTHON_REDUCER),
            (self.mixed_precision, _native.DDP_MIXED_PRECISION),
            (self.builtin_comm_hook, _native.DDP_BUILTIN_COMM_HOOK),
        )
        return sum(bit for fact, bit in bits if fact)


def _cap(value: int | None) -> int | None:
    """A cap as the binding reads it: an int, or None for not given (it
    becomes GODDP_CAP_NOT_GIVEN there, the one conversion)."""
    return None if value is None else int(value)


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
            "first_bucket_cap_bytes": _cap(self.first_bucket_cap_bytes),
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
            "bucket_cap_bytes": _cap(self.bucket_cap_bytes),
            "first_bucket_cap_bytes": _cap(self.first_bucket_cap_bytes),
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
    alignment: how the buckets relate to DDP's (goddp_plan.alignment, named
        by ALIGNMENT_NAMES): "none" (predicted),
        "ready-order caps" (for DDP's rebuild), "declaration-order caps"
        (for the buckets DDP keeps under find_unused_parameters=True), or
        "declaration-order caps, pieces merged" (merged_cuts cuts dropped
        where no bucket could start), or "ready-order caps per dtype group"
        (buckets per (dtype, device) group against shared caps; merged_cuts
        piece ends at which no group's bucket closes: each runs on to a
        later one or stays open), or "declaration-order caps per dtype
        group" (the same in declaration order; merged_cuts cuts dropped
        where no bucket launches).
    ddp_caps: when aligned, the per-bucket caps (bytes, each at least 1) to
        give DDP, in the order DDP walks them.
    not_aligned: why DDP's buckets are not the pieces, in goddp's words
        (not_aligned_words of align_reason, the code, and aligned_params),
        None when they are.
    aligned_params: with align_reason NOT_COVERED or PART_OF_FORWARD, the
        parameters the aligned buckets held (goddp_plan.aligned_params).
    piece_params: per piece in forward order, its parameters' names in
        forward order (goddp_plan.piece_params; see piece_param_names).
    num_counted_params: the parameters of the graph that DDP reduces.
    eager_pieces: the edge pieces to run eagerly (option edges).
    node_block_ids: per node, its repeated block (-1: none), None when the
        planner found no blocks (or block cuts are off).
    ddp_bucket_order: the order in which the DDP module fills its own
        buckets, from its flags, aligned or not ("ready" outside DDP;
        goddp_plan.ddp_bucket_order).
    block_runs: the pieces begin only at block runs (ddp mode, two block
        runs or more, not declaration order; goddp_plan.block_runs): the
        checkpoint splitter reads it (Note [Checkpoint bodies]).
    checkpoint_regions: with uniform_caps (one checkpoint body planned
        alone), split the body into one checkpoint region per piece
        (goddp_plan.checkpoint_regions, Note [Uniform caps]).
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
    aligned_params: int = 0
    piece_params: list[list[str]] = field(default_factory=list, repr=False)
    num_counted_params: int = 0
    eager_pieces: list[int] = field(default_factory=list)
    node_block_ids: list[int] | None = field(default=None, repr=False)
    ddp_bucket_order: str = "ready"
    block_runs: bool = False
    checkpoint_regions: bool = False
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


def decode_plan(
    raw: Mapping[str, Any], node_names: Sequence[str], param_names: Sequence[str], request: PlanRequest
) -> GraphPlan:
    """Turns the planner's flat reply for a graph of node_names (forward
    order) and param_names (its parameter table) planned under request into
    a GraphPlan, checking its shape."""
    num_nodes = int(raw["num_nodes"])
    if num_nodes != len(node_names):
        raise RuntimeError(
            f"goddp planner returned {num_nodes} node entries for a graph of {len(node_names)} nodes"
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
    names = param_names
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
    reason = int(raw["align_reason"])
    blocks = raw["node_block_ids"]
    ddp_params = 0 if request.ddp is None else request.ddp.num_params
    alignment, aligned_params = int(raw["alignment"]), int(raw["aligned_params"])
    return GraphPlan(
        fingerprint=int(raw["fingerprint"]),
        mode=request.mode,
        num_pieces=num_pieces,
        node_pieces={name: piece_of_node[i] for i, name in enumerate(node_names)},
        buckets=buckets,
        caps=PlanSettings.from_reply(raw),
        piece_inputs=[[node_names[i] for i in ins] for ins in inputs],
        piece_outputs=[[node_names[i] for i in outs] for outs in outputs],
        piece_input_indices=inputs,
        piece_output_indices=outputs,
        alignment=ALIGNMENT_NAMES.get(alignment, f"unknown alignment {alignment}"),
        ddp_caps=_ints(raw["ddp_caps"], "q"),
        merged_cuts=int(raw["merged_cuts"]),
        not_aligned=not_aligned_words(reason, aligned_params, ddp_params),
        align_reason=reason,
        aligned_params=aligned_params,
        piece_params=[[names[i] for i in ids] for ids in piece_params],
        num_counted_params=int(raw["num_counted_params"]),
        eager_pieces=_ints(raw["eager_pieces"], "i"),
        node_block_ids=None if blocks is None else _ints(blocks, "i"),
        ddp_bucket_order=BUCKET_ORDER_NAMES[int(raw["ddp_bucket_order"])],
        block_runs=bool(raw["block_runs"]),
        checkpoint_regions=bool(raw["checkpoint_regions"]),
    )
