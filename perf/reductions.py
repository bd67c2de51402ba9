"""Reductions: error against float64 and time, chunked sums against one loop, in one run.

    python -m perf.reductions [--out perf/results/<machine>/reductions_cpu.json] [--large]

Note [sums in chunks] (runtime/codegen/lowering/cascade.py) cuts a float sum over a long row into chunks
whose partials are added with a compensation. This measures what that costs and buys, on the
machine at hand: each program is generated twice in this process, ``chunked`` (the kernels as
they are) and ``one loop`` (the chunk lengths set past every size here: the source is then the
one a sum had before chunks), and the two are called alternately with eager beside them.

- ``accuracy``: whole-tensor, row and column reductions at 2^16..2^24 elements (``--large``:
  up to 2^26): each way's and eager's error against the program in float64 (the largest absolute
  difference relative to the largest magnitude of the float64 result).
- ``speed``: the row sizes of real models (hidden sizes, vocabularies) and column sums of bias
  gradients: the median time of each way and eager's, and chunked over one loop. Rows of up to
  ``ROW_CHUNK`` elements get the same source either way (listed as a control).
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
          ("column_sum", (8192, 4096)), ("column_var", (2048, 1024))]


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


def _programs(fn: Callable, x: torch.Tensor) -> dict[str, Callable]:
    """The program built chunked and as one loop (Note [sums in chunks]), every segment a kernel."""
    import runtime
    from alias import apply_aliases
    from runtime.autotune import fixed
    from runtime.codegen.lowering import cascade
    from segmenter import capture, segment

    plan = apply_aliases(segment(capture(fn, [x])), "post")
    ways = {}
    saved = cascade.ROW_CHUNK, cascade.COLUMN_CHUNK, cascade.SCALAR_CHUNK
    try:
        with fixed("kernel"):
            ways["chunked"] = runtime.compile(plan, backend="cpp")
            cascade.ROW_CHUNK = cascade.COLUMN_CHUNK = cascade.SCALAR_CHUNK = 1 << 62
            ways["one loop"] = runtime.compile(plan, backend="cpp")
    finally:
        cascade.ROW_CHUNK, cascade.COLUMN_CHUNK, cascade.SCALAR_CHUNK = saved
    return ways


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
              f"chunked {_fmt(row['chunked'])}, one loop {_fmt(row['one loop'])}", file=sys.stderr, flush=True)
    return rows


def speed(cases: list, calls: int) -> list[dict[str, Any]]:
    from runtime.codegen.lowering import cascade

    rows = []
    for k, (name, shape) in enumerate(cases):
        fn = PROGRAMS[name]
        x = _input(shape, torch.float32, _offset(name))
        ways = {"eager": fn, **_programs(fn, x)}
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
        reduced = shape[-1] if not name.startswith("column") else shape[0]
        chunk = cascade.COLUMN_CHUNK if name.startswith("column") else cascade.ROW_CHUNK
        row = {"program": name, "shape": list(shape), "same_source": reduced <= chunk,
               **{f"{w}_us": round(m, 2) for w, m in med.items()},
               "chunked_over_one_loop": round(med["chunked"] / med["one loop"], 4),
               "chunked_over_eager": round(med["chunked"] / med["eager"], 4)}
        rows.append(row)
        print(f"[{k + 1}/{len(cases)}] {name} {shape}: chunked/one loop {row['chunked_over_one_loop']:.3f}, "
              f"chunked/eager {row['chunked_over_eager']:.3f}", file=sys.stderr, flush=True)
    return rows


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
                                      for w in ("chunked", "one loop")}
    if args.only != "accuracy":
        result["speed"] = speed(SPEED, args.calls)
        changed = [r["chunked_over_one_loop"] for r in result["speed"] if not r["same_source"]]
        control = [r["chunked_over_one_loop"] for r in result["speed"] if r["same_source"]]
        result["summary"] = {"chunked_over_one_loop_median": statistics.median(changed) if changed else None,
                             "chunked_over_one_loop_range": [min(changed), max(changed)] if changed else None,
                             "same_source_control_range": [min(control), max(control)] if control else None}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
