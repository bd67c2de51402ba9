"""METADATA launches: a segment whose every output is a view of its inputs runs no kernel.

Each output is one strided view of the tensor its chain of view ops starts from, at the layout
the plan computed (``reinterpret``: no dispatcher round trip, no bytes moved). Where the chain
changes the dtype (``view(dtype)``), or reaches past the extent of the tensor it starts from
(``as_strided``), the view ops are replayed on ATen instead (Note [views from the plan] in
runtime/emit/views.py).
"""

from __future__ import annotations

from segmenter import FusionGraph, Segment, TensorMeta
from segmenter.ir.symbolic import size_key

from ..backends.torch_backend import emit_nodes
from ..emit.views import metadata_views
from ..emit.wrapper import Code
from ..storage import layout

__all__ = ["emit_metadata"]


def emit_metadata(code: Code, graph: FusionGraph, seg: Segment, dying: frozenset[str]) -> None:
    views, replay = metadata_views(graph, seg)  # Note [views from the plan] in runtime/emit/views.py
    if replay:  # the view ops themselves, in order: a view(dtype) keeps its storage, reads another dtype
        emit_nodes(code, seg.nodes, set(seg.outputs) | set(seg.inputs), {})
    rt = code.const(layout.reinterpret_fn(code.fast))
    for o, (src, want, delta) in views.items():
        if o in code.pointers:  # never made: Note [views passed as pointers] in runtime/compiled/pointers.py
            continue
        have = graph.metas[src]
        if src not in code.pointers and _same_view(have, want, delta):  # Note [a view that changes nothing]
            code.line(f"{code.var(o)} = {code.var(src)}")
            continue
        code.line(f"{code.var(o)} = {rt}({code.var(src)}, {code.const(want.shape)}, {code.const(want.stride)}, {code.value(delta)})")
        if want.conj or want.neg or have.conj or have.neg:  # the view's own bits, not its source's
            code.line(f"{code.var(o)} = {code.const(want.with_bits)}({code.var(o)})")
    dead = [v for v in seg.inputs if v in dying]
    if dead:
        code.dels(dead)


# Note [a view that changes nothing]: AOTAutograd's backward graphs take a weight's transpose
# again (``t(t(w))`` for the input's gradient, ``mm(grad, t_7)``), and views compose to the layout
# they started from elsewhere too: 26 of a tiny Qwen2 backward's 63 METADATA segments made a
# tensor (about 1.3 us each) in the very layout of the one it started from. Such a view is the
# same storage, shape, strides and offset in the same dtype with no conj/neg bit: the program
# names the tensor it started from instead (what it reads and writes is the same memory either
# way; a graph output made so is handled as any output that shares a storage).
def _same_view(have: TensorMeta, want: TensorMeta, delta: object) -> bool:
    if have.dtype != want.dtype or have.conj or have.neg or want.conj or want.neg:
        return False
    return size_key(delta) == 0 and size_key((have.shape, have.stride)) == size_key((want.shape, want.stride))
