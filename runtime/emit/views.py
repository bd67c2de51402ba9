"""Views the program makes from the plan, without a dispatcher round trip, and which ones.

Note [views from the plan]: a METADATA segment's outputs (runtime/compiled/metadata.py) and, inside a
segment that runs on ATen, a view op whose chain of views starts at one of the segment's inputs
(a weight's ``t`` or ``permute`` before its ``mm``, the ``unsqueeze``/``expand`` before a ``bmm``)
are made as one strided view of the chain's source at the layout the plan computed
(``reinterpret``: ~0.45 us in the fast variant where ATen's ``permute`` took ~1.3 us). The
source's layout is the planned one on every call: a graph input's is checked by the entry, an
earlier launch's output is made or conformed to it. Only a true view is taken (``is_true_view``:
the layout algebra derives the recorded layout; ``contiguous`` has a view's schema and copies).
Left to ATen inside a segment: a view of a value the segment computes (its layout is ATen's,
checked only where it leaves the segment), one that changes the dtype, one where either side
carries a conjugate or negative bit, a view op with more than one output, and a node written in
place into an input.

ATen's view ops check that a view stays inside its storage (and raise their own errors: a
``select`` out of range is an IndexError); ``reinterpret`` does not. A view of a source reaches no
further than the source's own extent but through ``as_strided`` (or an index out of range in a
graph file): such a view is never made from the plan. Its view ops run on ATen, which checks
and raises as eager does (before this rule, a METADATA segment's ``as_strided`` of a graph input
whose storage was smaller than the example's read past the storage's end).
"""

from __future__ import annotations

from collections.abc import Mapping

from alias.analysis import is_true_view
from segmenter import FusionGraph, OpKind, Segment, TensorMeta, op_info
from segmenter.ir.graph import ValueRef

__all__ = ["metadata_views", "planned_views"]

View = tuple[str, TensorMeta, int]  # (chain source, view layout, offset delta in elements)


def _within(want: TensorMeta, have: TensorMeta) -> bool:
    """Whether every element of the view ``want`` lies inside its source's extent ``have`` (of
    the same dtype: both are asked only then)."""
    return want.storage_offset >= have.storage_offset and want.storage_extent <= have.storage_extent


def planned_views(graph: FusionGraph, seg: Segment, targets: Mapping[str, str]) -> dict[str, View]:
    """See Note [views from the plan]: node name -> view made from the plan, for a segment on ATen."""
    source = {v: v for v in seg.inputs}
    views: dict[str, View] = {}
    for node in seg.nodes:
        if (op_info(node.op).kind != OpKind.VIEW or len(node.outputs) != 1 or node.outputs[0] is None
                or not node.inputs or node.name in targets or not is_true_view(graph, node)[0]):
            continue
        base = node.args[0] if node.args else None
        src = source.get(node.inputs[0])
        if src is None or not isinstance(base, ValueRef) or base.name != node.inputs[0]:
            continue
        o = node.outputs[0]
        want, have = graph.metas[o], graph.metas[src]
        if (want.dtype != have.dtype or want.device != have.device or want.conj or want.neg or have.conj
                or have.neg or not _within(want, have)):
            continue
        views[node.name] = (src, want, want.storage_offset - have.storage_offset)
        source[o] = src
    return views


def metadata_views(graph: FusionGraph, seg: Segment) -> tuple[dict[str, View], bool]:
    """A METADATA segment's outputs made from the plan (output -> view), and whether its view ops
    must be replayed on ATen first (for the outputs left out: a dtype view, a view past its
    source's extent)."""
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    views: dict[str, View] = {}
    replay = False
    for o in seg.outputs:
        src = o
        while src in made:
            src = made[src].inputs[0]
        want, have = graph.metas[o], graph.metas[src]
        if want.dtype != have.dtype or not _within(want, have):
            replay = True
            continue
        views[o] = (src, want, want.storage_offset - have.storage_offset)
    return views, replay
