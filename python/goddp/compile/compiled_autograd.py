"""goddp and torch's compiled autograd: which of the two schedules DDP.

Note [Compiled autograd and DDP]: DDP's allreduces are scheduled either by
DDP's C++ reducer, from hooks on the gradients' accumulators while autograd
runs the backward goddp cut into pieces, or, under compiled autograd, by
the backward graph compiled autograd traces, which needs DDP's Python
reducer (``torch._dynamo.config.optimize_ddp = "python_reducer"``, read
when the DDP module is built). The two do not mix:

- compiled autograd on (``torch._dynamo.config.compiled_autograd``) and a
  DDP module with the C++ reducer: a backward that torch.compile traces
  raises torch's "Compiled autograd is not compatible with C++ DDP
  Reducer" (a backward run eagerly is left alone). goddp warns once per
  DDP module, at compile time (``warn_cpp_reducer``), saying what torch
  needs and what goddp does then, and cuts as usual meanwhile.
- optimize_ddp "python_reducer": DDP's forward no longer marks itself as
  the active DDP module, and Dynamo inlines it, so the graph carries DDP
  only in its module stack (``inlines_ddp``). goddp says once, at INFO,
  that compiled autograd schedules DDP's allreduces, and gives the graph to
  the inner compiler uncut (``passes_uncut``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import fx
from torch.nn.parallel import DistributedDataParallel

from goddp.compile import ddp_optimizer
from goddp.ddp.private import uses_python_reducer
from goddp.ddp.refusals import stand_in_blocker
from goddp.ddp.state import state_of

logger = logging.getLogger("goddp")

CPP_REDUCER = (
    "goddp: torch._dynamo.config.compiled_autograd is on, and this DDP module uses DDP's C++ reducer, "
    "which compiled autograd cannot trace: a backward that torch.compile compiles raises \"Compiled "
    "autograd is not compatible with C++ DDP Reducer\". torch needs torch._dynamo.config.optimize_ddp = "
    "\"python_reducer\" set before the DDP module is built; compiled autograd then schedules DDP's "
    "allreduces, and goddp gives each graph to the inner compiler uncut. Until then goddp cuts this "
    "module's graphs as usual, for a backward that runs outside torch.compile"
)

# The modes (optimize_ddp) already told (the DDP modules warned: their state).
_said_uncut: set[str] = set()


def inlines_ddp(gm: fx.GraphModule) -> bool:
    """Whether a DistributedDataParallel module is in the module stack of
    one of gm's nodes (Dynamo inlined its forward)."""
    for node in gm.graph.nodes:
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            kind = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
            if isinstance(kind, type) and issubclass(kind, DistributedDataParallel):
                return True
            if isinstance(kind, str) and kind.rsplit(".", 1)[-1] == "DistributedDataParallel":
                return True
    return False


def passes_uncut(gm: fx.GraphModule, ddp: Any) -> bool:
    """Whether compiled autograd schedules DDP's allreduces for gm
    (optimize_ddp "python_reducer...", gm inside a DDP forward or inlining
    one), so that gm goes to the inner compiler uncut; says so once at INFO."""
    mode = ddp_optimizer.compiled_autograd_schedules_ddp()
    if mode is None or (ddp is None and not inlines_ddp(gm)):
        return False
    if ddp is not None:
        # Built before optimize_ddp changed: it kept the C++ reducer.
        warn_cpp_reducer(ddp)
    if mode not in _said_uncut:
        _said_uncut.add(mode)
        logger.info(
            "goddp: optimize_ddp=%r lets compiled autograd schedule DDP's allreduces; "
            "compiling the whole graph without cuts",
            mode,
        )
    return True


def warn_cpp_reducer(ddp: Any) -> None:
    """Warns once per DDP module when compiled autograd is on and ddp runs
    DDP's C++ reducer (Note [Compiled autograd and DDP])."""
    if not getattr(torch._dynamo.config, "compiled_autograd", False):
        return
    if uses_python_reducer(ddp) or stand_in_blocker(ddp) is not None:
        return
    state = state_of(ddp)
    if state.warned_cpp_reducer:
        return
    state.warned_cpp_reducer = True
    warnings.warn(CPP_REDUCER, RuntimeWarning, stacklevel=2)
    logger.warning("%s", CPP_REDUCER)
