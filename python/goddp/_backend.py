"""The goddp Dynamo backend.

``torch.compile(ddp_model, backend="goddp", options={...})`` sends each
graph Dynamo captures here. Outside a DDP forward the graph goes to the inner
compiler untouched. Inside one, goddp:

1. reads the active DDP module's bucket settings (cap, first-bucket cap,
   per-bucket caps, ignored parameters);
2. exports the graph to flat arrays and asks the Go planner where DDP's
   buckets close (``mode="ddp"``) or where torch's DDPOptimizer would cut
   (``mode="torch"``);
3. compares the plan's fingerprint across ranks (``check_plans``);
4. cuts the graph into pieces along the plan and compiles each piece with
   the inner compiler, so that each bucket's allreduce can start while the
   rest of backward still runs;
5. returns one callable that runs the pieces in order.

Interplay with torch's DDPOptimizer: Dynamo puts its own DDPOptimizer in
front of any backend while ``torch._dynamo.config.optimize_ddp`` is on, and
reads that setting when a frame is converted, so a backend cannot switch it
off from inside its own call. Importing this module (which the
``torch_dynamo_backends`` entry point and ``goddp.backend()`` both do)
therefore sets ``optimize_ddp = "no_optimization"`` when it is True or
"ddp_optimizer", and logs that at INFO. Set GODDP_KEEP_OPTIMIZE_DDP=1 to keep
the setting. If goddp nevertheless receives a piece that DDPOptimizer cut,
it raises RuntimeError telling you to set
``torch._dynamo.config.optimize_ddp = False``.

Failures never cost a training step: if planning, cutting or compiling a
piece fails, goddp warns and compiles the whole graph with the inner
compiler instead (``strict=True`` raises instead). A plan that differs
between ranks is the one error that always raises, on every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import sys
import time
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import fx

from goddp._align import PendingAlignment, alignment_blocker, coverage_blocker
from goddp._cut import cut_graph
from goddp._ddp_settings import active_ddp_module, caps_for, note_ddp_settings, note_once, read_ddp_settings
from goddp._export import example_value, export_graph
from goddp._options import Options, parse_options
from goddp._plan import call_planner, decode_plan
from goddp._plan_check import check_plans_across_ranks
from goddp._records import add_record
from goddp._stitch import StitchedPieces

logger = logging.getLogger("goddp")

BACKEND_NAME = "goddp"
ENTRY_POINT_GROUP = "torch_dynamo_backends"

DDP_OPTIMIZER_REFUSAL = (
    "goddp received a graph piece that torch's DDPOptimizer already split "
    "(torch._dynamo.config.optimize_ddp is on). goddp must see the whole graph to plan "
    "its own cuts. Set `torch._dynamo.config.optimize_ddp = False` before calling the "
    "compiled model (goddp does this when it is imported unless GODDP_KEEP_OPTIMIZE_DDP=1 "
    "is set or the setting was turned back on afterwards)."
)


class GoddpFallback(Exception):
    """Internal: a step failed and the whole graph is compiled instead."""


# --------------------------------------------------------------------------
# Import-time setup


def _switch_off_ddp_optimizer() -> None:
    if os.environ.get("GODDP_KEEP_OPTIMIZE_DDP") == "1":
        return
    config = torch._dynamo.config
    if config.optimize_ddp is True or config.optimize_ddp == "ddp_optimizer":
        config.optimize_ddp = "no_optimization"
        logger.info(
            "goddp: set torch._dynamo.config.optimize_ddp = 'no_optimization' so that goddp, "
            "not torch's DDPOptimizer, splits DDP graphs (GODDP_KEEP_OPTIMIZE_DDP=1 keeps it on)"
        )


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


# --------------------------------------------------------------------------
# DDPOptimizer detection


def _called_from_ddp_optimizer() -> bool:
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < 40:
        code = frame.f_code
        if code.co_name == "compile_submod" and code.co_filename.replace("\\", "/").endswith(
            "_dynamo/backends/distributed.py"
        ):
            return True
        frame = frame.f_back
        depth += 1
    return False


def _refuse_ddp_optimizer_pieces(gm: fx.GraphModule) -> None:
    reason = getattr(gm, "compile_subgraph_reason", None)
    text = getattr(reason, "reason", reason)
    if (text is not None and "DDPOptimizer" in str(text)) or _called_from_ddp_optimizer():
        raise RuntimeError(DDP_OPTIMIZER_REFUSAL)


# --------------------------------------------------------------------------
# Per-piece aot_autograd metadata


@contextlib.contextmanager
def _piece_metadata_tracking() -> Iterator[Callable[[], None]]:
    """Keeps one forward-metadata entry per piece on Dynamo's TracingContext.

    aot_autograd compiles each piece's backward lazily, at the first backward,
    in reverse piece order, and reads the forward metadata from the tracing
    context; with several pieces under one Dynamo graph that would be the
    last piece's. torch provides DDPOptimizerContext for exactly this (one
    Dynamo graph, many aot graphs), and goddp fills it the same way.
    Yields a function to call after each piece compiles. On an exception the
    context is restored so a whole-graph fallback compiles cleanly.
    """
    tracing = torch._guards.TracingContext.try_get()
    context_cls = None
    if tracing is not None and hasattr(tracing, "ddp_optimizer_ctx"):
        try:
            from torch._dynamo.backends.distributed import DDPOptimizerContext as context_cls
        except ImportError:
            context_cls = None
    if context_cls is None:
        yield lambda: None
        return

    previous_ctx = tracing.ddp_optimizer_ctx
    previous_meta = tracing.fw_metadata
    per_piece = context_cls()
    tracing.ddp_optimizer_ctx = per_piece
    last_seen = [previous_meta]

    def after_piece() -> None:
        meta = tracing.fw_metadata
        if meta is not None and meta is not last_seen[0]:
            per_piece.curr_bucket += 1
            per_piece.metadata_per_bucket.append(meta)
            last_seen[0] = meta

    try:
        yield after_piece
    except BaseException:
        tracing.ddp_optimizer_ctx = previous_ctx
        tracing.fw_metadata = previous_meta
        raise


@contextlib.contextmanager
def _inductor_keeps_output_strides() -> Iterator[None]:
    """Pieces get Dynamo's (eager) strides as the example strides of values
    made by earlier pieces; Inductor honours them only with
    keep_output_stride (its default), so goddp keeps it on while compiling
    pieces."""
    config = sys.modules.get("torch._inductor.config")
    if config is None or getattr(config, "keep_output_stride", True):
        yield
        return
    logger.info("goddp: compiling pieces with torch._inductor.config.keep_output_stride=True")
    with config.patch(keep_output_stride=True):
        yield


# --------------------------------------------------------------------------
# The backend


def _warn_fallback(reason: str) -> None:
    message = f"goddp: {reason}; compiling the whole graph with the inner compiler instead"
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logger.warning(message)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _piece_example_inputs(
    gm: fx.GraphModule, example_inputs: Sequence[Any], pieces: Sequence[Any]
) -> list[list[Any]]:
    """Example inputs per piece: the graph's own example inputs for its
    placeholders, Dynamo's fake values (node.meta) for values from earlier
    pieces. Nothing is re-run under fake tensors."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise RuntimeError(
            f"graph has {len(placeholders)} placeholders but {len(example_inputs)} example inputs"
        )
    known = dict(zip(placeholders, example_inputs))
    result = []
    for piece in pieces:
        values = []
        for node in piece.input_nodes:
            if node in known:
                values.append(known[node])
                continue
            value = example_value(node)
            if not isinstance(value, _CROSSING_TYPES):
                # A tuple from a multi-output op whose getitems landed in a
                # later piece, for instance: the inner compilers take tensors
                # and symbolic scalars only.
                raise RuntimeError(
                    f"value {node.name!r} of type {type(value).__name__} would cross a cut; "
                    "only tensors and scalars can"
                )
            values.append(value)
        result.append(values)
    return result


