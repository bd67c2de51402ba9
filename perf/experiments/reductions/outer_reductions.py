"""Reductions over outer dims on the CPU: eager against the program on the generated kernel
(``backend="cpp"``, Note [column passes] in runtime/codegen/lowering/columns.py) and on the torch backend
(what ran before those segments were generated: the generator declined them).

    python -m perf.experiments.reductions.outer_reductions [--rounds 5] [--calls 30] [--out perf/results/<machine>/outer_reductions_cpu.json]

Method: each program is compiled once per backend, then eager and the two programs are timed in
``--rounds`` interleaved rounds of ``--calls`` calls each (fewer for the big ones); the record
keeps each one's median over all calls and the ratios to eager. A program's time includes its
call (the input check, the output buffer). Outputs are compared with eager's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from ...bench import environment

__all__ = ["CASES", "main"]

#: (name, program, input shape): bias-gradient sums, a mean over channels, centring over the batch
CASES: list[tuple[str, Callable[..., torch.Tensor], tuple[int, ...]]] = [
    ("sum(0) 64x64", lambda x: x.sum(0), (64, 64)),
    ("sum(0) 32x4096", lambda x: x.sum(0), (32, 4096)),
    ("sum(0) 1024x1024", lambda x: x.sum(0), (1024, 1024)),
    ("sum(0) 8192x64", lambda x: x.sum(0), (8192, 64)),
    ("sum(0) 4096x4096", lambda x: x.sum(0), (4096, 4096)),
    ("sum((0, 1)) 64x128x256", lambda x: x.sum((0, 1)), (64, 128, 256)),
    ("mean(1) 2x64x32x32", lambda x: x.mean(1), (2, 64, 32, 32)),
    ("amax(0) 256x512", lambda x: x.amax(0), (256, 512)),
    ("var(0) 256x512", lambda x: x.var(0), (256, 512)),
    ("x - mean(0) 512x512", lambda x: x - x.mean(0, keepdim=True), (512, 512)),
]


def _time(fn: Callable[..., object], x: torch.Tensor, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    import runtime
    from alias import apply_aliases
    from segmenter import capture, segment

    p = argparse.ArgumentParser(prog="python -m perf.experiments.reductions.outer_reductions", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args(argv)
    rows = []
    with torch.no_grad():
        for name, fn, shape in CASES:
            x = torch.randn(*shape)
            plan = apply_aliases(segment(capture(fn, [x])), "post")
            progs = {"generated": runtime.compile(plan, backend="cpp"), "torch": runtime.compile(plan, backend="torch")}
            backends = sorted(set(progs["generated"].backend_of.values()))
            want = fn(x)
            diff = max(float((prog(x)[0] - want).abs().max()) for prog in progs.values())
            calls = max(3, min(a.calls, int(a.calls * 1e6 / x.numel())))
            runs = {"eager": fn, **{k: (lambda t, prog=prog: prog(t)) for k, prog in progs.items()}}
            times: dict[str, list[float]] = {k: [] for k in runs}
            for f in runs.values():
                f(x)
            for _ in range(a.rounds):
                for k, f in runs.items():
                    times[k] += _time(f, x, calls)
            us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
            row = {"case": name, "backends": backends, "max_abs_diff": diff,
                   **{f"{k}_us": round(v, 2) for k, v in us.items()},
                   "generated_over_eager": round(us["generated"] / us["eager"], 3),
                   "torch_over_eager": round(us["torch"] / us["eager"], 3),
                   "generated_over_torch": round(us["generated"] / us["torch"], 3)}
            rows.append(row)
            print(f"{name:24s} eager {us['eager']:9.1f} us  generated {us['generated']:9.1f} "
                  f"({row['generated_over_eager']:.2f}x)  torch backend {us['torch']:9.1f} "
                  f"({row['torch_over_eager']:.2f}x)  on {backends}  diff {diff:.1e}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"environment": environment("cpu"), "threads": torch.get_num_threads(), "rounds": a.rounds,
                       "calls": a.calls, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
