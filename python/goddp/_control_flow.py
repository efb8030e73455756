"""Which exceptions are Dynamo steering its own compilation, not failures.

Note [Dynamo's control-flow exceptions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Dynamo raises some exceptions on purpose, from inside a backend, to change
how it compiles the frame; its own ``OutputGraph`` lets exactly these out of
the backend call and acts on them. They are not failures, and goddp must
never turn one into a fallback (a warning and an uncut graph) nor swallow
it: it re-raises them unchanged from every stage (export, planning, cutting,
example inputs, piece compiles, stitching), and Dynamo then re-traces or
skips the frame and, where it re-traces, hands goddp a new graph that goddp
plans from scratch. ``steers_dynamo`` below is the one test; every broad
``except`` on the compile path asks it first.

The classes, the same in torch 2.13, 2.14 and 2.15 (``torch._dynamo.exc``;
checked against each release's ``exc.py``, ``convert_frame.py`` and
``output_graph.py``'s ``_call_user_compiler``):

- ``RestartAnalysis`` and all its subclasses: Dynamo traces the frame again
  with different choices. ``TensorifyScalarRestartAnalysis`` is the one a
  backend meets: AOTAutograd's pass that turns Python floats into tensors
  (``torch/fx/passes/_tensorify_python_scalars.py``) raises it when a float
  input must be specialized instead, which happens in every piece of a cut
  graph that does not itself use the float, since the pieces share one
  ShapeEnv. The others (``SpeculationRestartAnalysis``,
  ``UnspecializeRestartAnalysis``, ``CompileCollectiveRestartAnalysis``,
  ``AutogradGradRestartAnalysis``, ``RequiresGradRestartAnalysis``) are
  raised while tracing, but goddp lets the whole family through: a subclass
  a later torch adds is covered without a change here.
- ``SkipFrame``: run the frame eagerly, now and later (Inductor raises it,
  e.g. for bfloat16 on a GPU without it).
- ``exceptions_allowed_to_be_fallback`` (fake-tensor data-dependent and
  unsupported-operator errors): Dynamo answers them with a graph break. A
  piece is traced with the very fake values the whole graph would be, so
  the whole graph would raise the same; goddp leaves the answer to Dynamo.

Everything else that a backend raises (``BackendCompilerFailed``,
``InductorError``, ``IndexError``, any other error) is a failure: goddp
falls back to compiling the whole graph (``strict=True`` raises).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger("goddp")


@functools.lru_cache(maxsize=1)
def steering_types() -> tuple[type[BaseException], ...]:
    """The exception classes of Note [Dynamo's control-flow exceptions] in
    the installed torch."""
    from torch._dynamo import exc

    found: list[type[BaseException]] = []
    for name in ("RestartAnalysis", "SkipFrame"):
        cls = getattr(exc, name, None)
        if isinstance(cls, type):
            found.append(cls)
    found.extend(c for c in getattr(exc, "exceptions_allowed_to_be_fallback", ()) if isinstance(c, type))
    return tuple(found)


def steers_dynamo(exc: BaseException) -> bool:
    """Whether exc is Dynamo steering its compilation (Note [Dynamo's
    control-flow exceptions]): re-raise it unchanged, never fall back."""
    return isinstance(exc, steering_types())


def pass_on(exc: BaseException, stage: str) -> BaseException:
    """Logs at INFO that exc leaves goddp from stage for Dynamo to act on,
    and returns exc itself, unchanged, for ``raise pass_on(exc, stage)``
    (which keeps its traceback and adds no context of goddp's)."""
    reason = getattr(exc, "restart_reason", None)
    logger.info(
        "goddp: %s raised %s%s, which Dynamo uses to steer its compilation: passed on, "
        "and the graph Dynamo traces next is planned anew",
        stage,
        type(exc).__name__,
        f" ({reason})" if reason else "",
    )
    return exc
