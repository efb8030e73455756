"""What goddp knows and decided about one DDP module, in one object.

Note [One object per DDP module]: everything goddp keeps about a DDP
module lives in its ``ModuleState``, reached only through ``state_of``: the
one attribute goddp sets on the module (``_goddp``), so that it goes away
with the module, and no registry outside it holds the module. A copy of the
module (copy, deepcopy, pickle) starts with a fresh state: goddp has decided
nothing about it yet.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any

logger = logging.getLogger("goddp")

ATTR = "_goddp"

# Numbers the modules' keys (never reused, unlike id()).
_numbers = itertools.count()


@dataclasses.dataclass(eq=False)
class ModuleState:
    """One DDP module's goddp state (Note [One object per DDP module])."""

    # Its key in plan records (module_key), once goddp planned inside it.
    key: str | None = None
    # Its settings as goddp reads them (goddp.ddp.settings.DDPSettings),
    # read at its first graph.
    settings: Any = None
    # What goddp has already said about it: the settings note, the notes
    # said once (Note [A plan's notes] in goddp.compile.notes), the
    # compiled-autograd warning (goddp.compile.compiled_autograd).
    settings_noted: bool = False
    noted: set[str] = dataclasses.field(default_factory=set)
    warned_cpp_reducer: bool = False
    # The agreement of its ranks (goddp.ranks.agreement): the decision so
    # far; the parameters that several graphs of the installed forward held
    # and those graphs' own layouts (Note [A later graph's part of the
    # layout] in goddp.ranks.layout); why it cannot train on, raised at
    # every later call.
    decision: Any = None
    shared: frozenset[int] = frozenset()
    parts: frozenset[Any] = frozenset()
    fatal: BaseException | None = None
    # The forward whose graphs are recorded for one layout
    # (goddp.ranks.forward.ForwardRecord), while one is.
    forward: Any = None
    # The caps goddp installed on DDP (goddp.ddp.align), and DDP's own
    # bucket config from before, which planning keeps reading.
    aligned_caps: tuple[int, ...] | None = None
    original_config: Any = None
    # Its bucket_cap_mb="auto" (goddp.ranks.auto.AutoBuckets), from its
    # graph's compile to its decision.
    auto: Any = None
    # The goddp.trace installed on it (goddp.tracing.install.Installation).
    trace: Any = None
    # While its ranks wait to meet inside a Join context: this iteration's
    # Join allreduce, as goddp.ranks.join reads it (Note [Meeting under Join]).
    join_check: Any = None

    def __reduce__(self) -> Any:
        return (ModuleState, ())

    def module_key(self, ddp: Any) -> str:
        """This module's key in plan records: the wrapped module's qualified
        class name and a number unique in this process, the same for every
        graph of the module."""
        if self.key is None:
            self.key = f"{module_type_name(ddp)}#{next(_numbers)}"
        return self.key

    def note_once(self, message: str) -> None:
        """Logs message at INFO once for this module."""
        if message not in self.noted:
            self.noted.add(message)
            logger.info("%s", message)

    def note_settings(self, message: str | None) -> None:
        """Logs message (a plan's settings note, Note [A plan's notes] in
        goddp.compile.notes) at INFO if this is the module's first plan."""
        if not self.settings_noted:
            self.settings_noted = True
            if message is not None:
                logger.info("%s", message)


def state_of(ddp: Any, create: bool = True) -> ModuleState | None:
    """ddp's state, made at first use; None when create is False and goddp
    has none for it. A module that takes no attribute gets a fresh state at
    each call (its notes are then said each time)."""
    state = getattr(ddp, ATTR, None)
    if state is not None or not create:
        return state
    state = ModuleState()
    try:
        state = vars(ddp).setdefault(ATTR, state)
    except TypeError:  # no __dict__: nothing outlives this call
        state.key = f"{module_type_name(ddp)}@{id(ddp):x}"
    return state


def module_type_name(ddp: Any) -> str:
    """The wrapped module's qualified class name."""
    kind = type(getattr(ddp, "module", ddp))
    return f"{kind.__module__}.{kind.__qualname__}"
