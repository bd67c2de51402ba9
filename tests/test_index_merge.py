"""Note [split indices merged] (runtime/codegen/source/index.py): a quotient and a remainder of one
index whose strides put them back together become one term; the merged expression equals the
split one under C's truncating division, for every index value tried (negative ones too); and a
kernel reading heads of an attention layout back as rows reads them as one run."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from runtime.codegen.source import index as ix


class CInt:
    """An int with C's truncating ``/`` and ``%`` (the generated kernels' arithmetic)."""

    def __init__(self, v: int) -> None:
        self.v = v

    @staticmethod
    def _of(x) -> int:
        return x.v if isinstance(x, CInt) else x

    def __add__(self, o): return CInt(self.v + self._of(o))
    __radd__ = __add__
    def __sub__(self, o): return CInt(self.v - self._of(o))
    def __rsub__(self, o): return CInt(self._of(o) - self.v)
    def __mul__(self, o): return CInt(self.v * self._of(o))
    __rmul__ = __mul__

    def __truediv__(self, o):
        a, b = self.v, self._of(o)
        q = abs(a) // abs(b)
        return CInt(q if (a >= 0) == (b > 0) else -q)

    def __mod__(self, o):
        a, b = self.v, self._of(o)
        return CInt(a - b * (self / b).v)


def _value(expr: str, L: int) -> int:
    return eval(expr.replace("L", "_L"), {"_L": CInt(L)}).v  # noqa: S307 - our own expressions


@pytest.mark.parametrize("seed", range(40))
def test_merged_terms_equal_the_split_ones(seed) -> None:
    rng = random.Random(seed)
    shape = tuple(rng.choice([2, 3, 4, 5, 8, 16]) for _ in range(rng.randint(2, 4)))
    contiguous = ix.contiguous_strides(shape)
    # strides that keep some neighbours together (where merging applies) and break others
    scale = [rng.choice([1, 1, 2, 3]) for _ in shape]
    stride = tuple(s * k for s, k in zip(contiguous, scale))
    terms = ix.unravel_terms("(L - 7)", shape)
    split = " + ".join(f"{t} * {s}" for t, n, s in zip(terms, shape, stride) if n != 1)
    merged = ix.linear(terms, shape, stride)
    for L in itertools.chain(range(-40, 3 * 7 * 256, 7), [rng.randrange(-10**6, 10**6) for _ in range(50)]):
        assert _value(merged, L) == _value(split, L), (shape, stride, merged, split, L)
    if scale == [1] * len(shape):
        assert merged == "((L - 7))", merged  # all together: one term


def test_only_whole_parenthesized_indices_merge() -> None:
    """A term that merely ends like a quotient (``((a) / 4 + (b) / 16)``) is not one."""
    terms = ["((a) / 4 + (b) / 16)", "((a) / 4 + (b) % 16)"]
    assert ix.linear(terms, (4, 16), (16, 1)) == "((a) / 4 + (b) / 16) * 16 + ((a) / 4 + (b) % 16)"


def test_heads_read_back_as_rows_are_one_run() -> None:
    """(2, 4, 32, 16) heads transposed and viewed as (2, 32, 64) rows, where the heads are
    contiguous in memory: the kernel reads ``in[... + i]``, no quotient or remainder; values
    and strides equal eager's at two shapes."""
    import runtime
    from alias import apply_aliases
    from runtime.codegen.build import cpu_compiler
    from segmenter import capture, segment

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler")

    def f(a, b):
        rows = torch.cat([a.transpose(1, 2).reshape(a.shape[0], a.shape[2], -1),
                          b.transpose(1, 2).reshape(b.shape[0], b.shape[2], -1)], -1)
        return rows, rows.sum((0, 1))

    for n, t in ((2, 32), (3, 8)):
        a = torch.randn(n, 4, t, 16).transpose(1, 2).contiguous().transpose(1, 2)  # heads together
        b = torch.randn(n, 4, t, 16)
        prog = runtime.compile(apply_aliases(segment(capture(f, [a, b])), "post"), backend="cpp")
        got, want = prog(a, b), f(a, b)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride()
        sources = [k.source("cpu") for k in prog.kernels.values()]
        assert sources and any("in0[" in s for s in sources)
        for s in sources:
            for line in s.splitlines():
                if "in0[" in line and "#" not in line:
                    assert "/ 16" not in line.split("in0[", 1)[1].split("]", 1)[0], line
