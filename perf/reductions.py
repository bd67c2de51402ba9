"""Reductions: error against float64 and time of the ways a long sum is generated, in one run.

    python -m perf.reductions [--out perf/results/<machine>/reductions_cpu.json] [--large]

Each program is generated three times in this process and the three are called alternately with
eager beside them:

- ``as built``: the kernels as they are: a float sum or mean over a long, symbolic-length or
  outer-dim row in ATen's order (Note [sums in ATen's order, streamed], runtime/codegen/lowering/cascade.py),
  other long sums in compensated chunks (Note [sums in chunks]);
- ``chunked``: every long sum in chunks (``cascade.STREAMED`` off: the kernels before ATen's order
  was streamed);
- ``one loop``: no chunks either (the chunk lengths set past every size here: the source a sum had
  before chunks).

Tables:

- ``accuracy``: whole-tensor, row and column reductions at 2^16..2^24 elements (``--large``:
  up to 2^26): each way's and eager's error against the program in float64 (the largest absolute
  difference relative to the largest magnitude of the float64 result).
- ``speed``: the row sizes of real models (hidden sizes, vocabularies) and column sums of bias
  gradients: the median time of each way and eager's, and their ratios. A case whose kernels are
  the same source in two ways says so (a control).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

F = torch.nn.functional

#: name -> program over one input
PROGRAMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "var": lambda x: x.var(-1),
    "norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
    "rms_norm": lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
    "column_sum": lambda x: x.sum(0),
    "column_var": lambda x: x.var(0),
    "total": lambda x: x.sum(),
}

#: (program, shape, dtype) of the accuracy table
ACCURACY = [(p, (n,), d) for p in ("sum", "mean", "var", "norm") for n in (1 << 16, (1 << 20) + 1, (1 << 24) + 1)
            for d in (torch.float32, torch.float16, torch.bfloat16)]
ACCURACY += [(p, (4, n), torch.float32) for p in ("softmax", "layer_norm", "rms_norm") for n in (8192, 1 << 20)]
ACCURACY += [(p, (n, 16), d) for p in ("column_sum", "column_var") for n in (1 << 12, 1 << 20)
             for d in (torch.float32, torch.float16)]
LARGE = [(p, ((1 << 26) + 1,), d) for p in ("sum", "var") for d in (torch.float32, torch.float16)]

#: (program, shape) of the speed table: rows of real models and bias gradients' column sums
SPEED = [(p, (rows, n)) for p in ("softmax", "layer_norm", "rms_norm", "sum")
         for rows, n in ((256, 768), (256, 4096), (256, 8192), (16, 32000), (16, 50257), (8, 152064))]
SPEED += [("log_softmax", (16, 50257)), ("column_sum", (512, 768)), ("column_sum", (2048, 1024)),
          ("column_sum", (8192, 4096)), ("column_var", (2048, 1024)), ("column_sum", (50, 2500)),
          ("sum", (1, 1 << 22)), ("mean", (4, 100003)), ("total", (256, 768)), ("total", (4096, 1024))]


def _input(shape: tuple[int, ...], dtype: torch.dtype, offset: float = 0.0) -> torch.Tensor:
    """Uniform in [offset, offset + 1): where adding one value at a time loses the most."""
    g = torch.Generator().manual_seed(sum(shape))
    return (torch.rand(*shape, generator=g, dtype=torch.float64) + offset).to(dtype)


def _offset(name: str) -> float:
    return 1.0 if "var" in name or "norm" in name else 0.0  # variances and norms: some cancellation


def _error(got: torch.Tensor, ref: torch.Tensor) -> float | None:
    """None where the result overflows its dtype (a float16 sum of 2^20 values near 1)."""
    if not bool(got.isfinite().all()):
        return None
    scale = ref.abs().max().item() or 1.0
    return (got.double() - ref).abs().max().item() / scale


def _fmt(e: float | None) -> str:
    return "overflow" if e is None else f"{e:.2e}"


WAYS = ("as built", "chunked", "one loop")


def _programs(fn: Callable, x: torch.Tensor) -> dict[str, Any]:
    """The program built each of the three ways (``WAYS``), every segment a kernel."""
    import runtime
    from alias import apply_aliases
    from runtime.autotune import fixed
    from runtime.codegen.lowering import cascade
    from segmenter import capture, segment

    plan = apply_aliases(segment(capture(fn, [x])), "post")
    ways = {}
    saved = cascade.ROW_CHUNK, cascade.COLUMN_CHUNK, cascade.SCALAR_CHUNK, cascade.STREAMED, cascade.aten_order_applies
    try:
        with fixed("kernel"):
            ways["as built"] = runtime.compile(plan, backend="cpp")
            cascade.STREAMED = False
            ways["chunked"] = runtime.compile(plan, backend="cpp")
            cascade.ROW_CHUNK = cascade.COLUMN_CHUNK = cascade.SCALAR_CHUNK = 1 << 62
            # (and no row laid out in ATen's order, Note [sums in ATen's order]: its source grows
            # with the row's length)
            cascade.aten_order_applies = lambda *a: False
            ways["one loop"] = runtime.compile(plan, backend="cpp")
    finally:
        (cascade.ROW_CHUNK, cascade.COLUMN_CHUNK, cascade.SCALAR_CHUNK, cascade.STREAMED,
         cascade.aten_order_applies) = saved
    return ways


def _sources(prog: Any) -> list[str]:
    return sorted(k.body for k in prog.kernels.values())


def _first(r: Any) -> torch.Tensor:
    return r[0] if isinstance(r, (tuple, list)) else r


def accuracy(cases: list) -> list[dict[str, Any]]:
    rows = []
    for k, (name, shape, dtype) in enumerate(cases):
        fn = PROGRAMS[name]
        x = _input(shape, dtype, _offset(name))
        ref = _first(fn(x.double()))
        row = {"program": name, "shape": list(shape), "dtype": str(dtype).split(".")[1],
               "eager": _error(_first(fn(x)), ref)}
        for way, prog in _programs(fn, x).items():
            row[way] = _error(_first(prog(x)), ref)
        rows.append(row)
        print(f"[{k + 1}/{len(cases)}] {name} {shape} {row['dtype']}: eager {_fmt(row['eager'])}, "
              + ", ".join(f"{w} {_fmt(row[w])}" for w in WAYS), file=sys.stderr, flush=True)
    return rows


def speed(cases: list, calls: int) -> list[dict[str, Any]]:
    rows = []
    for k, (name, shape) in enumerate(cases):
        fn = PROGRAMS[name]
        x = _input(shape, torch.float32, _offset(name))
        built = _programs(fn, x)
        ways = {"eager": fn, **built}
        for f in ways.values():  # first touches
            f(x)
        times: dict[str, list[float]] = {w: [] for w in ways}
        order = list(ways)
        for c in range(calls):
            for w in order[c % len(order):] + order[:c % len(order)]:  # each round in another order
                t0 = time.perf_counter()
                ways[w](x)
                times[w].append(time.perf_counter() - t0)
        med = {w: statistics.median(t) * 1e6 for w, t in times.items()}
        src = {w: _sources(p) for w, p in built.items()}
        row = {"program": name, "shape": list(shape),
               "same_source": {"as built, chunked": src["as built"] == src["chunked"],
                               "chunked, one loop": src["chunked"] == src["one loop"]},
               **{f"{w.replace(' ', '_')}_us": round(m, 2) for w, m in med.items()},
               "as_built_over_chunked": round(med["as built"] / med["chunked"], 4),
               "chunked_over_one_loop": round(med["chunked"] / med["one loop"], 4),
               "as_built_over_eager": round(med["as built"] / med["eager"], 4)}
        rows.append(row)
        print(f"[{k + 1}/{len(cases)}] {name} {shape}: as built/chunked {row['as_built_over_chunked']:.3f}"
              f"{' (same source)' if row['same_source']['as built, chunked'] else ''}, "
              f"as built/eager {row['as_built_over_eager']:.3f}", file=sys.stderr, flush=True)
    return rows


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "range": [min(values), max(values)]} if values else {}


def main(argv: list[str] | None = None) -> int:
    from perf.bench import environment

    ap = argparse.ArgumentParser(prog="python -m perf.reductions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the record here (JSON)")
    ap.add_argument("--large", action="store_true", help="add 2^26 + 1 element sums and variances")
    ap.add_argument("--calls", type=int, default=60, help="timed calls of each way per case")
    ap.add_argument("--only", choices=("accuracy", "speed"), help="one of the two tables")
    args = ap.parse_args(argv)
    os.environ["FUSEG_BACKGROUND_BUILDS"] = "0"
    result: dict[str, Any] = {"benchmark": "reductions", "environment": environment("cpu")}
    if args.only != "speed":
        result["accuracy"] = rows = accuracy(ACCURACY + (LARGE if args.large else []))
        eps = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}

        def within(r: dict[str, Any], way: str) -> bool:  # the rule of tests/test_reduction_accuracy.py
            return r[way] is None or r["eager"] is None or r[way] <= 2 * r["eager"] + 2 * eps[r["dtype"]]
        result["accuracy_summary"] = {w: f"{sum(within(r, w) for r in rows)} of {len(rows)} within 2x eager's error + 2 eps"
                                      for w in WAYS}
    if args.only != "accuracy":
        result["speed"] = sp = speed(SPEED, args.calls)
        result["summary"] = {
            "as_built_over_chunked": _spread([r["as_built_over_chunked"] for r in sp if not r["same_source"]["as built, chunked"]]),
            "as_built_over_chunked_same_source": _spread([r["as_built_over_chunked"] for r in sp if r["same_source"]["as built, chunked"]]),
            "chunked_over_one_loop": _spread([r["chunked_over_one_loop"] for r in sp if not r["same_source"]["chunked, one loop"]]),
            "as_built_over_eager": _spread([r["as_built_over_eager"] for r in sp])}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
