"""Kernels and modeled bytes moved for the alias modes off / pre / post, on the examples.

    python -m perf.benchmarks.bench_alias [--out perf/results/<machine>/alias_modes.json] [--markdown]

Each example is captured, segmented once with default options and once with a cut at every op
(``max_ops_per_segment=1``, the forced cut of seeds/002), then run through the three alias modes.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from alias import MODES, apply_aliases, check
from segmenter import SegmenterOptions, capture, segment

from .. import zoo


def rows(names: list[str]) -> list[dict[str, Any]]:
    out = []
    for name in names:
        fn, inputs = zoo.get(name).factory()
        graph = capture(fn, inputs)
        for cut, options in (("default", SegmenterOptions()), ("every-op", SegmenterOptions(max_ops_per_segment=1))):
            sf = segment(graph, options)
            row: dict[str, Any] = {"model": name, "cut": cut, "nodes": len(graph.nodes)}
            for mode in MODES:
                plan = apply_aliases(sf, mode)
                problems = check(sf, plan)
                if problems:
                    raise AssertionError(f"{name} {cut} {mode}: {problems}")
                st = plan.stats()
                row[f"{mode}_kernels"] = st["kernels"]
                row[f"{mode}_metadata"] = st["metadata"]
                row[f"{mode}_bytes"] = st["bytes_moved"]
            row["opaque"] = st["opaque"]
            row["bytes_floor"] = st["bytes_floor"]
            out.append(row)
            print(f"{name:>13} {cut:>8}: kernels off/pre/post {row['off_kernels']}/{row['pre_kernels']}/"
                  f"{row['post_kernels']}", file=sys.stderr)
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    head = ("| model | cut | kernels off | pre | post | metadata post | MB moved off | pre | post | floor MB |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in table:
        mb = [f"{r[k] / 1e6:.3f}" for k in ("off_bytes", "pre_bytes", "post_bytes", "bytes_floor")]
        lines.append(f"| {r['model']} | {r['cut']} | {r['off_kernels']} | {r['pre_kernels']} | {r['post_kernels']} | "
                     f"{r['post_metadata']} | {' | '.join(mb)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(zoo.ZOO))
    p.add_argument("--out", default=None)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)
    table = rows(args.models)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"benchmark": "alias_modes", "rows": table}, f, indent=1)
            f.write("\n")
    print(markdown(table) if args.markdown else json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
