"""Note [elements along a broadcast dim] (runtime/codegen/lowering/lower.py): a CUDA pointwise loop whose
input is broadcast along a dim gives each thread consecutive indices of that dim, so the input
is loaded once for them. Checked as source and through nvcc's PTX (no GPU); the values on a GPU
are tests/test_gpu.py's kernel cases (bias adds, RoPE), and the CPU loop is not touched."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen.build import ptx_of
from segmenter import capture, segment

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

ALONG = "FUSEG_UNROLL for (int u_ = 0; u_ < 4; ++u_) {"


def _kernel(fn, inputs):
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    (k,) = [k for k in prog.kernels.values() if k.kind == "pointwise"]
    return k


def _rope(x, cos, sin):
    x1, x2 = x[..., :16], x[..., 16:]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _loads_per_store(src: str) -> float:
    """Global loads over global stores in the PTX (nvcc unrolls the grid-stride loop as it likes:
    the ratio, not the count, is the loop body's)."""
    text = ptx_of(src)
    return len(re.findall(r"\bld\.global", text)) / len(re.findall(r"\bst\.global", text))


def test_a_bias_add_takes_four_rows_a_thread(monkeypatch) -> None:
    monkeypatch.delenv("FUSEG_BCAST_EPT", raising=False)
    k = _kernel(lambda x, b: x + b, [torch.randn(64, 256), torch.randn(256)])
    assert ALONG in k.body
    assert "const FUSEG_I i_0 = ((i) / 256) * 4 + u_;" in k.body
    assert f"i < {64 * 256 // 4};" in k.body
    assert k.grid == -(-64 * 256 // 1024)  # the grid of four elements a thread, as before


def test_rope_takes_four_heads_a_thread(monkeypatch) -> None:
    monkeypatch.delenv("FUSEG_BCAST_EPT", raising=False)
    x, cos, sin = torch.randn(8, 16, 32), torch.randn(16, 32), torch.randn(16, 32)
    k = _kernel(_rope, [x, cos, sin])
    assert ALONG in k.body
    assert "const FUSEG_I i_0 = ((i) / 512) * 4 + u_;" in k.body  # the heads, which cos and sin do not have


@pytest.mark.parametrize("name,fn,inputs", [
    ("no broadcast input", lambda x, y: x * y + 1, [torch.randn(64, 256), torch.randn(64, 256)]),
    ("broadcast along a dim of 10", lambda x, b: x + b, [torch.randn(10, 256), torch.randn(256)]),
    ("broadcast along the innermost dim only", lambda x, b: x + b, [torch.randn(64, 256), torch.randn(64, 1)]),
])
def test_a_loop_without_such_a_dim_keeps_its_elements_a_block_apart(monkeypatch, name, fn, inputs) -> None:
    monkeypatch.delenv("FUSEG_BCAST_EPT", raising=False)
    k = _kernel(fn, inputs)
    assert ALONG not in k.body, name
    assert "i_ + (FUSEG_I)u_ * FUSEG_BLOCK_DIM" in k.body


def test_the_switch_turns_it_off(monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_BCAST_EPT", "0")
    k = _kernel(lambda x, b: x + b, [torch.randn(64, 256), torch.randn(256)])
    assert ALONG not in k.body


@needs_nvcc
@pytest.mark.parametrize("on,ratio", [("1", 5 / 4), ("0", 2)])
def test_the_broadcast_input_is_loaded_once_for_the_four_elements(monkeypatch, on: str, ratio: float) -> None:
    """x + b over rows: four rows of x and one of b for four stores; before, an x and a b each."""
    monkeypatch.setenv("FUSEG_BCAST_EPT", on)
    k = _kernel(lambda x, b: x + b, [torch.randn(64, 256), torch.randn(256)])
    assert _loads_per_store(k.source("cuda")) == ratio


def test_the_cpu_loop_is_the_same_and_matches_eager_at_two_shapes(monkeypatch) -> None:
    for T in (16, 24):
        x, cos, sin = torch.randn(8, T, 32), torch.randn(T, 32), torch.randn(T, 32)
        bodies = []
        for on in ("1", "0"):
            monkeypatch.setenv("FUSEG_BCAST_EPT", on)
            prog = runtime.compile(apply_aliases(segment(capture(_rope, [x, cos, sin])), "post"), backend="cpp")
            torch.testing.assert_close(prog(x, cos, sin)[0], _rope(x, cos, sin))
            (k,) = [k for k in prog.kernels.values() if k.kind == "pointwise"]
            bodies.append(k.body.split("#else", 1)[1])  # the CPU side (the CUDA loop comes first)
        assert bodies[0] == bodies[1]


@pytest.mark.parametrize("case,dim", [("bcast-rows", 0), ("bcast-inner", 1), ("rope", 1)])
def test_the_kernel_cases_that_run_it_on_a_gpu_take_it(monkeypatch, case: str, dim: int) -> None:
    """tests/test_gpu.py runs these kernel cases against eager on CUDA: they must take the path."""
    from .kernel_cases import CASES

    monkeypatch.delenv("FUSEG_BCAST_EPT", raising=False)
    fn, inputs = CASES[case]
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    bodies = [k.body for k in prog.kernels.values() if k.kind == "pointwise"]
    # (rope's dim 1 has 4 indices: the thread takes all of them, ``i_1 = u_``)
    along = re.compile(rf"const FUSEG_I i_{dim} = (.* \* 4 \+ u_|\(FUSEG_I\)u_);")
    assert any(ALONG in b and along.search(b) for b in bodies)


@pytest.mark.parametrize("whole", ["1", "0"])
def test_a_dim_of_seven_is_taken_whole_when_asked(monkeypatch, whole: str) -> None:
    """The expanded V of a GQA with 7 query heads per group, a thread a whole group of 7 copies: on
    by default (measured on an H100, run 5), off with FUSEG_BCAST_WHOLE=0."""
    if whole == "1":
        monkeypatch.delenv("FUSEG_BCAST_WHOLE", raising=False)
    else:
        monkeypatch.setenv("FUSEG_BCAST_WHOLE", whole)
    v = torch.randn(2, 1, 16, 8)
    k = _kernel(lambda v: v.expand(2, 7, 16, 8) * 2, [v])
    if whole == "1":
        assert "FUSEG_UNROLL for (int u_ = 0; u_ < 7; ++u_) {" in k.body
        assert f"i < {2 * 16 * 8};" in k.body
    else:
        assert "u_ < 7" not in k.body and ALONG not in k.body


@needs_nvcc
def test_the_case_of_seven_compiles_and_matches_eager_with_the_dim_taken_whole(monkeypatch) -> None:
    """The kernel case tests/test_gpu.py runs against eager, its dim taken whole (the default)."""
    from runtime.codegen.build import nvcc_check

    from .kernel_cases import CASES

    monkeypatch.delenv("FUSEG_BCAST_WHOLE", raising=False)
    fn, inputs = CASES["bcast-seven"]
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    (k,) = [k for k in prog.kernels.values() if k.kind == "pointwise"]
    assert "FUSEG_UNROLL for (int u_ = 0; u_ < 7; ++u_) {" in k.body
    r = nvcc_check(k)
    assert r.returncode == 0, r.stderr[-2000:]
    for got, want in zip(prog(*inputs), fn(*inputs)):
        torch.testing.assert_close(got, want)


def test_a_small_dim_taken_whole_loses_to_a_dim_of_more_elements() -> None:
    """RoPE over [2, 4, 8, 16] (batch 2, 4 heads): both dims are free of cos and sin; the thread
    takes 4 heads (ept), not the batch of 2 whole."""
    fn = lambda x, c, s: x * c + x.flip(-1) * s  # noqa: E731
    k = _kernel(fn, [torch.randn(2, 4, 8, 16), torch.randn(8, 16), torch.randn(8, 16)])
    assert "u_ < 4" in k.body and "u_ < 2" not in k.body
    assert re.search(r"const FUSEG_I i_1 = .*u_", k.body)


def test_a_dim_of_six_is_taken_whole() -> None:
    k = _kernel(lambda x, b: x + b, [torch.randn(6, 256), torch.randn(256)])
    assert "FUSEG_UNROLL for (int u_ = 0; u_ < 6; ++u_) {" in k.body and f"i < {256};" in k.body
