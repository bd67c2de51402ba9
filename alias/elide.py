"""Copy elision: a copy-only segment whose output only feeds kernels becomes a metadata op.

Note [copy elision]: ``clone`` (what ``contiguous`` and ``reshape`` leave in a core-ATen graph)
makes a contiguous copy that the next kernel reads. Every kernel path here reads arbitrary
strides, so the copy is pure cost, when three things hold: nothing outside the program sees the
value (not a graph output, not a write-back); the views after it still exist on the strided
layout (``x.t().contiguous().view(-1)`` needs its copy); and no value any kernel computes changes
layout because of it (graph outputs keep eager's strides). The clone becomes ``aten.alias``, the
metas are propagated again with FakeTensors, and the rewrite is kept only if every value made by
a non-view op has exactly its old layout.
"""

from __future__ import annotations

import dataclasses

from segmenter import FusionGraph, GraphError, Node, OpKind, SegmentKind, op_info
from segmenter.capturing.meta import propagate_metas

__all__ = ["elide_copies"]

_COPIES = frozenset({"aten.clone.default"})
_KERNELS = frozenset({SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION, SegmentKind.MATMUL})

Parts = list[tuple[SegmentKind, list[Node]]]


def _candidates(graph: FusionGraph, parts: Parts) -> list[int]:
    external = graph.external_values
    part_of = {n.name: k for k, (_, nodes) in enumerate(parts) for n in nodes}
    found = []
    for k, (kind, nodes) in enumerate(parts):
        if kind != SegmentKind.POINTWISE or not any(n.op in _COPIES for n in nodes):
            continue
        if not all(n.op in _COPIES or op_info(n.op).kind == OpKind.VIEW for n in nodes):
            continue
        outs = [o for n in nodes for o in n.outputs if o is not None]
        if any(o in external for o in outs):
            continue
        consumers = {part_of[u.name] for o in outs for u in graph.users.get(o, ())} - {k}
        if consumers and all(parts[c][0] in _KERNELS for c in consumers):
            found.append(k)
    return found


def _try(graph: FusionGraph, parts: Parts, chosen: list[int]) -> FusionGraph | None:
    names = {n.name for k in chosen for n in parts[k][1] if n.op in _COPIES}
    nodes = tuple(
        dataclasses.replace(n, op="aten.alias.default", args=n.args[:1], kwargs=()) if n.name in names else n
        for n in graph.nodes
    )
    try:
        fresh = propagate_metas(dataclasses.replace(graph, nodes=nodes))
    except GraphError:
        return None  # a view after the copy needs the contiguous layout
    for old, new in zip(graph.nodes, fresh.nodes):
        if op_info(new.op).kind == OpKind.VIEW or new.name in names:
            continue
        if any(a is not None and (b is None or not a.same_layout(b)) for a, b in zip(old.metas, new.metas)):
            return None  # a kernel's output would change layout
    return fresh


def elide_copies(graph: FusionGraph, parts: Parts) -> tuple[FusionGraph, Parts, list[tuple[str, str]]]:
    """The graph and parts with elidable copy-only segments turned into metadata."""
    candidates = _candidates(graph, parts)
    if not candidates:
        return graph, parts, []
    accepted: list[int] = []
    fresh = _try(graph, parts, candidates)
    if fresh is not None:
        accepted = candidates
    else:  # one at a time, keeping what works
        for k in candidates:
            attempt = _try(graph, parts, [*accepted, k])
            if attempt is not None:
                accepted.append(k)
                fresh = attempt
    if not accepted or fresh is None:
        return graph, parts, []
    by_name = {n.name: n for n in fresh.nodes}
    new_parts: Parts = [
        (SegmentKind.METADATA if k in accepted else kind, [by_name[n.name] for n in nodes])
        for k, (kind, nodes) in enumerate(parts)
    ]
    elided = [(o, "copy only feeds kernels that read the strided layout: elided")
              for k in accepted for n in parts[k][1] if n.op in _COPIES for o in n.outputs if o is not None]
    return fresh, new_parts, elided
