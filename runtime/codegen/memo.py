"""Lowering each distinct segment once per program.

Note [lowering memo]: a model repeats its layers, so most of its kernel segments are the same
kernel over other values: on the 100k-node synthetic transformer, 19446 cpp segments lower to a
few dozen distinct kernels, and lowering them one by one (meta checks, index math, source text)
was 3-4 of the 6.4 s ``runtime.compile`` took. ``lower_memo`` lowers a segment whose structure
was seen before by renaming the values of the earlier kernel instead.

The key is everything the lowering reads, with the segment's values renumbered in order of first
appearance (inputs, then each node's outputs): per node its op, its arguments and keywords (a
literal by type and ``repr``, so 1, 1.0, True, 0.0 and -0.0 are different keys), its output
slots and their recorded metas; per input its meta; the planned layout of every input and
output. Graph-level facts enter the lowering only through in-place writes (which inputs a kernel
writes, and which values are views of them): segments with an in-place target are lowered on
their own, never memoized, as are segments whose lowering declined (a reason names a node).
"""

from __future__ import annotations

import dataclasses

from segmenter import FusionGraph, Segment
from segmenter.ir.graph import OpRef, ValueRef

from .kernel import Kernel, Param
from .lowering.lower import lower_segment

__all__ = ["lower_memo", "segment_key"]


def segment_key(graph: FusionGraph, seg: Segment, layouts: dict, order: tuple[str, ...] | None = None) -> tuple | None:
    """The structure of ``seg`` with its values renumbered (``order``: ``_order(seg)``, when the
    caller has it), or None where it has none we trust (an argument of a type we do not know how
    to key)."""
    local = {v: i for i, v in enumerate(_order(seg) if order is None else order)}

    def arg(a: object) -> object:
        t = type(a)
        if t is ValueRef:
            name = a.name  # type: ignore[attr-defined]
            return ("%", local[name]) if name in local else ("%?", name)
        if t is tuple:
            return ("L", tuple(map(arg, a)))  # type: ignore[call-overload]
        if t is int or t is bool or t is str or a is None:
            return (t.__name__, a)
        return _other(a)

    def _other(a: object) -> object:
        if isinstance(a, ValueRef):
            return ("%", local[a.name]) if a.name in local else ("%?", a.name)
        if isinstance(a, tuple):
            return ("L", tuple(arg(x) for x in a))
        if isinstance(a, (float, complex)):
            return (type(a).__name__, repr(a))
        if a is None or isinstance(a, (bool, int, str, OpRef)) or type(a).__module__ == "torch":
            return (type(a).__name__, a)
        raise TypeError(type(a).__name__)

    metas = graph.metas
    try:
        nodes = tuple(
            (n.op, arg(n.args), tuple((k, arg(v)) for k, v in n.kwargs),
             tuple(None if o is None else local[o] for o in n.outputs), n.metas)
            for n in seg.nodes)
        key = (seg.kind, nodes, tuple(metas[v] for v in seg.inputs),
               tuple(sorted((local[v], lay) for v, lay in layouts.items() if v in local)),
               tuple(local[o] for o in seg.outputs))
        hash(key)
    except (TypeError, KeyError):
        return None
    return key


def lower_memo(memo: dict, graph: FusionGraph, seg: Segment, layouts: dict,
               in_place: dict[str, str] | None = None) -> Kernel:
    """``lower_segment``, reusing the kernel of an earlier segment of the same structure
    (Note [lowering memo]); ``memo`` lives as long as one program's compilation."""
    if in_place:
        return lower_segment(graph, seg, layouts, in_place)
    order = _order(seg)
    key = segment_key(graph, seg, layouts, order)
    if key is None:
        return lower_segment(graph, seg, layouts)
    hit = memo.get(key)
    if hit is None:
        kernel = lower_segment(graph, seg, layouts)  # a Declined propagates and is not kept
        position = {v: i for i, v in enumerate(order)}
        memo[key] = (kernel, tuple((p, position[p.value]) for p in kernel.params))
        return kernel
    kernel, params = hit
    # the same kernel over this segment's values: each parameter renamed by its position
    return dataclasses.replace(kernel, params=tuple(
        Param(p.name, order[i], p.dtype, p.shape, p.stride, p.output, p.target) for p, i in params))


def _order(seg: Segment) -> tuple[str, ...]:
    """The segment's values in the order ``segment_key`` numbers them."""
    seen: dict[str, None] = dict.fromkeys(seg.inputs)
    for n in seg.nodes:
        for o in n.outputs:
            if o is not None:
                seen.setdefault(o, None)
    return tuple(seen)
