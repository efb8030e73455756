"""The oracle cases' graph JSON, made by goddp's production exporter.

Both generators (ddp_oracle/generate.py, torch_oracle/generate.py) encode
their graphs with goddp.graph.export.export_graph, the exporter the backend
uses, and write its arrays in the layout planner/oracle_test.go reads, so
that `go test ./planner` checks the exporter's encoding against real torch
as well as the planner.
"""

from __future__ import annotations

from typing import Sequence

from goddp.native import extension as _native
from goddp.graph.export import ExportedGraph


def _csr_renumbered(values: Sequence[int], renumber: Sequence[int]) -> list[int]:
    return [renumber[v] for v in values]


def graph_json(exported: ExportedGraph, *, param_order: Sequence[int] | None = None, dtype: bool = True) -> dict:
    """exported as the oracle files' "graph" object.

    param_order lists the exporter's parameter indices in the order the
    file's parameter table wants (default: the exporter's own order, first
    reference first); dtype=False leaves out the dtype codes.
    """
    a = exported.arrays
    order = list(range(a["num_params"])) if param_order is None else list(param_order)
    if sorted(order) != list(range(a["num_params"])):
        raise ValueError("param_order must list every exported parameter once")
    renumber = [0] * len(order)
    for new, old in enumerate(order):
        renumber[old] = new
    names = exported.param_names
    flags = a["param_flags"]
    params = []
    for old in order:
        entry = {
            "name": names[old],
            "bytes": a["param_bytes"][old],
            "storage_bytes": a["param_storage_bytes"][old],
        }
        if dtype:
            entry["dtype"] = a["param_dtypes"][old]
        entry["requires_grad"] = bool(flags[old] & _native.PARAM_REQUIRES_GRAD)
        entry["ignored"] = bool(flags[old] & _native.PARAM_DDP_IGNORED)
        params.append(entry)
    return {
        "ops": a["node_ops"].tolist(),
        "module_ids": a["node_module_ids"].tolist(),
        "param_offsets": a["node_param_offsets"].tolist(),
        "param_index": _csr_renumbered(a["node_params"], renumber),
        "param_refs": a["node_param_refs"].tolist(),
        "user_offsets": a["node_user_offsets"].tolist(),
        "users": a["node_users"].tolist(),
        "params": params,
    }

