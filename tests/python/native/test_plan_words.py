"""The words of a plan's codes (ABI 11: goddp_plan is numbers and codes,
goddp.native.plan words them): why DDP's buckets are not the pieces, for
every GODDP_REASON_* code, and the alignment's name, for every
GODDP_ALIGN_* code; a code this goddp does not know is worded, never an
error."""

from __future__ import annotations

import pytest

from goddp.native import extension as _native
from goddp.native.plan import ALIGNMENT_NAMES, DDPRequest, PlanRequest, decode_plan, not_aligned_words

# The words users read in plan records and logs (the planner's until ABI 10).
NOT_ALIGNED = {
    "REASON_ALIGNED": None,
    "REASON_OFF": "off (align_buckets=False or mode='torch')",
    "REASON_NOT_COVERED": "the graph uses 6 of DDP's 7 parameters (a graph break, or parameters used outside "
    "this graph); DDP buckets the whole model",
    "REASON_ONE_PIECE": "one piece: nothing to align",
    "REASON_PART_OF_FORWARD": "the graph uses 6 of DDP's 7 parameters (a graph break, or parameters used outside "
    "this graph); DDP buckets the whole model; planned with the forward's other graphs at the module's next "
    "training call",
    "REASON_NO_PARAMS": "no parameters in this graph",
    "REASON_NO_PER_BUCKET_CAPS": "this torch's DDP has no per-bucket caps (needs torch >= 2.9)",
    "REASON_PYTHON_REDUCER": "DDP uses the Python reducer, which has no per-bucket caps",
    "REASON_MIXED_PRECISION": "DDP mixed precision is on",
    "REASON_BUILTIN_COMM_HOOK": "a built-in comm hook that goddp cannot identify is registered",
    "REASON_GROUPS_LATER": (
        "parameters span several (dtype, device) groups, which DDP buckets against shared caps: caps that "
        "close every group's buckets at the cuts would launch them later than DDP's own buckets (docs/limits.md)"
    ),
}
REASONS = sorted((n for n in dir(_native) if n.startswith("REASON_")), key=lambda n: getattr(_native, n))
ALIGNMENTS = sorted((n for n in dir(_native) if n.startswith("ALIGN_")), key=lambda n: getattr(_native, n))


def test_every_code_is_listed_here():
    assert REASONS == sorted(NOT_ALIGNED, key=lambda n: getattr(_native, n))
    # 8, 11 and 12 are gone (reasons no longer given); the others kept their numbers.
    assert [getattr(_native, n) for n in REASONS] == [c for c in range(len(REASONS) + 3) if c not in (8, 11, 12)]
    assert sorted(ALIGNMENT_NAMES) == [getattr(_native, n) for n in ALIGNMENTS]


@pytest.mark.parametrize("name", REASONS)
def test_reason_words(name):
    assert not_aligned_words(getattr(_native, name), aligned_params=6, ddp_params=7) == NOT_ALIGNED[name]


def test_reasons_have_their_own_words():
    words = [not_aligned_words(getattr(_native, n), 6, 7) for n in REASONS]
    assert len(set(words)) == len(words)


@pytest.mark.parametrize("code", [max(getattr(_native, n) for n in REASONS) + 1, 8, 11, 12, 99, -1])
def test_an_unknown_reason_is_worded(code):
    words = not_aligned_words(code, 6, 7)
    assert words == f"unknown reason {code}"


@pytest.mark.parametrize(
    "code, name",
    [(_native.ALIGN_NONE, "none"), (_native.ALIGN_READY, "ready-order caps"),
     (_native.ALIGN_DECLARATION, "declaration-order caps"),
     (_native.ALIGN_DECLARATION_MERGED, "declaration-order caps, pieces merged"),
     (_native.ALIGN_READY_GROUPS, "ready-order caps per dtype group"),
     (_native.ALIGN_DECLARATION_GROUPS, "declaration-order caps per dtype group")],
)
def test_alignment_names(code, name):
    assert ALIGNMENT_NAMES[code] == name


def _reply(reason: int, alignment: int, aligned_params: int) -> dict:
    """A goddp_plan of one node and no piece, as the extension returns it."""
    empty = b""
    return {
        "fingerprint": 1, "num_nodes": 1, "node_pieces": (-1).to_bytes(4, "little", signed=True), "num_pieces": 0,
        "num_buckets": 0, "bucket_bytes": empty, "bucket_pieces": empty, "bucket_extended": empty,
        "bucket_param_offsets": (0).to_bytes(8, "little"), "bucket_params": empty,
        "piece_input_offsets": (0).to_bytes(8, "little"), "piece_inputs": empty,
        "piece_output_offsets": (0).to_bytes(8, "little"), "piece_outputs": empty,
        "piece_param_offsets": (0).to_bytes(8, "little"), "piece_params": empty,
        "alignment": alignment, "ddp_caps": empty, "merged_cuts": 0, "bucket_cap_bytes": 1, "first_bucket_cap_bytes": 1,
        "bucket_caps_bytes": empty, "max_pieces": 0, "align_buckets": False, "bucket_order": _native.ORDER_READY,
        "align_reason": reason, "aligned_params": aligned_params, "num_counted_params": 0, "eager_pieces": empty,
        "node_block_ids": None, "ddp_bucket_order": _native.ORDER_READY, "block_runs": False,
        "checkpoint_regions": False,
    }


@pytest.mark.parametrize("name", REASONS)
def test_decode_words_the_reply(name):
    """decode_plan words the reply's codes with the request's DDP parameter
    count; unknown codes decode too."""
    request = PlanRequest(ddp=DDPRequest(bucket_cap_bytes=1, first_bucket_cap_bytes=None, num_params=7))
    plan = decode_plan(_reply(getattr(_native, name), _native.ALIGN_READY, 6), ["output"], [], request)
    assert (plan.not_aligned, plan.alignment, plan.aligned_params) == (NOT_ALIGNED[name], "ready-order caps", 6)
    odd = decode_plan(_reply(99, 7, 0), ["output"], [], request)
    assert (odd.not_aligned, odd.alignment) == ("unknown reason 99", "unknown alignment 7")
