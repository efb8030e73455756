"""The in-process record of plans made by the backend (goddp.last_plans())."""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from goddp.tools import structured

# Enough for any realistic number of recompilations, bounded so that a
# long job that recompiles often does not grow without limit.
MAX_RECORDS = 1024

TIMING_KEYS = ("export", "plan", "cut", "example_inputs", "identify", "compile", "stitch")


def new_timings() -> dict[str, float]:
    """Seconds per phase, all zero (GraphRecord.timings)."""
    return dict.fromkeys(TIMING_KEYS, 0.0)


@dataclasses.dataclass(kw_only=True)
class GraphRecord:
    """What the backend did with one graph; last_plans() lists these as
    dicts (the fields below, in this order; see last_plans for each)."""

    fingerprint: int | None = None
    mode: str
    caps: dict[str, Any]
    num_pieces: int = 1
    distinct_pieces: int = 1
    reused_pieces: int = 0
    eager_pieces: int = 0
    block_cuts: bool = False
    pieces: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    buckets: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=new_timings)
    fallback: str | None = None
    plan_check: dict[str, Any] | None = None
    graph: dict[str, int | None]
    # plan_check and ddp_buckets are filled in at the first training call,
    # after the record was added (goddp.ranks.agreement).
    ddp_buckets: dict[str, Any] | None = None
    inner: str
    alignment: str = "none"
    ddp_caps: list[int] = dataclasses.field(default_factory=list)
    merged_cuts: int = 0
    frame: dict[str, Any] | None = None
    fallback_stage: str | None = None
    ddp_module: dict[str, Any] | None = None
    # Filled in at the agreement of a forward planned across graphs.
    forward: dict[str, Any] | None = None
    # bucket_cap_mb="auto": what it measured and chose (goddp.ranks.auto).
    auto_buckets: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A deep, JSON-serialisable copy."""
        return dataclasses.asdict(self)


_lock = threading.Lock()
_records: "collections.deque[GraphRecord]" = collections.deque(maxlen=MAX_RECORDS)


def add_record(record: GraphRecord) -> None:
    """Keeps record, and writes it to torch's structured trace when one is
    written (Note [Structured trace artifacts] in goddp.tools.structured)."""
    with _lock:
        _records.append(record)
    structured.plan(record)


def last_plans() -> list[dict[str, Any]]:
    """Plans of the graphs the goddp backend compiled in this process (inside
    a DDP forward), oldest first. Each is a JSON-serialisable dict with these
    keys (a copy: changing it changes nothing):

    - fingerprint: the plan's 64-bit fingerprint (int), or None when
      planning failed.
    - mode: goddp's cutting mode, "ddp" or "torch".
    - caps: the settings planned with, as the planner resolved them (when
      no plan was made, export or planning failed, the request instead:
      the user's options, None where the user gave none, which the planner
      would have filled in from DDP's settings, and align_buckets False):
      bucket_cap_bytes, first_bucket_cap_bytes, bucket_caps_bytes,
      max_pieces, align_buckets, bucket_order.
    - num_pieces: how many pieces the graph was cut into (1: not cut).
    - distinct_pieces: how many different pieces the graph has; identical
      pieces share one compile (goddp.graph.blocks).
    - reused_pieces: how many pieces run the compiled code of an identical
      earlier piece.
    - eager_pieces: how many pieces run eagerly instead of through the
      inner compiler: the edges, pieces wholly outside the repeated blocks
      (option edges; see Note [Edges] in planner/edges.go). The inner compiler ran
      distinct_pieces - eager_pieces times.
    - block_cuts: whether the graph was planned with block-aligned cuts.
    - pieces: per piece (param_names in ddp mode are the parameters first
      used in it; same_as is the piece whose compiled code it runs, itself
      unless reused; eager says whether it runs eagerly): index,
      num_nodes, inputs, outputs, param_names, same_as, eager.
    - buckets: per DDP bucket: index, bytes, param_names, piece, extended.
    - timings: seconds spent in export, plan, cut, example_inputs,
      identify, compile, stitch.
    - fallback: None, or why the whole graph was compiled instead.
    - plan_check: None until the graph's first training call, for graphs
      compiled with gradients disabled, and for a stand-in DDP; then what
      the ranks of the DDP module's process group said and decided there
      (aligned, action, caps, layout_digest, reason, ranks (each rank's
      fingerprint, pieces, layout_digest, caps, reason, later), group,
      size, seconds; goddp.ranks.verdict, Note [Agreeing on DDP's layout]),
      or, for a later graph of a decided module, that it followed that
      decision (aligned, followed).
    - graph: sizes of the Dynamo graph (num_params is None when export
      failed): num_nodes, num_params.
    - ddp_buckets: whether DDP's buckets were set to the pieces:
      {"aligned": bool, "reason": None or why not}; None when planning
      failed. Until the first training call it holds this rank's proposal;
      then the decision of every rank of the DDP module's group.
    - inner: the inner compiler's name.
    - alignment: which caps set DDP's buckets to the pieces: "none",
      "ready-order caps" (DDP rebuilds its buckets), "declaration-order
      caps" (find_unused_parameters=True: DDP keeps declaration-order
      buckets), "declaration-order caps, pieces merged", "ready-order
      caps per dtype group" (several (dtype, device) groups against shared
      caps: docs/limits.md) or "declaration-order caps per dtype group".
    - ddp_caps: the per-bucket caps given to DDP, in the order DDP walks
      them ([] when not aligned; per dtype group, cap j is every group's
      j-th bucket's).
    - merged_cuts: the cuts dropped because no bucket could start (per
      dtype group in declaration order: launch) there, or (per dtype
      group in ready order) the cuts at which no group's bucket closes.
    - frame: where the graph came from (goddp.graph.frames.FrameInfo): frame,
      compile_id, graph_break (Dynamo's reason) and break_at.
    - fallback_stage: None, or the stage that failed
      (goddp.compile.fallback.STAGES: export, plan, cut, example_inputs,
      identify, compile, stitch).
    - ddp_module: the DDP module the graph was compiled in
      (goddp.ddp.settings.module_of): key (unique in this process, the
      same for all its graphs), type (the wrapped module's qualified class
      name) and process_group (its process group's name).
    - forward: None, unless the graph was one of several of the DDP module's
      first training forward, planned together at its next training call
      (goddp.ranks.forward, Note [Graphs of one forward]): graphs (each graph's
      frame, in call order), position (this graph's place in it),
      bucket_graphs (per combined DDP bucket, DDP order, the position of
      the graph it comes from), moved (parameters of several graphs, counted
      in the earliest), dropped, merged_cuts (several (dtype, device)
      groups: graph buckets at whose end no group's bucket closes), aligned
      and reason.
    - auto_buckets: None, unless bucket_cap_mb="auto" (goddp.ranks.auto,
      Note [Buckets chosen by cost]): state ("off", "measuring", "decided"),
      reason (why it keeps the starting buckets, None when it installed),
      units, start (its caps); once decided on measurements: measured_steps,
      reordered_units (units found ready before the one before them),
      backward_ns and unit_bytes (per unit, backward order), allreduce (latency_ns,
      bytes_per_second, probe: [bytes, ns] points, method), start and
      chosen (caps, and the predicted step_ns, backward_ns, exposed_ns),
      predicted_gain, last_run (where rank 0 remembered a last run: whether
      its buckets were kept), installed, and agreement (the round that
      installed). ddp_caps then holds the caps DDP has: the start, the
      chosen ones once installed, none when DDP's own are back.
    """
    with _lock:
        return [r.to_dict() for r in _records]


def clear_plans() -> None:
    """Forgets the recorded plans."""
    with _lock:
        _records.clear()
