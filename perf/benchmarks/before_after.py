"""One model, two checkouts of this project: ``torch.compile(backend="fuseg")`` before and after a
change, each against eager in the same process, alternated in one run.

    python -m perf.benchmarks.before_after --before /path/to/old/checkout [MODEL ...]
                                [--rounds 4] [--calls 20] [--first-call] [--out perf/results/<machine>/before_after_cpu.json]

Method. Per model and round, one fresh process per side (``before`` first on even rounds,
``after`` first on odd ones): it imports the side's ``runtime.dynamo.fuseg_backend`` (the
checkout is put first on ``sys.path``), builds the model from this checkout's perf/models.py
(loaded by path, so an older checkout runs the same models), compiles it with default options,
then times eager and fuseg in interleaved blocks of ``--calls`` calls and prints each one's
median. The record keeps per side the median over rounds of fuseg/eager (eager is the yardstick
both sides share, so machine noise between processes cancels) and ``after / before`` of those
ratios: below 1 is faster. Kernel caches are per side and kept across rounds (the first round's
compile fills them); only steady-state calls are timed. Outputs are compared with eager's.
``--first-call`` times each side's first call instead (trace, segmentation, kernel builds), in a
fresh process with an empty kernel cache per call, the sides alternating per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from ..bench import environment

__all__ = ["main", "measure"]

_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Both children start so: ``sys.argv[1:4]`` = checkout, models.py path, model name; the side's
# fuseg backend compiles the model (not yet called).
_LOAD = r"""
import importlib.util, json, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
tree, models_py, name = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, tree)
import torch
from runtime.dynamo import fuseg_backend
spec = importlib.util.spec_from_file_location("fuseg_bench_models", models_py)
models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(models)
model, args = models.MODELS[name]()
compiled = torch.compile(model, backend=fuseg_backend)
"""

# Steady state; then ``sys.argv[4:6]`` = calls, blocks.
_CHILD = _LOAD + r"""
calls, blocks = int(sys.argv[4]), int(sys.argv[5])
times = {"eager": [], "fuseg": []}
with torch.no_grad():
    want, got = model(*args), compiled(*args)
    try:  # the steady state is the kernels' (Note [kernels built in the background]; older checkouts lack it)
        from runtime.codegen.build import wait_for_background_builds
        wait_for_background_builds()
    except ImportError:
        pass
    leaves = lambda x: [t for t in torch.utils._pytree.tree_leaves(x.to_tuple() if hasattr(x, "to_tuple") else x)
                        if isinstance(t, torch.Tensor)]
    diff = max((float((a.double() - b.double()).abs().nan_to_num(0.0).max())
                for a, b in zip(leaves(got), leaves(want)) if b.numel()), default=0.0)
    for _ in range(3):
        model(*args); compiled(*args)
    for _ in range(blocks):
        for variant, fn in (("eager", model), ("fuseg", compiled)):
            for _ in range(calls):
                t0 = time.perf_counter(); fn(*args); times[variant].append(time.perf_counter() - t0)
print(json.dumps({"eager_ms": 1e3 * statistics.median(times["eager"]),
                  "fuseg_ms": 1e3 * statistics.median(times["fuseg"]), "max_abs_diff": diff}))
"""


# ``--first-call``: the first call alone, with an empty kernel cache.
_FIRST = _LOAD + r"""
with torch.no_grad():
    t0 = time.perf_counter(); compiled(*args); first = time.perf_counter() - t0
