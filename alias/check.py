"""Invariants every alias rewrite must keep; tests run ``check`` after every pass, and
``runtime.compile`` runs ``plan_problems`` (1-3, linear time) on every plan before it runs it.

1. Every node of the graph is in exactly one segment, and segments come in dependency order.
2. A METADATA segment holds only true views, whose recorded layouts are the ones the layout
   algebra derives, and moves nothing.
3. No graph output aliases a graph input or another output unless it did in the original
   program (``x.clone()`` stays a copy): judged by storage roots, as Inductor judges storage
   overlap.
4. (needs the original) Outputs that were views in the original stay views (``output_aliases`` unchanged), and every
   mutated input gets the original's final value (``mutations`` unchanged, each value produced).
"""

from __future__ import annotations

from segmenter import FusionGraph, GraphError, SegmentedFusion, SegmentKind
from segmenter.capturing.meta import meta_mismatches

from .analysis import is_true_view

__all__ = ["PlanError", "check", "plan_problems", "storage_roots"]


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


class PlanError(GraphError):
    """A plan that breaks the alias invariants: ``runtime.compile`` refuses to run it."""


def plan_problems(plan: SegmentedFusion) -> list[str]:
    """The invariants a plan breaks on its own (no original needed), in time linear in its
    size: what ``runtime.compile`` always checks before it builds anything.

    Every node in one segment; no segment reads a value before it is made; METADATA segments
    hold only views whose recorded layouts (bits included) the layout algebra derives, and move
    nothing; every write-back value is produced; no output shares a storage with an input or
    another output unless the graph records that it does (``output_aliases``)."""
    g = plan.graph
    problems: list[str] = []
    seen: dict[str, int] = {}
    made: dict[str, int] = {}
    for seg in plan.segments:
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
    inputs = set(g.input_names)
    constants = set(g.constant_names)
    for seg in plan.segments:
        for v in seg.inputs:
            if v not in inputs and v not in constants and made.get(v, seg.index) >= seg.index:
                problems.append(f"s{seg.index} reads %{v} before it is made")
        if seg.kind == SegmentKind.METADATA:
            for node in seg.nodes:
                ok, why = is_true_view(g, node)
                if not ok:
                    problems.append(f"metadata segment s{seg.index} holds {node.name!r}, not a view: {why}")
            if seg.bytes_moved:
                problems.append(f"metadata segment s{seg.index} moves {seg.bytes_moved} bytes")
    for m in g.mutations:
        if m.value not in made and m.value not in inputs and m.value not in constants:
            problems.append(f"the final value %{m.value} of input {g.inputs[m.input].name!r} is never produced")
    roots = storage_roots(plan)
    owner: dict[tuple[str, object], int] = {}
    for i, (v, alias) in enumerate(zip(g.outputs, g.output_aliases)):
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


def check(original: SegmentedFusion | FusionGraph, rewritten: SegmentedFusion, metas: bool = True) -> list[str]:
    """The invariants ``rewritten`` breaks (empty: none): ``plan_problems``, the original
    program's aliasing and write-backs kept, and with ``metas``, every value's recorded layout
    what FakeTensor propagation computes (segmenter.capturing.meta)."""
    orig = original.graph if isinstance(original, SegmentedFusion) else original
    g = rewritten.graph
    problems: list[str] = meta_mismatches(g) if metas else []
    if g.output_aliases != orig.output_aliases:
        problems.append("output aliasing differs from the original program's (a view output was materialized, "
                        "or a copy became a view)")
    if g.mutations != orig.mutations:
        problems.append(f"write-backs differ from the original program's: {orig.mutations} vs {g.mutations}")
    return problems + plan_problems(rewritten)
