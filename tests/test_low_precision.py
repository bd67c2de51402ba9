"""fp16/bf16 ops whose core-ATen decomposition rounds between steps that eager computes in fp32
(segmenter/capturing/from_torch.py Note [ops kept whole in low precision]): against eager within OpInfo's
tolerances, on both backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from segmenter import capture, segment

from .util import assert_matches_eager

TOL = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}  # assert_close's, as OpInfo uses


def _r(*shape, dtype):
    return torch.randn(*shape, dtype=dtype)


TABLE = [
    ("logit", lambda x: torch.logit(x, 1e-3), lambda d: [torch.rand(64, dtype=d)]),
    ("addr", lambda a, x, y: torch.addr(a, x, y, beta=0.5, alpha=2.0),
     lambda d: [_r(8, 9, dtype=d), _r(8, dtype=d), _r(9, dtype=d)]),
    ("cross", lambda x, y: torch.linalg.cross(x, y), lambda d: [_r(5, 3, dtype=d), _r(5, 3, dtype=d)]),
    ("interpolate-linear", lambda x: F.interpolate(x, scale_factor=1.7, mode="linear"), lambda d: [_r(1, 2, 5, dtype=d)]),
    ("interpolate-bicubic", lambda x: F.interpolate(x, scale_factor=1.7, mode="bicubic"),
     lambda d: [_r(1, 2, 5, 6, dtype=d)]),
    ("interpolate-trilinear", lambda x: F.interpolate(x, scale_factor=1.7, mode="trilinear"),
     lambda d: [_r(1, 2, 3, 4, 5, dtype=d)]),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,fn,make_inputs", TABLE, ids=[t[0] for t in TABLE])
def test_low_precision_ops_match_eager(name, fn, make_inputs, dtype) -> None:
    torch.manual_seed(0)
    inputs = make_inputs(dtype)
    graph = capture(fn, inputs)
    plan = apply_aliases(segment(graph), "post")
    rtol, atol = TOL[dtype]
    for backend in ("torch", "cpp"):
        assert_matches_eager(fn, inputs, graph, program=runtime.compile(plan, backend=backend), atol=atol, rtol=rtol)


def test_float32_still_decomposes_and_fuses() -> None:
    graph = capture(lambda x: torch.logit(x, 1e-3), [torch.rand(64)])
    assert "aten.logit.default" not in {n.op for n in graph.nodes}


def test_half_exact_recognizes_whole_conversions_only() -> None:
    from runtime.codegen.kernel import half_exact

    assert half_exact("fuseg_bf2f(in0[i * 2 + (j)])") == torch.bfloat16
    assert half_exact("fuseg_h2f(fuseg_f2h((t1 * t2)))") == torch.float16
    assert half_exact("fuseg_bf2f(a) + fuseg_bf2f(b)") is None  # a sum of two halves is not one
    assert half_exact("fuseg_bf2f(a) * (float)2") is None
    assert half_exact("(fuseg_bf2f(a))") is None
    assert half_exact("t3") is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 6, 40), (1, 5, 24)])
def test_rope_rounds_only_what_eager_rounds(dtype, shape) -> None:
    """See Note [values already rounded]: a RoPE block's slices, cat and copies of half values make
    no conversion round trip of a value that is already a half (a load, or a view of one), and
    the kernel still matches eager, bit for bit, at two shapes."""
    import re

    from perf import zoo

    B, T, C = shape
    head = C // 4  # 2 heads, 1 group: q, k, v of one head each
    fn, args = zoo._rope(B, T, 2, 1, head, head, dtype)()
    prog = runtime.compile(apply_aliases(segment(capture(fn, args)), "post"), backend="auto")
    conv = "fuseg_bf2f(fuseg_f2bf(" if dtype == torch.bfloat16 else "fuseg_h2f(fuseg_f2h("
    loads = {m.group(1) for m in re.finditer(r"const float (t\d+) = fuseg_(?:bf2f|h2f)\(in\d+\[", "".join(
        k.body for k in prog.kernels.values()))}
    assert prog.kernels and loads
    body = "".join(k.body for k in prog.kernels.values())
    for t in loads:
        assert f"{conv}{t}))" not in body, t
    got, want = prog(*args), fn(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0, rtol=0)
