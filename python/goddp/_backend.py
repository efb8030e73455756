"""The goddp Dynamo backend: the coordinator.

``torch.compile(ddp_model, backend="goddp", options={...})`` sends each
graph Dynamo captures here. Outside a DDP forward the graph goes to the inner
compiler untouched. Inside one, goddp:

1. reads the active DDP module's bucket settings (goddp._ddp_settings);
2. exports the graph to flat arrays (goddp._export) and asks the Go planner
   where DDP's buckets close (goddp mode "ddp") or where torch's
   DDPOptimizer would cut (goddp mode "torch"), deciding on the way whether
   DDP's own buckets can be set to the pieces (docs/align.md);
3. cuts the graph into pieces along the plan (goddp._cut) and compiles each
   piece with the inner compiler (goddp._pieces), so that each bucket's
   allreduce can start while the rest of backward still runs;
4. returns one callable that runs the pieces in order (goddp._stitch); at
   its first training call the ranks of the DDP module's process group agree
   on the plan and on DDP's buckets (goddp._agreement).

Importing this module switches torch's DDPOptimizer off
(goddp._ddp_optimizer explains why) and registers the backend.

Failures never cost a training step: if planning, cutting or compiling a
piece fails, goddp warns and compiles the whole graph with the inner
compiler instead (``strict=True`` raises instead); a rank that fell back
still takes part in the agreement. A plan that differs between ranks raises
on every rank (goddp._plan_check).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import warnings
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import fx

from goddp import _ddp_optimizer, _native
from goddp._agreement import GatedCall, TrainingGate, gate_for_training
from goddp._align import alignment_blocker, coverage_blocker
from goddp._blocks import block_ids, edge_pieces, group_pieces, piece_signature
from goddp._checkpoints import companions, flattened_nodes, log_splits, split_checkpoints
from goddp._cut import cut_graph
from goddp._declaration import bucket_order, ddp_parameter_names, with_ddp_positions
from goddp._ddp_settings import active_ddp_module, caps_for, note_ddp_settings, note_once, read_ddp_settings
from goddp._export import ExportedGraph, export_graph
from goddp._frames import frame_info
from goddp._options import Options, parse_options
from goddp._pieces import PieceCompileError, compile_pieces, log_pieces, piece_example_inputs
from goddp._plan import GraphPlan, PlanSettings, call_planner, decode_plan
from goddp._plan_check import Statement
from goddp._records import GraphRecord, add_record
from goddp._stitch import StitchedPieces

logger = logging.getLogger("goddp")

BACKEND_NAME = "goddp"
ENTRY_POINT_GROUP = "torch_dynamo_backends"

ALIGNMENT_OFF = "off (align_buckets=False or mode='torch')"


# --------------------------------------------------------------------------
# Inner compiler


def resolve_inner(options: Options) -> Callable[..., Any]:
    """The callable that compiles one graph (a piece, or the whole graph)."""
    inner = options.inner
    if callable(inner) and not isinstance(inner, str):
        return inner
    from torch._dynamo.backends.registry import lookup_backend

    if options.compile_mode is None and not options.inner_options:
        return lookup_backend(inner)
    # torch.compile(mode=...) and inner_options go to the inner backend the
    # way torch.compile itself would hand them over.
    if inner == "inductor" and hasattr(torch, "_TorchCompileInductorWrapper"):
        return torch._TorchCompileInductorWrapper(options.compile_mode, options.inner_options, None)
    if hasattr(torch, "_TorchCompileWrapper"):
        return torch._TorchCompileWrapper(inner, options.compile_mode, options.inner_options, None)
    return lookup_backend(inner)


def _inner_name(inner: Any) -> str:
    return inner if isinstance(inner, str) else getattr(inner, "__name__", repr(inner))


# --------------------------------------------------------------------------
# Planning, and whether DDP's buckets become the pieces


def plan_and_align(
    ddp: Any, exported: ExportedGraph, options: Options, caps: PlanSettings
) -> tuple[GraphPlan, PlanSettings | str]:
    """Plans the graph and decides, in this one place, whether DDP's buckets
    are set to the pieces (docs/align.md). Returns the plan and either the
    caps to align with (align_buckets=True) or the reason not to."""

    def plan_with(settings: PlanSettings) -> GraphPlan:
        return decode_plan(call_planner(exported, options.mode, settings), exported, options.mode, settings)

    reason = alignment_blocker(ddp) if options.aligns_buckets else ALIGNMENT_OFF
    if reason is not None:
        return plan_with(caps), reason
    # A DDP that never rebuilds its buckets keeps declaration-order ones:
    # the planner needs each parameter's place in DDP's list for them.
    aligned = dataclasses.replace(caps, align_buckets=True, bucket_order=bucket_order(ddp))
    if aligned.bucket_order == "declaration":
        exported = with_ddp_positions(exported, ddp_parameter_names(ddp))
    plan = plan_with(aligned)
    reason = coverage_blocker(ddp, [b.param_names for b in plan.buckets])
    if reason is not None:
        return plan_with(caps), reason
    if plan.num_pieces <= 1:
        return plan, "one piece: nothing to align"
    return plan, aligned


# --------------------------------------------------------------------------
# Fallback


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _warn_fallback(reason: str, cause: BaseException | None) -> None:
    """Warns (warnings and logger "goddp"); the cause's whole message goes
    to WARNING and its traceback to DEBUG, since reason keeps one line."""
    message = f"goddp: {reason}; compiling the whole graph with the inner compiler instead"
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    full = str(cause).strip() if cause is not None else ""
    if "\n" in full:
        logger.warning("%s\n%s: %s", message, type(cause).__name__, full)
    else:
        logger.warning("%s", message)
    if cause is not None:
        logger.debug("goddp: the cause of the fallback:", exc_info=cause)


# --------------------------------------------------------------------------
# One graph inside a DDP forward


class _DDPGraphCompile:
    """Compiles one Dynamo graph inside a DDP forward: plan, cut, compile the
    pieces, stitch; or, at any failure, the whole graph. Either way the
    callable it returns takes part in the DDP module's agreement at its
    first training call (goddp._agreement)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        options: Options,
        inner: Callable[..., Any],
        ddp: Any,
    ) -> None:
        self.gm = gm
        # What a fallback compiles: Dynamo's graph as it came (self.gm may
        # become a copy with checkpoints split, see export).
        self.dynamo_gm = gm
        self.example_inputs = example_inputs
        self.options = options
        self.inner = inner
        self.ddp = ddp
        self.settings = read_ddp_settings(ddp)
        note_ddp_settings(ddp, self.settings, options)
        self.caps = caps_for(self.settings, options)
        # Why DDP's buckets stay DDP's; None while this rank proposes the pieces.
        self.not_aligned: str | None = ALIGNMENT_OFF
        self.frame = frame_info(gm)
        self.record = GraphRecord(
            mode=options.mode,
            block_cuts=options.cuts_at_blocks,
            caps=self.caps.to_dict(),
            graph={"num_nodes": len(gm.graph.nodes), "num_params": None},
            inner=_inner_name(options.inner),
            frame=self.frame.to_dict(),
        )

    def run(self) -> Callable[..., Any]:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("goddp: original graph:\n%s", self.gm.graph)
        try:
            exported = self.export()
            if not _holds_ddp_parameters(exported):
                return self.parameter_free()
            plan, alignment = self.plan(exported)
        except Exception as exc:
            if self.options.strict:
                raise
            return self.whole_graph(f"planning failed ({_describe(exc)})", exc)
        self.note_plan(plan, alignment)
        if plan.num_pieces <= 1:
            return self.whole_graph()
        try:
            pieces, piece_inputs = self.cut(exported, plan)
        except Exception as exc:
            self.log_table(plan)
            if self.options.strict:
                raise
            return self.whole_graph(f"cutting the graph along the plan failed ({_describe(exc)})", exc)
        log_pieces(pieces)
        try:
            same_as, eager = self.identify(exported, plan, pieces, piece_inputs)
        except Exception as exc:
            self.log_table(plan)
            if self.options.strict:
                raise
            return self.whole_graph(f"comparing the pieces failed ({_describe(exc)})", exc)
        self.log_table(plan, same_as, eager)
        try:
            with self.record.timed("compile"):
                compiled = compile_pieces(self.inner, pieces, piece_inputs, same_as, eager)
        except PieceCompileError as failed:
            if self.options.strict:
                raise failed.__cause__ from None
            return self.whole_graph(f"{failed} ({_describe(failed.__cause__)})", failed.__cause__)
        return self.stitch(pieces, compiled, plan)

    def export(self) -> ExportedGraph:
        with self.record.timed("export"):
            if self.options.cuts_at_blocks:
                # Note [Checkpoint bodies]: a checkpoint spanning several
                # blocks becomes one checkpoint per block before planning.
                self.gm, splits = split_checkpoints(self.gm, _body_block_ids)
                log_splits(splits)
            exported = export_graph(
                self.gm,
                param_name_of=self.settings.param_name_of,
                ignored_names=self.settings.ignored_names,
                block_cuts=self.options.cuts_at_blocks,
            )
        self.record.graph["num_params"] = len(exported.params)
        return exported

    def plan(self, exported: ExportedGraph) -> tuple[GraphPlan, PlanSettings | str]:
        with self.record.timed("plan"):
            return plan_and_align(self.ddp, exported, self.options, self.caps)

    def parameter_free(self) -> Callable[..., Any]:
        """A graph that uses no parameter DDP reduces (what a trainer's
        graph break leaves behind, e.g. after Lightning's self.log): nothing
        to cut or align, nothing for the ranks to agree on, so no plan, no
        plan check (whose per-graph sequence would drift where ranks compile
        different small frames), no note and no warning; one INFO line
        names the frame."""
        self.record.ddp_buckets = {"aligned": False, "reason": "no parameters in this graph"}
        logger.info("goddp: %s holds no parameters of DDP: compiled whole, not planned", self.frame.describe())
        try:
            with self.record.timed("compile"):
                # No training gate: every rank sees the same graph holds no
                # parameters, so every rank leaves it out of the agreement.
                return self.inner(self.dynamo_gm, self.example_inputs)
        finally:
            add_record(self.record)

    def note_plan(self, plan: GraphPlan, alignment: PlanSettings | str) -> None:
        """Records the plan; logs its table unless the graph is cut (then
        identify logs it, with the pieces that reuse compiled code)."""
        record = self.record
        if isinstance(alignment, PlanSettings):
            self.caps, reason = alignment, None
        else:
            self.caps, reason = dataclasses.replace(self.caps, align_buckets=False), alignment
        self.not_aligned = reason
        record.caps = self.caps.to_dict()
        record.ddp_buckets = {"aligned": self.caps.align_buckets, "reason": reason}
        record.alignment = plan.alignment if self.caps.align_buckets else "none"
        record.ddp_caps = list(plan.ddp_caps) if self.caps.align_buckets else []
        record.merged_cuts = plan.merged_cuts
        if reason is not None and self.options.aligns_buckets:
            note_once(self.ddp, f"goddp: DDP keeps its own buckets, which may straddle the cuts: {reason}")
        if self.caps.align_buckets and self.caps.bucket_order == "declaration":
            note_once(self.ddp, _declaration_note(plan))
        plan_dict = plan.to_dict()
        record.fingerprint = plan.fingerprint
        record.num_pieces = plan.num_pieces
        record.pieces = plan_dict["pieces"]
        record.buckets = plan_dict["buckets"]
        record.distinct_pieces = plan.num_pieces
        for piece in record.pieces:
            piece["same_as"] = piece["index"]
            piece["eager"] = False
        if plan.num_pieces <= 1:
            self.log_table(plan)

    def log_table(self, plan: GraphPlan, same_as: list[int] | None = None, eager: Sequence[int] = ()) -> None:
        """The plan table at INFO (log_plan), with the frame the graph came
        from: a trainer's graph breaks make several graphs per step."""
        if self.options.log_plan:
            logger.info("%s\n(%s)", plan.table(same_as, eager), self.frame.describe())

    def identify(
        self, exported: ExportedGraph, plan: GraphPlan, pieces: list[Any], piece_inputs: list[list[Any]]
    ) -> tuple[list[int], list[int]]:
        """Per piece, the piece whose compiled callable it will run: an
        earlier identical one (same code and input metadata, names aside;
        goddp._blocks) with block cuts, else itself; and the edge pieces
        that run eagerly (option edges; goddp._blocks, "Edges"). Recorded."""
        with self.record.timed("identify"):
            eager = edge_pieces(
                exported.nodes,
                exported.arrays.get("node_block_ids"),
                [plan.node_pieces[node.name] for node in exported.nodes],
                self.options.edge_policy,
                _node_weights(self.gm, exported.nodes),
            )
            if self.options.cuts_at_blocks:
                # An eager piece shares nothing: no compiled piece may run its
                # uncompiled code, nor it a compiled piece's.
                same_as = group_pieces(
                    [None if p.index in eager else piece_signature(p.gm, x) for p, x in zip(pieces, piece_inputs)]
                )
            else:
                same_as = list(range(len(pieces)))
        record = self.record
        distinct = sum(1 for p, leader in enumerate(same_as) if p == leader)
        record.distinct_pieces, record.reused_pieces = distinct, len(pieces) - distinct
        record.eager_pieces = len(eager)
        for piece in record.pieces:
            piece["same_as"] = same_as[piece["index"]]
            piece["eager"] = piece["index"] in eager
        return same_as, eager

    def cut(self, exported: ExportedGraph, plan: GraphPlan) -> tuple[list[Any], list[list[Any]]]:
        with self.record.timed("cut"):
            pieces = cut_graph(self.gm, exported, plan, entry_grad_enabled=torch.is_grad_enabled())
        with self.record.timed("example_inputs"):
            piece_inputs = piece_example_inputs(self.gm, self.example_inputs, pieces)
        return pieces, piece_inputs

    def stitch(self, pieces: list[Any], compiled: list[Callable[..., Any]], plan: GraphPlan) -> Callable[..., Any]:
        with self.record.timed("stitch"):
            stitched = StitchedPieces(self.gm, pieces, compiled)
            caps = plan.ddp_caps if self.caps.align_buckets else None
            stitched.before_first_call = self.training_gate(caps, self.not_aligned)
        add_record(self.record)
        return stitched

    def whole_graph(self, reason: str | None = None, cause: BaseException | None = None) -> Callable[..., Any]:
        if reason is not None:
            self.record.fallback = reason
            _warn_fallback(reason, cause)
        try:
            with self.record.timed("compile"):
                compiled = self.inner(self.dynamo_gm, self.example_inputs)
        finally:
            add_record(self.record)
        # A rank that fell back still takes part in the agreement, and says why.
        gate = self.training_gate(None, f"fallback: {reason}" if reason is not None else self.not_aligned)
        return compiled if gate is None else GatedCall(compiled, gate)

    def training_gate(self, caps_bytes: Sequence[int] | None, reason: str | None) -> TrainingGate | None:
        """What this rank will say at the DDP module's first training call,
        wrapped in the gate that says it; None for a graph compiled with
        gradients disabled, which never trains."""
        record = self.record
        statement = Statement(
            fingerprint=record.fingerprint,
            pieces=record.num_pieces,
            caps=None if caps_bytes is None else tuple(caps_bytes),
            reason=reason,
            check=self.options.check_plans,
        )

        def report(plan_check: dict[str, Any], ddp_buckets: dict[str, Any]) -> None:
            record.plan_check, record.ddp_buckets = plan_check, ddp_buckets

        return gate_for_training(self.ddp, statement, report)


