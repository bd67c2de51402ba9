"""The packages pyproject.toml's ``[tool.mypy]`` covers (the IR, the partitioner, the alias pass) type-check
clean under its strict flags, and a type error in any of them fails the check. Skipped where mypy is not
installed (it is in setup.py's test extra).

One mypy cache serves the module's runs (a fresh directory per session: nothing stale from an earlier
tree): the first run reads torch's types (about 7 s of CPU), the second reuses them (a few seconds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("mypy") is None, reason="mypy is not installed (pip install mypy)")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy_cache")


def mypy(root: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # the tree at root, not an installed copy; `mypy` with no arguments checks pyproject.toml's `files`
    env = {**os.environ, "MYPYPATH": str(root)}
    return subprocess.run(["mypy", "--cache-dir", str(cache), "--no-error-summary", "--python-executable",
                           sys.executable], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_covered_packages_type_check(cache_dir: Path) -> None:
    done = mypy(ROOT, cache_dir)
    assert done.returncode == 0, done.stdout + done.stderr


def _copy(tmp_path: Path) -> Path:
    for name in ("segmenter", "alias"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


# A deliberate error in each covered package, each of a kind the flags are there for; all in one copy of the
# tree, so one mypy run (a few seconds on the warm cache) checks that each one is reported where it is.
BROKEN = [
    # a wrong type where the IR says int
    ("segmenter/ir/limits.py", "def _broken() -> int:\n    return 'four'\n",
     'Incompatible return value type (got "str", expected "int")'),
    # a def without annotations (disallow_untyped_defs)
    ("alias/check.py", "def _broken(x):\n    return x\n", "Function is missing a type annotation"),
    # an attribute a TensorMeta does not have
    ("segmenter/partition/options.py",
     "from segmenter.ir.graph import TensorMeta\n\n\ndef _broken(m: TensorMeta) -> int:\n    return m.rank\n",
     '"TensorMeta" has no attribute "rank"'),
    # an ignore that hides nothing (warn_unused_ignores)
    ("alias/report.py", "_BROKEN: int = 4  # type: ignore[assignment]\n", 'Unused "type: ignore" comment'),
]


def test_a_type_error_fails(tmp_path: Path, cache_dir: Path) -> None:
    root = _copy(tmp_path)
    for module, code, _ in BROKEN:
        path = root / module
        path.write_text(path.read_text() + "\n\n" + code)
    done = mypy(root, cache_dir)
    assert done.returncode != 0, done.stdout
    errors = done.stdout.splitlines()
    for module, _, words in BROKEN:
        assert any(e.startswith(f"{module}:") and words in e for e in errors), (module, words, done.stdout)
