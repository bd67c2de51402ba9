"""Depthwise convolutions on the CPU: eager (oneDNN) against the generated kernel
(runtime/codegen/opaque/conv.py, Note [depthwise convolutions]), shape by shape, every shape as
the kernel (the cap ``conv.MAX_MACS`` these figures chose is now a measurement of each shape
class: Note [choices by measurement] in runtime/autotune.py).

    python -m perf.experiments.depthwise [--rounds 5] [--calls 40] [--out perf/results/<machine>/depthwise_cpu.json]

Method: each shape is compiled once (a program of the one convolution with its bias), then eager
and the program are timed in ``--rounds`` interleaved rounds of ``--calls`` calls each; the
record keeps each one's median over all calls and their ratio. The program's time includes its
call (the input check, the output buffer): what a model pays per depthwise layer.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from ..bench import call_times, environment

__all__ = ["SHAPES", "main"]

#: (batch, channels, height = width, kernel, stride, channels-last): mobilenet-v2-tiny's and
#: convnext-tiny's layers first (convnext's are channels-last), then the sizes of full-size models
SHAPES = [(2, 192, 4, 3, 1, False), (2, 96, 8, 3, 2, False), (2, 16, 8, 7, 1, False), (2, 16, 8, 7, 1, True),
          (2, 128, 1, 7, 1, True), (2, 64, 16, 3, 1, False), (2, 64, 16, 3, 1, True), (2, 64, 32, 3, 1, False),
          (2, 64, 32, 3, 1, True), (2, 128, 28, 3, 1, False), (1, 384, 14, 7, 1, False), (1, 384, 14, 7, 1, True),
          (2, 256, 56, 3, 2, False), (2, 128, 56, 3, 1, False)]


def main(argv: list[str] | None = None) -> int:
    import runtime
    from alias import apply_aliases
    from segmenter import capture, segment

    p = argparse.ArgumentParser(prog="python -m perf.experiments.depthwise", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--out")
    a = p.parse_args(argv)
    from runtime.autotune import set_policy

    set_policy("kernel")  # every shape as the generated kernel, whatever this machine's verdict (runtime/autotune.py)
    rows = []
    with torch.no_grad():
        for n, c, h, k, s, nhwc in SHAPES:
            x, w, b = torch.randn(n, c, h, h), torch.randn(c, 1, k, k), torch.randn(c)
            if nhwc:
                x = x.contiguous(memory_format=torch.channels_last)

            def fn(x, w, b, s=s, k=k, c=c):
                return F.conv2d(x, w, b, stride=s, padding=k // 2, groups=c)

            prog = runtime.compile(apply_aliases(segment(capture(fn, [x, w, b])), "post"))
            if set(prog.backend_of.values()) != {"cpp"}:  # declined for another reason than its size
                why = "; ".join(f"{b}: {r}" for reasons in prog.passed_over.values() for b, r in reasons)
                rows.append({"shape": [n, c, h, h], "kernel": k, "stride": s, "layout": "NHWC" if nhwc else "NCHW",
                             "declined": why})
                print(f"{n}x{c}x{h}x{h} k{k}: not a generated kernel: {why}", flush=True)
                continue
            (got,) = prog(x, w, b)
            diff = float((got - fn(x, w, b)).abs().max())
            times: dict[str, list[float]] = {"eager": [], "generated": []}
            for _ in range(3):
                fn(x, w, b), prog(x, w, b)
            for _ in range(a.rounds):
                times["eager"] += call_times(fn, [x, w, b], a.calls)
                times["generated"] += call_times(prog, [x, w, b], a.calls)
            oh = (h + 2 * (k // 2) - k) // s + 1
            row = {"shape": [n, c, h, h], "kernel": k, "stride": s, "layout": "NHWC" if nhwc else "NCHW",
                   "macs": n * c * oh * oh * k * k,
                   "eager_us": 1e6 * statistics.median(times["eager"]),
                   "generated_us": 1e6 * statistics.median(times["generated"]), "max_abs_diff": diff}
            row["generated_over_eager"] = row["generated_us"] / row["eager_us"]
            rows.append(row)
            print(f"{n}x{c}x{h}x{h} {row['layout']} k{k} s{s}: {row['macs'] / 1e6:.2f}M multiply-adds, eager {row['eager_us']:.1f} us, "
                  f"generated {row['generated_us']:.1f} us ({row['generated_over_eager']:.2f})", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "depthwise convolutions, eager (oneDNN) against the generated kernel, CPU",
                       "environment": environment("cpu"), "threads": torch.get_num_threads(), "rounds": a.rounds,
                       "calls": a.calls, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
