"""goddp's phases in torch's compile-time metrics.

Note [goddp in compile_times]: each phase of goddp's compile (export,
plan, cut, example_inputs, identify, compile, stitch: the keys of
``last_plans()[i]["timings"]``) runs inside torch's ``dynamo_timed`` under
the name ``goddp.<phase>``, and so does the ranks' agreement at a DDP
module's first training call (``goddp.agreement``). ``dynamo_timed`` is what
``torch._dynamo.utils.compile_times()`` reads and what writes the compile's
chromium trace events (tlparse's ``chromium_events.json``), so a user asking
torch where the first step went sees goddp's share beside Dynamo's and
Inductor's. ``goddp.compile`` holds the inner compiler's own phases, which
torch also lists by their names. Where a torch lacks ``dynamo_timed`` or
its keyword, the phase is timed by goddp's record alone.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

try:
    from torch._dynamo.utils import dynamo_timed as _dynamo_timed
except ImportError:  # a torch without it: goddp's own record still times the phases
    _dynamo_timed = None

PREFIX = "goddp."


def phase(name: str, compile_time: bool = True) -> ContextManager[None]:
    """A context timing goddp's phase name as ``goddp.<name>``;
    compile_time=False for a phase outside a compile (the agreement)."""
    if _dynamo_timed is None:
        return contextlib.nullcontext()
    key = PREFIX + name
    try:
        return _dynamo_timed(key, log_pt2_compile_event=compile_time)
    except TypeError:  # an older dynamo_timed without the keyword
        return _dynamo_timed(key)
