"""Writing a mutated input's final value straight into its storage, where that is safe.

Note [in-place write-back]: a functional graph says "input x ends holding value v"; the plain way
is a copy of v into x after the last launch. Where it is safe, the op that computes v writes it
straight into x instead (its ``.out`` overload with ``out=x``), and no copy runs. Safe means:
  * v is made by an elementwise op (the write's index map is the identity: not ``x.copy_(x.t())``)
    whose output has x's shape, dtype and strides, and which has an ``.out`` overload that takes
    every argument the node passes (``_to_copy.out`` has no ``dtype``: a cast keeps the copy);
  * nothing reads x's old value after that op: no later node reads x or a view of x, no view of x
    is handed back as a separate output, and the op itself reads x only as x (same layout);
  * v is not also a graph output (seeds/003: ``y = x.clone(); x.copy_(y); return y`` keeps y apart);
  * x shares its storage with no other input and has no overlapping (stride-0) elements.
Everything else keeps the copy, with the reason recorded.
"""

from __future__ import annotations

import torch

from segmenter import Node, OpKind, SegmentedFusion, SegmentKind, op_info
from segmenter.ir.graph import view_roots

__all__ = ["out_overload", "plan_in_place_writes"]


def out_overload(node: Node) -> tuple[torch._ops.OpOverload | None, str | None]:
    """The ``.out`` overload that computes ``node`` into a given tensor, or None and why not.
    It must take every argument the node passes, by the same position or name: ``_to_copy.out``
    takes no ``dtype`` (the out tensor's dtype is the cast), so a cast stays a copy."""
    parts = node.op.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None, f"{node.op} has no .out overload"
    packet = getattr(torch.ops.aten, parts[1], None)
    functional = getattr(packet, parts[2], None) if packet is not None else None
    if not isinstance(functional, torch._ops.OpOverload):
        return None, f"{node.op} has no .out overload"
    for overload in ("out", f"{parts[2]}_out"):
        op = getattr(packet, overload, None)
        if not isinstance(op, torch._ops.OpOverload) or not any(a.name == "out" for a in op._schema.arguments):
            continue
        positional = [a.name for a in op._schema.arguments if not a.kwarg_only]
        named = {a.name for a in op._schema.arguments if a.name != "out"}
        passed = [a.name for a in functional._schema.arguments[:len(node.args)]]
        if len(node.args) > len(functional._schema.arguments) or positional[:len(passed)] != passed:
            return None, f"{op} does not take {node.op}'s arguments in the same positions"
        missing = [k for k, _ in node.kwargs if k not in named]
        if missing:
            return None, f"{op} takes no {', '.join(missing)} argument{'s' if len(missing) > 1 else ''}"
        return op, None
    return None, f"{node.op} has no .out overload"


def plan_in_place_writes(plan: SegmentedFusion) -> tuple[dict[str, int], dict[int, str]]:
    """Node name -> the input it writes in place; and for every other write-back, why not."""
    g = plan.graph
    order: dict[str, int] = {}
    kind_of: dict[str, SegmentKind] = {}
    for seg in plan.segments:
        for n in seg.nodes:
            order[n.name] = len(order)
            kind_of[n.name] = seg.kind
    end = len(order)
    root = view_roots(g)  # every value that may see x's storage
    last_read: dict[str, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            last_read[v] = max(last_read.get(v, -1), order[n.name])
    for v in (*g.outputs, *(m.value for m in g.mutations)):
        last_read[v] = end
    shared = {inp.storage for inp in g.inputs if sum(j.storage == inp.storage for j in g.inputs) > 1}
    targets: dict[str, int] = {}
    why_not: dict[int, str] = {}
    for m in g.mutations:
        inp = g.inputs[m.input]
        node = g.producers.get(m.value)
        reason = None
        if inp.storage in shared:
            reason = "the input shares its storage with another input"
        elif any(st == 0 and n > 1 for n, st in zip(inp.meta.shape, inp.meta.stride)):
            reason = "the input has overlapping elements"
        elif m.value in g.outputs:
            reason = "the final value is also returned as an output, which must stay a separate tensor"
        elif node is None or op_info(node.op).kind != OpKind.ELEMENTWISE or kind_of.get(node.name) in (
                SegmentKind.OPAQUE, SegmentKind.METADATA):
            reason = "the final value is not made by an elementwise kernel op (not an identity write)"
        elif (no_out := out_overload(node)[1]) is not None:
            reason = no_out
        elif not inp.meta.same_layout(g.metas[m.value]._replace_offset(inp.meta.storage_offset)):
            reason = "the final value's layout differs from the input's"
        else:
            family = {v for v, r in root.items() if r == inp.name} | {inp.name}
            here = order[node.name]
            if any(last_read.get(v, -1) > here for v in family):
                reason = "the old value is read after the op that makes the new one"
            elif any(v in family and v != inp.name for v in node.inputs):
                reason = "the op reads the input through a view (not an identity write)"
        if reason is None:
            targets[node.name] = m.input
        else:
            why_not[m.input] = reason
    return targets, why_not
