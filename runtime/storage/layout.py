"""Layout helpers every backend shares: making a tensor hold its planned layout.

Every value a launch hands on has the layout the plan was compiled for (Note [planned layouts]):
the strides of its dims with more than one element, its shape and its dtype, exactly as the
graph's metas say. A launch whose tensor comes back otherwise (a torch op that picks other
strides, a size-1 dim with another stride) conforms it here: a free restride where only size-1
dims differ, a copy into a fresh buffer of the planned layout where real strides differ.

Note [planned layouts]: because every launch conforms what it makes, a generated kernel may
read any value it is handed with the strides it was compiled for; the run-time layout guard in
front of a kernel (runtime/backends/kernels.py) only catches what was not made by the program
(graph inputs handed to one launch directly, in tests), and a graph whose metas lie (a dtype or
shape torch does not produce) is refused at the first value that contradicts them.
"""

from __future__ import annotations

import torch

from segmenter import GraphError, TensorMeta
from segmenter.capturing.reference import fresh_in_layout

# the stride rules live in codegen/source/index.py (the generator needs them without torch); re-exported here
from ..codegen.source.index import contiguous_strides, dense_strides

__all__ = ["conform", "contiguous_strides", "dense_copy", "dense_strides", "empty_fn", "ensure", "fresh_in_layout",
           "reinterpret", "reinterpret_fn", "same_strides"]

try:  # the C++ fast path Inductor's wrapper uses (no dispatcher round trip): 2x cheaper than as_strided
    from torch._C._dynamo.guards import _reinterpret_tensor as _reinterpret
except ImportError:  # pragma: no cover - older/newer torch without it
    _reinterpret = None
try:
    from torch._C._dynamo.guards import _empty_strided_cpu as _empty_cpu
except ImportError:  # pragma: no cover
    _empty_cpu = None


def reinterpret(t: torch.Tensor, shape: tuple[int, ...], stride: tuple[int, ...], delta: int) -> torch.Tensor:
    """A view of ``t``'s storage with this shape and stride, ``delta`` elements after ``t``'s own
    offset (``as_strided``, without the dispatcher where torch offers it: not for tensors that
    require grad, whose views autograd must see)."""
    if _reinterpret is not None and not t.requires_grad:
        return _reinterpret(t, shape, stride, delta)
    return t.as_strided(shape, stride, t.storage_offset() + delta)


def reinterpret_fn(fast: bool):
    """What a program variant calls to make a view (Note [fast and safe programs] in runtime/compiled/program.py)."""
    return _reinterpret if fast and _reinterpret is not None else reinterpret


def empty_fn(fast: bool, device: torch.device):
    """``(shape, stride, dtype) -> tensor`` for a program variant: the allocation Inductor's CPU
    wrapper uses where no dispatch mode may need to see it, ``torch.empty_strided`` otherwise."""
    if fast and device.type == "cpu" and _empty_cpu is not None:
        return _empty_cpu
    return lambda shape, stride, dtype: torch.empty_strided(shape, stride, dtype=dtype, device=device)


def same_strides(t: torch.Tensor, m: TensorMeta) -> bool:
    """Same shape, and the same strides wherever a dim has more than one element."""
    return tuple(t.shape) == m.shape and all(a == b for n, a, b in zip(m.shape, t.stride(), m.stride) if n > 1)


def dense_copy(t: torch.Tensor, m: TensorMeta) -> torch.Tensor:
    """A fresh dense buffer holding ``t``, dims in the planned order (a plain ``.contiguous()``
    would turn a permuted layout, e.g. CUDA attention's output, into one a later view cannot take)."""
    return m.with_bits(torch.empty_strided(m.shape, dense_strides(m.shape, m.stride), dtype=m.dtype,
                                           device=t.device)).copy_(t)


def conform(t: torch.Tensor, m: TensorMeta, what: str) -> torch.Tensor:
    """``t`` in the planned layout ``m`` (see Note [planned layouts]); ``what`` names the value
    for the error a lying graph gets."""
    if not isinstance(t, torch.Tensor):
        raise GraphError(f"{what}: the op returned {type(t).__name__}, the graph says a tensor {m}")
    if t.dtype != m.dtype or tuple(t.shape) != m.shape:
        raise GraphError(f"{what}: the op made {str(t.dtype).removeprefix('torch.')}{list(t.shape)}, "
                         f"the graph says {m}")
    bits = t.is_conj() == m.conj and t.is_neg() == m.neg
    if t.stride() == m.stride and bits:
        return t
    if same_strides(t, m) and bits:  # only size-1 dims differ: same addresses, planned strides
        return reinterpret(t, m.shape, m.stride, 0)
    return fresh_in_layout(t, m)  # with the planned bits (Note [conjugate and negative bits])


def ensure(t: torch.Tensor, spec: tuple) -> torch.Tensor:
    """``conform(t, m, what)`` behind a cheap test of the usual case (``t`` already has the planned
    strides, shape and dtype): ``spec`` is ``(m.stride, m.shape, m.dtype, m, what)``, built once
    per value when the program is compiled. One call per value, not an inline ``if``: Python's
    ``compile()`` of the 100k-node program spent 0.9 of its 2.1 s on 22k inline tests (a call
    costs ~15 ns more per run)."""
    stride, shape, dtype, m, what = spec
    try:
        if t.stride() == stride and t.shape == shape and t.dtype == dtype:
            return t
    except AttributeError:  # not a tensor: conform says so
        pass
    return conform(t, m() if callable(m) else m, what)  # (a symbolic plan's meta is made when needed)

