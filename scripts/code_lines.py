"""Code lines of the Python shim and of the Go planner (README,
"Architecture"): Python without blank, comment and docstring lines; Go
without blank and comment lines; planner tests apart.

    python scripts/code_lines.py [ROOT]
"""

from __future__ import annotations

import ast
import io
import pathlib
import sys
import tokenize


def python_lines(path: pathlib.Path) -> int:
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return len(lines)


def go_lines(path: pathlib.Path) -> int:
    count, in_block = 0, False
    for line in path.read_text().splitlines():
        text = line.strip()
        if in_block:
            in_block = "*/" not in text
            continue
        if not text or text.startswith("//"):
            continue
        if text.startswith("/*"):
            in_block = "*/" not in text
            continue
        count += 1
    return count


def main() -> None:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    shim = sum(python_lines(p) for p in (root / "python/goddp").rglob("*.py"))
    go = sorted((root / "planner").glob("*.go"))
    core = sum(go_lines(p) for p in go if not p.name.endswith("_test.go"))
    tests = sum(go_lines(p) for p in go if p.name.endswith("_test.go"))
    print(f"python/goddp: {shim} code lines; planner/: {core} (its tests: {tests}); shim/core {shim / core:.2f}")


if __name__ == "__main__":
    main()
