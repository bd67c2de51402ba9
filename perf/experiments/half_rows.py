"""fp16 kernels on the CPU before and after this session's three changes to them (a benchmark).

    python -m perf.experiments.half_rows [--rounds 7] [--calls 20] [--models gpt2-768,t5-encoder-512,llama-1024]
        [--out perf/results/<machine>/half_rows_cpu.json]

The "after" programs are built as the library builds them; the "before" ones in this process
with the three turned off (``_before``): Note [fp16 rows converted by the row] (``half_rows.ROWS``:
every load and store converted in software), Note [one row's passes shared among threads]
(``rows.ONE_ROW_THREADS``: a kernel of one row on one thread) and Note [fp16 rounding in float]
(``kernel.H_HELPERS`` patched back to the rounding that selected among four cases). Timed
interleaved with eager as perf/experiments/bf16_rounding.py times its cases (its ``_row``, which
also says whether each side equals eager bit for bit, and whether the two sides agree): lone
fused fp16 ops at transformer sizes (the kernel kept on both sides), then whole fp16 models
(kernel or ATen chosen per segment by timing, as ``torch.compile(backend="fuseg")`` chooses).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .bf16_rounding import _ops as _fused_ops
from .bf16_rounding import fp16_main

#: the rounding of Note [fp16 rounding in float] before it added and took away a power of two
_OLD_ROUND = r"""FUSEG_FN float fuseg_h_round(float f) {
  const unsigned int x = fuseg_f2bits(f), a = x & 0x7fffffffu, sign = x & 0x80000000u;
  const unsigned int normal = (x + 0xfffu + ((x >> 13) & 1u)) & 0xffffe000u;
  const unsigned int sub = sign | fuseg_f2bits((fuseg_bits2f(a) + 0.5f) - 0.5f);
  return fuseg_bits2f(a > 0x7f800000u ? (sign | 0x7fc00000u) : (a >= 0x477ff000u ? (sign | 0x7f800000u)
                      : (a < 0x38800000u ? sub : normal)));
}
"""


@contextlib.contextmanager
def _before() -> Iterator[None]:
    """Within: the three changes off (the module's docstring), kernels built at once."""
    from runtime import options
    from runtime.codegen import kernel
    from runtime.codegen.lowering import half_rows, rows

    helpers = kernel.H_HELPERS
    start = helpers.index("FUSEG_FN float fuseg_h_round(float f) {\n  const")
    end = helpers.index("}\n", start) + 2
    kernel.H_HELPERS = helpers[:start] + _OLD_ROUND + helpers[end:]
    half_rows.ROWS, rows.ONE_ROW_THREADS = False, False
    try:
        with options.use(background_builds=False):
            yield
    finally:
        kernel.H_HELPERS = helpers
        half_rows.ROWS, rows.ONE_ROW_THREADS = True, True


def _ops() -> list[tuple[str, Callable[..., Any], list[torch.Tensor]]]:
    """bf16_rounding's lone ops in fp16, an add, GPT-2's tanh GELU and T5's check of a sum for an inf."""
    h = torch.float16

    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    def gelu_gpt2(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))

    def t5_check(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = a + b
        return x, x.isinf().any()

    ops = [(f"{name} fp16", *make()) for name, make in _fused_ops(h)]
    return ops + [("add 256x1024 fp16", add, [torch.randn(256, 1024).to(h), torch.randn(256, 1024).to(h)]),
                  ("GPT-2 GELU 128x3072 fp16", gelu_gpt2, [torch.randn(128, 3072).to(h)]),
                  ("T5 inf check 128x512 fp16", t5_check, [torch.randn(128, 512).to(h), torch.randn(128, 512).to(h)])]


def main(argv: list[str] | None = None) -> int:
    return fp16_main(__doc__, argv, "gpt2-768,t5-encoder-512,llama-1024", _ops, _before,
                     "fp16 kernels: rows converted by F16C, one row's passes on threads, the cheaper round; before and after, CPU", "half_rows")


if __name__ == "__main__":
    raise SystemExit(main())
