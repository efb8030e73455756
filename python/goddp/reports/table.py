"""The plan table: what goddp logs at INFO for each plan (option log_plan).

Pure formatting of the planner's answer; the caller only adds which pieces
share one compiled callable (same_as), which it learns by comparing the cut
pieces, and which run eagerly.
"""

from __future__ import annotations

from typing import Sequence

from goddp.native.plan import READY_GROUPS, GraphPlan
from goddp.options import MIB

HEADER = ("bucket", "MiB", "piece", "params")


def plan_table(plan: GraphPlan, same_as: Sequence[int] | None = None, eager: Sequence[int] = ()) -> str:
    """The table of plan: a head line (mode, fingerprint, counts, caps in
    MiB, the alignment, and with same_as the distinct and reused pieces), a
    line naming the reused pieces, a line naming the eager ones, then one
    row per parameter with its bucket's index, size (MiB) and piece on the
    bucket's first row. same_as: per piece, the piece whose compiled code it
    reuses (itself if none); None when the pieces were not compared. eager:
    the pieces run eagerly. A NUL in a name or word is written \\x00, the
    same text as when the planner wrote the table for C's NUL-terminated
    strings."""
    reused = [(p, leader) for p, leader in enumerate(same_as or ()) if p != leader]
    lines = [_head(plan, same_as, len(reused))]
    if reused:
        lines.append(
            "reused compiled pieces (piece=the piece compiled for it): " + " ".join(f"{p}={leader}" for p, leader in reused)
        )
    if eager:
        lines.append(
            "eager pieces (edges outside the repeated blocks, not compiled; option edges): " + " ".join(str(p) for p in eager)
        )
    lines += _rows(plan)
    return "\n".join(lines).replace("\0", "\\x00")


def _mib(n: int, decimals: int) -> str:
    return f"{n / MIB:.{decimals}f}"


def _head(plan: GraphPlan, same_as: Sequence[int] | None, num_reused: int) -> str:
    caps = plan.caps
    head = (
        f"goddp plan: mode={plan.mode} fingerprint={plan.fingerprint:016x} pieces={plan.num_pieces} "
        f"buckets={len(plan.buckets)} cap={_mib(caps.bucket_cap_bytes, 2)} MiB first={_mib(caps.first_bucket_cap_bytes, 2)} MiB"
    )
    if caps.bucket_caps_bytes:
        head += " per-bucket=[" + ", ".join(_mib(c, 2) for c in caps.bucket_caps_bytes) + "] MiB"
    if caps.max_pieces:
        head += f" max_pieces={caps.max_pieces}"
    if caps.align_buckets:
        head += f" (DDP's buckets set to the pieces: {plan.alignment}"
        if not plan.merged_cuts:
            head += ")"
        elif plan.alignment == READY_GROUPS:
            head += f", {plan.merged_cuts} cuts close no bucket)"
        else:
            head += f", {plan.merged_cuts} cuts merged)"
    if same_as is not None:
        head += f" distinct pieces={len(same_as) - num_reused} reused={num_reused}"
    return head


def _rows(plan: GraphPlan) -> list[str]:
    """The bucket table: its first three columns padded to their widest
    cell, the parameter names last, as they are (not padded, not stripped:
    a name may end in a space or hold a line break)."""
    cells = [HEADER]
    for bucket in plan.buckets:
        names = list(bucket.param_names) or ["(none)"]
        piece = f"{bucket.piece} (extended)" if bucket.extended else str(bucket.piece)
        cells.append((str(bucket.index), _mib(bucket.bytes, 3), piece, names[0]))
        cells += [("", "", "", name) for name in names[1:]]
    widths = [max(len(row[i]) for row in cells) for i in range(3)]
    return ["".join(row[i].ljust(widths[i]) + "  " for i in range(3)) + row[3] for row in cells]
