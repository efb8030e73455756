"""The options are documented once, in goddp.options.OPTIONS: the README's
table, goddp.backend's docstring and the validator all follow it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import goddp
from goddp import options as opts
from goddp.options import OPTION_KEYS, OPTIONS, Options, parse_options

README = Path(__file__).resolve().parents[3] / "README.md"
REGENERATE = "regenerate it: .venv/bin/python -m goddp.options --readme README.md"


def readme_rows(text: str) -> dict[str, list[str]]:
    """The README's options table between its markers, parsed: key -> cells
    (default, valid values, meaning)."""
    start, end = text.index(opts.README_BEGIN), text.index(opts.README_END)
    rows = {}
    for line in text[start + len(opts.README_BEGIN) : end].strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key = re.fullmatch(r"`(\w+)`", cells[0])
        assert key, f"README options row without a `key` cell: {line!r}"
        rows[key.group(1)] = cells[1:]
    return rows


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def test_readme_table_is_the_generated_one():
    text = README.read_text(encoding="utf-8")
    assert opts.with_readme_table(text) == text, f"README's options table differs from goddp.options.OPTIONS; {REGENERATE}"


def test_readme_keys_defaults_and_choices_are_the_validators():
    rows = readme_rows(README.read_text(encoding="utf-8"))
    assert tuple(rows) == OPTION_KEYS
    defaults = parse_options(None)
    for key, (default, valid, meaning) in rows.items():
        doc = next(d for d in OPTIONS if d.key == key)
        if doc.deprecated:
            assert default == "—" and "deprecated" in meaning, key
            continue
        # The first code span of the default cell is the value the validator
        # gives an option left out.
        shown = code_spans(default)[0]
        assert shown == (f'"{getattr(defaults, key)}"' if isinstance(getattr(defaults, key), str) else repr(getattr(defaults, key))), key
        for choice in doc.choices:
            assert (f'"{choice}"' if isinstance(choice, str) else repr(choice)) in code_spans(valid), (key, choice)
            parse_options({key: choice} if key != "edges" else {key: choice, "mode": "ddp"})
        assert meaning, key


def test_every_option_is_an_options_field_and_back():
    fields = [f.name for f in Options.__dataclass_fields__.values() if f.compare]
    assert OPTION_KEYS == tuple(fields)


@pytest.mark.parametrize("doc", OPTIONS, ids=lambda d: d.key)
def test_listed_choices_are_accepted_and_others_named(doc, monkeypatch):
    if doc.deprecated:
        monkeypatch.setattr(opts, "_warned_check_plans", False)
        with pytest.warns(DeprecationWarning, match="deprecated"):
            parse_options({doc.key: doc.choices[0]})
    for choice in doc.choices:
        assert getattr(parse_options({doc.key: choice}), doc.key) == choice
    if doc.choices and doc.key != "inner":
        with pytest.raises(ValueError) as info:
            parse_options({doc.key: "not-a-choice"})
        message = str(info.value)
        assert all(repr(c) in message for c in doc.choices), message


def test_backend_docstring_lists_every_option_with_its_default():
    doc = goddp.backend.__doc__
    for d in OPTIONS:
        line = next((l for l in doc.splitlines() if l.startswith(f"- {d.key} (default ")), None)
        assert line is not None, d.key
        assert opts._plain(opts.default_cell(d)) in line


def test_a_changed_side_fails(monkeypatch):
    # The check must notice a README edited by hand and a table changed in
    # code without regenerating the README.
    text = README.read_text(encoding="utf-8")
    edited = text.replace('| `mode` | `"ddp"` |', '| `mode` | `"torch"` |')
    assert edited != text
    assert opts.with_readme_table(edited) != edited
    changed = tuple(d if d.key != "strict" else opts.OptionDoc(d.key, d.default_note, d.valid, "something else", d.choices) for d in OPTIONS)
    monkeypatch.setattr(opts, "OPTIONS", changed)
    assert opts.with_readme_table(text) != text


def test_markers_are_required():
    with pytest.raises(ValueError, match="no options table markers"):
        opts.with_readme_table("# a README without the table\n")


def test_command_line(capsys, tmp_path):
    assert opts.main(["--markdown"]) == 0
    assert capsys.readouterr().out == opts.markdown_table()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{opts.README_BEGIN}\nold\n{opts.README_END}\nrest\n", encoding="utf-8")
    assert opts.main(["--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == f"intro\n{opts.README_BEGIN}\n{opts.markdown_table()}{opts.README_END}\nrest\n"
    assert opts.main(["--bogus"]) == 2
