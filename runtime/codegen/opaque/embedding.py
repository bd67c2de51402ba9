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
backward (Note [embedding backward kernels] below).

Taken: one ``aten.embedding`` of a 2-D weight whose rows hold at least one element, of a dtype
the generator stores (complex is not), by int64 or int32 indices of any layout, the output in
the contiguous layout ATen gives it (recorded output metas are checked against torch's meta
kernel first: Note [checked source values] in runtime/codegen/source/checks.py). Lookups of over the loop threshold
elements share their rows among threads. Anything else is declined with the reason and runs on
torch.
"""

from __future__ import annotations

import math

import torch

from segmenter import FusionGraph, Node
from segmenter.ir.graph import ValueRef

from ..kernel import Kernel, Param, bind, loop_kernel
from ..source import index as ix
from ..source.checks import check_layout, check_segment_metas, int_arg, lone
from ..source.ctypes_ import Declined, storage_type

__all__ = ["EMBEDDING", "EMBEDDING_BACKWARD", "embedding_backward_kernel", "embedding_kernel"]

EMBEDDING = "aten.embedding.default"
EMBEDDING_BACKWARD = "aten.embedding_dense_backward.default"
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
    params = (Param("w_", w.name, wm.dtype, wshape, wstride, False),
              Param("i_", ids.name, im.dtype, ishape, istride, False),
              Param("y_", node.outputs[0], ym.dtype, yshape, ystride, True))
    return loop_kernel("fuseg_embedding", "embedding", lines, count * width, " reduction(+:bad)", params, "long long")


# Note [embedding backward kernels]: ``aten.embedding_dense_backward`` is the weight's gradient of
# a lookup: rows of zeros, and each index's row of the incoming gradient added into the row it
# names. ATen's CPU kernel makes the zeros, then adds one row at a time through a TensorIterator
# (its add kernel with alpha 1), 7-8 us a call for a tiny transformer's 64 tokens here, where
# the work is a few thousand additions; training a tiny LM calls it once per embedding table
# (GPT-2: two, BERT: three). The kernel here is that loop. Its sums are ATen's to the bit:
# ATen adds the indices' rows in index order into each row, in the gradient's dtype (alpha 1 is
# exact, fused or not), and so does the kernel, starting from zero; it shares the columns among
# threads (each thread all indices, in order, for its columns), never the indices. Indices
# outside ``[0, num_weights)`` add nothing, as in ATen (it finds no row for them), nor does
# ``padding_idx``. Taken: float32 and float64 gradients of any layout with the indices' shape
# and one more dim, int64 or int32 indices of any layout, ``scale_grad_by_freq`` false; half and
# bfloat16 (whose sums ATen rounds after each add), and counting indices for
# ``scale_grad_by_freq``, are declined and run on ATen. In a program of fixed sizes, chosen by
# measurement against ATen's op on the machine that runs it (Note [choices by measurement] in
# runtime/autotune.py), since 2026-11-28, on made-up indices of zeros (runtime/backends/
# measured.py), as the lookup is; a symbolic plan measures it once at its first sizes (Note [a
# lookup measured at the plan's first sizes] there); on this machine kind the kernel won by
# 2.5-5x at the tiny models' shapes (the verdicts of that measurement in one scratch run,
# 2026-11-28, not committed).
# ``perf.experiments.embedding_backward`` times it in place in training steps.

_GRAD_DTYPES = {torch.float32: "float", torch.float64: "double"}
_COLUMNS = 64  # columns a thread takes at a time


def embedding_backward_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``aten.embedding_dense_backward`` (Note [embedding backward
    kernels])."""
    if node.op != EMBEDDING_BACKWARD:
        raise Declined("not an embedding backward")
    a = bind(node)
    g, ids = a.get("grad_output"), a.get("indices")
    if not (isinstance(g, ValueRef) and isinstance(ids, ValueRef)) or len(node.outputs) != 1 or node.outputs[0] is None:
        raise Declined("an embedding backward of something other than tensor values")
    if a.get("scale_grad_by_freq") is not False:
        raise Declined("scale_grad_by_freq (the kernel does not count indices)")
    # values that reach the source: plain ints in range (Note [checked source values])
    rows = int_arg(a.get("num_weights"), "num_weights", 0)
    pad = int_arg(a.get("padding_idx"), "padding_idx", -(2**63), 2**63 - 1)
    gm, im, ym = graph.metas[g.name], graph.metas[ids.name], node.metas[0]
    if gm.dtype not in _GRAD_DTYPES:
        raise Declined(f"a {str(gm.dtype).removeprefix('torch.')} gradient (float32 and float64 are taken)")
    if im.dtype not in _INDEX_DTYPES:
        raise Declined(f"{str(im.dtype).removeprefix('torch.')} indices (int64 and int32 are taken)")
    gshape, gstride = check_layout(gm.shape, gm.stride, "gradient")
    ishape, istride = check_layout(im.shape, im.stride, "indices")
    # the recorded output is what torch's meta kernel computes from these layouts, or not believed
    check_segment_metas(graph, lone(node, tuple(dict.fromkeys((g.name, ids.name)))), {})
    yshape, ystride = check_layout(ym.shape, ym.stride, "output")
    if len(gshape) != len(ishape) + 1 or tuple(gshape[:-1]) != tuple(ishape):
        raise Declined(f"a gradient of {list(gshape)} for indices of {list(ishape)} (their shape and one more dim are taken)")
    width = gshape[-1]
    if yshape != (rows, width) or ym.dtype != gm.dtype or (ym.numel and not ym.is_contiguous()):
        raise Declined(f"an output of {list(yshape)} strides {list(ystride)} {ym.dtype}: "
                       f"a contiguous [{rows}, {width}] {gm.dtype} is written")
    ct = _GRAD_DTYPES[gm.dtype]
    count = math.prod(ishape)
    lead = ix.unravel_terms("i", ishape)
    at = "i" if im.is_contiguous() else ix.linear(lead, ishape, istride)
    src = ix.linear(lead, ishape, tuple(gstride[:-1]))
    gs = gstride[-1]
    lines = [
        f"  const FUSEG_I blocks = ((FUSEG_I)({width}) + {_COLUMNS - 1}) / {_COLUMNS};",
        "// loops",
        "  for (FUSEG_I b = 0; b < blocks; ++b) {",
        f"    const FUSEG_I j0 = b * {_COLUMNS};",
        f"    const FUSEG_I j1 = j0 + {_COLUMNS} < (FUSEG_I)({width}) ? j0 + {_COLUMNS} : (FUSEG_I)({width});",
        f"    for (FUSEG_I r = 0; r < (FUSEG_I)({rows}); ++r)",
        f"      for (FUSEG_I j = j0; j < j1; ++j) y_[r * {width} + j] = ({ct})0;",
        f"    for (FUSEG_I i = 0; i < {count}; ++i) {{",
        f"      const long long r = (long long)i_[{at}];",
        f"      if (r < 0 || r >= (long long)({rows}){f' || r == {pad}LL' if 0 <= pad < rows else ''}) continue;",
        f"      {ct}* dst = y_ + r * {width};",
        f"      const {ct}* src = g_ + {src};",
        f"      for (FUSEG_I j = j0; j < j1; ++j) dst[j] += src[{'j' if gs == 1 else f'j * {gs}'}];",
        "    }",
        "  }",
    ]
    params = (Param("g_", g.name, gm.dtype, gshape, gstride, False),
              Param("i_", ids.name, im.dtype, ishape, istride, False),
              Param("y_", node.outputs[0], ym.dtype, yshape, ystride, True))
    return loop_kernel("fuseg_embedding_backward", "embedding", lines, count * width, "", params)


def index_error(count: int, rows: int, value: str) -> None:
    """What a lookup raises for ``count`` indices outside ``[0, rows)`` (eager's message first)."""
    raise IndexError(f"index out of range in self ({count} of the indices %{value} outside [0, {rows}))")
