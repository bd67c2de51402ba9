"""1-D convolutions as patches and a matmul, one generated kernel (the CPU target only).

Note [1-D convolutions as patches]: a 1-D convolution of more than one tap (wav2vec 2.0's feature
extractor, 10 and 3 taps of strides 5 and 2, and its grouped positional embedding of 16 taps;
Whisper's stem) goes to oneDNN in eager, 48-222 us a call on wav2vec2-tiny's layers on this 2-core
machine kind (a scratch comparison). ATen's other path, im2col + GEMM, takes 2-D ones only. The
kernel here is that path in one function: per image and group, blocks of output positions; for
each block, the patch of every position (its input channels times the filter's taps, zero where
the filter reaches past either end of the row) is copied into a buffer on the stack, and the
matmul templates of Note [matmul kernels] (gemm.py) multiply the group's filters by it, plus the
bias, straight into the output's rows. The patches are laid out along positions (the templates'
vector loop, 16 positions at a time) where a block has 16 positions or more, else along the patch
(dot products in vectors along it, the weight's taps and channels one run). The filter is read
in place: its channels and taps must make one run of equally spaced elements (either order).
Padding reads nothing. The images and groups are shared among threads where the work passes the
matmul threshold (Note [thread thresholds measured here] in runtime/codegen/thresholds.py).

Values are not ATen's bits (another summation order); the tests check them against eager within
float32's tolerances. Taken: one ``aten.convolution`` of 1-D float32 values, not transposed, any
stride, padding, dilation and groups, an output whose positions are one element apart (NCL), a
patch of at most ``BLOCK_FLOATS`` elements. Anything else is declined with the reason. Few
filters a group make the copy dear (each copied element is read once per filter: 2.3x eager's
time with 8 filters a group at 6.6M multiply-adds, 0.88x with 16, perf/results/x86-cpu-unrecorded/patches_cpu.json,
an AMD EPYC): that was a decline, 16 filters a group from 2^18 multiply-adds, set from that one
machine; since 2026-11-28 the kernel and ATen are measured on the machine that runs them, as
for any size (Note [choices by measurement] in runtime/autotune.py). (One-tap ones go to Note [one-tap convolutions] first, which reads the
input in place.)
"""

from __future__ import annotations

from segmenter import FusionGraph, Node

from .. import thresholds
from ..kernel import BESIDE_MARK, Kernel
from ..source.ctypes_ import Declined
from .conv import convolution_args
from .gemm import Product, product_call
from .matconv import checked_operands, matmul_conv_kernel

__all__ = ["BLOCK_FLOATS", "patches_kernel"]

#: floats of one block of patches on the stack (64 KiB)
BLOCK_FLOATS = 1 << 14


def _fill(per_group: int, taps: int, order: str, width: int, block: int, along_positions: bool,
          geometry: tuple[int, int, int, int, int, int, int]) -> list[str]:
    """Lines that copy the patches of ``width`` positions from ``l0`` into ``pt`` (row k of the
    patch at ``pt + k * block`` along positions, or position l at ``pt + l * patch``)."""
    s, p, d, length, positions, sxc, sxl = geometry
    patch = per_group * taps
    row = f"c * {taps} + t" if order == "c" else f"t * {per_group} + c"
    at, step = (f"pt + ({row}) * {block}", "1") if along_positions else (f"pt + {row}", str(patch))
    return [
        f"for (FUSEG_I c = 0; c < {per_group}; ++c)",
        f"  for (FUSEG_I t = 0; t < {taps}; ++t) {{",
        f"    const FUSEG_I off = t * {d} - {p};  // output position l reads input position l * {s} + off",
        f"    const FUSEG_I first = off >= 0 ? 0 : (-off + {s} - 1) / {s};",
        f"    const FUSEG_I end = {length - 1} - off >= 0 ? ({length - 1} - off) / {s} + 1 : 0;",
        f"    FUSEG_I lo = first - l0 < 0 ? 0 : first - l0, hi = (end < {positions} ? end : {positions}) - l0;",
        f"    lo = lo > {width} ? {width} : lo;",
        f"    hi = hi > {width} ? {width} : hi < lo ? lo : hi;",
        f"    float* r = {at};",
        f"    const float* xr = xp + c * {sxc};",
        f"    for (FUSEG_I l = 0; l < lo; ++l) r[l * {step}] = 0.0f;",
        f"    for (FUSEG_I l = lo; l < hi; ++l) r[l * {step}] = xr[((l0 + l) * {s} + off) * {sxl}];",
        f"    for (FUSEG_I l = hi; l < {width}; ++l) r[l * {step}] = 0.0f;",
        "  }",
    ]


