"""Host time per call of a one-kernel program, per backend, and where it goes (cProfile).

    python -m perf.benchmarks.launch_overhead [--device cuda] [--calls 2000] [--program softmax|rope-seed]

The program is softmax over a [32, 128] tensor: one kernel, so the time per call is the runtime's
own overhead plus one launch. Eager's time for the same op is printed beside it; on CUDA, the
same program replayed as a CUDA graph too ("cupy+graphs": the entry's checks, one replay and the
output's copy).

``--program rope-seed``: the zoo's RoPE seed block (bf16 on CUDA), whose one-kernel program took
~55 us a call on the H100 (run 5) against ~35 us with FUSEG_BCAST_EPT=0 or FUSEG_CUDA_TUNING=0,
while its kernel took less: the same program built three ways in one process ("cupy", and
"cupy-ept-off" / "cupy-untuned" lowered with those switches), timed in alternating rounds, each
profiled.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
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
    p.add_argument("--program", choices=("softmax", "rope-seed"), default="softmax")
    p.add_argument("--rounds", type=int, default=1, help="timing rounds, the variants alternating (median kept)")
    a = p.parse_args(argv)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    kernel_backend = "cupy" if a.device == "cuda" else "cpp"
    if a.program == "rope-seed":
        from .. import zoo

        fn, inputs = zoo.get("rope-seed").factory()
        dtype = torch.bfloat16 if a.device == "cuda" else None
        inputs = [t.to(a.device, dtype if t.is_floating_point() and dtype else t.dtype) for t in inputs]
        plan = apply_aliases(segment(capture(fn, inputs)), "post")
        calls = {"eager": lambda: fn(*inputs)}
        switches = {kernel_backend: {}, f"{kernel_backend}-ept-off": {"FUSEG_BCAST_EPT": "0"},
                    f"{kernel_backend}-untuned": {"FUSEG_CUDA_TUNING": "0"}}
        for name, env in switches.items():
            with _environment(env):
                built = runtime.compile(plan, backend=kernel_backend)
            calls[name] = (lambda p: lambda: p(*inputs))(built)
        profiled = list(switches)
        refused = None
    else:
        x = torch.randn(32, 128, device=a.device)

        def fn(t: torch.Tensor) -> torch.Tensor:
            return torch.softmax(t, -1)

        plan = apply_aliases(segment(capture(fn, [x])), "post")
        calls = {"eager": lambda: fn(x)}
        refused = None
        for b in ("torch", kernel_backend):
            calls[b] = (lambda prog: lambda: prog(x))(runtime.compile(plan, backend=b))
        if a.device == "cuda":  # the same program replayed as a CUDA graph (Note [CUDA graphs of a program])
            from runtime.cudagraphs import use_cuda_graphs

            graphed = runtime.compile(plan, backend="cupy")
            if use_cuda_graphs(graphed) is not None:
                calls["cupy+graphs"] = lambda: graphed(x)
            refused = graphed.cuda_graph_refused
        profiled = [kernel_backend]
    result = {"device": a.device, "program": a.program, "calls": a.calls, "us_per_call": {},
              "rounds_us": {name: [] for name in calls}}
    if a.device == "cuda":
        result["cuda_graph_refused"] = refused
    for call in calls.values():
        for _ in range(100):
            call()
    sync()
    for _ in range(max(a.rounds, 1)):
        for name, call in calls.items():
            t0 = time.perf_counter()
            for _ in range(a.calls):
                call()
            sync()
            result["rounds_us"][name].append((time.perf_counter() - t0) / a.calls * 1e6)
    result["us_per_call"] = {name: statistics.median(ts) for name, ts in result["rounds_us"].items()}
    for name in profiled:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            calls[name]()
        prof.disable()
        sync()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        result["profile_" + name] = buf.getvalue()
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps(result["us_per_call"]), file=sys.stderr)
    for name in profiled:
        print(result["profile_" + name], file=sys.stderr)
    return 0


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """``env`` set while a program is lowered (the switches are read then), then as it was."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    sys.exit(main())
