"""Note [views from the plan] (runtime/backends/torch_backend.py): a view op inside a segment
that runs on ATen, whose chain of views starts at one of the segment's inputs, is made from the
planned layout (one strided view, no dispatcher round trip) where the fast variant runs; every
other view (of a value the segment computes, one that changes the dtype, one with a conjugate or
negative bit) is ATen's own call. Checked against eager: values, strides, offsets, aliasing."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import runtime
from alias import apply_aliases
from segmenter import GraphError, capture, segment

from .util import assert_matches_eager


def _mm_t(x, w):
    return x @ w.t()


def _mm_t_bias(x, w, b):
    return torch.addmm(b, x, w.t())


def _bmm_expanded(x, w):
    return torch.bmm(x, w.t().unsqueeze(0).expand(x.shape[0], -1, -1))


def _mm_of_transposed_input(x, w):
    return x.t() @ w


def _view_of_computed(x, w):
    return (x @ w).view(-1)[3:9].view(2, 3) @ w[:3, :3]


def _dtype_view(x, w):
    return torch.mm(x.view(torch.int32).view(torch.float32), w.t())


def _index_of_view(x, i):
    return x.t()[i]


#: name -> (program, inputs, ATen ops that must not run in the fast variant (made from the plan))
CASES = {
    "mm of w.t()": (_mm_t, lambda: [torch.randn(5, 4), torch.randn(6, 4)], {"aten::t", "aten::permute"}),
    "addmm of w.t()": (_mm_t_bias, lambda: [torch.randn(5, 4), torch.randn(6, 4), torch.randn(6)],
                       {"aten::t", "aten::permute"}),
    "bmm of an expanded view": (_bmm_expanded, lambda: [torch.randn(3, 5, 4), torch.randn(6, 4)],
                                {"aten::t", "aten::permute", "aten::unsqueeze", "aten::expand"}),
    # the input has a storage offset of its own: the view is made relative to it
    "offset input": (_mm_of_transposed_input, lambda: [torch.randn(40)[7:31].view(4, 6), torch.randn(4, 3)],
                     {"aten::t", "aten::permute"}),
    "view of a computed value": (_view_of_computed, lambda: [torch.randn(4, 4), torch.randn(4, 4)], set()),
    "view that changes the dtype": (_dtype_view, lambda: [torch.randn(5, 4), torch.randn(6, 4)], set()),
    "index of a view": (_index_of_view, lambda: [torch.randn(5, 4), torch.tensor([2, 0, 3])], set()),
}


def _aten_ops_run(program, inputs) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        program(*inputs)
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_views_of_segment_inputs_come_from_the_plan(name: str, backend: str) -> None:
    fn, make, not_run = CASES[name]
    inputs = make()
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    program = runtime.compile(plan, backend=backend)
    with torch.no_grad():
        assert_matches_eager(fn, inputs, plan.graph, program=program)
        ran = _aten_ops_run(program, inputs)
    assert not ran & not_run, f"ATen view ops ran where the plan makes the view: {sorted(ran & not_run)}"
    # the matmul ran: ATen's, or (on cpp) its generated kernel (Note [matmul kernels])
    kernels = [program.kernels[s.index].name for s in plan.segments if s.index in program.kernels]
    assert ran & {"aten::mm", "aten::addmm", "aten::bmm", "aten::index"} or any("matmul" in k for k in kernels)


def test_dtype_views_stay_atens() -> None:
    """The negative control of the profiler check: a view that changes the dtype is ATen's."""
    def fn(x, w):
        return (x @ w.t()).view(torch.int32)

    inputs = [torch.randn(5, 4), torch.randn(6, 4)]
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    program = runtime.compile(plan, backend="torch")
    with torch.no_grad():
        assert_matches_eager(fn, inputs, plan.graph, program=program)
        ran = _aten_ops_run(program, inputs)
    assert "aten::view" in ran


def test_conjugate_views_stay_atens() -> None:
    def fn(x, w):
        return x @ w.conj().t()

    x, w = torch.randn(3, 4, dtype=torch.complex64), torch.randn(5, 4, dtype=torch.complex64)
    plan = apply_aliases(segment(capture(fn, [x, w])), "post")
    program = runtime.compile(plan, backend="torch")
    with torch.no_grad():
        assert_matches_eager(fn, [x, w], plan.graph, program=program)


