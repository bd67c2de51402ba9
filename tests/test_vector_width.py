"""Note [a vector width measured here] (runtime/codegen/vector_width.py): the width CPU kernels
prefer is measured once per machine and kept, or set; kernels built for 512 bits start with the
pragma and give eager's results. The suite itself runs with ``native`` (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import platform

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime import autotune, options
from runtime.codegen import vector_width
from runtime.machine.compiler import cpu_compiler
from segmenter import capture, segment

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    """A fresh cache dir, the width measured (no decision of this process kept)."""
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", "measure")
    monkeypatch.setattr(vector_width, "_RESOLVED", {})
    return tmp_path


def _scripted(monkeypatch, width: int) -> list:
    calls: list = []

    def measure():
        calls.append(1)
        return {"width": width, "wide_over_native": 0.8 if width else 1.0, "loops_us": {}, "how": "measured"}

    monkeypatch.setattr(vector_width, "measure", measure)
    monkeypatch.setattr(vector_width, "_why_not", lambda cxx: None)
    return calls


def test_the_option_reads_measure_native_and_512() -> None:
    assert options.RuntimeOptions().vector_width == "measure"
    assert options.from_env({"FUSEG_VECTOR_WIDTH": "Native"}).vector_width == "native"
    assert options.from_env({"FUSEG_VECTOR_WIDTH": "512"}).vector_width == "512"
    with pytest.raises(ValueError, match="FUSEG_VECTOR_WIDTH='256'"):
        options.from_env({"FUSEG_VECTOR_WIDTH": "256"})
    with pytest.raises(ValueError, match="vector_width"):
        options.RuntimeOptions(vector_width="wide")


@pytest.mark.parametrize("width", [512, 0])
def test_a_width_is_measured_once_and_kept(measuring, monkeypatch, width: int) -> None:
    calls = _scripted(monkeypatch, width)
    assert vector_width.resolve() == width and vector_width.resolve() == width
    assert len(calls) == 1  # once a process
    kept = json.loads(open(vector_width.kept_path()).read())
    assert kept["width"] == width and kept["machine"]["cpu"]
    monkeypatch.setattr(vector_width, "_RESOLVED", {})  # a second process, the same cache dir
    assert vector_width.resolve() == width and len(calls) == 1
    assert vector_width.pragma("cpu") == (vector_width.PRAGMA if width else "")
    assert vector_width.pragma("cuda") == ""


def test_a_damaged_kept_file_is_measured_again(measuring, monkeypatch) -> None:
    calls = _scripted(monkeypatch, 512)
    with open(vector_width.kept_path(), "w") as f:
        f.write("{not json")
    assert vector_width.resolve() == 512 and len(calls) == 1


def test_a_probe_that_fails_keeps_the_compilers_width_unkept(measuring, monkeypatch) -> None:
    def failing():
        raise OSError("no such library")

    monkeypatch.setattr(vector_width, "measure", failing)
    monkeypatch.setattr(vector_width, "_why_not", lambda cxx: None)
    assert vector_width.resolve() == 0
    assert not os.path.exists(vector_width.kept_path())


def test_nothing_is_measured_without_avx512(measuring, monkeypatch) -> None:
    real = vector_width._why_not
    calls = _scripted(monkeypatch, 512)
    monkeypatch.setattr(vector_width, "_why_not", real)
    monkeypatch.setattr(vector_width, "machine", lambda: {"cpu": "x", "cpu_flags": "sse2 avx avx2 fma f16c"})
    assert vector_width.resolve() == 0 and calls == []


def test_the_setting_goes_first(measuring, monkeypatch) -> None:
    calls = _scripted(monkeypatch, 512)
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", "native")
    assert vector_width.resolve() == 0
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", "512")
    assert vector_width.resolve() == 512 and calls == []


def test_the_cli_says_which_width_and_why(measuring, monkeypatch, capsys) -> None:
    from perf.tools.cli import main

    _scripted(monkeypatch, 512)
    assert main(["threads", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["vector_width"]
    assert got["width"] == 512 and got["how"] == "measured" and os.path.exists(got["path"])
    assert main(["threads"]) == 0
    assert "prefer 512-bit vectors (measured, the wide build 0.80x the other's time)" in capsys.readouterr().out
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", "native")
    assert main(["threads"]) == 0
    assert "the compiler's own vector width (set by FUSEG_VECTOR_WIDTH=native)" in capsys.readouterr().out


def test_verdicts_of_each_width_are_kept_apart(measuring, monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", "native")
    native = autotune.verdict_path()
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", "512")
    assert autotune.verdict_path() != native


@pytest.mark.parametrize("width", ["512", "native"])
def test_kernels_built_for_a_width_give_eagers_results(measuring, monkeypatch, width: str) -> None:
    """The pragma heads every kernel's source (a softmax, a layer norm, fp16 and bf16 math, a row
    sum), and what they compute is eager's, within the usual bounds, each at two shapes (the sum
    over a row of 2^25 + 3 values too: the lanes of a long sum follow the width)."""
    monkeypatch.setenv("FUSEG_VECTOR_WIDTH", width)
    h, bf = torch.float16, torch.bfloat16
    cases = [  # (program, its inputs at two shapes, whether it is the long sum)
        (lambda x: torch.softmax(x * 0.5, -1), [[torch.randn(6, 300)], [torch.randn(3, 1031)]], False),
        (lambda x, w: torch.nn.functional.layer_norm(x, (96,), w),
         [[torch.randn(5, 96), torch.randn(96)], [torch.randn(2, 7, 96), torch.randn(96)]], False),
        (lambda x: torch.nn.functional.gelu(x) * 2, [[torch.randn(33, 17, dtype=h)], [torch.randn(4, 1000, dtype=h)]], False),
        (lambda x, y: (x * y).exp() - y, [[torch.randn(8, 40, dtype=bf), torch.randn(40, dtype=bf)],
                                          [torch.randn(3, 5, 129, dtype=bf), torch.randn(129, dtype=bf)]], False),
        (lambda x: x.sum(-1), [[torch.randn(4, 100003)], [torch.randn(1, (1 << 25) + 3)]], True),
    ]
    with autotune.fixed("kernel"):
        for fn, shapes, long_sum in cases:
            for inputs in shapes:
                prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
                assert prog.kernels, "no kernel built"
                for kernel in prog.kernels.values():
                    assert kernel.source("cpu").startswith(vector_width.PRAGMA) == (width == "512")
                (got,) = prog(*inputs)
                want = fn(*inputs)
                if got.dtype in (torch.float16, torch.bfloat16):
                    torch.testing.assert_close(got, want, rtol=4 * torch.finfo(got.dtype).eps, atol=1e-5)
                elif long_sum:  # against float64, a few units of float32's epsilon times the sum of
                    # magnitudes (what a sum in any order of lanes keeps)
                    exact = fn(*[t.double() for t in inputs])
                    bound = 8 * torch.finfo(torch.float32).eps * inputs[0].double().abs().sum(-1)
                    assert ((got.double() - exact).abs() <= bound).all(), (got, exact)
                else:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the probe's pragma is GCC's for x86-64")
def test_the_probe_times_both_builds(measuring) -> None:
    got = vector_width.measure(rounds=1)
    assert set(got["loops_us"]) == set(vector_width.LOOPS)
    assert all(native > 0 and wide > 0 for native, wide in got["loops_us"].values())
    assert got["width"] in (0, 512) and (got["width"] == 512) == (got["wide_over_native"] * vector_width.TIE < 1)
