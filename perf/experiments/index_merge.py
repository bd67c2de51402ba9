"""Kernels built with and without merged split indices, in one process (Note [split indices
merged] in runtime/codegen/index.py; a measurement).

    python -m perf.experiments.index_merge [MODEL ...] [--rounds 9] [--out perf/results/index_merge_cpu.json]

Per model of ``perf.train_step`` (default: gpt2-tiny, llama-tiny, qwen2-tiny, gpt2-256), one
process compiles the model twice through ``torch.compile`` and runs one training step with each:
"before" with the rule turned off (every quotient and remainder of a reshape read kept), "after"
as the code builds kernels now. Each forward and backward program of both is then timed launch
by launch (``CompiledProgram.profile_launches`` on the inputs of its first call, 10 calls a
round), the sides alternating for ``--rounds`` rounds; the record keeps each launch's median and,
per program, the sums over all launches and over the kernels whose source the rule changed.
A launch's time moves by tens of percent between rounds on this machine kind: compare the
changed kernels' sums.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from typing import Any

__all__ = ["main", "run_model"]


def _source(prog: Any, j: int) -> str:
    launch = prog._chosen.get(j)
    kernel = getattr(launch, "kernel", None) or getattr(getattr(launch, "inner", None), "kernel", None)
    return kernel.source("cpu") if kernel is not None else ""


def run_model(name: str, rounds: int) -> dict[str, Any]:
    import torch

    import runtime.codegen.index as index
    from perf.train_step import _model
    from runtime.dynamo import FusegCompiler, compile_with_aot
    from runtime.program import CompiledProgram

    torch._dynamo.reset()  # (a model seen before would be traced with symbolic sizes: automatic dynamic shapes)
    base, ids = _model(name)
    rule = index._merged
    first_inputs: dict[int, tuple] = {}
    call = CompiledProgram.__call__

    def recording(self, *inputs):
        first_inputs.setdefault(id(self), inputs)
        return call(self, *inputs)

    compilers = {}
    CompiledProgram.__call__ = recording  # type: ignore[method-assign]
    try:
        for side in ("before", "after"):
            index._merged = (lambda pairs: list(pairs)) if side == "before" else rule
            compiler = FusegCompiler()
            model = copy.deepcopy(base)
            fn = torch.compile(model, backend=lambda gm, ex, c=compiler: compile_with_aot(c, gm, ex))
            fn(input_ids=ids, labels=ids).loss.backward()
            compilers[side] = compiler
            torch._dynamo.reset()
    finally:
        index._merged = rule
        CompiledProgram.__call__ = call  # type: ignore[method-assign]
    programs = {s: [(p, first_inputs[id(p)]) for p in c.compiled if id(p) in first_inputs] for s, c in compilers.items()}
    runs: dict[str, list[list[list[float]]]] = {s: [[] for _ in ps] for s, ps in programs.items()}
    for r in range(rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            for i, (prog, inputs) in enumerate(programs[side]):
                runs[side][i].append([la["us"] for la in prog.profile_launches(*inputs, calls=10)])
    out = []
    for i, ((prog, _), (old, _)) in enumerate(zip(programs["after"], programs["before"])):
        changed = [j for j in range(len(prog.launches)) if _source(prog, j) != _source(old, j)]
        med = {s: [statistics.median(r[j] for r in runs[s][i]) for j in range(len(runs[s][i][0]))] for s in runs}
        out.append({"program": prog.graph.name, "launches": len(prog.launches), "kernels_changed": changed,
                    "launch_us": med, "total_us": {s: sum(v) for s, v in med.items()},
                    "changed_us": {s: sum(v[j] for j in changed) for s, v in med.items()},
                    "changed_ops": {j: [n.op for n in prog.plan.segments[j].nodes] for j in changed}})
    return {"model": name, "rounds": rounds, "programs": out}


def main(argv: list[str] | None = None) -> int:
    from perf.bench import environment, write_record

    p = argparse.ArgumentParser(prog="python -m perf.experiments.index_merge", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", default=["gpt2-tiny", "llama-tiny", "qwen2-tiny", "gpt2-256"])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = []
    for name in args.models:
        row = run_model(name, args.rounds)
        for prog in row["programs"]:
            c, t = prog["changed_us"], prog["total_us"]
            print(f"{name} {prog['program']}: {len(prog['kernels_changed'])} kernels changed, "
                  f"{c['before']:.0f} -> {c['after']:.0f} us (all launches {t['before']:.0f} -> {t['after']:.0f})",
                  file=sys.stderr, flush=True)
        rows.append(row)
    write_record({"benchmark": "index_merge", "environment": environment("cpu"), "method": __doc__,
                  "command": " ".join(["python -m perf.experiments.index_merge", *(argv if argv is not None else sys.argv[1:])]),
                  "results": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