def _node_weights(gm: fx.GraphModule, nodes: Sequence[fx.Node]) -> list[int]:
    """How many compute nodes each node stands for: a checkpoint call its
    body's (Note [Checkpoint bodies]), its get_attr and getitems none, any
    other node one."""
    weights = [len(flattened_nodes(gm, node)) for node in nodes]
    index = {node: i for i, node in enumerate(nodes)}
    for node in nodes:
        for companion in companions(gm, node):
            if companion in index:
                weights[index[companion]] = 0
    return weights


def _body_block_ids(body: fx.GraphModule) -> list[int]:
    return block_ids(list(body.graph.nodes), body)


def _holds_ddp_parameters(exported: ExportedGraph) -> bool:
    """Whether the graph uses a parameter whose gradient DDP reduces."""
    required, ignored = _native.PARAM_REQUIRES_GRAD, _native.PARAM_DDP_IGNORED
    return any(f & required and not f & ignored for f in exported.arrays["param_flags"])


def _declaration_note(plan: GraphPlan) -> str:
    """The INFO line that says how goddp aligned a DDP module that never
    rebuilds its buckets."""
    text = (
        "goddp: find_unused_parameters=True: DDP never rebuilds its buckets and keeps the ones it "
        f"fills in declaration order, so goddp gives it caps for that order ({plan.alignment})"
    )
    if plan.merged_cuts:
        text += (
            f"; no bucket could start at {plan.merged_cuts} of the cuts, so those pieces were merged "
            f"({plan.num_pieces} pieces remain)"
        )
    return text


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> Callable[..., Any]:
    """Compiles one Dynamo graph according to options (see module doc)."""
    _ddp_optimizer.refuse_its_pieces(gm)
    inner = resolve_inner(options)
    ddp = active_ddp_module()
    if ddp is None:
        return inner(gm, example_inputs)
    reducer_mode = _ddp_optimizer.compiled_autograd_schedules_ddp()
    if reducer_mode is not None:
        logger.info(
            "goddp: optimize_ddp=%r lets compiled autograd schedule DDP's allreduces; "
            "compiling the whole graph without cuts",
            reducer_mode,
        )
        return inner(gm, example_inputs)
    return _DDPGraphCompile(gm, example_inputs, options, inner, ddp).run()


