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