print(json.dumps({"first_call_s": first}))
"""


def _first_call(tree: str, name: str) -> dict[str, float]:
    """The first call of the compiled model in a fresh process with an empty kernel cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FUSEG_CACHE_DIR=cache, PYTHONPATH=tree)
        models_py = os.path.join(_HERE, "perf", "models.py")
        r = subprocess.run([sys.executable, "-c", _FIRST, tree, models_py, name], capture_output=True, text=True,
                           env=env, timeout=1800, cwd=tree)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        raise RuntimeError(f"{name} in {tree}: {last}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure_first_call(before: str, names: list[str], rounds: int = 4, progress: bool = True) -> list[dict[str, Any]]:
    """First calls (trace, segment, kernel builds on an empty cache), the sides alternating."""
    rows: list[dict[str, Any]] = []
    sides = {"before": os.path.abspath(before), "after": _HERE}
    for name in names:
        runs: dict[str, list[float]] = {"before": [], "after": []}
        row: dict[str, Any] = {"model": name}
        try:
            for r in range(rounds):
                for s in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    runs[s].append(_first_call(sides[s], name)["first_call_s"])
        except RuntimeError as e:
            row["error"] = str(e)
        else:
            for s in sides:
                row[f"{s}_first_call_s"] = statistics.median(runs[s])
                row[f"{s}_runs_s"] = runs[s]
            row["after_over_before"] = row["after_first_call_s"] / row["before_first_call_s"]
        rows.append(row)
        if progress:
            print(f"{name:>16}: " + (row["error"] if "error" in row else
                  f"first call before {row['before_first_call_s']:.2f} s, after {row['after_first_call_s']:.2f} s "
                  f"(after/before {row['after_over_before']:.2f})"), file=sys.stderr, flush=True)
    return rows


def _side(tree: str, name: str, calls: int, blocks: int, cache: str) -> dict[str, float]:
    env = dict(os.environ, FUSEG_CACHE_DIR=cache, PYTHONPATH=tree)
    models_py = os.path.join(_HERE, "perf", "models.py")
    r = subprocess.run([sys.executable, "-c", _CHILD, tree, models_py, name, str(calls), str(blocks)],
                       capture_output=True, text=True, env=env, timeout=1800, cwd=tree)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        raise RuntimeError(f"{name} in {tree}: {last}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def measure(before: str, names: list[str], rounds: int = 4, calls: int = 20, blocks: int = 3,
            progress: bool = True) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    sides = {"before": os.path.abspath(before), "after": _HERE}
    with tempfile.TemporaryDirectory() as tmp:
        caches = {s: os.path.join(tmp, s) for s in sides}
        for name in names:
            runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            error = None
            for r in range(rounds):
                order = ("before", "after") if r % 2 == 0 else ("after", "before")
                try:
                    for s in order:
                        runs[s].append(_side(sides[s], name, calls, blocks, caches[s]))
                except RuntimeError as e:
                    error = str(e)
                    break
            row: dict[str, Any] = {"model": name}
            if error is not None:
                row["error"] = error
            else:
                for s in sides:
                    row[f"{s}_fuseg_over_eager"] = statistics.median(x["fuseg_ms"] / x["eager_ms"] for x in runs[s])
                    row[f"{s}_eager_ms"] = statistics.median(x["eager_ms"] for x in runs[s])
                    row[f"{s}_fuseg_ms"] = statistics.median(x["fuseg_ms"] for x in runs[s])
                    row[f"{s}_max_abs_diff"] = max(x["max_abs_diff"] for x in runs[s])
                row["after_over_before"] = row["after_fuseg_over_eager"] / row["before_fuseg_over_eager"]
            rows.append(row)
            if progress:
                print(_line(row), file=sys.stderr, flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['model']:>16}: {row['error']}"
    return (f"{row['model']:>16}: fuseg/eager before {row['before_fuseg_over_eager']:.2f}, "
            f"after {row['after_fuseg_over_eager']:.2f} (after/before {row['after_over_before']:.2f})")


def main(argv: list[str] | None = None) -> int:
    from ..models import DEFAULT, MODELS

    p = argparse.ArgumentParser(prog="python -m perf.benchmarks.before_after", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help=f"default: all of {', '.join(DEFAULT)}; also known: the UNSEEN set")
    p.add_argument("--before", required=True, help="a checkout of the project before the change")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3, help="interleaved eager/fuseg blocks per process")
    p.add_argument("--first-call", action="store_true",
                   help="time the first call instead (a fresh process and an empty kernel cache per call)")
    p.add_argument("--out", help="write the record (JSON) here")
    a = p.parse_args(argv)
    names = a.models or list(DEFAULT)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if not os.path.isfile(os.path.join(a.before, "runtime", "dynamo.py")):
        p.error(f"--before {a.before}: not a checkout of this project (no runtime/dynamo.py)")
    if a.first_call:
        rows = measure_first_call(a.before, names, a.rounds)
        record = {"benchmark": "fuseg first call before and after, CPU", "environment": environment("cpu"),
                  "before": os.path.abspath(a.before), "rounds": a.rounds, "rows": rows}
    else:
        rows = measure(a.before, names, a.rounds, a.calls, a.blocks)
        record = {"benchmark": "fuseg before and after, CPU", "environment": environment("cpu"),
                  "before": os.path.abspath(a.before), "rounds": a.rounds, "calls": a.calls, "blocks": a.blocks,
                  "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
