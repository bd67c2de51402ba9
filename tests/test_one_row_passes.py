"""A kernel of one row shares its order-free passes and its write among threads (Note [one row's
passes shared among threads] in runtime/codegen/lowering/rows.py): any, all, max and min into one
value, and the elements it writes, equal eager's at one, two and three threads, at two sizes."""

from __future__ import annotations

import pytest
import torch

from runtime import autotune
from tests.util import compiled_post


def _t5_check(h, y):  # T5's check of an fp16 sum (written out) for an inf
    x = h + y
    return x, x.isinf().any()


def _extremes(x):  # a max and a min (NaN rule) and an all, into one value each
    return x.amax(), x.amin(), (x > -3).all(), x * 2.0


def _inputs(n: int, dtype: torch.dtype, with_nan: bool) -> list[torch.Tensor]:
    torch.manual_seed(n)
    a = torch.randn(n, 512).to(dtype)
    if with_nan:
        a.view(-1)[n * 300] = float("nan")
    return [a]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_one_rows_passes_shared_among_threads_keep_eagers_values(threads) -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (128, 257):  # (2^16 and 131584 elements: past the loop threshold)
            h = torch.randn(rows, 512, dtype=torch.float16)
            y = torch.randn(rows, 512, dtype=torch.float16)
            y.view(-1)[rows * 200] = 60000.0  # one sum past fp16's range: an inf
            h.view(-1)[rows * 200] = 60000.0
            with autotune.fixed("kernel"):
                prog = compiled_post(_t5_check, [h, y], backend="cpp")
            cpu = "".join(k.function("cpu") for k in prog.kernels.values())
            assert "#pragma omp parallel for simd reduction(|:" in cpu, cpu
            for got, want in zip(prog(h, y), _t5_check(h, y)):
                assert torch.equal(got, want)
            assert bool(_t5_check(h, y)[1])
            for dtype in (torch.float32, torch.float16):
                for with_nan in (False, True):
                    (x,) = _inputs(rows, dtype, with_nan)
                    with autotune.fixed("kernel"):
                        prog = compiled_post(_extremes, [x], backend="cpp")
                    assert prog.kernels
                    for got, want in zip(prog(x), _extremes(x)):
                        assert got.dtype == want.dtype and got.shape == want.shape
                        assert torch.equal(got.isnan(), want.isnan())
                        assert torch.equal(got[~want.isnan()], want[~want.isnan()]), (rows, dtype, with_nan)
    finally:
        torch.set_num_threads(saved)


def test_one_rows_passes_at_two_to_the_25() -> None:
    """The shared passes at the size a real reduction reaches: 2^25 floats into one max, min and
    all (and the doubled values written), with and without a NaN, at two threads and one."""
    saved = torch.get_num_threads()
    torch.manual_seed(0)
    x = torch.randn(1 << 25)
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            for with_nan in (False, True):
                if with_nan:
                    x[(1 << 24) + 12345] = float("nan")
                with autotune.fixed("kernel"):
                    prog = compiled_post(_extremes, [x], backend="cpp")
                assert prog.kernels
                for got, want in zip(prog(x), _extremes(x)):
                    assert torch.equal(got.isnan(), want.isnan())
                    assert torch.equal(got[~want.isnan()], want[~want.isnan()]), (threads, with_nan)
    finally:
        torch.set_num_threads(saved)
