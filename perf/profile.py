"""``fuseg profile [MODEL ...]``: segment and kernel counts per model, alias modes side by side.

One record per model (JSON: a list of these, first key "model"), with stable keys:
  model, nodes, eager_launches (ops that would launch in eager: every non-view node),
  then for each mode in off / pre / post: {mode}_segments, {mode}_kernels, {mode}_launches,
  {mode}_metadata, {mode}_opaque, {mode}_bytes_moved; and bytes_floor, segment_ms.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any

import pandas as pd

from alias import apply_aliases
from segmenter import OpKind, SegmenterOptions, op_info, segment

from . import zoo
from .targets import load_program

__all__ = ["COLUMNS", "MODES", "profile", "render"]

MODES = ("off", "pre", "post")  # side by side in this order

COLUMNS = ["model", "nodes", "eager_launches"] + [
    f"{mode}_{key}" for mode in MODES for key in ("segments", "kernels", "launches", "metadata", "opaque", "bytes_moved")
] + ["bytes_floor", "segment_ms"]


def profile(models: list[str], options: SegmenterOptions | None = None, progress: bool = True) -> pd.DataFrame:
    for name in models:  # refuse a bad name before any work (and before any progress output)
        if ":" not in name and not name.endswith(".json") and not os.path.isfile(name) and name not in zoo.ZOO:
            zoo.get(name)  # raises with the list of examples
    rows: list[dict[str, Any]] = []
    for k, name in enumerate(models):
        if progress:
            print(f"\r[{k + 1}/{len(models)}] {name:<20}", end="", file=sys.stderr, flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            graph = load_program(name).graph
        t0 = time.perf_counter()
        sf = segment(graph, options)
        row: dict[str, Any] = {
            "model": name, "nodes": len(graph.nodes),
            "eager_launches": sum(op_info(n.op).kind != OpKind.VIEW for n in graph.nodes),
            "segment_ms": round((time.perf_counter() - t0) * 1e3, 2),
        }
        for mode in MODES:
            st = apply_aliases(sf, mode).stats()
            for key in ("segments", "kernels", "launches", "metadata", "opaque", "bytes_moved"):
                row[f"{mode}_{key}"] = st[key]
            row["bytes_floor"] = st["bytes_floor"]
        rows.append(row)
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
