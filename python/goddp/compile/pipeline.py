"""The compile pipeline's coordinator: one Dynamo graph, start to end.

``torch.compile(ddp_model, backend="goddp", options={...})`` sends each
graph Dynamo captures here. Outside a DDP forward the graph goes to the inner
compiler untouched. Inside one, goddp:

1. reads the active DDP module's bucket settings (goddp.ddp.settings);
2. exports the graph to flat arrays (goddp.graph.export) and asks the Go planner,
   in one call, where DDP's buckets close (goddp mode "ddp") or where torch's
   DDPOptimizer would cut (goddp mode "torch"); the planner also resolves the
   caps, finds the repeated blocks and the edge pieces, and decides whether
   DDP's own buckets can be set to the pieces (docs/align.md,
   planner/decide.go);
3. cuts the graph into pieces along the plan (goddp.graph.cut) and compiles each
   piece with the inner compiler (goddp.compile.pieces), so that each bucket's
   allreduce can start while the rest of backward still runs;
4. returns one callable that runs the pieces in order (goddp.graph.stitch); at
   its first training call the ranks of the DDP module's process group agree
   on the plan and on DDP's buckets (goddp.ranks.agreement).

Each step returns what it made (an ExportedGraph, a Planned, the pieces,
an Identified, the compiled callables); the plan record is built from those
values in one place (``_DDPGraphCompile.record``).

A failing stage never costs a training step (see Note [Fallback] in
goddp.compile.fallback); a rank that fell back still takes part in the
agreement (Note [Where the ranks meet] in goddp.ranks.agreement). Ranks whose
layouts for DDP's buckets differ keep DDP's own buckets on every rank
(strict=True raises instead; goddp.ranks.agreement).
"""


from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Callable, Sequence

import torch
from torch import fx

from goddp.compile import compiled_autograd, ddp_optimizer
from goddp.compile.fallback import FellBack, Stages, warn_fallback
from goddp.compile.inner import inner_name, resolve_inner
from goddp.compile.notes import PlanFacts, plan_notes, settings_note
from goddp.compile.pieces import compile_pieces, log_pieces, piece_example_inputs
from goddp.compile.plan import call_planner, decode_plan, plan_graph_module, request_for
from goddp.ddp.declaration import ddp_parameter_names
from goddp.ddp.private import active_ddp_module
from goddp.ddp.refusals import STAND_IN, alignment_facts, could_not_inspect, stand_in_blocker
from goddp.ddp.settings import module_of, settings_of
from goddp.ddp.state import state_of
from goddp.graph.blocks import group_pieces, piece_signature
from goddp.graph.checkpoints import BodyBuckets, log_splits, split_checkpoints
from goddp.graph.cut import Piece, cut_graph
from goddp.graph.export import ExportedGraph, body_parameters, export_graph, with_ddp_positions
from goddp.graph.frames import frame_info
from goddp.graph.stitch import StitchedPieces
from goddp.native.extension import REASON_ALIGNED, REASON_PART_OF_FORWARD
from goddp.native.plan import READY_GROUPS, AlignmentFacts, GraphPlan, PlanRequest, PlanSettings
from goddp.options import Options
from goddp.ranks.auto import AutoBuckets, ddp_runs, unit_cap
from goddp.ranks.agreement import GatedCall, TrainingGate, gate_for_training, installed_layout
from goddp.ranks.forward import Member
from goddp.ranks.layout import Layout, covering_run, installed_run, layout_of
from goddp.ranks.verdict import Statement
from goddp.reports.records import GraphRecord, add_record, new_timings
from goddp.reports.table import plan_table
from goddp.tools import structured
from goddp.tools.ranges import piece_labels

logger = logging.getLogger("goddp")


# --------------------------------------------------------------------------
# One graph inside a DDP forward


