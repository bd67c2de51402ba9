"""Gathers at constant affine indices: ``x[i0, i1, ...]`` whose index tensors are computed once,
when the program is compiled, and whose addresses step evenly, read as one strided view.

Note [gathers at constant affine indices]: the attention-mask code of `transformers` decoders
(llama, mistral, gpt2 and their kin) reads a [batch, seq] tensor at index tensors made by
``arange`` and ``unsqueeze`` (batch index 0, positions 0..15): four ``aten.index.Tensor`` calls a
call, ~10 us each in ATen (it builds a TensorIterator over broadcast index tensors) for 16
elements. Those index tensors read no graph input, so the program computes them when it is
compiled (Note [folded segments] in runtime/compiled/program.py), and then the gather's element ``p``
lies at ``c + sum_d a_d * p_d`` elements past ``x``'s offset for some integers ``c`` and ``a``
exactly when every index is affine in ``p``: checked element by element here, on the folded
values (negative indices wrapped as ATen wraps them; any index out of range, a negative step, an
index tensor that is not an integer one, a bool mask, or more than ``MAX_CHECKED`` elements leaves
the op to ATen, which raises or gathers as before). ``None`` slots (full slices: falcon reads its
fused q/k/v as ``x[:, :, [-2]]``) are taken, since the addresses are found by ATen's own index.
The launch then copies that strided view of ``x`` into a fresh buffer of the planned layout: the
output is new memory, as
ATen's is (no aliasing), and ``x`` is only read inside its own extent (every index is in range;
where ``x`` is a graph input, its storage is checked to hold that extent on every call).
Measured in ``perf/results/x86-cpu-unrecorded/before_after_gather_cpu.json``.
"""

from __future__ import annotations

import math

import torch

from segmenter import Segment, SegmentKind
from segmenter.ir.graph import ValueRef

from ..backends.base import BuildContext, SegmentLaunch
from ..emit.wrapper import Code
from ..storage import layout

__all__ = ["MAX_CHECKED", "AffineGather", "affine_gather", "affine_view"]

#: most output elements whose indices are checked when the program is compiled
MAX_CHECKED = 1 << 16


