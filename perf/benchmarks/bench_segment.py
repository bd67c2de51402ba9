"""Segmentation time against graph size (a benchmark, not a test).

    python -m perf.benchmarks.bench_segment [--out perf/results/<machine>/segment_time.json] [--repeat 3]

Synthetic transformer-like graphs of 1k, 10k and 100k nodes (perf.benchmarks.synthetic), and the captured
graph of a 32-layer Llama-2-7B config (fake weights on the meta device, so no weight memory).
Reports the median of ``--repeat`` runs, time per node, and the segmenter's peak Python memory
(tracemalloc, one extra run).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import tracemalloc
import warnings
from typing import Any

import torch

from segmenter import FusionGraph, segment
from segmenter.capturing.from_torch import capture

from ..bench import write_record
from .synthetic import block_graph, synthetic_transformer


def llama_32_layers() -> FusionGraph:
    import transformers

    with torch.device("meta"):
        cfg = transformers.LlamaConfig(
            num_hidden_layers=32, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
            num_key_value_heads=32, vocab_size=32000, use_cache=False,
        )
        model = transformers.LlamaModel(cfg).eval()
    return capture(model, [torch.zeros(1, 4096, dtype=torch.long, device="meta")], name="llama2-7b-32-layers")


def measure(graph: FusionGraph, repeat: int) -> dict[str, Any]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sf = segment(graph)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    segment(graph)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    med = statistics.median(times)
    return {
        "graph": graph.name, "nodes": len(graph.nodes), "segments": len(sf.segments),
        "kernels": sf.stats()["kernels"], "median_s": round(med, 4), "min_s": round(min(times), 4),
        "max_s": round(max(times), 4), "us_per_node": round(med / len(graph.nodes) * 1e6, 2),
        "peak_python_mib": round(peak / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--no-llama", action="store_true")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)
    block = block_graph()
    rows = []
    graphs = [lambda n=int(n): synthetic_transformer(n, block) for n in args.sizes.split(",")]
    if not args.no_llama:
        graphs.append(llama_32_layers)
    for make in graphs:
        t0 = time.perf_counter()
        g = make()
        build = time.perf_counter() - t0
        row = measure(g, args.repeat)
        row["build_s"] = round(build, 2)
        rows.append(row)
        print(f"{row['graph']:>22}: {row['nodes']:>6} nodes -> {row['segments']:>5} segments in "
              f"{row['median_s']:.3f} s ({row['us_per_node']} us/node, peak {row['peak_python_mib']} MiB)",
              file=sys.stderr)
    result = {
        "benchmark": "segment_time",
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "processor": platform.processor() or platform.machine(), "cpus": __import__("os").cpu_count()},
        "rows": rows,
    }
    write_record(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
