"""Code lines of goddp's production code (docs/architecture.md): the
Python shim, the Go planner, the cgo bridge and the C sources. Python
without blank, comment and docstring lines; Go and C without blank and
comment lines; Go tests and test-only files (testsupport.go, debugpanic.go:
built only with the goddp_testhooks tag) apart.

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


def _test_only(path: pathlib.Path) -> bool:
    if path.name.endswith("_test.go"):
        return True
    head = path.read_text().lstrip()
    return head.startswith("//go:build") and "goddp_testhooks" in head.splitlines()[0] and "!" not in head.splitlines()[0]


def main() -> None:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    counts = {"python/goddp": sum(python_lines(p) for p in (root / "python/goddp").rglob("*.py"))}
    tests = 0
    for folder in ("planner", "bridge"):
        files = sorted((root / folder).glob("*.go"))
        counts[f"{folder}/"] = sum(go_lines(p) for p in files if not _test_only(p))
        tests += sum(go_lines(p) for p in files if _test_only(p))
    counts["csrc/"] = sum(go_lines(p) for p in sorted((root / "csrc").glob("*.[ch]")))
    total = sum(counts.values())
    print("; ".join(f"{k}: {v}" for k, v in counts.items()) + f"; production total: {total} (Go tests: {tests})")


if __name__ == "__main__":
    main()
