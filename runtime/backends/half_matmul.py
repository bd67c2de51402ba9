"""The half-matmul backend: an fp16 or bf16 matmul on the CPU computed by ATen's float32 GEMM on
its operands widened, the product rounded back, where that was measured faster here than ATen's
own op in the half dtype.

Note [half matmuls in float]: a CPU without AVX512-FP16 or AMX-FP16 has no fast fp16 GEMM in
ATen: torch 2.13's ``mm``/``addmm`` of fp16 operands laid out as ``x @ w`` (a GPT-2 Conv1D) run a
plain loop, 271 ms for 256x768 by 768x2304 on the AMD EPYC family 25 model 17 of the records,
where the float32 product takes 5.7 ms; an fp16 GPT-2 at hidden 768 spent 99.6% of its 2.3 s
call there (eager and Inductor alike: Inductor calls the same op). Widening both operands,
ATen's float32 op, and rounding the product to fp16 computes the same sums in float (ATen's fp16
GEMM accumulates in float too) in another order, with one rounding at the end as there: the
product can differ from eager's in the last fp16 bit at places, as a generated float32 matmul
differs from ATen's BLAS. bf16 has oneDNN's kernels on a CPU with avx512_bf16 and is seldom
slower, but no rule says which CPU has what, so each shape is measured: both ways on made-up
operands of its layouts, once per machine (the verdict kept with the kernels' verdicts, Note
[choices by measurement] in runtime/autotune.py), on at most ``_MEASURED_MACS`` multiply-adds:
a product with more is measured on its first rows of A (a slow half GEMM costs seconds a call at
a vocabulary projection's size), at least 64, and both times are taken to the whole product's
rows: in proportion, except the widening of B, which does not grow with the rows (timed apart;
taken in proportion, it made a Llama projection's 11 measured rows say ATen, 2.0 ms against 5.2,
where its 256 rows took 21 ms on ATen and 7 in float). A symbolic plan measures at its first
sizes; where the float way won there, each size class is chosen again at its first call (Note
[half matmuls chosen by class]). Not taken: with
``torch.use_deterministic_algorithms(True)`` (eager's op, eager's bits: Note [no choice by
timing] in runtime/backends/im2col.py), under ``autotune.fixed`` (the tests of generated kernels
and benchmarks of ATen's path), a product whose operands or output are not all one half dtype,
and a segment other than one ``mm``/``addmm``/``bmm`` among views.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from segmenter import Node, OpKind, Segment, op_info
from segmenter.ir.graph import ValueRef
from segmenter.ir.symbolic import is_symbolic, size_hint

from .. import autotune
from ..codegen import Declined
from ..codegen.kernel import bind
from ..codegen.opaque.gemm import MATMULS
from ..emit.wrapper import Code
from .base import Backend, BuildContext, SegmentLaunch
from .measured import made_up
from .torch_backend import TorchLaunch, emit_node, emit_torch, op_entry, render_args

__all__ = ["ByClass", "HalfMatmulBackend", "in_float", "on_aten"]

_HALVES = (torch.float16, torch.bfloat16)
#: multiply-adds a measurement runs a product of at most (more: its first rows of A only) ...
_MEASURED_MACS = 1 << 25
#: ... but never fewer rows than this (a few rows may take another path: ATen's fp16 product of
#: 11 rows took 0.18 ms a row, of 256 rows 0.08)
_MIN_ROWS = 64


def in_float(op: Callable[..., torch.Tensor], *args: Any, out: torch.Tensor | None = None,
             **kwargs: Any) -> torch.Tensor:
    """``op`` of the tensors of ``args`` widened to float32, its result rounded to their dtype (into
    ``out`` where given: a buffer of its own, Note [huge pages for big buffers], rounded as it is copied)."""
    half = next(a.dtype for a in args if isinstance(a, torch.Tensor))
    r = op(*[a.float() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    return r.to(half) if out is None else out.copy_(r)


def on_aten(op: Callable[..., torch.Tensor], *args: Any, out: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """``op`` as eager runs it, in the half dtype (``in_float``'s signature; into ``out`` where given)."""
    r = op(*args, **kwargs)
    return r if out is None else out.copy_(r)


class HalfMatmulLaunch(TorchLaunch):
    backend = "half-matmul"

    def __init__(self, ctx: BuildContext, seg: Segment, by_class: ByClass | None = None) -> None:
        super().__init__(ctx, seg)
        #: a symbolic plan's product, its way chosen per size class (Note [half matmuls chosen by class])
        self.by_class = by_class

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        way: Callable[..., torch.Tensor] = self.by_class if self.by_class is not None else in_float

        def emit(code: Code, node: Node, out: str | None) -> None:
            """The product in float (or as chosen by class), every other node as torch runs it."""
            if node.op not in MATMULS:
                emit_node(code, node, out)
                return
            (o,) = node.outputs
            args = [code.const(op_entry(node)._op), *render_args(code, node)] + ([f"out={code.var(out)}"] if out else [])
            code.line(f"{code.var(o)} = {code.const(way)}({', '.join(args)})")

        emit_torch(code, self.ctx, self.segment, dying, emit)


def _operands(node: Node) -> dict[str, ValueRef]:
    """The product's operands in the op's order, by role: X (addmm's bias), A, B."""
    a = bind(node)
    if node.op == "aten.addmm.default":
        if any(not (isinstance(a.get(k), (int, float)) and not isinstance(a.get(k), bool) and a.get(k) == 1)
               for k in ("beta", "alpha")):
            raise Declined("addmm with beta or alpha other than 1")
        refs = {"X": a.get("self"), "A": a.get("mat1"), "B": a.get("mat2")}
    else:
        refs = {"A": a.get("self"), "B": a.get("mat2")}
    if not all(isinstance(v, ValueRef) for v in refs.values()):
        raise Declined("a matmul of something other than tensor values")
    return refs


def _dim(n: int, symbolic: bool) -> str:
    """A size in a verdict's key: a symbolic one by its class (as a measured kernel's key names it)."""
    return str(autotune.class_of_bits(max(n, 0).bit_length())) if symbolic else str(n)


def _key_of(op: str, dtype: torch.dtype, layouts: list[tuple[list[str], list[str]]]) -> str:
    parts = " ".join(f"{'x'.join(shape)}/{','.join(stride)}" for shape, stride in layouts)
    return f"half matmul in float: {op} {str(dtype).removeprefix('torch.')} {parts}; threads {torch.get_num_threads()}"


def _key(node: Node, metas: list[Any]) -> str:
    """The verdict's key: the op, its operands' layouts (a symbolic size by its class at the first
    call's sizes) and torch's threads."""
    return _key_of(node.op, metas[0].dtype, [([_dim(size_hint(n), is_symbolic(n)) for n in m.shape],
                                              [_dim(size_hint(n), is_symbolic(n)) for n in m.stride]) for m in metas])


class _Layout:
    """A call's operand as ``_measure`` reads a meta: its shape, strides and dtype."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.stride, self.dtype = tuple(t.shape), t.stride(), t.dtype


# Note [half matmuls chosen by class]: a symbolic plan's product is measured at the plan's first
# sizes (a prompt: many rows). Other sizes can choose the other way: ATen's fp16 loop takes time
# in proportion to the rows, the float way pays the widening of the weight whatever the rows. On
# the AMD EPYC family 25 model 17, one row by a 1024x2816 weight took 2.5-3.7 ms on ATen and
# 4.3-5.6 ms in float (scratch, 2026-12-07), 256 rows 21 ms and 7: a prompt of a few tokens is
# such a product (a generate's decode step is a graph of fixed sizes of its own, measured at its
# one row when it is made). So where the float way won at the
# first sizes, the launch calls a ``ByClass``, which picks the way by the class of the call's sizes
# (every size's and stride's bit length, and torch's threads) from a table it fills at each
# class's first call: the verdict kept for that class (the key written as at the plan, the
# symbolic sizes by their class, each as the call has it), else both ways measured on made-up
# operands of the call's layouts (``_measure``, as at the plan) and the verdict kept. Where ATen
# won at the first sizes the segment stays on torch at every size, as before (bf16 on a CPU with
# avx512_bf16: oneDNN's product won there by 2.5-6x, and no class would be worth its measurement).
# With deterministic algorithms on at a call (whatever the table holds), or fixed choices at a
# class's first call, ATen's op runs (nothing kept); under a dispatch mode of the caller's, the
# float way (as the plan was made; nothing measured).
class ByClass:
    """A symbolic plan's half product, run the way measured faster for the class of each call's
    sizes (Note [half matmuls chosen by class]); called as ``in_float`` is."""

    def __init__(self, node: Node, metas: dict[str, Any]) -> None:
        self.node, self.dtype = node, metas["A"].dtype
        self.symbolic = [([is_symbolic(n) for n in m.shape], [is_symbolic(n) for n in m.stride]) for m in metas.values()]
        self.roles = list(metas)
        #: class (torch's threads, every size's and stride's bit length) -> ``in_float`` or ``on_aten``
        self.table: dict[tuple[int, ...], Callable[..., torch.Tensor]] = {}
        #: the verdict keys this launch measured at its calls, in this process
        self.measured: list[str] = []

    def __call__(self, op: Callable[..., torch.Tensor], *args: Any, out: torch.Tensor | None = None,
                 **kwargs: Any) -> torch.Tensor:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        cls = (torch.get_num_threads(), *[n.bit_length() for t in tensors for n in (*t.shape, *t.stride())])
        way = self.table.get(cls)
        if way is None or torch.are_deterministic_algorithms_enabled():
            way = self._choose(cls, tensors)
        return way(op, *args, out=out, **kwargs)

    def _choose(self, cls: tuple[int, ...], tensors: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
        if torch.are_deterministic_algorithms_enabled() or autotune.policy() != "measure":
            return on_aten  # (Note [no choice by timing]; not kept: the next call looks again)
        if _get_current_dispatch_mode() is not None or len(tensors) != len(self.roles):
            return in_float  # as the plan was made, untimed
        layouts = [([_dim(n, s) for n, s in zip(t.shape, shape)], [_dim(n, s) for n, s in zip(t.stride(), stride)])
                   for t, (shape, stride) in zip(tensors, self.symbolic)]
        key = _key_of(self.node.op, self.dtype, layouts)
        verdict = autotune.lookup(key)
        if verdict is None:
            verdict = _measure(self.node, {role: _Layout(t) for role, t in zip(self.roles, tensors)})
            autotune.record(key, verdict)
            self.measured.append(key)
        way = self.table[cls] = in_float if verdict.kernel else on_aten
        return way


class HalfMatmulBackend(Backend):
    name = "half-matmul"
    device = "cpu"

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        products = [n for n in seg.nodes if n.op in MATMULS]
        if len(products) != 1 or any(op_info(n.op).kind != OpKind.VIEW for n in seg.nodes if n.op not in MATMULS):
            raise Declined("not one mm/addmm/bmm among views")
        node = products[0]
        refs = _operands(node)
        metas = [ctx.graph.metas[v.name] for v in refs.values()]
        out = node.outputs[0] if len(node.outputs) == 1 else None
        dtypes = {m.dtype for m in metas} | ({ctx.graph.metas[out].dtype} if out is not None else set())
        if out is None or len(dtypes) != 1 or metas[0].dtype not in _HALVES:
            raise Declined("not a product of fp16 or bf16 values alone (float32 ones are the cpp backend's)")
        if torch.are_deterministic_algorithms_enabled():
            raise Declined("deterministic algorithms are on (torch.use_deterministic_algorithms): no choice by "
                           "timing, ATen's half op as in eager")
        if autotune.policy() != "measure":
            raise Declined(f"choices fixed (autotune.fixed({autotune.policy()!r})): ATen's half op")
        key = _key(node, metas)
        verdict = autotune.lookup(key)
        if verdict is None:
            verdict = _measure(node, {role: ctx.graph.metas[v.name] for role, v in refs.items()})
            autotune.record(key, verdict)
        if not verdict.kernel:
            raise Declined(f"ATen's {str(metas[0].dtype).removeprefix('torch.')} op measured faster on this CPU "
                           f"({verdict.aten_us:.1f} us a call against {verdict.kernel_us:.1f} us in float32; "
                           "Note [half matmuls in float])")
        if any(is_symbolic(m) for m in metas) and all(v in node.args for v in refs.values()):
            return HalfMatmulLaunch(ctx, seg, ByClass(node, {role: ctx.graph.metas[v.name] for role, v in refs.items()}))
        return HalfMatmulLaunch(ctx, seg)


def _measure(node: Node, metas: dict[str, Any]) -> autotune.Verdict:
    """Both ways on made-up operands (``metas``: by role, in the op's order; Note [half matmuls in
    float]). Past ``_MEASURED_MACS`` multiply-adds, on the first rows of A (at least ``_MIN_ROWS``),
    and each way's time taken to the product's rows: ATen's in proportion, the float way's in
    proportion less the widening of the operands that do not have A's rows (B, a bias of one row),
    timed apart and counted once."""
    a, b = metas["A"], metas["B"]
    batch = math.prod(size_hint(n) for n in a.shape[:-2])
    m, k, n = size_hint(a.shape[-2]), size_hint(a.shape[-1]), size_hint(b.shape[-1])
    rows = None
    if batch * m * k * n > _MEASURED_MACS and m > _MIN_ROWS:
        rows = min(m, max(_MIN_ROWS, _MEASURED_MACS // max(1, batch * k * n)))
    made, whole = [], []
    for role, meta in metas.items():
        shape = [size_hint(d) for d in meta.shape]
        sliced = rows is not None and (role == "A" or role == "X" and len(shape) == 2 and shape[0] > 1)  # (a bias of m rows)
        if sliced:
            shape[-2] = rows
        made.append(made_up(tuple(shape), tuple(size_hint(st) for st in meta.stride), meta.dtype))
        if not sliced:
            whole.append(made[-1])
    op = op_entry(node)._op
    with torch.no_grad():
        v = autotune.measure(lambda: in_float(op, *made), lambda: op(*made))
        if rows is None:
            return v
        widen_s = statistics.median(_timed(lambda: [t.float() for t in whole]) for _ in range(3))
    scale = m / rows
    fixed_us = min(widen_s * 1e6, v.kernel_us)
    in_float_us = fixed_us + (v.kernel_us - fixed_us) * scale
    aten_us = v.aten_us * scale
    return autotune.Verdict(in_float_us < aten_us, in_float_us, aten_us)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
