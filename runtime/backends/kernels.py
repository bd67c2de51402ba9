"""Launching a generated kernel (runtime.codegen) for a segment: the part the C++ and CuPy
backends share.

The kernel is lowered when the program is compiled, for the layouts its values will have
(``layouts``; Note [planned layouts] in runtime/storage/layout.py), and built with every other kernel
of the program at once (``Backend.build_all``). Its outputs are written into buffers allocated
in their planned layout or, for a mutated input whose final value the kernel computes (Note
[in-place write-back]), into the input itself. Outputs that are views of a value the kernel
computes stay views of it (made after the launch), so outputs that share a storage in eager
share it here. In a launch run on its own (``Launch.run``, given inputs the program did not
make), each input's layout is compared with the planned one first, and a mismatch runs the
segment on torch instead of misreading it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from segmenter import FusionGraph, GraphError, OpKind, Segment, op_info

from ..codegen import Declined, Kernel
from ..codegen.lowering.lower import check_kind
from ..codegen.memo import lower_memo
from ..codegen.source.index import dense_strides
from ..emit.wrapper import Code
from ..storage import layout, pages
from .base import BuildContext, SegmentLaunch
from .torch_backend import emit_torch

__all__ = ["KernelLaunch", "bits_problem", "check_storage", "device_problem", "layouts", "raw_read_problem", "span_bytes",
           "views_of_outputs"]


def layouts(graph: FusionGraph, seg: Segment, materialize: frozenset[str], written: dict[str, str]) -> dict:
    """value -> (shape, strides) the kernel reads (inputs) or writes (outputs)."""
    out = {}
    for v in (*seg.inputs, *seg.outputs):
        m = graph.metas[v]
        if v in written:
            t = graph.metas[written[v]]
            out[v] = (t.shape, t.stride)
        elif v in materialize:
            out[v] = (m.shape, dense_strides(m.shape, m.stride))
        else:
            out[v] = (m.shape, m.stride)
    return out


def views_of_outputs(graph: FusionGraph, seg: Segment, materialize: frozenset[str]) -> dict[str, str]:
    """Outputs of ``seg`` that are views (a chain of view ops, same dtype) of a value the kernel
    computes: as in the program, they are made as views of that value after the launch (which
    the kernel then writes whole), so they share its storage and keep their offsets. (A value
    that crosses launches as a dense copy, in pre/off, is written by the kernel itself.)"""
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    views = {}
    for o in seg.outputs:
        v = o
        while v in made and op_info(made[v].op).kind == OpKind.VIEW and len(made[v].inputs) == 1:
            v = made[v].inputs[0]
        if v != o and v in made and graph.metas[v].dtype == graph.metas[o].dtype and not {o, v} & materialize:
            views[o] = v
    return views


def bits_problem(graph: FusionGraph, seg: Segment) -> str | None:
    """Why a backend reading raw storage cannot run ``seg``: a value it touches carries a conj/neg
    bit, which raw reads would not see (Note [conjugate and negative bits]); else None."""
    for v in (*seg.inputs, *(o for n in seg.nodes for o in n.outputs if o is not None)):
        m = graph.metas[v]
        if m.conj or m.neg:
            return f"%{v} carries the {'conjugate' if m.conj else 'negative'} bit: left to torch"
    return None


def device_problem(graph: FusionGraph, seg: Segment, device: torch.device) -> str | None:
    """Why a kernel launched on ``device`` cannot read or write ``seg``'s values: one lives on
    another device (a CPU scalar tensor beside CUDA tensors, which ATen reads on the host; a
    raw pointer to host memory read on the GPU is an illegal access), else None. Left to torch."""
    for v in (*seg.inputs, *(o for n in seg.nodes for o in n.outputs if o is not None)):
        d = torch.device(graph.metas[v].device)
        if d.type != device.type or None not in (d.index, device.index) and d.index != device.index:
            return f"%{v} is on {d}, the kernel on {device}: left to torch"
    return None


def raw_read_problem(ctx: BuildContext, seg: Segment) -> str | None:
    """Why a backend reading raw storage on ``ctx.device`` cannot run ``seg`` (``bits_problem``,
    ``device_problem``), else None."""
    return bits_problem(ctx.graph, seg) or device_problem(ctx.graph, seg, ctx.device)


def span_bytes(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes from a tensor's first element to the end of its last one, in this layout."""
    if 0 in shape:
        return 0
    return (sum((n - 1) * st for n, st in zip(shape, stride)) + 1) * dtype.itemsize


def check_storage(t: torch.Tensor, span: int, value: str) -> None:
    """Note [kernel reads stay in storage]: a kernel indexes a tensor from its data pointer (its
    storage offset included) by the planned shape and strides; what is left is that the storage
    really holds that span past the offset. torch's own views always do, but a storage resized
    (or set_) behind a tensor's back does not, and eager itself would read out of bounds there:
    refused."""
    if t.storage_offset() * t.itemsize + span > t.untyped_storage().nbytes():
        raise GraphError(f"value %{value}: its storage holds {t.untyped_storage().nbytes()} bytes, fewer than "
                         f"its layout reaches ({t.storage_offset() * t.itemsize + span}): not read")


