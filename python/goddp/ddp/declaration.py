"""DDP's declaration order, for the buckets it keeps under find_unused_parameters.

With ``find_unused_parameters=True`` and no ``static_graph``, DDP never
rebuilds its buckets: it keeps the ones it filled at construction, walking
its parameter list in declaration order against the caps. goddp tells the
planner DDP's flags and each parameter's position in that list; the planner
decides the order (planner/settings.go), the caps and which cuts to keep
(planner/declorder.go), and checks with the same positions that aligned
buckets hold exactly DDP's parameters. This module only gathers the facts.
"""

from __future__ import annotations

from typing import Any

from goddp.ddp import private
from goddp.graph.export import parameter_names


def ddp_parameter_names(ddp: Any) -> list[str]:
    """The names (relative to the wrapped module) of DDP's parameters, in
    the order its reducer indexes them."""
    names = parameter_names(ddp.module)
    return [names[id(p)] for p in private.ddp_parameters(ddp)]
