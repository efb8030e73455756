"""The package's layout keeps its promises (README.md, "Architecture"):
no import cycles, between modules or between subpackages (layers that read
top-down), goddp.native a leaf, no imports hidden in functions without a
reason, and one module that touches torch's private DDP API."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "python" / "goddp"

# The one module allowed to use torch's private DDP API.
PRIVATE_DDP_MODULE = "goddp.ddp.private"
# Names of torch's private DDP API (attributes of DDP, its reducer, its
# logger, and the torch.distributed helpers DDP builds its reducer with).
PRIVATE_DDP_NAMES = {
    "_ddp_init_helper",
    "_build_params_for_reducer",
    "_build_debug_param_to_name_mapping",
    "_get_ddp_logging_data",
    "_comm_hooks",
    "_register_comm_hook",
    "_set_comm_hook_name",
    "_compute_bucket_assignment_by_size",
    "_bucket_config",
    "_set_static_graph",
    "_use_python_reducer",
    "_delay_all_reduce_params",
    "_delay_all_reduce_all_params",
    "_join_config",
    "_has_rebuilt_buckets",
    "_pre_forward",
    "_post_forward",
    "_get_active_ddp_module",
    "_module_parameters",
    "_lazy_init_ran",
    "_require_manual_backward_finalization",
    "_remove_autograd_hooks",
    "_get_zeros_like_grad_buckets",
    "_set_manual_finalization_required",
    "_set_optimizer_in_backward",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    is_package = _modules()[module].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _module_level_imports(module: str, path: Path, in_functions: bool = False) -> set[str]:
    """The goddp modules `module` imports when it is imported (imports in
    functions excluded unless in_functions); ``from pkg import name`` counts
    pkg.name when that is a module."""
    modules = _modules()
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    functions = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in functions and not in_functions:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        else:
            continue
        out.update(n for n in names if n in modules and n != module)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of graph (module -> the modules it imports), or None.
    Every explicit edge counts, a package's __init__ and its own modules
    included: a subpackage's __init__ re-exporting its modules (goddp.tracing)
    is no cycle, but a module importing a name back from its package's
    __init__ while that __init__ imports it is."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_the_cycle_check_sees_a_cycle_through_a_package_init():
    assert _cycle({"p": {"p.a"}, "p.a": {"p.b"}, "p.b": set()}) is None  # re-exports only
    assert _cycle({"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}}) == ["p", "p.a", "p.b", "p"]
    assert _cycle({"p": {"p.a"}, "p.a": {"p"}}) == ["p", "p.a", "p"]


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    graph = {m: _module_level_imports(m, p) for m, p in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
    # The check sees the imports it must (it can fail).
    assert "goddp.ddp.private" in graph["goddp.ddp.align"]
    assert "goddp.graph.nodes" in graph["goddp.graph.export"]
    assert any(m.startswith("goddp.tracing.") for m in graph["goddp.tracing"])  # an __init__'s own edges


def _layer(module: str) -> str:
    """A module's subpackage or top-level module: goddp.graph.export ->
    goddp.graph; goddp.options -> goddp.options."""
    return ".".join(module.split(".")[:2])


def _layer_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Subpackage -> the other subpackages (and top-level modules) it
    imports, every import counted, in functions too."""
    graph: dict[str, set[str]] = {}
    for m, p in modules.items():
        targets = {_layer(t) for t in _module_level_imports(m, p, in_functions=True)}
        graph.setdefault(_layer(m), set()).update(targets - {_layer(m), "goddp"})
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    return graph


def test_no_subpackage_imports_one_that_imports_it_back():
    graph = _layer_graph(_modules())
    cycle = _cycle(graph)
    assert cycle is None, "subpackages import each other: " + " -> ".join(cycle or [])
    assert {"goddp.native", "goddp.options"} <= graph["goddp.compile"]  # the check sees the edges (it can fail)


