"""The backward of small float32 attention as a generated C++ kernel (runtime/codegen/opaque/attention.py,
Note [attention backward kernels]): a table of attentions trained through torch.compile, each at
two sizes, whose backward graph's ``_scaled_dot_product_flash_attention_for_cpu_backward`` the cpp
backend takes, against eager (the gradients' values and strides); the same at symbolic sizes;
the ones it declines with their reasons; arguments and recorded layouts that contradict the op,
not believed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime.codegen import Declined
from runtime.codegen.opaque.attention import ATTENTION_BACKWARD, attention_backward_kernel
from runtime.dynamo import FusegCompiler, aot_backend

from .test_attention_kernels import _heads, _sdpa, _with
from .util import layout

TOL = 1e-4  # float32 sums in another order than ATen's, and another exp, through two products


def _masked(lq, s):
    m = torch.randn(lq, s)
    m[1] = float("-inf")  # row 1 sees no key: its gradients are zeros
    m[:, 2] = float("-inf")
    return m


def _backward_segment(program) -> int | None:
    found = [s.index for s in program.plan.segments if any(n.op == ATTENTION_BACKWARD for n in s.nodes)]
    return found[0] if found else None


def _train(fn, inputs, dynamic=False):
    """The gradients of q, k and v through the compiled ``fn`` and through eager's, and the
    backward graph's program."""
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=aot_backend(compiler), dynamic=dynamic)
    grads = []
    for f in (compiled, fn):
        q, k, v = (t.detach().clone().requires_grad_() for t in inputs[:3])
        out = f(q, k, v, *inputs[3:])
        grads.append(torch.autograd.grad((out * out.detach().cos()).sum(), (q, k, v)))
    programs = [p for p in compiler.compiled if _backward_segment(p) is not None]
    return grads[0], grads[1], programs


# (name, program, inputs at two sizes): sizes cover the products' tails (rows past a tile,
# features and keys past a vector), query rows in blocks whose scores fit ATTENTION_SCORES floats
# (more than one block from 130 keys; with is_causal a block sees no key past its last row), a
# block of more query rows than a block of k (128), masks of 2 and 4 dims, rows masked out whole.
TAKEN = [
    ("causal", _sdpa(is_causal=True), lambda n: [_heads(2, 4, n, 16) for _ in range(3)], (32, 13)),
    ("plain-tails", _sdpa(), lambda n: [_heads(2, 3, n, 24), _heads(2, 3, n + 6, 24), _heads(2, 3, n + 6, 24)], (17, 5)),
    ("scale-mask-2d-rows-masked", _sdpa(scale=0.3),
     lambda n: [_heads(1, 2, n, 12), _heads(1, 2, n + 2, 12), _heads(1, 2, n + 2, 12), _masked(n, n + 2)], (7, 10)),
    ("mask-4d", _sdpa(), lambda n: [_heads(2, 2, n, 8), _heads(2, 2, 5, 8), _heads(2, 2, 5, 8), torch.randn(2, 2, n, 5)],
     (6, 3)),
    ("one-feature", _sdpa(is_causal=True), lambda n: [_heads(1, 2, n, 1) for _ in range(3)], (5, 9)),
    ("row-blocks-causal", _sdpa(is_causal=True), lambda n: [_heads(1, 2, n, 8) for _ in range(3)], (200, 131)),
    ("long-block-of-queries", _sdpa(), lambda n: [_heads(1, 2, n, 16), _heads(1, 2, 64, 16), _heads(1, 2, 64, 16)],
     (160, 150)),
    ("heads-of-64", _sdpa(is_causal=True), lambda n: [_heads(2, 4, n, 64) for _ in range(3)], (64, 40)),
    # grouped-query attention: a key head's gradients sum its group of query heads' shares
    ("grouped-query-causal", _sdpa(is_causal=True, enable_gqa=True),
     lambda n: [_heads(2, 4, n, 16), _heads(2, 2, n, 16), _heads(2, 2, n, 16)], (32, 9)),
    ("grouped-query-one-key-head-mask", _sdpa(enable_gqa=True),
     lambda n: [_heads(1, 3, n, 8), _heads(1, 1, 6, 8), _heads(1, 1, 6, 8), torch.randn(1, 3, n, 6)], (7, 140)),
]


@pytest.mark.parametrize("name,fn,make,sizes", TAKEN, ids=[t[0] for t in TAKEN])
def test_attention_backward_kernel_matches_eager(name, fn, make, sizes) -> None:
    for n in sizes:
        torch._dynamo.reset()
        inputs = make(n)
        got, want, programs = _train(fn, inputs)
        (program,) = programs
        i = _backward_segment(program)
        assert program.backend_of[i] == "cpp", program.passed_over
        assert "fuseg_attention_head_backward(" in program.kernels[i].body
        for g, w in zip(got, want):
            assert layout(g) == layout(w)
            assert not g.isnan().any()
            torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)


