"""Convolutions whose filters have one tap, as generated matmuls (the CPU target only).

Note [one-tap convolutions]: a convolution with a filter of size 1 in every spatial dim, stride 1
and no padding (SqueezeBERT's grouped ``conv1d`` layers in place of its linear layers, the 1x1
"pointwise" layers of MobileNet, EfficientNet, ResNet, RegNet...) is a matmul per image and group:
over the positions (the spatial dims, which must make one run of equally spaced elements), out
channel ``o`` is the weight's row ``o`` times the input's channels, plus the bias. Eager sends it
to oneDNN, which spent 47-66 us a call on SqueezeBERT's 2x64x32 layers on this 2-core machine
kind (a scratch comparison, one process; 12 of them were three quarters of its time), and ATen's
im2col + GEMM (``aten.thnn_conv2d``, the im2col backend) 12-22 us on MobileNet's; the arithmetic
is a few microseconds. The kernel calls the matmul templates of Note [matmul kernels] (gemm.py)
once per image and group, in the orientation that writes the output's unit-stride dim along the
product's rows: positions along columns for an NCHW output (C = W @ X), out channels along columns
for a channels-last one (C = X^T @ W^T). The input may be read through any strides the templates
take (SqueezeBERT's is a transpose of its [batch, seq, channels] hidden states). Fewer than 16
positions (MobileNet's and PoolFormer's 2x2 and 1x1 maps) would make each column a dot product
reading the input one row of positions apart, element by element (PoolFormer's 2x256x2x2 layer
took 55 us so, against 19 us as im2col): the image's group of positions is first copied
contiguous along channels into a stack buffer, and the dot products run in vectors along the
channels (3.8 us). The images and groups are shared among threads where the work passes the
matmul threshold (measured on the machine: Note [thread thresholds measured here] in
runtime/codegen/thresholds.py; it was 2^18 multiply-adds, from perf/results/x86-cpu-unrecorded/onetap_cpu.json).

Values are not ATen's bits: the sums run in another order (oneDNN's depends on the machine and
the sizes); the tests check them against eager within float32's tolerances, the sums being
the matmul kernel's. Taken: one ``aten.convolution`` (1-D or 2-D, not transposed) of float32
values, a filter of one tap, stride 1, padding 0 (any dilation: one tap has nothing to dilate),
any groups, an output of the input's positions in a layout with positions or out channels one
element apart. Anything else is declined with the reason. Whether the kernel or ATen's convolution
is the faster for a shape is measured on the machine (Note [choices by measurement] in
runtime/autotune.py; a cap of 2^22 multiply-adds, measured on another machine, decided before).
"""

from __future__ import annotations

import math

from segmenter import FusionGraph, Node

from .. import thresholds
from ..kernel import BESIDE_MARK, Kernel
from ..source.ctypes_ import Declined
from .conv import convolution_args
from .gemm import product_call
from .matconv import checked_operands, matmul_conv_kernel

__all__ = ["onetap_kernel"]

#: bytes of an image's positions copied contiguous along channels on the stack (see the Note)
_COPY_BYTES = 1 << 16


def _run(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, int] | None:
    """The dims ``shape`` as one run: (elements, stride), or None where they are not equally spaced."""
    dims = [(n, st) for n, st in zip(shape, stride) if n != 1]
    if not dims:
        return 1, 1
    for (_, outer), (n, inner) in zip(dims, dims[1:]):
        if outer != inner * n:
            return None
    return math.prod(shape), dims[-1][1]


