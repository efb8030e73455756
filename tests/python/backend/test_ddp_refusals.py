"""goddp.ddp.refusals: why goddp.trace, or the reducer rebuild, leaves a DDP
module alone (Note [DDP refusals]), on stand-ins that hold the facts as DDP
does; the words users read are pinned in testdata/ddp_refusals.golden."""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _golden import check_golden
from goddp.ddp import private, refusals
from goddp.ddp.state import state_of

GOLDEN = Path(__file__).resolve().parent / "testdata" / "ddp_refusals.golden"


@dataclasses.dataclass(frozen=True)
class Facts:
    """What a DDP module holds that a trace is refused for."""

    traced: bool = False
    python_reducer: bool = False
    static_graph: bool = False
    every_delayed: bool = False
    hooks: int | Exception = 1  # Python comm hooks DDP lists, or what reading them raises
    logged: str | Exception | None = None  # the hook DDP's logging data names, or what reading it raises
    join: bool = False


class StandIn:
    """The attributes goddp.ddp.private reads, as DDP keeps them."""

    def __init__(self, facts: Facts) -> None:
        if facts.traced:
            state_of(self).trace = object()
        self._use_python_reducer = facts.python_reducer
        self.static_graph = facts.static_graph
        self._delay_all_reduce_all_params = facts.every_delayed
        self._join_config = SimpleNamespace(enable=facts.join)
        self.facts = facts

    @property
    def _comm_hooks(self) -> list[Any]:
        if isinstance(self.facts.hooks, Exception):
            raise self.facts.hooks
        return [(None, None)] * self.facts.hooks

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        if isinstance(self.facts.logged, Exception):
            raise self.facts.logged
        return {"comm_hook": self.facts.logged} if self.facts.logged else {}


# The trace's rules in the note's order: facts that make each apply.
RULES = {
    "traced": Facts(traced=True),
    "python reducer": Facts(python_reducer=True),
    "every allreduce delayed": Facts(every_delayed=True),
    "several hooks": Facts(hooks=3),
    "logging data": Facts(logged=KeyError("x")),
    "unknown built-in hook": Facts(hooks=0, logged="ALLREDUCE"),  # no BuiltinCommHookType is named so
}
# The names DDP's logging data gives the built-in hooks goddp registers again.
KNOWN_BUILTIN = ("BuiltinCommHookType.ALLREDUCE", "BuiltinCommHookType.FP16_COMPRESS")
# The goddp.ddp.private fact each rule of naive_trace_refusal reads (None:
# a plain attribute of the module).
READS = (None, "uses_python_reducer", "delays_every_allreduce", "comm_hooks", "comm_hooks",
         "builtin_comm_hook", "builtin_comm_hook")


def test_the_words_users_read():
    """Each rule's reason (GODDP_UPDATE_GOLDENS=1 rewrites the golden file)."""
    out = [f"trace, {name}: {refusals.trace_refusal(StandIn(facts))}\n" for name, facts in RULES.items()]
    check_golden(GOLDEN, "".join(out))


@pytest.mark.parametrize("index", range(len(RULES)), ids=list(RULES))
def test_the_first_rule_that_applies_is_the_reason(index):
    """With every later rule's fact too, a rule is still the reason; the
    alignment facts, and a Join context, refuse no trace."""
    rules = list(RULES.values())
    alone = refusals.trace_refusal(StandIn(rules[index]))
    assert alone is not None
    together: dict[str, Any] = {"join": True}
    for rule in reversed(rules[index:]):  # an earlier rule's fact wins (the hook count)
        together.update({f.name: getattr(rule, f.name) for f in dataclasses.fields(rule)
                         if getattr(rule, f.name) != f.default})
    assert refusals.trace_refusal(StandIn(Facts(**together))) == alone


def test_a_module_no_rule_refuses():
    known = tuple(Facts(hooks=0, logged=name) for name in KNOWN_BUILTIN)
    for facts in (Facts(), Facts(hooks=0), Facts(join=True), Facts(static_graph=True),
                  Facts(hooks=1, logged="hook named in the logs"), *known):
        assert refusals.trace_refusal(StandIn(facts)) is None


def test_comm_hooks_that_cannot_be_read_raise_where_a_rule_needs_them():
    unreadable = RuntimeError("no _comm_hooks on this DDP")
    with pytest.raises(RuntimeError, match="no _comm_hooks"):
        refusals.trace_refusal(StandIn(Facts(hooks=unreadable)))
    assert refusals.trace_refusal(StandIn(Facts(hooks=unreadable, every_delayed=True))).startswith("every parameter")


def naive_trace_refusal(f: Facts) -> tuple[str | Exception | None, int]:
    """Note [DDP refusals] read literally: every rule's fact taken at once
    (a built-in hook is one DDP's logging data names while DDP lists no
    Python hook; a known one is named as in KNOWN_BUILTIN), the first rule
    that applies wins; and how many rules were reached."""
    unread = isinstance(f.hooks, Exception)
    builtin = f.logged if isinstance(f.logged, Exception) or f.hooks == 0 else None
    rules = [
        (f.traced, "this DDP module is already being traced (one goddp.trace at a time)"),
        (f.python_reducer, "DDP uses the Python reducer (compiled autograd): it has no comm hooks"),
        (f.every_delayed, "every parameter is in DDP's delayed allreduce: DDP reduces nothing in backward"),
        (unread, f.hooks),
        (not unread and f.hooks > 1, f"DDP lists {f.hooks} comm hooks; expected at most one"),
        (isinstance(builtin, Exception), f"could not read DDP's logging data ({type(builtin).__name__}: {builtin})"),
        (bool(builtin) and builtin not in KNOWN_BUILTIN,
         f"a built-in C++ comm hook goddp cannot identify ({builtin}) is registered; it could not be "
         "registered again after the trace"),
    ]
    reached = next((i for i, (applies, _) in enumerate(rules) if applies), None)
    return (None, len(rules)) if reached is None else (rules[reached][1], reached + 1)


FACTS = st.builds(
    Facts,
    traced=st.booleans(), python_reducer=st.booleans(), static_graph=st.booleans(), every_delayed=st.booleans(),
    hooks=st.one_of(st.integers(0, 4), st.just(RuntimeError("unreadable hooks"))),
    logged=st.one_of(st.none(), st.sampled_from(["ALLREDUCE", "FP16_COMPRESS", "a (b)", *KNOWN_BUILTIN]),
                     st.text(max_size=8),
                     st.sampled_from([KeyError("x"), AttributeError("no logging data")])),
    join=st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(FACTS)
def test_trace_refusal_is_the_note_read_literally_reading_each_fact_once(facts):
    want, reached = naive_trace_refusal(facts)
    reads: collections.Counter[str] = collections.Counter()

    def counted(name, real):
        def read(ddp):
            reads[name] += 1
            return real(ddp)

        return read

    with pytest.MonkeyPatch.context() as mp:
        for name in {n for n in READS if n}:
            mp.setattr(private, name, counted(name, getattr(private, name)))
        if isinstance(want, Exception):
            with pytest.raises(type(want)):
                refusals.trace_refusal(StandIn(facts))
        else:
            assert refusals.trace_refusal(StandIn(facts)) == want
    # Each fact is read once, and only the facts of the rules reached, in
    # the note's order.
    assert max(reads.values(), default=0) <= 1, reads
    assert list(reads) == list(dict.fromkeys(n for n in READS[:reached] if n))