@dataclasses.dataclass(frozen=True)
class Planned:
    """What planning made: the plan, the settings it was made with (with
    align_buckets saying whether this rank proposes the pieces as DDP's
    buckets), and why it does not (None when it does)."""

    plan: GraphPlan
    caps: PlanSettings
    not_aligned: str | None
    # The graph holds part of DDP's parameters: planned with the forward's
    # other graphs (goddp.ranks.forward, Note [Graphs of one forward]).
    part_of_forward: bool = False
    # Planned again with the caps of DDP's installed buckets: the line that
    # says so (_DDPGraphCompile.follow_installed).
    follows: str | None = None
    # The same graph and request planned with other per-bucket caps (the
    # aligned plans; goddp.ranks.auto), and the caps that make the
    # compiled pieces' buckets auto's units.
    replan: Callable[[Sequence[int]], GraphPlan] | None = dataclasses.field(default=None, repr=False)
    unit_caps: tuple[int, ...] = (1,)


@dataclasses.dataclass(frozen=True)
class Identified:
    """Per piece, the piece whose compiled callable it runs (itself unless
    reused), and the pieces that run eagerly (option edges)."""

    same_as: list[int]
    eager: list[int]


class _DDPGraphCompile:
    """Compiles one Dynamo graph inside a DDP forward: plan, cut, compile the
    pieces, stitch; or, at any failure, the whole graph. Either way the
    callable it returns takes part in the DDP module's agreement at its
    first training call (goddp.ranks.agreement)."""

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
        self.settings = settings_of(ddp)
        self.frame = frame_info(gm)
        self.stages = Stages(options.strict, new_timings())
        self._outer: tuple[fx.GraphModule, ExportedGraph] | None = None

    def run(self) -> Callable[..., Any]:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("goddp: original graph:\n%s", self.gm.graph)
        stages = self.stages
        exported: ExportedGraph | None = None
        planned: Planned | None = None
        try:
            with stages.stage("export"):
                exported = self.export()
            with stages.stage("plan"):
                planned = self.auto_units(self.plan(exported))
            if planned.plan.num_counted_params == 0:
                return self.parameter_free(exported, planned)
            self.note(planned)
            if planned.plan.num_pieces <= 1:
                self.log_table(planned.plan)
                return self.whole_graph(exported, planned)
            identified: Identified | None = None
            try:
                with stages.stage("cut"):
                    pieces = cut_graph(self.gm, exported, planned.plan, entry_grad_enabled=torch.is_grad_enabled())
                log_pieces(pieces)
                with stages.stage("example_inputs"):
                    piece_inputs = piece_example_inputs(self.gm, self.example_inputs, pieces)
                with stages.stage("identify"):
                    identified = self.identify(exported, planned.plan, pieces, piece_inputs)
                    labels = piece_labels(planned.plan, exported.nodes)
            finally:
                self.log_table(planned.plan, identified)
            structured.pieces(self.gm, pieces, identified.same_as, identified.eager, labels, self.frame.describe())
            with stages.timed("compile"):
                compiled = compile_pieces(
                    self.inner, pieces, piece_inputs, identified.same_as, identified.eager, stages.guard
                )
            with stages.stage("stitch"):
                stitched = StitchedPieces(self.gm, pieces, compiled, labels)
        except FellBack as fell:
            return self.whole_graph(exported, planned, fell)
        record = self.record(exported, planned, identified)
        caps = planned.plan.ddp_caps if planned.caps.align_buckets else None
        auto = self.start_auto(record, planned) if stand_in_blocker(self.ddp) is None and torch.is_grad_enabled() else None
        stitched.before_first_call = self.training_gate(
            record, planned, caps, planned.not_aligned, start=None if auto is None else auto.start
        )
        add_record(record)
        return stitched

    # -- the steps, each returning what it made

    def export(self) -> ExportedGraph:
        if self.options.cuts_at_blocks:
            # A checkpoint spanning several blocks, or holding more than a
            # bucket's parameters (Note [Checkpoint bodies]), becomes one
            # checkpoint per block or bucket before planning.
            self.gm, splits = split_checkpoints(self.gm, _body_block_ids, self.body_buckets, self.cut_at_blocks)
            log_splits(splits)
        return self.export_outer(self.gm)

    def export_outer(self, gm: fx.GraphModule) -> ExportedGraph:
        """gm in the planner's arrays with this DDP module's names, exported
        once: cut_at_blocks exports the graph the splitter may leave as it
        is, and export then reuses it."""
        if self._outer is None or self._outer[0] is not gm:
            exported = export_graph(gm, param_name_of=self.settings.param_name_of, ignored_names=self.settings.ignored_names)
            self._outer = (gm, exported)
        return self._outer[1]

    def cut_at_blocks(self, gm: fx.GraphModule) -> bool:
        """Whether the planner cuts gm at block runs (GraphPlan.block_runs),
        planned as this graph would be: this DDP module's settings, aligned
        where it would be (under find_unused_parameters=True, declaration
        order, the planner cuts by bytes even across blocks)."""
        return self.plan(self.export_outer(gm)).plan.block_runs

    def body_buckets(self, gm: fx.GraphModule, call: fx.Node, body: fx.GraphModule) -> BodyBuckets | None:
        """A checkpoint body planned alone, by buckets: ddp mode, this DDP
        module's bucket cap for every bucket (Note [Uniform caps] in
        planner/regions.go, which also says whether its pieces are regions
        to split it into), its placeholders that stand for DDP's
        parameters counted as those parameters; None when it holds none."""
        exported = export_graph(
            body,
            param_name_of=self.settings.param_name_of,
            ignored_names=self.settings.ignored_names,
            placeholder_params=body_parameters(gm, call, body),
        )
        request = dataclasses.replace(self.request(), edges="compile", max_pieces=None, uniform_caps=True)
        plan = decode_plan(call_planner(exported, request), exported, request)
        if plan.num_counted_params == 0:
            return None
        pieces = [plan.node_pieces.get(node.name, -1) for node in body.graph.nodes]
        return BodyBuckets(
            pieces, sum(b.bytes for b in plan.buckets), plan.caps.bucket_cap_bytes, len(plan.buckets), plan.checkpoint_regions
        )

    def request(self, align: bool = False, num_params: int = 0, facts: AlignmentFacts | None = None) -> PlanRequest:
        """What the planner is told besides the graph: the user's options
        (None: not given) and the DDP module's settings."""
        return request_for(self.options, self.settings.request(num_params, facts), align)

    def plan(self, exported: ExportedGraph) -> Planned:
        """One call into the planner. Whether DDP's buckets may be set to the
        pieces is the planner's decision, from facts read from DDP
        (alignment_facts) and each parameter's position in DDP's list
        (docs/align.md); a stand-in or a DDP goddp cannot inspect is refused
        here."""
        blocker, facts = stand_in_blocker(self.ddp), None
        if blocker is None and self.options.aligns_buckets:
            facts, blocker = alignment_facts(self.ddp)
        align, num_params = self.options.aligns_buckets and blocker is None, 0
        if align:
            try:
                names = ddp_parameter_names(self.ddp)
            except Exception as exc:  # a DDP whose private API differs: leave it alone
                blocker, align = could_not_inspect(exc), False
            else:
                exported, num_params = with_ddp_positions(exported, names), len(names)
        request = self.request(align, num_params, facts)
        plan = decode_plan(call_planner(exported, request), exported, request)
        follows = None
        if align:
            plan, follows = self.follow_installed(exported, request, plan)
        part = plan.align_reason == REASON_PART_OF_FORWARD

        def replan(caps: Sequence[int]) -> GraphPlan:
            again = dataclasses.replace(request, bucket_caps_bytes=tuple(caps))
            return decode_plan(call_planner(exported, again), exported, again)

        return Planned(plan, plan.caps, blocker or plan.not_aligned, part_of_forward=part, follows=follows,
                       replan=replan if align else None)

    def follow_installed(
        self, exported: ExportedGraph, request: PlanRequest, plan: GraphPlan
    ) -> tuple[GraphPlan, str | None]:
        """A graph of a module whose ranks installed goddp's layout, whose
        parameters are a run of the installed buckets but whose plan is not:
        planned again with the run's caps so that it is cut where those
        buckets close, and the line that says so (Note [A later graph's
        part of the layout] in goddp.ranks.layout); else plan, unchanged."""
        try:
            found = installed_layout(self.ddp)
        except Exception:  # a DDP whose private API differs: the plan as it is, which trains
            logger.debug("goddp: could not read the layout DDP's ranks installed", exc_info=True)
            found = None
        if found is None or found[0].order != "ready" or not _in_ready_order(plan):
            return plan, None
        installed, shared = found
        if installed.shares_caps:
            return plan, None
        if plan.align_reason == REASON_ALIGNED:
            shared = frozenset()  # every parameter: nothing counted elsewhere
        own = self._ready_layout(plan)
        if own is None or installed_run(installed, own, shared) is not None:
            return plan, None
        run = covering_run(installed, [p for bucket in own.buckets for p in bucket], shared)
        if run is None:
            return plan, None
        caps = installed.caps[run.start : run.stop]
        again = dataclasses.replace(request, bucket_caps_bytes=tuple(caps))
        replanned = decode_plan(call_planner(exported, again), exported, again)
        if replanned.align_reason != plan.align_reason or not _in_ready_order(replanned):
            return plan, None
        mine = self._ready_layout(replanned)
        if mine is None or installed_run(installed, mine, shared) != run:
            return plan, None
        line = (
            f"goddp: {self.frame.describe()}: planned with the caps of DDP's installed buckets "
            f"{run.start}-{run.stop - 1} ({list(caps)} bytes), so that its pieces close where they do"
        )
        return replanned, line

    def _ready_layout(self, plan: GraphPlan) -> Layout | None:
        try:
            return self.layout(plan, plan.ddp_caps, "ready")
        except Exception:  # a name DDP does not know: the plan as it is; the gate says so (training_gate)
            logger.debug("goddp: could not state the plan's layout", exc_info=True)
            return None

    def identify(
        self, exported: ExportedGraph, plan: GraphPlan, pieces: list[Piece], piece_inputs: list[list[Any]]
    ) -> Identified:
        """Per piece, the piece whose compiled callable it will run: an
        earlier identical one (same code and input metadata, names aside;
        goddp.graph.blocks) with block cuts, else itself; and the edge pieces
        that run eagerly (option edges; the planner's, Note [Edges] in
        planner/edges.go)."""
        eager = list(plan.eager_pieces)
        if self.options.cuts_at_blocks:
            # An eager piece shares nothing: no compiled piece may run its
            # uncompiled code, nor it a compiled piece's.
            same_as = group_pieces(
                [None if p.index in eager else piece_signature(p.gm, x) for p, x in zip(pieces, piece_inputs)]
            )
        else:
            same_as = list(range(len(pieces)))
        return Identified(same_as, eager)

    # -- the ends: a graph without DDP's parameters, the whole graph

    def parameter_free(self, exported: ExportedGraph, planned: Planned) -> Callable[..., Any]:
        """A graph that uses no parameter DDP reduces (the planner's
        one-piece decision, Note [Parameter-free graphs] in
        planner/decide.go): nothing to cut or align, nothing for the ranks
        to agree on: no plan check (whose per-graph sequence would drift
        where ranks compile different small frames), no note and no
        warning; one INFO line names the frame."""
        logger.info("goddp: %s holds no parameters of DDP: compiled whole, not planned", self.frame.describe())
        try:
            with self.stages.timed("compile"):
                # No training gate: every rank sees the same graph holds no
                # parameters, so every rank leaves it out of the agreement.
                return self.inner(self.dynamo_gm, self.example_inputs)
        finally:
            add_record(
                self.record(exported, caps=planned.caps, ddp_buckets={"aligned": False, "reason": planned.plan.not_aligned})
            )

    def whole_graph(
        self, exported: ExportedGraph | None, planned: Planned | None, fell: FellBack | None = None
    ) -> Callable[..., Any]:
        if fell is not None:
            warn_fallback(fell)
        record = self.record(exported, planned, fell=fell)
        if self.options.auto_buckets and planned is not None and torch.is_grad_enabled():
            reason = "its graph is one piece: no bucket boundary to choose" if fell is None else "its graph fell back"
            state_of(self.ddp).note_once(f"goddp: bucket_cap_mb='auto' keeps the starting buckets of {self.frame.describe()}: {reason}")
            record.auto_buckets = {"state": "off", "reason": reason}
        try:
            with self.stages.timed("compile"):
                compiled = self.inner(self.dynamo_gm, self.example_inputs)
        finally:
            add_record(record)
        # A rank that fell back still takes part in the agreement, and says why.
        reason = f"fallback: {fell.reason}" if fell is not None else planned.not_aligned
        gate = self.training_gate(record, planned, None, reason)
        return compiled if gate is None else GatedCall(compiled, gate)

    # -- what the graph leaves behind: notes, the record, the gate

    def note(self, planned: Planned) -> None:
        """The INFO notes a plan deserves (Note [A plan's notes] in
        goddp.compile.notes), each once per DDP module unless it says
        otherwise."""
        plan = planned.plan
        facts = PlanFacts(
            mode=self.options.mode,
            align_requested=self.options.aligns_buckets,
            ddp_bucket_order=plan.ddp_bucket_order,
            aligned=planned.caps.align_buckets,
            caps_order=planned.caps.bucket_order,
            alignment=plan.alignment,
            merged_cuts=plan.merged_cuts,
            num_pieces=plan.num_pieces,
            not_aligned=planned.not_aligned,
            stand_in=planned.not_aligned == STAND_IN,
            part_of_forward=planned.part_of_forward,
            frame=self.frame.describe(),
        )
        state = state_of(self.ddp)
        state.note_settings(settings_note(facts))
        if planned.follows is not None:
            logger.info("%s", planned.follows)
        for note in plan_notes(facts):
            if note.once:
                state.note_once(note.text)
            else:
                logger.info("%s", note.text)

    def log_table(self, plan: GraphPlan, identified: Identified | None = None) -> None:
        """The plan table at INFO (log_plan), with the frame the graph came
        from: a trainer's graph breaks make several graphs per step."""
        if self.options.log_plan:
            same_as, eager = (identified.same_as, identified.eager) if identified is not None else (None, ())
            logger.info("%s\n(%s)", plan_table(plan, same_as, eager), self.frame.describe())

    def record(
        self,
        exported: ExportedGraph | None = None,
        planned: Planned | None = None,
        identified: Identified | None = None,
        fell: FellBack | None = None,
        ddp_buckets: dict[str, Any] | None = None,
        caps: PlanSettings | None = None,
    ) -> GraphRecord:
        """The one place a graph's record (goddp.last_plans()) is made, from
        what the steps made; missing values are steps that did not run. The
        caps are the plan's (or caps), else what the planner was asked."""
        if planned is not None:
            caps = planned.caps
        record = GraphRecord(
            mode=self.options.mode,
            block_cuts=self.options.cuts_at_blocks,
            caps=(caps or self.request()).to_dict(),
            graph={"num_nodes": len(self.dynamo_gm.graph.nodes), "num_params": None if exported is None else len(exported.params)},
            inner=inner_name(self.options.inner),
            frame=self.frame.to_dict(),
            timings=self.stages.timings,
            ddp_buckets=ddp_buckets,
            ddp_module=module_of(self.ddp),
        )
        if fell is not None:
            record.fallback, record.fallback_stage = fell.reason, fell.stage
        if planned is None:
            return record
        plan = planned.plan
        record.ddp_buckets = {"aligned": planned.caps.align_buckets, "reason": planned.not_aligned}
        record.alignment = plan.alignment
        record.ddp_caps = list(plan.ddp_caps)
        record.merged_cuts = plan.merged_cuts
        plan_dict = plan.to_dict()
        record.fingerprint = plan.fingerprint
        record.num_pieces = plan.num_pieces
        record.pieces = plan_dict["pieces"]
        record.buckets = plan_dict["buckets"]
        same_as = identified.same_as if identified is not None else list(range(plan.num_pieces))
        eager = identified.eager if identified is not None else []
        record.distinct_pieces = sum(1 for p, leader in enumerate(same_as) if p == leader)
        record.reused_pieces = len(same_as) - record.distinct_pieces
        record.eager_pieces = len(eager)
        for piece in record.pieces:
            piece["same_as"] = same_as[piece["index"]]
            piece["eager"] = piece["index"] in eager
        return record

    def training_gate(
        self, record: GraphRecord, planned: Planned | None, caps_bytes: Sequence[int] | None, reason: str | None,
        start: Layout | None = None,
    ) -> TrainingGate | None:
        """What this rank will say at the DDP module's first training call,
        wrapped in the gate that says it; None for a graph compiled with
        gradients disabled, which never trains, and for a stand-in DDP,
        which has no ranks to agree with."""
        if stand_in_blocker(self.ddp) is not None:
            return None
        layout = digest = None
        if caps_bytes is not None and planned is not None:
            try:
                layout = start or self.layout(planned.plan, caps_bytes, planned.caps.bucket_order)
                digest = layout.digest()
            except Exception as exc:  # a name DDP does not know, a layout the planner refuses: DDP's buckets
                logger.debug("goddp: could not state DDP's layout", exc_info=True)
                layout, reason = None, f"could not state DDP's layout ({type(exc).__name__}: {exc})"
        member_layout, member_reason, later = layout, reason, False
        if planned is not None and planned.part_of_forward and record.fallback is None:
            # Part of DDP's parameters: the ranks decide at the module's next
            # training forward, with the forward's other graphs.
            try:
                member_layout = self.layout(planned.plan, planned.plan.ddp_caps, "ready")
                later = True
            except Exception as exc:  # a name DDP does not know: no layout, DDP's buckets serve
                logger.debug("goddp: could not state DDP's layout", exc_info=True)
                member_reason = f"could not state DDP's layout ({type(exc).__name__}: {exc})"
        statement = Statement(
            layout=layout,
            digest=digest if layout is not None else None,
            reason=reason,
            later=later,
            strict=self.options.strict,
            fingerprint=None if planned is None else planned.plan.fingerprint,
            pieces=1 if planned is None else planned.plan.num_pieces,
        )

        compile_id = structured.current_compile_id()

        def report(plan_check: dict[str, Any], ddp_buckets: dict[str, Any]) -> None:
            record.plan_check, record.ddp_buckets = plan_check, ddp_buckets
            structured.agreement(compile_id, plan_check, ddp_buckets)

        def note(forward: dict[str, Any]) -> None:
            record.forward = forward

        member = Member(member_layout, member_reason, self.frame.describe(), report, note,
                        caps=None if planned is None else planned.caps)
        return gate_for_training(self.ddp, statement, report, member)

    def auto_units(self, planned: Planned) -> Planned:
        """With bucket_cap_mb="auto", the module's first graph, when it is
        not cut at blocks, is cut where buckets of unit_cap(total) close
        instead (Note [Auto's units] in goddp.ranks.auto), so that auto has
        pieces to choose runs of; later graphs follow the module."""
        plan = planned.plan
        state = state_of(self.ddp)
        if (
            not self.options.auto_buckets
            or state.auto is not None
            or state.decision is not None
            or planned.replan is None
            or plan.block_runs
            or plan.align_reason != REASON_ALIGNED
            or plan.alignment == READY_GROUPS
            or planned.caps.bucket_order != "ready"
        ):
            return planned
        unit = unit_cap(sum(b.bytes for b in plan.buckets))
        again = planned.replan((unit,))
        if again.align_reason != REASON_ALIGNED:
            return planned
        return dataclasses.replace(planned, plan=again, unit_caps=(unit,))

    def start_auto(self, record: GraphRecord, planned: Planned) -> AutoBuckets | None:
        """bucket_cap_mb="auto" for the module's first graph (Note [Buckets
        chosen by cost] in goddp.ranks.auto): its units and starting buckets,
        kept on the module's state; or, said once, why it keeps the starting
        layout. A later graph follows the module's decision."""
        state = state_of(self.ddp)
        if not self.options.auto_buckets or state.auto is not None or state.decision is not None:
            return None
        compile_id = structured.current_compile_id()

        def report(outcome: dict[str, Any], caps: Sequence[int] | None = None) -> None:
            record.auto_buckets = json.loads(json.dumps(outcome))
            if caps is not None:
                record.ddp_caps = list(caps)
            structured.auto_buckets(compile_id, record.auto_buckets)

        units, reason = self.auto_units_of(planned)
        if units is None:
            state.note_once(f"goddp: bucket_cap_mb='auto' keeps the starting buckets of {self.frame.describe()}: {reason}")
            report({"state": "off", "reason": reason})
            return None
        positions, sizes = units
        if planned.unit_caps == (1,):  # cut at blocks: the plan's buckets are runs of its pieces
            start = self.layout(planned.plan, planned.plan.ddp_caps, "ready")
            unit_of = {p: u for u, unit in enumerate(positions) for p in unit}
            starts = [unit_of[b[0]] for b in start.buckets[1:]]
        else:  # cut into units: DDP's own caps over them
            caps = planned.caps
            starts = ddp_runs(sizes, caps.bucket_caps_bytes or (caps.first_bucket_cap_bytes, caps.bucket_cap_bytes))
        auto = AutoBuckets(positions, sizes, starts, report)
        report(auto.outcome, auto.start.caps)
        state.auto = auto
        return auto

    def auto_units_of(self, planned: Planned) -> tuple[tuple[list[tuple[int, ...]], list[int]] | None, str | None]:
        """The units of the plan (its pieces' buckets, in DDP order: each
        one's DDP positions and bytes), or why auto has none."""
        if planned.part_of_forward:
            return None, "its forward is split over several graphs"
        if planned.caps.bucket_order != "ready":
            return None, (
                "under find_unused_parameters=True DDP fills its buckets in declaration order and never "
                "rebuilds them, so the units a step's timeline orders are not its buckets"
            )
        if planned.not_aligned is not None or planned.replan is None:
            return None, f"DDP's buckets are not goddp's: {planned.not_aligned}"
        if planned.plan.alignment == READY_GROUPS:
            return None, (
                "its parameters span several (dtype, device) groups, which DDP buckets apart against shared "
                "caps, so a run of units is no bucket"
            )
        # Cut into units already (auto_units), its plan is the finest; cut at
        # blocks, planned with one-byte caps every piece closes a bucket.
        finest = planned.plan if planned.unit_caps != (1,) else planned.replan((1,))
        if finest.node_pieces != planned.plan.node_pieces or finest.align_reason != REASON_ALIGNED:
            return None, "its pieces move with the cap (planned so that every piece closes a bucket, it is cut elsewhere)"
        layout = self.layout(finest, finest.ddp_caps, "ready")
        return (list(layout.buckets), [b.bytes for b in finest.buckets]), None

    def layout(self, plan: GraphPlan, caps_bytes: Sequence[int], order: str) -> Layout:
        """The plan's buckets as DDP would hold them (goddp.ranks.layout)."""
        positions = {name: k for k, name in enumerate(ddp_parameter_names(self.ddp))}
        return layout_of([b.param_names for b in plan.buckets], caps_bytes, order, positions)


