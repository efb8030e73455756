"""What DDP will communicate for one module: the layout that the ranks of a
DDP module agree on (goddp._agreement, Note [Agreeing on DDP's layout]).

A Layout names DDP's parameters by their position in DDP's own parameter
list (``ddp_parameters``), which DDP checks at construction to be the same
on every rank, never by graph node or graph-local index. Its digest comes
from the Go planner (planner/layout.go).
"""

from __future__ import annotations

import array
import dataclasses
from typing import Any, Callable, Mapping, Sequence

ORDERS = ("ready", "declaration")


def build_id() -> str:
    """The goddp build as the layout names it: version and planner ABI."""
    from goddp import __version__
    from goddp._native import ABI_VERSION

    return f"goddp {__version__} abi {ABI_VERSION}"


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
        from goddp import _native

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

    def difference(self, other: "Layout", name_of: Callable[[int], str]) -> str | None:
        """What first differs between self and other, in words (parameters
        named by name_of(position)), or None when they are equal."""
        if self.build != other.build:
            return f"goddp build {self.build!r} against {other.build!r}"
        if self.order != other.order:
            return f"bucket order {self.order!r} against {other.order!r}"
        for k in range(max(len(self.buckets), len(other.buckets))):
            mine = self.buckets[k] if k < len(self.buckets) else ()
            theirs = other.buckets[k] if k < len(other.buckets) else ()
            if mine != theirs:
                return f"bucket {k}: {_names(mine, theirs, name_of)} against {_names(theirs, mine, name_of)}"
        if self.caps != other.caps:
            k = next((i for i, (a, b) in enumerate(zip(self.caps, other.caps)) if a != b), min(len(self.caps), len(other.caps)))
            return f"caps {list(self.caps)} against {list(other.caps)} bytes (from bucket {k} on)"
        return None


def _names(mine: Sequence[int], theirs: Sequence[int], name_of: Callable[[int], str]) -> str:
    """mine's parameters, those not in theirs first (at most three named)."""
    if not mine:
        return "no such bucket"
    only = [p for p in mine if p not in theirs]
    shown = (only or list(mine))[:3]
    names = ", ".join(name_of(p) for p in shown)
    more = len(only or mine) - len(shown)
    what = f"{len(only)} parameter(s) not in the other, " if only else "the same parameters in another order, "
    return f"[{what}{names}{f' and {more} more' if more > 0 else ''}]"


def layout_of(
    bucket_param_names: Sequence[Sequence[str]],
    caps: Sequence[int],
    order: str,
    positions: Mapping[str, int],
) -> Layout:
    """The layout of a plan's buckets (fully qualified names relative to the
    DDP-wrapped module, per bucket in DDP order) given DDP's caps and
    positions: name -> index in DDP's parameter list. A cap below one byte
    goes to DDP as one (goddp._align.install_bucket_caps)."""
    if order not in ORDERS:
        raise ValueError(f"goddp: layout order {order!r}; want one of {ORDERS}")
    return Layout(
        buckets=tuple(tuple(positions[name] for name in bucket) for bucket in bucket_param_names),
        caps=tuple(max(1, int(c)) for c in caps),
        order=order,
        build=build_id(),
    )
