"""fp16 kernels on the CPU with branchless conversions against F16C's one-value ones (a benchmark).

    python -m perf.experiments.half_vectors [--rounds 7] [--calls 20] [--models llama-1024,gpt2-768]
        [--out perf/results/<machine>/half_vectors_cpu.json]

Note [fp16 on the CPU] (runtime/codegen/source/ctypes_.py): the CPU converts fp16 with integer
and float operations and selects, which GCC vectorizes, where it used F16C's one-value
instructions, which it does not. The "before" programs are built here with ``FUSEG_F16C_HALF``
defined in their sources (``soft_half`` patched to write it: the prelude's F16C branch), the
"after" ones as the library builds them, in this process, with their kernels built at once; then
timed interleaved with eager as perf/experiments/bf16_rounding.py times its cases (its ``_row``,
which also says whether each side's output equals eager's bit for bit): lone fused fp16 ops at
transformer sizes, then whole fp16 models (kernel or ATen chosen per segment by timing, as
``torch.compile(backend="fuseg")`` chooses them: a slow kernel can lose to ATen on either side).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .bf16_rounding import _args, _model_rows, _op_program, _row, _write


@contextlib.contextmanager
def _f16c() -> Iterator[None]:
    """Within: kernels' sources define FUSEG_F16C_HALF (F16C's scalar conversions), built at once."""
    from runtime import options
    from runtime.codegen import kernel

    soft_half = kernel.soft_half
    kernel.soft_half = lambda target: soft_half(target) + ("#define FUSEG_F16C_HALF\n" if target == "cpu" else "")
    try:
        with options.use(background_builds=False):
            yield
    finally:
        kernel.soft_half = soft_half


@contextlib.contextmanager
def _at_once() -> Iterator[None]:
    from runtime import options

    with options.use(background_builds=False):
        yield


def _ops() -> list[tuple[str, Callable[..., Any], list[torch.Tensor]]]:
    h = torch.float16

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).to(h)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def silu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(a) * b

    def gelu_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + b, approximate="tanh")

    def layer_norm_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w.float()).to(x.dtype)

    def softmax_scaled(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 0.125, -1)

    return [
        ("rms-norm 256x1024 fp16", rms, [r(256, 1024), r(1024)]),
        ("silu*mul 256x2816 fp16", silu_mul, [r(256, 2816), r(256, 2816)]),
        ("gelu(x+b) 128x3072 fp16", gelu_bias, [r(128, 3072), r(3072)]),
        ("layer-norm in float 64x4096 fp16", layer_norm_float, [r(64, 4096), r(4096)]),
        ("softmax 12x128x128 fp16", softmax_scaled, [r(12, 128, 128)]),
    ]


def main(argv: list[str] | None = None) -> int:
    a, argv = _args(__doc__, argv, "llama-1024,gpt2-768")
    rows: list[dict[str, Any]] = []
    with _at_once():
        for name, fn, inputs in _ops():
            rows.append(_row(name, fn, inputs, _op_program, a.rounds, a.calls, _f16c))
        rows += _model_rows(a.models, lambda name: (torch.float16,), a.rounds, a.calls, _f16c)
    _write("fp16 kernels with branchless conversions against F16C's one-value ones (Note [fp16 on the CPU]), CPU",
           "half_vectors", argv, a, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
