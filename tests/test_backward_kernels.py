"""Backward graphs get generated kernels (issue 42, goal 4; Note [decompositions before
segmenting] in runtime/dynamo.py): AOTAutograd's backward ops that the kernel generator does not
take (``silu_backward``, ``slice_backward``, ``_log_softmax_backward_data``, ...) are decomposed
into the pointwise, injective and row ops it does take, with torch's own decompositions;
``gelu_backward`` is generated whole (runtime/codegen/lowering/pointwise.py). Each program below is trained through ``torch.compile(backend="fuseg")`` at two
shapes (the second one through dynamo's symbolic recompile); every gradient and the loss are
checked against eager, and no backward op is left whole in a backward graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.codegen.build import cpu_compiler
from runtime.dynamo import DECOMPOSED, FusegCompiler, decompositions
from segmenter import SegmentKind


def _rotate_half(x, w):  # RoPE's rotate_half: slice_backward twice, then a cat, in the backward
    h = x.shape[-1] // 2
    return (x * w + torch.cat((-x[..., h:], x[..., :h]), -1) * w).sum()


PROGRAMS = {
    # name: (loss of (x, w), the backward op AOTAutograd emits for it)
    "silu": (lambda x, w: (F.silu(x * w) * x).sum(), "aten.silu_backward.default"),
    "gelu": (lambda x, w: F.gelu(x * w).sum(), "aten.gelu_backward.default"),
    "gelu-tanh": (lambda x, w: F.gelu(x * w, approximate="tanh").sum(), "aten.gelu_backward.default"),
    "tanh": (lambda x, w: torch.tanh(x * w).pow(2).sum(), "aten.tanh_backward.default"),
    "sigmoid": (lambda x, w: torch.sigmoid(x * w).pow(2).sum(), "aten.sigmoid_backward.default"),
    "relu": (lambda x, w: F.relu(x * w).pow(2).sum(), "aten.threshold_backward.default"),
    "hardtanh": (lambda x, w: F.hardtanh(x * w, -0.5, 0.5).pow(2).sum(), "aten.hardtanh_backward.default"),
    "leaky-relu": (lambda x, w: F.leaky_relu(x * w, 0.1).pow(2).sum(), "aten.leaky_relu_backward.default"),
    "elu": (lambda x, w: F.elu(x * w).pow(2).sum(), "aten.elu_backward.default"),
    "softplus": (lambda x, w: F.softplus(x * w).pow(2).sum(), "aten.softplus_backward.default"),
    "hardswish": (lambda x, w: F.hardswish(x * w).pow(2).sum(), "aten.hardswish_backward.default"),
    "log-softmax": (lambda x, w: -(F.log_softmax(x * w, -1) * x).sum(), "aten._log_softmax_backward_data.default"),
    "softmax": (lambda x, w: (torch.softmax(x * w, -1) * x).sum(), "aten._softmax_backward_data.default"),
    "layer-norm": (lambda x, w: (F.layer_norm(x, x.shape[-1:], w[0], w[1]) * w).sum(),
                   "aten.native_layer_norm_backward.default"),
    "slice": (lambda x, w: (x[:, 1:5] * w[:, 2:6]).pow(2).sum(), "aten.slice_backward.default"),
    "select": (lambda x, w: (x[:, 3] * w[:, 1]).pow(2).sum(), "aten.select_backward.default"),
    "rotate-half": (_rotate_half, "aten.slice_backward.default"),
}

SHAPES = ((4, 8), (6, 12))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_backward_runs_generated_kernels_and_matches_eager(name: str) -> None:
    fn, backward_op = PROGRAMS[name]
    from runtime.codegen.lowering.pointwise import ELEMENTWISE

    assert (backward_op in DECOMPOSED) != (backward_op in ELEMENTWISE)  # decomposed, or generated whole
    from torch._dynamo.backends.common import aot_autograd

    forward, backward = FusegCompiler(), FusegCompiler()  # (aot_backend's settings, a compiler each)
    step = torch.compile(fn, backend=aot_autograd(fw_compiler=forward, bw_compiler=backward,
                                                  keep_inference_input_mutations=True,
                                                  decompositions=decompositions()))
    for k, shape in enumerate(SHAPES):
        torch.manual_seed(k)
        x, w = torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
        xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        loss = step(x, w)
        loss.backward()
        want = fn(xe, we)
        want.backward()
        torch.testing.assert_close(loss, want)
        torch.testing.assert_close(x.grad, xe.grad)
        torch.testing.assert_close(w.grad, we.grad)
        assert x.grad.stride() == xe.grad.stride() and w.grad.stride() == we.grad.stride()
    assert len(backward.compiled) == 2 and backward.compiled[1].sizes is not None  # static, then symbolic
    ops = {n.op for p in backward.compiled for seg in p.plan.segments for n in seg.nodes}
    assert not ops & DECOMPOSED, f"left whole: {sorted(ops & DECOMPOSED)}"
    if cpu_compiler() is not None:  # every kernel segment of the backward programs is generated
        for p in backward.compiled:
            on_torch = {i: p.passed_over.get(i) for i, seg in enumerate(p.plan.segments)
                        if seg.kind not in (SegmentKind.METADATA, SegmentKind.MATMUL) and p.backend_of.get(i) == "torch"}
            assert not on_torch, on_torch


def test_the_forward_saves_a_min_cut_and_the_backward_recomputes() -> None:
    """Note [training graphs cut by min-cut] (runtime/dynamo.py): the forward of ``silu(x * w) *
    tanh(x)`` does not hand ``x * w`` to the backward (AOTAutograd's default partition saved it,
    with a detach of tanh: 7 outputs); the backward recomputes it in its own kernel, and the
    gradients are eager's."""
    from runtime.dynamo import aot_backend

    def fn(x, w):
        return (F.silu(x * w) * torch.tanh(x)).sum()

    compiler = FusegCompiler()
    step = torch.compile(fn, backend=aot_backend(compiler))
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    step(x, w).backward()
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    fn(xe, we).backward()
    torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(w.grad, we.grad)
    forward, backward = compiler.compiled
    product = next(n.outputs[0] for n in forward.graph.nodes if n.op == "aten.mul.Tensor")
    assert product not in forward.graph.outputs
    assert "aten.detach.default" not in {n.op for n in forward.graph.nodes}
    assert "aten.mul.Tensor" in {n.op for n in backward.graph.nodes}
