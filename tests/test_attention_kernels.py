"""Small float32 attention as a generated C++ kernel (runtime/codegen/opaque/attention.py, Note
[attention kernels]): a table of the attentions the cpp backend takes under torch.compile (where
``scaled_dot_product_attention`` reaches us as ATen's flash attention for the CPU), each against
eager (values, strides, NaN positions); the ones it declines with their reasons; arguments and
recorded layouts of a graph that contradict the op, not believed; and the backward reading the
kernel's logsumexp."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.codegen import Declined
from runtime.codegen.opaque.attention import ATTENTION, ATTENTION_SCORES, attention_kernel
from runtime.dynamo import FusegCompiler, aot_backend

from .util import layout

TOL = 1e-5  # float32 sums in another order than ATen's, and another exp


def _compile(fn, inputs):
    """(the compiled function's outputs, its one program)."""
    torch._dynamo.reset()
    compiler = FusegCompiler()
    got = torch.compile(fn, backend=aot_backend(compiler))(*inputs)
    (program,) = compiler.compiled
    return got, program


def _attention_segment(program) -> int:
    (i,) = [s.index for s in program.plan.segments if any(n.op == ATTENTION for n in s.nodes)]
    return i


def _heads(b, h, n, e):
    """[b, h, n, e] as a transformer makes it: [b, n, h, e] transposed."""
    return torch.randn(b, n, h, e).transpose(1, 2)


def _causal_mask(lq, s):
    return torch.zeros(1, 1, lq, s).masked_fill_(torch.ones(lq, s, dtype=torch.bool).triu(1), float("-inf"))


def _sdpa(**kw):
    return lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m, **kw)


def _rows_masked_out(lq, s):
    m = torch.randn(lq, s)
    m[2] = float("-inf")  # row 2 sees no key
    m[:, 4] = float("-inf")
    return m


# (name, program, inputs): sizes cover the matmul tiles' tails (rows past the tile, keys past the
# last vector, features past the last vector), both ways of the scores (dot products below
# PACK_ROWS query rows, the key copied contiguous along the keys from there: a test in the
# kernel), and query rows in blocks whose scores fit ATTENTION_SCORES floats (more than one block
# from 130 x 130; with is_causal a block sees no key past its last row).
TAKEN = [
    ("llama-like", _sdpa(scale=0.25), [*(_heads(1, 4, 16, 16) for _ in range(3)), _causal_mask(16, 16)]),
    ("default-scale-tails", _sdpa(), [_heads(2, 3, 17, 24), _heads(2, 3, 23, 24), _heads(2, 3, 23, 24)]),
    ("contiguous-heads", _sdpa(), [torch.randn(2, 2, 9, 8), torch.randn(2, 2, 11, 8), torch.randn(2, 2, 11, 8)]),
    ("causal-fewer-queries", _sdpa(is_causal=True), [_heads(1, 2, 5, 16), _heads(1, 2, 13, 16), _heads(1, 2, 13, 16)]),
    ("causal-more-queries", _sdpa(is_causal=True), [_heads(1, 2, 13, 16), _heads(1, 2, 6, 16), _heads(1, 2, 6, 16)]),
    ("mask-2d-rows-masked-out", _sdpa(), [_heads(2, 2, 7, 12), _heads(2, 2, 9, 12), _heads(2, 2, 9, 12),
                                          _rows_masked_out(7, 9)]),
    ("mask-4d-full", _sdpa(), [_heads(2, 3, 6, 8), _heads(2, 3, 5, 8), _heads(2, 3, 5, 8), torch.randn(2, 3, 6, 5)]),
    ("padding-mask-bool", _sdpa(), [_heads(2, 2, 6, 8), _heads(2, 2, 6, 8), _heads(2, 2, 6, 8),
                                    torch.tensor([[1, 1, 1, 0, 0, 1], [1, 0, 1, 1, 1, 1]], dtype=torch.bool)
                                    .view(2, 1, 1, 6)]),
    ("one-feature", _sdpa(scale=2.0), [_heads(1, 2, 5, 1), _heads(1, 2, 7, 1), _heads(1, 2, 7, 1)]),
    ("one-key", _sdpa(), [_heads(1, 2, 5, 8), _heads(1, 2, 1, 8), _heads(1, 2, 1, 8)]),
    ("one-query-many-keys", _sdpa(), [_heads(1, 2, 1, 16), _heads(1, 2, 700, 16), _heads(1, 2, 700, 16)]),
    ("packed", _sdpa(), [_heads(1, 1, 40, 32), _heads(1, 1, 36, 32), _heads(1, 1, 36, 32)]),
    ("packed-causal-edges", _sdpa(is_causal=True), [_heads(1, 1, 37, 19), _heads(1, 1, 37, 19), _heads(1, 1, 37, 19)]),
    ("row-blocks", _sdpa(), [_heads(1, 1, 130, 8) for _ in range(3)]),
    ("row-blocks-causal-threads", _sdpa(is_causal=True), [_heads(1, 2, 300, 12), _heads(1, 2, 300, 12),
                                                       _heads(1, 2, 300, 12)]),
    ("row-blocks-mask", _sdpa(), [_heads(1, 1, 200, 8), _heads(1, 1, 90, 8), _heads(1, 1, 90, 8),
                                  torch.randn(1, 1, 200, 90)]),
    ("threads", _sdpa(), [*(_heads(2, 4, 64, 32) for _ in range(3))]),
    # grouped-query attention: each key head read by a group of query heads (Note [attention kernels])
    ("grouped-query-causal", _sdpa(is_causal=True, enable_gqa=True),
     [_heads(2, 4, 13, 16), _heads(2, 2, 13, 16), _heads(2, 2, 13, 16)]),
    ("grouped-query-one-key-head-mask", _sdpa(enable_gqa=True),
     [_heads(1, 3, 7, 8), _heads(1, 1, 9, 8), _heads(1, 1, 9, 8), torch.randn(1, 3, 7, 9)]),
]


