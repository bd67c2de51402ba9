"""fuseg's decisions under torch's logging: ``TORCH_LOGS=+fuseg`` lines, and ``TORCH_TRACE``
artifacts that tlparse files with dynamo's graphs (Note [fuseg in torch's logs], runtime/logs.py).
Each test runs a fresh process: torch reads both variables when it is imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a softmax then a sum over the other dim: two segments and one cut with a reason; a second
# length makes dynamo recompile with a symbolic size, so the second program is a symbolic plan
SCRIPT = textwrap.dedent("""
    import torch

    def f(x, y):
        return torch.softmax(x * 2 + y, dim=-1).sum(0)

    g = torch.compile(f, backend="fuseg", options={"backend": "torch"})
    for n in (8, 11):
        x, y = torch.randn(n, 16), torch.randn(16)
        torch.testing.assert_close(g(x, y), f(x, y))
    print("values agree")
""")


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "compiled.py"
    script.write_text(SCRIPT)
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    environ.update(PYTHONPATH=str(ROOT) + os.pathsep + environ.get("PYTHONPATH", ""), **env)
    done = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "values agree" in done.stdout
    return done


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One process with both: ``TORCH_LOGS=+fuseg`` and ``TORCH_TRACE`` (the trace's folder, stderr)."""
    tmp = tmp_path_factory.mktemp("traced")
    done = _run(tmp, TORCH_LOGS="+fuseg", TORCH_TRACE=str(tmp / "trace"))
    return tmp, done.stderr


def test_torch_logs_plus_fuseg_shows_segments_cuts_backends_and_conditions(traced: tuple[Path, str]) -> None:
    err = traced[1]
    # INFO: one line per program, with dynamo's frame id, specialized and then a symbolic plan
    assert "[0/0] aot_graph_0 (specialized, alias mode post): 4 nodes -> 2 segments" in err
    assert "[0/1] aot_graph_0 (symbolic plan, alias mode post): 4 nodes -> 2 segments" in err
    assert "backends: torch x2" in err
    # DEBUG: the segments with their backends, the cut with its reason, the plan's conditions, the source
    assert "s0 NORMALIZATION on torch: [mul.Tensor, add.Tensor, _softmax.default]" in err
    assert "s1 REDUCTION on torch: [sum.dim_IntList]" in err
    assert "%_softmax: s0 -> s1: reductions over different domains" in err
    assert "symbolic sizes: s" in err and "one segmentation for every size" in err
    assert "def fuseg_program(" in err


def test_torch_logs_fuseg_at_info_leaves_the_details_out(tmp_path: Path) -> None:
    err = _run(tmp_path, TORCH_LOGS="fuseg").stderr
    assert "(specialized, alias mode post)" in err
    assert "s0 NORMALIZATION" not in err and "def fuseg_program(" not in err


def test_without_torch_logs_fuseg_is_silent(tmp_path: Path) -> None:
    assert "aot_graph_0" not in _run(tmp_path).stderr


def test_tlparse_shows_fuseg_artifacts_beside_dynamos_graphs(traced: tuple[Path, str]) -> None:
    tlparse = shutil.which("tlparse")
    if tlparse is None:
        pytest.skip("tlparse is not installed (pip install -e '.[test]' installs it)")
    trace = traced[0] / "trace"
    out = traced[0] / "tl_out"
    logs = sorted(trace.iterdir())
    assert logs, "TORCH_TRACE wrote nothing"
    done = subprocess.run([tlparse, str(logs[0]), "-o", str(out), "--no-browser", "--overwrite"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    index = (out / "index.html").read_text()
    for frame, how in (("-_0_0_0", "specialized"), ("-_0_1_0", "symbolic plan")):  # frame 0, compiles 0 and 1
        folder = out / frame
        names = sorted(p.name for p in folder.iterdir())
        assert any(n.startswith("dynamo_output_graph") for n in names), names  # dynamo's graph beside ours
        seg = [n for n in names if n.startswith("fuseg_segmentation")]
        prog = [n for n in names if n.startswith("fuseg_program")]
        assert len(seg) == 1 and len(prog) == 1, names
        assert f"{frame}/{seg[0]}" in index and f"{frame}/{prog[0]}" in index
        record = json.loads((folder / seg[0]).read_text())
        assert record["how"] == how and record["graph"] == "aot_graph_0"
        assert [s["kind"] for s in record["segments"]] == ["normalization", "reduction"]
        assert [s["backend"] for s in record["segments"]] == ["torch", "torch"]
        assert record["boundaries"][0]["reason"].startswith("reductions over different domains")
        assert bool(record["conditions"]) == (how == "symbolic plan")
        assert "def fuseg_program(" in (folder / prog[0]).read_text()
