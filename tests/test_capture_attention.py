"""SDPA captured at ATen level (Note [attention kept whole] in segmenter/capturing/from_torch.py): a table of
attention programs, each captured, segmented in every alias mode, compiled for the torch and the
generated C++ backends and checked against eager (values, strides, aliasing); the attention output
is read by a pointwise op too, whose layout follows it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from segmenter import capture, segment

from .util import assert_matches_eager


def _qkv(n: int, h: int, lq: int, lk: int, e: int, dtype: torch.dtype = torch.float32,
         hk: int | None = None) -> list[torch.Tensor]:
    hk = h if hk is None else hk
    return [torch.randn(n, h, lq, e, dtype=dtype), torch.randn(n, hk, lk, e, dtype=dtype),
            torch.randn(n, hk, lk, e, dtype=dtype)]


def _plain(q, k, v):
    o = F.scaled_dot_product_attention(q, k, v)
    return o, o.sin()


def _causal(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2,)


def _scaled(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, scale=0.3) + 1,)


def _masked(q, k, v, m):
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=m).tanh(),)


def _bool_masked(q, k, v, m):
    return (F.scaled_dot_product_attention(q, k, v, attn_mask=m) - 1,)


def _gqa(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v, enable_gqa=True).exp(),)


def _heads_last(q, k, v):
    # the layout transformers use: [N, L, H, E] transposed to [N, H, L, E], then back
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return (o.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1),)


def _three_d(q, k, v):
    return (F.scaled_dot_product_attention(q, k, v).cos(),)


def _cases() -> dict[str, tuple]:
    qkv = _qkv(2, 3, 5, 5, 8)
    return {
        "plain 2x3x5x8": (_plain, qkv),
        "plain, head dim 1": (_plain, _qkv(1, 2, 2, 2, 1)),
        "plain, one query": (_plain, _qkv(2, 2, 1, 7, 4)),
        "causal": (_causal, _qkv(2, 2, 6, 6, 4)),
        "causal, more keys": (_causal, _qkv(1, 2, 3, 6, 4)),
        "scale": (_scaled, qkv),
        "float mask": (_masked, [*qkv, torch.randn(5, 5)]),
        "bool mask": (_bool_masked, [*qkv, torch.rand(2, 1, 5, 5) > 0.3]),
        "grouped query": (_gqa, _qkv(1, 4, 5, 5, 8, hk=2)),
        "heads last": (_heads_last, [torch.randn(2, 5, 3, 8) for _ in range(3)]),
        "3-d": (_three_d, [torch.randn(3, 5, 8) for _ in range(3)]),
        "float64": (_plain, _qkv(2, 2, 4, 4, 8, dtype=torch.float64)),
    }


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("name", sorted(_cases()))
def test_attention_programs_match_eager(name: str, backend: str) -> None:
    fn, inputs = _cases()[name]
    graph = capture(fn, [t.clone() for t in inputs])
    ops = {n.op for n in graph.nodes}
    if inputs[0].dim() == 4:
        # kept whole: the op torch picks on the CPU for 4-d inputs, not its decomposition into
        # matmuls (3-d inputs take SDPA's math path, plain ATen ops in eager too)
        assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops, sorted(ops)
        assert "aten.bmm.default" not in ops, sorted(ops)
    sf = segment(graph)
    for mode in ("post", "pre", "off"):
        program = runtime.compile(apply_aliases(sf, mode), backend=backend)
        assert_matches_eager(fn, inputs, graph, program=program, atol=1e-5, rtol=1e-5)
