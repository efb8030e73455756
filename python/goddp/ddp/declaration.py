"""DDP's declaration order, for the buckets it keeps under find_unused_parameters.

With ``find_unused_parameters=True`` and no ``static_graph``, DDP never
rebuilds its buckets: it keeps the ones it filled at construction, walking
its parameter list in declaration order against the caps. goddp then plans
with ``bucket_order="declaration"`` and tells the planner each parameter's
position in that list; the planner (planner/declorder.go) decides the caps
and which cuts to keep. This module only gathers the facts.
"""

from __future__ import annotations

import dataclasses
from array import array
from typing import Any, Sequence

from goddp.graph.export import ExportedGraph


def bucket_order(ddp: Any) -> str:
    """"declaration" when this DDP module never rebuilds its buckets, else "ready"."""
    if getattr(ddp, "find_unused_parameters", False) and not getattr(ddp, "static_graph", False):
        return "declaration"
    return "ready"


def ddp_parameter_names(ddp: Any) -> list[str]:
    """The names (relative to the wrapped module) of DDP's parameters, in
    the order its reducer indexes them."""
    parameters, _ = ddp._build_params_for_reducer()
    names: dict[int, str] = {}
    for name, param in ddp.module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    return [names[id(p)] for p in parameters]


def with_ddp_positions(exported: ExportedGraph, names: Sequence[str]) -> ExportedGraph:
    """exported with goddp_graph.param_ddp_positions set: each parameter's
    index in ``names`` (DDP's list), -1 where DDP does not reduce it.
    Matched by name: the graph may hold Dynamo's stand-ins rather than the
    parameters themselves."""
    position = {name: k for k, name in enumerate(names)}
    positions = array("i", (position.get(name, -1) for name in exported.param_names))
    return dataclasses.replace(exported, arrays={**exported.arrays, "param_ddp_positions": positions})
