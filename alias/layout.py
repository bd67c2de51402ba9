"""A strided-layout algebra: the layout torch gives a view, or why a copy is needed.

A layout is sizes, strides (in elements), an absolute storage offset and a dtype. Each function
returns the layout of the view torch would make, or ``NeedsCopy(reason)`` where torch would copy
(``reshape``) or refuse (``view``). It follows ATen's own rules (``computeStride`` for view and
reshape, the clamping of ``slice``, ``inferUnsqueezeGeometry``, the itemsize rules of
``view(dtype)``, ``diagonal``, ``unfold``, ``view_as_real/complex``; the conj/neg bits of
``_conj``/``_neg_view``) and is property-tested against torch. Conservative: an op it does not model
is ``NeedsCopy``, never a guessed view.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from segmenter import TensorMeta

__all__ = [
    "Layout", "NeedsCopy", "alias", "apply_view_op", "as_strided", "conj", "diagonal", "expand", "narrow", "neg_view",
    "permute", "reshape", "select", "slice_", "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind",
    "unfold", "unsqueeze", "view", "view_as_complex", "view_as_real", "view_dtype",
]

_MAX = 2**63 - 1


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    conj: bool = False  # torch's lazy view bits (segmenter.ir.graph Note [conjugate and negative bits])
    neg: bool = False

    @classmethod
    def from_meta(cls, m: TensorMeta) -> Layout:
        return cls(m.shape, m.stride, m.storage_offset, m.dtype, m.conj, m.neg)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Layout:
        # a FakeTensor's symbolic offset is a SymInt, typed int as TensorMeta's fields are
        offset = cast(int, t.storage_offset())
        return cls(tuple(t.shape), tuple(t.stride()), offset, t.dtype, t.is_conj(), t.is_neg())

    def to_meta(self, device: str = "cpu") -> TensorMeta:
        return TensorMeta(self.shape, self.stride, self.offset, self.dtype, device, self.conj, self.neg)

    def matches(self, m: TensorMeta) -> bool:
        """``m`` is this layout, up to what cannot be observed (TensorMeta.same_layout)."""
        if (self.shape, self.dtype, self.conj, self.neg) != (m.shape, m.dtype, m.conj, m.neg):
            return False
        if 0 in self.shape:
            return True
        return self.offset == m.storage_offset and all(
            a == b for n, a, b in zip(self.shape, self.stride, m.stride) if n > 1)

    def moved(self, shape: Sequence[int], stride: Sequence[int], offset: int | None = None) -> Layout:
        """The same storage, dtype and bits, seen with other sizes, strides (and offset)."""
        return Layout(tuple(shape), tuple(stride), self.offset if offset is None else offset, self.dtype,
                      self.conj, self.neg)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class NeedsCopy:
    reason: str


Result = Layout | NeedsCopy


def _dim(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"dim {d} out of range for {ndim} dims")
    return d % n


def _infer(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError("only one dimension can be inferred")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or numel % known:
            raise ValueError(f"shape {shape} is invalid for {numel} elements")
        shape[shape.index(-1)] = numel // known
    if math.prod(shape) != numel:
        raise ValueError(f"shape {shape} is invalid for {numel} elements")
    return tuple(shape)


def _compute_stride(old: Sequence[int], old_stride: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """ATen's computeStride: the strides of a view of ``old`` with sizes ``new``, or None."""
    if not old:
        return (1,) * len(new)
    numel = math.prod(old)
    if numel == 0 and tuple(old) == tuple(new):
        return tuple(old_stride)
    out = [0] * len(new)
    if numel == 0:
        for d in range(len(new) - 1, -1, -1):
            out[d] = 1 if d == len(new) - 1 else max(new[d + 1], 1) * out[d + 1]
        return tuple(out)
    view_d = len(new) - 1
    chunk = old_stride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_numel *= old[d]
        if d == 0 or (old[d - 1] != 1 and old_stride[d - 1] != tensor_numel * chunk):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * chunk
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk = old_stride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(out) if view_d == -1 else None


def view(lay: Layout, shape: Sequence[int]) -> Result:
    new = _infer(shape, lay.numel)
    stride = _compute_stride(lay.shape, lay.stride, new)
    if stride is None:
        return NeedsCopy(f"view {list(lay.shape)} -> {list(new)} merges dims that are not contiguous with each other "
                         f"(strides {list(lay.stride)})")
    return lay.moved(new, stride)


reshape = view  # the same layout when a view is possible; otherwise torch copies


