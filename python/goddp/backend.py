"""``goddp.backend``: both the module holding the Dynamo entry point and a
callable that makes a configured backend.

- ``goddp.backend.goddp_backend`` is the entry-point target
  (``goddp = "goddp.backend:goddp_backend"`` in group
  ``torch_dynamo_backends``), i.e. what ``backend="goddp"`` resolves to.
- ``goddp.backend(**options)`` returns a backend with those options bound:
  ``torch.compile(ddp_model, backend=goddp.backend(inner="aot_eager"))``.
  With no options it returns ``goddp_backend`` itself.

Importing this module switches ``torch._dynamo.config.optimize_ddp`` off
(see goddp.compile.ddp_optimizer).

The options, also accepted as ``torch.compile(..., backend="goddp",
options={...})``, are listed below from goddp.options.OPTIONS, their one
table; an unknown key or a bad value raises ValueError naming the valid
choices.

"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
import types
from typing import Any, Callable, Mapping, Sequence

from torch import fx
from torch._dynamo.backends import registry

from goddp.compile import ddp_optimizer
from goddp.compile.pipeline import compile_graph
from goddp.options import MODES, OPTION_KEYS, Options, options_text, parse_options

if __doc__:  # None under python -OO
    __doc__ += options_text()

BACKEND_NAME = "goddp"
ENTRY_POINT_GROUP = "torch_dynamo_backends"

logger = logging.getLogger("goddp")


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
    except Exception:  # another package's broken metadata: goddp registers itself, and imports
        logger.debug("goddp: could not read the %s entry points", ENTRY_POINT_GROUP, exc_info=True)
        return False


def _register_with_dynamo() -> None:
    """Registers "goddp" unless the installed entry point will (Dynamo loads
    entry points lazily and would reject a name registered twice)."""
    if BACKEND_NAME in registry._COMPILER_FNS or _entry_point_installed():
        return
    registry.register_backend(compiler_fn=goddp_backend, name=BACKEND_NAME)


class _CallableModule(types.ModuleType):
    """Lets ``goddp.backend(**options)`` work while ``goddp.backend`` stays the
    module that holds the entry point."""

    def __call__(self, **options: Any) -> Callable[..., Any]:
        return make_backend(**options)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "ConfiguredBackend",
    "MODES",
    "OPTION_KEYS",
    "Options",
    "compile_graph",
    "goddp_backend",
    "make_backend",
    "parse_options",
]

ddp_optimizer.switch_off_at_import()
_register_with_dynamo()
