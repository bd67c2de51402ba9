"""Sizes read from data under ``torch.compile(backend="fuseg")`` (issue 63, goal 3): ``.item()``
used as a size, ``nonzero``, ``masked_select``, ``repeat_interleave`` with tensor repeats,
``torch._check``. Note [sizes read from data run on torch] (runtime/unbacked.py): the ops whose
sizes depend on data run on torch, with the reason recorded; the rest of the graph still gets
our kernels. Every case is checked against eager (values and strides) at two or more values of
the data-dependent size, 0 among them where the program allows it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from runtime.codegen.build import cpu_compiler
from runtime.dynamo import STATS, FusegCompiler, compile_with_aot


@pytest.fixture(autouse=True)
def _data_dependent_capture():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        yield
    torch._dynamo.reset()


def _same(got: object, expected: object) -> None:
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
        assert g.stride() == e.stride(), (g.stride(), e.stride())


def _compiled(fn: Callable, compiler: FusegCompiler) -> Callable:
    return torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))


def _item_as_rows(x, y):
    a = (x * 2).sin()
    z = y.item()
    return torch.cat([a, a.new_ones(z, a.shape[1])]), a.cos() + 1


def _checked_item(x, y):
    z = y.item()
    torch._check(z // 2 == 3)
    return x + x.new_ones(z)


def _nonzero(x):
    return torch.nonzero(x > 0) * 2, x.exp()


def _masked_select(x):
    s = torch.masked_select(x * 3, x > 0)
    return s.sin() + 1, s.sum() * x


def _repeat_interleave(x, r):
    return torch.repeat_interleave(x.relu(), r, dim=0) * 2


def _kernel_programs(compiler: FusegCompiler) -> int:
    return sum(1 for p in compiler.compiled if p.kernels)


def test_item_used_as_a_size() -> None:
    compiler = FusegCompiler()
    fn = _compiled(_item_as_rows, compiler)
    x = torch.randn(3, 4)
    for z in (2, 0, 5):
        y = torch.tensor(z)
        _same(fn(x, y), _item_as_rows(x, y))
    (report,) = compiler.data_dependent
    text = report.describe()
    assert "aten._local_scalar_dense.default" in text and "aten.cat.default" in text
    # (x * 2).sin() and a.cos() + 1 depend on no data-dependent size: planned, with our kernels
    ops = {n.op for p in compiler.compiled for s in p.plan.segments for n in s.nodes}
    assert {"aten.sin.default", "aten.cos.default"} <= ops
    assert "aten._local_scalar_dense.default" not in ops and "aten.cat.default" not in ops
    if cpu_compiler() is not None:
        assert _kernel_programs(compiler) >= 1


def test_torch_check_on_an_item() -> None:
    """``torch._check(z // 2 == 3)`` allows 6 and 7 (0 breaks the check: eager raises)."""
    compiler = FusegCompiler()
    fn = _compiled(_checked_item, compiler)
    for z in (7, 6):
        x, y = torch.randn(z), torch.tensor(z)
        _same(fn(x, y), _checked_item(x, y))
    assert compiler.data_dependent


@pytest.mark.parametrize("positives", [0, 4, 15])
def test_nonzero(positives: int) -> None:
    compiler = FusegCompiler()
    fn = _compiled(_nonzero, compiler)
    x = -torch.rand(5, 3)
    x.view(-1)[:positives] = torch.rand(positives) + 0.1
    _same(fn(x), _nonzero(x))
    assert "aten.nonzero.default" in compiler.data_dependent[0].describe()
    ops = {n.op for p in compiler.compiled for s in p.plan.segments for n in s.nodes}
    assert "aten.exp.default" in ops and "aten.gt.Scalar" in ops


def test_nonzero_at_several_counts_in_one_compile() -> None:
    """One dynamo graph serves every count (the count is a symbol); each call is right."""
    compiler = FusegCompiler()
    fn = _compiled(_nonzero, compiler)
    for positives in (3, 0, 15, 7):
        x = -torch.rand(5, 3)
        x.view(-1)[:positives] = 1.0
        _same(fn(x), _nonzero(x))
    assert len(compiler.data_dependent) == 1


def test_masked_select_at_several_counts() -> None:
    compiler = FusegCompiler()
    fn = _compiled(_masked_select, compiler)
    for positives in (0, 6, 12):
        x = -torch.rand(4, 3)
        x.view(-1)[:positives] = torch.rand(positives) + 0.1
        _same(fn(x), _masked_select(x))
    assert "aten.masked_select.default" in compiler.data_dependent[0].describe()


def test_repeat_interleave_with_tensor_repeats() -> None:
    compiler = FusegCompiler()
    fn = _compiled(_repeat_interleave, compiler)
    x = torch.randn(3, 4)
    for r in ([0, 0, 0], [1, 0, 2], [3, 3, 3]):
        repeats = torch.tensor(r)
        _same(fn(x, repeats), _repeat_interleave(x, repeats))
    assert "aten.repeat_interleave.Tensor" in compiler.data_dependent[0].describe()


def test_the_registered_backend_runs_them() -> None:
    """``backend="fuseg"`` as a user writes it, and the count in ``STATS``."""
    before = STATS["data_dependent_on_torch"]
    fn = torch.compile(_item_as_rows, backend="fuseg")
    x = torch.randn(2, 5)
    for z in (0, 3):
        _same(fn(x, torch.tensor(z)), _item_as_rows(x, torch.tensor(z)))
    assert STATS["data_dependent_on_torch"] > before


def test_marked_dynamic_dim_with_a_data_dependent_size() -> None:
    """mark_dynamic's symbol (backed) beside nonzero's (unbacked): the parts that depend on the
    backed one only are planned symbolically, once."""
    compiler = FusegCompiler()
    fn = _compiled(_nonzero, compiler)
    for n, positives in ((5, 0), (9, 4), (13, 13)):
        x = -torch.rand(n, 3)
        x.view(-1)[:positives] = 1.0
        torch._dynamo.mark_dynamic(x, 0)
        _same(fn(x), _nonzero(x))
    assert len(compiler.data_dependent) == 1
    assert any(p.sizes is not None for p in compiler.compiled), compiler.symbolic_refused


def test_training_through_masked_select() -> None:
    """A forward and a backward graph, both with the data-dependent count; gradients as eager's."""
    compiler = FusegCompiler()

    def loss(x, w):
        return torch.masked_select((x * w).tanh(), x > 0).square().sum()

    fn = _compiled(loss, compiler)
    w = torch.randn(3)
    for positives in (0, 5):
        x = -torch.rand(4, 3)
        x.view(-1)[:positives] = 1.0
        w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
        expected = loss(x, w1)
        expected.backward()
        got = fn(x, w2)
        got.backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(w2.grad, w1.grad)


def test_explain_says_what_ran_on_torch_and_why(caplog) -> None:
    """The reasons are in ``FusegCompiler.explain()`` and in the "fuseg" logger (what a user of
    ``backend="fuseg"`` sees with logging on)."""
    import logging

    compiler = FusegCompiler()
    fn = _compiled(_masked_select, compiler)
    x = torch.randn(4, 3)
    with caplog.at_level(logging.INFO, logger="fuseg"):
        _same(fn(x), _masked_select(x))
    text = compiler.explain()
    assert "%masked_select (aten.masked_select.default): its size or value is read from data" in text
    assert "%sum_1 (aten.sum.default): it reads %masked_select" in text
    assert "on generated kernels" in text
    assert "aten.masked_select.default" in caplog.text


def _item_returned(x, y):
    return x * 2, y.item()


def _bool_mask(x):
    return (x * 3)[x > 0.5] + 1, x.sum()


def _float_item(x, y):
    return (x * y.item()).sin()


def _mutates_then_selects(x):
    x.add_(1)
    return x[x > 1.5] * 2


def _item_as_view_shape(x, y):
    z = y.item()
    torch._check(z > 0)
    torch._check(x.numel() % z == 0)
    return (x.view(z, -1) * 2).sum(0)


def _unique(x):
    return torch.unique(x) * 2


def _tolist_sizes(x, y):
    a, b = y.tolist()
    return x.new_zeros(a, b) + 1, x.cos()


def _slice_of_input(x, y):
    z = y.item()
    torch._check(z <= x.shape[0])
    return x[:z], x.relu()


def _reads_then_mutates(x):
    y = x[x > 0]
    x.add_(1)
    return y * 2


def _item_then_mutates(x, n):
    y = x.new_ones(n.item()) * x.sum()
    x.mul_(3)
    return y


# (program, two or more argument lists: the data-dependent size 0 first where the program allows it)
MORE = {
    "item_returned": (_item_returned, [(torch.randn(3), torch.tensor(0)), (torch.randn(3), torch.tensor(4))]),
    "bool_mask": (_bool_mask, [(torch.zeros(4, 3),), (torch.rand(4, 3),)]),
    "float_item": (_float_item, [(torch.randn(4), torch.tensor(0.0)), (torch.randn(4), torch.tensor(2.5))]),
    "mutates_then_selects": (_mutates_then_selects, [(torch.zeros(5),), (torch.rand(5) + 0.4,)]),
    "item_as_view_shape": (_item_as_view_shape, [(torch.randn(12), torch.tensor(3)), (torch.randn(12), torch.tensor(4))]),
    "unique": (_unique, [(torch.tensor([1.0, 1.0]),), (torch.tensor([3.0, 1.0, 2.0, 1.0]),)]),
    "tolist_sizes": (_tolist_sizes, [(torch.randn(3), torch.tensor([0, 4])), (torch.randn(3), torch.tensor([2, 3]))]),
    # (Note [writes after the parts]) the write stays last, after the read of the old value on torch
    "reads_then_mutates": (_reads_then_mutates, [(-torch.rand(6),), (torch.randn(6),)]),
    "item_then_mutates": (_item_then_mutates, [(torch.randn(4), torch.tensor(0)), (torch.randn(4), torch.tensor(3))]),
    "slice_of_input": (_slice_of_input, [(torch.randn(5, 2), torch.tensor(0)), (torch.randn(5, 2), torch.tensor(3))]),
}


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_programs_with_sizes_from_data(name: str) -> None:
    """Values, strides, numbers, inputs afterwards (mutation) and outputs that are views of inputs,
    as eager's."""
    fn, calls = MORE[name]
    compiler = FusegCompiler()
    compiled = _compiled(fn, compiler)
    for args in calls:
        ours, theirs = [a.clone() for a in args], [a.clone() for a in args]
        expected, got = fn(*theirs), compiled(*ours)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        _same([g for g in got if isinstance(g, torch.Tensor)], [e for e in expected if isinstance(e, torch.Tensor)])
        assert [g for g in got if not isinstance(g, torch.Tensor)] == [e for e in expected if not isinstance(e, torch.Tensor)]
        _same(ours, theirs)
        for g, e in zip(got, expected):
            if isinstance(e, torch.Tensor):
                shares = [e.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in theirs]
                assert shares == [g.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for t in ours]
    # (dynamo breaks the graph at a float's .item() instead: no graph of ours reads it)
    assert bool(compiler.data_dependent) == (name != "float_item")


def test_automatic_dynamic_with_an_item_as_a_size() -> None:
    """Dynamo's automatic dynamic shapes (a second row count recompiles with it symbolic) beside
    the item's size: right at every row count and item, the part of ordinary sizes planned
    symbolically once dynamo's graph has symbolic sizes."""
    compiler = FusegCompiler()
    fn = _compiled(_item_as_rows, compiler)
    for n in (3, 5, 8):
        x = torch.randn(n, 4)
        for z in (0, 2):
            _same(fn(x, torch.tensor(z)), _item_as_rows(x, torch.tensor(z)))
    assert len(compiler.data_dependent) == 2  # the static graph, then the dynamic one
    assert any(p.sizes is not None for p in compiler.compiled), compiler.symbolic_refused


def test_a_graph_that_writes_midway_runs_whole_on_torch() -> None:
    """See Note [writes after the parts]: a write that is not the epilogue (an in-place op read after
    it, as a graph that is not functionalized has) keeps the whole graph on torch, in its order."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from runtime.unbacked import split_at_data

    def f(x):
        y = torch.nonzero(x > 0)
        x.add_(1)
        return y * 2, x * 2

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(6))
    compiled: list[int] = []
    outer, report = split_at_data(gm, "g", lambda sub, k: compiled.append(k))
    assert report.parts == 0 and compiled == [] and "the whole graph" in report.describe()
    for x in (-torch.rand(6), torch.randn(6)):
        ours, theirs = x.clone(), x.clone()
        _same(outer(ours), f(theirs))
        _same(ours, theirs)


def _gather_loss(x, w, _n):
    h = (x * w).sigmoid()
    return h[torch.nonzero(x > 0, as_tuple=True)].square().sum() + h.sum()


def _item_loss(x, w, n):
    k = n.item()
    torch._check(k <= x.shape[0])
    return (x * w)[:k].exp().sum() + torch.cat([x * w, x.new_ones(k, 3)]).sum()


@pytest.mark.parametrize("loss", [_gather_loss, _item_loss])
def test_training_gradients_with_sizes_from_data(loss: Callable) -> None:
    """Backward graphs whose saved values have sizes read from data (a gather by nonzero, a slice
    and a cat by an item): gradients as eager's, at the size 0 and another."""
    fn = torch.compile(loss, backend="fuseg")
    w = torch.randn(3)
    for x, n in ((-torch.rand(4, 3), torch.tensor(0)), (torch.randn(4, 3), torch.tensor(3))):
        w1, w2 = w.clone().requires_grad_(), w.clone().requires_grad_()
        expected, got = loss(x, w1, n), fn(x, w2, n)
        expected.backward()
        got.backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(w2.grad, w1.grad)