def permute(lay: Layout, dims: Sequence[int]) -> Layout:
    dims = [_dim(d, len(lay.shape)) for d in dims]
    return lay.moved([lay.shape[d] for d in dims], [lay.stride[d] for d in dims])


def transpose(lay: Layout, d0: int, d1: int) -> Layout:
    if not lay.shape:
        return lay
    order = list(range(len(lay.shape)))
    a, b = _dim(d0, len(order)), _dim(d1, len(order))
    order[a], order[b] = order[b], order[a]
    return permute(lay, order)


def t(lay: Layout) -> Layout:
    return lay if len(lay.shape) < 2 else transpose(lay, 0, 1)


def slice_(lay: Layout, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Layout:
    d = _dim(dim, len(lay.shape))
    size = lay.shape[d]
    start = 0 if start is None else start
    end = _MAX if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    shape, stride = list(lay.shape), list(lay.stride)
    shape[d] = (end - start + step - 1) // step
    offset = lay.offset + start * stride[d]
    stride[d] *= step
    return lay.moved(shape, stride, offset)


def narrow(lay: Layout, dim: int, start: int, length: int) -> Layout:
    d = _dim(dim, len(lay.shape))
    if start < 0:
        start += lay.shape[d]
    return slice_(lay, d, start, start + length)


def select(lay: Layout, dim: int, index: int) -> Layout:
    d = _dim(dim, len(lay.shape))
    if index < 0:
        index += lay.shape[d]
    return lay.moved(lay.shape[:d] + lay.shape[d + 1:], lay.stride[:d] + lay.stride[d + 1:],
                     lay.offset + index * lay.stride[d])


def expand(lay: Layout, sizes: Sequence[int]) -> Layout:
    """ATen's inferExpandGeometry: a broadcast dim gets stride 0; a new leading dim of size 1
    gets the stride a contiguous dim there would have."""
    nd = len(sizes)
    if nd < len(lay.shape):
        raise ValueError("expand cannot drop dims")
    shape, stride = [0] * nd, [0] * nd
    for i in range(nd - 1, -1, -1):
        d = len(lay.shape) - nd + i
        size = lay.shape[d] if d >= 0 else 1
        st = lay.stride[d] if d >= 0 else (shape[i + 1] * stride[i + 1] if i + 1 < nd else 1)
        want = size if sizes[i] == -1 else sizes[i]
        if size != want:
            if size != 1:
                raise ValueError(f"cannot expand size {size} to {want}")
            size, st = want, 0
        shape[i], stride[i] = size, st
    return lay.moved(shape, stride)


def squeeze(lay: Layout, dims: Sequence[int] | int | None = None) -> Layout:
    if dims is None:
        drop = {d for d, n in enumerate(lay.shape) if n == 1}
    else:
        dims = [dims] if isinstance(dims, int) else dims
        drop = {d for d in (_dim(x, len(lay.shape)) for x in dims) if lay.shape and lay.shape[d] == 1}
    keep = [d for d in range(len(lay.shape)) if d not in drop]
    return lay.moved([lay.shape[d] for d in keep], [lay.stride[d] for d in keep])


def unsqueeze(lay: Layout, dim: int) -> Layout:
    d = _dim(dim, len(lay.shape) + 1)
    new_stride = 1 if d >= len(lay.shape) else lay.shape[d] * lay.stride[d]
    return lay.moved(lay.shape[:d] + (1,) + lay.shape[d:], lay.stride[:d] + (new_stride,) + lay.stride[d:])


def split_with_sizes(lay: Layout, sizes: Sequence[int], dim: int = 0) -> tuple[Layout, ...]:
    d = _dim(dim, len(lay.shape))
    out, start = [], 0
    for n in sizes:
        out.append(slice_(lay, d, start, start + n))
        start += n
    return tuple(out)


def split(lay: Layout, size: int | Sequence[int], dim: int = 0) -> tuple[Layout, ...]:
    if not isinstance(size, int):
        return split_with_sizes(lay, size, dim)
    d = _dim(dim, len(lay.shape))
    n = lay.shape[d]
    chunks = max(1, -(-n // size)) if size else 1
    return split_with_sizes(lay, [min(size, n - i * size) for i in range(chunks)], d)


def unbind(lay: Layout, dim: int = 0) -> tuple[Layout, ...]:
    d = _dim(dim, len(lay.shape))
    return tuple(select(lay, d, i) for i in range(lay.shape[d]))


def alias(lay: Layout) -> Layout:
    return lay


def as_strided(lay: Layout, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Layout:
    return lay.moved(size, stride, storage_offset)


def view_dtype(lay: Layout, dtype: torch.dtype) -> Result:
    if lay.conj or lay.neg:
        return NeedsCopy("torch refuses view(dtype) of a tensor with the conjugate or negative bit")
    old, new = lay.dtype.itemsize, dtype.itemsize
    if old == new:
        return Layout(lay.shape, lay.stride, lay.offset, dtype)
    if not lay.shape:
        return NeedsCopy("view(dtype) of a 0-d tensor needs the same element size")
    if lay.stride[-1] != 1:
        return NeedsCopy("view(dtype) to another element size needs stride 1 in the last dim")
    if old > new:
        r = old // new
        return Layout(lay.shape[:-1] + (lay.shape[-1] * r,), tuple(s * r for s in lay.stride[:-1]) + (1,),
                      lay.offset * r, dtype)
    r = new // old
    if lay.shape[-1] % r or lay.offset % r or any(s % r for s in lay.stride[:-1]):
        return NeedsCopy(f"view(dtype) to a {r}x larger element needs the last size, the offset and the other "
                         "strides divisible by the ratio")
    return Layout(lay.shape[:-1] + (lay.shape[-1] // r,), tuple(s // r for s in lay.stride[:-1]) + (1,),
                  lay.offset // r, dtype)


def conj(lay: Layout) -> Result:
    """``_conj`` (and ``conj`` on complex values): the same view with the conjugate bit flipped."""
    if not lay.dtype.is_complex:
        return NeedsCopy("_conj of a non-complex tensor (torch asserts)")
    return dataclasses.replace(lay, conj=not lay.conj)


def neg_view(lay: Layout) -> Layout:
    return dataclasses.replace(lay, neg=not lay.neg)


def view_as_real(lay: Layout) -> Result:
    """Each complex element as two reals: a trailing dim of 2, strides and offset doubled."""
    if not lay.dtype.is_complex:
        return NeedsCopy("view_as_real of a non-complex tensor (torch refuses)")
    if lay.conj:
        return NeedsCopy("view_as_real of a conjugate view (torch refuses)")
    return Layout(lay.shape + (2,), tuple(2 * s for s in lay.stride) + (1,), 2 * lay.offset, lay.dtype.to_real(),
                  False, lay.neg)


def view_as_complex(lay: Layout) -> Result:
    """ATen's view_as_complex: a last dim of size 2 and stride 1 becomes one complex element."""
    if lay.dtype not in (torch.float16, torch.float32, torch.float64):
        return NeedsCopy(f"view_as_complex of a {lay.dtype} tensor (torch refuses)")
    if not lay.shape or lay.shape[-1] != 2 or lay.stride[-1] != 1:
        return NeedsCopy("view_as_complex needs a last dim of size 2 and stride 1")
    # a dim of size 1 is never stepped along: torch checks no stride of one (and halves it all the same)
    if lay.offset % 2 or any(s % 2 for s, n in zip(lay.stride[:-1], lay.shape[:-1]) if n != 1):
        return NeedsCopy("view_as_complex needs the offset and the other strides even")
    return Layout(lay.shape[:-1], tuple(s // 2 for s in lay.stride[:-1]), lay.offset // 2, lay.dtype.to_complex(),
                  False, lay.neg)


def diagonal(lay: Layout, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Layout:
    """ATen's diagonal: dims ``dim1`` and ``dim2`` go, a last dim walks both at once (stride the
    sum of theirs), starting ``offset`` above (or below) the main diagonal."""
    nd = len(lay.shape)
    d1, d2 = _dim(dim1, nd), _dim(dim2, nd)
    if d1 == d2:
        raise ValueError("diagonal dimensions cannot be identical")
    n1, n2 = lay.shape[d1], lay.shape[d2]
    size = max(min(n1, n2 - offset), 0) if offset >= 0 else max(min(n1 + offset, n2), 0)
    start = lay.offset
    if size:  # ATen leaves the offset alone for an empty diagonal
        start += offset * lay.stride[d2] if offset >= 0 else -offset * lay.stride[d1]
    keep = [d for d in range(nd) if d not in (d1, d2)]
    return lay.moved([lay.shape[d] for d in keep] + [size],
                     [lay.stride[d] for d in keep] + [lay.stride[d1] + lay.stride[d2]], start)


def unfold(lay: Layout, dim: int, size: int, step: int) -> Layout:
    """ATen's unfold: windows of ``size`` every ``step`` along ``dim``, as a new last dim."""
    nd = len(lay.shape)
    d = _dim(dim, nd)
    limit = lay.shape[d] if nd else 1
    if not 0 <= size <= limit or step <= 0:
        raise ValueError(f"unfold: size {size} / step {step} out of range for a dim of {limit}")
    shape, stride = list(lay.shape), list(lay.stride)
    shape.append(size)
    stride.append(lay.stride[d] if nd else 1)
    if nd:
        shape[d] = (shape[d] - size) // step + 1
        stride[d] *= step
    return lay.moved(shape, stride)


def apply_view_op(lay: Layout, op: str, args: Sequence[object], kwargs: dict[str, object] | None = None
                  ) -> Layout | tuple[Layout, ...] | NeedsCopy:
    """The layout(s) an ATen view op gives; ``args`` are the op's arguments after the tensor."""
    kw = dict(kwargs or {})
    a = list(args)

    def arg(i: int, name: str, default: object = None) -> object:
        return a[i] if i < len(a) else kw.get(name, default)

    try:
        if op in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"):
            return view(lay, arg(0, "size"))  # type: ignore[arg-type]
        if op == "aten.view.dtype":
            return view_dtype(lay, arg(0, "dtype"))  # type: ignore[arg-type]
        if op == "aten.permute.default":
            return permute(lay, arg(0, "dims"))  # type: ignore[arg-type]
        if op == "aten.transpose.int":
            return transpose(lay, arg(0, "dim0"), arg(1, "dim1"))  # type: ignore[arg-type]
        if op == "aten.t.default":
            return t(lay)
        if op == "aten.slice.Tensor":
            return slice_(lay, arg(0, "dim", 0), arg(1, "start"), arg(2, "end"), arg(3, "step", 1))  # type: ignore[arg-type]
        if op == "aten.narrow.default":
            return narrow(lay, arg(0, "dim"), arg(1, "start"), arg(2, "length"))  # type: ignore[arg-type]
        if op == "aten.select.int":
            return select(lay, arg(0, "dim"), arg(1, "index"))  # type: ignore[arg-type]
        if op == "aten.expand.default":
            return expand(lay, arg(0, "size"))  # type: ignore[arg-type]
        if op in ("aten.squeeze.dim", "aten.squeeze.dims"):
            return squeeze(lay, arg(0, "dim"))  # type: ignore[arg-type]
        if op == "aten.squeeze.default":
            return squeeze(lay)
        if op == "aten.unsqueeze.default":
            return unsqueeze(lay, arg(0, "dim"))  # type: ignore[arg-type]
        if op == "aten.split.Tensor":
            return split(lay, arg(0, "split_size"), arg(1, "dim", 0))  # type: ignore[arg-type]
        if op == "aten.split_with_sizes.default":
            return split_with_sizes(lay, arg(0, "split_sizes"), arg(1, "dim", 0))  # type: ignore[arg-type]
        if op == "aten.unbind.int":
            return unbind(lay, arg(0, "dim", 0))  # type: ignore[arg-type]
        if op in ("aten.alias.default", "aten.detach.default", "aten.lift_fresh.default"):
            return alias(lay)
        if op == "aten.as_strided.default":
            return as_strided(lay, arg(0, "size"), arg(1, "stride"), arg(2, "storage_offset"))  # type: ignore[arg-type]
        if op == "aten._conj.default" or (op == "aten.conj.default" and lay.dtype.is_complex):
            return conj(lay)
        if op == "aten.conj.default":
            return alias(lay)
        if op == "aten._neg_view.default":
            return neg_view(lay)
        if op == "aten.view_as_real.default":
            return view_as_real(lay)
        if op == "aten.view_as_complex.default":
            return view_as_complex(lay)
        if op == "aten.diagonal.default":
            return diagonal(lay, arg(0, "offset", 0), arg(1, "dim1", 0), arg(2, "dim2", 1))  # type: ignore[arg-type]
        if op == "aten.unfold.default":
            return unfold(lay, arg(0, "dimension"), arg(1, "size"), arg(2, "step"))  # type: ignore[arg-type]
    except (ValueError, IndexError, TypeError) as e:
        return NeedsCopy(f"{op}: {e}")
    if op == "aten.clone.default":
        return NeedsCopy("clone always copies")
    return NeedsCopy(f"not a view op the algebra models: {op}")
