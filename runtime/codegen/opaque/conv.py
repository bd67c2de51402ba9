"""Depthwise 2-D convolutions as generated C++ kernels (the CPU target only).

Note [depthwise convolutions]: a depthwise convolution (groups = input channels = output
channels: MobileNet's and ConvNeXt's 3x3 and 7x7 layers) is a handful of multiply-adds per output
element, yet eager sends it to oneDNN like any other, at about 100-170 us a call on this 2-core
machine kind for mobilenet-v2-tiny's 2x192x4x4 (its 17 took 1960 us, of 6270 us for all its
convolutions, in one timing of each layer alone). ATen has no other CPU path for it (with oneDNN
off it is one slow convolution per channel: 39 ms), and im2col + batched GEMM was no faster
(scratch runs, not kept). The kernel here is the loop
itself: per image and channel (the two outer loops, shared among threads where the work is
worth it: Note [work of a loop] in runtime/codegen/kernel.py), the output plane starts at the bias and each tap
(i, j) of the filter adds ``x * w`` over the output columns whose input column is inside the
image. That range depends on j alone, so each j is its own loop with literal bounds: no bounds
test inside, short rows unroll whole and long ones vectorize where the stride is 1. Padding
reads nothing (zeros add nothing). The sum runs in another order than oneDNN's: results may
differ from eager's in the last bits.

Channels-last input and output (NHWC: ConvNeXt's, after its permutes) take another loop nest: the
filter copied tap-major on the stack first, then per output pixel each tap inside the image adds
over the channels, a unit-stride loop.

Taken: one ``aten.convolution`` of a 4-D float32/float64 input, input and output both contiguous
(NCHW) or both channels-last (NHWC, a filter copy of at most 64 KiB), a
weight of shape [C, 1, kh, kw] (any layout), a bias of [C] or none, not transposed, integer
stride, padding and dilation. Anything else is declined with the reason. This plain loop reads
and writes its output row once per tap, so from some size oneDNN beats it; where, is measured on
the machine (Note [choices by measurement] in runtime/autotune.py; a cap of 0.5M multiply-adds,
chosen on another machine by ``python -m perf.experiments.depthwise``, decided before).
"""

from __future__ import annotations

import hashlib

import torch

from segmenter import FusionGraph, Node
from segmenter.ir.graph import ValueRef

from ..kernel import Kernel, Param, parallel_if
from ..source.ctypes_ import Declined, storage_type

__all__ = ["CONVOLUTION", "convolution_args", "depthwise_kernel", "planar_args"]

CONVOLUTION = "aten.convolution.default"
_STACK_FILTER_BYTES = 64 << 10  # the channels-last kernel's tap-major copy of the filter
_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _ints(v: object, what: str, least: int, dims: int) -> tuple[int, ...]:
    if not (isinstance(v, tuple) and len(v) == dims and all(type(e) is int and least <= e < 1 << 20 for e in v)):
        raise Declined(f"a {dims}-D convolution whose {what} is {v!r:.60} ({dims} integers from {least} are taken)")
    return v


def convolution_args(graph: FusionGraph, node: Node) -> dict:
    """The arguments of ``node``, a 1-D or 2-D ``aten.convolution``, by name, or ``Declined`` with
    why not: input, weight and bias are tensor values (the bias may be None), input and weight
    both 3-D or both 4-D (``spatial``: 1 or 2, the dims after batch and channels), not
    transposed, and stride, padding and dilation each one integer in range per spatial dim (the
    schema also takes one for all dims, which ATen's other convolutions refuse: it is declined
    here)."""
    if node.op != CONVOLUTION or len(node.args) != len(_ARGS) or node.kwargs:
        raise Declined("not a convolution with the nine positional arguments of its schema")
    a = dict(zip(_ARGS, node.args))
    if not (isinstance(a["input"], ValueRef) and isinstance(a["weight"], ValueRef)
            and (a["bias"] is None or isinstance(a["bias"], ValueRef))):
        raise Declined("a convolution of something other than tensor values")
    if a["transposed"] is not False:
        raise Declined("a transposed convolution")
    xm, wm = graph.metas[a["input"].name], graph.metas[a["weight"].name]
    if len(xm.shape) not in (3, 4) or len(wm.shape) != len(xm.shape):
        raise Declined(f"a {len(xm.shape) - 2}-D convolution with a {len(wm.shape)}-D weight (1-D and 2-D ones are "
                       "taken)")
    a["spatial"] = spatial = len(xm.shape) - 2
    a["stride"] = _ints(a["stride"], "stride", 1, spatial)
    a["padding"] = _ints(a["padding"], "padding", 0, spatial)
    a["dilation"] = _ints(a["dilation"], "dilation", 1, spatial)
    return a


