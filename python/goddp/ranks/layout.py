"""What DDP will communicate for one module: the layout that the ranks of a
DDP module agree on (goddp.ranks.agreement, Note [Agreeing on DDP's layout]).

A Layout names DDP's parameters by their position in DDP's own parameter
list (``ddp_parameters``), which DDP checks at construction to be the same
on every rank, never by graph node or graph-local index. Its digest comes
from the Go planner (planner/layout.go); goddp.ranks.verdict words how two
layouts differ (layout_difference).
"""

from __future__ import annotations

import array
import dataclasses
from typing import Any, Mapping, Sequence

from goddp import __version__
from goddp.native import extension as _native

ORDERS = ("ready", "declaration")


def build_id() -> str:
    """The goddp build as the layout names it: version and planner ABI."""
    return f"goddp {__version__} abi {_native.ABI_VERSION}"


@dataclasses.dataclass(frozen=True)
class Layout:
    """DDP's buckets as goddp would set them.

    buckets: per bucket (DDP order), the DDP positions of its parameters in
        the order their gradients become ready.
    caps: the per-bucket caps (bytes) given to DDP, in the order DDP walks
        them.
    order: "ready" (DDP rebuilds from gradient-ready order) or
        "declaration" (find_unused_parameters=True: it never rebuilds).
    build: the goddp build that made it (build_id()).
    """

    buckets: tuple[tuple[int, ...], ...]
    caps: tuple[int, ...]
    order: str
    build: str

    @property
    def shares_caps(self) -> bool:
        """Several (dtype, device) groups walk the caps, cap j being every
        group's j-th bucket's (Note [Several dtype groups] in
        planner/keys.go): fewer caps than buckets, and no run of caps is a
        run of buckets. One group has a cap per bucket."""
        return len(self.caps) < len(self.buckets)

    def digest(self) -> int:
        """The planner's 64-bit digest (goddp_layout_digest); raises
        PlannerError for a layout no DDP module could have."""
        offsets = [0]
        for bucket in self.buckets:
            offsets.append(offsets[-1] + len(bucket))
        return _native.load().layout_digest(
            array.array("q", offsets).tobytes(),
            array.array("i", [p for bucket in self.buckets for p in bucket]).tobytes(),
            array.array("q", self.caps).tobytes(),
            _native.ORDER_READY if self.order == "ready" else _native.ORDER_DECLARATION,
            self.build,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": [list(b) for b in self.buckets], "caps": list(self.caps), "order": self.order, "build": self.build}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Layout":
        return cls(
            buckets=tuple(tuple(int(p) for p in b) for b in raw["buckets"]),
            caps=tuple(int(c) for c in raw["caps"]),
            order=str(raw["order"]),
            build=str(raw["build"]),
        )


def layout_of(
    bucket_param_names: Sequence[Sequence[str]],
    caps: Sequence[int],
    order: str,
    positions: Mapping[str, int],
) -> Layout:
    """The layout of a plan's buckets (fully qualified names relative to the
    DDP-wrapped module, per bucket in DDP order) given DDP's caps and
    positions: name -> index in DDP's parameter list. The caps are the
    planner's (at least one byte each; the digest refuses others)."""
    if order not in ORDERS:
        raise ValueError(f"goddp: layout order {order!r}; want one of {ORDERS}")
    return Layout(
        buckets=tuple(tuple(positions[name] for name in bucket) for bucket in bucket_param_names),
        caps=tuple(int(c) for c in caps),
        order=order,
        build=build_id(),
    )


# Note [A later graph's part of the layout]
#
# A graph that first trains after its DDP module installed goddp's layout
# (the resume frame recompiled for an .item() branch or loop count, a new
# shape, a branch first taken at step 3, a second torch.compile) follows
# the decision and never re-buckets training (Note [Where the ranks meet]
# in goddp.ranks.agreement). It is aligned when its buckets are installed
# ones: a contiguous run of whole installed buckets, in DDP order, each
# holding the same parameters (their order inside a bucket does not
# matter: a bucket closes once all of them are ready). One exception, the
# combining's (planner/forward.go): a parameter that several graphs of the
# installed forward held (shared) is counted in the earliest of them, in a
# bucket after the run in DDP order; a later graph that holds it too has it
# in one of its own buckets, and that is no difference. Two installed
# buckets in one bucket of the graph are a difference: both would close only
# at the end of that piece's backward. A graph whose layout is the very one
# a graph of the installed forward brought to the combining is aligned too
# (with several (dtype, device) groups the combined buckets are split by
# group, so no graph's own buckets are a run of them).
#
# A graph whose parameters are such a run but whose own plan buckets them
# otherwise (it was planned as if its caps were its own) is planned again
# with the run's caps, so that it is cut where the installed buckets close
# (goddp.compile.pipeline, _DDPGraphCompile.follow_installed). A graph
# compiled in the forward whose first call holds the round now due, before
# that round, is planned against the layout this rank will propose there
# (goddp.ranks.agreement.installed_layout); should the ranks keep DDP's
# buckets instead, nothing is lost but its record's "aligned". Anything
# else is a real difference, and the graph's plan record says so.


def installed_run(installed: Layout, part: Layout, shared: frozenset[int] = frozenset()) -> range | None:
    """The run of installed buckets (DDP order) that part's buckets are, or
    None (Note [A later graph's part of the layout]). shared: the
    parameters several graphs of the installed forward held."""
    if part.order != installed.order:
        return None
    return _Homes(installed, shared).run_of(part.buckets)


def covering_run(installed: Layout, positions: Sequence[int], shared: frozenset[int] = frozenset()) -> range | None:
    """The run of whole installed buckets whose parameters are positions,
    shared parameters counted after the run aside, or None (Note [A later
    graph's part of the layout])."""
    return _Homes(installed, shared).run_covering(set(positions))


class _Homes:
    """Each installed parameter's bucket, and the steps of the two runs."""

    def __init__(self, installed: Layout, shared: frozenset[int]) -> None:
        self.buckets = [frozenset(b) for b in installed.buckets]
        self.home = {p: k for k, bucket in enumerate(installed.buckets) for p in bucket}
        self.shared = shared

    def start(self, params: set[int]) -> int | None:
        """The first installed bucket params touch; None for none, or for a
        parameter the layout does not hold."""
        if any(p not in self.home for p in params):
            return None
        return min((self.home[p] for p in params), default=None)

    def run_of(self, buckets: Sequence[Sequence[int]]) -> range | None:
        """The longest run that buckets are: from the first installed
        bucket they touch, past every bucket their unshared parameters
        touch, and at most one installed bucket per bucket of theirs."""
        params = {p for b in buckets for p in b}
        start = self.start(params)
        if start is None:
            return None
        last = max((self.home[p] for p in params if p not in self.shared), default=start)
        for end in range(min(len(self.buckets), start + len(buckets)), last, -1):
            if self.is_run(buckets, start, end):
                return range(start, end)
        return None

    def is_run(self, buckets: Sequence[Sequence[int]], start: int, end: int) -> bool:
        """Whether buckets, the shared parameters counted after end taken
        out, are the installed buckets start..end-1."""
        later = {p for b in buckets for p in b if p in self.shared and self.home[p] >= end}
        kept = []
        for bucket in buckets:
            own = set(bucket) - later
            if bucket and not own:  # only parameters counted later: the combining drops it
                continue
            kept.append(own)
        return kept == [set(b) for b in self.buckets[start:end]]

    def run_covering(self, params: set[int]) -> range | None:
        k = start = self.start(params)
        if start is None:
            return None
        while k < len(self.buckets) and self.buckets[k] <= params:
            k += 1
        run = range(start, k)
        if not run or not self.counted_later({p for p in params if self.home[p] not in run}, k):
            return None
        return run

    def counted_later(self, params: set[int], end: int) -> bool:
        """Whether each of params is shared and counted after the run that
        ends at end."""
        return all(p in self.shared and self.home[p] >= end for p in params)
