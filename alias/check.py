"""Invariants every alias rewrite must keep; tests run ``check`` after every pass.

1. Every node of the graph is in exactly one segment, and segments come in dependency order.
2. A METADATA segment holds only true views, whose recorded layouts are the ones the layout
   algebra derives, and moves nothing.
3. No graph output aliases a graph input or another output unless it did in the original
   program (``x.clone()`` stays a copy): judged by storage roots, as Inductor judges storage
   overlap.
4. Outputs that were views in the original stay views (``output_aliases`` unchanged), and every
   mutated input gets the original's final value (``mutations`` unchanged, each value produced).
"""

from __future__ import annotations

from segmenter import FusionGraph, SegmentedFusion, SegmentKind
from segmenter.meta import meta_mismatches

from .analysis import is_true_view
from .layout import Layout, NeedsCopy, apply_view_op

__all__ = ["check", "storage_roots"]


def storage_roots(sf: SegmentedFusion) -> dict[str, tuple[str, object]]:
    """For each value, the storage it lives in under this plan: ("input", storage group) for
    views of graph inputs, ("value", name) for a buffer a launch writes."""
    g = sf.graph
    roots: dict[str, tuple[str, object]] = {inp.name: ("input", inp.storage) for inp in g.inputs}
    for seg in sf.segments:
        for node in seg.nodes:
            for o in node.outputs:
                if o is None:
                    continue
                if seg.kind == SegmentKind.METADATA and node.inputs:
                    roots[o] = roots.get(node.inputs[0], ("value", node.inputs[0]))
                else:
                    roots[o] = ("value", o)
    return roots


def check(original: SegmentedFusion | FusionGraph, rewritten: SegmentedFusion, metas: bool = True) -> list[str]:
    """The invariants ``rewritten`` breaks (empty: none). With ``metas``, also that every value's
    recorded layout is what FakeTensor propagation computes (segmenter.meta)."""
    orig = original.graph if isinstance(original, SegmentedFusion) else original
    g = rewritten.graph
    problems: list[str] = meta_mismatches(g) if metas else []
    seen: dict[str, int] = {}
    made: dict[str, int] = {}
    for seg in rewritten.segments:
        for node in seg.nodes:
            if node.name in seen:
                problems.append(f"node {node.name!r} is in segments s{seen[node.name]} and s{seg.index}")
            seen[node.name] = seg.index
            for o in node.outputs:
                if o is not None:
                    made[o] = seg.index
    missing = [n.name for n in g.nodes if n.name not in seen]
    if missing:
        problems.append(f"nodes in no segment: {missing[:5]}")
    for seg in rewritten.segments:
        for v in seg.inputs:
            if v not in g.input_names and made.get(v, seg.index) >= seg.index:
                problems.append(f"s{seg.index} reads %{v} before it is made")
        if seg.kind == SegmentKind.METADATA:
            for node in seg.nodes:
                ok, why = is_true_view(g, node)
                if not ok:
                    problems.append(f"metadata segment s{seg.index} holds {node.name!r}, not a view: {why}")
                    continue
                # The layout the runtime will make must be the one the algebra derives.
                derived = apply_view_op(Layout.from_meta(g.metas[node.inputs[0]]), node.op, node.args[1:],
                                        dict(node.kwargs))
                derived = derived if isinstance(derived, tuple) else (derived,)
                for o, lay in zip(node.outputs, derived):
                    if o is not None and (isinstance(lay, NeedsCopy) or not lay.to_meta(g.metas[o].device).same_layout(g.metas[o])):
                        problems.append(f"metadata op {node.name!r}: recorded layout {g.metas[o]} is not what the "
                                        f"layout algebra derives ({lay})")
            if seg.bytes_moved:
                problems.append(f"metadata segment s{seg.index} moves {seg.bytes_moved} bytes")
    if g.output_aliases != orig.output_aliases:
        problems.append("output aliasing differs from the original program's (a view output was materialized, "
                        "or a copy became a view)")
    if g.mutations != orig.mutations:
        problems.append(f"write-backs differ from the original program's: {orig.mutations} vs {g.mutations}")
    for m in g.mutations:
        if m.value not in made and m.value not in g.input_names:
            problems.append(f"the final value %{m.value} of input {g.inputs[m.input].name!r} is never produced")
    roots = storage_roots(rewritten)
    owner: dict[tuple[str, object], int] = {}
    for i, (v, alias) in enumerate(zip(g.outputs, orig.output_aliases)):
        if alias is not None:
            continue
        root = roots.get(v)
        if root is None:
            continue
        if root[0] == "input" and v not in g.input_names:  # an input itself: finish hands back a copy
            problems.append(f"output {i} (%{v}) would alias an input; in the original program it is a copy")
        elif root in owner and g.outputs[owner[root]] != v:
            problems.append(f"output {i} (%{v}) would share a storage with output {owner[root]}")
        owner.setdefault(root, i)
    return problems
