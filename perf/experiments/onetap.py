"""One-tap convolutions on the CPU (1-D and 2-D, filter size 1, stride 1, no padding): eager
(oneDNN) against the generated kernel (runtime/codegen/opaque/onetap.py, Note [one-tap convolutions]) on
one thread and shared among threads, and, for 2-D ones, ATen's im2col + GEMM (the im2col backend),
shape by shape, every shape as the kernel (the cap ``onetap.MAX_WORK`` these figures chose is now a measurement
of each shape class: Note [choices by measurement] in runtime/autotune.py), so that the threading
threshold (``onetap.PARALLEL_WORK``) is chosen from measured figures.

    python -m perf.experiments.onetap [--rounds 5] [--calls 40] [--out perf/results/<machine>/onetap_cpu.json]

Method: each shape is compiled once per way (a program of the one convolution with its bias),
then eager and the programs are timed in ``--rounds`` interleaved rounds of ``--calls`` calls
each; the record keeps each one's median over all calls and the ratios to eager. A program's time
includes its call (the input check, the output buffer): what a model pays per layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch
import torch.nn.functional as F

from ..bench import call_times, environment, write_record

__all__ = ["SHAPES", "main"]

#: (input shape, filters, groups, input layout): SqueezeBERT-tiny's (its input a transpose of
#: [batch, seq, channels]: "T"), MobileNet-v2-tiny's, EfficientNet-tiny's and PoolFormer-tiny's, then bigger ones up to
#: full-size SqueezeBERT's and ResNet's. Layouts: "C" contiguous, "T" 1-D transposed, "L" channels-last.
SHAPES = [((2, 128, 32), 64, 2, "C"), ((2, 64, 32), 128, 2, "T"), ((2, 64, 32), 64, 2, "T"),
          ((2, 24, 2, 2), 144, 1, "C"), ((2, 16, 4, 4), 96, 1, "C"), ((2, 24, 8, 8), 96, 1, "C"),
          ((2, 8, 16, 16), 48, 1, "C"), ((2, 336, 1, 1), 56, 1, "C"), ((2, 32, 4, 4), 128, 1, "L"),
          ((2, 256, 2, 2), 64, 1, "C"), ((2, 512, 1, 1), 128, 1, "C"),
          ((2, 32, 16, 16), 64, 1, "C"), ((2, 128, 64), 128, 2, "T"), ((2, 256, 32), 256, 4, "C"),
          ((2, 96, 16, 16), 96, 1, "L"), ((2, 64, 16, 16), 128, 1, "C"), ((2, 256, 64), 256, 1, "C"),
          ((2, 64, 32, 32), 64, 1, "C"), ((2, 128, 16, 16), 128, 1, "L"), ((2, 128, 28, 28), 128, 1, "C"),
          ((2, 768, 128), 768, 4, "T"), ((2, 64, 56, 56), 64, 1, "L")]


def _input(shape: tuple[int, ...], layout: str) -> torch.Tensor:
    if layout == "T":  # [batch, positions, channels] seen as [batch, channels, positions]
        return torch.randn(shape[0], shape[2], shape[1]).transpose(1, 2)
    x = torch.randn(shape)
    return x.contiguous(memory_format=torch.channels_last) if layout == "L" else x


def main(argv: list[str] | None = None) -> int:
    import runtime
    from alias import apply_aliases
    from runtime.backends import im2col
    from runtime.codegen import thresholds
    from segmenter import capture, segment

    p = argparse.ArgumentParser(prog="python -m perf.experiments.onetap", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--out")
    a = p.parse_args(argv)
    from runtime.autotune import set_policy

    set_policy("kernel")  # every shape as the generated kernel, whatever this machine's verdict (runtime/autotune.py)
    im2col._measure = lambda key, onednn, im2col_: (0.0, 1.0)  # im2col taken wherever it can be
    rows = []
    with torch.no_grad():
        for shape, filters, groups, layout in SHAPES:
            x = _input(shape, layout)
            w, b = torch.randn(filters, shape[1] // groups, *(1,) * (len(shape) - 2)), torch.randn(filters)
            conv = F.conv1d if len(shape) == 3 else F.conv2d

            def fn(x, w, b, conv=conv, groups=groups):
                return conv(x, w, b, groups=groups)

            graph = apply_aliases(segment(capture(fn, [x, w, b])), "post")
            ways = {"eager": fn}
            for way, parallel in (("generated", 1 << 62), ("threaded", 1)):
                with thresholds.pinned(dataclasses.replace(thresholds.UNMEASURED, macs=parallel)):
                    prog = runtime.compile(graph)
                if set(prog.backend_of.values()) != {"cpp"}:
                    why = "; ".join(f"{b}: {r}" for reasons in prog.passed_over.values() for b, r in reasons)
                    raise SystemExit(f"{list(shape)}: not a generated kernel: {why}")
                ways[way] = prog
            if len(shape) == 4:
                prog = runtime.compile(graph, backend="im2col")
                if set(prog.backend_of.values()) == {"im2col"}:
                    ways["im2col"] = prog
            diff = max(float((w_(x, w, b)[0] - fn(x, w, b)).abs().max()) for k, w_ in ways.items() if k != "eager")
            times: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(3):
                for f in ways.values():
                    f(x, w, b)
            for _ in range(a.rounds):
                for k, f in ways.items():
                    times[k] += call_times(f, [x, w, b], a.calls)
            positions = x.numel() // (shape[0] * shape[1])
            row = {"shape": list(shape), "filters": filters, "groups": groups, "layout": layout,
                   "macs": shape[0] * filters * (shape[1] // groups) * positions, "max_abs_diff": diff}
            for k, ts in times.items():
                row[f"{k}_us"] = 1e6 * statistics.median(ts)
            for k in ways:
                if k != "eager":
                    row[f"{k}_over_eager"] = row[f"{k}_us"] / row["eager_us"]
            rows.append(row)
            print(f"{'x'.join(map(str, shape))} {layout} -> {filters} g{groups}: {row['macs'] / 1e6:.2f}M multiply-adds, "
                  + ", ".join(f"{k} {row[f'{k}_us']:.1f} us" for k in ways), flush=True)
    if a.out:
        write_record({"benchmark": "one-tap convolutions, eager (oneDNN) against the generated kernel (one thread "
                      "and threaded) and im2col + GEMM, CPU",
                      "environment": environment("cpu"), "threads": torch.get_num_threads(), "rounds": a.rounds,
                      "calls": a.calls, "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
