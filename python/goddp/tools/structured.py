"""goddp's artifacts in torch's structured trace (``TORCH_TRACE``, read by tlparse).

Note [Structured trace artifacts]: under ``TORCH_TRACE`` torch writes one
structured log per rank, and tlparse renders it per compile id (an
``index.html`` and a folder per compile id; ``compile_directory.json`` lists
each compile id's artifacts). goddp writes its own as torch's generic
"artifact" entries (``torch._logging.trace_structured("artifact", ...)``: a
name and an encoding), which tlparse lists under the compile id they carry:

- ``goddp_plan`` (json): the graph's ``goddp.last_plans()`` record as it
  stands at compile time (``plan_check`` is filled in later, see
  goddp_agreement);
- ``goddp_cut_graph`` (string): the program that runs the pieces in order,
  each piece a call, with a header naming each piece, its block and whether
  it is compiled, runs another piece's compiled code, or runs eagerly;
- ``goddp_piece_<i>_graph`` (string): the FX graph of each distinct piece
  (a piece that reuses another's compiled code has none of its own);
- ``goddp_piece_reuse`` (json): per piece, the piece whose compiled code it
  runs and whether it runs eagerly;
- ``goddp_fallback`` (json): the stage that failed and why, when a graph
  was compiled whole instead;
- ``goddp_agreement`` (json): what the ranks of the DDP module decided at
  its first training call for this graph (the record's ``plan_check`` and
  ``ddp_buckets``). That call is no compile, so the artifact carries the
  compile id of the graph it gated, captured when that graph compiled
  (tlparse lists it under that id, with attempt "-");
- ``goddp_auto_buckets`` (json): with bucket_cap_mb="auto", what it
  measured and chose (the record's ``auto_buckets``), under the same id.

No cost without ``TORCH_TRACE``: trace_structured writes only when torch's
trace log has a handler, and each function here checks that first
(``enabled``) and returns; payloads are made by ``payload_fn`` only when
written. Writing never fails a compile: an error is logged at DEBUG.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Sequence

import torch
from torch import fx

logger = logging.getLogger("goddp")

PLAN = "goddp_plan"
CUT_GRAPH = "goddp_cut_graph"
PIECE_GRAPH = "goddp_piece_{index}_graph"
PIECE_REUSE = "goddp_piece_reuse"
FALLBACK = "goddp_fallback"
AGREEMENT = "goddp_agreement"
AUTO_BUCKETS = "goddp_auto_buckets"


def enabled() -> bool:
    """Whether torch writes a structured trace (what trace_structured itself
    checks: its trace log has a handler). True where this torch keeps the
    log elsewhere: trace_structured then decides alone."""
    internal = getattr(torch._logging, "_internal", None)
    trace_log = getattr(internal, "trace_log", None)
    return True if trace_log is None else bool(trace_log.handlers)


def current_compile_id() -> Any:
    """Dynamo's compile id of the graph being compiled (None outside one)."""
    try:
        return torch._guards.CompileContext.current_compile_id()
    except AttributeError:  # a torch that keeps it elsewhere: the artifact goes without
        return None


def _artifact(name: str, encoding: str, payload_fn: Callable[[], Any], compile_id: Any = None) -> None:
    try:
        kwargs = {} if compile_id is None else {"compile_id": compile_id}
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda: {"name": name, "encoding": encoding},
            payload_fn=payload_fn,
            **kwargs,
        )
    except Exception:  # the trace is for reading later: a failure to write it never stops a compile
        logger.debug("goddp: could not write %s to the structured trace", name, exc_info=True)


def plan(record: Any) -> None:
    """goddp_plan: record (a reports.records.GraphRecord) as JSON."""
    if enabled():
        _artifact(PLAN, "json", record.to_dict)


def pieces(
    gm: fx.GraphModule,
    cut: Sequence[Any],
    same_as: Sequence[int],
    eager: Sequence[int],
    labels: Sequence[str],
    where: str,
) -> None:
    """goddp_cut_graph, goddp_piece_<i>_graph per distinct piece and
    goddp_piece_reuse for the pieces of gm (goddp.graph.cut.Piece), with
    their labels (goddp.tools.ranges.piece_labels); where: the frame."""
    if not enabled():
        return
    roles = [_role(p, same_as[p], p in eager) for p in range(len(cut))]
    _artifact(CUT_GRAPH, "string", lambda: _cut_program(gm, cut, labels, roles, where))
    for piece in cut:
        index = piece.index
        if same_as[index] != index:
            continue
        users = [p for p, leader in enumerate(same_as) if leader == index]

        def text(piece=piece, users=users) -> str:
            used = f", run by pieces {', '.join(map(str, users))}" if len(users) > 1 else ""
            header = f"# {labels[piece.index]}: {roles[piece.index]}{used}\n"
            return header + piece.gm.print_readable(print_output=False)

        _artifact(PIECE_GRAPH.format(index=index), "string", text)
    _artifact(PIECE_REUSE, "json", lambda: {
        "pieces": [
            {"index": p, "label": labels[p], "same_as": same_as[p], "eager": p in eager} for p in range(len(cut))
        ],
        "compiled": [p for p, leader in enumerate(same_as) if p == leader and p not in eager],
    })


def _role(index: int, leader: int, eager: bool) -> str:
    if eager:
        return "runs eagerly (an edge outside the repeated blocks)"
    if leader != index:
        return f"runs the compiled code of piece {leader}"
    return "compiled"


def _cut_program(gm: fx.GraphModule, cut: Sequence[Any], labels: Sequence[str], roles: Sequence[str], where: str) -> str:
    """The stitched program as Python: each piece a call, in order."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
    for piece in cut:
        call = graph.call_module(f"piece_{piece.index}", tuple(env[n] for n in piece.input_nodes))
        for k, value in enumerate(piece.output_nodes):
            env[value] = graph.create_node("call_function", operator.getitem, (call, k), name=value.name)
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    graph.output(fx.map_arg(output.args[0], lambda n: env[n]))
    header = [f"# goddp cut graph: {where}, {len(cut)} pieces"]
    header += [f"# piece_{p}: {label}, {role}" for p, (label, role) in enumerate(zip(labels, roles))]
    return "\n".join(header) + "\n" + graph.python_code(root_module="self").src


def fallback(stage: str, reason: str, cause: BaseException) -> None:
    """goddp_fallback: the stage that failed, why, and the exception."""
    if enabled():
        _artifact(FALLBACK, "json", lambda: {
            "stage": stage, "reason": reason, "exception": f"{type(cause).__name__}: {cause}",
        })


def agreement(compile_id: Any, plan_check: dict[str, Any], ddp_buckets: dict[str, Any]) -> None:
    """goddp_agreement, under compile_id (the gated graph's, see the Note)."""
    if enabled():
        _artifact(AGREEMENT, "json", lambda: {"plan_check": plan_check, "ddp_buckets": ddp_buckets}, compile_id)


def auto_buckets(compile_id: Any, outcome: dict[str, Any]) -> None:
    """goddp_auto_buckets, under compile_id (the graph's): what
    bucket_cap_mb="auto" measured and chose (goddp.ranks.auto)."""
    if enabled():
        _artifact(AUTO_BUCKETS, "json", lambda: outcome, compile_id)
