"""The one fallback of the compile pipeline, and what is never a failure.

Note [Fallback]: failures never cost a training step. When a stage of the pipeline fails
(export, plan, cut, example inputs, compile piece N, stitch), goddp warns,
naming the stage and the real exception, and compiles the whole graph with
the inner compiler instead (``strict=True`` raises the exception itself).
``Stages.guard`` is that one fallback context; ``Stages.timed`` adds each
stage's time to the plan record.

Note [The fallback's words stay in Python]: the reason and the warning
(``describe``, ``warn_fallback``) are the one text goddp writes without the
planner: a fallback is also what happens when Go cannot answer (a
PlannerError, a ForkedChildError in a forked child, a planner that failed
to load), so its words must not need Go.

Dynamo steers its own compilation with exceptions (restart the analysis,
skip the frame, turn an unsupported fake-tensor operation into a graph
break). They are not failures of goddp's: ``is_dynamo_control_flow`` names
them, in this one place, and the fallback context lets them pass untouched
(Note [Dynamo's control-flow exceptions]).

Note [Dynamo's control-flow exceptions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo raises some exceptions on purpose, from inside a backend, to change
how it compiles the frame; its own ``OutputGraph`` lets exactly these out of
the backend call and acts on them. goddp must never turn one into a
fallback (a warning and an uncut graph) nor swallow it: every stage (export,
planning, cutting, example inputs, piece compiles, stitching) runs in
``Stages.guard``, which re-raises them unchanged (same object, no context
added) with one INFO line; Dynamo then re-traces or skips the frame and,
where it re-traces, hands goddp a new graph that goddp plans from scratch.
The classes, the same in torch 2.13, 2.14 and 2.15 (checked against each
release's ``torch/_dynamo/exc.py``, ``convert_frame.py`` and
``output_graph.py``'s ``_call_user_compiler``):

- ``RestartAnalysis`` and all its subclasses: Dynamo traces the frame again
  with other choices. ``TensorifyScalarRestartAnalysis`` is the one a
  backend meets: AOTAutograd's pass that turns Python floats into tensors
  (``torch/fx/passes/_tensorify_python_scalars.py``) raises it when a float
  input must be specialized instead, which happens in every piece of a cut
  graph that does not itself use the float, since the pieces share one
  ShapeEnv. The others (``SpeculationRestartAnalysis``,
  ``UnspecializeRestartAnalysis``, ``CompileCollectiveRestartAnalysis``,
  ``AutogradGradRestartAnalysis``, ``RequiresGradRestartAnalysis``) are
  raised while Dynamo traces; the whole family passes, so that a subclass a
  later torch adds is covered without a change here.
- ``SkipFrame``: run the frame eagerly, now and later (Inductor raises it,
  e.g. for bfloat16 on a GPU without it).
- ``exceptions_allowed_to_be_fallback`` (fake-tensor data-dependent and
  unsupported-operator errors): Dynamo answers them with a graph break. A
  piece is traced with the very fake values the whole graph would be, so
  the whole graph would raise the same; the answer is Dynamo's.

Everything else a stage raises (``BackendCompilerFailed``,
``InductorError``, ``IndexError``, ``Unsupported``, any other error) is a
failure: the fallback below (``strict=True`` raises it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from typing import Any, Iterator

import torch._dynamo.exc as dynamo_exc

from goddp.tools import structured
from goddp.tools.phases import phase

logger = logging.getLogger("goddp")

# What the WARNING and the plan record call each stage ("compile" per piece).
STAGES = {
    "export": "exporting the graph",
    "plan": "planning",
    "cut": "cutting the graph along the plan",
    "example_inputs": "making the pieces' example inputs",
    "identify": "comparing the pieces",
    "compile": "compiling piece {piece} of {pieces}",
    "stitch": "stitching the pieces",
}


@functools.lru_cache(maxsize=None)
def _control_flow_types() -> tuple[type[BaseException], ...]:
    # Read by name: a torch without one of them simply has nothing to pass.
    names = ("RestartAnalysis", "SkipFrame")
    found = [getattr(dynamo_exc, name) for name in names if hasattr(dynamo_exc, name)]
    # Fake-tensor failures Dynamo turns into a graph break of its own.
    found.extend(getattr(dynamo_exc, "exceptions_allowed_to_be_fallback", ()))
    return tuple(found)


def is_dynamo_control_flow(exc: BaseException) -> bool:
    """Whether exc is an exception Dynamo raises to steer compilation, which a
    backend must let through untouched: RestartAnalysis and its subclasses
    (Dynamo analyses the frame again), SkipFrame (Dynamo runs the frame
    eagerly), and the fake-tensor exceptions Dynamo makes a graph break of
    (torch._dynamo.exc.exceptions_allowed_to_be_fallback)."""
    return isinstance(exc, _control_flow_types())


def _passing_on(exc: BaseException, stage: str) -> None:
    reason = getattr(exc, "restart_reason", None)
    logger.info(
        "goddp: %s raised %s%s, which Dynamo uses to steer its compilation: passed on, "
        "and the graph Dynamo traces next is planned anew",
        stage,
        type(exc).__name__,
        f" ({reason})" if reason else "",
    )


def describe(exc: BaseException) -> str:
    """The exception's type and the first line of its message (see
    Note [The fallback's words stay in Python])."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class FellBack(Exception):
    """A stage failed and the graph is to be compiled whole (never leaves the
    pipeline). stage: the key in STAGES; reason: what failed, in words;
    cause: the real exception."""

    def __init__(self, stage: str, reason: str, cause: BaseException) -> None:
        super().__init__(reason)
        self.stage = stage
        self.reason = reason
        self.cause = cause


class Stages:
    """The stages of one graph's compile: their timings and their failures."""

    def __init__(self, strict: bool, timings: dict[str, float]) -> None:
        self.strict = strict
        self.timings = timings

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Adds the time spent in the block to timings[stage], also timed
        as torch's goddp.<stage> (Note [goddp in compile_times] in
        goddp.tools.phases)."""
        with phase(stage):
            start = time.perf_counter()
            try:
                yield
            finally:
                self.timings[stage] += time.perf_counter() - start

    @contextlib.contextmanager
    def guard(self, stage: str, **details: Any) -> Iterator[None]:
        """The fallback context: an exception in the block becomes FellBack
        naming the stage (details fill in its words: piece=, pieces=), unless
        the option strict is set or the exception is Dynamo's control flow,
        which pass as they are."""
        try:
            yield
        except FellBack:
            raise
        except Exception as exc:
            if is_dynamo_control_flow(exc):
                _passing_on(exc, STAGES[stage].format(**details))
                raise
            if self.strict:
                raise
            reason = f"{STAGES[stage].format(**details)} failed ({describe(exc)})"
            raise FellBack(stage, reason, exc) from exc

    @contextlib.contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """timed and guard together."""
        with self.timed(stage), self.guard(stage):
            yield


def warn_fallback(fell: FellBack) -> None:
    """Warns (warnings and logger "goddp"); the cause's whole message goes
    to WARNING and its traceback to DEBUG, since the reason keeps one line."""
    message = f"goddp: {fell.reason}; compiling the whole graph with the inner compiler instead"
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    structured.fallback(fell.stage, fell.reason, fell.cause)
    cause = fell.cause
    full = str(cause).strip()
    if "\n" in full:
        logger.warning("%s\n%s: %s", message, type(cause).__name__, full)
    else:
        logger.warning("%s", message)
    logger.debug("goddp: the cause of the fallback:", exc_info=cause)
