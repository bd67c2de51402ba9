"""The alias rewrites: post (per segment, after the cut), pre (graph outputs only), off.

Note [metadata segments]: a segment's outputs fall in three groups (alias/analysis.py):
  views of the segment's inputs   -> a METADATA segment before the kernel (no launch);
  views of a value it computes    -> the kernel writes that value; a METADATA segment after it
                                     makes the views ((a + 1).expand(4, n) stays stride 0);
  everything else                 -> the kernel.
A segment left with no computed output becomes METADATA as a whole: the lone slice of nvFuser
#2577 launches nothing. Kernel inputs that are views are read strided in place: the runtime hands
the kernel the view itself.

Note [outputs that must stay copies]: a rewrite may not make a graph output alias an input or
another output unless the original program did (Inductor's rule; seeds/003). So a graph output
becomes metadata only where the original program returned a view (``output_aliases``), or where
it is the only graph output viewing a value that nothing else sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from segmenter import Alias, Boundary, FusionGraph, Node, OpKind, Segment, SegmentedFusion, SegmentKind, op_info
from segmenter.ir.graph import view_roots
from segmenter.partition.segments import build_segment

from .analysis import SegmentAliases, analyze_segment, is_true_view
from .elide import elide_copies

__all__ = ["SegmentReport", "rewrite"]


@dataclass(frozen=True)
class SegmentReport:
    """What the pass found in one segment of the input (by its index there)."""

    segment: int
    kind: SegmentKind
    became: tuple[SegmentKind, ...]  # kinds of the segments it was split into
    views_of_inputs: tuple[tuple[str, str], ...]  # (value, root) turned into metadata
    views_of_outputs: tuple[tuple[str, str], ...]  # (value, computed root) as metadata after the kernel
    kept_in_kernel: tuple[tuple[str, str], ...]  # (value, why it could not be a view)


def _ancestors(targets: list[str], made_by: dict[str, Node]) -> set[str]:
    """Names of the nodes inside the segment needed to compute ``targets``."""
    need: set[str] = set()
    stack = [made_by[t] for t in targets if t in made_by]
    while stack:
        n = stack.pop()
        if n.name in need:
            continue
        need.add(n.name)
        stack.extend(made_by[v] for v in n.inputs if v in made_by)
    return need


class _Rewriter:
    def __init__(self, sf: SegmentedFusion, mode: str) -> None:
        self.sf, self.mode, self.graph = sf, mode, sf.graph
        g = self.graph
        self.output_alias: dict[str, Alias | None] = {}
        for name, alias in zip(g.outputs, g.output_aliases):
            self.output_alias.setdefault(name, alias)
        self.mutation_values = {m.value for m in g.mutations}
        self.graph_inputs = set(g.input_names)
        self.global_root = view_roots(g, include_maybe_copies=False)
        self.family_outputs: dict[str, int] = {}
        for v in set(g.outputs):
            base = self.global_root.get(v, v)
            self.family_outputs[base] = self.family_outputs.get(base, 0) + 1

    def metadata_allowed(self, seg: Segment, facts: SegmentAliases, v: str) -> str | None:
        """None if output ``v`` of ``seg`` may be produced as a view; else why not."""
        if self.mode == "off":
            return "alias mode off"
        is_output = v in self.output_alias
        if self.mode == "pre":
            if not is_output:
                return "pre: only graph outputs that are views of graph inputs become metadata"
            if self.global_root.get(v) not in self.graph_inputs or self.output_alias[v] is None:
                return "pre: not a view of a graph input in the original program"
            if facts.root.get(v) not in self.graph_inputs:
                # its chain starts at a value an earlier launch made, which pre hands over as a
                # contiguous copy: the recorded strides do not hold there
                return "pre: a view of a value another launch makes (a contiguous copy in pre)"
            return None
        if not is_output or self.output_alias[v] is not None:
            return None
        # A graph output that was a copy: a view only of a buffer no one else can see.
        base = self.global_root.get(v, v)
        if base in self.graph_inputs:
            return "a graph output that was a copy in the original program stays a copy"
        if base in self.output_alias or base in self.mutation_values:
            return "its storage would be shared with another output: it stays a copy"
        if self.family_outputs.get(base, 0) > 1 and not self._heads_family(v, base):
            return "its storage would be shared with another output: it stays a copy"
        return None

    def _heads_family(self, v: str, base: str) -> bool:
        """Whether every other graph output that is a view of ``base`` was recorded as a view of
        output ``v`` (returned once): then ``v`` made a view of ``base`` shares its storage with
        exactly those outputs, as in the original program (AOTAutograd's training forward returns
        an attention output detached for the backward, and a reshape of it)."""
        g = self.graph
        at = [k for k, o in enumerate(g.outputs) if o == v]
        if len(at) != 1:
            return False
        for w, alias in zip(g.outputs, g.output_aliases):
            if w == v or self.global_root.get(w, w) != base:
                continue
            if alias is None or alias.source != "output" or alias.index != at[0]:
                return False
        return True

    def split(self, seg: Segment) -> tuple[list[tuple[SegmentKind, list[Node]]], SegmentReport]:
        facts = analyze_segment(self.graph, seg)
        made_by = {o: n for n in seg.nodes for o in n.outputs if o is not None}
        vin, vcomp, kept = [], [], []
        computed = []
        for v in seg.outputs:
            if v not in facts.root:
                computed.append(v)
                continue
            why = self.metadata_allowed(seg, facts, v)
            if why is not None:
                kept.append((v, why))
                computed.append(v)
            elif facts.view_of_input(seg, v):
                vin.append(v)
            else:
                vcomp.append(v)
        kernel_targets = computed + [facts.root[v] for v in vcomp]
        k_nodes = _ancestors(kernel_targets, made_by)
        k_nodes |= {n.name for n in seg.nodes if op_info(n.op).kind != OpKind.VIEW}
        in_nodes = _ancestors(vin, made_by)
        k_nodes -= in_nodes  # the kernel reads these views strided, as inputs
        out_nodes = _ancestors(vcomp, made_by) - k_nodes - in_nodes
        placed = k_nodes | in_nodes | out_nodes
        late: set[str] = set()
        for n in seg.nodes:  # views nothing needs: with whichever side they hang from
            if n.name in placed:
                continue
            sources = {made_by[v].name for v in n.inputs if v in made_by}
            if sources & (out_nodes | late):
                # a view of a view made after the kernel: after it too (a true view is metadata
                # there; anything else runs on its own, never in the kernel, which runs first)
                (out_nodes if n.outputs[0] in facts.root and is_true_view(self.graph, n)[0] else late).add(n.name)
            elif sources <= in_nodes and facts.view_of_input(seg, n.outputs[0] or ""):
                in_nodes.add(n.name)  # before the kernel, as the views it hangs from
            else:
                k_nodes.add(n.name)  # with the kernel, which makes (or reads) what it hangs from
        parts: list[tuple[SegmentKind, list[Node]]] = []
        for kind, names in ((SegmentKind.METADATA, in_nodes), (seg.kind, k_nodes), (SegmentKind.METADATA, out_nodes),
                            (SegmentKind.OPAQUE, late)):
            if names:
                parts.append((kind, [n for n in seg.nodes if n.name in names]))  # in graph order
        report = SegmentReport(
            seg.index, seg.kind, tuple(k for k, _ in parts),
            tuple((v, facts.root[v]) for v in vin), tuple((v, facts.root[v]) for v in vcomp),
            tuple(kept) + tuple((name, why) for name, why in facts.not_views.items()),
        )
        return parts, report


def rewrite(sf: SegmentedFusion, mode: str) -> tuple[SegmentedFusion, list[SegmentReport], list[tuple[str, str]]]:
    r = _Rewriter(sf, mode)
    parts: list[tuple[SegmentKind, list[Node]]] = []
    reports: list[SegmentReport] = []
    for seg in sf.segments:
        if seg.kind in (SegmentKind.OPAQUE, SegmentKind.METADATA) or mode == "off":
            parts.append((seg.kind, list(seg.nodes)))
            continue
        split, report = r.split(seg)
        parts.extend(split)
        reports.append(report)
    graph: FusionGraph = sf.graph
    elided: list[tuple[str, str]] = []
    if mode == "post":
        graph, parts, elided = elide_copies(graph, parts)
    materialized: frozenset[str] = frozenset()
    if mode in ("pre", "off"):
        # Today's fusers: every value passed between launches is a contiguous buffer.
        made = {o: k for k, (kind, nodes) in enumerate(parts) for n in nodes for o in n.outputs if o is not None}
        used_elsewhere = {
            v for k, (kind, nodes) in enumerate(parts) for n in nodes for v in n.inputs
            if v in made and made[v] != k
        }
        materialized = frozenset(v for v in used_elsewhere if parts[made[v]][0] != SegmentKind.METADATA)
    segments = tuple(build_segment(graph, i, kind, nodes, materialized) for i, (kind, nodes) in enumerate(parts))
    return SegmentedFusion(graph, segments, _boundaries(sf, segments), sf.merges, alias_mode=mode), reports, elided


def _boundaries(before: SegmentedFusion, segments: tuple[Segment, ...]) -> tuple[Boundary, ...]:
    """The cuts of the new plan, each with the segmenter's reason, or the alias pass's own."""
    old_seg = before.segment_of()
    reasons = {(b.value, b.consumer): b.reason for b in before.boundaries}
    made = {o: s.index for s in segments for o in s.outputs}
    out = []
    for s in segments:
        origin = old_seg[s.nodes[0].name]
        for v in s.inputs:
            if v not in made:
                continue
            why = reasons.get((v, origin))
            if why is None:
                kind = segments[made[v]].kind if segments[made[v]].kind == SegmentKind.METADATA else s.kind
                why = f"split by the alias pass: the {kind.name} part runs apart (a view needs no kernel)"
            out.append(Boundary(v, made[v], s.index, why))
    return tuple(out)
