"""CPU time of the examples through the runtime (torch backend), per alias mode, against eager.

    python -m perf.benchmarks.bench_runtime [--out perf/results/<machine>/runtime_cpu.json] [--repeat 30]

One run measures everything, interleaved, so ratios are comparable on a noisy machine: for each
example, eager and the compiled program in each alias mode, each timed as the median of
``--repeat`` calls after warm-up. Also the per-launch overhead: a chain of N tiny pointwise ops
cut at every op (N launches) against eager's N op dispatches.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import runtime
from alias import MODES, apply_aliases
from segmenter import SegmenterOptions, capture, segment
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs

from .. import zoo


def _median_s(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), statistics.pstdev(times)


def bench_examples(names: list[str], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        fn, inputs = zoo.get(name).factory()
        graph = capture(fn, inputs)
        module = fn if isinstance(fn, torch.nn.Module) else None
        sf = segment(graph)
        programs = {mode: runtime.compile(apply_aliases(sf, mode)) for mode in MODES}
        args = clone_inputs(inputs)
        full = bind_inputs(graph, module, clone_inputs(inputs))
        row: dict[str, Any] = {"model": name, "nodes": len(graph.nodes)}
        with torch.no_grad():
            med, sd = _median_s(lambda f=fn, a=args: f(*a), repeat)
            row["eager_ms"], row["eager_sd_ms"] = med * 1e3, sd * 1e3
            for mode, program in programs.items():
                med, sd = _median_s(lambda p=program, a=full: p(*a), repeat)
                row[f"{mode}_ms"], row[f"{mode}_sd_ms"] = med * 1e3, sd * 1e3
                row[f"{mode}_launches"] = program.plan.stats()["launches"]
        rows.append(row)
        print(f"{name:>13}: eager {row['eager_ms']:.3f} ms, post {row['post_ms']:.3f} ms, "
              f"pre {row['pre_ms']:.3f} ms, off {row['off_ms']:.3f} ms", file=sys.stderr)
    return rows


def bench_launch_overhead(n: int, repeat: int) -> dict[str, Any]:
    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(n):
            x = x + 1
        return x

    x = torch.randn(8)
    program = runtime.compile(apply_aliases(segment(capture(chain, [x]), SegmenterOptions(max_ops_per_segment=1)), "post"))
    eager, _ = _median_s(lambda: chain(x), repeat)
    ours, _ = _median_s(lambda: program(x), repeat)
    return {"ops": n, "eager_us_per_op": eager / n * 1e6, "ours_us_per_launch": ours / n * 1e6,
            "launches": program.plan.stats()["launches"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["rope-seed", "mlp", "softmax", "rms-norm", "gpt2-tiny", "llama-tiny", "bert-tiny"])
    p.add_argument("--out", default=None)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)
    torch.set_num_threads(1)  # steadier on a shared 2-core machine
    result = {
        "benchmark": "runtime_cpu",
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1},
        "launch_overhead": bench_launch_overhead(200, args.repeat),
        "rows": bench_examples(args.models, args.repeat),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
