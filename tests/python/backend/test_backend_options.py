"""goddp's options and its registration as a Dynamo backend."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

import goddp
from goddp.options import CAP_MB_RANGE, INT64_MAX, MIB, OPTION_KEYS, parse_options

CAP_RANGE = f"must be {CAP_MB_RANGE}, or None"
# bucket_cap_mb names "auto" among its choices too.
BUCKET_CAP_RANGE = f"must be {CAP_MB_RANGE}, 'auto' to choose the buckets by measured cost, or None"


def test_goddp_is_a_listed_backend():
    assert "goddp" in torch._dynamo.list_backends()


def test_backend_without_options_is_the_entry_point_target():
    # The entry point string must import, and name the same function that
    # goddp.backend() and backend="goddp" resolve to.
    module_name, attr = "goddp.backend:goddp_backend".split(":")
    entry_target = getattr(importlib.import_module(module_name), attr)
    assert goddp.backend() is entry_target
    assert lookup_backend("goddp") is entry_target
    assert goddp.backend.goddp_backend is entry_target


def test_backend_with_options_binds_them():
    backend = goddp.backend(inner="aot_eager", mode="torch", bucket_cap_mb=2, log_plan=False)
    assert backend.options.inner == "aot_eager"
    assert backend.options.mode == "torch"
    assert backend.options.bucket_cap_mb == 2.0
    assert backend.options.log_plan is False
    assert "goddp.backend(" in repr(backend)


def test_importing_goddp_switched_off_torch_ddp_optimizer():
    # goddp must see whole graphs; DDPOptimizer would hand it pieces.
    assert torch._dynamo.utils.get_optimize_ddp_mode() == "no_optimization"


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"bucket_cap": 25}, "valid keys: inner, inner_options, mode, bucket_cap_mb, first_bucket_cap_mb, max_pieces, align_buckets, block_cuts, edges, strict"),
        ({"mode": "fast"}, "'ddp', 'torch'"),
        ({"inner": "no_such_backend"}, "valid choices:"),
        ({"inner": 3}, "'inductor', 'aot_eager', 'eager'"),
        ({"inner": "goddp"}, "cannot be 'goddp'"),
        ({"bucket_cap_mb": 0}, BUCKET_CAP_RANGE),
        ({"bucket_cap_mb": -1.5}, BUCKET_CAP_RANGE),
        ({"first_bucket_cap_mb": "1"}, CAP_RANGE),
        ({"bucket_cap_mb": True}, BUCKET_CAP_RANGE),
        ({"bucket_cap_mb": float("nan")}, BUCKET_CAP_RANGE),
        # The caps the planner refuses: fewer than 1 byte, more than int64's.
        ({"bucket_cap_mb": 1e-7}, BUCKET_CAP_RANGE),
        ({"first_bucket_cap_mb": 2.0**-21}, CAP_RANGE),
        ({"bucket_cap_mb": float("inf")}, BUCKET_CAP_RANGE),
        ({"bucket_cap_mb": 2**43}, BUCKET_CAP_RANGE),
        ({"first_bucket_cap_mb": 1e300}, CAP_RANGE),
        ({"bucket_cap_mb": 10**30}, BUCKET_CAP_RANGE),
        ({"max_pieces": 0}, "int >= 1 or None"),
        ({"max_pieces": -3}, "int >= 1 or None"),
        ({"max_pieces": 2.0}, "int >= 1 or None"),
        ({"max_pieces": True}, "int >= 1 or None"),
        ({"max_pieces": 2**63}, "at most 2**63 - 1"),
        ({"max_pieces": 4, "mode": "torch"}, "only to mode='ddp'"),
        ({"align_buckets": True, "mode": "torch"}, "only to mode='ddp'"),
        ({"align_buckets": "on"}, "True (DDP's buckets close at the cuts), False (DDP keeps its own) or None"),
        ({"block_cuts": True, "mode": "torch"}, "only to mode='ddp'"),
        ({"block_cuts": "yes"}, "True (cut at repeated module blocks), False (byte-driven cuts) or None"),
        ({"edges": "fast"}, "one of 'auto', 'compile', 'eager' or None"),
        ({"edges": "eager", "mode": "torch"}, "only to graphs cut at repeated blocks"),
        ({"edges": "compile", "block_cuts": False}, "only to graphs cut at repeated blocks"),
        ({"strict": 1}, "True or False"),
        ({"log_plan": "yes"}, "True or False"),
        ({"check_plans": None}, "True or False"),
        ({"inner_options": [1]}, "must be a dict"),
        ({"bucket_cap_mb": 1, "first_bucket_cap_mb": 2}, "must be <= 'bucket_cap_mb'"),
        ({"bucket_cap_mb": "Auto"}, BUCKET_CAP_RANGE),
    ],
)
def test_bad_options_name_the_valid_choices(options, fragment):
    with pytest.raises(ValueError, match="goddp option|unknown goddp option") as info:
        goddp.backend(**options)
    assert fragment in str(info.value)
    # The same validation applies to torch.compile(options=...).
    with pytest.raises(ValueError) as info2:
        parse_options(options)
    assert str(info2.value) == str(info.value)


def test_every_documented_key_is_accepted():
    valid = {
        "inner": "eager",
        "inner_options": None,
        "mode": "ddp",
        "bucket_cap_mb": 10,
        "first_bucket_cap_mb": 0.5,
        "max_pieces": 3,
        "align_buckets": False,
        "block_cuts": True,
        "edges": "compile",
        "strict": True,
        "log_plan": False,
        "check_plans": False,
    }
    assert set(valid) == set(OPTION_KEYS)
    options = parse_options(valid)
    assert (options.max_pieces, options.first_bucket_cap_mb, options.strict) == (3, 0.5, True)


def test_the_bounds_the_planner_takes_are_accepted_in_bytes():
    # The one conversion (goddp.options.cap_bytes): int(mb * MIB), as DDP's.
    low = parse_options({"bucket_cap_mb": 2.0**-20, "first_bucket_cap_mb": 2.0**-20, "max_pieces": INT64_MAX})
    assert (low.bucket_cap_bytes, low.first_bucket_cap_bytes, low.max_pieces) == (1, 1, INT64_MAX)
    high = parse_options({"bucket_cap_mb": 2**43 - 2.0**-10})
    assert high.bucket_cap_bytes == (1 << 63) - 1024 <= INT64_MAX
    assert parse_options({"bucket_cap_mb": 0.5}).bucket_cap_bytes == MIB // 2
    assert parse_options({}).bucket_cap_bytes is None and parse_options({}).first_bucket_cap_bytes is None


def test_defaults():
    options = parse_options(None)
    assert options.inner == "inductor"
    assert options.mode == "ddp"
    assert options.bucket_cap_mb is None and options.first_bucket_cap_mb is None
    assert options.max_pieces is None
    assert options.align_buckets is None and options.aligns_buckets
    assert not parse_options({"mode": "torch"}).aligns_buckets
    assert options.block_cuts is None and options.cuts_at_blocks
    assert not parse_options({"mode": "torch"}).cuts_at_blocks
    assert not parse_options({"block_cuts": False}).cuts_at_blocks
    assert options.edges is None and options.edge_policy == "auto"
    assert parse_options({"mode": "torch"}).edge_policy == "compile"
    assert parse_options({"block_cuts": False}).edge_policy == "compile"
    assert parse_options({"align_buckets": None}).aligns_buckets
    assert (options.strict, options.log_plan, options.check_plans) == (False, True, True)


def test_callable_inner_is_accepted():
    def my_compiler(gm, example_inputs):
        return gm.forward

    assert parse_options({"inner": my_compiler}).inner is my_compiler


def test_bad_options_through_torch_compile_surface_at_first_call():
    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x * 2

    compiled = torch.compile(Tiny(), backend="goddp", options={"mode": "bogus"})
    with pytest.raises(Exception, match="'ddp', 'torch'"):
        compiled(torch.ones(2))


def test_plan_graph_module_rejects_bad_mode():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="'ddp', 'torch'"):
        goddp.plan_graph_module(gm, mode="other")
    with pytest.raises(ValueError, match="max_pieces"):
        goddp.plan_graph_module(gm, max_pieces=0)


def _optimize_ddp_after_import(extra_env: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("GODDP_KEEP_OPTIMIZE_DDP", "TORCH_LOGS")}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[3] / "python"), env.get("PYTHONPATH")])
    )
    env.update(extra_env)
    code = "import goddp, torch; print(repr(torch._dynamo.config.optimize_ddp))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.single_process
def test_import_switches_ddp_optimizer_off_unless_told_to_keep_it():
    assert _optimize_ddp_after_import({}) == "'no_optimization'"
    assert _optimize_ddp_after_import({"GODDP_KEEP_OPTIMIZE_DDP": "1"}) == "True"


def test_configured_backend_merges_torch_compile_options(monkeypatch):
    seen = []
    import goddp.backend as backend_module

    monkeypatch.setattr(backend_module, "compile_graph", lambda gm, ex, options: seen.append(options) or gm.forward)
    configured = goddp.backend(inner="aot_eager", bucket_cap_mb=3)
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    configured(gm, [torch.ones(1, 2)], options={"mode": "torch"}, mode="reduce-overhead")
    configured(gm, [torch.ones(1, 2)])
    merged, plain = seen
    assert (merged.inner, merged.bucket_cap_mb, merged.mode, merged.compile_mode) == (
        "aot_eager",
        3.0,
        "torch",
        "reduce-overhead",
    )
    assert (plain.mode, plain.compile_mode) == ("ddp", None)
    with pytest.raises(ValueError, match="valid keys"):
        configured(gm, [torch.ones(1, 2)], options={"bogus": 1})


def test_check_plans_is_deprecated_and_changes_nothing(monkeypatch):
    """The ranks compare DDP's layout, not their plans (issue 16): the
    option is accepted, warned about once, and ignored."""
    import goddp.options as options_module

    monkeypatch.setattr(options_module, "_warned_check_plans", False)
    with pytest.warns(DeprecationWarning, match="'check_plans' is deprecated and has no effect.*strict=True"):
        off = parse_options({"check_plans": False})
    assert off.strict is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_options({"check_plans": True})  # once per process
    with pytest.raises(ValueError, match="True or False"):
        parse_options({"check_plans": "no"})
