"""bucket_cap_mb="auto" in one process (1-rank gloo group): the option at
the door, the measurement's door, the units it chooses among, and where
it keeps the starting buckets (Note [Buckets chosen by cost] in
goddp.ranks.auto). test_dist_auto_buckets runs the choice on two ranks."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch import nn

import goddp
from goddp.options import MIB, parse_options
from goddp.ranks import auto as auto_mod
from models import ZOO

# A link where 8 MiB take about as long as the measured backward: 200 MB/s, 0.1 ms latency.
LINK = {"latency_ns": 100_000, "bytes_per_second": 200_000_000, "probe": [], "method": "test"}
STEPS = auto_mod.WARMUP + auto_mod.MEASURED + 3  # decides at the forward after the measured backwards, DDP rebuilds at the one after


@pytest.fixture(autouse=True)
def _own_cache(monkeypatch, tmp_path):
    """What rank 0 remembers stays in the test (conftest gives each test a
    fresh Dynamo and no plans)."""
    monkeypatch.setenv(auto_mod.CACHE_ENV, str(tmp_path))


# --------------------------------------------------------------------------
# The door


def test_auto_is_a_bucket_cap_mb_that_starts_from_ddps_cap():
    options = parse_options({"bucket_cap_mb": "auto"})
    assert options.auto_buckets and options.bucket_cap_bytes is None
    assert not parse_options({"bucket_cap_mb": 4}).auto_buckets


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"bucket_cap_mb": "Auto"}, "'auto' to choose the buckets by measured cost"),
        ({"bucket_cap_mb": "fast"}, "'auto' to choose the buckets by measured cost"),
        ({"bucket_cap_mb": "auto", "mode": "torch"}, "needs mode='ddp' with align_buckets True or None"),
        ({"bucket_cap_mb": "auto", "align_buckets": False}, "needs mode='ddp' with align_buckets True or None"),
        ({"bucket_cap_mb": "auto", "first_bucket_cap_mb": 1}, "must be None with bucket_cap_mb='auto'"),
        ({"first_bucket_cap_mb": "auto"}, "must be a number of MiB"),
    ],
)
def test_auto_where_it_cannot_choose_is_refused_at_the_door(raw, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_options(raw)


@pytest.mark.parametrize(
    "values, words",
    [
        ([1, 0, 3], "unit 1's backward as 0 ns"),
        ([1, -2, 3], "unit 1's backward as -2 ns"),
        ([math.nan, 2, 3], "unit 0's backward as nan ns"),
        ([1, 2, math.inf], "unit 2's backward as inf ns"),
        ([1, True, 3], "unit 1's backward as True ns"),
        ([1, "2", 3], "unit 1's backward as '2' ns"),
        ([1, 2], "one backward time per unit \\(3\\)"),
        (None, "one backward time per unit \\(3\\)"),
    ],
)
def test_a_measurement_the_model_cannot_take_is_a_clear_error(values, words):
    with pytest.raises(auto_mod.MeasurementError, match=words):
        auto_mod.check_durations(values, 3)
    assert auto_mod.check_durations([1, 2.0, 3e6], 3) == [1, 2, 3_000_000]


# --------------------------------------------------------------------------
# The units, and the decision on one rank


class Layers(nn.Module):
    """Eight 1 MiB layers without repeated blocks: cut by bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(512, 512, bias=False)
        self.b = nn.Linear(512, 512, bias=False)
        self.c = nn.Linear(512, 512, bias=False)
        self.d = nn.Linear(512, 512, bias=False)
        self.e = nn.Linear(512, 512, bias=False)
        self.f = nn.Linear(512, 512, bias=False)
        self.g = nn.Linear(512, 512, bias=False)
        self.h = nn.Linear(512, 512, bias=False)

    def forward(self, x):
        for layer in (self.a, self.b, self.c, self.d, self.e, self.f, self.g, self.h):
            x = torch.relu(layer(x))
        return x


def _train(ddp, options, steps=STEPS, make=lambda s: torch.randn(16, 512, generator=torch.Generator().manual_seed(s))):
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", **options})
    for step in range(steps):
        compiled(make(step)).pow(2).mean().backward()


def _record() -> dict:
    (record,) = [p for p in goddp.last_plans() if p["auto_buckets"] is not None]
    return record


