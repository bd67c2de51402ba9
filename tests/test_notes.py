"""docs/notes.md is what ``python -m perf.notes`` generates from the code, and every Note named in the
code or in the docs is defined once (perf/notes.py)."""

from __future__ import annotations

import glob
import os
import re

import pytest

from perf import notes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = "No" + "te"  # (spelled apart: this file's own text names no Note)


@pytest.fixture(scope="module")
def index() -> notes.NoteIndex:
    return notes.scan(ROOT)


def test_notes_md_is_generated_from_the_code(index: notes.NoteIndex) -> None:
    with open(os.path.join(ROOT, notes.OUTPUT), encoding="utf-8") as f:
        written = f.read()
    assert written == notes.render(index), "docs/notes.md is stale: run `python -m perf.notes`"


def test_no_name_dangles_and_no_note_is_defined_twice(index: notes.NoteIndex) -> None:
    assert index.dangling == []
    assert index.duplicated == {}
    assert len(index.definitions) > 100  # the scan found the tree's Notes at all


def test_the_docs_name_only_notes_that_exist(index: notes.NoteIndex) -> None:
    pages = [p for p in glob.glob(os.path.join(ROOT, "docs", "*.md")) if not p.endswith("notes.md")]
    pages.append(os.path.join(ROOT, "CONTRIBUTING.md"))
    named = {}
    for page in pages:
        with open(page, encoding="utf-8") as f:
            for title in re.findall(rf"{N} \[([^\]\n]+)\]", f.read()):
                named.setdefault(" ".join(title.split()), os.path.relpath(page, ROOT))
    missing = {t: p for t, p in named.items() if t not in index.definitions and t != "title"}
    assert missing == {}
    assert len(named) > 50  # the docs do name the code's Notes


def test_scan_finds_definitions_references_and_dangling_names() -> None:
    sources = {
        "a.py": (f'"""{N} [module rule]: a paragraph opening a module docstring."""\n'
                 f"x = 1  # {N} [comment rule]\n"
                 f"# {N} [comment rule]: the paragraph, after its first naming\n"
                 f"#: names {N} [module\n#: rule] over two lines, and {N} [nowhere]\n"),
        "b.sh": (f"// {N} [kernel rule]: in generated C++\n"
                 f'label = "{N} [kernel "\n    "rule] in a string split in two"\n'
                 f"# See {N} [module rule]: a naming with a colon, not a definition\n"),
        "c.py": f"    # {N} [kernel rule]: defined again\n",
    }
    index = notes.scan_sources(sources)
    assert dict(index.definitions) == {
        "module rule": [("a.py", 1)], "comment rule": [("a.py", 3)], "kernel rule": [("b.sh", 1), ("c.py", 1)]}
    assert {t: dict(r) for t, r in index.references.items()} == {
        "comment rule": {"a.py": 1}, "module rule": {"a.py": 1, "b.sh": 1}, "kernel rule": {"b.sh": 1}}
    assert index.dangling == [("nowhere", "a.py", 5)]
    assert index.duplicated == {"kernel rule": [("b.sh", 1), ("c.py", 1)]}
    text = notes.render(index)
    assert "| comment rule | `a.py` | `a.py` |" in text  # the file alone: no line to go stale
    assert "- `nowhere` at `a.py:5`" in text and "- `kernel rule`: `b.sh:1`, `c.py:1`" in text


def test_check_fails_on_a_stale_index(tmp_path) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "x.py").write_text(f"# {N} [a rule]: why\n")
    assert notes.main(["--root", str(tmp_path)]) == 0
    assert notes.main(["--root", str(tmp_path), "--check"]) == 0
    (tmp_path / "runtime" / "y.py").write_text(f"z = 0  # {N} [a rule]\n")
    assert notes.main(["--root", str(tmp_path), "--check"]) == 1  # y.py's naming is not in the file
    (tmp_path / "runtime" / "y.py").write_text(f"z = 0  # {N} [no rule]\n")
    assert notes.main(["--root", str(tmp_path)]) == 0
    assert notes.main(["--root", str(tmp_path), "--check"]) == 1  # up to date, but a name dangles
