"""Note [sums in ATen's order] (runtime/codegen/lowering/cascade.py): a float sum or mean over an
innermost row of a known length adds in ATen's ``cascade_sum`` order, so its bits are eager's."""

from __future__ import annotations

import pytest
import torch

from runtime.codegen.kernel import branches_with_loads

from .util import compiled_post

LENGTHS = (8, 9, 31, 64, 100, 512, 513, 1024, 2047, 4096)


def _kernel_only(prog) -> None:  # noqa: ANN001
    assert prog.backend_of and set(prog.backend_of.values()) == {"cpp"}, prog.backend_of


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("rows", [1, 7])
def test_row_sums_and_means_are_eagers_bits(dtype, rows) -> None:
    """Values of mean 3.5 (every sum rounds), at lengths around the vector, four-vector and
    cascade steps, with a prologue (the squares, as an RMS norm has them)."""
    g = torch.Generator().manual_seed(rows)
    for n in LENGTHS:
        x = (torch.rand(rows, n, generator=g, dtype=torch.float64) + 3).to(dtype)
        for name, fn in (("sum", lambda t: (t * t).sum(-1)), ("mean", lambda t: (t * t).mean(-1, keepdim=True))):
            prog = compiled_post(fn, [x], backend="cpp")
            _kernel_only(prog)
            (got,) = prog(x)
            assert torch.equal(got, fn(x)), (name, n, int((got != fn(x)).sum()))


def _t5_rms_norm(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return w * (h * torch.rsqrt(variance + 1e-6)).to(torch.bfloat16)


@pytest.mark.parametrize("shape", [(256, 512), (3, 40, 768)], ids=["256x512", "3x40x768"])
def test_a_bf16_rms_norm_gives_eagers_bits(shape) -> None:
    """T5's RMS norm in bfloat16: a mean of squares in float, then rounded to bf16, where a last
    float bit of the mean became a rounding of the output (80 values of T5's encoder output)."""
    torch.manual_seed(0)
    h, w = (torch.randn(*shape) * 4).bfloat16(), (torch.randn(shape[-1]) * 0.2 + 1).bfloat16()
    prog = compiled_post(_t5_rms_norm, [h, w], backend="cpp")
    _kernel_only(prog)
    (got,) = prog(h, w)
    assert torch.equal(got, _t5_rms_norm(h, w))


def test_the_sum_is_laid_out_with_no_branch() -> None:
    """A CPU kernel with an ``if`` is built without if-conversion (Note [no if-conversion of
    branches]): a cascade written with one left a bf16 RMS norm's write pass scalar, 7x slower."""
    prog = compiled_post(_t5_rms_norm, [torch.randn(4, 2048).bfloat16(), torch.randn(2048).bfloat16()], backend="cpp")
    (kernel,) = prog.kernels.values()
    assert "[4][32]" in kernel.body  # (2048 values: the cascade's four levels are used)
    assert not branches_with_loads(kernel.body)


def test_other_rows_keep_their_sums() -> None:
    """Not in ATen's order: a row reduced over an outer dim (a column pass), and a row longer than
    ROW_CHUNK (chunked, Note [sums in chunks]): still within eager's error, not its bits."""
    from runtime.codegen.lowering import cascade

    assert cascade.aten_order_applies(512, "float", True) and cascade.aten_order_applies(4096, "double", True)
    assert not cascade.aten_order_applies(512, "float", False)
    assert not cascade.aten_order_applies(4097, "float", True) and not cascade.aten_order_applies(7, "float", True)
    assert not cascade.aten_order_applies(512, "int", True)
