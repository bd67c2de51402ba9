"""Pointwise loops under OpenMP with and without ``omp simd`` (a benchmark).

    python -m perf.experiments.simd_loops [--rounds 7] [--calls 20] [--models llama-1024]
        [--out perf/results/<machine>/simd_loops_cpu.json]

Note [simd pointwise loops] (runtime/codegen/lowering/lower.py): the innermost loop of a
pointwise kernel that OpenMP shares is marked ``omp simd`` (its outlined body lost the pointers'
``__restrict__`` and GCC gave up past 10 run-time alias tests). The "before" programs are built
here with no loop marked (``_simd`` patched to say no), the "after" ones as the library builds
them, in this process, timed interleaved with eager as perf/experiments/bf16_rounding.py times
its cases (its ``_row``): Llama's RoPE over q and k at llama-1024's sizes in float32 and bf16,
and whole models (float32 and bf16).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from ..bench import environment, write_record
from .bf16_rounding import _model, _model_program, _op_program, _row


@contextlib.contextmanager
def _unmarked() -> Iterator[None]:
    """Within: no pointwise loop is marked ``omp simd``."""
    from runtime.codegen.lowering import lower

    simd = lower._simd
    lower._simd = lambda lw, lines: False
    try:
        yield
    finally:
        lower._simd = simd


def _rope(qp: torch.Tensor, kp: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    def rot(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
    q, k = qp.view(1, 256, 16, 64).transpose(1, 2), kp.view(1, 256, 16, 64).transpose(1, 2)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--models", default="llama-1024", help="comma-separated perf.models names (none: '')")
    p.add_argument("--out", default=None)
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    for dtype in (torch.float32, torch.bfloat16):
        inputs = [torch.randn(256, 1024).to(dtype), torch.randn(256, 1024).to(dtype),
                  torch.randn(1, 1, 256, 64).to(dtype), torch.randn(1, 1, 256, 64).to(dtype)]
        rows.append(_row(f"RoPE q and k 16x256x64 {str(dtype)[6:]}", _rope, inputs, _op_program, a.rounds, a.calls,
                         _unmarked))
    for name in (m for m in a.models.split(",") if m):
        for dtype in (torch.float32, torch.bfloat16):
            fn, inputs = _model(name)
            fn = fn.to(dtype)
            rows.append(_row(f"{name} ({str(dtype)[6:]})", fn, inputs, _model_program, a.rounds, max(3, a.calls // 5),
                             _unmarked))
    if a.out:
        write_record({"benchmark": "pointwise loops with and without omp simd (Note [simd pointwise loops]), CPU",
                      "command": "python -m perf.experiments.simd_loops " + " ".join(argv),
                      "environment": environment("cpu"), "threads": torch.get_num_threads(), "rounds": a.rounds,
                      "calls": a.calls, "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
