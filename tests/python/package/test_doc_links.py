"""Every relative link in README.md and docs/*.md leads somewhere: the file
exists and, where the link names an anchor, that file has a heading with
that anchor under GitHub's rules (lowercase; spaces become '-'; punctuation
but '-' and '_' dropped; a repeated heading gets '-1', '-2', ...). Links in
code (fenced blocks, indented blocks, `spans`) are text, not links. And the
README stays within its 500 lines."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
# [text](target) and ![alt](target); the target may carry a "title".
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of text outside fenced and indented code blocks."""
    out, fenced, previous_blank = [], None, True
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fenced is not None:
            if fence and fence.group(1) == fenced:
                fenced = None
        elif fence:
            fenced = fence.group(1)
        elif previous_blank and line.startswith(("    ", "\t")) and line.strip():
            continue  # an indented code block (it starts after a blank line)
        else:
            out.append((number, line))
            previous_blank = not line.strip()
            continue
        previous_blank = False
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = LINK.sub(lambda m: m.group(1), heading)  # a link in a heading anchors by its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in path's prose; a link may span
    two lines, so each paragraph is searched whole, code spans removed."""
    found: list[tuple[int, str]] = []
    paragraph: list[tuple[int, str]] = []

    def flush():
        if not paragraph:
            return
        text = "\n".join(line for _, line in paragraph)
        text = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        for match in LINK.finditer(text):
            found.append((paragraph[0][0] + text.count("\n", 0, match.start()), match.group(2)))
        paragraph.clear()

    last = None
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        if not line.strip() or (last is not None and number != last + 1):
            flush()
        if line.strip():
            paragraph.append((number, line))
        last = number
    flush()
    return found


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    problems = []
    for path in files:
        for number, target in links(path):
            if not target or EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: ({target})"
            if not dest.exists():
                problems.append(f"{where}: no file {file_part}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: {dest.relative_to(root)} has no heading #{anchor}")
            elif anchor and dest.suffix != ".md" and not re.fullmatch(r"L\d+(-L\d+)?", anchor):
                problems.append(f"{where}: an anchor into a file that is not Markdown")
    return problems


def test_every_relative_link_in_the_docs_resolves():
    files = doc_files()
    assert len(files) > 2 and all(p.is_file() for p in files)
    assert sum(len(links(p)) for p in files) > 20  # the scan sees the links
    assert broken_links(files) == []


def test_github_slugs():
    assert slug("Seeing the overlap: `goddp.trace`") == "seeing-the-overlap-goddptrace"
    assert slug("The demo: `make demo`") == "the-demo-make-demo"
    assert (
        slug("`find_unused_parameters=True`: caps vs DDP's own buckets: `python -m bench.declaration_order`")
        == "find_unused_parameterstrue-caps-vs-ddps-own-buckets-python--m-benchdeclaration_order"
    )
    assert slug("With a trainer: Hugging Face `Trainer` and Lightning") == "with-a-trainer-hugging-face-trainer-and-lightning"
    assert slug("See [the plan](planner.md#x)") == "see-the-plan"


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## Twice\n\n## Twice\n\n```\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "[fine](docs/other.md) [fine](docs/other.md#other-page) [fine](#top) [fine](docs/other.md#twice-1)\n"
        "[external](https://example.com/x.md#nothing) `[code](missing.md)`\n\n"
        "    [indented code](missing.md)\n\n"
        "```\n[fenced](missing.md)\n```\n\n"
        "[no file](docs/missing.md)\n"
        "[no anchor](docs/other.md#not-a-heading) [no anchor here](#nowhere)\n"
        "[a link over\ntwo lines](docs/gone.md) ![image](docs/picture.png)\n",
        encoding="utf-8",
    )
    problems = broken_links(doc_files(tmp_path), tmp_path)
    assert problems == [
        "README.md:12: (docs/missing.md): no file docs/missing.md",
        "README.md:13: (docs/other.md#not-a-heading): docs/other.md has no heading #not-a-heading",
        "README.md:13: (#nowhere): README.md has no heading #nowhere",
        "README.md:14: (docs/gone.md): no file docs/gone.md",
        "README.md:15: (docs/picture.png): no file docs/picture.png",
    ]
    (tmp_path / "docs" / "gone.md").write_text("# Gone\n")
    assert len(broken_links(doc_files(tmp_path), tmp_path)) == 4


README_MAX_LINES = 500  # issue 24: the README is for users; the rest lives in docs/


def test_the_readme_stays_short():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move the detail to docs/ (at most {README_MAX_LINES})"
