"""A lone-op kernel against ATen's op in training steps, alternated in one process: the embedding
backward kernel (Note [embedding backward kernels] in runtime/codegen/opaque/embedding.py), or with
``--kernels nll_loss`` the loss's (Note [nll loss kernels] in runtime/codegen/opaque/nll_loss.py).

Usage: python -m perf.experiments.embedding_backward [--kernels embedding_backward|nll_loss]
                                                     [--processes 4] [--rounds 8] [--steps 10]
                                                     [--out FILE] [models ...]

Three variants of each model of ``perf.train_step`` (default: gpt2-tiny, bert-tiny, gpt2-256,
bert-256): Inductor, fuseg, and fuseg with the op(s) left to ATen (the kernels
declined while that variant's graphs are compiled: everything else is the same plan). One
training step each (forward, backward, SGD), their rounds alternated; each process is fresh, with
empty caches. The two fuseg variants swap places from one process to the next (which is compiled
first, and steps first in each round): in an A/A trial (both variants with the kernel, gpt2-tiny,
three processes) the one made first took 1.03-1.06x the other's step, whatever it ran; so the
processes come in pairs, and the row is the median over them. A change of a few microseconds on a step of 2 ms is below the spread between
processes of ``perf.train_step --before`` (fuseg/eager moved by a quarter between processes doing
the same work), so the comparison here is within one process, step against step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MODELS = ["gpt2-tiny", "bert-tiny", "gpt2-256", "bert-256"]
#: --kernels: the ops the "fuseg-aten" variant leaves to ATen, and the prefix of their kernels' names
KERNELS = {"embedding_backward": (("aten.embedding_dense_backward.default",), "fuseg_embedding_backward_"),
           "nll_loss": (("aten.nll_loss_forward.default", "aten.nll_loss_backward.default"), "fuseg_nll_loss_")}


def run(name: str, rounds: int, steps: int, swap: bool = False, kernels: str = "embedding_backward") -> dict[str, Any]:
    """In this process: the three variants' steps of ``name``, alternated; ``swap`` makes the
    variant with ATen's op the second one, before the kernel's."""
    import contextlib
    import copy
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from perf.train_step import _model, timed_rounds
    from runtime.backends import cpp
    from runtime.dynamo import FusegCompiler, compile_with_aot

    ops, prefix = KERNELS[kernels]

    @contextlib.contextmanager
    def kernel_declined(on: bool):
        kept = dict(cpp._LONE_OPS)
        if on:
            for op in ops:
                del cpp._LONE_OPS[op]
        try:
            yield
        finally:
            cpp._LONE_OPS.clear()
            cpp._LONE_OPS.update(kept)

    base, ids = _model(name)
    variants: dict[str, tuple[Any, Any, Any]] = {}
    compilers: dict[str, Any] = {}
    for v in ("inductor", *(("fuseg-aten", "fuseg") if swap else ("fuseg", "fuseg-aten"))):
        model = copy.deepcopy(base)
        if v == "inductor":
            fn = torch.compile(model, backend="inductor")
        else:
            compilers[v] = compiler = FusegCompiler()
            fn = torch.compile(model, backend=lambda gm, ex, c=compiler: compile_with_aot(c, gm, ex))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        with kernel_declined(v == "fuseg-aten"):  # every graph is compiled in the first step
            opt.zero_grad()
            fn(input_ids=ids, labels=ids).loss.backward()
        variants[v] = (model, fn, opt)
    taken = {v: sum(k.name.startswith(prefix) for p in c.compiled for k in p.kernels.values() if k is not None)
             for v, c in compilers.items()}
    # each fuseg program's own calls timed in place (the backward program is where the variants differ)
    calls: dict[str, dict[str, list[float]]] = {v: {} for v in compilers}
    for v, c in compilers.items():
        for prog in c.compiled:
            into = calls[v].setdefault(prog.graph.name, [])

            def timed(*a, entry=prog.entry, into=into):
                t0 = time.perf_counter()
                out = entry(*a)
                into.append(time.perf_counter() - t0)
                return out
            prog.entry = timed

    def warmed_up(r: int, times: dict[str, list[float]]) -> None:  # round 0 warms up: dropped
        if r == 0:
            for t in (*times.values(), *(t for c in calls.values() for t in c.values())):
                t.clear()

    times = timed_rounds(variants, ids, rounds + 1, steps, after_round=warmed_up)
    ms = {v: 1e3 * statistics.median(t) for v, t in times.items()}
    in_place = {v: {g: 1e6 * statistics.median(t) for g, t in c.items() if t} for v, c in calls.items()}
    return {"model": name, "order": list(variants), "step_ms": ms, "kernels": kernels, "kernels_taken": taken, "program_us_in_place": in_place,
            "programs_kernel_over_aten": sum(in_place["fuseg"].values()) / sum(in_place["fuseg-aten"].values()),
            "kernel_over_aten": ms["fuseg"] / ms["fuseg-aten"],
            "fuseg_over_inductor": ms["fuseg"] / ms["inductor"],
            "fuseg_aten_over_inductor": ms["fuseg-aten"] / ms["inductor"]}


def _child(name: str, rounds: int, steps: int, swap: bool, kernels: str) -> dict[str, Any]:
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"), PYTHONWARNINGS="ignore",
                   PYTHONPATH=here)
        code = ("import json, sys; from perf.experiments.embedding_backward import run;"
                "print(json.dumps(run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1', sys.argv[5])))")
        done = subprocess.run([sys.executable, "-c", code, name, str(rounds), str(steps), str(int(swap)), kernels], capture_output=True,
                              text=True, env=env, timeout=3600, cwd=tmp)
        if done.returncode != 0:
            return {"model": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=MODELS)
    p.add_argument("--processes", type=int, default=4, help="an even number: the order swaps between processes")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--kernels", choices=sorted(KERNELS), default="embedding_backward")
    p.add_argument("--out")
    args = p.parse_args()
    from perf.bench import environment, write_record

    rows = []
    for k, name in enumerate(args.models):
        runs = []
        for j in range(args.processes):
            print(f"[{k + 1}/{len(args.models)}] {name}, process {j + 1}/{args.processes} ...", file=sys.stderr, flush=True)
            runs.append(_child(name, args.rounds, args.steps, swap=j % 2 == 1, kernels=args.kernels))
        ok = [r for r in runs if "error" not in r]
        row: dict[str, Any] = {"model": name, "processes": runs}
        if ok:
            for key in ("kernel_over_aten", "programs_kernel_over_aten", "fuseg_over_inductor", "fuseg_aten_over_inductor"):
                row[key] = statistics.median(r[key] for r in ok)
                row[f"{key}_per_process"] = [round(r[key], 3) for r in ok]
            print(f"  {name}: kernel/ATen {row['kernel_over_aten']:.3f} {row['kernel_over_aten_per_process']} "
                  f"(the programs alone {row['programs_kernel_over_aten']:.3f} {row['programs_kernel_over_aten_per_process']}), "
                  f"fuseg/Inductor {row['fuseg_over_inductor']:.3f} (ATen's op: {row['fuseg_aten_over_inductor']:.3f})",
                  file=sys.stderr, flush=True)
        rows.append(row)
    record = {"environment": environment("cpu"), "command": " ".join(["python -m perf.experiments.embedding_backward", *sys.argv[1:]]),
              "method": __doc__, "results": rows}
    write_record(record, args.out)


if __name__ == "__main__":
    main()