def test_a_graph_without_blocks_is_cut_into_units_and_decided(dist_group, caplog):
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers())  # DDP's caps: two pieces without "auto"
    with caplog.at_level(logging.INFO, logger="goddp"):
        _train(ddp, {"bucket_cap_mb": "auto"})
    record = _record()
    outcome = record["auto_buckets"]
    # 8 MiB of gradients in units of at least 1 MiB: a piece per layer
    assert record["num_pieces"] == outcome["units"] == 8, record
    assert outcome["unit_bytes"] == [MIB] * 8
    # the start is DDP's own caps over the units: its first bucket (1 MiB), then the rest
    assert outcome["start"]["caps"] == [MIB, 7 * MIB]
    assert outcome["state"] == "decided" and len(outcome["backward_ns"]) == 8
    assert outcome["measured_steps"] == auto_mod.MEASURED
    assert set(outcome["chosen"]) >= {"caps", "step_ns", "backward_ns", "exposed_ns"}
    assert sum(outcome["chosen"]["caps"]) == 8 * MIB
    installed = outcome["chosen"]["caps"] if outcome["installed"] else outcome["start"]["caps"]
    assert record["ddp_caps"] == installed == _rebuilt_sizes(ddp)
    messages = [r.getMessage() for r in caplog.records]
    assert any("bucket_cap_mb='auto' measured 3 steps" in m for m in messages), messages
    assert any(
        "bucket_cap_mb='auto' installed" in m or "bucket_cap_mb='auto' keeps the starting buckets" in m for m in messages
    ), messages


def _fixed(monkeypatch, backward_ns, link=LINK):
    monkeypatch.setattr(auto_mod.AutoBuckets, "measured", lambda self: list(backward_ns))
    monkeypatch.setattr(auto_mod, "probe", lambda ddp, buffers: dict(link))


def _rebuilt_sizes(ddp) -> list[int]:
    data = ddp._get_ddp_logging_data()
    assert data.get("has_rebuilt_buckets"), data
    return [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]


def test_a_graph_cut_into_units_installs_runs_of_them(dist_group, monkeypatch):
    """Its pieces stay the units; DDP's buckets become the chosen runs."""
    _fixed(monkeypatch, [3_000_000] * 8)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers())
    _train(ddp, {"bucket_cap_mb": "auto"})
    record = _record()
    outcome = record["auto_buckets"]
    assert outcome["installed"] is True, outcome
    chosen = outcome["chosen"]["caps"]
    assert chosen != outcome["start"]["caps"] and len(chosen) > 2
    assert record["num_pieces"] == 8 and record["ddp_caps"] == chosen == _rebuilt_sizes(ddp)
    assert ddp._goddp.decision.layout.caps == tuple(chosen)


def test_an_install_that_fails_leaves_ddps_own_buckets_and_says_so(dist_group, monkeypatch):
    from goddp.ranks import agreement

    _fixed(monkeypatch, [3_000_000] * 8)
    real = agreement.install_or_reset
    calls = []

    def second_fails(ddp, caps):
        calls.append(caps)
        if len(calls) == 2:
            return "the test's install failed"
        return real(ddp, caps)

    monkeypatch.setattr(agreement, "install_or_reset", second_fails)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers())
    _train(ddp, {"bucket_cap_mb": "auto"})
    outcome = _record()["auto_buckets"]
    assert len(calls) == 2 and outcome["installed"] is False
    assert outcome["reason"].startswith("DDP's own buckets are back on every rank"), outcome
    assert ddp._goddp.decision.action != agreement.INSTALL and agreement.installed_layout(ddp) is None
    assert _record()["ddp_caps"] == []


def test_without_auto_the_same_graph_is_cut_where_ddps_buckets_close(dist_group):
    torch.manual_seed(0)
    _train(nn.parallel.DistributedDataParallel(Layers()), {}, steps=1)
    (record,) = goddp.last_plans()
    # DDP's first bucket closes at 1 MiB (the last layer), the rest is under 25 MiB
    assert record["num_pieces"] == 2 and record["auto_buckets"] is None


