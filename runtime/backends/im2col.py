"""The im2col backend: a lone 2-D convolution on the CPU as ATen's im2col + GEMM
(``aten.thnn_conv2d``, what eager itself runs with oneDNN off) where that was measured faster
here than oneDNN's convolution, eager's choice.

Note [small convolutions]: eager sends every float convolution on the CPU to oneDNN, which costs
60-95 us a call on this 2-core machine kind whatever the size (resnet-tiny's 16 convolutions,
2x16x8x8 and the like: 1336 us in all), where im2col + GEMM takes 12-22 us for the same ones
(413 us in all); on big ones oneDNN wins by far. No size rule holds across machines and thread
counts, so each shape is measured once per process, when its program is built: both ways, on
made-up inputs of the segment's own layouts, after one untimed call each (oneDNN builds its kernel
for a new shape then, which takes milliseconds), interleaved, the median of each. A convolution of
over ``_MAX_MACS`` multiply-adds is not measured (its calls take milliseconds; a single timing of
one was no guide either: a call of a small one took 4-36 ms while the machine was busy) and stays
with oneDNN. The two compute the same sums in another order: results differ from eager's in the
last bits (4.5e-7 on resnet-tiny's output), as any other compiler's kernels do. Inputs of over
``_MAX_MADE_UP_BYTES`` are not measured either (a strided convolution of a huge input has few
multiply-adds, and the measurement allocates its inputs).

Note [no choice by timing]: a measurement can come out either way where the two are close, so two
processes may build the same program with different choices, whose results differ in the last
bits (bit-tiny trained: im2col in one process out of six, gradients up to 1e-3 apart, loss
-1.0434331 against -1.0434643; found by a scratch run over unseen models). With
``torch.use_deterministic_algorithms(True)`` nothing is measured and every convolution stays with
oneDNN, eager's choice, so a program gives the same bits in every process (dynamo guards the
setting, so turning it on recompiles).

Taken: a segment that is one ``aten.convolution`` of a 4-D float32/float64 input in contiguous
(NCHW) layout, with a dense weight, groups 1, dilation 1, stride and padding two integers each
(``planar_args`` in runtime/codegen/opaque/conv.py), not transposed, its output contiguous and not
written into an input. Anything else is declined with the reason and runs on torch;
``backend="torch"`` (the reference path) never comes here.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

from segmenter import Node, Segment, TensorMeta

from ..codegen import Declined
from ..codegen.opaque.conv import CONVOLUTION, planar_args
from .base import Backend, BuildContext, SegmentLaunch
from .torch_backend import TorchLaunch

__all__ = ["Im2colBackend"]

_MAX_MACS = 50_000_000  # a convolution with more multiply-adds: oneDNN's, not measured (milliseconds a call)
_MAX_MADE_UP_BYTES = 64 << 20  # the made-up inputs a measurement may allocate
_ROUNDS = 5
#: measured shapes in this process: key -> (im2col + GEMM us, oneDNN us)
_MEASURED: dict[tuple, tuple[float, float]] = {}


class Im2colLaunch(TorchLaunch):
    backend = "im2col"


def _dense(m: TensorMeta) -> bool:
    """Each element of the shape at its own place in one block (any order of dims)."""
    expected = 1
    for n, st in sorted(((n, st) for n, st in zip(m.shape, m.stride) if n != 1), key=lambda d: d[1]):
        if st != expected:
            return False
        expected *= n
    return True


def _why_not(ctx: BuildContext, node: Node, a: dict) -> str | None:
    """Why ``node``, a 2-D convolution with arguments ``a`` (``planar_args``), is not one
    this backend takes, or None."""
    x, w, out = ctx.graph.metas[a["input"].name], ctx.graph.metas[a["weight"].name], node.metas[0]
    if a["groups"] != 1:
        return f"groups={a['groups']} (im2col + GEMM takes groups=1)"
    if a["dilation"] != (1, 1):
        return f"dilation={list(a['dilation'])} (im2col takes dilation 1)"
    if x.dtype not in (torch.float32, torch.float64) or w.dtype != x.dtype:
        return f"a {str(x.dtype).removeprefix('torch.')} convolution (float32 and float64 only)"
    if not x.is_contiguous() or out is None or not out.is_contiguous():
        return "an input or output not in contiguous (NCHW) layout: oneDNN keeps its layout"
    if not _dense(w):
        return "a weight whose elements are not each at one place"
    if node.name in ctx.in_place:
        return "a convolution written into an input"
    return None


def _measure(key: tuple, run_onednn: Callable[[], object], run_im2col: Callable[[], object]) -> tuple[float, float]:
    """Median microseconds of one call each way, interleaved (Note [small convolutions])."""
    del key  # what the result is cached under (tests see which shapes were measured)
    run_onednn()  # oneDNN builds its kernel for a new shape on its first call (milliseconds)
    run_im2col()
    times: dict[str, list[float]] = {"im2col": [], "onednn": []}
    for _ in range(_ROUNDS):
        for name, run in (("onednn", run_onednn), ("im2col", run_im2col)):
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1e6)
    return statistics.median(times["im2col"]), statistics.median(times["onednn"])


def _made_up(m: TensorMeta) -> torch.Tensor:
    t = torch.empty_strided(m.shape, m.stride, dtype=m.dtype)
    return t.copy_(torch.randn(m.shape, dtype=m.dtype))


class Im2colBackend(Backend):
    name = "im2col"
    device = "cpu"
    opaque_ops = frozenset({CONVOLUTION})
    kernel_segments = False

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        if len(seg.nodes) != 1 or seg.nodes[0].op != CONVOLUTION:
            raise Declined("not a lone convolution")
        node = seg.nodes[0]
        a = planar_args(ctx.graph, node)
        why = _why_not(ctx, node, a)
        if why is not None:
            raise Declined(why)
        x, w, bias, stride, padding = a["input"], a["weight"], a["bias"], a["stride"], a["padding"]
        xm, wm = ctx.graph.metas[x.name], ctx.graph.metas[w.name]
        bm = ctx.graph.metas[bias.name] if bias is not None else None
        kernel = tuple(wm.shape[2:])
        macs = node.metas[0].numel * wm.shape[1] * kernel[0] * kernel[1]
        if macs > _MAX_MACS:
            raise Declined(f"a big convolution ({macs / 1e6:.0f}M multiply-adds): left to oneDNN, not measured")
        made_up = xm.nbytes + wm.nbytes + (bm.nbytes if bm is not None else 0)
        if made_up > _MAX_MADE_UP_BYTES:  # a strided convolution of a huge input has few multiply-adds
            raise Declined(f"inputs of {made_up / 2**20:.0f} MiB: left to oneDNN, not measured")
        if torch.are_deterministic_algorithms_enabled():  # Note [no choice by timing]
            raise Declined("deterministic algorithms are on (torch.use_deterministic_algorithms): "
                           "no choice by timing, oneDNN's convolution as in eager")
        key = (xm.shape, wm.shape, wm.stride, bm is not None, stride, padding, xm.dtype,
               torch.get_num_threads())
        times = _MEASURED.get(key)
        if times is None:
            xt, wt = _made_up(xm), _made_up(wm)
            bt = _made_up(bm) if bm is not None else None
            conv = torch.ops.aten.convolution.default
            im2col = torch.ops.aten.thnn_conv2d.default
            with torch.no_grad():
                times = _measure(key, lambda: conv(xt, wt, bt, list(stride), list(padding), [1, 1], False, [0, 0], 1),
                                 lambda: im2col(xt, wt, list(kernel), bt, list(stride), list(padding)))
            _MEASURED[key] = times
        t_im2col, t_onednn = times
        if not t_im2col < t_onednn:
            raise Declined(f"oneDNN's convolution measured faster for this shape ({t_onednn:.1f} us a call against "
                           f"{t_im2col:.1f} us as im2col + GEMM)")
        thnn = dataclasses.replace(node, op="aten.thnn_conv2d.default", args=(x, w, kernel, bias, stride,
                                                                             padding))
        return Im2colLaunch(ctx, dataclasses.replace(seg, nodes=(thnn,)))
