"""The data a segmentation page draws: plain JSON-able dicts, apart from the page itself.

One record per graph (``graph_data``): the graph's nodes and values once, and per alias mode its
segments (the groups the page draws), the boundaries between them with the segmenter's or the
alias pass's reason, the alias pass's decisions and the modeled bytes against the floor. Nodes
and values are referred to by their index in the graph's tables, so a 10^4-node graph stays a
few MB whatever the number of modes.

Note [page layout]: the page lays segments out in layers computed here, once. A segment's layer
is one more than the deepest segment it reads from (segments come in execution order, so one
pass suffices); within a layer segments are ordered by the mean position of their producers (one
barycentre sweep, which untangles chains without a crossing-minimizer's cost). Nodes inside a
segment get layers the same way, among the segment's own nodes. The page only turns layers into
pixels, so expanding a box costs it one pass over the segments, not a graph layout.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from segmenter import FusionGraph, SegmentedFusion, op_info
from segmenter.ir.graph import TensorMeta, view_roots
from segmenter.ir.symbolic import sizes_of
from segmenter.partition.explain import describe_sizes

__all__ = ["MODE_NOTES", "PAGE_VERSION", "graph_data", "page_data"]

PAGE_VERSION = 1

MODE_NOTES = {
    "post": "ours: alias analysis again on every segment after the cut; view-only segments and "
            "view outputs become metadata (no launch), kernels read strided inputs in place",
    "pre": "today's fusers: only graph outputs that are views of graph inputs become metadata; "
           "every value passed between launches is a contiguous copy",
    "off": "no aliasing inside or between segments (outputs that alias inputs in the program stay views)",
    None: "the segmenter's plan before any alias pass",
}


def _dim(x: int | torch.SymInt, graph: FusionGraph) -> int | str:
    if isinstance(x, torch.SymInt):
        sizes = sizes_of(graph)
        return sizes.text(x) if sizes is not None else str(x)
    return int(x)


def _meta(m: TensorMeta | None, graph: FusionGraph) -> dict[str, Any] | None:
    if m is None:
        return None
    out: dict[str, Any] = {"shape": [_dim(x, graph) for x in m.shape],
                           "stride": [_dim(x, graph) for x in m.stride],
                           "offset": _dim(m.storage_offset, graph),
                           "dtype": str(m.dtype).removeprefix("torch."), "device": m.device}
    if m.conj or m.neg:
        out["bits"] = "conj" * m.conj + " neg" * m.neg
    return out


class _Tables:
    """The graph's nodes and values, each once, by index."""

    def __init__(self, graph: FusionGraph) -> None:
        self.graph = graph
        self.value_index: dict[str, int] = {}
        self.values: list[dict[str, Any]] = []
        metas = graph.metas
        roots = view_roots(graph, include_maybe_copies=False)
        for inp in graph.inputs:
            self._value(inp.name, metas.get(inp.name), roots, role=inp.role)
        for c in graph.constants:
            self._value(c.name, metas.get(c.name), roots, role="constant")
        self.node_index = {n.name: i for i, n in enumerate(graph.nodes)}
        self.nodes: list[dict[str, Any]] = []
        for i, n in enumerate(graph.nodes):
            outs = [self._value(o, metas.get(o), roots, producer=i) for o in n.outputs if o is not None]
            self.nodes.append({"name": n.name, "op": n.op, "kind": op_info(n.op).kind.name,
                               "inputs": [self.value_index[v] for v in n.inputs if v in self.value_index],
                               "outputs": outs})
        for v in graph.outputs:
            if v in self.value_index:
                self.values[self.value_index[v]]["output"] = True
        for m in graph.mutations:
            self.values[self.value_index[graph.inputs[m.input].name]]["mutated_to"] = self.value_index.get(m.value)

    def _value(self, name: str, meta: TensorMeta | None, roots: Mapping[str, str], *, producer: int = -1,
               role: str | None = None) -> int:
        found = self.value_index.get(name)
        if found is not None:
            return found
        record: dict[str, Any] = {"name": name, "producer": producer, "meta": _meta(meta, self.graph)}
        if role is not None:
            record["role"] = role
        root = roots.get(name)
        if root is not None and root != name:
            record["root"] = root
        self.value_index[name] = len(self.values)
        self.values.append(record)
        return self.value_index[name]


