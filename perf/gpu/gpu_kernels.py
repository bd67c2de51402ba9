"""Per-kernel device time of a compiled model, fuseg against Inductor (issue 44: the ViT gap).

    python -m perf.gpu.gpu_kernels [MODEL ...] [--variants fuseg_graphs,inductor_ro] [--calls 20]
                               [--device cuda] [--top 25] [--out FILE.json]

For each model and variant (as ``perf.compiled`` compiles them: ``fuseg_graphs`` is fuseg with
CUDA graphs, ``inductor_ro`` Inductor's reduce-overhead), the program is warmed up, then
``--calls`` calls run under the torch profiler. Recorded per variant: the device's kernels per
call (count and summed time, in us), and the ``--top`` kernels by total time with their calls per
call and mean time; per model, the summed time per call of each variant and their difference.
The profiler's device times are what the GPU spent in kernels, whatever the host did, so the
difference is where a variant's kernels are slower or more numerous. Outputs are compared with
eager first. ``--device cpu`` runs the same steps on the CPU (a dry run of the plumbing: the
profiler's CPU ops stand in for kernels; no figure is a result).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import torch

from ..bench import environment, write_record
from ..compiled import _compile, _max_diff, load_model

__all__ = ["main", "profile_kernels"]


def _kernel_table(prof: Any, calls: int, cuda: bool, top: int) -> dict[str, Any]:
    rows = []
    for e in prof.key_averages():
        us = (e.device_time_total if cuda else e.self_cpu_time_total)
        if cuda and getattr(e, "device_type", None) is not None and str(e.device_type) != "DeviceType.CUDA":
            continue
        if us <= 0:
            continue
        rows.append({"kernel": e.key[:160], "calls_per_call": e.count / calls, "us_per_call": us / calls,
                     "mean_us": us / e.count})
    rows.sort(key=lambda r: -r["us_per_call"])
    return {"kernels_per_call": sum(r["calls_per_call"] for r in rows),
            "us_per_call": sum(r["us_per_call"] for r in rows), "top": rows[:top]}


def profile_kernels(names: list[str], variants: list[str], calls: int = 20, device: str = "cuda",
                    top: int = 25) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    out = []
    for name in names:
        fn, inputs = load_model(name, device)
        row: dict[str, Any] = {"model": name, "device": device, "calls": calls}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = fn(*inputs)
            for v in variants:
                try:
                    c, _ = _compile(fn, v)
                    row[f"{v}_max_abs_diff"] = _max_diff(c(*inputs), want)
                    for _ in range(5):
                        c(*inputs)
                    if cuda:
                        torch.cuda.synchronize()
                    with profile(activities=activities) as prof:
                        for _ in range(calls):
                            c(*inputs)
                        if cuda:
                            torch.cuda.synchronize()
                    row[v] = _kernel_table(prof, calls, cuda, top)
                except Exception as e:  # noqa: BLE001 - recorded: a variant that fails is a result
                    row[f"{v}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        done = [v for v in variants if v in row]
        if len(done) == 2:
            a, b = done
            row[f"us_per_call_{a}_minus_{b}"] = row[a]["us_per_call"] - row[b]["us_per_call"]
        out.append(row)
        print(f"{name}: " + "  ".join(f"{v} {row[v]['kernels_per_call']:.0f} kernels {row[v]['us_per_call']:.1f} us"
                                      if v in row else f"{v} {row.get(v + '_error')}" for v in variants), flush=True)
        for v in done:
            for r in row[v]["top"][:12]:
                print(f"  {v:>13} {r['us_per_call']:8.1f} us  x{r['calls_per_call']:<5.1f} {r['kernel'][:90]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["vit", "bert-tiny"])
    p.add_argument("--variants", default="fuseg_graphs,inductor_ro")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default="cuda")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out")
    a = p.parse_args(argv)
    rows = profile_kernels(a.models, a.variants.split(","), a.calls, a.device, a.top)
    write_record({"benchmark": "gpu_kernels", "environment": environment(a.device), "command": " ".join(sys.argv),
                  "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
