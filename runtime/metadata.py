"""METADATA launches: a segment whose every output is a view of its inputs runs no kernel.

Each output is one strided view of the tensor its chain of view ops starts from, at the layout
the plan computed (``reinterpret``: no dispatcher round trip, no bytes moved). Where the chain
changes the dtype (``view(dtype)``), or reaches past the extent of the tensor it starts from
(``as_strided``), the view ops are replayed on ATen instead (Note [views from the plan] in
runtime/views.py).
"""

from __future__ import annotations

from segmenter import FusionGraph, Segment

from . import layout
from .backends.torch_backend import emit_nodes
from .views import metadata_views
from .wrapper import Code

__all__ = ["emit_metadata"]


def emit_metadata(code: Code, graph: FusionGraph, seg: Segment, dying: frozenset[str]) -> None:
    views, replay = metadata_views(graph, seg)  # Note [views from the plan] in runtime/views.py
    if replay:  # the view ops themselves, in order: a view(dtype) keeps its storage, reads another dtype
        emit_nodes(code, seg.nodes, set(seg.outputs) | set(seg.inputs), {})
    rt = code.const(layout.reinterpret_fn(code.fast))
    for o, (src, want, delta) in views.items():
        if o in code.pointers:  # never made: Note [views passed as pointers] in runtime/pointers.py
            continue
        code.line(f"{code.var(o)} = {rt}({code.var(src)}, {code.const(want.shape)}, {code.const(want.stride)}, {code.value(delta)})")
        have = graph.metas[src]
        if want.conj or want.neg or have.conj or have.neg:  # the view's own bits, not its source's
            code.line(f"{code.var(o)} = {code.const(want.with_bits)}({code.var(o)})")
    dead = [v for v in seg.inputs if v in dying]
    if dead:
        code.dels(dead)
