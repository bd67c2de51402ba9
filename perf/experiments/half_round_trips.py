"""fp16/bf16 blocks on the CPU with and without the round trips of values already rounded and
the F16C conversions (a benchmark).

    python -m perf.experiments.half_round_trips [--rounds 5] [--out perf/results/<machine>/half_round_trips_cpu.json]

Note [values already rounded] (runtime/codegen/kernel.py): the lowering no longer wraps a value
that is already a half (a load, a view of one, a cat of them, an earlier rounding) in another
conversion round trip. On the CPU the conversions are software (a bf16 rounding is 5 integer
operations and a select, an fp16 one about 20), so a RoPE block's element paid ~10 of them.
Note [fp16 on the CPU] (ctypes_.py) converted fp16 with F16C where the CPU had it when this ran;
the CPU now runs branchless software conversions either way (perf/experiments/half_vectors.py).
The runtime options ``cuda_tuning=False`` (read when a kernel is lowered) with ``soft_half=True``
(read when its source is made) give the kernels as they were before both, so both
programs are built in one process and timed interleaved with eager: per round and case, eager,
"before" and "after" each run a block of calls, the median block per call is kept, ratios are per
round, then the median over rounds. Outputs are compared with eager's: bit for bit, and the largest
difference (a norm's mean sums in another order than ATen's: one bf16 ulp apart at places, before
and after alike).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from ..bench import environment, write_record


def _cases() -> list[tuple[str, object]]:
    """(name, factory of (fn, inputs))."""
    from .. import zoo

    def rms(dtype: torch.dtype):
        def fn(x, w):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        g = torch.Generator().manual_seed(0)
        return fn, [torch.randn(256, 1024, generator=g).to(dtype), torch.randn(1024, generator=g).to(dtype)]

    return [
        ("rope-seed bf16", lambda: zoo._rope(2, 1024, 16, 4, 32, 8, torch.bfloat16)()),
        ("rope-head64 bf16", lambda: zoo._rope(1, 512, 8, 8, 64, 64, torch.bfloat16)()),
        ("rope-head64 fp16", lambda: zoo._rope(1, 512, 8, 8, 64, 64, torch.float16)()),
        ("rms-norm bf16", lambda: rms(torch.bfloat16)),
    ]


def _program(fn, inputs, tuning: str):
    import runtime
    from alias import apply_aliases
    from runtime import options
    from segmenter import capture, segment

    with options.use(cuda_tuning=tuning != "0", soft_half=tuning == "0"):
        return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")


def _block(call, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - t) / calls


def measure(rounds: int, calls: int) -> list[dict]:
    rows = []
    for name, make in _cases():
        fn, inputs = make()
        progs = {"before": _program(fn, inputs, "0"), "after": _program(fn, inputs, "1")}
        want = fn(*inputs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        equal, diff = {}, {}
        for side, p in progs.items():
            got = p(*inputs)
            equal[side] = all(torch.equal(g, w) for g, w in zip(got, want))
            diff[side] = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
        sources = {side: [k.source("cpu") for k in p.kernels.values()] for side, p in progs.items()}
        per = {"eager": [], "before": [], "after": []}
        calls_of = {"eager": lambda fn=fn, inputs=inputs: fn(*inputs),
                    "before": lambda p=progs["before"], inputs=inputs: p(*inputs),
                    "after": lambda p=progs["after"], inputs=inputs: p(*inputs)}
        for c in calls_of.values():
            _block(c, 3)
        for _ in range(rounds):
            for side in ("eager", "before", "after"):
                per[side].append(statistics.median(_block(calls_of[side], calls) for _ in range(3)))
        ratio = [a / b for a, b in zip(per["after"], per["before"])]
        row = {"case": name, "kernels": {s: len(v) for s, v in sources.items()},
               "round_trips": {s: sum(src.count("fuseg_bf_round(") + src.count("fuseg_h2f(fuseg_f2h(")
                                      for src in v) for s, v in sources.items()},
               "equal_eager": equal, "max_abs_diff": diff, **{f"{s}_ms": statistics.median(v) * 1e3 for s, v in per.items()},
               **{f"{s}_rounds_ms": [x * 1e3 for x in v] for s, v in per.items()},
               "after_over_before": statistics.median(ratio),
               "before_over_eager": statistics.median(b / e for b, e in zip(per["before"], per["eager"])),
               "after_over_eager": statistics.median(a / e for a, e in zip(per["after"], per["eager"]))}
        print(f"{name:>18}  eager {row['eager_ms']:.4f} ms  before {row['before_ms']:.4f}  after {row['after_ms']:.4f}"
              f"  after/before {row['after_over_before']:.2f}  round trips {row['round_trips']}  equal {equal}  diff {diff}",
              flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", default=None)
    if argv is None:
        import sys

        argv = sys.argv[1:]
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = measure(a.rounds, a.calls)
    if a.out:
        write_record({"benchmark": "half round trips before/after (Note [values already rounded]), CPU",
                      "command": "python -m perf.experiments.half_round_trips " + " ".join(argv or []),
                      "environment": environment("cpu"), "rounds": a.rounds, "calls": a.calls, "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
