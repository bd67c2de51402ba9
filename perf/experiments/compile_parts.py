"""Python's ``compile()`` of a large generated program, as one function and in parts (a benchmark).

    python -m perf.experiments.compile_parts [--nodes 100000] [--rounds 3] [--out perf/results/<machine>/compile_parts_100k.json]

Note [program parts] (runtime/emit/wrapper.py) cuts a long program into functions of about
``PART_LINES`` lines. Here, per round, one fresh process per side ("whole": no cut; "parts": the
default), the sides alternating: each builds the synthetic graph (perf.benchmarks.synthetic), segments it,
runs the alias pass, and times ``runtime.compile`` with the torch backend, adding up the seconds
spent inside ``compile()`` itself. Peak RSS is the process's (the pipeline's own objects
included), so the sides differ by what ``compile()`` holds at its peak.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import warnings

from ..bench import environment, write_record

SIDES = {"whole": 10**9, "parts": None}  # PART_LINES per side (None: the default)


def measure_one(nodes: int, part_lines: int | None) -> dict[str, float]:
    import runtime
    import runtime.emit.wrapper as wrapper
    from alias import apply_aliases
    from segmenter import segment

    from ..benchmarks.synthetic import block_graph, synthetic_transformer

    if part_lines is not None:
        wrapper.PART_LINES = part_lines
    spent = [0.0]
    builtin = compile

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            return builtin(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    wrapper.compile = timed  # the module's lookup of the builtin, for this process only
    plan = apply_aliases(segment(synthetic_transformer(nodes, block_graph())), "post")
    t = time.perf_counter()
    program = runtime.compile(plan, backend="torch")
    total = time.perf_counter() - t
    return {"compile_builtin_s": round(spent[0], 3), "runtime_compile_s": round(total, 3),
            "source_lines": program.source.count("\n"),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=100000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a side: run it in this process
    args = p.parse_args(argv)
    warnings.simplefilter("ignore", FutureWarning)
    if args.one:
        print(json.dumps(measure_one(args.nodes, SIDES[args.one])))
        return 0
    runs = []
    for r in range(args.rounds):
        for side in (("whole", "parts") if r % 2 == 0 else ("parts", "whole")):
            out = subprocess.run([sys.executable, "-m", "perf.experiments.compile_parts", "--nodes", str(args.nodes), "--one", side],
                                 capture_output=True, text=True, check=True)
            row = {"round": r + 1, "side": side, **json.loads(out.stdout.strip().splitlines()[-1])}
            runs.append(row)
            print(row, file=sys.stderr)
    summary = {side: {k: statistics.median(x[k] for x in runs if x["side"] == side)
                      for k in ("compile_builtin_s", "runtime_compile_s", "peak_rss_mib")} for side in SIDES}
    result = {"benchmark": "compile_parts", "nodes": args.nodes, "environment": environment("cpu"),
              "method": __doc__.split("\n\n")[2].replace("\n", " "), "summary": summary, "runs": runs}
    write_record(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
