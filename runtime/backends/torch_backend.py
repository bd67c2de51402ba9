"""The torch backend: a segment's ATen ops called one after the other, as eager would.

It takes every segment (MATMUL and OPAQUE segments only run here), is the reference the other
backends are tested against, and is what a generated kernel falls back to. Each op is emitted as
a direct call of the op's C++ entry point (``OpOverload._op``: no Python frame of the overload
object in between), intermediates are deleted at their last use, and the segment's outputs are
handed on in their planned layout (runtime/storage/layout.py): a dense copy where the plan says the value
crosses launches as one ("pre"/"off"), a fresh buffer where a kernel segment's output would
otherwise share the storage of its input (the plan computed it; torch's view op did not copy).
"""

from __future__ import annotations

import functools
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from segmenter import GraphError, Node, OpKind, Segment, SegmentKind, TensorMeta, op_info
from segmenter.ir.graph import OpRef, ValueRef
from segmenter.ir.ops import resolve_op, why_not_runnable
from segmenter.ir.symbolic import is_symbolic

from ..codegen.source.index import dense_strides
from ..emit.inplace import out_overload
from ..emit.views import planned_views
from ..emit.wrapper import Code
from ..storage import layout, pages
from .base import Backend, BuildContext, SegmentLaunch

__all__ = ["TorchBackend", "TorchLaunch", "emit_node", "emit_nodes", "emit_torch", "op_entry", "render_args"]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def op_entry(node: Node) -> torch._ops.OpOverload:
    op = resolve_op(node.op)
    if not isinstance(op, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
        raise GraphError(f"node {node.name!r}: {why_not_runnable(node.op)}; it cannot be run")
    return op


def _render(code: Code, a: Any) -> str:
    """An argument as a Python expression: a local for a tensor value, a bound global otherwise."""
    if isinstance(a, ValueRef):
        return code.var(a.name)
    if isinstance(a, OpRef):
        op = resolve_op(a.name)
        if not isinstance(op, torch._ops.OpOverload):
            raise GraphError(f"op argument {a.name} is not an ATen op known to torch")
        return code.const(op)
    if isinstance(a, tuple):
        if any(isinstance(x, (ValueRef, tuple, OpRef)) for x in a):
            return "[" + "".join(_render(code, x) + ", " for x in a) + "]"
        return code.const(list(a))
    if a is None or type(a) is bool or type(a) is int:
        return repr(a)  # digits, True/False/None only
    return code.const(a)


def render_args(code: Code, node: Node) -> list[str]:
    """``node``'s arguments as Python expressions, its keyword arguments as ``name=value``."""
    names = _argument_names(op_entry(node)) if node.kwargs else None
    for k, _ in node.kwargs:
        # keyword names reach the source: only identifiers, and only the schema's own where there is one
        if not k.isidentifier() or keyword.iskeyword(k) or (names is not None and k not in names):
            raise GraphError(f"node {node.name!r}: {node.op} has no argument {k!r}")
    return [_render(code, a) for a in node.args] + [f"{k}={_render(code, v)}" for k, v in node.kwargs]


def emit_node(code: Code, node: Node, out: str | None = None) -> None:
    """``node``'s op as one call defining its outputs' locals; with ``out`` (a graph input, or a
    big output's buffer already made: ``big_outputs``), the op's ``.out`` overload writes the
    result straight into it (Note [in-place write-back])."""
    op = op_entry(node)
    args = render_args(code, node)
    if out is not None:
        target, why_not = out_overload(node)
        if target is None:  # pragma: no cover - plan_in_place_writes only picks nodes with a usable one
            raise GraphError(f"node {node.name!r}: {why_not}")
        call = f"{code.const(target._op)}({', '.join([*args, f'out={code.var(out)}'])})"
        code.line(call)
        for o in node.outputs:
            if o is not None:
                code.line(f"{code.var(o)} = {code.var(out)}")
        return
    entry = code.const(op._op if isinstance(op, torch._ops.OpOverload) else op)
    call = f"{entry}({', '.join(args)})"
    if _returns_one_tensor(op, node):
        o = node.outputs[0]
        code.line(f"{code.var(o)} = {call}" if o is not None else call)
        return
    code.line(f"_r = {call}")
    if _returns_list(op):
        code.line(f"if len(_r) != {len(node.outputs)}:")
        code.line(f"    raise {code.const(GraphError)}({code.const(_count_error(node))})")
    for i, o in enumerate(node.outputs):
        if o is not None:
            code.line(f"{code.var(o)} = _r[{i}]")
    code.line("del _r")


@functools.lru_cache(maxsize=4096)
def _argument_names(op: object) -> frozenset[str] | None:
    return frozenset(a.name for a in op._schema.arguments) if isinstance(op, torch._ops.OpOverload) else None


@functools.lru_cache(maxsize=4096)
def _one_tensor(op: torch._ops.OpOverload) -> bool:
    rets = op._schema.returns
    return len(rets) == 1 and isinstance(rets[0].type, torch.TensorType)


def _returns_one_tensor(op: object, node: Node) -> bool:
    if not isinstance(op, torch._ops.OpOverload):
        return False
    if _one_tensor(op):
        if len(node.outputs) != 1:
            raise GraphError(f"node {node.name!r}: {node.op} returns one tensor, the graph names {len(node.outputs)}")
        return True
    rets = op._schema.returns
    nothing = not rets and all(o is None for o in node.outputs)  # run for its effect (_linalg_check_errors)
    if not _returns_list(op) and len(rets) != len(node.outputs) and not nothing:
        raise GraphError(f"node {node.name!r}: {node.op} returns {len(rets)} values, the graph names {len(node.outputs)}")
    return False


def _returns_list(op: object) -> bool:
    if not isinstance(op, torch._ops.OpOverload):
        return True  # a higher-order op: a sequence, checked at run time
    rets = op._schema.returns
    return len(rets) == 1 and isinstance(rets[0].type, torch.ListType)


def _count_error(node: Node) -> str:
    return f"node {node.name!r}: {node.op} did not return the {len(node.outputs)} values the graph names"


def emit_nodes(code: Code, nodes: Sequence[Node], keep: set[str], targets: dict[str, str],
               planned: Mapping[str, tuple[str, TensorMeta, int]] | None = None,
               big: Mapping[str, TensorMeta] | None = None, emit: Callable[..., None] = emit_node) -> None:
    """The nodes in order; a value that nothing after its last use reads (and ``keep`` does not
    hold) is deleted there, so intermediates die as they would in eager. ``planned``: node name
    -> (source, layout, offset delta) of the view ops made from the plan (Note [views from the
    plan] in runtime/emit/views.py): such a view reads its chain's source, and one nothing reads (a
    link of a chain) is not made. ``big``: node name -> the planned layout of its one output,
    computed by the op's ``.out`` overload into a buffer on huge pages (``big_outputs``). ``emit``:
    what emits one node's call (``emit_node``'s signature; Note [half matmuls in float])."""
    planned, big = planned or {}, big or {}

    def reads(node: Node) -> tuple[str, ...]:
        view = planned.get(node.name)
        return (view[0],) if view is not None else node.inputs

    last: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for v in reads(node):
            last[v] = k
    rt = code.const(layout.reinterpret_fn(code.fast)) if planned else ""
    for k, node in enumerate(nodes):
        view = planned.get(node.name)
        unread = [o for o in node.outputs if o is not None and o not in last and o not in keep]
        if view is None and node.name in big:
            out = code.var(node.outputs[0])
            m = big[node.name]
            code.line(f"{out} = {code.const(pages.empty_huge)}({code.const(m.shape)}, {code.const(m.stride)}, "
                      f"{code.const(m.dtype)})")
            emit(code, node, node.outputs[0])
        elif view is None:
            emit(code, node, targets.get(node.name))
        elif unread:
            unread = []  # a view nothing reads is not made
        else:
            src, m, delta = view
            code.line(f"{code.var(node.outputs[0])} = {rt}({code.var(src)}, {code.const(m.shape)}, "
                      f"{code.const(m.stride)}, {code.value(delta)})")
        dead = [v for v in reads(node) if last[v] == k and v not in keep] + unread
        if dead:
            code.dels(dict.fromkeys(dead))


def big_outputs(ctx: BuildContext, seg: Segment, targets: Mapping[str, str], fast: bool) -> dict[str, TensorMeta]:
    """Note [huge pages for big buffers] (runtime/storage/pages.py), for ATen's ops: node name -> the
    planned layout of an output of at least ``pages.HUGE_MIN`` bytes that the fast variant
    allocates itself and has the op's ``.out`` overload write (``out_overload``: every argument
    taken as the functional op takes it). Only known single-output ops with one ``out`` argument
    that is the op's own kernel (an overload tagged ``generated`` computes into a temporary and
    copies: ``convolution``, ``clone``, ``embedding``), not a view, not random (an out overload need not draw the same numbers), not written in
    place, into a dense layout without repeated elements or view bits (the planned layout is the
    functional op's, so the out overload neither resizes nor restrides)."""
    if not fast or ctx.device.type != "cpu":
        return {}
    found = {}
    for node in seg.nodes:
        if len(node.outputs) != 1 or node.outputs[0] is None or node.name in targets:
            continue
        m = ctx.graph.metas[node.outputs[0]]
        info = op_info(node.op)
        if (not pages.wants_huge(m.nbytes, ctx.device, fast) or m.conj or m.neg or m.dtype.is_complex
                or info.kind == OpKind.VIEW or not info.known or info.mutates or info.reason == "random"
                or not _dense(m)):
            continue
        op, _ = out_overload(node)
        if op is None or sum(a.is_out for a in op._schema.arguments) != 1 or torch.Tag.generated in op.tags:
            continue
        found[node.name] = m
    return found


def _dense(m: TensorMeta) -> bool:
    """A fresh buffer's layout: no offset, no gap, no repeated element (dims in any order)."""
    if m.storage_offset or any(st == 0 and n > 1 for n, st in zip(m.shape, m.stride)):
        return False
    return all(a == b for n, a, b in zip(m.shape, m.stride, dense_strides(m.shape, m.stride)) if n > 1)


def _view_roots_inside(seg: Segment) -> dict[str, str]:
    """Outputs of ``seg`` made by a chain of view ops from one of its inputs -> that input."""
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    roots = {}
    for o in seg.outputs:
        v = o
        while v in made and op_info(made[v].op).kind == OpKind.VIEW and made[v].inputs:
            v = made[v].inputs[0]
        if v != o and v not in made:
            roots[o] = v
    return roots


def emit_outputs(code: Code, ctx: BuildContext, seg: Segment, written: set[str], roots: dict[str, str]) -> None:
    """Each output handed on in its planned layout (see the module docstring)."""
    graph = ctx.graph
    for o in seg.outputs:
        if o in written:
            continue  # the input itself, holding its final value
        v, m = code.var(o), graph.metas[o]
        if o in ctx.materialize:
            code.line(f"{v} = {code.const(layout.dense_copy)}({v}, {code.const(m)})")
            continue
        root = roots.get(o)
        if root is not None and seg.kind != SegmentKind.OPAQUE:
            # a view op made it, where the plan has the kernel compute it: a buffer of its own
            s = code.const(_storage)
            code.line(f"if {s}({v}) == {s}({code.var(root)}):")
            code.line(f"    {v} = {code.const(layout.fresh_in_layout)}({v}, {code.const(m)})")
        code.line(_conform_line(code, v, m, f"value of node output {o!r}"))


def _conform_line(code: Code, v: str, m: TensorMeta, what: str) -> str:
    if m.conj or m.neg or m.dtype.is_complex:  # where a conj/neg bit can be: conform compares them too
        return f"{v} = {code.const(layout.conform)}({v}, {code.const(m)}, {code.const(what)})"
    if code.sizes is not None and is_symbolic(m):
        # symbolic sizes (Note [sizes in generated source]): the test's sizes computed at the call,
        # the meta (for conform, which a mismatch needs) made only then
        return (f"{v} = {code.const(layout.ensure)}({v}, ({code.value(m.stride)}, {code.value(m.shape)}, "
                f"{code.const(m.dtype)}, lambda: {code.value(m)}, {code.const(what)}))")
    return f"{v} = {code.const(layout.ensure)}({v}, {code.const((m.stride, m.shape, m.dtype, m, what))})"


def emit_torch(code: Code, ctx: BuildContext, seg: Segment, dying: frozenset[str],
               emit: Callable[..., None] = emit_node) -> None:
    """``seg`` on torch (also the fallback of a generated kernel); ``emit`` as in ``emit_nodes``."""
    targets = ctx.targets(seg)
    written = {o for n in seg.nodes if n.name in targets for o in n.outputs if o is not None}
    roots = _view_roots_inside(seg)
    # inputs still alive after this launch, and the roots of view outputs (compared below), are kept
    keep = set(seg.outputs) | (set(seg.inputs) - dying) | set(targets.values()) | set(roots.values())
    emit_nodes(code, seg.nodes, keep, targets, planned_views(ctx.graph, seg, targets),
               big_outputs(ctx, seg, targets, code.fast), emit)
    emit_outputs(code, ctx, seg, written, roots)
    late = [v for v in dict.fromkeys(roots.values()) if v in dying]
    if late:
        code.dels(late)


class TorchLaunch(SegmentLaunch):
    backend = "torch"

    def __init__(self, ctx: BuildContext, seg: Segment) -> None:
        self.ctx, self.segment = ctx, seg

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        emit_torch(code, self.ctx, self.segment, dying)


class TorchBackend(Backend):
    name = "torch"

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        return TorchLaunch(ctx, seg)
