"""CUDA's memory-efficient attention in a training graph of symbolic sizes, on the CPU.

On the H100 (2026-11-27) qwen2's training on varying sequence lengths under
``torch.compile(backend="fuseg")`` matched eager but got no symbolic plan: AOTAutograd's graphs
there call ``_scaled_dot_product_efficient_attention``, whose logsumexp (saved for the backward)
has ``ceil(L / 32) * 32`` columns, a size fuseg refused ('a float size CeilToInt(IntTrueDiv(s,
32))'), so every length was planned and compiled again. The op has no CPU kernel; this module
gives it and its backward one (the math, in float64) for its tests only, so the graph's shape, the
padded logsumexp going from the forward to the backward, runs here. Note [rounded divisions] in
segmenter/ir/symbolic.py. CUDA's flash attention (half-precision training) gets the same treatment:
its forward returns the sequence lengths as SymInts and its random-number state as tensors on
the meta device, and its backward takes them."""

from __future__ import annotations

import copy
import math

import pytest
import torch

aten = torch.ops.aten


def _reference(q, k, v, is_causal, scale):
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q.double() @ k.double().transpose(-1, -2)) * s
    if is_causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
    return scores


def _forward(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    assert attn_bias is None and dropout_p == 0.0, "the test kernel has no bias and no dropout"
    scores = _reference(q, k, v, is_causal, scale)
    lse = scores.logsumexp(-1)
    out = (scores - lse[..., None]).exp() @ v.double()
    b, h, n, e = q.shape
    res = torch.empty(b, n, h, v.shape[-1], dtype=q.dtype).transpose(1, 2)  # the meta function's layout
    res.copy_(out)
    width = math.ceil(n / 32) * 32 if compute_log_sumexp else 0
    padded = torch.zeros(b, h, width, dtype=torch.float32)
    if compute_log_sumexp:
        padded[..., :n] = lse.float()
    return res, padded, torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)


def _backward(grad_out, q, k, v, attn_bias, out, logsumexp, seed, offset, dropout_p, grad_input_mask,
              is_causal=False, *, scale=None):
    """Attention's backward as the kernel computes it, from the saved output and logsumexp."""
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    n = q.shape[2]
    probs = (_reference(q, k, v, is_causal, scale) - logsumexp[..., :n, None].double()).exp()
    do, qd, kd, vd = grad_out.double(), q.double(), k.double(), v.double()
    ds = probs * (do @ vd.transpose(-1, -2) - (do * out.double()).sum(-1, keepdim=True))

    def like(g, t):
        return torch.empty_permuted(t.shape, (0, 2, 1, 3), dtype=t.dtype).copy_(g)

    return like(ds @ kd * s, q), like(ds.transpose(-1, -2) @ qd * s, k), like(probs.transpose(-1, -2) @ do, v), None


def _flash_forward(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    assert dropout_p == 0.0 and not return_debug_mask, "the test kernel has no dropout and no debug mask"
    scores = _reference(q, k, v, is_causal, scale)
    lse = scores.logsumexp(-1)
    out = torch.empty_like(q).copy_((scores - lse[..., None]).exp() @ v.double())
    return (out, lse.float(), None, None, q.shape[2], k.shape[2], torch.zeros(2, dtype=torch.uint64),
            torch.zeros((), dtype=torch.uint64), torch.empty(0, dtype=q.dtype))


def _flash_backward(grad_out, q, k, v, out, logsumexp, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed,
                    offset, *, scale=None):
    assert (max_q, max_k) == (q.shape[2], k.shape[2]), "the lengths the forward returned"
    dq, dk, dv, _ = _backward(grad_out, q, k, v, None, out, logsumexp, seed, offset, dropout_p, [True] * 4,
                              is_causal, scale=scale)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


def _cpu_kernels(op: str, forward, backward):
    """CPU kernels for ``op`` and its backward while a test of this module runs."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(op, forward, "CPU")
    lib.impl(f"{op}_backward", backward, "CPU")
    yield
    lib._destroy()


@pytest.fixture(scope="module")
def flash_attention_on_cpu():
    yield from _cpu_kernels("_scaled_dot_product_flash_attention", _flash_forward, _flash_backward)


@pytest.fixture(scope="module")
def efficient_attention_on_cpu():
    yield from _cpu_kernels("_scaled_dot_product_efficient_attention", _forward, _backward)


class _Attention(torch.nn.Module):
    def __init__(self, flash: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.flash = flash
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if self.flash:
            o = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
        else:
            o = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)[0]
        return self.out(o.transpose(1, 2).reshape(b, n, 16)).pow(2).mean()


def test_the_reference_kernels_are_attention(efficient_attention_on_cpu) -> None:
    """(The test's own kernels against SDPA's math, forward and gradients.)"""
    q, k, v = (torch.randn(1, 2, 37, 8, requires_grad=True) for _ in range(3))
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)
    assert lse.shape == (1, 2, 64)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    got = _backward(g, q, k, v, None, out, lse, None, None, 0.0, [True] * 4, True)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got, want_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_training_with_a_padded_logsumexp_is_planned_once(efficient_attention_on_cpu) -> None:
    """Forward and backward graphs with the padded logsumexp between them, on lengths on both
    sides of a multiple of 32: loss and every gradient against eager, and symbolic plans (none
    refused) from the second length on, the third length planning nothing new."""
    _train_on_four_lengths(_Attention())


def test_training_with_flash_attention_is_planned_once(flash_attention_on_cpu) -> None:
    """The same with CUDA's flash attention: SymInt outputs (the lengths) and meta-device
    random-number state between the forward and the backward graphs."""
    _train_on_four_lengths(_Attention(flash=True))


def _train_on_four_lengths(model: torch.nn.Module) -> None:
    from runtime.dynamo import STATS, FusegCompiler, compile_with_aot

    torch._dynamo.reset()
    ours = copy.deepcopy(model)
    compiler = FusegCompiler()
    compiled = torch.compile(ours, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    plans = []
    for n in (40, 70, 64, 100):
        x = torch.randn(2, n, 16)
        model.zero_grad()
        ours.zero_grad()
        want = model(x)
        got = compiled(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        want.backward()
        got.backward()
        for (name, a), b in zip(model.named_parameters(), ours.parameters()):
            torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=f"length {n}: {name}")
        plans.append(len(compiler.compiled))
    torch._dynamo.reset()
    assert compiler.symbolic_refused == [], compiler.symbolic_refused
    symbolic = [p for p in compiler.compiled if p.sizes is not None]
    assert len(symbolic) >= 2, f"forward and backward planned symbolically: {plans}, {dict(STATS)}"
    assert plans[-1] == plans[-2] == plans[1], f"programs after each length: {plans}"
