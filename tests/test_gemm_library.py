"""Note [one matmul library] (runtime/codegen/gemm_library.py): the matmul routines are compiled
once into a library the kernels call; a kernel's own source holds no routine; the library's entry
points honour the settings each kernel passes; a second process with the same cache builds
nothing and computes the same bits."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.codegen import gemm_library
from runtime.codegen.build import cpu_compiler
from runtime.codegen.source.ctypes_ import GEMM_LIBRARY, GEMM_TAG, prelude
from runtime.codegen.source.gemm_prelude import gemm_texts

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")
ROOT = Path(__file__).resolve().parent.parent

# (function text of a kernel, whether it calls the library)
CALLS = [
    ("  fuseg_mm_nt(4, 8, 16, p0_, 16, p1_, 16, y_, 8, nullptr, 0, 0);\n", True),
    ("  fuseg_mm_nn(4, 8, 16, p0_, 16, 1, p1_, 8, y_, 8, nullptr, 0, 0);\n", True),
    ("  fuseg_attention_head(L, S, E, q, 64, k, 64, v, 64, nullptr, 0, 0, 1, 0.125f, o, 64, lse, 1);\n", True),
    ("  fuseg_attention_head_backward(L, S, E, g, 64, q, 64, k, 64, v, 64);\n", True),
    ("  for (FUSEG_I i = 0; i < 4; ++i) y_[i] = fuseg_exp(p0_[i]);\n", False),
    ("  // fuseg_mm_ntx is no routine\n  y_[0] = my_fuseg_mm_nt;\n", False),
]


@pytest.mark.parametrize("function,calls", CALLS)
def test_which_kernels_call_the_library(function: str, calls: bool) -> None:
    assert gemm_library.calls_library(function) is calls


def test_the_kernels_prelude_calls_the_library_it_names() -> None:
    """The prelude declares the entry points under the library's tag and holds no routine body;
    the library defines both; another library source has another tag."""
    cpu = prelude("cpu")
    assert f"fuseg_gemm_nt_{GEMM_TAG}(" in cpu and f"fuseg_gemm_nn_{GEMM_TAG}(" in cpu
    assert "fuseg_nn_tile" not in cpu and "fuseg_nt_pack" not in cpu  # (the routines' parts)
    assert f'extern "C" void fuseg_gemm_nt_{GEMM_TAG}(long long macs' in GEMM_LIBRARY
    assert "fuseg_nn_tile" in GEMM_LIBRARY and "fuseg_attention_head" not in GEMM_LIBRARY
    other, calls, tag = gemm_texts("// another prelude\n")
    assert tag != GEMM_TAG and f"fuseg_gemm_nn_{tag}(" in calls and f"fuseg_gemm_nn_{tag}(" in other


def _product(lib: ctypes.CDLL, name: str, macs: int, pack: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C = A @ B by the library's entry point ``name``: ``b`` is N x K for "nt", K x N for "nn"."""
    (M, K), N = a.shape, b.shape[0] if name == "nt" else b.shape[1]
    c = torch.full((M, N), float("nan"))
    p, L = ctypes.c_void_p, ctypes.c_long
    fn = getattr(lib, f"fuseg_gemm_{name}_{GEMM_TAG}")
    fn.restype = None
    strides = (L(K), p(b.data_ptr()), L(K)) if name == "nt" else (L(K), L(1), p(b.data_ptr()), L(N))
    fn(ctypes.c_longlong(macs), L(pack), L(M), L(N), L(K), p(a.data_ptr()), *strides, p(c.data_ptr()), L(N), None,
       L(0), L(0))
    return c