def _layers(items: list[list[int]]) -> tuple[list[int], list[int]]:
    """Layer and order within the layer of items given in topological order, each with the
    indices of the earlier items it reads from (Note [page layout])."""
    layer: list[int] = []
    for preds in items:
        layer.append(1 + max((layer[p] for p in preds), default=-1))
    order = [0] * len(items)
    by_layer: dict[int, list[int]] = {}
    for i, lay in enumerate(layer):
        by_layer.setdefault(lay, []).append(i)
    for lay in sorted(by_layer):
        members = by_layer[lay]
        if lay > 0:
            def centre(i: int) -> float:
                preds = items[i]
                return sum(order[p] for p in preds) / len(preds) if preds else 0.0
            members.sort(key=lambda i: (centre(i), i))
        for k, i in enumerate(members):
            order[i] = k
    return layer, order


def _mode_data(sf: SegmentedFusion, tables: _Tables, origin_of: Mapping[str, int] | None,
               reasons: dict[str, int], reason_list: list[str]) -> dict[str, Any]:
    g = sf.graph
    base = tables.graph
    vi, ni = tables.value_index, tables.node_index
    made_in = {o: s.index for s in sf.segments for o in s.outputs}
    seg_preds = [sorted({made_in[v] for v in s.inputs if v in made_in and made_in[v] != s.index})
                 for s in sf.segments]
    seg_layer, seg_order = _layers(seg_preds)
    segments = []
    for s, lay, order in zip(sf.segments, seg_layer, seg_order):
        local = {n.name: k for k, n in enumerate(s.nodes)}
        made_by = {o: local[n.name] for n in s.nodes for o in n.outputs if o is not None}
        node_preds = [sorted({made_by[v] for v in n.inputs if v in made_by}) for n in s.nodes]
        n_layer, n_order = _layers(node_preds)
        record: dict[str, Any] = {
            "index": s.index, "name": s.name, "kind": s.kind.value, "launches": s.launches_kernel,
            "nodes": [ni[n.name] for n in s.nodes], "node_layer": n_layer, "node_order": n_order,
            "inputs": [vi[v] for v in s.inputs if v in vi], "outputs": [vi[v] for v in s.outputs if v in vi],
            "bytes_read": s.bytes_read, "bytes_written": s.bytes_written, "bytes_moved": s.bytes_moved,
            "layer": lay, "order": order,
        }
        if origin_of is not None:
            record["origin"] = origin_of.get(s.nodes[0].name)
        segments.append(record)
    boundaries = []
    for b in sf.boundaries:
        k = reasons.get(b.reason)
        if k is None:
            k = reasons[b.reason] = len(reason_list)
            reason_list.append(b.reason)
        boundaries.append({"value": vi[b.value], "producer": b.producer, "consumer": b.consumer, "reason": k})
    out: dict[str, Any] = {"mode": sf.alias_mode or "segmenter", "note": MODE_NOTES.get(sf.alias_mode, ""),
                           "stats": sf.stats(), "segments": segments, "boundaries": boundaries,
                           "alias": _alias_data(sf, vi)}
    if g is not base:  # the alias pass rewrote the graph (copies elided): what differs from the table
        out["changed_nodes"], out["changed_values"] = _changes(g, tables)
    return out


def _alias_data(sf: SegmentedFusion, vi: Mapping[str, int]) -> dict[str, Any] | None:
    report = sf.alias_report
    if report is None:
        return None

    def pairs(items: Iterable[tuple[str, str]]) -> list[list[Any]]:
        return [[vi.get(v, v), w] for v, w in items]

    segs = [{"segment": r.segment, "kind": r.kind.value, "became": [k.value for k in r.became],
             "views_of_inputs": pairs(r.views_of_inputs), "views_of_outputs": pairs(r.views_of_outputs),
             "kept": pairs(r.kept_in_kernel)}
            for r in report.segments if r.views_of_inputs or r.views_of_outputs or r.kept_in_kernel]
    return {"kernels_before": report.kernels_before, "kernels_after": report.kernels_after,
            "metadata_after": report.metadata_after, "segments": segs, "elided": pairs(report.copies_elided)}


