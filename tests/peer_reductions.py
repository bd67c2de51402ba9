"""Programs of the kinds PyTorch's own test/test_reductions.py runs, in our words, for the peer
suite (Note [the peer suite] in tests/peer_suite.py). Read there (torch 2.13's file): which
programs and which inputs: reductions along a non-contiguous innermost or outermost dim, over every
dim of a strided slice, of a transposed or an expanded tensor; dim lists (sorted, unsorted,
negative), keepdim, dim=None; ``dtype=`` (integers summed in uint8 with wrap-around, int means in
float); sums of 0s and 1s over many small dims and over 2^20 elements (exact in any order); the
identity (zeros between the values); NaN and inf (propagated; omitted by nansum/nanmean; max
with inf; logsumexp of -inf rows); empty tensors (a reduction over an empty slice, and a
non-empty slice of an empty tensor); float16/bfloat16; integer inputs (upcast to int64, prod,
cumsum, all/any of uint8); var's stability ([2281.5, 2281.25]); var_mean/std_mean over every
combination of dims; ``out=`` (the result aliases ``out``, a column view of another tensor).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

import torch

from .opdb_sweep import Case

inf, nan = float("inf"), float("nan")


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, low: float = -1.0,
         high: float = 1.0) -> torch.Tensor:
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=_g(seed)) * (high - low) + low).to(dtype)
    return torch.randint(int(low), int(high) + 1, shape, generator=_g(seed)).to(dtype)


def spiky(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    """Values times 30..100 with a fifth zeroed, then NaN, inf and -inf sprinkled (the extremal
    inputs of test_reductions' generator)."""
    g = _g(seed)
    x = torch.randn(shape, generator=g) * 57
    x[torch.rand(shape, generator=g) > 0.8] = 0
    x[torch.rand(shape, generator=g) > 0.9] = nan
    x[torch.rand(shape, generator=g) > 0.9] = inf
    x[torch.rand(shape, generator=g) > 0.9] = -inf
    return x.to(dtype)


def noncontiguous(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a tensor whose every dim is strided (a slice of a larger one)."""
    big = torch.zeros(*x.shape, 2, 2, dtype=x.dtype)[..., 0].select(-1, -1)
    big.copy_(x)
    return big


# name -> (function, inputs for a dtype, dtypes). Inputs are made per dtype, so each floating dtype
# the table names runs the program on its own values.
Maker = Callable[[torch.dtype], list[torch.Tensor]]
PROGRAMS: dict[str, tuple[Callable[..., object], Maker, tuple[torch.dtype, ...]]] = {}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
F32 = (torch.float32,)


def program(name: str, make: Maker, dtypes: Sequence[torch.dtype] = FLOATS):
    def add(fn: Callable[..., object]) -> Callable[..., object]:
        PROGRAMS[name] = (fn, make, tuple(dtypes))
        return fn

    return add


def _one(*shape: int, **kw) -> Maker:
    return lambda dt: [rand(*shape, dtype=dt, **kw)]


# --- non-contiguous inputs (each against the contiguous program's result in test_reductions)
REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin, "prod": torch.prod,
    "var": torch.var, "std": torch.std, "nansum": torch.nansum, "logsumexp": torch.logsumexp,
    "vector_norm": torch.linalg.vector_norm,
}


def _reduce(op: Callable[..., torch.Tensor], x: torch.Tensor, dim=None) -> torch.Tensor:  # noqa: ANN001
    if dim is None:
        return op(x) if op is not torch.logsumexp else op(x, tuple(range(x.dim())))
    return op(x, dim=dim)


for _name, _op in REDUCTIONS.items():
    program(f"{_name}/innermost-strided", _one(10, 10))(lambda x, _op=_op: _reduce(_op, x[:, ::2], 1))
    program(f"{_name}/outermost-strided", _one(10, 10), F32)(lambda x, _op=_op: _reduce(_op, x[::2, :], 0))
    program(f"{_name}/all-of-a-slice", _one(5, 5, 5), F32)(lambda x, _op=_op: _reduce(_op, x[::2, ::3, 1:-1:2]))
    program(f"{_name}/transposed", _one(5, 5), F32)(lambda x, _op=_op: _reduce(_op, x.T))
    program(f"{_name}/expanded", _one(2, 3), F32)(lambda x, _op=_op: _reduce(_op, x.unsqueeze(1).expand(-1, 5, -1)))
    program(f"{_name}/strided-input", lambda dt: [noncontiguous(rand(3, 5, 7, dtype=dt, low=-2, high=2))])(
        lambda x, _op=_op: (_reduce(_op, x, 0), _reduce(_op, x, 2)))


# --- dims, keepdim, dim=None
@program("sum/dim-lists", _one(4, 3, 5, 2))
def _(x):
    return x.sum((0, 2)), x.sum((3, 0, 2)), x.sum((1, -1), keepdim=True), x.sum(dim=None), x.sum(())


@program("mean/dim-lists-keepdim", _one(4, 3, 5, 2))
def _(x):
    return x.mean((3, 0, 2), keepdim=True), x.mean(-1), x.mean(dim=None, keepdim=True)


@program("amax-amin/dims", _one(4, 3, 5), F32)
def _(x):
    return x.amax((0, 2)), x.amin(-1, keepdim=True), x.amax(()), x.amin((2, 0))


@program("vector_norm/dims-and-orders", _one(4, 3, 5), F32)
def _(x):
    v = torch.linalg.vector_norm
    return v(x, 2, (0, 2)), v(x, 1, -1, keepdim=True), v(x, inf), v(x, -inf, 0), v(x, 0), v(x, 3.5, (1, 2))


@program("norm/lastdim-of-a-slice", lambda dt: [rand(3, 5, 40, dtype=dt)], (torch.float32, torch.bfloat16))
def _(x):
    y = x[:, :, 0:40:2]
    return torch.norm(y, dim=-1), torch.argmax(y, dim=-1), torch.argmin(y, dim=-1)


@program("logsumexp/dims", _one(3, 4, 5))
def _(x):
    return x.logsumexp(1), x.logsumexp((0, 1, 2)), torch.logsumexp(x, (0, 2), keepdim=True)


# var_mean and std_mean over every combination of two and more dims, both corrections, keepdim
@program("var_mean/dim-combinations", _one(4, 6, 7, 5, 3), F32)
def _(x):
    out = []
    for r in (2, 3, 4):
        for dims in combinations(range(5), r):
            out.extend(torch.var_mean(x, dim=dims, unbiased=r % 2 == 0, keepdim=r == 3))
    return out


@program("std_mean/corrections", _one(6, 7, 5))
def _(x):
    return (*torch.std_mean(x, 1, correction=0), *torch.std_mean(x, (0, 2), correction=2, keepdim=True),
            *torch.var_mean(x, correction=1))


@program("var/stability", lambda dt: [torch.tensor([2281.5, 2281.25], dtype=dt)], (torch.float32,))
def _(x):
    return x.var(dim=0), x.var(), x.std(unbiased=False)


@program("var-std/unbiased-or-not", _one(100))
def _(x):
    return x.var(0), x.var(unbiased=False), x.std(0, unbiased=True), x.std(unbiased=False)


# --- dtype=, integer inputs
@program("sum/uint8-wraps", lambda dt: [torch.tensor([[255, 2, 1], [5, 3, 6]], dtype=torch.uint8)], F32)
def _(x):
    return x.sum(dtype=torch.uint8), x.sum(0, dtype=torch.uint8), x.sum(1, dtype=torch.uint8)


INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@program("sum-prod-cumsum/integer-upcast", lambda dt: [rand(3, 4, 5, dtype=dt, low=0, high=3)], INTS)
def _(x):
    return x.sum(), x.sum(0), x.prod(1), x.cumsum(0), x.cumprod(2), x.sum(dtype=torch.int32), x.sum(1, dtype=torch.float32)


@program("mean/int-with-dtype", lambda dt: [rand(3, 4, 5, dtype=dt, low=-9, high=9)], (torch.int64, torch.int32))
def _(x):
    return x.mean(dtype=torch.float32), x.mean((0, 2), dtype=torch.float64)


@program("sum/float-to-double", _one(6, 7))
def _(x):
    return x.sum(dtype=torch.float64), x.sum(1, dtype=torch.float32), x.mean(0, dtype=torch.float32)


@program("all-any/uint8-and-bool", lambda dt: [rand(73, 11, 3, dtype=torch.uint8, low=0, high=4)], F32)
def _(x):
    b = x.bool()
    return x.all(), x.any(), x.all(0), x.any(1, keepdim=True), b.all(2), b.any(), (x.prod(0) != 0), x.count_nonzero(1)


# --- large sums of 0s and 1s (exact in any order), and parallel reductions
@program("sum/zeros-and-ones-many-dims", lambda dt: [rand(2, 3, 3, 3, 3, 2, 2, 3, 2, dtype=dt, low=0, high=1).round()])
def _(x):
    return x.sum(), x.sum(0), x.sum(4), x.sum(8)


@program("sum/zeros-and-ones-2^20", lambda dt: [rand(1, 1 << 20, dtype=dt, low=0, high=1).round()], (torch.float32,))
def _(x):
    return x.sum(), x.sum(1), x.sum(0)


@program("sum-mean-var/5x400000-rows", lambda dt: [rand(5, 400000, dtype=dt, low=-100, high=100)], F32)
def _(x):
    return x.sum(1), x.mean(1), x.var(1), x.std(1, unbiased=False), x.logsumexp(1)


@program("sum-mean-var/100000", lambda dt: [rand(100000, dtype=dt, low=-100, high=100)], F32)
def _(x):
    return x.sum(-1), x.mean(-1), x.var(-1), x.std(-1)


@program("sum-mean/50^3-dims", lambda dt: [rand(50, 50, 50, dtype=dt, low=-100, high=100)], (torch.float32, torch.float16))
def _(x):
    return x.sum(0), x.mean(1), x.sum(2), x.mean((1, 2)), x.sum((1, -1)), x.mean((0, 2)), x.sum((0, 2, 1))


@program("var-std/50^3-dims", lambda dt: [rand(50, 50, 50, dtype=dt, low=-100, high=100)], F32)
def _(x):
    return x.var(0), x.std(1, unbiased=False), x.var((1, 2)), x.std((0, 2, 1))


# --- the identity, NaN and inf
@program("identity/zeros-between", lambda dt: [rand(10, dtype=dt, low=1, high=2)])
def _(x):
    y = x.clone()
    y[1::2] = 0
    return y[::2].sum(), y.sum(), y[::2].nansum(), y.count_nonzero()


@program("nan-inf/propagated", lambda dt: [spiky(8, 9, dtype=dt)])
def _(x):
    return x.sum(1), x.mean(0), x.amax(1), x.amin(0), x.prod(1), x.var(1), x.logsumexp(1), x.cumsum(1)


@program("nan-inf/omitted", lambda dt: [spiky(8, 9, dtype=dt, seed=1)])
def _(x):
    return x.nansum(1), x.nanmean(0), x.nansum(), torch.nan_to_num(x).sum()


@program("nan/one-in-five", lambda dt: [torch.tensor([1.0, 2.0, nan, 4.0, 5.0], dtype=dt)])
def _(x):
    return x.sum(), x.mean(), x.amax(), x.var(), x.nansum(), x.nanmean(), x.softmax(0)


@program("max/with-inf", lambda dt: [torch.tensor([[-inf, -inf, inf, 3], [inf, inf, -inf, -1]], dtype=dt)])
def _(x):
    return torch.max(x, dim=1).values, torch.amax(x, dim=1), torch.max(x), torch.amax(x), x.amin(0)


@program("logsumexp/-inf-rows", _one(5, 4))
def _(x):
    y = x.clone()
    y[1, :] = -inf
    y[3, 2] = inf
    return y.logsumexp(1), torch.full((2, 3), -inf, dtype=x.dtype).logsumexp((0, 1)) + x.sum()


@program("softmax/-inf-masked-rows", _one(4, 6))
def _(x):
    y = x.masked_fill(torch.arange(6) > 2, -inf)
    return y.softmax(-1), y.log_softmax(-1)


# --- empty tensors
@program("empty/reduce-an-empty-slice", lambda dt: [rand(0, 2, 3, dtype=dt)], F32)
def _(x):
    return x.sum(0), x.sum((0, 2)), x.prod(0), x.mean(0), x.nansum(0), x.logsumexp(0), x.count_nonzero(0)


@program("empty/a-slice-of-an-empty-tensor", lambda dt: [rand(0, 2, 3, dtype=dt)], F32)
def _(x):
    return x.sum(1), x.amax((1, 2)), x.mean(1), x.var(2), x.amin(1), x.softmax(1), x.cumsum(2)


@program("empty/whole", lambda dt: [rand(0, dtype=dt)], F32)
def _(x):
    return x.sum(), x.prod(), x.mean(), x.logsumexp(0), x.all(), x.any()


# --- scans, argmax, mode
@program("cumsum-cumprod/dims", _one(4, 5, 6))
def _(x):
    return x.cumsum(0), x.cumsum(-1), x[:, ::2].cumprod(1), torch.logcumsumexp(x, 2), x.cumsum(1, dtype=torch.float64)


@program("cummax-cummin", _one(5, 7), F32)
def _(x):
    return (*torch.cummax(x, 1), *torch.cummin(x, 0))


@program("argmax-argmin/duplicates", lambda dt: [rand(4, 4, dtype=dt, low=-2, high=2).round()])
def _(x):
    return x.argmax(), x.argmin(0), x.argmax(1, keepdim=True), torch.max(x, 0).indices


@program("mode/rows", lambda dt: [torch.arange(1, 101, dtype=dt).reshape(10, 10).clamp(max=40)], F32)
def _(x):
    return (*torch.mode(x, 0), *torch.mode(x.T.contiguous(), 1))


@program("aminmax/dims", _one(5, 6))
def _(x):
    return (*torch.aminmax(x), *torch.aminmax(x, dim=1, keepdim=True))


# --- out= (the result is ``out``; a column view of another tensor written through)
@program("mean/out-is-the-result", lambda dt: [rand(3, 1, 4, dtype=dt), torch.empty(1, 1, 4, dtype=dt)], F32)
def _(x, out):
    r = torch.mean(x, dim=0, keepdim=True, out=out)
    return r, out


@program("logsumexp/out-a-column", lambda dt: [rand(5, 4, dtype=dt), torch.zeros(5, 2, dtype=dt)], F32)
def _(x, b):
    c = b[:, 0]
    torch.logsumexp(x, 1, out=c)
    return b.sum(1)


@program("sum/out-int", lambda dt: [rand(2, 3, dtype=torch.uint8, low=0, high=200), torch.zeros(3, dtype=torch.uint8)], F32)
def _(x, y):
    torch.sum(x, 0, out=y)
    return y


def cases(dtypes: Sequence[torch.dtype] | None = None, names: Sequence[str] | None = None) -> list[Case]:
    """One case per program and dtype (``dtypes``: those of the table that are also in it)."""
    out = []
    for name, (fn, make, table_dtypes) in PROGRAMS.items():
        if names is not None and name not in names:
            continue
        for dt in table_dtypes:
            if dtypes is not None and dt not in dtypes and not (dt in INTS and torch.int64 in dtypes):
                continue
            out.append(Case(name, dt, make(dt), fn))
    return out
