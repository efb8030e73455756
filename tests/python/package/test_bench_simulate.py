"""bench.simulate: its parts against what they model, on the library's
timeline (goddp_timeline)."""

from __future__ import annotations

import json

import pytest

from bench import simulate

MIB = 1 << 20


def test_ring_cost_is_the_ring_formula():
    """One unit, one bucket: exposed = launch + 2(N-1)/N * bytes / bandwidth
    + 2(N-1) * hop latency, to the ns."""
    p = simulate.Profile("test", 64, 50e9, 5e-6, 1e15)
    r = simulate.timeline(([1000], [512 * MIB]), p, 1.0, None)
    want = p.launch_s + 2 * 63 / 64 * 512 * MIB / 50e9 + 2 * 63 * 5e-6
    assert r["exposed_ns"] == pytest.approx(want * 1e9, abs=2)


def test_ddp_starts_close_at_the_cap():
    """DDP's rule: a bucket closes once it reaches its cap, 1 MiB first."""
    assert simulate.ddp_starts([MIB // 2, MIB // 2, 10 * MIB, 20 * MIB, 5 * MIB]) == [2, 4]
    assert simulate.ddp_starts([30 * MIB]) == []


def test_group_pieces_closes_nearest_the_cap():
    """planner/blocks.go's groupPieces: the boundary nearest the cap."""
    caps = [MIB, 25 * MIB]
    assert simulate.group_pieces([6144, 27 * MIB, 27 * MIB, 150 * MIB], caps) == [1, 2, 3]
    assert simulate.group_pieces([2 * MIB, 10 * MIB, 10 * MIB, 10 * MIB, 10 * MIB], caps) == [1, 4]


def test_torch_counts_the_tied_weight_at_the_head():
    """The head's use of the tied embedding fills torch's first piece."""
    pieces = simulate.torch_pieces(simulate.MODELS[0])
    assert pieces[:3] == [0, 1, 1], "the head alone, then the final norm with the last block's first node"


@pytest.mark.parametrize("model", simulate.MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize("slowdown", [1.0, 1.5])
def test_the_timeline_choice_is_never_predicted_slower(model, slowdown):
    """At the same pieces, the search's step is at most DDP's cap's and
    unsplit's; every strategy keeps all the gradient bytes."""
    p = simulate.PROFILES[2]
    res = simulate.simulate(model, p, slowdown)
    blocks = simulate.block_units(model, p)
    unsplit_blocks = simulate.timeline(blocks, p, slowdown, [])
    best = res["goddp, timeline"]
    assert best["search"] == "exact"
    assert best["step_ns"] <= min(res["goddp, DDP's cap"]["step_ns"], unsplit_blocks["step_ns"])
    total = sum(blocks[1])
    for name, r in res.items():
        assert sum(b["bytes"] for b in r["buckets"]) == total, name


def test_a_profile_file_is_read_and_checked_at_the_door(tmp_path, capsys):
    good = {"name": "mine", "ranks": 16, "link_bytes_per_s": 25e9, "hop_latency_s": 3e-6, "flops_per_s": 1e14}
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps([good, {**good, "launch_s": 5e-6}]))
    first, second = simulate.load_profiles(str(path))
    assert first == simulate.Profile("mine", 16, 25e9, 3e-6, 1e14) and second.launch_s == 5e-6
    bad = [
        ([{k: v for k, v in good.items() if k != "flops_per_s"}], r"profile 0: missing \['flops_per_s'\], unknown \[\]"),
        ([good, {**good, "bandwidth": 1}], r"profile 1: missing \[\], unknown \['bandwidth'\]"),
        ([{**good, "ranks": 1}], "ranks an int of at least 2"),
        ([{**good, "link_bytes_per_s": 0}], "link_bytes_per_s must be a finite number above 0"),
        ([{**good, "hop_latency_s": -1}], "hop_latency_s must be a finite number of at least 0"),
        ([{**good, "flops_per_s": "fast"}], "flops_per_s must be a finite number above 0"),
        ([], "non-empty JSON list"),
        ([3], "must be an object with the fields name, ranks"),
    ]
    for profiles, words in bad:
        path.write_text(json.dumps(profiles))
        with pytest.raises(ValueError, match=words):
            simulate.load_profiles(str(path))
    path.write_text("{")
    with pytest.raises(ValueError, match="cannot read the profile file"):
        simulate.load_profiles(str(path))
    path.write_text(json.dumps([{k: v for k, v in good.items() if k != "ranks"}]))
    with pytest.raises(SystemExit):
        simulate.main(["--profile", str(path)])
    assert "missing ['ranks']" in capsys.readouterr().err
