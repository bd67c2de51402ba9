"""docs/ keeps up with the code: every FUSEG_* environment variable the code reads is on
docs/options.md, every page the index links exists, and each page stays a page (a few hundred
lines). The Notes the pages name are checked in tests/test_notes.py."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
P = "FUSEG" + "_"  # (spelled apart: this file's own text reads no variable)

#: how code reads (or sets, for a child process) an environment variable: os.environ.get("X"),
#: os.environ["X"], getenv("X"), monkeypatch.setenv("X"), _ENV = "X", dict(os.environ, X=...), ${X},
#: and a runtime option's variable, ``_opt(..., env="X", ...)`` (runtime/options.py)
_READS = (
    re.compile(rf"""(?:environ(?:\.get|\.setdefault|\.pop)?\s*[(\[]|getenv\(|setenv\(|_ENV\s*=|\benv=)\s*["']({P}[A-Z0-9_]+)["']"""),
    re.compile(rf"\b({P}[A-Z0-9_]+)="),
    re.compile(rf"\$\{{?({P}[A-Z0-9_]+)"),
)


def _sources() -> dict[str, str]:
    out = {}
    for top in ("segmenter", "alias", "runtime", "perf", "tests", ".ci"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "results")]
            for name in files:
                if name.endswith((".py", ".sh")) or top == ".ci":
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        out[os.path.relpath(path, ROOT)] = f.read()
    return out


def environment_variables(sources: dict[str, str]) -> dict[str, str]:
    """Each variable read from the environment -> the first file that reads it."""
    found: dict[str, str] = {}
    for path, text in sorted(sources.items()):
        for pattern in _READS:
            for name in pattern.findall(text):
                found.setdefault(name, path)
    return found


def test_the_scan_finds_reads_and_not_macros() -> None:
    text = (f'a = os.environ.get("{P}A", "1")\nb = os.environ["{P}B"]\n_ENV = "{P}C"\n'
            f'env = dict(os.environ, {P}D="0")\nmonkeypatch.setenv("{P}E", "0")\n'
            f'src = "#define {P}I long long\\n{P}ON_CPU(x, y)"\n'
            f'huge: bool = _opt(True, env="{P}G", doc="")\n')
    assert sorted(environment_variables({"x.py": text, "y.sh": f"echo ${{{P}F:-x}}"})) == [
        f"{P}{c}" for c in "ABCDEFG"]


def test_every_environment_variable_is_on_options_md() -> None:
    found = environment_variables(_sources())
    assert len(found) >= 20  # the scan found the tree's variables at all
    with open(os.path.join(DOCS, "options.md"), encoding="utf-8") as f:
        page = f.read()
    missing = {name: path for name, path in found.items() if f"`{name}`" not in page}
    assert missing == {}, "document these in docs/options.md (name, default, what it does)"


def test_the_index_links_every_page_and_each_page_stays_a_page() -> None:
    with open(os.path.join(DOCS, "README.md"), encoding="utf-8") as f:
        index = f.read()
    linked = set(re.findall(r"\]\(([a-z-]+\.md)\)", index))
    pages = {p for p in os.listdir(DOCS) if p.endswith(".md") and p != "README.md"}
    assert linked == pages
    for page in pages - {"notes.md"}:
        with open(os.path.join(DOCS, page), encoding="utf-8") as f:
            lines = f.read().count("\n")
        assert lines <= 400, f"docs/{page}: {lines} lines; split it"


def test_docs_cite_only_code_that_exists() -> None:
    """A `path/to/file.py` a page names is in the tree (pages follow moves of the code)."""
    missing = []
    for page in sorted(os.listdir(DOCS)):
        if not page.endswith(".md") or page == "notes.md":
            continue
        with open(os.path.join(DOCS, page), encoding="utf-8") as f:
            for path in re.findall(r"`((?:segmenter|alias|runtime|perf|tests)/[\w/]+\.(?:py|sh))`", f.read()):
                if not os.path.isfile(os.path.join(ROOT, path)):
                    missing.append(f"docs/{page}: {path}")
    assert missing == []
