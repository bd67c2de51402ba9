"""Time of the whole pipeline against graph size, per stage (a benchmark, not a test).

    python -m perf.benchmarks.bench_pipeline [--out perf/results/<machine>/pipeline_time.json] [--repeat 3]
                                  [--sizes 1000,10000,100000] [--backends torch,cpp]

For each size, a fresh process (so that its peak RSS is that size's) builds a synthetic
transformer-like graph (perf.benchmarks.synthetic) and runs segment -> alias ("post") -> runtime.compile,
``--repeat`` times, recording wall and CPU time per stage (median), then once more under
tracemalloc for the peak of Python allocations over the pipeline. ``ru_maxrss`` is the process's
peak RSS (torch itself included: ``rss_before_mib`` is the RSS before the graph is built).

With ``backend="cpp"`` each distinct kernel is one g++ run: the kernels are built once before
the measured runs, so what is timed is the structural cost (lowering, checks, cache lookups)
with a warm cache, not the compiler. Every run gets a freshly built graph (what a graph caches
about itself is computed inside the timed run), and garbage left by the previous run is
collected before each run; both outside the timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
from typing import Any

import torch

STAGES = ("segment", "alias", "compile")


def _pipeline(graph, backend: str) -> dict[str, tuple[float, float]]:
    import runtime
    from alias import apply_aliases
    from segmenter import segment

    out = {}
    w, c = time.perf_counter(), time.process_time()
    sf = segment(graph)
    out["segment"] = (time.perf_counter() - w, time.process_time() - c)
    w, c = time.perf_counter(), time.process_time()
    plan = apply_aliases(sf, "post")
    out["alias"] = (time.perf_counter() - w, time.process_time() - c)
    w, c = time.perf_counter(), time.process_time()
    prog = runtime.compile(plan, backend=backend)
    out["compile"] = (time.perf_counter() - w, time.process_time() - c)
    out["_counts"] = (len(plan.segments), sum(1 for b in prog.backend_of.values() if b == backend))
    return out


def measure_one(n: int, backend: str, repeat: int) -> dict[str, Any]:
    from .synthetic import block_graph, synthetic_transformer

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if backend == "cpp":
        _pipeline(synthetic_transformer(n, block_graph()), backend)  # builds the kernels: the runs below find them cached
    runs = []
    for _ in range(repeat):
        # Each run gets a graph of its own, built untimed: a graph caches what the passes ask of
        # it (view roots, which view ops are true views, the bytes floor), and a run on a graph
        # an earlier run used would find that work done. The last run's plan and program are
        # garbage in cycles: collected here, untimed, so that a run is timed as the one pipeline
        # of a fresh process would be, not with the collection of another run's 1.5 GiB of objects.
        graph = synthetic_transformer(n, block_graph())
        gc.collect()
        runs.append(_pipeline(graph, backend))
        del graph
    graph = synthetic_transformer(n, block_graph())
    gc.collect()
    tracemalloc.start()
    _pipeline(graph, backend)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    nodes = len(graph.nodes)
    row: dict[str, Any] = {"backend": backend, "nodes": nodes, "segments": runs[0]["_counts"][0],
                           "segments_on_backend": runs[0]["_counts"][1]}
    for s in STAGES:
        row[f"{s}_s"] = round(statistics.median(r[s][0] for r in runs), 3)
        row[f"{s}_cpu_s"] = round(statistics.median(r[s][1] for r in runs), 3)
    totals = [sum(r[s][0] for s in STAGES) for r in runs]
    cpu_totals = [sum(r[s][1] for s in STAGES) for r in runs]
    row["total_s"] = round(statistics.median(totals), 3)
    row["total_cpu_s"] = round(statistics.median(cpu_totals), 3)
    row["us_per_node"] = round(row["total_s"] / nodes * 1e6, 2)
    row["cpu_us_per_node"] = round(row["total_cpu_s"] / nodes * 1e6, 2)
    row["peak_python_mib"] = round(peak / 2**20, 1)
    row["rss_before_mib"] = round(rss_before, 1)
    row["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--backends", default="torch,cpp")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "n,backend": run in this process
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)
    if args.one:
        n, backend = args.one.split(",")
        print(json.dumps(measure_one(int(n), backend, args.repeat)))
        return 0
    rows = []
    for backend in args.backends.split(","):
        for n in args.sizes.split(","):
            r = subprocess.run([sys.executable, "-m", "perf.benchmarks.bench_pipeline", "--one", f"{n},{backend}",
                                "--repeat", str(args.repeat)], capture_output=True, text=True, check=True)
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["load_average_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            print(f"{backend:>5} {row['nodes']:>6} nodes: segment {row['segment_s']:.2f} s, alias {row['alias_s']:.2f} s, "
                  f"compile {row['compile_s']:.2f} s, total {row['total_s']:.2f} s ({row['us_per_node']} us/node; "
                  f"cpu {row['total_cpu_s']:.2f} s), peak python {row['peak_python_mib']} MiB, "
                  f"peak rss {row['peak_rss_mib']} MiB", file=sys.stderr)
    result = {
        "benchmark": "pipeline_time",
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "rows": rows,
    }
    from ..bench import write_record  # here: the per-size processes measure RSS before their imports

    write_record(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
