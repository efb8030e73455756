"""The binding's combine_forward: the export of planner.CombineForward
(planner/forward.go), end to end through the C ABI."""

from __future__ import annotations

from array import array

import pytest

from goddp.native import extension as _native


def _ints(code, data):
    return array(code, data).tolist()


def test_the_later_graph_comes_first_and_a_tied_parameter_stays_in_the_earliest(native_module):
    # Graph 0 buckets (DDP order): [1, 0]; graph 1: [3], [0, 2] (0 tied).
    reply = native_module.combine_forward(
        array("q", [100, 10, 20, 30]), array("q", [0, 1, 3]), array("q", [0, 2, 3, 5]), array("i", [1, 0, 3, 0, 2])
    )
    assert reply["num_buckets"] == 3
    assert _ints("q", reply["bucket_bytes"]) == [30, 20, 110]
    assert _ints("i", reply["bucket_graphs"]) == [1, 1, 0]
    assert _ints("i", reply["bucket_sources"]) == [0, 1, 0]
    assert _ints("q", reply["bucket_param_offsets"]) == [0, 1, 2, 4]
    assert _ints("i", reply["bucket_params"]) == [3, 2, 1, 0]
    assert reply["moved"] == 1 and reply["dropped"] == 0


def test_ddp_caps_are_the_byte_totals_but_at_least_one_byte(native_module):
    # Parameter 1 holds no bytes: its bucket totals 0, its cap for DDP is 1.
    reply = native_module.combine_forward(array("q", [8, 0]), array("q", [0, 1, 2]), array("q", [0, 1, 2]), array("i", [0, 1]))
    assert _ints("q", reply["bucket_bytes"]) == [0, 8]
    assert _ints("q", reply["ddp_caps"]) == [1, 8]


def test_param_keys_split_the_combined_buckets_by_group(native_module):
    # Graph 0: [1, 0]; graph 1: [3, 2] (positions 2 and 3 in group 1, a
    # bf16 layer of 45 and 5 bytes). Cap 0 closes the float32 layer only
    # above 90 bytes: the bf16 bucket stays open, after the closed one.
    args = (array("q", [90, 10, 45, 5]), array("q", [0, 1, 2]), array("q", [0, 2, 4]), array("i", [1, 0, 3, 2]))
    reply = native_module.combine_forward(*args, array("i", [0, 0, 1, 1]))
    assert reply["num_buckets"] == 2 and reply["num_ddp_caps"] == 1
    assert _ints("i", reply["bucket_params"]) == [1, 0, 3, 2]
    assert _ints("q", reply["ddp_caps"]) == [100]
    assert reply["merged_cuts"] == 1
    one = native_module.combine_forward(*args)
    assert _ints("q", one["ddp_caps"]) == [50, 100] and one["merged_cuts"] == 0
    with pytest.raises(native_module.PlannerError, match="group number -1") as caught:
        native_module.combine_forward(*args, array("i", [0, 0, 1, -1]))
    assert caught.value.code == _native.ERR_INVALID_CONFIG
    with pytest.raises(native_module.PlannerError, match="param_keys"):
        native_module.combine_forward(*args, array("i", [0, 0, 1]))


def test_own_caps_under_which_the_groups_would_launch_later(native_module):
    # Ten float32 layers of 100 bytes (graph 0), a bf16 head of 1000 and a
    # 10-byte bias (graph 1): the one cap that closes the head leaves the
    # float32 gradients in one bucket; DDP's own 250-byte caps launch them
    # layer by layer.
    param_bytes = array("q", [100] * 10 + [1000, 10])
    keys = array("i", [0] * 10 + [1, 1])
    params = [*range(9, -1, -1), 11, 10]
    args = (param_bytes, array("q", [0, 10, 11]), array("q", [*range(11), 12]), array("i", params), keys)
    own = {"bucket_cap_bytes": 250, "first_bucket_cap_bytes": 250, "bucket_caps_bytes": []}
    assert native_module.combine_forward(*args, own)["groups_later"] is True
    assert native_module.combine_forward(*args, {**own, "bucket_caps_bytes": [250, 300]})["groups_later"] is True
    big = {"bucket_cap_bytes": 1 << 30, "first_bucket_cap_bytes": 1 << 20, "bucket_caps_bytes": []}
    assert native_module.combine_forward(*args, big)["groups_later"] is False
    assert native_module.combine_forward(*args)["groups_later"] is False
    with pytest.raises(native_module.PlannerError, match="FirstBucketCapBytes") as caught:
        native_module.combine_forward(*args, {**own, "first_bucket_cap_bytes": 500})
    assert caught.value.code == _native.ERR_INVALID_CONFIG


def test_a_forward_missing_parameters_is_a_planner_error(native_module):
    with pytest.raises(native_module.PlannerError, match="use 1 of DDP's 2 parameters") as caught:
        native_module.combine_forward(array("q", [4, 4]), array("q", [0, 1]), array("q", [0, 1]), array("i", [0]))
    assert caught.value.code == _native.ERR_INVALID_GRAPH


@pytest.mark.parametrize(
    "args,error,match",
    [
        # What cannot be a C array of the field's type: the binding's.
        ((array("i", [4]), array("q", [0, 1]), array("q", [0, 1]), array("i", [0])), ValueError, "param_bytes"),
        (([4], array("q", [0, 1]), array("q", [0, 1]), array("i", [0])), TypeError, "param_bytes"),
        # Counts and offsets: the library's.
        ((array("q", [4]), array("q", [0]), array("q", [0]), array("i", [])), "PlannerError", "at least one graph"),
        ((array("q", [4]), array("q", [0, 2]), array("q", [0, 1]), array("i", [0])), "PlannerError",
         "bucket_param_offsets has 2 items; the counts and offsets say 3"),
    ],
)
def test_malformed_arrays_are_refused(native_module, args, error, match):
    with pytest.raises(native_module.PlannerError if error == "PlannerError" else error, match=match) as caught:
        native_module.combine_forward(*args)
    if error == "PlannerError":
        assert caught.value.code == _native.ERR_INVALID_CONFIG


def test_offsets_that_descend_are_a_planner_error(native_module):
    # An empty bucket is fine; a descending pair of offsets is not.
    reply = native_module.combine_forward(array("q", [1, 1]), array("q", [0, 2]), array("q", [0, 2, 2]), array("i", [0, 1]))
    assert _ints("q", reply["bucket_bytes"]) == [2]
    with pytest.raises(native_module.PlannerError, match="ascend") as caught:
        native_module.combine_forward(array("q", [1, 1]), array("q", [0, 2]), array("q", [0, 3, 2]), array("i", [0, 1]))
    assert caught.value.code == _native.ERR_INVALID_CONFIG
