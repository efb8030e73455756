"""goddp.measure, the benchmarks' hooks: each does what it says, fails loudly
when its target moves, and bench/ (and examples/) use no other goddp name."""

from __future__ import annotations

import ast
import contextlib
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import goddp
from goddp import measure
from goddp.compile import pipeline
from goddp.graph import blocks
from goddp.ranks.store_round import RanksMissingError
from goddp.ranks.verdict import Statement
from models import ZOO

REPO = Path(__file__).resolve().parents[3]

# The public goddp names: the package's API and the modules named as public,
# each with its __all__.
PUBLIC_MODULES = ("goddp.backend", "goddp.tracing", "goddp.measure")


def _public_names() -> dict[str, set[str]]:
    import importlib

    names = {"goddp": set(goddp.__all__) | {"measure", "tracing", "__version__"}}
    for module in PUBLIC_MODULES:
        names[module] = set(importlib.import_module(module).__all__)
    return names


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def goddp_references(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every goddp name a file imports or reaches
    through attributes: ``from goddp.x import y`` gives goddp.x.y."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    _set_parents(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "goddp"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "goddp":
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
            name = _dotted(node)
            if name and name.split(".")[0] == "goddp":
                found.append((node.lineno, name))
    return found


def private_references(path: Path) -> list[str]:
    public = _public_names()
    bad = []
    for line, name in goddp_references(path):
        parts = name.split(".")
        ok = False
        for depth in range(len(parts), 0, -1):
            module = ".".join(parts[:depth])
            if module in public:
                rest = parts[depth:]
                # module itself, or one public name of it (attributes of that
                # name, e.g. goddp.trace(...).summary, are the name's own)
                ok = module in PUBLIC_MODULES or module == "goddp" if not rest else rest[0] in public[module]
                break
        if not ok:
            bad.append(f"{path.relative_to(REPO)}:{line}: {name}")
    return bad


def _set_parents(tree: ast.AST) -> None:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent


def test_bench_and_examples_use_public_goddp_names_only():
    files = sorted((REPO / "bench").glob("*.py")) + sorted((REPO / "examples").glob("*.py"))
    assert len(files) > 5
    bad = [entry for path in files for entry in private_references(path)]
    assert not bad, "private goddp names outside goddp (give each a hook in goddp.measure):\n" + "\n".join(bad)


def test_the_check_finds_private_names(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import goddp\nimport goddp.compile.pipeline as p\nfrom goddp.native.plan import MIB\n"
        "from goddp.measure import MIB as ok\nfrom goddp.tracing import draw_launch_rows\n"
        "goddp.compile.pipeline.group_pieces = None\ngoddp.trace(m).summary()\ngoddp.backend.MODES\n"
    )
    global REPO
    saved, REPO = REPO, tmp_path
    try:
        bad = private_references(sample)
    finally:
        REPO = saved
    assert [b.split(": ", 1)[1] for b in bad] == [
        "goddp.compile.pipeline",
        "goddp.native.plan.MIB",
        "goddp.compile.pipeline.group_pieces",
    ]


# ---------------------------------------------------------------- PieceReuseOff


def compile_and_train_blocks() -> list:
    """ZOO["blocks"] (repeated blocks, identical pieces) compiled by goddp
    and trained two steps; the graphs the inner compiler (aot_eager) got."""
    from torch._dynamo.backends.registry import lookup_backend

    graphs: list = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    entry = ZOO["blocks"]
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    compiled = torch.compile(ddp, backend="goddp", options={"inner": counting, "strict": True, "log_plan": False})
    for step in range(2):
        entry.loss(compiled(*entry.make_inputs(step))).backward()
    return graphs


def test_piece_reuse_off_compiles_every_piece(dist_group):
    """With the switch on, every piece but the eager edges gets its own inner compile."""
    with_reuse = len(compile_and_train_blocks())
    (plan,) = goddp.last_plans()
    assert plan["reused_pieces"] >= 1 and with_reuse == plan["distinct_pieces"] - plan["eager_pieces"]

    with measure.PieceReuseOff() as switch:
        graphs = compile_and_train_blocks()
    switch.check_used()
    (plan_off,) = goddp.last_plans()
    assert plan_off["fingerprint"] == plan["fingerprint"], "the switch changes what is compiled, not the plan"
    assert plan_off["reused_pieces"] == 0
    assert len(graphs) == plan_off["num_pieces"] - plan_off["eager_pieces"] > with_reuse
    assert pipeline.group_pieces is blocks.group_pieces, "off again on leaving"


def test_piece_reuse_off_fails_when_its_target_moved(monkeypatch):
    monkeypatch.setattr(pipeline, "group_pieces", lambda signatures: list(range(len(signatures))))
    with pytest.raises(measure.MeasureHookError, match="no longer groups identical pieces"):
        measure.PieceReuseOff().on()
    monkeypatch.undo()
    monkeypatch.delattr(pipeline, "group_pieces")
    with pytest.raises(measure.MeasureHookError):
        measure.PieceReuseOff().on()


def test_piece_reuse_off_that_did_nothing_says_so():
    with measure.PieceReuseOff() as switch:
        pass
    with pytest.raises(measure.MeasureHookError, match="never grouped pieces"):
        switch.check_used()
    assert pipeline.group_pieces is blocks.group_pieces


def test_module_call_scan_sees_methods_and_nested_functions():
    assert measure._module_calls(pipeline, "group_pieces")
    assert not measure._module_calls(pipeline, "no_such_name_anywhere")


# ---------------------------------------------------------------- PieceRanges


def ranges_opened(monkeypatch, switch=None) -> int:
    """ZOO["mlp"] compiled by goddp (its pieces run as they are) and trained
    one step with no profiler recording, under switch; how many ranges
    goddp opened (goddp.tools.ranges' record_function calls)."""
    from goddp.tools import ranges

    opened = []
    real = ranges.record_function
    monkeypatch.setattr(ranges, "record_function", lambda name: opened.append(name) or real(name))
    entry = ZOO["mlp"]
    torch._dynamo.reset()
    goddp.clear_plans()
    ddp = entry.wrap(entry.build(seed=0), bucket_cap_mb=entry.ddp_cap_mb)
    compiled = torch.compile(ddp, backend=goddp.backend(inner=lambda gm, example_inputs: gm.forward, log_plan=False))
    with switch if switch is not None else contextlib.nullcontext():
        entry.loss(compiled(*entry.make_inputs(0))).backward()
    assert goddp.last_plans()[0]["num_pieces"] > 1
    return len(opened)


def test_piece_ranges_open_nothing_unless_a_profiler_records_or_the_switch_says_always(dist_group, monkeypatch):
    from goddp.graph import stitch
    from goddp.tools import ranges

    assert ranges_opened(monkeypatch) == 0
    opened = ranges_opened(monkeypatch, measure.PieceRanges("always"))
    pieces = goddp.last_plans()[0]["num_pieces"]
    assert opened == 2 * pieces  # each piece's forward and backward
    assert stitch.piece_ranges is ranges.piece_ranges, "off again on leaving"
    steps = ((print, None, (), ()),)
    with measure.PieceRanges("off") as switch:
        assert stitch.piece_ranges(steps, ["goddp piece 0"]) is None
    switch.check_used()
    with measure.PieceRanges("always"):
        assert stitch.piece_ranges(steps, ["goddp piece 0"]).wanted()
    assert not stitch.piece_ranges(steps, ["goddp piece 0"]).wanted()  # no profiler recording


def test_piece_ranges_switch_fails_when_its_target_moved_or_did_nothing(monkeypatch):
    from goddp.graph import stitch

    with pytest.raises(ValueError, match="mode must be one of"):
        measure.PieceRanges("sometimes")
    with measure.PieceRanges("off") as switch:
        pass
    with pytest.raises(measure.MeasureHookError, match="stitched no pieces"):
        switch.check_used()
    monkeypatch.setattr(stitch, "piece_ranges", lambda steps, labels: None)
    with pytest.raises(measure.MeasureHookError, match="no longer makes its ranged steps"):
        measure.PieceRanges("off").on()


# ---------------------------------------------------------------- first_use_nodes


def test_first_use_nodes_follow_the_forward():
    captured = []

    def capture(gm, example_inputs):
        captured.append(gm)
        return gm.forward

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    torch.compile(model, backend=capture)(torch.randn(3, 4))
    (gm,) = captured
    first = measure.first_use_nodes(gm)
    assert set(first) == {n for n, _ in model.named_parameters()}
    assert first["0.weight"] < first["2.weight"] < first["4.weight"]
    # each is the first node that reads the parameter's placeholder
    nodes = list(gm.graph.nodes)
    for name, index in first.items():
        module, attr = name.split(".")
        (source,) = [n for n in nodes if n.op == "placeholder" and n.name.endswith(f"_{module}_parameters_{attr}_")]
        assert index == min(i for i, n in enumerate(nodes) if source in n.all_input_nodes), name


# ---------------------------------------------------------------- plan_exchange


def test_plan_exchange_returns_every_ranks_statement():
    store = torch.distributed.HashStore()
    results: dict[int, dict] = {}

    def rank(r):
        exchange = measure.plan_exchange(store, "t/x", r, (0, 1), timeout_s=30)
        results[r] = [exchange(), exchange()]

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert set(results) == {0, 1}
    for rounds in results.values():
        for statements in rounds:
            assert set(statements) == {0, 1}
            assert Statement.from_json(statements[1]).pieces == 6


def test_plan_exchange_is_bounded():
    exchange = measure.plan_exchange(torch.distributed.HashStore(), "t/alone", 0, (0, 1), timeout_s=0.5)
    with pytest.raises(RanksMissingError):
        exchange()


def test_timeline_predicts_and_chooses():
    # two units of 1 ms backward, 1 MB each; 0.1 ms + 1 GB/s per allreduce
    request = {"backward_ns": [1_000_000, 1_000_000], "bytes": [1_000_000, 1_000_000],
               "allreduce": {"latency_ns": 100_000, "bytes_per_second": 1_000_000_000},
               "launch_ns": 0, "slowdown_permille": 1000}
    one = measure.timeline({**request, "starts": []})
    split = measure.timeline({**request, "starts": [1]})
    chosen = measure.timeline({**request, "starts": None})
    # one bucket: ready at 2 ms, done 2.1 ms later; two: the first (1 to
    # 2.1 ms) overlaps the second unit's backward, the second done at 3.2 ms
    assert (one["step_ns"], split["step_ns"]) == (4_100_000, 3_200_000)
    assert [b["end"] for b in chosen["buckets"]] == [1, 2] and chosen["step_ns"] == 3_200_000