class KernelLaunch(SegmentLaunch):
    """A segment as one generated kernel; ``fn`` is set by the backend's ``build_all``."""

    def __init__(self, backend: str, ctx: BuildContext, seg: Segment) -> None:
        self.backend, self.ctx, self.segment = backend, ctx, seg
        check_kind(seg)  # a matmul segment is declined before the work below (half of a model's segments)
        graph = ctx.graph
        why = raw_read_problem(ctx, seg)
        if why is not None:
            raise Declined(why)
        targets = ctx.targets(seg)
        written = {n.outputs[0]: targets[n.name] for n in seg.nodes if n.name in targets}
        views = views_of_outputs(graph, seg, ctx.materialize)
        written_outputs = [o for o in seg.outputs if o not in views]
        lowered = dataclasses.replace(seg, outputs=tuple(dict.fromkeys([*written_outputs, *views.values()])))
        self._bind(lower_memo(ctx.kernel_memo, graph, lowered,
                              layouts(graph, lowered, ctx.materialize, written), targets),
                   hidden={b for b in views.values() if b not in written_outputs},  # written for their views only
                   views=views)

    def _bind(self, kernel: Kernel, hidden: set[str] | None = None, views: dict[str, str] | None = None) -> None:
        """The launch's kernel, the values it writes only for their views, and those views (view ->
        the value it views)."""
        self.kernel: Kernel = kernel
        self.hidden = hidden if hidden is not None else set()
        m = self.ctx.graph.metas
        self.views = [(o, b, m[o], m[o].storage_offset - m[b].storage_offset) for o, b in (views or {}).items()]
        self.fn: Callable[..., Any] | None = None
        #: how often a launch run on its own found an input in another layout than planned (and ran on torch)
        self.stats = {"layout_fallbacks": 0}

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        k, ctx = self.kernel, self.ctx
        ins = [p for p in k.params if not p.output]
        outs = [p for p in k.params if p.output]
        if guard:  # inputs (and in-place targets) this launch did not see made: compared with the plan
            same = code.const(_same)
            read = [(p.value, p) for p in ins] + [(p.target, p) for p in outs if p.target]
            test = " and ".join(f"{same}({code.var(v)}, {code.const((p.shape, p.stride, p.dtype))})" for v, p in read)
            code.line(f"if {test or 'True'}:")
            code.indent += "    "
            for v, p in read:
                code.line(f"{code.const(check_storage)}({code.var(v)}, {code.value(span_bytes(p.shape, p.stride, p.dtype))}, "
                          f"{code.const(v)})")
        for p in outs:
            if p.target:
                code.line(f"{code.var(p.value)} = {code.var(p.target)}")
            else:
                code.line(f"{code.var(p.value)} = {self.alloc(code, p.shape, p.stride, p.dtype)}")
        if any(_numel(p.shape) for p in outs):
            self.emit_call(code, [p.value for p in (*ins, *outs)])
        dead = code.dying(self.segment.inputs, dying)  # Note [views passed as pointers]
        if dead:
            code.dels(dead)
        rt = code.const(layout.reinterpret_fn(code.fast))
        for o, b, m, delta in self.views:  # views stay views of what they view, as in the program
            code.line(f"{code.var(o)} = {rt}({code.var(b)}, {code.const(m.shape)}, {code.const(m.stride)}, {code.value(delta)})")
        if self.hidden:
            code.dels(sorted(self.hidden))
        if guard:
            code.indent = code.indent[:-4]
            code.line("else:")
            with code.block():
                code.line(f"{code.const(self.stats)}['layout_fallbacks'] += 1")
                emit_torch(code, ctx, self.segment, dying)

    def alloc(self, code: Code, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> str:
        span = span_bytes(shape, stride, dtype)
        huge = pages.wants_huge(span, self.ctx.device, code.fast)
        if huge is None:  # a symbolic size: huge pages or not, at the call
            return (f"{code.const(pages.empty_sized)}({code.const(shape)}, {code.const(stride)}, {code.const(dtype)}, "
                    f"{code.value(span)})")
        if huge:
            empty = code.const(pages.empty_huge)  # Note [huge pages for big buffers]
        else:
            empty = code.const(layout.empty_fn(code.fast, self.ctx.device))
        return f"{empty}({code.const(shape)}, {code.const(stride)}, {code.const(dtype)})"

    def emit_call(self, code: Code, values: list[str]) -> None:
        """The kernel's call on these graph values (inputs, then outputs)."""
        raise NotImplementedError

    def built(self, code: Code) -> str:
        """The global name of the built kernel (``build_all`` runs before any emission)."""
        if self.fn is None:  # pragma: no cover
            raise RuntimeError("kernel not built")
        return code.const(self.fn)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _same(t: torch.Tensor, planned: tuple[tuple[int, ...], tuple[int, ...], torch.dtype]) -> bool:
    shape, stride, dtype = planned
    return (t.dtype == dtype and tuple(t.shape) == shape
            and all(a == b for n, a, b in zip(shape, t.stride(), stride) if n != 1))