@pytest.mark.parametrize("name,fn,inputs", TAKEN, ids=[t[0] for t in TAKEN])
def test_attention_kernel_matches_eager(name, fn, inputs) -> None:
    with torch.no_grad():
        want = fn(*inputs)
        got, program = _compile(fn, inputs)
    i = _attention_segment(program)
    assert program.backend_of[i] == "cpp", program.passed_over
    body = program.kernels[i].body
    assert "fuseg_attention_head(" in body
    assert ("omp parallel" in body) == name.endswith("threads")
    assert layout(got) == layout(want)
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL, equal_nan=True)


def test_rows_masked_out_whole_are_zeros_as_in_eager() -> None:
    (fn, inputs), = [(t[1], t[2]) for t in TAKEN if t[0] == "mask-2d-rows-masked-out"]
    with torch.no_grad():
        got, _ = _compile(fn, inputs)
        want = fn(*inputs)
    assert want[:, :, 2].eq(0).all() and got[:, :, 2].eq(0).all()
    assert not got.isnan().any()


def test_a_nan_reaches_the_rows_the_math_definition_sends_it_to() -> None:
    """See Note [attention kernels]: a NaN score makes its row NaN, as SDPA's math backend computes
    it. ATen's flash kernel drops NaN from a row's max in ways that depend on the row's length
    (here a query row of NaN scores comes out as zeros, as if masked out); every row without a
    NaN matches eager's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (_heads(1, 2, 6, 8) for _ in range(3))
    q[0, 1, 3, 2] = float("nan")  # one query row of one head
    k[0, 0, 4, 0] = float("nan")  # one key of the other head: every row of it
    fn = _sdpa()
    with torch.no_grad():
        got, program = _compile(fn, [q, k, v])
        want = fn(q, k, v)
        with sdpa_kernel(SDPBackend.MATH):
            math = fn(q, k, v)
    assert program.backend_of[_attention_segment(program)] == "cpp"
    assert torch.equal(got.isnan(), math.isnan()) and got[0, 1, 3].isnan().all() and got[0, 0].isnan().all()
    assert want[0, 1, 3].eq(0).all()  # eager's flash kernel: zeros (what this test documents)
    clean = ~math.isnan()
    torch.testing.assert_close(got[clean], want[clean], atol=TOL, rtol=TOL)


def test_the_kernel_reads_the_inputs_it_is_called_with_each_time() -> None:
    fn, inputs = TAKEN[0][1], TAKEN[0][2]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="fuseg")
    with torch.no_grad():
        for _ in range(3):
            fresh = [*(torch.randn_like(t) for t in inputs[:3]), inputs[3]]
            torch.testing.assert_close(compiled(*fresh), fn(*fresh), atol=TOL, rtol=TOL)


def test_training_reads_the_kernels_logsumexp() -> None:
    """With gradients, the forward hands ATen's backward the output and the logsumexp: the
    kernel writes both (in the layouts torch's meta kernel gives them), and the gradients match
    eager's, also through a row masked out whole (its logsumexp 0, as ATen writes it)."""
    q, k, v = (_heads(2, 2, 8, 16).requires_grad_() for _ in range(3))
    mask = _causal_mask(8, 8)
    mask[..., 5, :] = float("-inf")
    fn = _sdpa(scale=0.3)
    want = fn(q, k, v, mask)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    got, program = _compile(fn, [q, k, v, mask])
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    i = _attention_segment(program)
    assert program.backend_of[i] == "cpp", program.passed_over
    assert [p.name for p in program.kernels[i].params if p.output] == ["y_", "l_"]
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)
    for g, w in zip(grads, want_grads):
        assert not g.isnan().any()
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_training_through_query_row_blocks_reads_each_blocks_logsumexp() -> None:
    """130 x 130 scores are two blocks of query rows (Note [attention kernels]): the backward reads
    the logsumexp of every row where the kernel wrote it."""
    q, k, v = (_heads(1, 2, 130, 8).requires_grad_() for _ in range(3))
    fn = _sdpa(is_causal=True)
    want = fn(q, k, v)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    got, program = _compile(fn, [q, k, v])
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    assert program.backend_of[_attention_segment(program)] == "cpp", program.passed_over
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