def test_native_is_a_leaf():
    """goddp.native, the binding to the planner, imports nothing of goddp
    but itself (its ABI codes): every other layer may use it."""
    modules = _modules()
    escapes = {
        m: sorted(t for t in _module_level_imports(m, p, in_functions=True) if _layer(t) != "goddp.native")
        for m, p in modules.items()
        if _layer(m) == "goddp.native"
    }
    assert {m: ts for m, ts in escapes.items() if ts} == {}
    assert "goddp.native.extension" in _module_level_imports("goddp.native.plan", modules["goddp.native.plan"])


def test_the_layer_check_sees_cycles_and_lazy_imports(tmp_path, monkeypatch):
    root = tmp_path / "goddp"
    for name, text in {
        "__init__.py": "",
        "native/__init__.py": "",
        "native/plan.py": "from goddp.native import extension\nfrom ..graph import export\n",
        "native/extension.py": "def load():\n    import goddp.options\n",
        "graph/__init__.py": "",
        "graph/export.py": "from goddp.native.plan import X\n",
        "options.py": "from goddp import __version__\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    graph = _layer_graph(_modules())
    assert graph == {"goddp": set(), "goddp.native": {"goddp.graph", "goddp.options"},
                     "goddp.graph": {"goddp.native"}, "goddp.options": set()}
    assert _cycle(graph) == ["goddp.graph", "goddp.native", "goddp.graph"]


@pytest.mark.single_process
def test_every_module_imports_in_a_fresh_interpreter():
    """Each module imports when it is the first goddp module imported, and
    none loads the Go runtime: a fresh interpreter imports torch once, then
    forks a child per module that imports that module first. One child
    imports the whole package before anything but torch is loaded; the
    parent then imports torch._dynamo and Inductor, which every goddp module
    pulls in (2 to 4 s per child otherwise), for the children of each
    module."""
    names = sorted(_modules())
    code = (
        "import importlib, os, sys, traceback\n"
        "import torch, torch.distributed, torch.fx\n"
        "def imports_first(name):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "            assert 'libgoddp.so' not in open('/proc/self/maps').read(), 'an import loaded the Go runtime'\n"
        "        except BaseException:\n"
        "            traceback.print_exc()\n"
        "            os._exit(1)\n"
        "        os._exit(0)\n"
        "    return os.waitpid(pid, 0)[1] == 0\n"
        "failed = [] if imports_first('goddp') else ['goddp, before torch._dynamo and Inductor']\n"
        "import torch._dynamo, torch._inductor.compile_fx\n"
        f"failed += [name for name in {names!r} if not imports_first(name)]\n"
        "assert not failed, f'failed when imported first: {failed}'\n"
        "print('each imported first:', len(failed) == 0)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE.parent), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_imports_inside_functions_say_why():
    """An import inside a function hides a dependency; the few that must be
    lazy (an optional dependency, an API that exists only with
    torch.distributed) carry a comment that says why."""
    silent = []
    for module, path in _modules().items():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line = lines[node.lineno - 1]
                    above = lines[node.lineno - 2] if node.lineno > 1 else ""
                    if "#" not in line and not above.strip().startswith("#"):
                        silent.append(f"{module}:{node.lineno}: {line.strip()}")
    assert not silent, "imports inside functions without a reason:\n" + "\n".join(silent)


def _private_ddp_uses(path: Path) -> list[str]:
    uses = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_DDP_NAMES:
            uses.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_DDP_NAMES:
            uses.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return uses


def test_one_module_uses_torchs_private_ddp_api():
    modules = _modules()
    elsewhere = [use for m, p in modules.items() if m != PRIVATE_DDP_MODULE for use in _private_ddp_uses(p)]
    assert not elsewhere, f"torch's private DDP API outside {PRIVATE_DDP_MODULE}:\n" + "\n".join(elsewhere)
    # The check recognises the uses it forbids elsewhere (it can fail).
    assert len(_private_ddp_uses(modules[PRIVATE_DDP_MODULE])) > 10