def _in_ready_order(plan: GraphPlan) -> bool:
    """The plan's buckets are for DDP's ready order: aligned, or part of a
    forward."""
    if plan.align_reason == REASON_ALIGNED:
        return plan.caps.bucket_order == "ready" and bool(plan.ddp_caps)
    return plan.align_reason == REASON_PART_OF_FORWARD and bool(plan.buckets)


def _body_block_ids(body: fx.GraphModule) -> list[int]:
    """Each body node's repeated block, -1 for none: the planner's block
    rule (Note [Block rule]) applied to the body alone."""
    plan = plan_graph_module(body, block_cuts=True)
    return list(plan.node_block_ids) if plan.node_block_ids is not None else [-1] * len(body.graph.nodes)


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> Callable[..., Any]:
    """Compiles one Dynamo graph according to options (see module doc)."""
    ddp_optimizer.refuse_its_pieces(gm)
    inner = resolve_inner(options)
    ddp = active_ddp_module()
    # Note [Compiled autograd and DDP] in goddp.compile.compiled_autograd
    if compiled_autograd.passes_uncut(gm, ddp) or ddp is None:
        return inner(gm, example_inputs)
    compiled_autograd.warn_cpp_reducer(ddp)
    return _DDPGraphCompile(gm, example_inputs, options, inner, ddp).run()
