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

from .bf16_rounding import _ops as _fused_ops
from .bf16_rounding import fp16_main


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


def _layer_norm_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w.float()).to(x.dtype)


def _ops() -> list[tuple[str, Callable[..., Any], list[torch.Tensor]]]:
    """bf16_rounding's lone ops in fp16, and a layer norm in float of fp16 rows (a float variance)."""
    h = torch.float16
    ops = [(f"{name} fp16", *make()) for name, make in _fused_ops(h)]
    return ops + [("layer-norm in float 64x4096 fp16", _layer_norm_float,
                   [torch.randn(64, 4096).to(h), torch.randn(4096).to(h)])]


def main(argv: list[str] | None = None) -> int:
    return fp16_main(__doc__, argv, "llama-1024,gpt2-768", _ops, _f16c,
                     "fp16 kernels with branchless conversions against F16C's one-value ones (Note [fp16 on the CPU]), CPU", "half_vectors")


if __name__ == "__main__":
    raise SystemExit(main())