def test_several_dtype_groups_keep_the_start_uncut_into_units(dist_group):
    """DDP buckets the groups against shared caps (Note [Several dtype
    groups]): a run of units is no bucket, so auto keeps the start and the
    graph is cut as without auto, not into units."""
    torch.manual_seed(0)
    model = Layers()
    model.c.to(torch.bfloat16)
    model.forward = lambda x: _mixed_forward(model, x)
    _train(nn.parallel.DistributedDataParallel(model, bucket_cap_mb=2), {"bucket_cap_mb": "auto"}, steps=2)
    record = _record()
    assert record["alignment"] == "ready-order caps per dtype group", record
    assert record["auto_buckets"]["state"] == "off"
    assert "several (dtype, device) groups" in record["auto_buckets"]["reason"]
    goddp.clear_plans()
    torch._dynamo.reset()
    torch.manual_seed(0)
    again = Layers()
    again.c.to(torch.bfloat16)
    again.forward = lambda x: _mixed_forward(again, x)
    _train(nn.parallel.DistributedDataParallel(again, bucket_cap_mb=2), {"bucket_cap_mb": 2}, steps=1)
    (fixed,) = goddp.last_plans()
    assert record["num_pieces"] == fixed["num_pieces"] < 8, (record["num_pieces"], fixed["num_pieces"])


def _mixed_forward(model, x):
    for layer in (model.a, model.b, model.c, model.d, model.e, model.f, model.g, model.h):
        x = torch.relu(layer(x.to(layer.weight.dtype))).float()
    return x


def test_a_forward_over_several_graphs_keeps_the_start_and_says_why(dist_group, caplog):
    entry = ZOO["graph_break"]
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": "aot_eager", "bucket_cap_mb": "auto"})
    with caplog.at_level(logging.INFO, logger="goddp"):
        for step in range(STEPS):
            entry.loss(compiled(*entry.make_inputs(step))).backward()
    offs = [p["auto_buckets"] for p in goddp.last_plans() if p["auto_buckets"] is not None]
    assert offs and all(o == {"state": "off", "reason": "its forward is split over several graphs"} for o in offs), offs
    assert sum("bucket_cap_mb='auto' keeps the starting buckets" in r.getMessage() for r in caplog.records) == 1


def test_the_decision_is_kept_after_it_is_made(dist_group, monkeypatch):
    """Calls after the decision neither measure nor decide again."""
    calls = []
    real = auto_mod.AutoBuckets._decide
    monkeypatch.setattr(auto_mod.AutoBuckets, "_decide", lambda self, ddp: calls.append(self.synced) or real(self, ddp))
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers())
    _train(ddp, {"bucket_cap_mb": "auto"}, steps=STEPS + 4)
    assert calls == [auto_mod.WARMUP + auto_mod.MEASURED]
    assert ddp._goddp.auto.pending is False and not ddp._goddp.auto._handles


# --------------------------------------------------------------------------
# What rank 0 remembers


def test_a_remembered_choice_is_read_back_only_when_it_fits(tmp_path):
    path = tmp_path / "auto.json"
    cost = {"latency_ns": 1000, "bytes_per_second": 10**9}
    auto_mod.remember(path, [4, 8], [10, 20], cost, [12])
    last = auto_mod.load_last(path, [4, 8])
    assert last == {"unit_bytes": [4, 8], "backward_ns": [10, 20], "caps": [12], "latency_ns": 1000,
                    "bytes_per_second": 10**9}
    assert auto_mod.load_last(path, [4, 8, 1]) is None, "another module's units"
    assert auto_mod.load_last(path, [8, 4]) is None, "other units"
    assert auto_mod.load_last(tmp_path / "none.json", [4, 8]) is None
    for text in ("{", "[]", '{"unit_bytes": [4, 8]}', path.read_text().replace("[10, 20]", "[10, -1]")):
        path.write_text(text)
        assert auto_mod.load_last(path, [4, 8]) is None, text
    assert auto_mod.similar(last, [11, 19], [4, 8], cost)
    assert not auto_mod.similar(last, [12, 20], [4, 8], cost), "a unit 20 % slower"
    assert not auto_mod.similar(last, [10, 20], [4, 8], {"latency_ns": 2000, "bytes_per_second": 10**9})
    assert not auto_mod.similar(last, [10, 20], [8, 4], cost)


