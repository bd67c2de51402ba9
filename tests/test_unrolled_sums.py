"""Note [few-term sums unrolled] (runtime/codegen/lowering/lower.py): a segment whose row plan declines and
whose reductions are float sums/means of at most UNROLLED_TERMS elements per output runs as a
pointwise kernel, each reduced value written out term by term; anything else keeps its reason.
"""

from __future__ import annotations

import pytest
import torch

from runtime.codegen.lowering.lower import UNROLLED_TERMS
from segmenter import SegmentKind
from tests.util import assert_matches_eager, compiled_post


def _moe_combine(y, r):
    """Mixtral's top-2 combine: expert outputs per (token, choice) summed over the choices, viewed
    back to [batch, seq, hidden], added to the residual and squared for the next RMS norm."""
    s = y.view(64, 2, 64).sum(1).view(2, 32, 64) + r
    return s, s.pow(2)


def _mean_then_view(x):
    return x.mean(1, keepdim=True).reshape(4, 2, 8) * 2.0


def _two_dims(x):
    return x.sum((0, 2)).view(2, 3) - 1.0


def _bf16(y, r):
    return y.view(16, 2, 8).sum(1).view(4, 4, 8) + r


def _rows_with_transposed(x):  # tests/test_codegen.py's cross-row case with rows of 4: each mean
    m = x.mean(-1, keepdim=True)  # is computed where it is read, so row i's beside row j's is right
    return (x * 2 - m).transpose(0, 1) + m


def _one_too_many(x):  # UNROLLED_TERMS + 1 elements a position: not unrolled
    return x.view(4, UNROLLED_TERMS + 1, 8).sum(1).view(2, 2, 8) + 1.0


def _integer(x):
    return x.view(4, 2, 8).sum(1).view(2, 2, 8) + 1


# name -> (fn, inputs, unrolled: whether the reduction segment is expected as a generated kernel)
CASES = {
    "moe top-2 combine": (_moe_combine, lambda: [torch.randn(128, 64), torch.randn(2, 32, 64)], True),
    "mean keepdim, reshaped": (_mean_then_view, lambda: [torch.randn(8, 3, 8)], True),
    "sum over two dims of 2": (_two_dims, lambda: [torch.randn(2, 6, 2)], True),
    "bfloat16 pair sum": (_bf16, lambda: [torch.randn(32, 8, dtype=torch.bfloat16),
                                          torch.randn(4, 4, 8, dtype=torch.bfloat16)], True),
    "a mean read beside another row's values": (_rows_with_transposed, lambda: [torch.randn(4, 4)], True),
    "one term too many": (_one_too_many, lambda: [torch.randn(4 * (UNROLLED_TERMS + 1), 8)], False),
    "integer sum": (_integer, lambda: [torch.randint(-5, 5, (8, 8))], False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_few_term_sums(name):
    fn, make, unrolled = CASES[name]
    inputs = make()
    prog = compiled_post(fn, inputs, backend="cpp")
    reductions = [s.index for s in prog.plan.segments if s.kind in (SegmentKind.REDUCTION, SegmentKind.NORMALIZATION)]
    assert reductions, "no reduction segment: the case tests nothing"
    for i in reductions:
        if unrolled:
            assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
            assert prog.kernels[i].kind == "pointwise"
        else:
            assert prog.backend_of[i] != "cpp"
            assert "re-indexed" in str(prog.passed_over[i]), prog.passed_over[i]
    tol = 1e-2 if inputs[0].dtype == torch.bfloat16 else 1e-6
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)


def test_row_kernels_keep_the_sums_they_take():
    """A few-term sum the row plan takes (nothing re-indexes it) stays a row kernel."""
    x = torch.randn(8, 2)
    prog = compiled_post(lambda x: x.sum(-1) * 2.0, [x], backend="cpp")
    kinds = [prog.kernels[s.index].kind for s in prog.plan.segments if s.kind == SegmentKind.REDUCTION]
    assert kinds == ["row"]
