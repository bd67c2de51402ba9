"""Greedy segmentation: union-find over producer/consumer groups, never creating a cycle.

Note [merge order]: every node starts as its own group. Each round lists the producer ->
consumer group pairs with the bytes of the values flowing between them (what a merge saves:
those values need not be written and read back), and tries them biggest first, ties broken by
position in the graph, so the result is deterministic. A merge happens when the kinds' rule
(``rules.combine``) accepts the merged group and no path leaves the producer group and comes
back into the consumer through a third group (that would be a cycle between segments). Rounds
repeat until one merges nothing, since a merge refused early may become legal once its
neighbours have merged. Then independent pointwise groups that read a common input over the
same iteration space merge horizontally (q, k and v of a RoPE block) when that cannot raise peak
memory.

Note [cycle check cost]: the check is a depth-first search from the producer group's consumers,
pruned at every group that starts after the consumer group ends (nodes are in topological order,
so such a group cannot reach it). On transformer-like graphs the search stays within a layer,
so segmentation time grows about linearly with graph size (figures in perf/ and the README).
"""

from __future__ import annotations

import gc
import heapq
from collections import defaultdict
from dataclasses import dataclass

from ..ir.graph import FusionGraph
from ..ir.ops import OpKind
from ..ir.symbolic import SizeKey, size_hint, size_key
from .matmul_bias import split_matmul_bias
from .options import SegmenterOptions
from .rules import NodeTraits, Traits, combine, node_traits, too_big, traits_of
from .segments import Boundary, Segment, SegmentedFusion, SegmentKind, build_segment

__all__ = ["segment"]


_NO_NUMELS: frozenset[SizeKey] = frozenset()


@dataclass(slots=True)
class _Group:
    nodes: list[int]
    min_idx: int
    max_idx: int
    outputs: list[str]  # values made here and needed elsewhere (or graph outputs)
    consumers: list[int]  # node indices outside the group that read its values
    traits: Traits
    numels: frozenset[SizeKey] = frozenset()  # element counts of its computing nodes (shared: never mutated)
    version: int = 0  # bumped on every merge: a refusal between unchanged groups stays valid


