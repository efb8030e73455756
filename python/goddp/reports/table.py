"""The plan table: what goddp logs at INFO for each plan (option log_plan),
rendered by the planner (planner/table.go, goddp_plan_table)."""

from __future__ import annotations

from typing import Sequence

from goddp.native import extension as _native
from goddp.native.plan import GraphPlan


def plan_table(plan: GraphPlan, same_as: Sequence[int] | None = None, eager: Sequence[int] = ()) -> str:
    """The table of plan. same_as: per piece, the piece whose compiled code
    it reuses (itself if none); None when the pieces were not compared.
    eager: the pieces run eagerly."""
    return _native.plan_table(
        {
            "fingerprint": plan.fingerprint,
            "mode": plan.mode,
            "num_pieces": plan.num_pieces,
            "caps": plan.caps.to_dict(),
            "buckets": [b.to_dict() for b in plan.buckets],
            "alignment": plan.alignment,
            "merged_cuts": plan.merged_cuts,
            "same_as": None if same_as is None else list(same_as),
            "eager": list(eager),
        }
    )