# (name, program, inputs, why): attentions the generator declines (ATen runs them, as before)
DECLINED = [
    ("double", _sdpa(), [_heads(1, 2, 4, 8).double() for _ in range(3)], "float32"),
    ("too-many-keys", _sdpa(), [_heads(1, 1, 2, 8), _heads(1, 1, ATTENTION_SCORES + 1, 8),
                                _heads(1, 1, ATTENTION_SCORES + 1, 8)], f"more than a row of scores the kernel keeps ({ATTENTION_SCORES})"),
]


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[t[0] for t in DECLINED])
def test_declined_attentions_run_on_aten_with_the_reason(name, fn, inputs, why) -> None:
    with torch.no_grad():
        got, program = _compile(fn, inputs)
        want = fn(*inputs)
    i = _attention_segment(program)
    assert program.backend_of[i] == "torch"
    assert any(why in reason for _, reason in program.passed_over[i]), program.passed_over[i]
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# --- a graph that contradicts its own op --------------------------------------------------------


@pytest.fixture(scope="module")
def graph_and_node():
    fn, inputs = TAKEN[0][1], TAKEN[0][2]
    with torch.no_grad():
        _, program = _compile(fn, inputs)
    graph = program.graph
    (node,) = [n for n in graph.nodes if n.op == ATTENTION]
    attention_kernel(graph, node)  # taken as recorded
    return graph, node


def _with(graph, node, **changes):
    new = dataclasses.replace(node, **changes)
    return dataclasses.replace(graph, nodes=tuple(new if n is node else n for n in graph.nodes)), new


def _kwarg(node, name, value):
    return tuple((k, value if k == name else v) for k, v in node.kwargs)


