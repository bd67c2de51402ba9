"""What the convolution kernels built on the matmul templates share (Note [one-tap convolutions]
in onetap.py, Note [1-D convolutions as patches] in patches.py): the checks of the operands and
the kernel's parameters."""

from __future__ import annotations

import hashlib

import torch

from segmenter import FusionGraph, Node, TensorMeta

from .. import thresholds
from ..kernel import Kernel, Param
from ..source.checks import check_layout, check_segment_metas, lone
from ..source.ctypes_ import Declined
from ..source.index import dense_strides

__all__ = ["Operands", "checked_operands", "matmul_conv_kernel"]

#: input, weight, bias (or None) and output
Operands = tuple[TensorMeta, TensorMeta, TensorMeta | None, TensorMeta]


def checked_operands(graph: FusionGraph, node: Node, a: dict) -> Operands:
    """The metas of ``node``, a convolution with arguments ``a`` (``convolution_args``), or
    ``Declined``: one output, the one torch's meta kernel computes (else not believed), every
    value float32 (what the templates take), each layout one the kernel can index, a dense output,
    groups that divide the channels and the filters, and a bias of one per filter."""
    if len(node.outputs) != 1 or node.outputs[0] is None:
        raise Declined("a convolution without its one output")
    # the recorded output is the op's, or not believed (and torch checks the arguments)
    check_segment_metas(graph, lone(node, tuple(dict.fromkeys(
        v.name for v in (a["input"], a["weight"], a["bias"]) if v is not None))), {})
    xm, wm, ym = graph.metas[a["input"].name], graph.metas[a["weight"].name], node.metas[0]
    bm = graph.metas[a["bias"].name] if a["bias"] is not None else None
    if ym is None or any(m.dtype != torch.float32 for m in (xm, wm, ym, *(bm,) * (bm is not None))):
        raise Declined("a convolution not of float32 values (the matmul templates take float32)")
    for what, m in (("input", xm), ("weight", wm), ("output", ym), *((("bias", bm),) if bm is not None else ())):
        check_layout(m.shape, m.stride, f"{what} of the convolution")
    if any(st != d for n, st, d in zip(ym.shape, ym.stride, dense_strides(ym.shape, ym.stride)) if n > 1):
        raise Declined(f"an output of strides {list(ym.stride)} whose elements are not each at one place of one block")
    groups, (n, c), (filters, per_group) = a["groups"], xm.shape[:2], wm.shape[:2]
    if not (type(groups) is int and groups >= 1 and c == groups * per_group and filters % groups == 0):
        raise Declined(f"groups={groups!r:.20} with an input of {c} channels and a weight of {list(wm.shape)}")
    if ym.shape[:2] != (n, filters) or len(ym.shape) != len(xm.shape):
        raise Declined(f"an output of shape {list(ym.shape)} for an input of {list(xm.shape)} and a weight of "
                       f"{list(wm.shape)}")
    if bm is not None and bm.shape != (filters,):
        raise Declined(f"a bias of shape {list(bm.shape)}")
    return xm, wm, bm, ym


def matmul_conv_kernel(prefix: str, node: Node, a: dict, operands: Operands, lines: list[str], work: int) -> Kernel:
    """The kernel named ``prefix`` + a digest of ``lines`` and its parameters ``x_``, ``w_``, ``b_``
    (where there is a bias) and ``y_``; it calls the matmul routines, whose products, at most
    ``work`` multiply-adds, share threads from the matmul threshold (Note [thread thresholds
    measured here] in runtime/codegen/thresholds.py)."""
    xm, wm, bm, ym = operands
    params = [Param("x_", a["input"].name, xm.dtype, xm.shape, xm.stride, False),
              Param("w_", a["weight"].name, wm.dtype, wm.shape, wm.stride, False)]
    if bm is not None:
        params.append(Param("b_", a["bias"].name, bm.dtype, bm.shape, bm.stride, False))
    params.append(Param("y_", node.outputs[0], ym.dtype, ym.shape, ym.stride, True))
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.shape, p.stride) for p in params])).encode()).hexdigest()[:12]
    least = thresholds.current()
    return Kernel(f"{prefix}{digest}", tuple(params), body, 1, 1, "conv", beside=work < least.beside_macs,
                  parallel_macs=least.macs, pack_rows=(least.pack_rows, least.nn_pack_rows))
