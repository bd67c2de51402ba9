"""Compiled models on the CPU: eager against ``torch.compile(backend="inductor")`` and
``torch.compile(backend="fuseg")``, default options, side by side in one run.

    python -m perf.compiled [MODEL ...] [--set default|unseen|all] [--rounds 5] [--calls 20] [--first-calls 3] [--no-first-call]
                            [--out perf/results/compiled_cpu.json] [--plot FILE.png]

Models: the zoo's runnable entries and transformer-family models the project never tuned for
(``HELD_OUT``: tiny configs from ``transformers``, random weights, batch 2, sequence 32); with
``--set unseen`` (or ``all``) a second such set, ``UNSEEN`` in perf/models.py, first run after all
the tuning done on the others.

Method. Steady state: every variant of a model is compiled first, then the variants are timed
in ``--rounds`` interleaved rounds (eager, inductor, fuseg, eager, ...) of ``--calls`` calls each
(``perf_counter`` around each call); the record holds each variant's median over all its calls,
and the ratios fuseg/eager and fuseg/inductor of those medians. Two more variants bound what any
backend could do: "dynamo" (``torch.compile(backend="eager")``: the captured ops run as they are)
and "floor" (``torch.compile`` with a backend that does no work: at compile time it runs the graph
once on the example inputs, and each call hands those same outputs back). The floor is dynamo's
per-call cost alone (guards, frames, the module call path) with no compiled code at all: where it
is slower than eager, no torch.compile backend can be faster than eager (the inputs are the same
on every call, so its outputs are eager's too). "dynamo" is no such bound: its ops run one by one
through the GraphModule, which a compiler need not do.
Interleaving puts the machine's
noise on every variant alike: compare ratios within one run, not times across runs. First call:
each compiler's first call (trace, compile, kernel builds) in a fresh process with empty
Inductor and fuseg caches, ``--first-calls`` times per compiler (3), the two compilers
alternating; the median is kept, every time is recorded (one cold start on this shared machine
varied by up to 40% between runs: resnet's fuseg first call took 2.1 s in one run, 3.4 s in the
next). ``--no-first-call`` skips it. Every variant's outputs are compared
with eager's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .bench import environment

__all__ = ["HELD_OUT", "MODELS", "UNSEEN", "bench_compiled", "main"]

from .models import DEFAULT, HELD_OUT, MODELS, UNSEEN


def _set_of(name: str) -> str:
    return "unseen" if name in UNSEEN else "held_out" if name in HELD_OUT else "zoo"


def _leaves(x: Any) -> list[torch.Tensor]:
    if hasattr(x, "to_tuple"):  # transformers' ModelOutput
        x = x.to_tuple()
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _max_diff(got: Any, want: Any) -> float:
    g, w = _leaves(got), _leaves(want)
    if len(g) != len(w) or any(a.shape != b.shape for a, b in zip(g, w)):
        return math.inf
    return max((float((a.double() - b.double()).abs().nan_to_num(0.0).max()) for a, b in zip(g, w) if b.numel()),
               default=0.0)


def _first_call(name: str, backend: str) -> float:
    """Seconds of the first call of ``torch.compile(model, backend=...)``, in a fresh process with
    empty caches (Inductor's and ours)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                   FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"))
        code = ("import sys, time, warnings, torch; warnings.filterwarnings('ignore');"
                "from perf.compiled import MODELS;"
                f"m, a = MODELS[{name!r}]();"
                f"c = torch.compile(m, backend={backend!r});"
                "t0 = time.perf_counter();"
                "torch.no_grad().__enter__(); c(*a);"
                "print(time.perf_counter() - t0)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
        return float(r.stdout.strip().splitlines()[-1])


def _no_work_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The "floor" variant's backend: the graph runs once, now; every call returns its outputs."""
    outputs = gm(*example_inputs)
    return lambda *args: outputs


def bench_compiled(names: list[str], rounds: int = 5, calls: int = 20, first_call: int = 3,
                   progress: bool = True) -> list[dict[str, Any]]:
    """``first_call``: fresh processes per compiler and model whose first calls are timed (the
    median is kept; 0: none)."""
    rows = []
    for name in names:
        if name not in MODELS:
            raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        torch._dynamo.reset()
        fn, inputs = MODELS[name]()
        row: dict[str, Any] = {"model": name, "held_out": name in HELD_OUT or name in UNSEEN, "set": _set_of(name)}
        variants: dict[str, Callable[[], Any]] = {"eager": lambda f=fn, a=inputs: f(*a)}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = fn(*inputs)
            # "dynamo": the captured ops run as they are; "floor": no work at all (module docstring)
            compilers: dict[str, Any] = {"dynamo": "eager", "floor": _no_work_backend}
            for backend in ("inductor", "fuseg", "dynamo", "floor"):
                try:
                    c = torch.compile(fn, backend=compilers.get(backend, backend))
                    row[f"{backend}_max_abs_diff"] = _max_diff(c(*inputs), want)
                    variants[backend] = lambda c=c, a=inputs: c(*a)
                except Exception as e:  # noqa: BLE001 - recorded: a compiler that fails is a result
                    row[f"{backend}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            times: dict[str, list[float]] = {v: [] for v in variants}
            for call in variants.values():  # warm-up
                for _ in range(3):
                    call()
            for _ in range(rounds):
                for v, call in variants.items():
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        call()
                        times[v].append((time.perf_counter() - t0) * 1e3)
        for v, ts in times.items():
            row[f"{v}_ms"] = statistics.median(ts)
            q = statistics.quantiles(ts, n=10)
            row[f"{v}_p10_ms"], row[f"{v}_p90_ms"] = q[0], q[-1]
        for v in ("dynamo", "floor"):
            if f"{v}_ms" in row:
                row[f"{v}_vs_eager"] = row[f"{v}_ms"] / row["eager_ms"]
        if "fuseg_ms" in row:
            row["fuseg_vs_eager"] = row["fuseg_ms"] / row["eager_ms"]
            if "inductor_ms" in row:
                row["fuseg_vs_inductor"] = row["fuseg_ms"] / row["inductor_ms"]
        if first_call:
            runs: dict[str, list[float]] = {"inductor": [], "fuseg": []}
            for _ in range(first_call):  # the two compilers alternate: the machine's drift hits both
                for backend in runs:
                    if f"{backend}_first_call_error" in row:
                        continue
                    try:
                        runs[backend].append(_first_call(name, backend))
                    except Exception as e:  # noqa: BLE001 - recorded
                        row[f"{backend}_first_call_error"] = str(e)[:300]
            for backend, ts in runs.items():
                if ts and f"{backend}_first_call_error" not in row:
                    row[f"{backend}_first_call_s"] = statistics.median(ts)
                    row[f"{backend}_first_call_runs_s"] = ts
            if "fuseg_first_call_s" in row and "inductor_first_call_s" in row:
                row["first_call_vs_inductor"] = row["fuseg_first_call_s"] / row["inductor_first_call_s"]
        rows.append(row)
        if progress:
            print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    def f(k: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(row[k]) if k in row else "-"
    return (f"{row['model']:>14}  eager {f('eager_ms')} ms  inductor {f('inductor_ms')}  fuseg {f('fuseg_ms')}  "
            f"floor/eager {f('floor_vs_eager', '{:.2f}')}  dynamo/eager {f('dynamo_vs_eager', '{:.2f}')}  fuseg/eager {f('fuseg_vs_eager', '{:.2f}')}  fuseg/inductor {f('fuseg_vs_inductor', '{:.2f}')}  "
            f"first call {f('fuseg_first_call_s', '{:.1f}')} s vs {f('inductor_first_call_s', '{:.1f}')} s")


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str, which: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in which if key in r]
        return statistics.median(vals) if vals else None
    out: dict[str, Any] = {}
    def of(part: str) -> list[dict[str, Any]]:
        return [r for r in rows if r.get("set", "held_out" if r["held_out"] else "zoo") == part]
    for part, which in (("all", rows), ("zoo", of("zoo")), ("held_out", of("held_out")), ("unseen", of("unseen"))):
        if part == "unseen" and not which:
            continue
        out[part] = {"models": len(which),
                     "median_fuseg_vs_eager": med("fuseg_vs_eager", which),
                     "median_fuseg_vs_inductor": med("fuseg_vs_inductor", which),
                     "slower_than_eager": [r["model"] for r in which if r.get("fuseg_vs_eager", 0) > 1],
                     # where running the captured ops as they are is slower than eager
                     "dynamo_alone_slower_than_eager": [r["model"] for r in which if r.get("dynamo_vs_eager", 0) > 1],
                     # where torch.compile doing no work at all is: no backend can beat eager there
                     "floor_slower_than_eager": [r["model"] for r in which if r.get("floor_vs_eager", 0) > 1],
                     "slower_than_eager_above_floor": [r["model"] for r in which if r.get("fuseg_vs_eager", 0) > 1
                                                       and r.get("floor_vs_eager", 0) <= 1],
                     "median_first_call_vs_inductor": med("first_call_vs_inductor", which),
                     "max_first_call_vs_inductor": max((r["first_call_vs_inductor"] for r in which
                                                        if "first_call_vs_inductor" in r), default=None)}
    return out


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "fuseg_vs_eager" in r]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["fuseg_vs_eager"] for r in rows], 0.4, label="fuseg / eager")
    ax.bar([x + 0.2 for x in xs], [r.get("fuseg_vs_inductor", float("nan")) for r in rows], 0.4,
           label="fuseg / inductor")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), [r["model"] for r in rows], rotation=60, ha="right")
    ax.set_ylabel("time ratio (lower is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help=f"default: the --set's models; known: {', '.join(MODELS)}")
    p.add_argument("--set", choices=("default", "unseen", "all"), default="default",
                   help="the zoo and HELD_OUT (default), UNSEEN, or both")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--first-calls", type=int, default=3, help="cold first calls per compiler and model (median kept)")
    p.add_argument("--no-first-call", action="store_true")
    p.add_argument("--out")
    p.add_argument("--plot")
    a = p.parse_args(argv)
    first_calls = 0 if a.no_first_call else a.first_calls
    sets = {"default": DEFAULT, "unseen": UNSEEN, "all": MODELS}
    rows = bench_compiled(a.models or list(sets[a.set]), a.rounds, a.calls, first_calls)
    result = {"benchmark": "compiled models, CPU", "environment": environment("cpu"),
              "threads": torch.get_num_threads(), "rounds": a.rounds, "calls": a.calls, "first_calls": first_calls,
              "summary": summary(rows), "rows": rows}
    print(json.dumps(result["summary"], indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if a.plot:
        plot(rows, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
