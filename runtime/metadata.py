"""METADATA launches: a segment whose every output is a view of its inputs runs no kernel.

Each output is one strided view of the tensor its chain of view ops starts from, at the layout
the plan computed (``reinterpret``: no dispatcher round trip, no bytes moved). Where the chain
changes the dtype (``view(dtype)``), the view ops are replayed instead.
"""

from __future__ import annotations

from segmenter import FusionGraph, Segment

from . import layout
from .backends.torch_backend import emit_nodes
from .wrapper import Code

__all__ = ["emit_metadata"]


def emit_metadata(code: Code, graph: FusionGraph, seg: Segment, dying: frozenset[str]) -> None:
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    replay = False
    views = []
    for o in seg.outputs:
        src = o
        while src in made:
            src = made[src].inputs[0]
        want, have = graph.metas[o], graph.metas[src]
        if want.dtype != have.dtype:
            replay = True
            continue
        views.append((o, src, want, want.storage_offset - have.storage_offset))
    if replay:  # the view ops themselves, in order: a view(dtype) keeps its storage, reads another dtype
        emit_nodes(code, seg.nodes, set(seg.outputs) | set(seg.inputs), {})
    rt = code.const(layout.reinterpret_fn(code.fast))
    for o, src, want, delta in views:
        code.line(f"{code.var(o)} = {rt}({code.var(src)}, {code.const(want.shape)}, {code.const(want.stride)}, {delta})")
        have = graph.metas[src]
        if want.conj or want.neg or have.conj or have.neg:  # the view's own bits, not its source's
            code.line(f"{code.var(o)} = {code.const(want.with_bits)}({code.var(o)})")
    dead = [v for v in seg.inputs if v in dying]
    if dead:
        code.dels(dead)
