"""Row sums in ATen's order against the lane-parallel sum they replaced (a benchmark).

    python -m perf.experiments.aten_sum_order [--rounds 7] [--calls 20] [--models t5-encoder-512,llama-1024]
        [--out perf/results/<machine>/aten_sum_order_cpu.json]

Note [sums in ATen's order] (runtime/codegen/lowering/cascade.py): a float sum or mean over an
innermost row of a known length adds in the order of ATen's ``cascade_sum``. The "before"
programs are built here with that order off (``aten_order_applies`` patched to say no: the
``omp simd`` reduction over the row, as before), the "after" ones as the library builds them, in
this process, timed interleaved with eager as perf/experiments/bf16_rounding.py times its cases
(its ``_row``, which also says whether each side's output equals eager's bit for bit): RMS norms
and a plain row sum in float32 at model sizes and at short rows, then whole models (T5's encoder
in bfloat16, whose RMS norm is a mean in float; Llama in float32).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .bf16_rounding import _args, _model_rows, _op_program, _row, _write


@contextlib.contextmanager
def _lane_sums() -> Iterator[None]:
    """Within: no row sum is emitted in ATen's order."""
    from runtime.codegen.lowering import cascade

    applies = cascade.aten_order_applies
    cascade.aten_order_applies = lambda R, acc_ct, innermost: False  # noqa: N803, ARG005
    try:
        yield
    finally:
        cascade.aten_order_applies = applies


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _row_sum(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(-1)


def main(argv: list[str] | None = None) -> int:
    a, argv = _args(__doc__, argv, "t5-encoder-512,llama-1024")
    rows: list[dict[str, Any]] = []
    for shape in ((256, 512), (256, 1024), (64, 4096), (4096, 64)):
        inputs = [torch.randn(*shape), torch.randn(shape[-1])]
        rows.append(_row(f"RMS norm {shape[0]}x{shape[1]} float32", _rms_norm, inputs, _op_program, a.rounds, a.calls,
                         _lane_sums))
    rows.append(_row("row sum 256x1024 float32", _row_sum, [torch.randn(256, 1024)], _op_program, a.rounds, a.calls,
                     _lane_sums))
    rows += _model_rows(a.models, lambda name: (torch.bfloat16 if name.startswith("t5") else torch.float32,),
                        a.rounds, a.calls, _lane_sums)
    _write("row sums in ATen's order against lane-parallel sums (Note [sums in ATen's order]), CPU", "aten_sum_order",
           argv, a, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
