"""The cross-rank plan comparison (goddp._plan_check), driven in one
process through a fake c10d store that plays the other ranks."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

import goddp._plan_check as plan_check


class FakeStore:
    """The part of a c10d Store that the check uses; other ranks' values are
    preset, and wait() times out when one is missing."""

    def __init__(self, preset: dict[str, str]) -> None:
        self.values = {k: v.encode() for k, v in preset.items()}
        self.waited: list[tuple[list[str], timedelta]] = []

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        return self.values[key]

    def wait(self, keys, timeout) -> None:
        self.waited.append((list(keys), timeout))
        if any(k not in self.values for k in keys):
            raise RuntimeError("Socket Timeout")


@pytest.fixture
def world(monkeypatch):
    """Pretends to be rank 0 of 3 and returns a function installing a store."""
    monkeypatch.setattr(plan_check, "distributed_world", lambda: (0, 3))
    monkeypatch.setattr(plan_check, "_seq", iter(range(7, 100)))

    def install(preset: dict[str, str]) -> FakeStore:
        store = FakeStore(preset)
        import torch.distributed.distributed_c10d as c10d

        monkeypatch.setattr(c10d, "_get_default_store", lambda: store)
        return store

    return install


def test_single_process_has_nothing_to_compare(monkeypatch):
    monkeypatch.setattr(plan_check, "distributed_world", lambda: None)
    assert plan_check.check_plans_across_ranks(123, 4) is None


def test_equal_fingerprints_pass_and_publish_under_the_sequence_key(world):
    store = world({"goddp/plan/7/1": f"{0xABC:016x} 4", "goddp/plan/7/2": f"{0xABC:016x} 4"})
    summary = plan_check.check_plans_across_ranks(0xABC, 4)
    assert store.values["goddp/plan/7/0"] == f"{0xABC:016x} 4".encode()
    assert summary["checked"] and summary["seq"] == 7
    assert [r["pieces"] for r in summary["ranks"]] == [4, 4, 4]
    assert store.waited[0][0] == ["goddp/plan/7/0", "goddp/plan/7/1", "goddp/plan/7/2"]
    assert store.waited[0][1] == timedelta(seconds=300)


def test_a_differing_rank_raises_listing_every_rank(world):
    world({"goddp/plan/7/1": f"{0xABC:016x} 4", "goddp/plan/7/2": f"{0xABD:016x} 5"})
    with pytest.raises(plan_check.PlanMismatchError) as info:
        plan_check.check_plans_across_ranks(0xABC, 4)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    for expected in (
        f"rank 0: fingerprint {0xABC:016x}, 4 pieces",
        f"rank 1: fingerprint {0xABC:016x}, 4 pieces",
        f"rank 2: fingerprint {0xABD:016x}, 5 pieces",
    ):
        assert expected in message


def test_a_perturbed_rank_is_caught_and_no_environment_variable_perturbs(world, monkeypatch):
    store = world({"goddp/plan/7/1": f"{0xABC:016x} 4", "goddp/plan/7/2": f"{0xABC:016x} 4"})
    # The old test hook's variables do nothing: no test hook ships.
    monkeypatch.setenv("GODDP_TEST_PERTURB_RANK", "0")
    monkeypatch.setenv("GODDP_TESTING", "1")
    plan_check.check_plans_across_ranks(0xABC, 4)
    monkeypatch.setattr(plan_check, "published_fingerprint", lambda fp, rank: fp ^ 1 if rank == 0 else fp)
    store.values.update({"goddp/plan/8/1": f"{0xABC:016x} 4".encode(), "goddp/plan/8/2": f"{0xABC:016x} 4".encode()})
    with pytest.raises(plan_check.PlanMismatchError, match=f"rank 0: fingerprint {0xABD:016x}"):
        plan_check.check_plans_across_ranks(0xABC, 4)


def test_timeout_warns_and_continues(world, monkeypatch, caplog):
    monkeypatch.setenv("GODDP_PLAN_CHECK_TIMEOUT", "2.5")
    store = world({"goddp/plan/7/1": f"{0xABC:016x} 4"})  # rank 2 never answers
    with caplog.at_level(logging.WARNING, logger="goddp"):
        with pytest.warns(UserWarning, match="waited 2.5 s"):
            summary = plan_check.check_plans_across_ranks(0xABC, 4)
    assert summary == {"seq": 7, "checked": False, "reason": "timeout"}
    assert store.waited[0][1] == timedelta(seconds=2.5)
    assert any("waited 2.5 s" in r.getMessage() for r in caplog.records)


def test_a_rank_that_fell_back_warns_but_does_not_raise(world):
    world({"goddp/plan/7/1": "fallback 1", "goddp/plan/7/2": f"{0xABC:016x} 4"})
    with pytest.warns(UserWarning, match=r"compiled whole on ranks \[1\]"):
        summary = plan_check.check_plans_across_ranks(0xABC, 4)
    assert summary["checked"]