def onetap_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a one-tap ``aten.convolution`` (Note [one-tap convolutions])."""
    a = convolution_args(graph, node)
    wm = graph.metas[a["weight"].name]
    if any(k != 1 for k in wm.shape[2:]):
        raise Declined(f"a filter of {'x'.join(map(str, wm.shape[2:]))} taps (one-tap filters are taken)")
    if any(s != 1 for s in a["stride"]):
        raise Declined(f"stride {list(a['stride'])} (stride 1 is taken)")
    if any(p != 0 for p in a["padding"]):
        raise Declined(f"padding {list(a['padding'])} (no padding is taken)")
    checked = checked_operands(graph, node, a)
    xm, _, bm, ym = checked
    groups = a["groups"]
    (N, _), (filters, per_group) = xm.shape[:2], wm.shape[:2]
    if ym.shape[2:] != xm.shape[2:]:
        raise Declined(f"an output of positions {list(ym.shape[2:])} for an input of {list(xm.shape[2:])}")
    x_run, y_run = _run(xm.shape[2:], xm.stride[2:]), _run(ym.shape[2:], ym.stride[2:])
    if x_run is None or y_run is None:
        raise Declined("input or output positions that are not one run of equally spaced elements")
    (L, sxl), (_, syl) = x_run, y_run
    work = N * filters * per_group * L
    og, (sxn, sxc), (syn, syo), (swo, swc) = filters // groups, xm.stride[:2], ym.stride[:2], wm.stride[:2]
    sb = bm.stride[0] if bm is not None else 0
    # columns along the output's unit-stride dim: positions (C = W @ X) or out channels (C = X^T @ W^T);
    # where both are (one position, or one filter a group), the more columns first: the templates
    # vectorize along columns, 16 at a time (a lone column is a dot product a position)
    bias = (sb, 0) if bm is not None else None
    tries = []
    if L <= 1 or syl == 1:
        if L < 16 and per_group > 1 and sxc != 1 and swc == 1 and L * per_group * 4 <= _COPY_BYTES:
            # fewer positions than a vector: the columns would be dot products of the input read
            # per_group * L apart; its positions are first copied contiguous along channels (a
            # stack buffer), so the dot products run in vectors along the channels
            tries.append((L, [f"float xt[{L * per_group}];",
                              f"const float* xp = x_ + n * {sxn} + j * {per_group * sxc};",
                              f"for (FUSEG_I c = 0; c < {per_group}; ++c)",
                              f"  for (FUSEG_I l = 0; l < {L}; ++l) xt[l * {per_group} + c] = xp[c * {sxc} + l * {sxl}];"],
                          ("w", "xt"), lambda: product_call(og, L, per_group, (swo, swc), (1, per_group), syo, bias)))
        else:
            tries.append((L, [], ("w", "x"), lambda: product_call(og, L, per_group, (swo, swc), (sxc, sxl), syo, bias)))
    if og <= 1 or syo == 1:
        tries.append((og, [], ("x", "w"), lambda: product_call(L, og, per_group, (sxl, sxc), (swc, swo), syl,
                                                             (0, sb) if bm is not None else None)))
    tries.sort(key=lambda t: -t[0])
    if not tries:
        raise Declined(f"an output of strides {list(ym.stride)}: neither positions nor out channels one element "
                       "apart")
    why, chosen = [], None
    for _, prologue, pair, make in tries:
        try:
            chosen = (prologue, pair, make())
            break
        except Declined as e:
            why.append(str(e))
    if chosen is None:
        raise Declined(f"strides the matmul templates do not take: {'; '.join(why)}")
    prologue, (first, second), call = chosen
    ptr = {"w": f"w_ + j * {og * swo}", "x": f"x_ + n * {sxn} + j * {per_group * sxc}", "xt": "xt"}
    b = f"b_ + j * {og * sb}" if bm is not None else "nullptr"
    lines = [f"  for (FUSEG_I n = 0; n < {N}; ++n)",
             f"    for (FUSEG_I j = 0; j < {groups}; ++j) {{",
             *(f"      {line}" for line in prologue),
             f"      {call(ptr[first], ptr[second], b, f'y_ + n * {syn} + j * {og * syo}')};",
             "    }"]
    least = thresholds.current()
    if work >= least.macs and N * groups > 1:
        lines.insert(0, "#pragma omp parallel for collapse(2) schedule(static)" + (BESIDE_MARK if work < least.beside_macs
                                                                                  else ""))
    return matmul_conv_kernel("fuseg_onetap_", node, a, checked, lines, work)
