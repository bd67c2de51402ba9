"""Embedding lookups as generated C++ kernels (the CPU target only).

Note [embedding kernels]: eager's ``aten.embedding`` is an ``index_select`` of the weight's rows,
10-16 us a call on this 2-core machine kind for the 64 tokens of a tiny transformer (every model
of the bench has one to four), most of it ATen's checks and dispatch around a copy of a few KiB.
The kernel here is the copy: per index, the row of the weight it names, copied as stored (the
storage type of the weight's dtype, so half, bfloat16 and integer rows bit for bit; nothing is
computed). The indices are data the program first sees when called, so each is tested against
the weight's row count before its row is read: an index outside ``[0, rows)`` reads nothing and
is counted, the kernel returns the count (``Kernel.returns``), and the launch raises eager's
``IndexError`` ("index out of range in self") when it is not zero. ATen does not wrap negative
indices here either. ``padding_idx``, ``scale_grad_by_freq`` and ``sparse`` change only the
backward, which stays ATen's.

Taken: one ``aten.embedding`` of a 2-D weight whose rows hold at least one element, of a dtype
the generator stores (complex is not), by int64 or int32 indices of any layout, the output in
the contiguous layout ATen gives it (recorded output metas are checked against torch's meta
kernel first: Note [checked source values] in checks.py). Lookups of over ``PARALLEL_MIN``
elements share their rows among threads. Anything else is declined with the reason and runs on
torch.
"""

from __future__ import annotations

import hashlib
import math

import torch

from segmenter import FusionGraph, Node
from segmenter.ir import ValueRef

from . import index as ix
from .checks import check_layout, check_segment_metas, lone
from .ctypes_ import Declined, storage_type
from .kernel import Kernel, Param, bind, parallel_if

__all__ = ["EMBEDDING", "embedding_kernel"]

EMBEDDING = "aten.embedding.default"
_INDEX_DTYPES = (torch.int64, torch.int32)


def embedding_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``aten.embedding`` (Note [embedding kernels])."""
    if node.op != EMBEDDING:
        raise Declined("not an embedding")
    a = bind(node)
    w, ids = a.get("weight"), a.get("indices")
    if not (isinstance(w, ValueRef) and isinstance(ids, ValueRef)) or len(node.outputs) != 1 or node.outputs[0] is None:
        raise Declined("an embedding of something other than tensor values")
    wm, im, ym = graph.metas[w.name], graph.metas[ids.name], node.metas[0]
    wshape, wstride = check_layout(wm.shape, wm.stride, "weight")
    ishape, istride = check_layout(im.shape, im.stride, "indices")
    if len(wshape) != 2:
        raise Declined(f"a weight of {len(wshape)} dims (2-D weights are taken)")
    if im.dtype not in _INDEX_DTYPES:
        raise Declined(f"{str(im.dtype).removeprefix('torch.')} indices (int64 and int32 are taken)")
    if wm.dtype.is_complex:
        raise Declined(f"a {str(wm.dtype).removeprefix('torch.')} weight: complex rows are not taken")
    ct = storage_type(wm.dtype)
    rows, width = wshape
    if width == 0:
        raise Declined("rows of no elements (nothing to copy; ATen checks the indices)")
    # the recorded output is what torch's meta kernel computes from these layouts, or not believed
    check_segment_metas(graph, lone(node, (w.name, ids.name)), {})
    yshape, ystride = check_layout(ym.shape, ym.stride, "output")
    if yshape != (*ishape, width) or ym.dtype != wm.dtype:
        raise Declined(f"an output of {list(yshape)} {ym.dtype} for indices {list(ishape)} into {list(wshape)} {wm.dtype}")
    if ym.numel and not ym.is_contiguous():  # (an empty output is never written)
        raise Declined(f"an output of strides {list(ystride)}: the kernel writes rows contiguously")
    count = math.prod(ishape)
    at = "i" if im.is_contiguous() else ix.linear(ix.unravel_terms("i", ishape), ishape, istride)
    ws0, ws1 = wstride
    column = "j" if ws1 == 1 else f"j * {ws1}"
    lines = [
        "  long long bad = 0;",
        "// loops",
        f"  for (FUSEG_I i = 0; i < {count}; ++i) {{",
        f"    const long long r = (long long)i_[{at}];",
        f"    if (r < 0 || r >= (long long)({rows})) {{ bad += 1; continue; }}",
        f"    const {ct}* src = w_ + r * {ws0};",
        f"    {ct}* dst = y_ + i * {width};",
        f"    for (FUSEG_I j = 0; j < {width}; ++j) dst[j] = src[{column}];",
        "  }",
        "  return bad;",
    ]
    threads = parallel_if(count * width, [])
    if threads is not None:
        lines.insert(lines.index("// loops") + 1, f"#pragma omp parallel for reduction(+:bad) schedule(static){threads}")
    params = (Param("w_", w.name, wm.dtype, wshape, wstride, False),
              Param("i_", ids.name, im.dtype, ishape, istride, False),
              Param("y_", node.outputs[0], ym.dtype, yshape, ystride, True))
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.dtype) for p in params])).encode()).hexdigest()[:12]
    return Kernel(f"fuseg_embedding_{digest}", params, body, 1, 1, "embedding", "long long", returns="long long")


def index_error(count: int, rows: int, value: str) -> None:
    """What a lookup raises for ``count`` indices outside ``[0, rows)`` (eager's message first)."""
    raise IndexError(f"index out of range in self ({count} of the indices %{value} outside [0, {rows}))")
