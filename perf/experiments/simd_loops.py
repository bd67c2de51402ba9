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

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .bf16_rounding import _args, _model_rows, _op_program, _row, _write


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
    a, argv = _args(__doc__, argv, "llama-1024")
    rows: list[dict[str, Any]] = []
    for dtype in (torch.float32, torch.bfloat16):
        inputs = [torch.randn(256, 1024).to(dtype), torch.randn(256, 1024).to(dtype),
                  torch.randn(1, 1, 256, 64).to(dtype), torch.randn(1, 1, 256, 64).to(dtype)]
        rows.append(_row(f"RoPE q and k 16x256x64 {str(dtype)[6:]}", _rope, inputs, _op_program, a.rounds, a.calls,
                         _unmarked))
    rows += _model_rows(a.models, lambda name: (torch.float32, torch.bfloat16), a.rounds, a.calls, _unmarked)
    _write("pointwise loops with and without omp simd (Note [simd pointwise loops]), CPU", "simd_loops", argv, a, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
