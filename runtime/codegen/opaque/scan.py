"""Cumulative sums as generated C++ kernels (the CPU target only).

Note [cumsum kernels]: every decoder of the bench computes its position ids as a ``cumsum`` of
its attention mask, 11-12 us a call on this 2-core machine kind for 64 elements, nearly all of
it ATen's dispatch and checks. The kernel runs ATen's CPU loop itself, so results are the same
bits: per position of the other dims, one pass along the summed dim, each input element first
converted to the output's dtype (ATen's ``self.to(result dtype)``), added into an accumulator of
ATen's CPU accumulate type (double for float32 and float64, float for half and bfloat16, 64-bit
for integers), and each partial sum stored converted back. Positions share threads where the
work passes the loop threshold (Note [thread thresholds measured here] in runtime/codegen/thresholds.py).

Taken: one ``aten.cumsum`` of a tensor of at least one dim, any layouts, with an integer or bool
input summed into an int64 or int32 output (a ``dtype`` argument narrows it: stored wrapped, as
ATen's conversion does), or a float input into the same dtype. A float summed into another dtype
and an integer into a float are declined (not written here), as is anything else, with the
reason; those run on torch. A float cumsum in a program of fixed sizes is chosen by measurement
against ATen's op on the machine that runs it (Note [choices by measurement] in
runtime/autotune.py; since 2026-11-28; a symbolic plan measures it once, at its first sizes):
here the kernel won at [2, 32] and [8, 512] (1.2 against 2.8 us, 5.0 against 6.6) and lost at
[64, 4096] (262 against 139 us; why was not looked into): the verdicts of that measurement in one
scratch run, 2026-11-28, not committed. An integer one, a
mask's, is not measured (made-up values are floats) and keeps the kernel.
"""

from __future__ import annotations

import hashlib
import math

import torch

from segmenter import FusionGraph, Node
from segmenter.ir.graph import ValueRef

from ..kernel import Kernel, Param, bind, parallel_if
from ..source import index as ix
from ..source.checks import check_layout, check_segment_metas, dim_arg, lone
from ..source.ctypes_ import Declined, load, storage_type, store

__all__ = ["CUMSUM", "cumsum_kernel"]

CUMSUM = "aten.cumsum.default"
#: ATen's CPU accumulate type (at::acc_type<T, /*is_cuda=*/false>) of a float output
_FLOAT_ACC = {torch.float32: "double", torch.float64: "double", torch.float16: "float", torch.bfloat16: "float"}
_INT_OUT = (torch.int64, torch.int32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cumsum_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``aten.cumsum`` (Note [cumsum kernels])."""
    if node.op != CUMSUM:
        raise Declined("not a cumsum")
    a = bind(node)
    x = a.get("self")
    if not isinstance(x, ValueRef) or len(node.outputs) != 1 or node.outputs[0] is None:
        raise Declined("a cumsum of something other than a tensor value")
    xm, ym = graph.metas[x.name], node.metas[0]
    xshape, xstride = check_layout(xm.shape, xm.stride, "input")
    if not xshape:
        raise Declined("a cumsum of a 0-d tensor (a copy)")
    d = dim_arg(a.get("dim"), len(xshape))
    check_segment_metas(graph, lone(node, (x.name,)), {})  # the recorded output is the op's, or not believed
    yshape, ystride = check_layout(ym.shape, ym.stride, "output")
    if yshape != xshape:
        raise Declined(f"an output of {list(yshape)} for an input of {list(xshape)}")
    xt, yt = xm.dtype, ym.dtype
    if yt in _INT_OUT and (xt == torch.bool or (not xt.is_floating_point and not xt.is_complex)):
        acc = "long long"
    elif yt in _FLOAT_ACC and xt == yt:
        acc = _FLOAT_ACC[yt]
    else:
        raise Declined(f"a cumsum of {_name(xt)} into {_name(yt)} (integers into int64/int32, floats into their own dtype)")
    # ATen converts the input to the output's dtype first (a no-op for floats here)
    element = load(xt, "xp[k]" if xstride[d] == 1 else f"xp[k * {xstride[d]}]")
    if xt != yt:
        element = f"(({storage_type(yt)}){element})"
    outer = [k for k in range(len(xshape)) if k != d]
    oshape = tuple(xshape[k] for k in outer)
    idx = ix.unravel_terms("o", oshape)
    xbase = ix.linear(idx, oshape, tuple(xstride[k] for k in outer))
    ybase = ix.linear(idx, oshape, tuple(ystride[k] for k in outer))
    positions, length = math.prod(oshape), xshape[d]
    ys = ystride[d]
    lines = [
        "// loops",
        f"  for (FUSEG_I o = 0; o < {positions}; ++o) {{",
        f"    const {storage_type(xt)}* xp = x_ + {xbase};",
        f"    {storage_type(yt)}* yp = y_ + {ybase};",
        f"    {acc} acc = ({acc})0;",
        f"    for (FUSEG_I k = 0; k < {length}; ++k) {{",
        f"      acc += ({acc}){element};",
        f"      yp[{'k' if ys == 1 else f'k * {ys}'}] = {store(yt, 'acc')};",
        "    }",
        "  }",
    ]
    threads = parallel_if(positions * length, [])
    if threads is not None and positions > 1:
        lines.insert(1, f"#pragma omp parallel for schedule(static){threads}")
    params = (Param("x_", x.name, xt, xshape, xstride, False), Param("y_", node.outputs[0], yt, yshape, ystride, True))
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.dtype) for p in params])).encode()).hexdigest()[:12]
    return Kernel(f"fuseg_cumsum_{digest}", params, body, 1, 1, "scan", "long long")