def test_rows_masked_out_whole_get_zero_gradients_as_in_eager() -> None:
    (fn, make) = [(t[1], t[2]) for t in TAKEN if t[0] == "scale-mask-2d-rows-masked"][0]
    got, want, _ = _train(fn, make(7))
    assert want[0][:, :, 1].eq(0).all() and got[0][:, :, 1].eq(0).all()


def test_symbolic_sizes_one_kernel_for_every_length() -> None:
    """Training at three lengths under ``dynamic=True``: the backward's kernel reads its sizes as
    arguments, and the gradients match eager's at each."""
    torch._dynamo.reset()
    fn = _sdpa(is_causal=True)
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=aot_backend(compiler), dynamic=True)
    for n in (9, 11, 13):
        inputs = [_heads(1, 2, n, 8) for _ in range(3)]
        grads = []
        for f in (compiled, fn):
            q, k, v = (t.detach().clone().requires_grad_() for t in inputs)
            grads.append(torch.autograd.grad(f(q, k, v).square().sum(), (q, k, v)))
        for g, w in zip(*grads):
            torch.testing.assert_close(g, w, atol=TOL, rtol=TOL)
    backward = [p for p in compiler.compiled if _backward_segment(p) is not None]
    assert len(backward) == 1 and backward[0].sizes is not None, "not one symbolic plan"
    i = _backward_segment(backward[0])
    assert backward[0].backend_of[i] == "cpp" and "fuseg_s" in backward[0].kernels[i].body


def test_a_query_alone_with_gradients_matches_eager() -> None:
    """Only the query needs a gradient: the graph keeps the key's and value's gradients unused,
    so the kernel, which writes all three, declines (not done: writing the unused ones to scratch);
    ATen's op runs and the query's gradient matches eager's."""
    for n in (8, 5):
        torch._dynamo.reset()
        q, k, v = (_heads(1, 2, n, 16) for _ in range(3))
        compiler = FusegCompiler()
        fn = _sdpa(is_causal=True)
        compiled = torch.compile(fn, backend=aot_backend(compiler))
        grads = []
        for f in (compiled, fn):
            q_ = q.clone().requires_grad_()
            grads.append(torch.autograd.grad(f(q_, k, v).square().sum(), q_)[0])
        torch.testing.assert_close(grads[0], grads[1], atol=TOL, rtol=TOL)
        backward = [p for p in compiler.compiled if _backward_segment(p) is not None]
        assert len(backward) == 1
        i = _backward_segment(backward[0])
        assert backward[0].backend_of[i] == "torch"
        assert any("without its three gradients" in why for _, why in backward[0].passed_over[i])


def test_double_runs_on_aten_with_the_reason() -> None:
    for n in (6, 11):
        torch._dynamo.reset()
        got, want, programs = _train(_sdpa(), [_heads(1, 2, n, 8).double() for _ in range(3)])
        (program,) = programs
        i = _backward_segment(program)
        assert program.backend_of[i] == "torch"
        assert any("float32" in why for _, why in program.passed_over[i]), program.passed_over[i]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=0, rtol=0)


# --- a graph that contradicts its own op --------------------------------------------------------


@pytest.fixture(scope="module")
def graph_and_node():
    torch._dynamo.reset()
    _, _, (program,) = _train(_sdpa(is_causal=True), [_heads(1, 2, 8, 16) for _ in range(3)])
    graph = program.graph
    (node,) = [n for n in graph.nodes if n.op == ATTENTION_BACKWARD]
    attention_backward_kernel(graph, node)  # taken as recorded
    return graph, node


def _kwarg(node, name, value):
    kwargs = dict(node.kwargs)
    kwargs[name] = value
    return tuple(kwargs.items())


@pytest.mark.parametrize("change,why", [
    (lambda n: {"kwargs": _kwarg(n, "scale", "0.25; system('x')")}, "scale must be a number"),
    (lambda n: {"kwargs": _kwarg(n, "scale", 1e300)}, "not a float32"),
    (lambda n: {"args": (*n.args[:6], 0.5, *n.args[7:])}, "dropout"),
    (lambda n: {"args": (*n.args[:7], 1, *n.args[8:])}, "is_causal must be a bool"),
    (lambda n: {"metas": (dataclasses.replace(n.metas[0], stride=(1, 2, 4, 8)), *n.metas[1:])},
     "torch's meta kernel gives"),
], ids=["scale-string", "scale-huge", "dropout", "causal-int", "grad-query-strides"])
def test_arguments_and_layouts_that_contradict_the_op_are_declined(graph_and_node, change, why) -> None:
    graph, node = graph_and_node
    graph, node = _with(graph, node, **change(node))
    with pytest.raises(Declined, match=why):
        attention_backward_kernel(graph, node)