def test_remembering_where_nothing_can_be_written_is_no_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    auto_mod.remember(blocked / "auto.json", [4], [10], {"latency_ns": 0, "bytes_per_second": 1}, [4])
    assert auto_mod.load_last(blocked / "auto.json", [4]) is None


def test_the_cache_is_goddps_folder_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(auto_mod.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert auto_mod.cache_dir() == tmp_path / "goddp"
    monkeypatch.setenv(auto_mod.CACHE_ENV, str(tmp_path / "mine"))
    assert auto_mod.cache_dir() == tmp_path / "mine"


def test_the_outcome_is_a_structured_trace_artifact(dist_group, monkeypatch):
    from goddp.tools import structured

    written = []
    monkeypatch.setattr(structured, "enabled", lambda: True)
    monkeypatch.setattr(structured, "_artifact",
                        lambda name, encoding, payload, compile_id=None: written.append((name, payload())))
    torch.manual_seed(0)
    _train(nn.parallel.DistributedDataParallel(Layers()), {"bucket_cap_mb": "auto"})
    autos = [payload for name, payload in written if name == structured.AUTO_BUCKETS]
    assert [a["state"] for a in autos] == ["measuring", "decided"]
    assert autos[-1] == _record()["auto_buckets"]


def test_the_slowdown_is_applied_where_the_stream_is_busy():
    """The same measurements with a slowdown predict a longer step for
    buckets that overlap the backward, and none for one bucket."""
    cost = {"latency_ns": 0, "bytes_per_second": 10**8}
    backward, sizes = [10_000_000] * 4, [1_000_000] * 4
    plain = auto_mod.predict(backward, sizes, cost, [1, 2, 3])
    slowed = auto_mod.predict(backward, sizes, {**cost, "slowdown_permille": 2000}, [1, 2, 3])
    assert slowed["backward_ns"] > plain["backward_ns"] == sum(backward)
    one = [auto_mod.predict(backward, sizes, {**cost, "slowdown_permille": sd}, []) for sd in (1000, 2000)]
    assert one[0]["step_ns"] == one[1]["step_ns"]


def test_the_probe_times_allreduces_and_the_slowdown_on_one_rank(dist_group):
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers())
    buffers = auto_mod.probe_buffers(ddp, [MIB] * 8)
    assert [b.numel() * 4 for b in buffers] == [MIB, round((MIB * 8 * MIB) ** 0.5) // 4 * 4, 8 * MIB]
    cost = auto_mod.probe(ddp, buffers)
    assert [b for b, _ in cost["probe"]] == [b.numel() * 4 for b in buffers]
    assert all(ns > 0 for _, ns in cost["probe"]) and cost["bytes_per_second"] >= 1
    assert 1000 <= cost["slowdown_permille"] <= 1000 * auto_mod.MAX_SLOWDOWN


def test_every_rank_but_the_first_says_the_same_words(dist_group):
    """Store traffic per rank stays flat in the group's size: the deciding
    round reads only statements that differ from the first one arriving
    (Note [A round that does not grow with the group]), and every rank but
    the group's first states the same text; the verdict reads the first
    rank's numbers whatever the others measured."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Layers())
    units = [(k,) for k in range(8)]
    autos = [auto_mod.AutoBuckets(units, [MIB] * 8, [1], lambda outcome, caps=None: None) for _ in range(3)]
    for auto, ns in zip(autos, (1_000_000, 2_000_000, 3_000_000)):
        auto.durations = [[ns] * 8]
    cache = auto_mod.cache_dir() / "none.json"
    said = [json.dumps(a.statement(ddp, leader=i == 0, cache=cache), sort_keys=True) for i, a in enumerate(autos)]
    assert said[1] == said[2] != said[0]
    decided = auto_mod.verdict({r: s for r, s in enumerate(said)}, 0)
    assert decided == {"backward_ns": [1_000_000] * 8, "last": None}
    other = auto_mod.AutoBuckets(units, [MIB] * 8, [2], lambda outcome, caps=None: None)
    other.durations = [[1] * 8]
    apart = json.dumps(other.statement(ddp, leader=False, cache=cache), sort_keys=True)
    assert auto_mod.verdict({0: said[0], 1: apart}, 0) == {"keep": "rank 1's units or starting buckets differ from rank 0's"}
