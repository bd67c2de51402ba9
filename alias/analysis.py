"""Alias analysis of one segment: which values are views, and of what.

Answers questions; changes nothing (the rewrite is alias/rewrite.py).

Note [views from metas]: every value's TensorMeta was computed by torch's own meta functions on
FakeTensors whose storages are shared exactly as at run time (segmenter.capturing.meta), so a VIEW op's
output meta *is* its layout in its root's storage, absolute offset included. An op counts as a
view only when torch guarantees one: ATen view ops always alias (``view`` errors rather than
copy); ``reshape`` aliases only when a view is possible, which the layout algebra decides.
Conservative: anything else is not an alias.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from segmenter import FusionGraph, Node, OpKind, Segment, TensorMeta, op_info
from segmenter.ir.symbolic import is_symbolic, size_key

from .layout import Layout, NeedsCopy, apply_view_op

__all__ = ["SegmentAliases", "analyze_segment", "is_true_view"]

def is_true_view(graph: FusionGraph, node: Node) -> tuple[bool, str]:
    # Answers per graph, by node name: the alias pass asks for every view node, and
    # runtime.compile's plan_problems asks again for those in METADATA segments (0.6 s of a
    # 100k-node compile). A graph is frozen, so an answer holds while it lives, and it lives in
    # the graph (as view_roots' does). A name, not the Node, is the key: a Node hashes all its fields.
    # Nodes that agree in op, arguments and every layout involved get the same answer (the
    # layers of a model repeat): the second memo is keyed by those, where they hash.
    memo = graph.__dict__.get("_true_views")
    if memo is None:
        memo = graph.__dict__.setdefault("_true_views", {})
        graph.__dict__.setdefault("_true_views_by_layout", {})
        # (a graph's symbols are its inputs' sizes: Note [symbolic plans])
        graph.__dict__.setdefault("_true_views_symbolic", any(is_symbolic(i.meta) for i in graph.inputs))
    found = memo.get(node.name)
    if found is None:
        by_layout = graph.__dict__["_true_views_by_layout"]
        metas = graph.metas
        key: tuple[object, ...] | None = None
        if node.inputs and _plain(node.args[1:]) and _plain(v for _, v in node.kwargs):
            first, outs = metas[node.inputs[0]], tuple(o is not None and metas[o] for o in node.outputs)
            key = (node.op, first, node.args[1:], node.kwargs, outs)
            if graph.__dict__["_true_views_symbolic"]:
                # every size by its expression (size_key): a symbolic plan's layers key alike
                # where their sizes are equal for every value of the symbols, and a lookup
                # compares no SymInt (a comparison would record a condition: Note [hashing
                # symbolic sizes]); plain sizes key as they are (a cheaper key)
                key = (node.op, _layout_key(first), size_key(node.args[1:]),
                       tuple((k, size_key(v)) for k, v in node.kwargs),
                       tuple(m is not False and _layout_key(m) for m in outs))
            try:
                found = by_layout.get(key)
            except TypeError:  # (an argument that does not hash): no memo
                key = None
        if found is None:
            found = _is_true_view(graph, node)
            if key is not None:
                by_layout[key] = found
        memo[node.name] = found
    return found


def _plain(args: Iterable[object]) -> bool:
    """Only ints (not bools), sizes (SymInts), None and tuples of those: arguments equal as keys
    only when they are the same value (1, 1.0 and True are equal keys in a dict)."""
    def size(x: object) -> bool:
        return type(x) is int or isinstance(x, torch.SymInt)

    return all(a is None or size(a) or (type(a) is tuple and all(size(x) for x in a)) for a in args)


def _layout_key(m: TensorMeta) -> tuple:
    """A TensorMeta as a key, its sizes by their expressions (``size_key``)."""
    return (size_key(m.shape), size_key(m.stride), size_key(m.storage_offset), m.dtype, m.device, m.conj, m.neg)


def _is_true_view(graph: FusionGraph, node: Node) -> tuple[bool, str]:
    """Whether ``node`` returns views of its (first) tensor input, with the reason if not.

    Only where the layout algebra derives each output's recorded layout, bits and dtype
    included (Note [views from metas]): a VIEW-kind op the algebra does not model (``contiguous``
    and ``resolve_conj`` may copy; ``real`` of a conj view...) stays with the kernel, which runs it on
    torch, instead of being guessed at with as_strided.
    """
    info = op_info(node.op)
    if info.kind != OpKind.VIEW:
        return False, f"{node.op} computes a new tensor"
    if not node.inputs:
        return False, f"{node.op} has no tensor input"
    src = graph.metas[node.inputs[0]]
    result = apply_view_op(Layout.from_meta(src), node.op, node.args[1:], dict(node.kwargs))
    if isinstance(result, NeedsCopy):
        return False, result.reason
    derived = result if isinstance(result, tuple) else (result,)
    if len(derived) != len(node.outputs):
        return False, f"{node.op}: {len(derived)} views derived for {len(node.outputs)} outputs"
    for o, lay in zip(node.outputs, derived):
        if o is not None and not lay.matches(graph.metas[o]):
            return False, f"{node.op}: recorded layout {graph.metas[o]} is not the view's ({lay.to_meta()})"
    return True, ""


@dataclass
class SegmentAliases:
    """What one segment's values are views of."""

    #: value -> its root: the segment input or the value computed in the segment it views.
    root: dict[str, str] = field(default_factory=dict)
    #: why a VIEW-kind node was not treated as a view (by node name).
    not_views: dict[str, str] = field(default_factory=dict)

    def view_of_input(self, seg: Segment, v: str) -> bool:
        return self.root.get(v, v) in seg.inputs and v in self.root

    def view_of_computed(self, seg: Segment, v: str) -> bool:
        return v in self.root and self.root[v] not in seg.inputs

    def layout(self, graph: FusionGraph, v: str) -> TensorMeta:
        return graph.metas[v]


def analyze_segment(graph: FusionGraph, seg: Segment) -> SegmentAliases:
    facts = SegmentAliases()
    for node in seg.nodes:
        if op_info(node.op).kind != OpKind.VIEW:
            continue
        ok, why = is_true_view(graph, node)
        if not ok:
            facts.not_views[node.name] = why
            continue
        src = node.inputs[0]
        base = facts.root.get(src, src)
        for o in node.outputs:
            if o is not None:
                facts.root[o] = base
    return facts
