"""A model's training programs built two ways in one process and timed launch by launch,
alternated: the shared part of the kernel-rule experiments (``no_pre``, ``index_merge``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

__all__ = ["built_both_ways", "timed_sides"]


def built_both_ways(name: str, use_rule: Callable[[bool], None]) -> dict[str, list[tuple[Any, tuple]]]:
    """``perf.train_step``'s model ``name`` compiled twice through ``torch.compile`` and stepped
    once (forward and backward): "before" after ``use_rule(False)``, "after" after
    ``use_rule(True)`` (which is left in force). Per side, each program with the inputs of its
    first call."""
    import torch

    from perf.train_step import _model
    from runtime.compiled.program import CompiledProgram
    from runtime.dynamo import FusegCompiler, compile_with_aot

    torch._dynamo.reset()  # (a model seen before would be traced with symbolic sizes: automatic dynamic shapes)
    base, ids = _model(name)
    first_inputs: dict[int, tuple] = {}
    call = CompiledProgram.__call__

    def recording(self, *inputs):
        first_inputs.setdefault(id(self), inputs)
        return call(self, *inputs)

    compilers = {}
    CompiledProgram.__call__ = recording  # type: ignore[method-assign]
    try:
        for side in ("before", "after"):
            use_rule(side == "after")
            compiler = FusegCompiler()
            model = copy.deepcopy(base)
            fn = torch.compile(model, backend=lambda gm, ex, c=compiler: compile_with_aot(c, gm, ex))
            fn(input_ids=ids, labels=ids).loss.backward()
            compilers[side] = compiler
            torch._dynamo.reset()
    finally:
        use_rule(True)
        CompiledProgram.__call__ = call  # type: ignore[method-assign]
    return {s: [(p, first_inputs[id(p)]) for p in c.compiled if id(p) in first_inputs] for s, c in compilers.items()}


def timed_sides(programs: dict[str, list[tuple[Any, tuple]]], rounds: int) -> dict[str, list[list[list[float]]]]:
    """Per side, per program, per round: each launch's microseconds
    (``CompiledProgram.profile_launches``, 10 calls), the sides alternating round by round."""
    runs: dict[str, list[list[list[float]]]] = {s: [[] for _ in ps] for s, ps in programs.items()}
    for r in range(rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            for i, (prog, inputs) in enumerate(programs[side]):
                runs[side][i].append([la["us"] for la in prog.profile_launches(*inputs, calls=10)])
    return runs


def experiment_main(argv: list[str] | None, module: str, doc: str, models: list[str],
                    run_model: Callable[[str, int], dict[str, Any]], changed: str, what: str) -> int:
    """The command line of such an experiment: models, ``--rounds``, ``--out``; a line per
    program (``changed``: the record's list of the kernels the rule changed, ``what``: how the
    line names them), and the record."""
    import argparse
    import sys

    from perf.bench import environment, write_record

    p = argparse.ArgumentParser(prog=f"python -m perf.experiments.{module}", description=doc.split("\n\n")[0])
    p.add_argument("models", nargs="*", default=models)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = []
    for name in args.models:
        row = run_model(name, args.rounds)
        for prog in row["programs"]:
            c, t = prog["changed_us"], prog["total_us"]
            print(f"{name} {prog['program']}: {len(prog[changed])} {what}, {c['before']:.0f} -> {c['after']:.0f} us "
                  f"(all launches {t['before']:.0f} -> {t['after']:.0f})", file=sys.stderr, flush=True)
        rows.append(row)
    write_record({"benchmark": module, "environment": environment("cpu"), "method": doc,
                  "command": " ".join([f"python -m perf.experiments.{module}", *(argv if argv is not None else sys.argv[1:])]),
                  "results": rows}, args.out)
    return 0


def summarized(name: str, rounds: int, programs: dict[str, list[tuple[Any, tuple]]],
               runs: dict[str, list[list[list[float]]]], changed_key: str,
               changed: Callable[[Any, Any, int], bool]) -> dict[str, Any]:
    """The record of one model: per program, each launch's median per side, the sums over all
    launches and over those ``changed(after_program, before_program, j)`` says the rule changed."""
    import statistics

    out = []
    for i, ((prog, _), (old, _)) in enumerate(zip(programs["after"], programs["before"])):
        which = [j for j in range(len(prog.launches)) if changed(prog, old, j)]
        med = {s: [statistics.median(r[j] for r in runs[s][i]) for j in range(len(runs[s][i][0]))] for s in runs}
        out.append({"program": prog.graph.name, "launches": len(prog.launches), changed_key: which,
                    "launch_us": med, "total_us": {s: sum(v) for s, v in med.items()},
                    "changed_us": {s: sum(v[j] for j in which) for s, v in med.items()},
                    "changed_ops": {j: [n.op for n in prog.plan.segments[j].nodes] for j in which}})
    return {"model": name, "rounds": rounds, "programs": out}