def planar_args(graph: FusionGraph, node: Node) -> dict:
    """``convolution_args`` of a 2-D convolution, or ``Declined`` (a 1-D one too)."""
    a = convolution_args(graph, node)
    if a["spatial"] != 2:
        raise Declined("a 1-D convolution (2-D ones are taken)")
    return a


def depthwise_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a depthwise ``aten.convolution`` (Note [depthwise convolutions])."""
    a = planar_args(graph, node)
    xm, wm, ym = graph.metas[a["input"].name], graph.metas[a["weight"].name], node.metas[0]
    if ym is None or len(ym.shape) != 4:
        raise Declined("a convolution whose output is not 4-D")
    N, C, H, W = xm.shape
    filters, per_group, kh, kw = wm.shape
    if not (a["groups"] == C == filters and per_group == 1):
        raise Declined(f"groups={a['groups']} with weight {list(wm.shape)}: not depthwise (one filter per channel)")
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    bm = graph.metas[a["bias"].name] if a["bias"] is not None else None
    dtype = xm.dtype
    if dtype not in (torch.float32, torch.float64) or any(m.dtype != dtype for m in (wm, ym, *(bm,) * (bm is not None))):
        raise Declined(f"a {str(dtype).removeprefix('torch.')} convolution (float32 and float64 only)")
    if bm is not None and bm.shape != (C,):
        raise Declined(f"a bias of shape {list(bm.shape)}")
    if xm.is_contiguous() and ym.is_contiguous():
        channels_last = False
    elif _channels_last(xm) and _channels_last(ym):
        channels_last = True
    else:
        raise Declined("an input or output neither contiguous (NCHW) nor channels-last (NHWC), or not both alike")
    OH, OW = ym.shape[2:]
    if ym.shape[:2] != (N, C):
        raise Declined(f"an output of shape {list(ym.shape)} for an input of {list(xm.shape)}")
    macs = ym.numel * kh * kw
    ct = storage_type(dtype)
    params = [Param("x_", a["input"].name, dtype, xm.shape, xm.stride, False),
              Param("w_", a["weight"].name, dtype, wm.shape, wm.stride, False)]
    if bm is not None:
        params.append(Param("b_", a["bias"].name, dtype, bm.shape, bm.stride, False))
    params.append(Param("y_", node.outputs[0], dtype, ym.shape, ym.stride, True))
    if channels_last and kh * kw * C * dtype.itemsize > _STACK_FILTER_BYTES:
        raise Declined(f"a channels-last filter of {kh * kw * C * dtype.itemsize} bytes (its copy lives on the stack)")
    ws0, _, ws2, ws3 = wm.stride
    bias = f"b_[c * {bm.stride[0]}]" if bm is not None else f"({ct})0"
    geometry = (N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, ws0, ws2, ws3)
    lines = _nhwc_loops(ct, bias, *geometry) if channels_last else _nchw_loops(ct, bias, *geometry)
    threads = parallel_if(macs, [])  # (Note [thread thresholds measured here])
    if threads is not None:
        lines.insert(lines.index("// loops") + 1, f"#pragma omp parallel for collapse(2) schedule(static){threads}")
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.dtype) for p in params])).encode()).hexdigest()[:12]
    return Kernel(f"fuseg_dwconv_{digest}", tuple(params), body, 1, 1, "conv", "long long")


def _channels_last(m) -> bool:  # noqa: ANN001 - a TensorMeta
    """NHWC strides (dims of one element may have any)."""
    n, c, h, w = m.shape
    want = (h * w * c, 1, w * c, c)
    return all(size == 1 or st == wst for size, st, wst in zip(m.shape, m.stride, want))


def _nchw_loops(ct, bias, N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, ws0, ws2, ws3) -> list[str]:  # noqa: ANN001, N803
    """Per image and channel, an output plane: each filter column j adds over the output columns
    whose input column is inside the image, a range with literal bounds (Note [depthwise
    convolutions])."""
    taps = []
    for j in range(kw):
        off = j * dw - pw  # input column of output column ow: ow * sw + off
        lo = 0 if off >= 0 else (-off + sw - 1) // sw
        hi = min(OW, (W - 1 - off) // sw + 1) if W - 1 - off >= 0 else 0
        if lo < hi:  # literal bounds: short rows unroll, long ones vectorize where sw is 1
            taps += [f"          {{ const {ct} wv = wr[{j * ws3}];",
                     f"            for (FUSEG_I ow = {lo}; ow < {hi}; ++ow) yr[ow] += xr[ow * {sw} + {off}] * wv; }}"]
    return [
        "// loops",
        f"  for (FUSEG_I n = 0; n < {N}; ++n)",
        f"  for (FUSEG_I c = 0; c < {C}; ++c) {{",
        f"    const {ct}* xp = x_ + (n * {C} + c) * {H * W};",
        f"    {ct}* yp = y_ + (n * {C} + c) * {OH * OW};",
        f"    const {ct} bias = {bias};",
        f"    for (FUSEG_I q = 0; q < {OH * OW}; ++q) yp[q] = bias;",
        f"    for (FUSEG_I oh = 0; oh < {OH}; ++oh) {{",
        f"      {ct}* yr = yp + oh * {OW};",
        f"      for (FUSEG_I i = 0; i < {kh}; ++i) {{",
        f"        const FUSEG_I ih = oh * {sh} - {ph} + i * {dh};",
        f"        if (ih < 0 || ih >= {H}) continue;",
        f"        const {ct}* xr = xp + ih * {W};",
        f"        const {ct}* wr = w_ + c * {ws0} + i * {ws2};",
        *taps,
        "      }",
        "    }",
        "  }",
    ]


def _nhwc_loops(ct, bias, N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, ws0, ws2, ws3) -> list[str]:  # noqa: ANN001, N803
    """Channels-last: the filter is first copied tap-major (``wt[tap][c]``, on the stack), then per
    output pixel each tap inside the image adds over the channels, a unit-stride loop that
    vectorizes (Note [depthwise convolutions])."""
    return [
        f"  {ct} wt[{kh * kw * C}];",
        f"  for (FUSEG_I c = 0; c < {C}; ++c)",
        f"    for (FUSEG_I i = 0; i < {kh}; ++i)",
        f"      for (FUSEG_I j = 0; j < {kw}; ++j) wt[(i * {kw} + j) * {C} + c] = w_[c * {ws0} + i * {ws2} + j * {ws3}];",
        "// loops",
        f"  for (FUSEG_I n = 0; n < {N}; ++n)",
        f"  for (FUSEG_I oh = 0; oh < {OH}; ++oh) {{",
        f"    for (FUSEG_I ow = 0; ow < {OW}; ++ow) {{",
        f"      {ct}* yp = y_ + ((n * {OH} + oh) * {OW} + ow) * {C};",
        f"      for (FUSEG_I c = 0; c < {C}; ++c) yp[c] = {bias};",
        f"      for (FUSEG_I i = 0; i < {kh}; ++i) {{",
        f"        const FUSEG_I ih = oh * {sh} - {ph} + i * {dh};",
        f"        if (ih < 0 || ih >= {H}) continue;",
        f"        for (FUSEG_I j = 0; j < {kw}; ++j) {{",
        f"          const FUSEG_I iw = ow * {sw} - {pw} + j * {dw};",
        f"          if (iw < 0 || iw >= {W}) continue;",
        f"          const {ct}* xp = x_ + ((n * {H} + ih) * {W} + iw) * {C};",
        f"          const {ct}* wp = wt + (i * {kw} + j) * {C};",
        f"          for (FUSEG_I c = 0; c < {C}; ++c) yp[c] += xp[c] * wp[c];",
        "        }",
        "      }",
        "    }",
        "  }",
    ]
