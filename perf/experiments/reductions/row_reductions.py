"""Row max/min passes of the generated C++ kernels against eager, before and after a change (a benchmark).

    python -m perf.experiments.reductions.row_reductions [--before /path/to/old/checkout] [--rounds 5]
                                              [--out perf/results/<machine>/row_reductions_cpu.json]

Each case is one function captured, segmented and compiled with the ``cpp`` backend (one
generated row kernel), timed against eager in the same process: per round, blocks of calls of
each side alternate and the median block per call is kept. With ``--before``, every round runs
one fresh process per checkout (the order alternating between rounds), each importing its own
tree first on ``sys.path``; the record keeps per side the median over rounds of kernel/eager
(eager is the yardstick both processes share) and ``after / before`` of those: below 1 is faster.
Without ``--before`` only this checkout is timed. Outputs are compared with eager's every time.

The cases are the row reductions with a max or min pass (Note [max without a NaN chain] in
runtime/codegen/lowering/rows.py) and those that write a value per row (thread 0's test, which cost the
CPU kernel its if-conversion before): amax, amin, a lone softmax and logsumexp at a few shapes,
and a row sum (no max pass, no row output: the control).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from ...bench import environment

__all__ = ["CASES", "main"]

_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the checkout

#: name -> (expression over x, shape of x)
CASES: dict[str, tuple[str, tuple[int, ...]]] = {
    "amax 512x512": ("x.amax(-1)", (512, 512)),
    "amax 4096x1024": ("x.amax(-1)", (4096, 1024)),
    "amax 64x64": ("x.amax(-1)", (64, 64)),
    "amin 512x512": ("x.amin(-1)", (512, 512)),
    "softmax 512x512": ("torch.softmax(x, -1)", (512, 512)),
    "softmax 64x1024": ("torch.softmax(x, -1)", (64, 1024)),
    "logsumexp 512x512": ("torch.logsumexp(x, -1)", (512, 512)),
    "sum 512x512 (control)": ("x.sum(-1)", (512, 512)),
}

# argv: tree, rounds-in-this-process, calls-budget; prints one JSON line {case: [eager_ms, kernel_ms]}
_CHILD = r"""
import json, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
tree = sys.argv[1]
sys.path.insert(0, tree)
import torch
import runtime
from alias import apply_aliases
from segmenter import capture, segment
cases = json.loads(sys.argv[2])
torch.manual_seed(0)

def per_call_ms(fn, args, calls, blocks=7):
    fn(*args)
    times = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        times.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(times)

out = {}
with torch.no_grad():
    for name, (expr, shape) in cases.items():
        fn = eval("lambda x: " + expr)
        x = torch.randn(*shape)
        prog = runtime.compile(apply_aliases(segment(capture(fn, [x])), "post"), backend="cpp")
        if set(prog.backend_of.values()) != {"cpp"}:
            raise SystemExit(f"{name}: not one generated kernel: {prog.backend_of} {prog.passed_over}")
        want = fn(x)
        (got,) = prog(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        calls = max(1, int(2e6 // x.numel()))
        out[name] = [per_call_ms(fn, [x], calls), per_call_ms(prog, [x], calls)]
print(json.dumps(out))
"""


def _run(tree: str, cases: dict[str, Any]) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run([sys.executable, "-c", _CHILD, tree, json.dumps(cases)], capture_output=True, text=True,
                       env=env, cwd=tree, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{tree}: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(before: str | None, rounds: int, progress: bool = True) -> list[dict[str, Any]]:
    sides = {"after": _HERE} if before is None else {"before": os.path.abspath(before), "after": _HERE}
    runs: dict[str, list[dict[str, list[float]]]] = {s: [] for s in sides}
    for k in range(rounds):
        order = list(sides) if k % 2 == 0 else list(reversed(sides))
        for side in order:
            runs[side].append(_run(sides[side], CASES))
        if progress:
            print(f"round {k + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows = []
    for name in CASES:
        row: dict[str, Any] = {"case": name, "expression": CASES[name][0], "shape": list(CASES[name][1])}
        for side in sides:
            eager = [r[name][0] for r in runs[side]]
            kernel = [r[name][1] for r in runs[side]]
            row[f"{side}_eager_ms"] = round(statistics.median(eager), 4)
            row[f"{side}_kernel_ms"] = round(statistics.median(kernel), 4)
            row[f"{side}_vs_eager"] = round(statistics.median(k / e for k, e in zip(kernel, eager)), 3)
        if before is not None:
            row["after_over_before"] = round(row["after_vs_eager"] / row["before_vs_eager"], 3)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", help="a checkout of this project before the change")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", help="write the record here (JSON)")
    args = p.parse_args(argv)
    rows = measure(args.before, args.rounds)
    for r in rows:
        line = f"{r['case']:24s} after: kernel/eager {r['after_vs_eager']:.3f}"
        if args.before:
            line += f"  before: {r['before_vs_eager']:.3f}  after/before {r['after_over_before']:.3f}"
        print(line)
    if args.out:
        import torch

        record = {"benchmark": "row_reductions", "environment": environment("cpu"),
                  "threads": torch.get_num_threads(), "rounds": args.rounds,
                  "before": os.path.abspath(args.before) if args.before else None, "rows": rows}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
