"""The whole pipeline at 100k nodes, this tree against another checkout, interleaved (a benchmark).

    python -m perf.experiments.pipeline_ab --before <checkout> [--rounds 3] [--nodes 100000]
                                           [--backends torch,cpp] [--out perf/results/<machine>/pipeline_ab.json]

Per round and backend, one fresh process per side runs this file's ``--worker`` mode with the
side's tree first on ``PYTHONPATH`` (so each side runs its own segmenter, alias pass and runtime;
the worker itself uses only their public functions), the sides alternating. A worker builds the
synthetic graph (perf.benchmarks.synthetic), and for the cpp backend runs one untimed pipeline on another
graph first (the kernels are then in that side's cache: what is timed is lowering and cache
lookups, not g++), collects garbage, and times segment -> alias "post" -> runtime.compile once
on a freshly built graph. Compare the after/before ratios of medians: this machine kind is shared
and its absolute times drift from run to run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings


def worker(backend: str, nodes: int) -> dict[str, float]:
    import runtime
    from alias import apply_aliases
    from segmenter import segment

    try:
        from perf.benchmarks.synthetic import block_graph, synthetic_transformer
    except ImportError:  # the side's tree is a checkout from before perf/synthetic.py moved to perf/benchmarks/
        from perf.synthetic import block_graph, synthetic_transformer

    if backend == "cpp":
        runtime.compile(apply_aliases(segment(synthetic_transformer(nodes, block_graph())), "post"), backend="cpp")
        gc.collect()
    graph = synthetic_transformer(nodes, block_graph())
    gc.collect()
    t0 = time.perf_counter()
    sf = segment(graph)
    t1 = time.perf_counter()
    plan = apply_aliases(sf, "post")
    t2 = time.perf_counter()
    runtime.compile(plan, backend=backend)
    t3 = time.perf_counter()
    return {"segment_s": round(t1 - t0, 3), "alias_s": round(t2 - t1, 3), "compile_s": round(t3 - t2, 3),
            "total_s": round(t3 - t0, 3)}


def _git_head(tree: str) -> str:
    r = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="a checkout of the commit to compare against")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--backends", default="torch,cpp")
    p.add_argument("--out", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        warnings.simplefilter("ignore")
        print(json.dumps(worker(args.worker, args.nodes)))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    sides = {"before": os.path.abspath(args.before), "after": here}
    backends = args.backends.split(",")
    runs = []
    for r in range(1, args.rounds + 1):
        for be in backends:
            for side, tree in sides.items():
                env = dict(os.environ, PYTHONPATH=tree, FUSEG_CACHE_DIR=os.path.join(
                    os.environ.get("TMPDIR", "/tmp"), f"fuseg-cache-pipeline-ab-{side}"))
                # -P: this file's folder is not put on sys.path, only the side's tree (PYTHONPATH); the
                # script lived in perf/ at first, whose profile.py would shadow the stdlib's
                out = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), "--before", tree, "--worker", be,
                                      "--nodes", str(args.nodes)], cwd=tree, env=env, capture_output=True,
                                     text=True, check=True)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                runs.append({"round": r, "backend": be, "side": side, "result": res,
                             "load_1m": round(os.getloadavg()[0], 2)})
                print(r, be, side, res, flush=True)
    summary: dict = {}
    for be in backends:
        summary[be] = {}
        for k in ("segment_s", "alias_s", "compile_s", "total_s"):
            b = statistics.median(x["result"][k] for x in runs if x["backend"] == be and x["side"] == "before")
            a = statistics.median(x["result"][k] for x in runs if x["backend"] == be and x["side"] == "after")
            summary[be][k] = {"before_median": round(b, 3), "after_median": round(a, 3), "after_over_before": round(a / b, 3)}
    record = {"benchmark": "pipeline before/after, one interleaved run", "nodes": args.nodes,
              "before": _git_head(sides["before"]), "after": _git_head(here), "method": __doc__.split("\n\n", 2)[2],
              "machine": {"python": sys.version.split()[0], "cpus": os.cpu_count()}, "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    if args.out:
        from perf.bench import write_record  # here: the worker runs this file as a script

        write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