class _Partition:
    def __init__(self, graph: FusionGraph, options: SegmenterOptions) -> None:
        self.graph = graph
        self.options = options
        nodes = graph.nodes
        producer: dict[str, int] = {}
        users: dict[str, list[int]] = {}
        for i, n in enumerate(nodes):
            for v in n.inputs:
                found = users.get(v)
                if found is None:
                    users[v] = [i]
                elif found[-1] != i:  # a node reading one value twice is one user
                    found.append(i)
            for o in n.outputs:
                if o is not None:
                    producer[o] = i
        self.producer, self.value_users = producer, users
        self.external = external = graph.external_values
        self.traits: list[NodeTraits] = [node_traits(graph, n) for n in nodes]
        #: node index -> the root of its group, kept exact at every merge (the smaller group is
        #: relabelled: O(n log n) in all), so a lookup is a list index, not a function call
        self.root = list(range(len(nodes)))
        self.groups: dict[int, _Group] = {}
        metas = graph.metas
        opaque_nodes = options.opaque_nodes
        #: element count of each value made by a non-view op (the ones that constrain kernels)
        self.out_numel: dict[str, SizeKey] = {}
        # Traits depend on the node only through its NodeTraits (and its op, when OPAQUE): one
        # object per distinct pair, not one per node.
        shared: dict[tuple[NodeTraits, str | None], Traits] = {}
        one_numel: dict[SizeKey, frozenset[SizeKey]] = {}
        for i, n in enumerate(nodes):
            nt = self.traits[i]
            made = [o for o in n.outputs if o is not None]
            outs = [o for o in made if o in users or o in external]
            if len(made) == 1:
                cons = users.get(made[0], [])[:]
            else:
                cons = sorted({u for o in made for u in users.get(o, ())})
            numels = _NO_NUMELS
            if nt.kind != OpKind.VIEW:
                for o in made:  # symbolic sizes by their expressions (Note [symbolic plans])
                    self.out_numel[o] = size_key(metas[o].numel)
                if nt.kind != OpKind.OPAQUE and made:
                    n0 = self.out_numel[made[0]]
                    numels = one_numel.get(n0) or one_numel.setdefault(n0, frozenset((n0,)))
            if n.name in opaque_nodes:
                traits = Traits(opaque=n.op)
            else:
                key = (nt, n.op if nt.kind == OpKind.OPAQUE else None)
                one = shared.get(key)
                if one is None:
                    one = shared[key] = traits_of(graph, n, nt)
                traits = one
            self.groups[i] = _Group([i], i, i, outs, cons, traits, numels)
        #: combine's answers by (id of a's traits, id of b's traits, output sizes, full size);
        #: each entry keeps its two Traits alive, so their ids stay theirs
        self.combined: dict[tuple, tuple[Traits, Traits, Traits | str]] = {}
        self.refusals: list[tuple[int, int, str]] = []
        self.refused: dict[tuple[int, int], tuple[int, int]] = {}
        #: roots of the groups merged since the last vertical round began; before the first
        #: round, every group counts as changed (None)
        self.changed: set[int] | None = None
        self.merges = 0
        # Every producer -> consumer edge once per (value, consumer), with the value's bytes.
        self.edges: list[tuple[int, int, str, int]] = [
            (self.producer[v], j, v, size_hint(metas[v].nbytes))  # an order, not a condition
            for j, n in enumerate(nodes) for v in n.inputs if v in self.producer
        ]

    # -- union-find ------------------------------------------------------------------------

    def find(self, i: int) -> int:
        return self.root[i]

    # -- the decision ----------------------------------------------------------------------

    def merged_outputs(self, ra: int, rb: int) -> list[str]:
        out = []
        root, external, users = self.root, self.external, self.value_users
        for v in (*self.groups[ra].outputs, *self.groups[rb].outputs):
            if v in external:
                out.append(v)
                continue
            for u in users[v]:
                r = root[u]
                if r != ra and r != rb:
                    out.append(v)
                    break
        return out

    def path_through_third(self, ra: int, rb: int) -> int | None:
        """A group on a path ra -> g -> ... -> rb (g not rb), if any: merging would make a cycle."""
        limit = self.groups[rb].max_idx
        seen = {ra, rb}
        root, groups = self.root, self.groups
        stack = [g for g in {root[c] for c in groups[ra].consumers} if g not in seen]
        first_hop: dict[int, int] = {g: g for g in stack}
        while stack:
            g = stack.pop()
            if g in seen:
                continue
            seen.add(g)
            if groups[g].min_idx >= limit:
                continue
            for c in groups[g].consumers:
                h = root[c]
                if h == rb:
                    return first_hop[g]
                if h not in seen:
                    first_hop.setdefault(h, first_hop[g])
                    stack.append(h)
        return None

    def why_not(self, ra: int, rb: int, vertical: bool = True) -> str | tuple[Traits, list[str]]:
        """The merged traits and outputs, or the reason the two groups cannot merge."""
        a, b = self.groups[ra], self.groups[rb]
        ta, tb = a.traits, b.traits
        # A matmul or OPAQUE group is judged by kinds alone (rules.combine reads no output
        # sizes there): most refusals need not list the merged outputs.
        by_kind = ta.opaque or tb.opaque or ta.matmuls or tb.matmuls
        outputs = None if by_kind else self.merged_outputs(ra, rb)
        numel = self.out_numel
        out_numels = {numel[v] for v in outputs if v in numel} if outputs is not None else set()
        full_size = ta.domain is not None and ta.domain.full in b.numels
        key = (id(ta), id(tb), frozenset(out_numels), vertical and full_size)
        known = self.combined.get(key)
        if known is None:
            known = self.combined[key] = (ta, tb, combine(ta, tb, out_numels, vertical and full_size, self.options))
        decision = known[2]
        if not (ta.opaque or tb.opaque):  # an OPAQUE op's reason comes first
            big = too_big(len(a.nodes) + len(b.nodes), self.options)
            if big is not None:
                return big
        if isinstance(decision, str):
            return decision
        if outputs is None:
            outputs = self.merged_outputs(ra, rb)
        nodes = self.graph.nodes
        third = self.path_through_third(ra, rb)
        if third is None and not vertical:
            third = self.path_through_third(rb, ra)
        if third is not None:
            return f"merging would create a cycle through the segment holding {nodes[third].name!r}"
        return decision, outputs

    def merge(self, ra: int, rb: int, traits: Traits, outputs: list[str]) -> None:
        a, b = self.groups[ra], self.groups[rb]
        keep, drop = (ra, rb) if len(a.nodes) >= len(b.nodes) else (rb, ra)
        root = self.root
        consumers = [c for c in dict.fromkeys((*a.consumers, *b.consumers)) if root[c] != ra and root[c] != rb]
        g = self.groups[keep]
        g.nodes.extend(self.groups[drop].nodes)
        g.min_idx, g.max_idx = min(a.min_idx, b.min_idx), max(a.max_idx, b.max_idx)
        g.outputs, g.consumers = outputs, consumers
        g.traits = traits
        other = self.groups[drop].numels
        if not other <= g.numels:
            g.numels = g.numels | other
        g.version = a.version + b.version + 1
        for i in self.groups[drop].nodes:
            root[i] = keep
        del self.groups[drop]
        assert self.changed is not None  # merges happen only in rounds, each of which made the set
        self.changed.add(keep)
        self.merges += 1

    def out_of_fuel(self) -> bool:
        return self.options.fuel is not None and self.merges >= self.options.fuel

    # -- rounds ----------------------------------------------------------------------------

    def vertical_round(self) -> bool:
        # A pair of groups neither of which changed since the last round began was tried then
        # (and refused, or they would be one group): only pairs touching a changed group are new.
        changed, self.changed = self.changed, set()
        pairs: dict[tuple[int, int], list[int]] = {}
        root = self.root
        if changed is None:  # the first round: one group per node, so each edge is one (pair, value)
            for i, j, _, nbytes in self.edges:
                entry = pairs.get((i, j))
                if entry is None:
                    pairs[(i, j)] = [nbytes, j]
                else:
                    entry[0] += nbytes
        else:
            counted: set[tuple[int, int, str]] = set()
            for i, j, v, nbytes in self.edges:
                ra, rb = root[i], root[j]
                if ra == rb or (ra not in changed and rb not in changed) or (ra, rb, v) in counted:
                    continue
                counted.add((ra, rb, v))
                entry = pairs.get((ra, rb))
                if entry is None:
                    pairs[(ra, rb)] = [nbytes, j]
                else:
                    entry[0] += nbytes
        merged = False
        for _, _, ra0, rb0 in sorted([(-e[0], e[1], ra, rb) for (ra, rb), e in pairs.items()]):
            if self.out_of_fuel():
                break
            ra, rb = root[ra0], root[rb0]
            if ra == rb:
                continue
            # Legality depends only on the two groups (their members decide which values
            # stay outputs) and on paths between them, which merges never remove.
            stamp = (self.groups[ra].version, self.groups[rb].version)
            if self.refused.get((ra, rb)) == stamp:
                continue
            decision = self.why_not(ra, rb)
            if isinstance(decision, str):
                self.refusals.append((ra, rb, decision))
                self.refused[(ra, rb)] = stamp
                continue
            self.merge(ra, rb, *decision)
            merged = True
        self.edges = [e for e in self.edges if root[e[0]] != root[e[1]]]
        return merged

    def horizontal_round(self) -> bool:
        """Pointwise groups reading a common input over one iteration space become one launch,
        when every output of both is read only after both have run (peak memory cannot rise)."""
        by_input: dict[str, list[int]] = defaultdict(list)
        for r, g in self.groups.items():
            if g.traits.kind() == SegmentKind.POINTWISE and g.traits.computes:
                for v in dict.fromkeys(x for i in g.nodes for x in self.graph.nodes[i].inputs):
                    by_input[v].append(r)
        merged = False
        for v in sorted(by_input, key=lambda v: min(by_input[v])):
            roots = sorted(set(by_input[v]))
            for i in range(1, len(roots)):
                if self.out_of_fuel():
                    return merged
                ra, rb = self.find(roots[0]), self.find(roots[i])
                if ra == rb or not self.outputs_read_late(ra, rb):
                    continue
                decision = self.why_not(ra, rb, vertical=False)
                if isinstance(decision, str):
                    self.refusals.append((ra, rb, decision))
                    continue
                self.merge(ra, rb, *decision)
                merged = True
        return merged

    def outputs_read_late(self, ra: int, rb: int) -> bool:
        end = max(self.groups[ra].max_idx, self.groups[rb].max_idx)
        return all(
            v in self.external or min(self.value_users[v]) > end
            for r in (ra, rb) for v in self.groups[r].outputs
        )

    # -- result ----------------------------------------------------------------------------

    def result(self) -> SegmentedFusion:
        order = self.execution_order()
        segs = tuple(self.build_segment(k, r) for k, r in enumerate(order))
        return SegmentedFusion(self.graph, segs, self.boundaries(order), self.merges)

    def execution_order(self) -> list[int]:
        preds: dict[int, set[int]] = {r: set() for r in self.groups}
        for r, g in self.groups.items():
            for c in g.consumers:
                h = self.find(c)
                if h != r:
                    preds[h].add(r)
        succs: dict[int, list[int]] = defaultdict(list)
        for h, ps in preds.items():
            for p in ps:
                succs[p].append(h)
        indeg = {r: len(ps) for r, ps in preds.items()}
        heap = [(self.groups[r].min_idx, r) for r, d in indeg.items() if d == 0]
        heapq.heapify(heap)
        order = []
        while heap:
            _, r = heapq.heappop(heap)
            order.append(r)
            for h in succs[r]:
                indeg[h] -= 1
                if indeg[h] == 0:
                    heapq.heappush(heap, (self.groups[h].min_idx, h))
        if len(order) != len(self.groups):  # pragma: no cover - the merge rule forbids it
            raise AssertionError("segment graph has a cycle")
        return order

    def build_segment(self, index: int, root: int) -> Segment:
        g = self.groups[root]
        idxs = sorted(g.nodes)
        nodes = [self.graph.nodes[i] for i in idxs]
        return build_segment(self.graph, index, self.exact_kind(g, idxs), nodes)

    def exact_kind(self, g: _Group, idxs: list[int]) -> SegmentKind:
        kind, domain = g.traits.kind(), g.traits.domain
        if kind != SegmentKind.REDUCTION or domain is None:  # (a REDUCTION has its domain: Traits.kind)
            return kind
        # NORMALIZATION iff a full-size computing node depends on a reduction inside the segment.
        full = domain.full
        tainted: set[str] = set()
        for i in idxs:
            node = self.graph.nodes[i]
            nt = self.traits[i]
            from_reduction = any(v in tainted for v in node.inputs)
            if from_reduction and nt.kind not in (OpKind.VIEW, OpKind.REDUCTION) and node.outputs[0] \
                    and size_key(self.graph.metas[node.outputs[0]].numel) == full:
                return SegmentKind.NORMALIZATION
            if nt.kind == OpKind.REDUCTION or from_reduction:
                tainted.update(o for o in node.outputs if o is not None)
        return kind

    def boundaries(self, order: list[int]) -> tuple[Boundary, ...]:
        seg_of = {r: k for k, r in enumerate(order)}
        reasons: dict[tuple[int, int], str] = {}
        for ra, rb, why in self.refusals:
            reasons[(self.find(ra), self.find(rb))] = why
        out = []
        for r in order:
            for v in self.groups[r].outputs:
                for c in sorted({self.find(u) for u in self.value_users.get(v, ())} - {r}, key=seg_of.__getitem__):
                    why = reasons.get((r, c)) or (
                        "not tried: out of fuel" if self.out_of_fuel() else "no merge was tried across this edge"
                    )
                    out.append(Boundary(v, seg_of[r], seg_of[c], why))
        return tuple(out)


def segment(graph: FusionGraph, options: SegmenterOptions | None = None) -> SegmentedFusion:
    """Cut ``graph`` into segments that one kernel each can run (see Note [merge order])."""
    # The pass makes a few objects per node and frees none of them until it returns; the
    # cyclic collector would rescan them all again and again (on 100k nodes, a third of the time).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _segment(graph, options or SegmenterOptions())
    finally:
        if was_enabled:
            gc.enable()


def _segment(graph: FusionGraph, options: SegmenterOptions) -> SegmentedFusion:
    if options.bias_after_matmul is not False:  # Note [a matmul's bias after it]
        graph = split_matmul_bias(graph, force=bool(options.bias_after_matmul))
    part = _Partition(graph, options)
    rounds = 0
    while rounds < part.options.max_rounds and not part.out_of_fuel():
        rounds += 1
        if part.vertical_round():
            continue
        # Vertical merging is stuck; a horizontal merge may unblock it (a producer whose
        # consumers must all join it before its outputs agree on one iteration space).
        if not part.options.allow_horizontal or not part.horizontal_round():
            break
    return part.result()
