"""fp16 rows converted a row at a time on the CPU (Note [fp16 rows converted by the row] in
runtime/codegen/lowering/half_rows.py): a row kernel's contiguous fp16 rows are converted once
into float arrays (F16C's vector conversions where the CPU has them) and its fp16 outputs written
from one; the values are eager's, bit for bit, where the software conversions gave them."""

from __future__ import annotations

import shutil

import pytest
import torch

from runtime import autotune
from runtime.codegen.lowering import half_rows
from tests.util import compiled_post

H = torch.float16


def _rms(x, w):
    return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _t5_guard(h, y, w):
    x = h + y
    big = torch.where(x.isinf().any(), torch.finfo(x.dtype).max - 1000, torch.finfo(x.dtype).max)
    return _rms(x.clamp(min=-big, max=big), w)


def _add_rms(x, y, w):  # a residual add kept, and its RMS norm: two fp16 outputs of the row
    z = x + y
    return z, _rms(z, w)


def _add_layer_norm(x, y, w, b):  # (a float layer norm's last bits are not ATen's: within 1 fp16 ulp)
    z = x + y
    return z, torch.nn.functional.layer_norm(z.float(), (x.shape[-1],), w.float(), b.float()).to(x.dtype)


def _rms_of_transposed(x, w):  # the rows are strided in x: read as before (its mean's order is not ATen's)
    return _rms(x.transpose(0, 1), w)


def _gelu_tanh(x):  # eight fp16 rounds an element
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def _bias_add(x, b):  # the bias's row (no outer index) and x's
    return x * 2.0 + b


def _add_transposed(x, y):  # y read with a stride along the inner loop: read as before
    return x + y.t()


def _add_flat(x, y):  # one loop (no outer loop to hold the arrays): as before
    return x + y


def _in_place(x, y):  # an in-place update: the kernel writes an output of its own, copied into x
    x.mul_(2.0).add_(y)
    return x


def _special(t: torch.Tensor) -> torch.Tensor:
    """``t`` with infs, NaNs, subnormals, zeros of both signs and the largest fp16 in it."""
    t = t.clone()
    flat = t.view(-1)
    vals = torch.tensor([float("inf"), -float("inf"), float("nan"), 6e-8, -6e-8, 3e-5, 0.0, -0.0, 65504.0],
                        dtype=t.dtype)
    flat[3:3 + len(vals)] = vals
    return t


CASES = {  # name: (fn, inputs at two shapes, whether the CPU source converts rows in, and out)
    "add, then RMS norm": (_add_rms, lambda r, n: [_special(torch.randn(r, n, dtype=H)), torch.randn(r, n, dtype=H),
                                                   torch.randn(n, dtype=H)], (True, True)),
    "RMS norm": (_rms, lambda r, n: [_special(torch.randn(r, n, dtype=H)), torch.randn(n, dtype=H)], (True, True)),
    "T5's guarded RMS norm": (_t5_guard, lambda r, n: [torch.randn(r, n, dtype=H), torch.randn(r, n, dtype=H),
                                                     torch.randn(n, dtype=H)], (True, True)),
    "add, then layer norm in float": (_add_layer_norm, lambda r, n: [
        _special(torch.randn(r, n, dtype=H)), torch.randn(r, n, dtype=H), torch.randn(n, dtype=H),
        torch.randn(n, dtype=H)], (True, True)),
    # (the weight's row is contiguous: converted; x's and the output's are not)
    "RMS norm of strided rows": (_rms_of_transposed, lambda r, n: [torch.randn(n, r, dtype=H),
                                                                   torch.randn(n, dtype=H)], (True, False)),
    "RMS norm of rows past the arrays' budget": (
        _rms, lambda r, n: [torch.randn(2, 32768, dtype=H), torch.randn(32768, dtype=H)], (False, False)),
}


POINTWISE = {  # name: (fn, inputs at two shapes, whether converted in and out, eager's bits)
    "tanh GELU": (_gelu_tanh, lambda r, n: [_special(torch.randn(r, n, dtype=H))], (True, True), True),
    "a bias added": (_bias_add, lambda r, n: [_special(torch.randn(r, n, dtype=H)), torch.randn(n, dtype=H)],
                     (True, True), True),
    "SiLU times": (lambda a, b: torch.nn.functional.silu(a) * b,
                   lambda r, n: [torch.randn(r, n, dtype=H), torch.randn(r, n, dtype=H)], (True, True), False),
    "an add of a transposed input": (_add_transposed, lambda r, n: [torch.randn(r, n, dtype=H),
                                                                    torch.randn(n, r, dtype=H)], (True, True), True),
    "an add of 1-d inputs": (_add_flat, lambda r, n: [torch.randn(r * n, dtype=H), torch.randn(r * n, dtype=H)],
                             (False, False), True),
    "an in-place update": (_in_place, lambda r, n: [torch.randn(r, n, dtype=H), torch.randn(r, n, dtype=H)],
                           (True, True), True),
}


