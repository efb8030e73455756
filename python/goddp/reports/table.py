"""The plan table: what goddp logs at INFO for each plan (option log_plan)."""

from __future__ import annotations

from typing import Sequence

from goddp.native.plan import MIB, GraphPlan


def plan_table(plan: GraphPlan, same_as: Sequence[int] | None = None, eager: Sequence[int] = ()) -> str:
    """A readable bucket table: one row per parameter, the bucket's index,
    size (MiB) and piece on its first row. same_as (per piece, the piece
    whose compiled code it reuses; itself if none) adds the counts of
    distinct and reused pieces and a line naming the reused ones; eager
    (the pieces run eagerly) adds a line naming them."""
    caps = plan.caps
    head = (
        f"goddp plan: mode={plan.mode} fingerprint={plan.fingerprint:016x} "
        f"pieces={plan.num_pieces} buckets={len(plan.buckets)} "
        f"cap={caps.bucket_cap_bytes / MIB:.2f} MiB first={caps.first_bucket_cap_bytes / MIB:.2f} MiB"
    )
    if caps.bucket_caps_bytes:
        head += " per-bucket=[" + ", ".join(f"{c / MIB:.2f}" for c in caps.bucket_caps_bytes) + "] MiB"
    if caps.max_pieces is not None:
        head += f" max_pieces={caps.max_pieces}"
    if caps.align_buckets:
        head += f" (DDP's buckets set to the pieces: {plan.alignment}"
        head += f", {plan.merged_cuts} cuts merged)" if plan.merged_cuts else ")"
    reused = [(p, leader) for p, leader in enumerate(same_as or ()) if p != leader]
    if same_as is not None:
        head += f" distinct pieces={len(same_as) - len(reused)} reused={len(reused)}"
    rows = [("bucket", "MiB", "piece", "params")]
    for bucket in plan.buckets:
        names = list(bucket.param_names) or ["(none)"]
        mark = " (extended)" if bucket.extended else ""
        rows.append((str(bucket.index), f"{bucket.bytes / MIB:.3f}", f"{bucket.piece}{mark}", names[0]))
        rows.extend(("", "", "", name) for name in names[1:])
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [head]
    if reused:
        lines.append(
            "reused compiled pieces (piece=the piece compiled for it): "
            + " ".join(f"{p}={leader}" for p, leader in reused)
        )
    if eager:
        lines.append(
            "eager pieces (edges outside the repeated blocks, not compiled; option edges): "
            + " ".join(str(p) for p in eager)
        )
    for row in rows:
        lines.append("  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3])
    return "\n".join(lines)