def _changes(g: FusionGraph, tables: _Tables) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    nodes: dict[str, str] = {}
    values: dict[str, dict[str, Any]] = {}
    roots = view_roots(g, include_maybe_copies=False)
    for n in g.nodes:
        i = tables.node_index.get(n.name)
        if i is None:
            continue
        if tables.nodes[i]["op"] != n.op:
            nodes[str(i)] = n.op
        for o, m in zip(n.outputs, n.metas):
            if o is None or o not in tables.value_index:
                continue
            k = tables.value_index[o]
            old = tables.values[k]
            meta, root = _meta(m, g), roots.get(o)
            if meta != old["meta"] or root != old.get("root"):
                values[str(k)] = {"meta": meta, **({"root": root} if root else {})}
    return nodes, values


def graph_data(plans: SegmentedFusion | Mapping[str, SegmentedFusion], name: str | None = None,
               base: SegmentedFusion | None = None, initial: str | None = None) -> dict[str, Any]:
    """The page's record of one graph. ``plans``: the segmenter's plan (straight from
    ``segmenter.segment``: the three alias modes are run on it), or plans by mode name (each drawn
    as is, in the order given). ``base``: the segmenter's plan they came from, where known (each
    segment then names the segment it came from, and shows what the alias pass did there).
    ``initial``: the mode the page shows first (default: the first)."""
    # the records free nothing until they are written: the cyclic collector would only rescan the
    # graph on every allocation burst (most of the time on 10^4 nodes), as in segmenter.segment
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        record = _graph_data(plans, name, base)
    finally:
        if was_enabled:
            gc.enable()
    modes = [m["mode"] for m in record["modes"]]
    if initial is not None and initial not in modes:
        raise ValueError(f"no {initial!r} plan to show first: the plans are {', '.join(modes)}")
    record["initial_mode"] = initial or modes[0]
    return record


def _graph_data(plans: SegmentedFusion | Mapping[str, SegmentedFusion], name: str | None,
                base: SegmentedFusion | None) -> dict[str, Any]:
    from alias import MODES, apply_aliases

    if isinstance(plans, SegmentedFusion):
        if plans.alias_mode is None:
            base = plans
            by_mode = {m: apply_aliases(plans, m) for m in MODES}
        else:
            by_mode = {plans.alias_mode: plans}
    else:
        by_mode = dict(plans)
        if base is None:
            base = next((p for p in by_mode.values() if p.alias_mode is None), None)
    if not by_mode:
        raise ValueError("no plan to draw")
    first = base if base is not None else next(iter(by_mode.values()))
    tables = _Tables(first.graph)
    origin_of = base.segment_of() if base is not None else None
    reason_list: list[str] = []
    reasons: dict[str, int] = {}
    modes = [_mode_data(sf, tables, origin_of, reasons, reason_list) for sf in by_mode.values()]
    for m, key in zip(modes, by_mode):
        m["mode"] = key
    g = first.graph
    sizes = sizes_of(g)
    return {"name": name or g.name, "nodes": tables.nodes, "values": tables.values,
            "inputs": [tables.value_index[i.name] for i in g.inputs],
            "outputs": [tables.value_index[v] for v in g.outputs if v in tables.value_index],
            "reasons": reason_list, "modes": modes,
            # a symbolic plan: its symbols' ranges and the conditions it holds under (bytes are at the hints)
            "sizes": describe_sizes(sizes) if sizes is not None else []}


def page_data(graphs: Iterable[dict[str, Any]], title: str = "fuseg segmentation",
              table: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything one page holds: graph records (``graph_data``) and, for ``fuseg profile``, its
    table's rows."""
    return {"version": PAGE_VERSION, "title": title, "graphs": list(graphs), "table": table}