def _run(fn, inputs, rows: bool):
    half_rows.ROWS = rows
    try:
        with autotune.fixed("kernel"):
            prog = compiled_post(fn, inputs, backend="cpp")
    finally:
        half_rows.ROWS = True
    assert prog.kernels, "no generated kernel"
    assert all(seg in prog.kernels for seg, la in enumerate(prog.plan.segments)
               if la.kind.value in ("reduction", "normalization")), "a row segment ran on torch"
    cpu = "".join(k.function("cpu") for k in prog.kernels.values())
    return prog(*inputs), cpu


def _same(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    if exact:
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    else:
        torch.testing.assert_close(got[~nan], want[~nan], rtol=2 * torch.finfo(H).eps, atol=1e-5)


@pytest.mark.parametrize("shape", [(64, 1024), (37, 200)], ids=["64x1024", "37x200"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rows_converted_by_the_row_give_eagers_bits(name, shape) -> None:
    fn, make, converted = CASES[name]
    torch.manual_seed(0)
    inputs = make(*shape)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    got, cpu = _run(fn, inputs, rows=True)
    assert ("fuseg_h2f_run(hrow" in cpu, "fuseg_f2h_run(out" in cpu) == converted, cpu
    before, cpu_before = _run(fn, inputs, rows=False)
    assert "fuseg_h2f_run(hrow" not in cpu_before
    # (a float layer norm, and a mean over strided rows, add in other orders than ATen's: within
    # one fp16 unit; the rest is eager's bits, before and after)
    exact = fn not in (_add_layer_norm, _rms_of_transposed)
    for g, b, w in zip(got, before, want):
        _same(g, w, exact)
        _same(b, w, exact)


def test_a_weight_every_row_reads_is_converted_once() -> None:
    """A weight's row (no index of the row in its place) is converted before the row loop, once,
    and its threads read it; the input's rows inside it."""
    x, w = torch.randn(64, 1024, dtype=H), torch.randn(1024, dtype=H)
    _, cpu = _run(_rms, [x, w], rows=True)
    loop = cpu.index("for (FUSEG_I row")
    before, inside = cpu[:loop], cpu[loop:]
    assert before.count("fuseg_h2f_run(hrow") == 1 and inside.count("fuseg_h2f_run(hrow") == 1, cpu


@pytest.mark.parametrize("shape", [(64, 1024), (37, 200)], ids=["64x1024", "37x200"])
@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_pointwise_rows_converted_by_the_row(name, shape) -> None:
    """The innermost loop of a pointwise kernel (below an outer loop, marked simd) reads its fp16
    inputs at a unit step from float arrays filled before it and writes its fp16 outputs through
    one; the values are eager's (SiLU's exp is ours: within one fp16 unit), as before."""
    fn, make, converted, exact = POINTWISE[name]
    torch.manual_seed(0)
    inputs = make(*shape)
    want = fn(*[t.clone() for t in inputs])
    args = [t.clone() for t in inputs]
    half_rows.ROWS = True
    with autotune.fixed("kernel"):
        prog = compiled_post(fn, [t.clone() for t in inputs], backend="cpp")
    assert prog.kernels, "no generated kernel"
    cpu = "".join(k.function("cpu") for k in prog.kernels.values())
    assert ("fuseg_h2f_run(hrow" in cpu, "fuseg_f2h_run(out" in cpu) == converted, cpu
    got = prog(*args)[0]
    _same(got, want, exact)
    if name == "an in-place update":
        _same(args[0], want, exact)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_row_kernels_with_row_arrays_compile_for_cuda() -> None:
    """The arrays are the CPU's: the same sources compile for CUDA, whose loads are as before."""
    from runtime.codegen.build import nvcc_check_many

    kernels = []
    for fn, make in (CASES["RMS norm"][:2], CASES["add, then layer norm in float"][:2], POINTWISE["tanh GELU"][:2]):
        with autotune.fixed("kernel"):
            prog = compiled_post(fn, make(64, 1024), backend="cpp")
        kernels += list(prog.kernels.values())
    assert any("fuseg_h2f_run(hrow" in k.source("cuda") for k in kernels)
    assert nvcc_check_many(kernels) == []
