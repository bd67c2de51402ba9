"""The strided-layout algebra, against torch: a table of named cases, and random op chains."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alias.layout import Layout, NeedsCopy, apply_view_op, view_dtype

F32, F64 = torch.float32, torch.float64


def L(t: torch.Tensor) -> Layout:
    return Layout.from_tensor(t)


def test_conj_bits_and_complex_views() -> None:
    x = torch.empty(3, 4, dtype=torch.complex64)[1:]
    c = apply_view_op(L(x), "aten._conj.default", ())
    assert c == L(x.conj()) and c.conj
    assert isinstance(apply_view_op(c, "aten.view_as_real.default", ()), NeedsCopy)  # torch refuses too
    n = apply_view_op(L(x), "aten._neg_view.default", ())
    assert n == L(torch._neg_view(x)) and n.neg
    r = apply_view_op(n, "aten.view_as_real.default", ())
    assert r == L(torch.view_as_real(torch._neg_view(x)))
    assert apply_view_op(r, "aten.view_as_complex.default", ()) == n
    assert isinstance(apply_view_op(c, "aten.view.dtype", (torch.float64,)), NeedsCopy)
    assert isinstance(apply_view_op(L(torch.empty(3)), "aten._conj.default", ()), NeedsCopy)


def test_view_as_complex_ignores_the_strides_of_size_1_dims() -> None:
    """Found by test_random_view_chains_agree_with_torch: torch views a [1, 2] tensor of strides
    (1, 1) as complex (stride 1 // 2 = 0) where the algebra said copy."""
    base = torch.empty(16)
    for shape, stride in [((1, 2), (1, 1)), ((1, 2), (7, 1)), ((3, 1, 2), (2, 5, 1))]:
        x = base.as_strided(shape, stride)
        assert apply_view_op(L(x), "aten.view_as_complex.default", ()) == L(torch.view_as_complex(x))
    x = base.as_strided((2, 2), (1, 1))  # torch refuses an odd stride of a dim of size 2
    assert isinstance(apply_view_op(L(x), "aten.view_as_complex.default", ()), NeedsCopy)


def test_slice_then_view_dtype_from_the_issue() -> None:
    got = view_dtype(L(torch.empty(4, 8)[:, 2:6]), F64)
    assert got == Layout((4, 2), (4, 1), 1, F64)


CASES = [
    # name, torch program on a real tensor, the same as (op, args) steps
    ("reshape-of-transpose-copies", lambda x: x.t().reshape(-1), [("aten.t.default", ()), ("aten.reshape.default", ((-1,),))]),
    ("reshape-of-expand-copies", lambda x: x[:1].expand(3, 8).reshape(-1),
     [("aten.slice.Tensor", (0, 0, 1)), ("aten.expand.default", ((3, 8),)), ("aten.reshape.default", ((-1,),))]),
    ("split-a-dim-of-a-slice", lambda x: x[:, 2:6].view(4, 2, 2),
     [("aten.slice.Tensor", (1, 2, 6)), ("aten.view.default", ((4, 2, 2),))]),
    ("slice-step-2-negative-start", lambda x: x[:, -7::2], [("aten.slice.Tensor", (1, -7, 2**63 - 1, 2))]),
    ("select-negative-index", lambda x: x.select(0, -1), [("aten.select.int", (0, -1))]),
    ("unsqueeze-at-the-end", lambda x: x[:, 1:3].unsqueeze(-1),
     [("aten.slice.Tensor", (1, 1, 3)), ("aten.unsqueeze.default", (-1,))]),
    ("as-strided-absolute-offset", lambda x: x[1:].as_strided((2, 2), (1, 8), 5),
     [("aten.slice.Tensor", (0, 1)), ("aten.as_strided.default", ((2, 2), (1, 8), 5))]),
    ("size-0-slice-then-view", lambda x: x[:, 8:].view(0, 4),
     [("aten.slice.Tensor", (1, 8)), ("aten.view.default", ((0, 4),))]),
    ("diagonal-offset-above", lambda x: x[1:].diagonal(2), [("aten.slice.Tensor", (0, 1)), ("aten.diagonal.default", (2,))]),
    ("diagonal-offset-below-transposed", lambda x: x.t().diagonal(-1, 1, 0),
     [("aten.t.default", ()), ("aten.diagonal.default", (-1, 1, 0))]),
    ("diagonal-empty-keeps-offset", lambda x: x[1:].diagonal(9), [("aten.slice.Tensor", (0, 1)), ("aten.diagonal.default", (9,))]),
    ("unfold-windows", lambda x: x[:, 1:].unfold(1, 3, 2), [("aten.slice.Tensor", (1, 1)), ("aten.unfold.default", (1, 3, 2))]),
    ("neg-view", lambda x: torch._neg_view(x[1:]), [("aten.slice.Tensor", (0, 1)), ("aten._neg_view.default", ())]),
    ("view-as-complex", lambda x: torch.view_as_complex(x.view(4, 4, 2)[1:]),
     [("aten.view.default", ((4, 4, 2),)), ("aten.slice.Tensor", (0, 1)), ("aten.view_as_complex.default", ())]),
    ("view-as-complex-odd-offset-copies", lambda x: torch.view_as_complex(x.view(32)[1:31].view(15, 2)).clone(),
     [("aten.view.default", ((32,),)), ("aten.slice.Tensor", (0, 1, 31)), ("aten.view.default", ((15, 2),)),
      ("aten.view_as_complex.default", ())]),
    ("size-1-dims", lambda x: x[:1, :1].view(1, 1, 1).squeeze(1),
     [("aten.slice.Tensor", (0, 0, 1)), ("aten.slice.Tensor", (1, 0, 1)), ("aten.view.default", ((1, 1, 1),)),
      ("aten.squeeze.dim", (1,))]),
]


@pytest.mark.parametrize("name,program,steps", CASES, ids=[c[0] for c in CASES])
def test_table(name, program, steps) -> None:
    x = torch.empty(4, 8)
    lay: Layout | NeedsCopy = L(x)
    for op, args in steps:
        assert isinstance(lay, Layout)
        lay = apply_view_op(lay, op, args)
    try:
        y = program(x)
    except RuntimeError:  # torch refuses the view: the algebra must say so too
        assert isinstance(lay, NeedsCopy), lay
        return
    if y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        assert lay == L(y)
    else:
        assert isinstance(lay, NeedsCopy), lay


# -- random chains -----------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.int32, torch.bfloat16, torch.uint8, torch.complex64]


@st.composite
def start_tensor(draw: st.DrawFn) -> torch.Tensor:
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    numel = math.prod(shape)
    offset = draw(st.integers(0, 3))
    buf = torch.empty(offset + max(numel, 1) + 64,
                      dtype=draw(st.sampled_from([torch.float32, torch.float64, torch.complex64])))
    x = buf[offset:offset + numel].view(shape)
    if len(shape) >= 2 and draw(st.booleans()):
        x = x.transpose(0, -1)
    return x


def _candidates(draw: st.DrawFn, x: torch.Tensor) -> tuple[str, tuple]:
    nd, shape = x.dim(), tuple(x.shape)
    choices = ["view", "reshape", "unsqueeze", "view_dtype"]
    if nd:
        choices += ["permute", "slice", "squeeze", "split", "expand", "narrow"]
        if any(shape):
            choices.append("select")
    choices += ["neg_view", "unfold"]
    if x.dtype.is_complex:
        choices += ["conj", "view_as_real"]
    if nd and shape[-1] == 2:
        choices.append("view_as_complex")
    if nd >= 2:
        choices.append("diagonal")
    kind = draw(st.sampled_from(choices))
    dim = draw(st.integers(-nd, nd - 1)) if nd else 0
    if kind == "neg_view":
        return "aten._neg_view.default", ()
    if kind == "conj":
        return "aten._conj.default", ()
    if kind == "view_as_real":
        return "aten.view_as_real.default", ()
    if kind == "view_as_complex":
        return "aten.view_as_complex.default", ()
    if kind == "diagonal":
        d2 = draw(st.sampled_from([d for d in range(-nd, nd) if d % nd != dim % nd]))
        return "aten.diagonal.default", (draw(st.integers(-4, 4)), dim, d2)
    if kind == "unfold":
        limit = shape[dim] if nd else 1
        return "aten.unfold.default", (dim, draw(st.integers(0, limit)), draw(st.integers(1, 3)))
    if kind in ("view", "reshape"):
        numel = x.numel()
        options = [(-1,), shape[::-1], (1, *shape), shape + (1,)]
        if nd >= 2:
            options.append(shape[:-2] + (shape[-2] * shape[-1],))
        if nd and shape[0] % 2 == 0 and shape[0]:
            options.append((2, shape[0] // 2) + shape[1:])
        new = draw(st.sampled_from(options))
        if math.prod(s for s in new if s != -1) == 0 and -1 in new:
            new = tuple(0 if s == -1 else s for s in new)
        if -1 not in new and math.prod(new) != numel:
            new = (-1,)
        return ("aten.view.default" if kind == "view" else "aten.reshape.default", (new,))
    if kind == "unsqueeze":
        return "aten.unsqueeze.default", (draw(st.integers(-nd - 1, nd)),)
    if kind == "view_dtype":
        return "aten.view.dtype", (draw(st.sampled_from(DTYPES)),)
    if kind == "permute":
        return "aten.permute.default", (tuple(draw(st.permutations(range(nd)))),)
    if kind == "slice":
        s = shape[dim]
        start = draw(st.one_of(st.none(), st.integers(-s - 2, s + 2)))
        end = draw(st.one_of(st.none(), st.integers(-s - 2, s + 2), st.just(2**63 - 1)))
        return "aten.slice.Tensor", (dim, start, end, draw(st.integers(1, 3)))
    if kind == "narrow":
        s = shape[dim]
        start = draw(st.integers(-s, s)) if s else 0
        length = draw(st.integers(0, max(0, s - (start % s if s else 0))))
        return "aten.narrow.default", (dim, start, length)
    if kind == "squeeze":
        return "aten.squeeze.dim", (dim,)
    if kind == "split":
        return "aten.split.Tensor", (draw(st.integers(1, 3)), dim)
    if kind == "expand":
        sizes = [draw(st.integers(0, 3)) if n == 1 else draw(st.sampled_from([n, -1])) for n in shape]
        lead = draw(st.lists(st.integers(1, 2), max_size=1))
        return "aten.expand.default", (tuple(lead + sizes),)
    dim = draw(st.sampled_from([d for d in range(nd) if shape[d]]))
    return "aten.select.int", (dim, draw(st.integers(-shape[dim], shape[dim] - 1)))


def _torch(x: torch.Tensor, op: str, args: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
    return getattr(getattr(torch.ops.aten, op.split(".")[1]), op.split(".")[2])(x, *args)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_view_chains_agree_with_torch(data: st.DataObject) -> None:
    x = data.draw(start_tensor())
    lay: Layout = L(x)
    for _ in range(data.draw(st.integers(1, 5))):
        op, args = _candidates(data.draw, x)
        ours = apply_view_op(lay, op, args)
        try:
            theirs = _torch(x, op, args)
        except RuntimeError:
            # torch refused: the algebra must not claim a view (for these it must say copy)
            if op in ("aten.view.default", "aten.view.dtype", "aten.view_as_real.default",
                      "aten.view_as_complex.default"):
                assert isinstance(ours, NeedsCopy), (op, args, lay, ours)
            return
        if isinstance(theirs, (tuple, list)):
            assert isinstance(ours, tuple) and len(ours) == len(theirs)
            for a, b in zip(ours, theirs):
                assert a == L(b), (op, args)
            if not theirs:
                return
            k = data.draw(st.integers(0, len(theirs) - 1))
            x, lay = theirs[k], ours[k]
            continue
        same_storage = theirs.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and (
            theirs.untyped_storage().nbytes() == x.untyped_storage().nbytes())
        if isinstance(ours, NeedsCopy):
            assert not same_storage or theirs.numel() == 0, (op, args, lay, L(theirs))  # torch copied too
            return
        assert same_storage, (op, args, "the algebra claims a view; torch copied")
        assert ours == L(theirs), (op, args, lay)
        x, lay = theirs, ours
