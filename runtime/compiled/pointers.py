"""Views that only generated kernels read, passed to them as pointers: no view tensor is made.

Note [views passed as pointers]: a METADATA segment's output is made as a tensor
(``reinterpret``, ~0.45 us a call) although a generated C++ kernel reads nothing of it but its
data pointer (the kernel was compiled for the planned layout: Note [planned layouts] in
runtime/storage/layout.py). llama-tiny's program made 71 views a call, 28 of them read only that way. In
the fast program such a view is not made: each kernel that reads it is handed its source's
pointer plus the view's offset in bytes, which is what the view's own ``data_ptr()`` would
return (the view is made from the plan: one strided view of its source, at an offset from the
source's, same dtype, inside the source's extent: Note [views from the plan] in runtime/emit/views.py).

A view is passed so only where nothing else could see the difference: every launch that reads it
is a generated kernel that takes pointers (``reads_pointers``) in a segment run on every call
(not folded); it is no output of the program, no input, constant or value read after the program
(``keep``), no value crossing launches as a dense copy (``pre``/``off``), and neither it nor its
source carries a conjugate or negative bit. The view tensor kept its source's storage alive until
its own last use; the source now lives until the last use of every view passed as its pointer
(``last_uses`` reads each such view as its source). The safe program variant and a launch run on
its own (``Launch.run``, which checks each input's layout) still make every view.

A gather at constant affine indices (Note [gathers at constant affine indices] in
runtime/compiled/gather.py) copies one strided view of its source; where that view has the output's
planned strides (llama's mask reads ``x[0, 0:16]`` of a [1, 16] tensor, four times a call), the
kernels that read the copy read the source there instead, under the same conditions, and one more:
the source is no graph input, nor a view of one (only graph inputs are ever written during a
program: Note [in-place write-back]), so nothing changes the elements between the gather's place
and the kernels'.
"""

from __future__ import annotations

from collections.abc import Mapping

from segmenter import FusionGraph, SegmentedFusion, SegmentKind
from segmenter.ir.graph import view_roots

from ..emit.views import metadata_views

__all__ = ["last_uses", "pointer_views"]

#: view -> (its source, bytes from the source's first element to the view's)
Pointers = dict[str, tuple[str, int]]


def pointer_views(plan: SegmentedFusion, launches: Mapping[int, object], folded: frozenset[int],
                  keep: set[str], materialize: frozenset[str]) -> Pointers:
    """See Note [views passed as pointers]: the views of the fast program that are not made, and the
    gathers not copied."""
    if not any(getattr(launch, "reads_pointers", False) for launch in launches.values()):
        return {}  # no kernel that takes pointers (the torch backend): nothing to pass
    graph: FusionGraph = plan.graph
    inputs = set(graph.input_names)
    roots = view_roots(graph)
    readers: dict[str, list[int]] = {}
    for seg in plan.segments:
        for v in seg.inputs:
            readers.setdefault(v, []).append(seg.index)

    def only_kernels_read(v: str) -> bool:
        users = readers.get(v, [])
        return bool(users) and all(i not in folded and getattr(launches.get(i), "reads_pointers", False)
                                   for i in users)

    found: Pointers = {}
    for seg in plan.segments:
        if seg.index in folded:
            continue
        gather = getattr(launches.get(seg.index), "in_place_of_copy", None)
        if gather is not None:  # a copy of elements that lie at the planned layout in their source
            o, where = seg.outputs[0], gather()
            if (where is not None and roots.get(where[0], where[0]) not in inputs and o not in keep
                    and only_kernels_read(o)):
                found[o] = where
            continue
        if seg.kind != SegmentKind.METADATA:
            continue
        views, _ = metadata_views(graph, seg)  # views replayed on ATen are not in it
        for o, (src, want, delta) in views.items():
            have = graph.metas[src]
            if (o in keep or o in materialize or want.conj or want.neg or have.conj or have.neg
                    or want.dtype != have.dtype or delta < 0):
                continue
            if only_kernels_read(o):
                found[o] = (src, delta * want.dtype.itemsize)
    return found


def last_uses(plan: SegmentedFusion, keep: set[str], through: Pointers | None = None) -> dict[int, frozenset[str]]:
    """Segment index -> the values whose last use in the program is that segment (linear); a view
    in ``through`` is read as its source, and is itself never made (so never deleted)."""
    through = through or {}
    last_use: dict[str, int] = {}
    for seg in plan.segments:
        for v in seg.inputs:
            last_use[through[v][0] if v in through else v] = seg.index
    dying: dict[int, set[str]] = {}
    for v, k in last_use.items():
        if v not in keep:
            dying.setdefault(k, set()).add(v)
    return {k: frozenset(vs) for k, vs in dying.items()}