def patches_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a 1-D ``aten.convolution`` (Note [1-D convolutions as patches])."""
    a = convolution_args(graph, node)
    if a["spatial"] != 1:
        raise Declined("a 2-D convolution (1-D ones are taken)")
    checked = checked_operands(graph, node, a)
    xm, wm, bm, ym = checked
    groups = a["groups"]
    (N, _, length), (filters, per_group, taps) = xm.shape, wm.shape
    positions = ym.shape[2]
    (sxn, sxc, sxl), (syn, syo, syl), (swo, swc, swt) = xm.stride, ym.stride, wm.stride
    # the filter as a matrix of rows of patches: channel-major (c * taps + t) or tap-major
    if taps == 1 or per_group == 1 or swc == taps * swt:
        order, ks = "c", (swt if taps > 1 else swc)
    elif swt == per_group * swc:
        order, ks = "t", swc
    else:
        raise Declined(f"a weight of strides {list(wm.stride)} whose channels and taps are not one run")
    patch = per_group * taps
    if patch == 0 or positions == 0 or N == 0:
        raise Declined("an empty convolution")
    if patch > BLOCK_FLOATS:
        raise Declined(f"patches of {patch} elements: more than a block on the stack holds ({BLOCK_FLOATS})")
    work = N * filters * patch * positions
    og, sb = filters // groups, (bm.stride[0] if bm is not None else 0)
    # positions a block: as many as the stack buffer holds, in multiples of 64 columns (else 16)
    # where there are that many: whole register tiles on AVX-512 and AVX2 (Note [register tiles]
    # in runtime/codegen/source/gemm_prelude.py; a tile cut short by the block's edge is masked)
    fits = BLOCK_FLOATS // patch
    block = max(1, min(positions, fits // 64 * 64 if fits >= 64 else fits // 16 * 16 if fits >= 16 else fits))
    # columns of the product along the output's unit-stride dim: positions (Y = W @ patches) or,
    # where torch makes the output channels-last (after a channels-last weight), filters
    # (Y^T = patches^T @ W^T, the patches along the patch)
    if positions <= 1 or syl == 1:
        along = block >= 16 or ks != 1  # patches along positions (vectors of positions), else along the patch
        bstride = (block, 1) if along else (1, patch)

        def product(width: int) -> Product:
            return product_call(og, width, patch, (swo, ks), bstride, syo, (sb, 0) if bm is not None else None)
        operands, out_at = (f"w_ + j * {og * swo}", "pt"), "yp + l0"
    elif og <= 1 or syo == 1:
        along = False

        def product(width: int) -> Product:
            return product_call(width, og, patch, (patch, 1), (ks, swo), syl, (0, sb) if bm is not None else None)
        operands, out_at = ("pt", f"w_ + j * {og * swo}"), f"yp + l0 * {syl}"
    else:
        raise Declined(f"an output of strides {list(ym.stride)}: neither positions nor filters one element apart")
    (s,), (p,), (d,) = a["stride"], a["padding"], a["dilation"]
    geometry = (s, p, d, length, positions, sxc, sxl)
    b = f"b_ + j * {og * sb}" if bm is not None else "nullptr"
    lines = [f"  for (FUSEG_I n = 0; n < {N}; ++n)",
             f"    for (FUSEG_I j = 0; j < {groups}; ++j) {{",
             f"      const float* xp = x_ + n * {sxn} + j * {per_group * sxc};",
             f"      float* yp = y_ + n * {syn} + j * {og * syo};",
             f"      float pt[{patch * block}];"]
    full, tail = positions // block * block, positions % block
    body: list[str] = []
    for width, start in ((block, None), (tail, full)):
        if width == 0:
            continue
        call = product(width)
        fill = _fill(per_group, taps, order, width, block, along, geometry)
        head = (f"for (FUSEG_I l0 = 0; l0 < {full}; l0 += {block}) {{" if start is None
                else f"{{ const FUSEG_I l0 = {start};")
        body += [head, *(f"  {line}" for line in fill),
                 f"  {call(*operands, b, out_at)};", "}"]
    lines += [f"      {line}" for line in body]
    lines.append("    }")
    least = thresholds.current()
    if work >= least.macs and N * groups > 1:
        lines.insert(0, "#pragma omp parallel for collapse(2) schedule(static)" + (BESIDE_MARK if work < least.beside_macs
                                                                                  else ""))
    return matmul_conv_kernel("fuseg_patches_", node, a, checked, lines, work)
