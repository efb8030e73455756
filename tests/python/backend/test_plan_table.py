"""The plan table (goddp.reports.table.plan_table): every part of it on a
plan worked out by hand, golden tables of the planner's plans of the test
models (testdata/table_*.golden, GODDP_UPDATE_GOLDENS=1 rewrites them),
before and after the pieces are compared, and the column rule against a
naive reference on any names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from _golden import check_golden, golden_path
from goddp.native.plan import BucketInfo, GraphPlan, PlanSettings
from goddp.options import MIB
from goddp.reports.table import plan_table


def make_plan(*, fingerprint, mode="ddp", num_pieces, caps, buckets, alignment="none", merged_cuts=0) -> GraphPlan:
    """A GraphPlan with what the table reads; buckets: (bytes, names,
    piece, extended) in DDP order, or BucketInfo."""
    infos = [
        b if isinstance(b, BucketInfo) else BucketInfo(index=k, bytes=b[0], param_names=tuple(b[1]), piece=b[2], extended=b[3])
        for k, b in enumerate(buckets)
    ]
    return GraphPlan(
        fingerprint=fingerprint, mode=mode, num_pieces=num_pieces, node_pieces={}, buckets=infos, caps=caps,
        alignment=alignment, merged_cuts=merged_cuts,
    )


def test_every_part_by_hand():
    plan = make_plan(
        fingerprint=0xAB, num_pieces=3,
        caps=PlanSettings(bucket_cap_bytes=25 * MIB, first_bucket_cap_bytes=MIB // 2,
                          bucket_caps_bytes=(MIB, 3 * MIB // 2), max_pieces=4, align_buckets=True),
        buckets=[
            BucketInfo(index=0, bytes=3 * MIB // 2, param_names=("héad.weight", "head.bias"), piece=2, extended=True),
            BucketInfo(index=1, bytes=1024, param_names=(), piece=1, extended=False),
            BucketInfo(index=12, bytes=MIB, param_names=("embed.weight",), piece=0, extended=False),
        ],
        alignment="declaration-order caps, pieces merged", merged_cuts=2,
    )
    assert plan_table(plan, same_as=[0, 1, 1], eager=[0]).split("\n") == [
        "goddp plan: mode=ddp fingerprint=00000000000000ab pieces=3 buckets=3 cap=25.00 MiB first=0.50 MiB "
        "per-bucket=[1.00, 1.50] MiB max_pieces=4 (DDP's buckets set to the pieces: declaration-order caps, pieces merged, "
        "2 cuts merged) distinct pieces=2 reused=1",
        "reused compiled pieces (piece=the piece compiled for it): 2=1",
        "eager pieces (edges outside the repeated blocks, not compiled; option edges): 0",
        "bucket  MiB    piece         params",
        "0       1.500  2 (extended)  héad.weight",
        "                             head.bias",
        "1       0.001  1             (none)",
        "12      1.000  0             embed.weight",
    ]
    # Without comparison, alignment, caps lists or eager pieces, the head
    # line ends after the first cap and only the table follows.
    plain = make_plan(fingerprint=1, mode="torch", num_pieces=1, merged_cuts=5, buckets=[],
                      caps=PlanSettings(bucket_cap_bytes=MIB, first_bucket_cap_bytes=MIB))
    assert plan_table(plain) == (
        "goddp plan: mode=torch fingerprint=0000000000000001 pieces=1 buckets=0 cap=1.00 MiB first=1.00 MiB\n"
        "bucket  MiB  piece  params"
    )
    # Compared pieces, none reused: counts without a reused line.
    assert plan_table(plain, same_as=[]).split("\n")[0].endswith(" distinct pieces=0 reused=0")


def test_nul_is_written_escaped():
    """A NUL in a parameter name, the mode or the alignment is written \\x00
    (as when the table crossed C's NUL-terminated strings), the same way
    every time."""
    plan = make_plan(
        fingerprint=1, mode="d\0dp", num_pieces=1, alignment="no\0ne",
        caps=PlanSettings(bucket_cap_bytes=MIB, first_bucket_cap_bytes=MIB, align_buckets=True),
        buckets=[(1, ["a\0b", "c\0\0d", "tail"], 0, False)],
    )
    got = plan_table(plan)
    assert "\0" not in got
    assert got.split("\n") == [
        r"goddp plan: mode=d\x00dp fingerprint=0000000000000001 pieces=1 buckets=1 cap=1.00 MiB first=1.00 MiB (DDP's buckets set to the pieces: no\x00ne)",
        "bucket  MiB    piece  params",
        r"0       0.000  0      a\x00b",
        r"                      c\x00\x00d",
        "                      tail",
    ]
    assert plan_table(plan) == got


# The golden cases: the planner's plans of its own test models (the
# decision goldens of planner/decide_test.go), in the words the planner
# gave them.


def gpt_ready_names(blocks: int) -> list[str]:
    """A GPT's parameter names in gradient-ready order (the reverse of
    forward): the final norm, the blocks last first, the embeddings."""
    names = ["ln_f.bias", "ln_f.weight"]
    for i in reversed(range(blocks)):
        for sub in ("out", "fc", "ln2", "attn.proj", "attn.qkv", "ln1"):
            names += [f"blocks.{i}.{sub}.bias", f"blocks.{i}.{sub}.weight"]
    return names + ["wpe.weight", "wte.weight"]


def mlp_ready_names(layers: int, weight_first: bool) -> list[str]:
    """An MLP's names, last layer first (torch mode counts the weight of a
    layer before its bias, ddp mode the bias first)."""
    kinds = ("weight", "bias") if weight_first else ("bias", "weight")
    return [f"fc{i}.{kind}" for i in range(layers, 0, -1) for kind in kinds]


def cut(names: list[str], buckets: list[tuple[int, int, int]]) -> list[tuple[int, list[str], int, bool]]:
    """Buckets (bytes, how many names, piece) over names, in order."""
    out, start = [], 0
    for size, count, piece in buckets:
        out.append((size, names[start:start + count], piece, False))
        start += count
    assert start == len(names)
    return out


def block_reuse(num_pieces: int, eager: list[int]) -> list[int]:
    """Every non-eager piece after the first reuses it, as identical block
    pieces do."""
    leader = next(p for p in range(num_pieces) if p not in eager)
    return [p if p in eager else leader for p in range(num_pieces)]


GOLDEN_CASES = {
    "gpt_stacks_aligned": dict(
        plan=make_plan(fingerprint=0x4B958653262323B2, num_pieces=6, alignment="ready-order caps",
                       caps=PlanSettings(bucket_cap_bytes=7000, first_bucket_cap_bytes=100, align_buckets=True),
                       buckets=cut(gpt_ready_names(4), [(64, 2, 5), (6976, 24, 3), (6976, 24, 1), (640, 2, 0)])),
        eager=[0, 5], compared=True),
    "gpt_stacks_find_unused": dict(
        plan=make_plan(fingerprint=0x11C30A84B9A7AFFE, num_pieces=3, alignment="declaration-order caps",
                       caps=PlanSettings(bucket_cap_bytes=7000, first_bucket_cap_bytes=100, align_buckets=True),
                       buckets=cut(gpt_ready_names(3), [(1120, 4, 2), (8128, 26, 1), (1920, 10, 0)]))),
    "mlp_not_covered": dict(
        plan=make_plan(fingerprint=0xA1594A0140BC901C, num_pieces=3, alignment="ready-order caps",
                       caps=PlanSettings(bucket_cap_bytes=45000, first_bucket_cap_bytes=20),
                       buckets=cut(mlp_ready_names(4, False), [(2020, 2, 2), (80800, 4, 1), (4400, 2, 0)]))),
    "mlp_per_bucket_caps": dict(
        plan=make_plan(fingerprint=0x614E653B9B40396B, num_pieces=3,
                       caps=PlanSettings(bucket_cap_bytes=300, first_bucket_cap_bytes=100, bucket_caps_bytes=(120, 500), max_pieces=3),
                       buckets=cut(mlp_ready_names(4, False), [(2020, 2, 2), (40400, 2, 2), (40400, 2, 1), (4400, 2, 0)]))),
    "toy_torch_defaults": dict(
        plan=make_plan(fingerprint=0x95B998F0D96E08D3, mode="torch", num_pieces=3,
                       caps=PlanSettings(bucket_cap_bytes=25 * MIB, first_bucket_cap_bytes=MIB),
                       buckets=cut(mlp_ready_names(4, True), [(100120020, 4, 2), (100020000, 2, 1), (220000, 2, 0)]))),
    # Names torch accepts (register_parameter refuses only "" and dots) that
    # a table library would reshape: a trailing space, a line break, a
    # leading space. They are written as they are.
    "odd_names": dict(
        plan=make_plan(fingerprint=1, num_pieces=1, caps=PlanSettings(bucket_cap_bytes=MIB, first_bucket_cap_bytes=MIB),
                       buckets=[(1, ["w ", "a\nb", " x", "\t"], 0, False)])),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_tables(name):
    """The table as the backend logs it before the pieces are compared,
    and, for a plan with identical block pieces, after."""
    case = GOLDEN_CASES[name]
    plan, eager = case["plan"], case.get("eager", [])
    text = plan_table(plan, None, eager) + "\n"
    if case.get("compared"):
        text += "\n" + plan_table(plan, block_reuse(plan.num_pieces, eager), eager) + "\n"
    check_golden(golden_path(__file__, f"table_{name}"), text)


def naive_rows(plan: GraphPlan) -> list[str]:
    """The bucket rows by the rule written out: each of the first three
    cells padded with spaces to the widest of its column plus two, then
    the names, one per row."""
    rows = [["bucket", "MiB", "piece", "params"]]
    for b in plan.buckets:
        names = list(b.param_names) or ["(none)"]
        rows.append([str(b.index), "%.3f" % (b.bytes / 2**20), str(b.piece) + (" (extended)" if b.extended else ""), names[0]])
        for name in names[1:]:
            rows.append(["", "", "", name])
    out = []
    for row in rows:
        line = ""
        for col in range(3):
            width = max(len(r[col]) for r in rows)
            line += row[col] + " " * (width - len(row[col]) + 2)
        out.append(line + row[3])
    return out


names = st.text(alphabet=st.characters(blacklist_characters="\0"), max_size=8)
buckets = st.lists(
    st.builds(BucketInfo, index=st.integers(0, 10**6), bytes=st.integers(0, 2**45), param_names=st.lists(names, max_size=3).map(tuple),
              piece=st.integers(0, 10**4), extended=st.booleans()),
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(buckets=buckets, num_pieces=st.integers(1, 4), data=st.data())
def test_rows_follow_the_column_rule(buckets, num_pieces, data):
    plan = make_plan(fingerprint=data.draw(st.integers(0, 2**64 - 1)), num_pieces=num_pieces, buckets=buckets,
                     caps=PlanSettings(bucket_cap_bytes=MIB, first_bucket_cap_bytes=MIB))
    same_as = data.draw(st.one_of(st.none(), st.lists(st.integers(0, num_pieces - 1), min_size=num_pieces, max_size=num_pieces)))
    eager = data.draw(st.lists(st.integers(0, num_pieces - 1), max_size=2))
    lines = plan_table(plan, same_as, eager).split("\n")
    reused = [f"{p}={q}" for p, q in enumerate(same_as or []) if p != q]
    extra = int(bool(reused)) + int(bool(eager))
    assert "\n".join(lines[1 + extra:]) == "\n".join(naive_rows(plan))
    assert lines[0].startswith(f"goddp plan: mode=ddp fingerprint={plan.fingerprint:016x} pieces={num_pieces} buckets={len(buckets)} ")
    if same_as is not None:
        assert lines[0].endswith(f" distinct pieces={num_pieces - len(reused)} reused={len(reused)}")
    if reused:
        assert lines[1] == "reused compiled pieces (piece=the piece compiled for it): " + " ".join(reused)