@pytest.mark.parametrize("name", ["nt", "nn"])
@pytest.mark.parametrize("shape", [(37, 70, 300), (6, 131, 129)])
def test_the_entry_points_take_the_settings_they_are_given(name: str, shape: tuple[int, int, int]) -> None:
    """Each setting a kernel passes reaches the routine: on threads or on one, a product makes the
    same sums; with B copied first (pack rows 1) or read in place, both ways are within float32's
    error of torch's product, and in "nt" they sum in different orders (k in order against lanes
    of dot products), so some of the sums differ in their last bits. Two shapes: whole and partial
    register tiles, k past a block of ``FUSEG_KC``, columns past the last whole vector."""
    gemm_library.load()
    lib = ctypes.CDLL(gemm_library.ensure())
    g = torch.Generator().manual_seed(0)
    M, N, K = shape
    a = torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g) if name == "nt" else torch.randn(K, N, generator=g)
    want = a @ (b.t() if name == "nt" else b)
    ways = {}
    for pack in (1, 1 << 30):
        one, threads = (_product(lib, name, macs, pack, a, b) for macs in (1 << 62, 0))
        torch.testing.assert_close(one, want, atol=1e-4, rtol=1e-5)
        assert torch.equal(one, threads), (name, pack)
        ways[pack] = one
    if name == "nt":
        assert not torch.equal(ways[1], ways[1 << 30])


_PROCESS = """
import json, sys, torch
import torch.nn.functional as F
import runtime
from alias import apply_aliases
from runtime import autotune
from runtime.codegen import build, gemm_library
from segmenter import capture, segment
g = torch.Generator().manual_seed(0)
x, w, b = torch.randn(24, 96, generator=g), torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
fn = lambda x, w, b: torch.relu(F.linear(x, w, b))
with autotune.fixed("kernel"):
    prog = runtime.compile(apply_aliases(segment(capture(fn, [x, w, b])), "post"), backend="cpp")
    out = prog(x, w, b)[0]
print(json.dumps({"backends": sorted(set(prog.backend_of.values())), "library": build.compilations["library"],
                  "kernels": build.compilations["cpu"], "loaded": gemm_library.loaded(),
                  "bits": out.view(torch.int32).sum().item(),
                  "eager": (out - fn(x, w, b)).abs().max().item()}))
"""


def _process(cache: Path) -> dict:
    env = {**os.environ, "FUSEG_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_builds_neither_the_library_nor_the_kernels(tmp_path: Path) -> None:
    """A linear layer's kernel in a fresh cache: the library is built once, beside the kernels, and
    loaded; a second process with that cache compiles nothing, loads the library for the kernel it
    finds, and makes the same bits, within float32's error of eager."""
    first = _process(tmp_path)
    assert first["backends"] == ["cpp"] and first["loaded"], first
    assert first["library"] == 1 and first["kernels"] >= 1, first
    assert [p.name for p in tmp_path.glob("fuseg_gemm_*.so")] == [os.path.basename(gemm_library.path())]
    second = _process(tmp_path)
    assert second["library"] == 0 and second["kernels"] == 0 and second["loaded"], second
    assert second["bits"] == first["bits"] and first["eager"] < 1e-4, (first, second)


def test_a_binary_whose_group_mate_calls_the_library_loads_it(tmp_path: Path) -> None:
    """A kernel built in a group (Note [one build per group of kernels]) shares its binary with the
    group's other kernels: where one of those calls the library and this one does not, loading
    this one's binary in a process without the library loads the library first, instead of
    failing on the undefined symbol (and building the kernel again)."""
    src = tmp_path / "mate.cpp"
    src.write_text(f'extern "C" void fuseg_gemm_nn_{GEMM_TAG}(long long, long, long, long, long, const float*, long, '
                   'long, const float*, long, float*, long, const float*, long, long);\n'
                   'extern "C" void plain(float* y) { y[0] = 1.0f; }\n'
                   f'extern "C" void mate(float* y) {{ fuseg_gemm_nn_{GEMM_TAG}(1, 1, 1, 1, 1, y, 1, 1, y, 1, y, 1, '
                   'nullptr, 0, 0); }\n')
    so = tmp_path / "mate.so"
    subprocess.run([cpu_compiler(), "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    code = ("import ctypes, sys\nfrom runtime.codegen import build, gemm_library\n"
            "assert not gemm_library.loaded()\n"
            "try:\n    ctypes.CDLL(sys.argv[1])\nexcept OSError as e:\n    assert 'undefined symbol' in str(e), e\n"
            "else:\n    raise AssertionError('loaded without the library')\n"
            "lib = build._load_kernel(sys.argv[1], False)\nassert gemm_library.loaded() and lib.plain\n")
    env = dict(os.environ, FUSEG_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code, str(so)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
