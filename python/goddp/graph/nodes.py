"""Small facts about FX nodes that the graph modules share."""

from __future__ import annotations

from typing import Any

from torch import fx

_NO_DEFAULT = object()


def example_value(node: fx.Node, default: Any = _NO_DEFAULT) -> Any:
    """Dynamo's fake value for a node (meta["example_value"], or "val").
    Raises KeyError when there is none, unless a default is given."""
    meta = node.meta
    if "example_value" in meta:
        return meta["example_value"]
    if "val" in meta:
        return meta["val"]
    if default is not _NO_DEFAULT:
        return default
    raise KeyError(f"node {node.name!r} has no example_value/val metadata")


def resolve_attr(root: Any, target: str) -> Any:
    """getattr along a dotted path (get_attr and call_module targets)."""
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def is_compute(node: fx.Node) -> bool:
    """Whether a node does work: neither a placeholder nor the output (as the
    planner counts nodes: planner/common.go, isCompute)."""
    return node.op not in ("placeholder", "output")
