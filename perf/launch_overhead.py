"""Host time per call of a one-kernel program, per backend, and where it goes (cProfile).

    python -m perf.launch_overhead [--device cuda] [--calls 2000]

The program is softmax over a [32, 128] tensor: one kernel, so the time per call is the runtime's
own overhead plus one launch. Eager's time for the same op is printed beside it; on CUDA, the
same program replayed as a CUDA graph too ("cupy+graphs": the entry's checks, one replay and the
output's copy).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

import torch

import runtime
from alias import apply_aliases
from segmenter import capture, segment


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    x = torch.randn(32, 128, device=a.device)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.softmax(t, -1)

    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    plan = apply_aliases(segment(capture(fn, [x])), "post")
    backends = ["torch", "cupy"] if a.device == "cuda" else ["torch", "cpp"]
    calls = {"eager": lambda: fn(x)}
    refused = None
    for b in backends:
        calls[b] = (lambda prog: lambda: prog(x))(runtime.compile(plan, backend=b))
    if a.device == "cuda":  # the same program replayed as a CUDA graph (Note [CUDA graphs of a program])
        from runtime.cudagraphs import use_cuda_graphs

        graphed = runtime.compile(plan, backend="cupy")
        if use_cuda_graphs(graphed) is not None:
            calls["cupy+graphs"] = lambda: graphed(x)
        refused = graphed.cuda_graph_refused
    result = {"device": a.device, "calls": a.calls, "us_per_call": {}}
    if a.device == "cuda":
        result["cuda_graph_refused"] = refused
    for name, call in calls.items():
        for _ in range(100):
            call()
        sync()
        t0 = time.perf_counter()
        for _ in range(a.calls):
            call()
        sync()
        result["us_per_call"][name] = (time.perf_counter() - t0) / a.calls * 1e6
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.calls):
        calls[backends[-1]]()
    prof.disable()
    sync()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
    result["profile_" + backends[-1]] = buf.getvalue()
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps(result["us_per_call"]), file=sys.stderr)
    print(result["profile_" + backends[-1]], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
