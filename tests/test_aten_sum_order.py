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


def test_only_known_rows_are_laid_out_whole() -> None:
    """The row laid out element by element (Note [sums in ATen's order]) is one of a known length
    from a vector to ROW_CHUNK reduced along the innermost dim; longer and symbolic ones stream
    (Note [sums in ATen's order, streamed])."""
    from runtime.codegen.lowering import cascade

    assert cascade.aten_order_applies(512, "float", True) and cascade.aten_order_applies(4096, "double", True)
    assert not cascade.aten_order_applies(512, "float", False)
    assert not cascade.aten_order_applies(4097, "float", True) and not cascade.aten_order_applies(7, "float", True)
    assert not cascade.aten_order_applies(512, "int", True)


# Note [sums in ATen's order, streamed] (cascade.py): rows longer than ROW_CHUNK, rows of a symbolic length and
# column passes add in ATen's order as well. Normal values (sums that cancel: where an order's
# error shows). Eager's order is a row's own where one of its threads takes the row whole: more
# than one row (two rows and more are shared among threads by rows, a single one is cut between
# them), and, for columns, a multiple of 32 of them (ATen's column vectors of four; the others it
# sums another way).
LONG = (4097, 8192, 100003, (1 << 20) + 3)


def _normal(shape: tuple, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _sums(t: torch.Tensor) -> tuple:
    return t.sum(-1), t.mean(-1), (t * t).sum(-1)


def _column_sums(t: torch.Tensor) -> tuple:
    return t.sum(0), t.mean(0), (t * 3).sum(0)


def _assert_bits(got: tuple, want: tuple, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), (what, i, int((g != w).sum()), float((g.double() - w.double()).abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_long_rows_are_eagers_bits(dtype) -> None:
    for n in LONG:
        x = _normal((3, n), dtype, n)
        prog = compiled_post(_sums, [x], backend="cpp")
        _kernel_only(prog)
        _assert_bits(prog(x), _sums(x), f"3 x {n}")
        y = _normal((3, n), dtype, n + 1)  # a second input, the same kernel
        _assert_bits(prog(y), _sums(y), f"3 x {n}, second input")


def _symbolic(fn):  # noqa: ANN001, ANN202
    from runtime.dynamo import FusegCompiler, compile_with_aot

    compiler = FusegCompiler()
    return compiler, torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)


def _symbolic_kernels_only(compiler) -> None:  # noqa: ANN001
    assert compiler.compiled
    for program in compiler.compiled:
        assert program.kernels and all(program.backend_of[i] == "cpp" for i in program.kernels), program.passed_over


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_rows_of_a_symbolic_length_are_eagers_bits(dtype) -> None:
    """One plan for every length (its kernel built once): short rows, rows around a cascade step,
    and long ones."""
    torch._dynamo.reset()
    compiler, compiled = _symbolic(_sums)
    for n in (9, 100, 513, 4097, 100003, (1 << 20) + 3):
        x = _normal((3, n), dtype, n)
        _assert_bits(compiled(x), _sums(x), f"3 x {n}")
    _symbolic_kernels_only(compiler)
    assert len(compiler.compiled) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_column_sums_are_eagers_bits(dtype) -> None:
    """Columns reduced over 16 to 4099 rows (a cascade step and past it), at fixed sizes and
    through one symbolic plan."""
    torch._dynamo.reset()
    compiler, compiled = _symbolic(_column_sums)
    for r in (16, 50, 257, 4099):
        x = _normal((r, 64), dtype, r)
        prog = compiled_post(_column_sums, [x], backend="cpp")
        _kernel_only(prog)
        _assert_bits(prog(x), _column_sums(x), f"{r} x 64")
        _assert_bits(compiled(x), _column_sums(x), f"{r} x 64, symbolic")
    _symbolic_kernels_only(compiler)


def test_streamed_sums_are_laid_out_with_no_branch() -> None:
    """The cascade's levels are chosen without an ``if`` (Note [no if-conversion of branches])."""
    for fn, shape in ((_sums, (3, 100003)), (_column_sums, (257, 64))):
        x = _normal(shape, torch.float32, 0)
        prog = compiled_post(fn, [x], backend="cpp")
        for kernel in prog.kernels.values():
            assert not branches_with_loads(kernel.body), fn


# Note [a long row's sum shared among threads] (cascade.py): a sum into one value is cut between
# the pool's threads from 32768 elements on, as eager cuts it, so its bits are eager's at every
# thread count (one thread: the whole row in one cascade).
def _whole_sums(t: torch.Tensor) -> tuple:
    return t.sum(), t.mean(), (t * t).sum()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sums_into_one_value_are_eagers_bits(threads) -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch._dynamo.reset()
        compiler, compiled = _symbolic(_whole_sums)
        for n in (5, 100, 32767, 32768, 100003, (1 << 20) + 3):  # under the grain, at it, past it
            x = _normal((n,), torch.float32, n)
            prog = compiled_post(_whole_sums, [x], backend="cpp")
            _kernel_only(prog)
            _assert_bits(prog(x), _whole_sums(x), f"{n} on {threads} threads")
            _assert_bits(compiled(x), _whole_sums(x), f"{n} on {threads} threads, symbolic")
        _symbolic_kernels_only(compiler)
        x = _normal((300, 1001), torch.float64, 1)  # two dims into one value
        prog = compiled_post(_whole_sums, [x], backend="cpp")
        _kernel_only(prog)
        _assert_bits(prog(x), _whole_sums(x), f"300 x 1001 on {threads} threads")
    finally:
        torch.set_num_threads(saved)
