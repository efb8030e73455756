"""The words of the checkpoint split (ABI 11: goddp_checkpoint_split's reply
is codes and numbers, goddp.graph.checkpoints words them): the INFO line
of every kind of decision and the reason of every code, pinned by
testdata/checkpoint_split_wording.golden (GODDP_UPDATE_GOLDENS=1
rewrites it); and the same words through the planner."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from goddp.graph import checkpoints as _checkpoints
from goddp.graph.checkpoints import BodyBuckets, describe_split, kept_whole_reason, mib
from _golden import check_golden, golden_path
from test_checkpoints import _hand_made, plan_split

REPO = Path(__file__).resolve().parents[3]
GOLDEN = golden_path(__file__, "checkpoint_split_wording")


def planner_codes() -> list[str]:
    """The codes planner/ckptsplit.go's KeptWhole names, in its order."""
    text = (REPO / "planner" / "ckptsplit.go").read_text(encoding="utf-8")
    table = re.search(r"keptWholeNames = \[\.\.\.\]string\{(.*?)\}", text, re.S)
    assert table, "keptWholeNames not found in planner/ckptsplit.go"
    return [c for c in re.findall(r'"([^"]*)"', table.group(1)) if c]


def render() -> str:
    lines = [
        describe_split("checkpoint", "block", 2, 2, None, ""),
        describe_split("checkpoint_1", "block", 3, None, None, kept_whole_reason("random_op", op="dropout")),
        describe_split("checkpoint_2", "bucket", 0, 2, BodyBuckets([], 3 << 20, 1 << 20, 3, True), ""),
        describe_split("wrap_body_0", "bucket", 0, None, BodyBuckets([], 123456789, 25 << 20, 5, True),
                       kept_whole_reason("random_op", op="bernoulli")),
    ]
    lines += [f"{n} bytes: {mib(n)}" for n in (0, 1, 1 << 10, 3 << 19, 1 << 20, 1000 << 20, 1234 << 20, 1 << 40)]
    lines += [f"{code}: {kept_whole_reason(code, op='add_', type_name='Size', region=1)}"
              for code in [*planner_codes(), "a_code_from_a_later_planner"]]
    lines.append(describe_split("it's", "block", 2, None, None, kept_whole_reason("nested_hop")))
    return "\n".join(lines) + "\n"


def test_wording_golden():
    check_golden(GOLDEN, render())


def test_every_planner_code_has_words():
    codes = planner_codes()
    assert len(codes) == 11
    assert set(codes) == set(_checkpoints._KEPT_WHOLE)
    assert kept_whole_reason("") == ""


@pytest.mark.parametrize(
    ("ops", "blocks", "example", "reason"),
    [
        ([("f", torch.relu, (0,)), ("m", "add_", (1,)), ("f", torch.neg, (2,))], [-1, 0, 1, 1, -1], None,
         "add_ writes a value from before its region, across a cut"),
        ([("f", torch.relu, (0,)), ("f", torch.nn.functional.dropout, (1,)), ("f", torch.neg, (2,))],
         [-1, 0, 1, 1, -1], None, "it holds a random op (dropout), whose saved RNG state would move"),
        ([("m", "size", (0,)), ("f", torch.neg, (0,)), ("f", torch.mul, (2, 1))], [-1, 0, 1, 1, -1],
         ("size", torch.Size([2])), "a Size value would cross a cut"),
        ([("f", torch.relu, (0,)), ("f", torch.neg, (0,))], [-1, 0, 1, -1], None, "its region 0 hands nothing on"),
    ],
    ids=["mutation", "random", "not-carried", "nothing-on"],
)
def test_the_planners_node_and_region_are_worded(ops, blocks, example, reason):
    """The reply names a body node or region by number; the words name the
    node's op or value type, as the planner's did."""
    gm, hop, body_blocks = _hand_made(ops, blocks)
    if example is not None:
        target, value = example
        next(n for n in gm.body.graph.nodes if n.target == target).meta["example_value"] = value
    split = plan_split(gm, hop, body_blocks)
    assert split.regions is None and split.reason == reason
    assert split.describe() == (
        f"goddp: the checkpoint {hop.name!r} spans 2 blocks but is kept whole, so its blocks' buckets cannot "
        f"overlap: {reason}"
    )
