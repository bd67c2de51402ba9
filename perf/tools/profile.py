"""``fuseg profile [MODEL ...]``: segment and kernel counts per model, alias modes side by side.

One record per model (JSON: a list of these, first key "model"), with stable keys:
  model, nodes, eager_launches (ops that would launch in eager: every non-view node),
  then for each mode in off / pre / post: {mode}_segments, {mode}_kernels, {mode}_launches,
  {mode}_metadata, {mode}_opaque, {mode}_bytes_moved, {mode}_generated (POINTWISE, REDUCTION and
  NORMALIZATION kernels: what a fuser generates, matmuls excluded); and bytes_floor, segment_ms,
  inductor_kernels (kernels Inductor generated for the same program under ``torch.compile``, with
  ``--inductor``; empty otherwise, or where torch.compile cannot run: meta-tensor entries, JSON graphs);
  nvfuser_segments_quoted, nvfuser_kernels_quoted, nvfuser_quote (for the nvFuser fusions of
  perf/fusions: nvFuser's segmentation as its issue quotes it, not measured; empty elsewhere).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import pandas as pd

from alias import apply_aliases
from segmenter import OpKind, SegmentedFusion, SegmenterOptions, SegmentKind, op_info, segment

from .. import fusions, zoo
from ..targets import Target, load_program

__all__ = ["COLUMNS", "MODES", "plot_kernels", "profile", "profile_target", "render", "side_by_side"]

MODES = ("off", "pre", "post")  # side by side in this order

COLUMNS = ["model", "nodes", "eager_launches"] + [
    f"{mode}_{key}" for mode in MODES
    for key in ("segments", "kernels", "launches", "metadata", "opaque", "bytes_moved", "generated")
] + ["bytes_floor", "segment_ms", "inductor_kernels", "nvfuser_segments_quoted", "nvfuser_kernels_quoted",
      "nvfuser_quote"]

_GENERATED = {SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION}


def inductor_kernels(fn: Any, inputs: list[Any]) -> int | None:
    """How many kernels Inductor generates for ``fn`` on ``inputs`` (None where it cannot run)."""
    import torch

    if fn is None or any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in inputs):
        return None
    from torch._inductor import metrics

    torch._dynamo.reset()
    metrics.reset()
    with torch.no_grad():
        torch.compile(fn)(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])
    return metrics.generated_kernel_count


def profile_target(name: str, target: Target, options: SegmenterOptions | None = None,
                   inductor: bool = False,
                   keep: Callable[[str, SegmentedFusion, dict[str, SegmentedFusion]], None] | None = None,
                   ) -> dict[str, Any]:
    """One record (the module's keys) for a loaded target. ``keep(model, plan, plans_by_mode)``,
    where given, receives the segmenter's plan and the plan per alias mode (``--html``)."""
    graph = target.graph
    t0 = time.perf_counter()
    sf = segment(graph, options)
    row: dict[str, Any] = {
        "model": name, "nodes": len(graph.nodes),
        "eager_launches": sum(op_info(n.op).kind != OpKind.VIEW for n in graph.nodes),
        "segment_ms": round((time.perf_counter() - t0) * 1e3, 2),
    }
    plans: dict[str, SegmentedFusion] = {}
    for mode in MODES:
        plan = plans[mode] = apply_aliases(sf, mode)
        st = plan.stats()
        for key in ("segments", "kernels", "launches", "metadata", "opaque", "bytes_moved"):
            row[f"{mode}_{key}"] = st[key]
        row[f"{mode}_generated"] = sum(s.kind in _GENERATED for s in plan.segments)
        row["bytes_floor"] = st["bytes_floor"]
    if keep is not None:
        keep(name, sf, plans)
    row["inductor_kernels"] = inductor_kernels(target.fn, target.inputs or []) if inductor else None
    quoted = fusions.FUSIONS.get(name)
    row["nvfuser_segments_quoted"] = quoted.nvfuser_segments if quoted else None
    row["nvfuser_kernels_quoted"] = quoted.nvfuser_kernels if quoted else None
    row["nvfuser_quote"] = f"{quoted.issue}: {quoted.quote}" if quoted else None
    return row


def profile(models: list[str], options: SegmenterOptions | None = None, progress: bool = True,
            inductor: bool = False, real_size: bool = False,
            keep: Callable[[str, SegmentedFusion, dict[str, SegmentedFusion]], None] | None = None,
            ) -> pd.DataFrame:
    """One row per model (the module's docstring); ``keep``: as ``profile_target``'s."""
    for name in models:  # refuse a bad name before any work (and before any progress output)
        if ":" not in name and not name.endswith(".json") and not os.path.isfile(name) and name not in zoo.ZOO \
                and name not in fusions.FUSIONS:
            zoo.get(name)  # raises with the list of examples
    rows: list[dict[str, Any]] = []
    for k, name in enumerate(models):
        if progress:
            print(f"\r[{k + 1}/{len(models)}] {name:<20}", end="", file=sys.stderr, flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            target = load_program(name, real_size=real_size)
        rows.append(profile_target(name, target, options, inductor, keep))
    if progress:
        print(file=sys.stderr)
    return pd.DataFrame(rows, columns=COLUMNS)


def render(df: pd.DataFrame, fmt: str) -> str:
    if fmt == "json":
        return df.to_json(orient="records", indent=1)
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "markdown":
        head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns)
        body = "\n".join("| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False))
        return head + "\n" + body
    return df.to_string(index=False)


def side_by_side(df: pd.DataFrame) -> str:
    """The nvFuser fusions' rows: nvFuser's segmentation as its issue quotes it (not measured
    here) beside ours ("post" mode); empty where no row has a quote."""
    rows = df[df["nvfuser_quote"].notna()]
    if rows.empty:
        return ""
    lines = ["nvFuser (quoted from its issue, not measured) against ours (post mode, measured):",
             f"{'model':14s} {'nvFuser segs':>12s} {'nvFuser kernels':>15s} {'our segs':>8s} {'our kernels':>11s} "
             f"{'our metadata':>12s}  source"]
    for r in rows.itertuples(index=False):
        def n(v: object) -> str:
            return "?" if v is None or v != v else str(int(v))  # NaN: the issue gives no count
        lines.append(f"{r.model:14s} {n(r.nvfuser_segments_quoted):>12s} {n(r.nvfuser_kernels_quoted):>15s} "
                     f"{r.post_segments:>8d} {r.post_kernels:>11d} {r.post_metadata:>12d}  {r.nvfuser_quote}")
    return "\n".join(lines)


def plot_kernels(df: pd.DataFrame, path: str, title: str = "generated kernels per model") -> None:
    """Bar chart: generated kernels per model for off / pre / post, with Inductor's beside them."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OSError("--plot needs matplotlib: pip install -e '.[plot]'") from None
    cols = [f"{m}_generated" for m in MODES] + (["inductor_kernels"] if df["inductor_kernels"].notna().any() else [])
    data = df.set_index("model")[cols].astype(float)
    data.columns = [c.removesuffix("_generated").removesuffix("_kernels") for c in cols]
    ax = data.plot.bar(figsize=(max(6, len(df) * 0.9), 4), rot=45)
    ax.set_ylabel("kernels")
    ax.set_title(title)
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()
