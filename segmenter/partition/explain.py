"""Human-readable and JSON views of a segmentation (``fuseg segment [--explain] [--json]``)."""

from __future__ import annotations

from typing import Any

import sympy

from ..ir.symbolic import SymbolicSizes, sizes_of
from .segments import SegmentedFusion

__all__ = ["describe_segments", "segmentation_to_dict"]


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 1e5 else f"{n} B"


def describe_segments(sf: SegmentedFusion, explain: bool = False) -> str:
    g = sf.graph
    lines = [f"graph {g.name}: {len(g.nodes)} nodes -> {len(sf.segments)} segments"]
    for s in sf.segments:
        ops = ", ".join(n.op.removeprefix("aten.") for n in s.nodes)
        lines.append(f"  {s.name} {s.kind.name:<13} {len(s.nodes):>3} ops  [{ops}]")
        if explain:
            lines.append(f"      inputs:  {', '.join(f'%{v} {g.metas[v]}' for v in s.inputs) or '-'}")
            lines.append(f"      outputs: {', '.join(f'%{v} {g.metas[v]}' for v in s.outputs) or '-'}")
            lines.append(f"      modeled bytes: read {_mb(s.bytes_read)}, written {_mb(s.bytes_written)}"
                         + ("" if s.launches_kernel else " (no launch: moves nothing)"))
    if explain:
        lines.append("boundaries (value: producer -> consumer: why they were not merged):")
        for b in sf.boundaries:
            lines.append(f"  %{b.value}: s{b.producer} -> s{b.consumer}: {b.reason}")
        if not sf.boundaries:
            lines.append("  none")
    st = sf.stats()
    sizes = sizes_of(g)
    lines.append(
        f"kernels {st['kernels']}, opaque {st['opaque']}, launches {st['launches']}, metadata {st['metadata']}, "
        f"bytes moved {_mb(st['bytes_moved'])} (floor {_mb(st['bytes_floor'])})"
        + (" at the symbols' hints" if sizes is not None else "")
    )
    if sizes is not None:
        lines.extend(describe_sizes(sizes))
    return "\n".join(lines)


def describe_sizes(sizes: SymbolicSizes) -> list[str]:
    """See Note [symbolic plans]: one segmentation for every size where its conditions hold."""
    ranges = []
    for sym in sizes.sources:
        vr = sizes.env.var_to_range[sym]
        upper = f"{int(vr.upper)}" if isinstance(vr.upper, sympy.Integer) else "inf"
        ranges.append(f"{sizes.display.get(sym, str(sym))} in [{int(vr.lower)}, {upper}] (hint {sizes.hints[sym]})")
    conds = [c for c in sizes.condition_text() if c]
    return [f"symbolic sizes: {'; '.join(ranges)}",
            "one segmentation for every size" + (f" where {' and '.join(conds)}" if conds else " in these ranges")]


def segmentation_to_dict(sf: SegmentedFusion) -> dict[str, Any]:
    """The segmentation by node and value names, to pair with the graph's own JSON."""
    return {
        "graph": sf.graph.name,
        "alias_mode": sf.alias_mode,
        "stats": sf.stats(),
        "segments": [
            {
                "index": s.index,
                "kind": s.kind.value,
                "launches_kernel": s.launches_kernel,
                "nodes": [n.name for n in s.nodes],
                "inputs": list(s.inputs),
                "outputs": list(s.outputs),
                "bytes_read": s.bytes_read,
                "bytes_written": s.bytes_written,
            }
            for s in sf.segments
        ],
        "boundaries": [
            {"value": b.value, "producer": b.producer, "consumer": b.consumer, "reason": b.reason}
            for b in sf.boundaries
        ],
    }
