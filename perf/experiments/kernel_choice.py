"""The generated matmul and attention kernels against ATen's ops, shape by shape, on this machine.

    python -m perf.experiments.kernel_choice [--rounds 7] [--out perf/results/<machine>/kernel_choice_cpu.json]

Each shape is one op (a Linear's ``x @ w.t() + b``, a Conv1D's ``addmm``, a ``bmm``, or ATen's
flash attention for the CPU with or without a causal mask) compiled as a program twice: on the
cpp backend (the kernel, whatever the verdict of Note [choices by measurement] would be) and on
torch (ATen's op); the two programs' calls alternate in rounds of about 2 ms each, and the record
keeps every round's time per call and the medians. The program's own call cost (its input
check, the output's allocation) is in both. Shapes: the tiny transformers' (16-32 tokens of 64
features), realistic ones (hidden 768-1024, 128-256 tokens) and decode steps (one token). This
is what ``runtime/autotune.py`` measures once per shape class at a program's first build; here
with more rounds, and recorded with the machine (CPU model and flags, compiler).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..bench import environment, write_record

__all__ = ["SHAPES", "main", "measure"]

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _linear(m: int, k: int, n: int) -> tuple[Callable, list[torch.Tensor]]:
    return (lambda x, w, b: F.linear(x, w, b)), [torch.randn(m, k), torch.randn(n, k), torch.randn(n)]


def _conv1d(m: int, k: int, n: int) -> tuple[Callable, list[torch.Tensor]]:
    return (lambda x, w, b: torch.addmm(b, x, w)), [torch.randn(m, k), torch.randn(k, n), torch.randn(n)]


def _scores(b: int, lq: int, s: int, e: int) -> tuple[Callable, list[torch.Tensor]]:
    return (lambda q, k: torch.bmm(q, k.transpose(1, 2))), [torch.randn(b, lq, e), torch.randn(b, s, e)]


def _weigh(b: int, lq: int, s: int, e: int) -> tuple[Callable, list[torch.Tensor]]:
    return (lambda p, v: torch.bmm(p, v)), [torch.randn(b, lq, s).softmax(-1), torch.randn(b, s, e)]


def _attention(h: int, lq: int, s: int, e: int, causal: bool) -> tuple[Callable, list[torch.Tensor]]:
    return ((lambda q, k, v: _FLASH(q, k, v, 0.0, causal)[0]),
            [torch.randn(1, lq, h, e).transpose(1, 2), torch.randn(1, s, h, e).transpose(1, 2),
             torch.randn(1, s, h, e).transpose(1, 2)])


#: name -> (kind, sizes, factory)
SHAPES: dict[str, tuple[str, tuple[int, ...], Callable[[], tuple[Callable, list[torch.Tensor]]]]] = {
    # the tiny transformers of the bench
    "linear 16x64->64": ("linear", (16, 64, 64), lambda: _linear(16, 64, 64)),
    "linear 32x64->128": ("linear", (32, 64, 128), lambda: _linear(32, 64, 128)),
    "linear 16x128->64": ("linear", (16, 128, 64), lambda: _linear(16, 128, 64)),
    "conv1d 16x64->192": ("conv1d", (16, 64, 192), lambda: _conv1d(16, 64, 192)),
    "scores 4x16x16 e16": ("bmm-nt", (4, 16, 16, 16), lambda: _scores(4, 16, 16, 16)),
    "weigh 4x16x16 e16": ("bmm-nn", (4, 16, 16, 16), lambda: _weigh(4, 16, 16, 16)),
    "attention 4h 16x16 e16 causal": ("attention", (4, 16, 16, 16), lambda: _attention(4, 16, 16, 16, True)),
    # realistic sizes: hidden 768-1024, 128-256 tokens
    "linear 128x768->768": ("linear", (128, 768, 768), lambda: _linear(128, 768, 768)),
    "linear 128x768->3072": ("linear", (128, 768, 3072), lambda: _linear(128, 768, 3072)),
    "linear 128x3072->768": ("linear", (128, 3072, 768), lambda: _linear(128, 3072, 768)),
    "linear 256x1024->1024": ("linear", (256, 1024, 1024), lambda: _linear(256, 1024, 1024)),
    "conv1d 128x768->2304": ("conv1d", (128, 768, 2304), lambda: _conv1d(128, 768, 2304)),
    "attention 12h 128x128 e64 causal": ("attention", (12, 128, 128, 64), lambda: _attention(12, 128, 128, 64, True)),
    "attention 16h 256x256 e64": ("attention", (16, 256, 256, 64), lambda: _attention(16, 256, 256, 64, False)),
    # decode steps: one token against its weights, and against a cache of 512
    "linear 1x768->768": ("linear", (1, 768, 768), lambda: _linear(1, 768, 768)),
    "linear 1x1024->4096": ("linear", (1, 1024, 4096), lambda: _linear(1, 1024, 4096)),
    "conv1d 1x768->2304": ("conv1d", (1, 768, 2304), lambda: _conv1d(1, 768, 2304)),
    "attention 12h 1x512 e64": ("attention", (12, 1, 512, 64), lambda: _attention(12, 1, 512, 64, False)),
}


def _programs(fn: Callable, inputs: list[torch.Tensor]) -> dict[str, Callable[[], Any]]:
    import runtime
    from alias import apply_aliases
    from runtime.autotune import fixed
    from segmenter import capture, segment

    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    out = {}
    with fixed("kernel"):
        for side, backend in (("kernel", "cpp"), ("aten", "torch")):
            prog = runtime.compile(plan, backend=backend)
            if side == "kernel" and "cpp" not in prog.backend_of.values():
                raise RuntimeError(f"no kernel: {prog.passed_over}")
            out[side] = (lambda p: lambda: p(*inputs))(prog)
    return out


def measure(name: str, rounds: int = 7, round_s: float = 0.002) -> dict[str, Any]:
    kind, sizes, make = SHAPES[name]
    torch.manual_seed(0)
    fn, inputs = make()
    runs = _programs(fn, inputs)
    with torch.no_grad():
        got, want = runs["kernel"](), runs["aten"]()
        diff = float((got[0] - want[0]).abs().max())
        for run in runs.values():  # first calls (allocation, ATen's set-up)
            run()
        t0 = time.perf_counter()
        runs["aten"]()
        calls = max(1, int(round_s / max(time.perf_counter() - t0, 1e-7)))
        times: dict[str, list[float]] = {"kernel": [], "aten": []}
        for r in range(rounds):
            for side in (("kernel", "aten") if r % 2 else ("aten", "kernel")):
                t0 = time.perf_counter()
                for _ in range(calls):
                    runs[side]()
                times[side].append((time.perf_counter() - t0) / calls * 1e6)
    k, a = statistics.median(times["kernel"]), statistics.median(times["aten"])
    return {"shape": name, "kind": kind, "sizes": list(sizes), "calls_a_round": calls, "kernel_us": k, "aten_us": a,
            "kernel_over_aten": k / a, "kernel_rounds_us": times["kernel"], "aten_rounds_us": times["aten"],
            "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.experiments.kernel_choice", description=__doc__.split("\n\n")[0])
    p.add_argument("shapes", nargs="*", help=f"default: all of {', '.join(SHAPES)}")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", help="write the record (JSON) here")
    a = p.parse_args(argv)
    rows = []
    for name in a.shapes or list(SHAPES):
        row = measure(name, a.rounds)
        rows.append(row)
        spread = max(row["kernel_rounds_us"]) / min(row["kernel_rounds_us"])
        print(f"{name:>34}: kernel {row['kernel_us']:9.1f} us, ATen {row['aten_us']:9.1f} us, kernel/ATen "
              f"{row['kernel_over_aten']:5.2f} (kernel rounds max/min {spread:.2f})", file=sys.stderr, flush=True)
    write_record({"benchmark": "generated matmul and attention kernels against ATen, per shape, CPU",
                  "environment": environment("cpu"), "rounds": a.rounds, "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
