"""Which storage elements a strided layout addresses, compared between two layouts.

A layout change of an input (``a.as_strided_(...)``, Note [metadata mutation]) is captured only
when the new layout addresses no storage element the old one did not: those elements are all a
functional graph over the input knows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # annotations only: graph.py imports this module
    from .graph import TensorMeta

__all__ = ["within"]


# Storage regions up to this many elements are compared element by element; beyond it only a
# dense outer layout is decided (anything else is "not within": the safe answer).
_WITHIN_LIMIT = 1 << 24


def within(inner: TensorMeta, outer: TensorMeta) -> bool:
    """True when every storage element ``inner`` addresses is one that ``outer`` addresses."""
    if inner.numel == 0:
        return True
    if outer.numel == 0:
        return False

    def span(m: TensorMeta) -> tuple[int, int]:
        lo = m.storage_offset + sum(min(0, (n - 1) * s) for n, s in zip(m.shape, m.stride))
        hi = m.storage_offset + sum(max(0, (n - 1) * s) for n, s in zip(m.shape, m.stride))
        return lo, hi

    lo, hi = span(inner)
    olo, ohi = span(outer)
    if lo < olo or hi > ohi:
        return False
    dims = sorted((abs(s), n) for n, s in zip(outer.shape, outer.stride) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            break
        expected *= n
    else:
        return True  # outer is dense: it addresses every element of its span
    if ohi - olo + 1 > _WITHIN_LIMIT or hi - lo + 1 > _WITHIN_LIMIT:
        return False
    mask = torch.zeros(ohi - olo + 1, dtype=torch.bool)
    mask[_positions(outer) - olo] = True
    return bool(mask[_positions(inner) - olo].all())


def _positions(m: TensorMeta) -> torch.Tensor:
    pos = torch.full((), m.storage_offset, dtype=torch.int64)
    for n, s in zip(m.shape, m.stride):
        pos = pos.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
    return pos.reshape(-1)