_CROSSING_TYPES = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def _log_pieces(pieces: Sequence[Any]) -> None:
    if not logger.isEnabledFor(logging.DEBUG):
        return
    for piece in pieces:
        logger.debug("goddp: piece %d graph:\n%s", piece.index, piece.gm.graph)


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Options) -> Callable[..., Any]:
    """Compiles one Dynamo graph according to options (see module doc)."""
    _refuse_ddp_optimizer_pieces(gm)
    inner = resolve_inner(options)
    ddp = active_ddp_module()
    if ddp is None:
        return inner(gm, example_inputs)
    ddp_mode = torch._dynamo.utils.get_optimize_ddp_mode()
    if ddp_mode.startswith("python_reducer"):
        logger.info(
            "goddp: optimize_ddp=%r lets compiled autograd schedule DDP's allreduces; "
            "compiling the whole graph without cuts",
            ddp_mode,
        )
        return inner(gm, example_inputs)

    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("goddp: original graph:\n%s", gm.graph)
    settings = read_ddp_settings(ddp)
    note_ddp_settings(ddp, settings, options)
    caps = caps_for(settings, options)
    not_aligned = "off (align_buckets=False or mode='torch')"
    if options.aligns_buckets:
        not_aligned = alignment_blocker(ddp)
        if not_aligned is None:
            caps = dataclasses.replace(caps, align_buckets=True)
    timings = dict.fromkeys(("export", "plan", "cut", "example_inputs", "compile", "stitch"), 0.0)
    record: dict[str, Any] = {
        "fingerprint": None,
        "mode": options.mode,
        "caps": caps.to_dict(),
        "num_pieces": 1,
        "pieces": [],
        "buckets": [],
        "timings": timings,
        "fallback": None,
        "plan_check": None,
        "graph": {"num_nodes": len(gm.graph.nodes), "num_params": None},
        "ddp_buckets": None,
        "inner": options.inner if isinstance(options.inner, str) else getattr(options.inner, "__name__", repr(options.inner)),
    }

    def whole_graph(reason: str | None) -> Callable[..., Any]:
        if reason is not None:
            record["fallback"] = reason
            _warn_fallback(reason)
        start = time.perf_counter()
        try:
            return inner(gm, example_inputs)
        finally:
            timings["compile"] += time.perf_counter() - start
            add_record(record)

    # Plan.
    try:
        start = time.perf_counter()
        exported = export_graph(gm, param_name_of=settings.param_name_of, ignored_names=settings.ignored_names)
        timings["export"] = time.perf_counter() - start
        record["graph"]["num_params"] = len(exported.params)
        start = time.perf_counter()
        plan = decode_plan(call_planner(exported, options.mode, caps), exported, options.mode, caps)
        if caps.align_buckets:
            not_aligned = coverage_blocker(ddp, [b.param_names for b in plan.buckets])
            if not_aligned is not None:
                caps = dataclasses.replace(caps, align_buckets=False)
                plan = decode_plan(call_planner(exported, options.mode, caps), exported, options.mode, caps)
        timings["plan"] = time.perf_counter() - start
    except Exception as exc:
        if options.strict:
            raise
        if options.check_plans:
            record["plan_check"] = check_plans_across_ranks(None, 1)
        return whole_graph(f"planning failed ({_describe(exc)})")

    plan_dict = plan.to_dict()
    if caps.align_buckets and plan.num_pieces <= 1:
        caps, not_aligned = dataclasses.replace(caps, align_buckets=False), "one piece: nothing to align"
    record["caps"] = caps.to_dict()
    record["ddp_buckets"] = {"aligned": caps.align_buckets, "reason": not_aligned}
    if not caps.align_buckets and options.aligns_buckets:
        note_once(ddp, f"goddp: DDP keeps its own buckets, which may straddle the cuts: {not_aligned}")
    record.update(
        fingerprint=plan.fingerprint,
        num_pieces=plan.num_pieces,
        pieces=plan_dict["pieces"],
        buckets=plan_dict["buckets"],
    )
    if options.check_plans:
        record["plan_check"] = check_plans_across_ranks(plan.fingerprint, plan.num_pieces)
    if options.log_plan:
        logger.info("%s", plan.table())
    if plan.num_pieces <= 1:
        return whole_graph(None)

    # Cut.
    try:
        start = time.perf_counter()
        pieces = cut_graph(gm, exported, plan, entry_grad_enabled=torch.is_grad_enabled())
        timings["cut"] = time.perf_counter() - start
        start = time.perf_counter()
        piece_inputs = _piece_example_inputs(gm, example_inputs, pieces)
        timings["example_inputs"] = time.perf_counter() - start
    except Exception as exc:
        if options.strict:
            raise
        return whole_graph(f"cutting the graph along the plan failed ({_describe(exc)})")
    _log_pieces(pieces)

    # Compile each piece.
    compiled = []
    start = time.perf_counter()
    try:
        with _inductor_keeps_output_strides(), _piece_metadata_tracking() as after_piece:
            for piece, inputs in zip(pieces, piece_inputs):
                try:
                    compiled.append(inner(piece.gm, inputs))
                except Exception as exc:
                    raise GoddpFallback(f"compiling piece {piece.index} of {len(pieces)} failed ({_describe(exc)})") from exc
                after_piece()
    except GoddpFallback as fallback:
        timings["compile"] = time.perf_counter() - start
        if options.strict:
            raise fallback.__cause__ from None
        return whole_graph(str(fallback))
    timings["compile"] = time.perf_counter() - start

    start = time.perf_counter()
    stitched = StitchedPieces(gm, pieces, compiled)
    if caps.align_buckets:
        # Installed on the first real call, inside DDP's forward: never while
        # Dynamo traces with fake tensors.
        stitched.before_first_call = PendingAlignment(ddp, [b.bytes for b in plan.buckets], record["ddp_buckets"])
    timings["stitch"] = time.perf_counter() - start
    add_record(record)
    return stitched


def goddp_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: Mapping[str, Any] | None = None,
    mode: str | None = None,
    **_ignored: Any,
) -> Callable[..., Any]:
    """The Dynamo backend registered as "goddp".

    torch.compile passes ``options=`` (goddp's options, see goddp.backend)
    and, when given, ``mode=`` (torch.compile's mode, forwarded to the inner
    backend; goddp's own cutting mode is the "mode" key of options).
    """
    return compile_graph(gm, example_inputs, parse_options(options).with_compile_mode(mode))


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
        mode: str | None = None,
        **_ignored: Any,
    ) -> Callable[..., Any]:
        resolved = parse_options({**self._raw, **options}) if options else self.options
        return compile_graph(gm, example_inputs, resolved.with_compile_mode(mode))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._raw.items())
        return f"goddp.backend({args})"


def make_backend(**options: Any) -> Callable[..., Any]:
    """Returns a Dynamo backend; see goddp.backend for the options."""
    if not options:
        return goddp_backend
    return ConfiguredBackend(options)


_switch_off_ddp_optimizer()
_register_with_dynamo()
