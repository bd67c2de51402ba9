"""The packages keep their layers (perf > runtime > alias > segmenter; inside segmenter formats >
partition | capturing > ir; inside perf the tools apart from the benchmarks, over bench and the
programs; inside runtime dynamo > compiled > backends > autotune > emit | storage > codegen >
machine, and codegen's own) and segmenter, alias, perf and runtime have no import circle:
pyproject.toml's ``[tool.importlinter]`` contracts, checked by ``lint-imports``. Skipped where import-linter is not
installed (it is in setup.py's test extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("segmenter", "alias", "runtime", "perf")

pytestmark = pytest.mark.skipif(shutil.which("lint-imports") is None,
                                reason="import-linter is not installed (pip install import-linter)")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the tree at root, not an installed copy
    return subprocess.run(["lint-imports", "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_contracts_are_kept() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _copy(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize("module, line, words", [
    # the IR reaching up into capture (as symbolic.py once did for meta.fakeable)
    ("segmenter/ir/symbolic.py", "from ..capturing import meta", "segmenter.ir is not allowed to import segmenter.capturing"),
    # the segmenter reaching up into the runtime
    ("segmenter/partition/greedy.py", "import runtime", "segmenter is not allowed to import runtime"),
    # a circle between siblings in one layer
    ("segmenter/ir/limits.py", "from . import graph", "No cycles are allowed in segmenter.ir"),
    # a benchmark reaching into the user tools (perf/tools/ and perf/benchmarks/ are kept apart)
    ("perf/benchmarks/bench_alias.py", "from ..tools import run", "perf.benchmarks is not allowed to import perf.tools"),
    # what the tools and the benchmarks share reaching up into the CLI
    ("perf/bench.py", "from .tools import cli", "perf.bench is not allowed to import perf.tools"),
    # the machine reaching up into the backends (as threads.py once did for ChosenAtCall)
    ("runtime/machine/threads.py", "from ..backends import at_call",
     "runtime.machine is not allowed to import runtime.backends"),
    # the thresholds reaching up into their measuring (as thresholds.py once did for calibrate)
    ("runtime/codegen/thresholds.py", "from . import calibrate",
     "runtime.codegen.thresholds is not allowed to import runtime.codegen.calibrate"),
    # a circle between siblings of the runtime in one layer (program.py imports trial)
    ("runtime/compiled/trial.py", "from . import program", "No cycles are allowed in runtime.compiled"),
])
def test_a_broken_contract_fails(tmp_path: Path, module: str, line: str, words: str) -> None:
    root = _copy(tmp_path)
    path = root / module
    if module == "segmenter/ir/limits.py":
        # graph.py must import limits first for the new import to close a circle
        graph = root / "segmenter/ir/graph.py"
        graph.write_text(graph.read_text() + "\nfrom . import limits  # noqa: E402\n")
    path.write_text(path.read_text() + f"\n{line}  # noqa: E402\n")
    done = lint_imports(root)
    assert done.returncode != 0, done.stdout
    assert words in done.stdout, done.stdout
