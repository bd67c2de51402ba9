"""Softmax row kernels on the CPU with and without their kept exps (a benchmark).

    python -m perf.experiments.reductions.softmax_exps [--rounds 3] [--out perf/results/<machine>/softmax_exps_cpu.json]

Note [softmax keeps its exps] (runtime/codegen/lowering/rows.py): the sum pass keeps each exp and the
write reads it back, where it used to compute it again. Both kernels are built in one process
(``EXP_SCRATCH_BYTES = 0`` gives the old one, which is exactly what the change switched off) and
timed interleaved with eager (both kernels scale by the sum's reciprocal, so the sides differ
only in the exps): per round and case, eager, "recompute" and "kept" each run blocks
of calls and the median block per call is taken; ratios are per round, then the median.

The cases are softmaxes fused with what attention puts before them (a scale and an additive
mask), so they are one generated kernel: a lone softmax stays in ATen's kernel
(``_ATEN_FASTER_ALONE`` in runtime/backends/cpp.py).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from ...bench import environment, write_record

#: (name, batch of rows, row length): attention-like scores of shape [batch, S, S]
CASES = [("scores-16x256x256", 16, 256), ("scores-64x32x32", 64, 32), ("scores-4x1024x1024", 4, 1024)]


def _attention_softmax(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 0.125 + mask, -1)


def _program(inputs: list[torch.Tensor], scratch_bytes: int):
    import runtime
    import runtime.codegen.lowering.rows as rows
    from alias import apply_aliases
    from segmenter import capture, segment

    saved = rows.EXP_SCRATCH_BYTES
    rows.EXP_SCRATCH_BYTES = scratch_bytes
    try:
        prog = runtime.compile(apply_aliases(segment(capture(_attention_softmax, inputs)), "post"), backend="cpp")
    finally:
        rows.EXP_SCRATCH_BYTES = saved
    if set(prog.backend_of.values()) != {"cpp"}:
        raise RuntimeError(f"softmax not on a generated kernel: {prog.backend_of} {prog.passed_over}")
    return prog


def _per_call_ms(fn, inputs: list[torch.Tensor], calls: int, blocks: int = 7) -> float:
    fn(*inputs)
    times = []
    for _ in range(blocks):
        t = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        times.append((time.perf_counter() - t) / calls * 1e3)
    return statistics.median(times)


def measure(rounds: int) -> list[dict]:
    import runtime.codegen.lowering.rows as rows

    rows_out = []
    for name, batch, s in CASES:
        inputs = [torch.randn(batch, s, s), torch.randn(s, s)]
        sides = {"eager": _attention_softmax, "recompute": _program(inputs, 0),
                 "kept": _program(inputs, rows.EXP_SCRATCH_BYTES)}
        want = _attention_softmax(*inputs)
        for side in ("recompute", "kept"):
            torch.testing.assert_close(sides[side](*inputs)[0], want)
        calls = max(1, int(4e6 // (batch * s * s)))
        per_round = []
        for _ in range(rounds):
            per_round.append({side: _per_call_ms(fn, inputs, calls) for side, fn in sides.items()})
        med = {side: round(statistics.median(r[side] for r in per_round), 4) for side in sides}
        rows_out.append({
            "case": name, "shape": [batch, s, s], "ms": med,
            "kept_over_recompute": round(statistics.median(r["kept"] / r["recompute"] for r in per_round), 3),
            "recompute_over_eager": round(statistics.median(r["recompute"] / r["eager"] for r in per_round), 3),
            "kept_over_eager": round(statistics.median(r["kept"] / r["eager"] for r in per_round), 3),
            "rounds": per_round})
        print(f"{name}: kept/recompute {rows_out[-1]['kept_over_recompute']}, recompute/eager "
              f"{rows_out[-1]['recompute_over_eager']}, kept/eager {rows_out[-1]['kept_over_eager']}", flush=True)
    return rows_out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    record = {"benchmark": "softmax_exps", "environment": environment("cpu"), "threads": torch.get_num_threads(),
              "rows": measure(args.rounds)}
    write_record(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
