"""``torch._dynamo.mark_dynamic`` (issue 41): the dim a user marks is symbolic in the first graph
dynamo hands over, and one plan (Note [symbolic plans]) runs every size of it; the other dims stay
numbers in the plan (specialized kernels)."""

from __future__ import annotations

import torch

from runtime.dynamo import FusegCompiler, compile_with_aot
from segmenter.ir.symbolic import is_symbolic


def _layer(x, w):
    h = torch.nn.functional.layer_norm(x, (16,)) * 2
    return (h @ w).relu().sum(1)


def test_a_marked_dim_is_planned_once() -> None:
    torch._dynamo.reset()
    compiler = FusegCompiler()
    fn = torch.compile(_layer, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    w = torch.randn(16, 8)
    for n in (5, 9, 30):
        x = torch.randn(3, n, 16)
        torch._dynamo.mark_dynamic(x, 1)
        got = fn(x, w)
        torch.testing.assert_close(got, _layer(x, w), atol=1e-5, rtol=1e-5)
    assert compiler.symbolic_refused == [] and len(compiler.compiled) == 1
    graph = compiler.compiled[0].graph
    x_meta = next(i.meta for i in graph.inputs if i.meta.ndim == 3)
    assert [is_symbolic(n) for n in x_meta.shape] == [False, True, False]
