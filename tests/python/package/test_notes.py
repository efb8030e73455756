"""Named notes: each rationale is written once, as ``Note [Name]`` in the
module that owns the rule, and cited by name elsewhere, with or without its
place ("see Note [Name] in goddp.x" or "in path/to/file"; names are unique,
so a grep finds it). Every citation must resolve to the one definition, in
the place it names, if it names one."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SOURCES = ["python/goddp/**/*.py", "planner/*.go", "bridge/*.go", "csrc/*.[ch]", "docs/*.md", "bench/*.py", "README.md", "tests/README.md",
           "Makefile", "setup.py", "scripts/*.py"]

NOTE = re.compile(r"Note \[([^\]\n]+)\]")
# A definition: the name alone on a comment line, or "Note [Name]:" opening
# a paragraph (a docstring's), or the name alone underlined with ~~~.
DEFINITION = re.compile(
    r"^\s*(?:(?:#|//)\s*Note \[([^\]\n]+)\]\s*$|(?:#|//|\*|\"\"\")?\s*Note \[([^\]\n]+)\]:"
    r"|Note \[([^\]\n]+)\]\s*\n\s*~{3,}\s*$)",
    re.M,
)
PLACE = re.compile(r"Note \[[^\]\n]+\]\s+in\s+`?([\w./]*\w)")


def source_files() -> list[Path]:
    files = {p for pattern in SOURCES for p in REPO.glob(pattern) if p.is_file()}
    return sorted(p for p in files if "test_notes" not in p.name)


def scan() -> tuple[dict[str, list[Path]], list[tuple[Path, str, str | None]]]:
    definitions: dict[str, list[Path]] = {}
    citations = []
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        defined_here = set()
        for match in DEFINITION.finditer(text):
            group = next(g for g in (1, 2, 3) if match.group(g))
            definitions.setdefault(match.group(group), []).append(path)
            defined_here.add(match.start(group))
        for match in NOTE.finditer(text):
            if match.start(1) in defined_here:
                continue
            place = PLACE.match(text, match.start())
            citations.append((path, match.group(1), place.group(1) if place else None))
    return definitions, citations


def module_path(place: str) -> str:
    """goddp.ranks.agreement -> python/goddp/ranks/agreement.py; a path (or
    a file at the top, Makefile) stays."""
    if place.startswith("goddp/"):
        return "python/" + place
    if "/" in place or place.endswith((".go", ".py", ".md", ".h", ".c")) or (REPO / place).is_file():
        return place
    return "python/" + place.replace(".", "/") + ".py"


def test_each_note_is_defined_once():
    definitions, _ = scan()
    assert definitions, "no notes found"
    twice = {name: [str(p.relative_to(REPO)) for p in paths] for name, paths in definitions.items() if len(paths) > 1}
    assert not twice


def test_every_citation_names_a_note_and_its_place():
    definitions, citations = scan()
    problems = []
    for path, name, place in citations:
        where = str(path.relative_to(REPO))
        if name not in definitions:
            problems.append(f"{where}: Note [{name}] is defined nowhere")
            continue
        owner = definitions[name][0]
        if place is not None:
            target = REPO / module_path(place)
            package = target.with_suffix("") if target.suffix == ".py" else target
            if not (target == owner or (package.is_dir() and package in owner.parents)):
                problems.append(f"{where}: Note [{name}] is said to be in {place}, but is in {owner.relative_to(REPO)}")
    assert not problems, "\n".join(problems)


def test_every_note_is_cited():
    definitions, citations = scan()
    cited = {name for _, name, _ in citations}
    assert sorted(set(definitions) - cited) == []


def test_the_scan_tells_definitions_from_citations(tmp_path):
    text = (
        "# Note [A]\n# why A\nx = 1  # see Note [A] in goddp.a\n\"\"\"Note [B]: why B.\"\"\"\n"
        "// Note [C]: why C\n    Step 3 of Note [A]: a citation, not a definition\n"
        "Note [D]\n~~~~~~~~\nwhy D\nsee Note [D]\n~ not an underline\n"
    )
    defs = [m.group(1) or m.group(2) or m.group(3) for m in DEFINITION.finditer(text)]
    assert defs == ["A", "B", "C", "D"]
    assert [PLACE.match(text, m.start()).group(1) for m in NOTE.finditer(text) if PLACE.match(text, m.start())] == ["goddp.a"]
