"""fp16/bf16 ops whose core-ATen decomposition rounds between steps that eager computes in fp32
(segmenter/from_torch.py Note [ops kept whole in low precision]): against eager within OpInfo's
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
