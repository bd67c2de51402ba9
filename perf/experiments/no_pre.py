"""Kernels built with and without g++'s PRE, in one process (Note [no partial redundancy
elimination around inlined math] in runtime/codegen/kernel.py; a measurement).

    python -m perf.experiments.no_pre [MODEL ...] [--rounds 9] [--out perf/results/<machine>/no_pre_cpu.json]

Per model of ``perf.train_step`` (default: bert-tiny, bert-256, llama-256), one process compiles
the model twice through ``torch.compile`` and runs one training step with each: "before" with
every kernel built with PRE (the rule turned off), "after" as the code builds them now. Then each
of the forward and backward programs of both is timed launch by launch
(``CompiledProgram.profile_launches`` on the inputs of its first call, 10 calls a round), the
sides alternating for ``--rounds`` rounds; the record keeps each launch's median and, per
program, the sums over all launches and over the kernels the rule changed. A launch's time
moves by tens of percent between rounds on this machine kind: compare the changed kernels' sums.
"""

from __future__ import annotations

import sys
from typing import Any

from .sides import built_both_ways, experiment_main, summarized, timed_sides

__all__ = ["main", "run_model"]


def run_model(name: str, rounds: int) -> dict[str, Any]:
    import runtime.codegen.kernel as kernel

    rule = kernel.calls_inlined_math

    def use_rule(on: bool) -> None:
        kernel.calls_inlined_math = rule if on else (lambda body: False)

    programs = built_both_ways(name, use_rule)
    runs = timed_sides(programs, rounds)

    def without_pre(prog, old, j) -> bool:  # (a kernel on both sides: a lone softmax is measured against ATen)
        built, before = (getattr(p._chosen.get(j), "kernel", None) for p in (prog, old))
        return built is not None and before is not None and "FUSEG_NO_PRE" in built.function("cpu")

    return summarized(name, rounds, programs, runs, "kernels_without_pre", without_pre)


def main(argv: list[str] | None = None) -> int:
    return experiment_main(argv, "no_pre", __doc__, ["bert-tiny", "bert-256", "llama-256"], run_model, "kernels_without_pre", "kernels without PRE")


if __name__ == "__main__":
    sys.exit(main())
