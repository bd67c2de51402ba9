"""Kernels built with and without merged split indices, in one process (Note [split indices
merged] in runtime/codegen/source/index.py; a measurement).

    python -m perf.experiments.index_merge [MODEL ...] [--rounds 9] [--out perf/results/<machine>/index_merge_cpu.json]

Per model of ``perf.train_step`` (default: gpt2-tiny, llama-tiny, qwen2-tiny, gpt2-256), one
process compiles the model twice through ``torch.compile`` and runs one training step with each:
"before" with the rule turned off (every quotient and remainder of a reshape read kept), "after"
as the code builds kernels now. Each forward and backward program of both is then timed launch
by launch (``CompiledProgram.profile_launches`` on the inputs of its first call, 10 calls a
round), the sides alternating for ``--rounds`` rounds; the record keeps each launch's median and,
per program, the sums over all launches and over the kernels whose source the rule changed
(launches that run a generated kernel on both sides: each side measures its own kernels against
ATen, Note [choices by measurement], and may choose ATen for a matmul the other runs as a
kernel; such a launch counts in the sums over all launches only).
A launch's time moves by tens of percent between rounds on this machine kind: compare the
changed kernels' sums.
"""

from __future__ import annotations

import sys
from typing import Any

from .sides import built_both_ways, experiment_main, summarized, timed_sides

__all__ = ["main", "run_model"]


def _source(prog: Any, j: int) -> str:
    launch = prog._chosen.get(j)
    kernel = getattr(launch, "kernel", None) or getattr(getattr(launch, "inner", None), "kernel", None)
    return kernel.source("cpu") if kernel is not None else ""


def run_model(name: str, rounds: int) -> dict[str, Any]:
    import runtime.codegen.source.index as index

    rule = index._merged

    def use_rule(on: bool) -> None:
        index._merged = rule if on else (lambda pairs: list(pairs))

    programs = built_both_ways(name, use_rule)
    runs = timed_sides(programs, rounds)
    def changed(prog, old, j) -> bool:  # (a kernel on both sides: the measured choice against ATen may differ)
        after, before = _source(prog, j), _source(old, j)
        return bool(after) and bool(before) and after != before

    return summarized(name, rounds, programs, runs, "kernels_changed", changed)


def main(argv: list[str] | None = None) -> int:
    return experiment_main(argv, "index_merge", __doc__, ["gpt2-tiny", "llama-tiny", "qwen2-tiny", "gpt2-256"], run_model, "kernels_changed", "kernels changed")


if __name__ == "__main__":
    sys.exit(main())