# --------------------------------------------------------------------------
# Entry points


def goddp_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
    **torch_compile_kwargs: Any,
) -> Callable[..., Any]:
    """The Dynamo backend registered as "goddp".

    torch.compile passes ``options=`` (goddp's options, see goddp.backend;
    goddp's cutting mode is its "mode" key) and, when given, its own
    ``mode=`` among torch_compile_kwargs, which goes to the inner backend.
    """
    compile_mode = torch_compile_kwargs.get("mode")
    return compile_graph(gm, example_inputs, parse_options(options).with_compile_mode(compile_mode))


class ConfiguredBackend:
    """goddp with options bound: what ``goddp.backend(**options)`` returns."""

    def __init__(self, raw_options: Mapping[str, Any]) -> None:
        self._raw = dict(raw_options)
        self.options = parse_options(self._raw)

    def __call__(
        self,
        gm: fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        options: Mapping[str, Any] | None = None,
        **torch_compile_kwargs: Any,
    ) -> Callable[..., Any]:
        resolved = parse_options({**self._raw, **options}) if options else self.options
        return compile_graph(gm, example_inputs, resolved.with_compile_mode(torch_compile_kwargs.get("mode")))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._raw.items())
        return f"goddp.backend({args})"


def make_backend(**options: Any) -> Callable[..., Any]:
    """Returns a Dynamo backend; see goddp.backend for the options."""
    if not options:
        return goddp_backend
    return ConfiguredBackend(options)


def _entry_point_installed() -> bool:
    try:
        return any(ep.name == BACKEND_NAME for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:
        return False


def _register_with_dynamo() -> None:
    """Registers "goddp" unless the installed entry point will (Dynamo loads
    entry points lazily and would reject a name registered twice)."""
    from torch._dynamo.backends import registry

    if BACKEND_NAME in registry._COMPILER_FNS or _entry_point_installed():
        return
    registry.register_backend(compiler_fn=goddp_backend, name=BACKEND_NAME)


_ddp_optimizer.switch_off_at_import()
_register_with_dynamo()
