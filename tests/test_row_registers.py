"""Note [row registers] (runtime/codegen/lowering/rows.py): where the block divides a row, a CUDA row
kernel's passes have no bounds test and the values its reduction passes load stay in registers.
Checked here through nvcc's PTX and ptxas's register report (no GPU); the kernels' values on a
GPU are tests/test_gpu.py's (every kernel case against eager CUDA PyTorch), and the CPU code,
which this leaves as it was, is checked against eager below at two shapes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen.build import ptx_of
from segmenter import capture, segment

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def _softmax(x):
    return torch.softmax(x, -1)


def _layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _five_inputs(a, b, c, d, e):
    """A row sum of five inputs, and a full output that reads them again: more loads than the
    register budget holds at 8 iterations a thread (32 / 8 = 4 arrays)."""
    s = (a * b + c * d + e).sum(-1, keepdim=True)
    return a * b + c * d + e - s


def _inputs(name: str, rows: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 7 + n)
    count = {"softmax": 1, "layer-norm": 3, "rms-norm": 2, "five": 5}[name]
    shapes = [(rows, n)] + [(n,)] * (count - 1) if name != "five" else [(rows, n)] * 5
    return [torch.randn(*s, generator=g) for s in shapes]


FNS = {"softmax": _softmax, "layer-norm": _layer_norm, "rms-norm": _rms_norm, "five": _five_inputs}


def _program(name: str, rows: int, n: int):
    fn, inputs = FNS[name], _inputs(name, rows, n)
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    return prog, fn, inputs


def _row_kernel(name: str, rows: int, n: int):
    prog, _, _ = _program(name, rows, n)
    (k,) = [k for k in prog.kernels.values() if k.kind == "row"]
    return k


def _counts(src: str) -> dict[str, int]:
    ptx = ptx_of(src)
    return {"ld": len(re.findall(r"\bld\.global", ptx)), "st": len(re.findall(r"\bst\.global", ptx)),
            "exp": len(re.findall(r"\bex2\.approx", ptx))}


@pytest.mark.parametrize("regs", ["1", "0"])
def test_a_row_the_block_divides_has_no_bounds_test_on_cuda(monkeypatch, regs: str) -> None:
    monkeypatch.setenv("FUSEG_ROW_REGS", regs)
    k = _row_kernel("softmax", 64, 4096)
    assert k.block == 512
    body = k.body
    if regs == "1":
        assert body.count("FUSEG_UNROLL for (int it = 0; it < 8; ++it) {") == 3
        assert "if (FUSEG_THREAD + (FUSEG_I)it * FUSEG_BLOCK_DIM < 4096)" not in body
        # the CPU loop is the one it was
        assert body.count("for (FUSEG_I j = FUSEG_THREAD; j < 4096; j += FUSEG_BLOCK_DIM) {") == 3
    else:
        assert body.count("if (FUSEG_THREAD + (FUSEG_I)it * FUSEG_BLOCK_DIM < 4096)") == 3
        assert "[it]" not in body


def test_a_row_the_block_does_not_divide_keeps_its_bounds_test() -> None:
    k = _row_kernel("softmax", 8, 1000)  # block 512: two iterations, the second past the row for some threads
    assert k.block == 512
    assert k.body.count("if (FUSEG_THREAD + (FUSEG_I)it * FUSEG_BLOCK_DIM < 1000)") == 3
    assert "[it]" not in k.body


@needs_nvcc
@pytest.mark.parametrize(("name", "regs", "loads", "exps"), [
    ("softmax", "1", 8, 8),      # x read once, one exp per element
    ("softmax", "0", 24, 16),    # before: x read by each of three passes, exps computed twice
    ("layer-norm", "1", 24, 0),  # x once, the weight and the bias in the write
    ("layer-norm", "0", 40, 0),  # x by each of three passes
    ("rms-norm", "1", 16, 0),
    ("rms-norm", "0", 24, 0),
])
def test_each_element_is_read_once_from_memory(monkeypatch, name: str, regs: str, loads: int, exps: int) -> None:
    """Global loads and exps in the PTX of a 4096-long row over 512 threads (8 a thread)."""
    monkeypatch.setenv("FUSEG_ROW_REGS", regs)
    c = _counts(_row_kernel(name, 64, 4096).source("cuda"))
    assert c == {"ld": loads, "st": 8, "exp": exps}


@needs_nvcc
def test_loads_past_the_register_budget_are_read_again() -> None:
    from runtime.codegen.lowering.rows import ROW_REGISTERS

    k = _row_kernel("five", 16, 4096)
    arrays = re.findall(r"float (k[0-9]+)\[8\];", k.body)
    assert len(arrays) == ROW_REGISTERS // 8 == 4
    kept = set(re.findall(r"k[0-9]+\[it\] = \(\(float\)(in[0-9])\[", k.body))
    assert len(kept) == 4
    (left,) = {"in0", "in1", "in2", "in3", "in4"} - kept
    assert f"FUSEG_ON_CPU(((float){left}[" not in k.body  # read from memory in every pass
    # 5 x 8 loads in the reduction pass; the write pass may read the fifth input's 8 again
    # (nvcc is free to keep them: they are read-only), never the kept four
    assert 40 <= _counts(k.source("cuda"))["ld"] <= 48


@needs_nvcc
@pytest.mark.parametrize("name", ["softmax", "layer-norm", "rms-norm", "five"])
def test_row_registers_do_not_spill(name: str) -> None:
    k = _row_kernel(name, 64, 4096)
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "k.cu")
        with open(cu, "w") as f:
            f.write(k.source("cuda"))
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
                            os.path.join(tmp, "k.cubin"), cu], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    report = [ln for ln in r.stderr.splitlines() if "spill" in ln]
    assert report and all("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in ln for ln in report), report


@pytest.mark.parametrize("name", ["softmax", "layer-norm", "rms-norm", "five"])
def test_the_cpu_kernel_still_matches_eager_at_two_shapes(name: str) -> None:
    for rows, n in ((64, 4096), (3, 512)):
        prog, fn, inputs = _program(name, rows, n)
        assert any(k.kind == "row" for k in prog.kernels.values())
        got, want = prog(*inputs), fn(*inputs)
        got = got[0] if isinstance(got, (tuple, list)) else got
        # a row sum of 4096 values of ~2 each: its summation order moves it by ~1e-4
        tol = 3e-4 if name == "five" else 1e-5
        torch.testing.assert_close(got, want, rtol=1e-5, atol=tol)
        assert got.stride() == want.stride()


@pytest.mark.parametrize("case,slots", [("layer-norm-1024", 2), ("softmax-rows-256", 1), ("layer-norm-768", 0)])
def test_the_kernel_cases_that_run_it_on_a_gpu_take_it(case: str, slots: int) -> None:
    """tests/test_gpu.py runs these kernel cases against eager on CUDA: the row registers are
    there (or, for 768 over a block of 512, not)."""
    from .kernel_cases import CASES

    fn, inputs = CASES[case]
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    bodies = [k.body for k in prog.kernels.values() if k.kind == "row"]
    assert bodies
    if slots:
        assert all(f"FUSEG_UNROLL for (int it = 0; it < {slots}; ++it) {{" in b and "[it]" in b for b in bodies)
    else:
        assert all("[it]" not in b for b in bodies)
