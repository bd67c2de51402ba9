"""1-D convolutions of more than one tap on the CPU: eager (oneDNN) against the generated kernel
(runtime/codegen/opaque/patches.py, Note [1-D convolutions as patches]), shape by shape, every shape
as the kernel, so that ``patches.MIN_FILTERS`` and ``patches.MAX_WORK`` were chosen from measured
figures (both now a measurement of each shape class: Note [choices by measurement] in
runtime/autotune.py).

    python -m perf.experiments.patches [--rounds 5] [--calls 40] [--out perf/results/<machine>/patches_cpu.json]

Method as ``python -m perf.experiments.onetap``: each shape compiled once, eager and the program timed in
``--rounds`` interleaved rounds of ``--calls`` calls; medians and their ratio. A program's time
includes its call (the input check, the output buffer).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from ..bench import call_times, environment, write_record

__all__ = ["SHAPES", "main"]

#: (input shape, transposed input, filters, taps, stride, padding, groups): wav2vec2-tiny's four
#: (its positional one reads a transpose of [batch, seq, channels]), Whisper-tiny's two, then
#: bigger ones
SHAPES = [((2, 1, 4000), False, 32, 10, 5, 0, 1), ((2, 32, 799), False, 32, 3, 2, 0, 1),
          ((2, 32, 399), False, 32, 3, 2, 0, 1), ((2, 64, 199), True, 64, 16, 1, 8, 4),
          ((2, 16, 32), False, 64, 3, 1, 1, 1), ((2, 64, 32), False, 64, 3, 2, 1, 1),
          ((2, 64, 256), False, 64, 3, 1, 1, 1), ((2, 128, 200), True, 128, 16, 1, 8, 16),
          ((2, 64, 1000), False, 64, 3, 1, 1, 1), ((2, 128, 400), False, 128, 5, 1, 2, 1),
          ((1, 512, 800), False, 512, 3, 2, 1, 1), ((2, 768, 200), True, 768, 128, 1, 64, 16)]


def main(argv: list[str] | None = None) -> int:
    import runtime
    from alias import apply_aliases
    from segmenter import capture, segment

    p = argparse.ArgumentParser(prog="python -m perf.experiments.patches", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--out")
    a = p.parse_args(argv)
    from runtime.autotune import set_policy

    set_policy("kernel")  # every shape as the generated kernel, whatever this machine's verdict (runtime/autotune.py)
    rows = []
    with torch.no_grad():
        for shape, transposed, filters, taps, stride, padding, groups in SHAPES:
            x = torch.randn(shape[0], shape[2], shape[1]).transpose(1, 2) if transposed else torch.randn(shape)
            w, b = torch.randn(filters, shape[1] // groups, taps), torch.randn(filters)

            def fn(x, w, b, stride=stride, padding=padding, groups=groups):
                return F.conv1d(x, w, b, stride=stride, padding=padding, groups=groups)

            prog = runtime.compile(apply_aliases(segment(capture(fn, [x, w, b])), "post"))
            if set(prog.backend_of.values()) != {"cpp"}:
                why = "; ".join(f"{b}: {r}" for reasons in prog.passed_over.values() for b, r in reasons)
                rows.append({"shape": list(shape), "filters": filters, "taps": taps, "declined": why})
                print(f"{list(shape)} x {filters}x{taps}: not a generated kernel: {why}", flush=True)
                continue
            diff = float((prog(x, w, b)[0] - fn(x, w, b)).abs().max())
            times: dict[str, list[float]] = {"eager": [], "generated": []}
            for _ in range(3):
                fn(x, w, b), prog(x, w, b)
            for _ in range(a.rounds):
                times["eager"] += call_times(fn, [x, w, b], a.calls)
                times["generated"] += call_times(prog, [x, w, b], a.calls)
            out = fn(x, w, b).shape[2]
            row = {"shape": list(shape), "transposed": transposed, "filters": filters, "taps": taps, "stride": stride,
                   "padding": padding, "groups": groups, "macs": shape[0] * filters * (shape[1] // groups) * taps * out,
                   "eager_us": 1e6 * statistics.median(times["eager"]),
                   "generated_us": 1e6 * statistics.median(times["generated"]), "max_abs_diff": diff}
            row["generated_over_eager"] = row["generated_us"] / row["eager_us"]
            rows.append(row)
            print(f"{'x'.join(map(str, shape))}{' T' if transposed else ''} -> {filters}x{taps} s{stride} p{padding} "
                  f"g{groups}: {row['macs'] / 1e6:.2f}M multiply-adds, eager {row['eager_us']:.1f} us, generated "
                  f"{row['generated_us']:.1f} us ({row['generated_over_eager']:.2f})", flush=True)
    if a.out:
        write_record({"benchmark": "1-D convolutions, eager (oneDNN) against the generated patch kernel, CPU",
                      "environment": environment("cpu"), "threads": torch.get_num_threads(), "rounds": a.rounds,
                      "calls": a.calls, "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