@pytest.mark.parametrize("change,why", [
    (lambda n: {"kwargs": _kwarg(n, "scale", "0.25; system('x')")}, "scale must be a number"),
    (lambda n: {"kwargs": _kwarg(n, "scale", float("nan"))}, "scale must be finite"),
    (lambda n: {"kwargs": _kwarg(n, "scale", 1e300)}, "not a float32"),
    (lambda n: {"args": (*n.args[:3], 0.5)}, "dropout"),
    (lambda n: {"args": (*n.args[:3], 0.0, 1)}, "is_causal must be a bool"),
    (lambda n: {"metas": (dataclasses.replace(n.metas[0], shape=(1, 4, 16, 8)), *n.metas[1:])}, "torch computes"),
    (lambda n: {"metas": (dataclasses.replace(n.metas[0], stride=(1024, 256, 16, 1)), *n.metas[1:])},
     "torch's meta kernel gives"),
], ids=["scale-string", "scale-nan", "scale-huge", "dropout", "causal-int", "output-shape", "output-strides"])
def test_arguments_and_layouts_that_contradict_the_op_are_declined(graph_and_node, change, why) -> None:
    graph, node = graph_and_node
    graph, node = _with(graph, node, **change(node))
    with pytest.raises(Declined, match=why):
        attention_kernel(graph, node)


def test_a_recorded_logsumexp_layout_that_contradicts_the_op_is_declined() -> None:
    q, k, v = (_heads(1, 2, 8, 16).requires_grad_() for _ in range(3))
    _, program = _compile(_sdpa(), [q, k, v])
    graph = program.graph
    (node,) = [n for n in graph.nodes if n.op == ATTENTION]
    assert attention_kernel(graph, node).params[-1].name == "l_"  # taken as recorded
    graph, node = _with(graph, node, metas=(node.metas[0], dataclasses.replace(node.metas[1], stride=(16, 8, 1))))
    with pytest.raises(Declined, match="logsumexp .* torch's meta kernel gives"):
        attention_kernel(graph, node)


def test_key_heads_that_do_not_group_the_querys_are_declined(graph_and_node) -> None:
    """A key and value of fewer heads are taken where they group the query's (grouped-query
    attention: query head h reads key head h / (H / Hk)); heads that do not divide the query's,
    recorded by a lying graph, are declined."""
    graph, node = graph_and_node
    kv = {node.args[1].name, node.args[2].name}
    three_heads = dict(shape=(1, 3, 16, 16), stride=(768, 256, 16, 1))
    inputs = tuple(dataclasses.replace(i, meta=dataclasses.replace(i.meta, **three_heads)) if i.name in kv else i
                   for i in graph.inputs)
    lying = dataclasses.replace(graph, inputs=inputs)
    with pytest.raises(Declined, match="heads that do not group the query's"):
        attention_kernel(lying, node)


@st.composite
def _attentions(draw):
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    lq, s, e = draw(st.integers(1, 40)), draw(st.integers(1, 40)), draw(st.integers(1, 36))
    kind = draw(st.sampled_from(["plain", "causal", "mask-2d", "mask-4d", "mask-heads"]))
    hk = draw(st.sampled_from([d for d in (1, 2, 3) if h % d == 0]))  # key heads: h or a divisor (grouped-query)
    q, k, v = _heads(b, h, lq, e), _heads(b, hk, s, e), _heads(b, hk, s, e)
    mask_shape = {"mask-2d": (lq, s), "mask-4d": (b, 1, lq, s), "mask-heads": (1, h, 1, s)}.get(kind)
    inputs = [q, k, v] if mask_shape is None else [q, k, v, torch.randn(mask_shape)]
    return _sdpa(is_causal=kind == "causal", enable_gqa=hk != h), inputs


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_attentions())
def test_random_attentions_match_eager(case) -> None:
    fn, inputs = case
    with torch.no_grad():
        got, program = _compile(fn, inputs)
        want = fn(*inputs)
    assert program.backend_of[_attention_segment(program)] == "cpp", program.passed_over
    assert layout(got) == layout(want)
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)