def affine_view(x_shape: tuple[int, ...], x_stride: tuple[int, ...], indices: list[torch.Tensor | None],
                out_shape: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """``(strides, offset)`` in elements of ``x`` (from its own offset) of the view of ``x`` that
    holds ``x[indices]`` for ``out_shape``, where one exists with non-negative strides; else None.
    ``indices`` as ``aten.index.Tensor`` takes them: a None slot (and every dim past the last
    index) is a full slice. Each element's address is found by ATen's own index applied to
    ``x``'s addresses (per dim, an expanded arange: nothing of ``x``'s size is made), so where
    the indexed dims land, how negative indices wrap and which indices are out of range (None
    here: ATen raises when called) are torch's rules."""
    if not indices or len(indices) > len(x_shape) or all(t is None for t in indices):
        return None
    if any(t is not None and t.dtype not in (torch.int64, torch.int32) for t in indices):
        return None
    if not 0 < math.prod(out_shape) <= MAX_CHECKED or 0 in x_shape:
        return None
    key = [None if t is None else t.detach().to("cpu", torch.int64) for t in indices]
    address = torch.zeros(out_shape, dtype=torch.int64)
    for d, (n, st) in enumerate(zip(x_shape, x_stride)):
        shape = [1] * len(x_shape)
        shape[d] = n
        term = (torch.arange(n, dtype=torch.int64) * st).view(shape).expand(x_shape)  # x's addresses along d
        try:
            term = torch.ops.aten.index.Tensor(term, key)
        except (IndexError, RuntimeError):  # out of range, or index tensors that do not broadcast
            return None
        if tuple(term.shape) != tuple(out_shape):
            return None
        address += term
    c = int(address.reshape(-1)[0])
    steps, expect = [], torch.full(out_shape, c, dtype=torch.int64)
    for d, n in enumerate(out_shape):
        if n == 1:
            steps.append(1)
            continue
        unit = [0] * len(out_shape)
        unit[d] = 1
        a = int(address[tuple(unit)]) - c
        if a < 0:
            return None
        steps.append(a)
        shape = [1] * len(out_shape)
        shape[d] = n
        expect = expect + torch.arange(n, dtype=torch.int64).view(shape) * a
    if not torch.equal(address, expect):
        return None
    return tuple(steps), c


class AffineGather(SegmentLaunch):
    """See Note [gathers at constant affine indices]: the gather as a copy of one strided view."""

    backend = "torch"

    def __init__(self, ctx: BuildContext, seg: Segment, src: str, stride: tuple[int, ...], delta: int) -> None:
        self.ctx, self.segment = ctx, seg
        self.stride, self.delta = stride, delta
        #: the value gathered from, read through a view made without the dispatcher, which checks
        #: no storage bounds: where it is a graph input, the entry checks that its storage holds
        #: its planned extent, as for a kernel's (Note [kernel reads stay in storage] in
        #: runtime/backends/kernels.py)
        self.raw_source = src

    def in_place_of_copy(self) -> tuple[str, int] | None:
        """``(source, bytes past its first element)`` where the gathered elements already lie in
        the source at the output's planned layout (every dim with more than one element has the
        planned stride: llama's mask reads ``x[0, 0:16]`` of a [1, 16] tensor), so a kernel
        compiled for that layout may read them there (Note [views passed as pointers] in
        runtime/compiled/pointers.py); else None."""
        m = self.ctx.graph.metas[self.segment.nodes[0].outputs[0]]
        if any(n > 1 and a != b for n, a, b in zip(m.shape, m.stride, self.stride)):
            return None
        return self.raw_source, self.delta * m.itemsize

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        out = self.segment.nodes[0].outputs[0]
        if out in code.pointers:  # Note [views passed as pointers]: read where it lies
            dead = code.dying(self.segment.inputs, dying)
            if dead:
                code.dels(dead)
            return
        m = self.ctx.graph.metas[out]
        empty = code.const(layout.empty_fn(code.fast, self.ctx.device))
        rt = code.const(layout.reinterpret_fn(code.fast))
        v = code.var(out)
        code.line(f"{v} = {empty}({code.const(m.shape)}, {code.const(m.stride)}, {code.const(m.dtype)})")
        code.line(f"{v}.copy_({rt}({code.var(self.raw_source)}, {code.const(m.shape)}, {code.const(self.stride)}, {self.delta}))")
        dead = [x for x in self.segment.inputs if x in dying]
        if dead:
            code.dels(dead)


def affine_gather(ctx: BuildContext, seg: Segment, fixed: dict[str, torch.Tensor]) -> AffineGather | None:
    """The launch for an OPAQUE segment of one ``aten.index.Tensor`` whose index tensors are all
    computed when compiled and affine (``affine_view``), or None (it stays on ATen)."""
    if seg.kind != SegmentKind.OPAQUE or len(seg.nodes) != 1 or seg.nodes[0].op != "aten.index.Tensor":
        return None
    node = seg.nodes[0]
    if len(node.args) != 2 or node.kwargs or len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    x, idx = node.args
    if not isinstance(x, ValueRef) or not isinstance(idx, tuple) or ctx.targets(seg):
        return None
    if not all(i is None or (isinstance(i, ValueRef) and i.name in fixed) for i in idx) or x.name in fixed:
        return None
    out = node.outputs[0]
    g = ctx.graph
    xm, om = g.metas[x.name], g.metas[out]
    if {x.name, out} & ctx.materialize or xm.conj or xm.neg or om.conj or om.neg or xm.dtype != om.dtype:
        return None
    if any(st == 0 and n > 1 for n, st in zip(om.shape, om.stride)):
        return None
    if any(st < 0 for st in xm.stride):  # pragma: no cover - planned layouts never have them
        return None
    found = affine_view(xm.shape, xm.stride, [None if i is None else fixed[i.name] for i in idx], om.shape)
    if found is None:
        return None
    return AffineGather(ctx, seg, x.name, *found)
