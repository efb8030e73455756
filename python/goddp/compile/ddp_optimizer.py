"""goddp and torch's own DDPOptimizer, which must not both cut a graph.

Dynamo puts its DDPOptimizer in front of any backend while
``torch._dynamo.config.optimize_ddp`` is on, and reads that setting when a
frame is converted, so a backend cannot switch it off from inside its own
call. Importing goddp's backend therefore switches it off
(``switch_off_at_import``); should goddp still receive a piece that
DDPOptimizer cut, ``refuse_its_pieces`` stops with the fix in the message.
"""

from __future__ import annotations

import logging
import os
import sys

import torch
from torch import fx

logger = logging.getLogger("goddp")

KEEP_ENV = "GODDP_KEEP_OPTIMIZE_DDP"

REFUSAL = (
    "goddp received a graph piece that torch's DDPOptimizer already split "
    "(torch._dynamo.config.optimize_ddp is on). goddp must see the whole graph to plan "
    "its own cuts. Set `torch._dynamo.config.optimize_ddp = False` before calling the "
    "compiled model (goddp does this when it is imported unless GODDP_KEEP_OPTIMIZE_DDP=1 "
    "is set or the setting was turned back on afterwards)."
)


def switch_off_at_import() -> None:
    """Sets optimize_ddp = "no_optimization" when it is True or
    "ddp_optimizer", unless GODDP_KEEP_OPTIMIZE_DDP=1; says so at INFO."""
    if os.environ.get(KEEP_ENV) == "1":
        return
    config = torch._dynamo.config
    if config.optimize_ddp is True or config.optimize_ddp == "ddp_optimizer":
        config.optimize_ddp = "no_optimization"
        logger.info(
            "goddp: set torch._dynamo.config.optimize_ddp = 'no_optimization' so that goddp, "
            "not torch's DDPOptimizer, splits DDP graphs (GODDP_KEEP_OPTIMIZE_DDP=1 keeps it on)"
        )


def _called_from_ddp_optimizer() -> bool:
    """Whether DDPOptimizer's compile_submod is on the call stack (the
    pieces it hands on carry no other mark on every torch version)."""
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


def refuse_its_pieces(gm: fx.GraphModule) -> None:
    """Raises RuntimeError when gm is a piece DDPOptimizer cut."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    text = getattr(reason, "reason", reason)
    if (text is not None and "DDPOptimizer" in str(text)) or _called_from_ddp_optimizer():
        raise RuntimeError(REFUSAL)


def compiled_autograd_schedules_ddp() -> str | None:
    """The optimize_ddp mode when compiled autograd schedules DDP's
    allreduces itself ("python_reducer..."), so goddp must not cut; else None."""
    ddp_mode = torch._dynamo.utils.get_optimize_ddp_mode()
    return ddp_mode if ddp_mode.startswith("python_reducer") else None