def test_safe_variant_views_keep_autograd() -> None:
    """Where autograd records (the safe variant), the view is ``as_strided`` of the input:
    gradients flow through it as through eager's ``t``."""
    x, w = torch.randn(5, 4), torch.randn(6, 4)
    plan = apply_aliases(segment(capture(_mm_t, [x, w])), "post")
    program = runtime.compile(plan, backend="torch")
    wg, we = w.clone().requires_grad_(), w.clone().requires_grad_()
    (y,) = program(x, wg)
    y.sum().backward()
    _mm_t(x, we).sum().backward()
    torch.testing.assert_close(wg.grad, we.grad)


def test_compiled_model_matches_eager() -> None:
    """Through torch.compile: a Linear's weight is viewed as transposed by the plan."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="fuseg")
    with torch.no_grad():
        got, want = compiled(x), m(x)
        ran = _aten_ops_run(compiled, [x])
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()
    assert "aten::permute" not in ran and "aten::t" not in ran


#: as_strided reaching past the input's own extent, into the rest of an example's storage: a
#: tensor of the same layout whose storage ends with it must be refused, as eager refuses it.
#: Before Note [views from the plan], the METADATA segment's view (sort, cumsum, mm of a
#: transposed view) was made without a storage check: out-of-bounds reads.
PAST_THE_EXTENT = {
    "sort of a metadata view": lambda x: torch.sort(x.as_strided((5, 10), (10, 1)), dim=1)[0],
    "cumsum of a metadata view": lambda x: torch.cumsum(x.as_strided((5, 10), (10, 1)), 1),
    "mm of a metadata view": lambda x, w: x.as_strided((5, 10), (10, 1)).t().t() @ w,
    "bmm of a view in its segment": lambda x, w: torch.bmm(x.as_strided((2, 5, 10), (0, 10, 1)), w.expand(2, 10, 3)),
    "view returned": lambda x: x.as_strided((5, 10), (10, 1)),
}


@pytest.mark.parametrize("name", list(PAST_THE_EXTENT))
@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_views_past_an_inputs_extent_check_its_storage(name: str, backend: str) -> None:
    fn = PAST_THE_EXTENT[name]
    big = [torch.randn(400)[:4], torch.randn(10, 3)][:fn.__code__.co_argcount]
    plan = apply_aliases(segment(capture(fn, big)), "post")
    program = runtime.compile(plan, backend=backend)
    with torch.no_grad():
        assert_matches_eager(fn, big, plan.graph, program=program)  # the storage holds it: as eager
        small = [torch.randn(4), torch.randn(10, 3)][:len(big)]
        with pytest.raises(RuntimeError):
            fn(*small)
        with pytest.raises((RuntimeError, GraphError), match="storage|out of bounds"):
            program(*small)


def test_views_past_a_computed_values_extent_stay_atens() -> None:
    """From a value the program made, a view past its extent is ATen's (which checks the storage),
    never made from the plan."""
    def fn(x):
        y = x * 2
        return y.as_strided((2, 2), (1, 1), 1).sum(), y

    x = torch.randn(6)
    plan = apply_aliases(segment(capture(fn, [x])), "post")
    program = runtime.compile(plan, backend="torch")
    with torch.no_grad():
        assert_matches_eager(fn, [x], plan.graph, program=program)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_a_chain_of_views_reads_its_source_after_its_first_link(backend: str) -> None:
    """Found by the op_db sweep: a segment run on torch views its input ``gather`` by ``permute``
    then ``unsqueeze``; the second view is made from ``gather`` itself, which the program had
    deleted after its last use as ATen's ops would read it (the permute): the program did not build."""
    def fn(x, t):
        return torch.nn.functional.multilabel_margin_loss(x, t)

    inputs = [torch.tensor(5.1619), torch.tensor(0)]
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    program = runtime.compile(plan, backend=backend)
    with torch.no_grad():
        assert_matches_eager(fn, inputs, plan.graph, program=program)
