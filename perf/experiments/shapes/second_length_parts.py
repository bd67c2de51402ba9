"""Where a second prompt length's time goes under ``backend="fuseg"`` (issue 41; a measurement).

    python -m perf.experiments.shapes.second_length_parts [--models qwen2 phi3] [--rounds 1] [--before DIR]
                                                   [--out perf/results/<machine>/second_length_parts_cpu.json]

Per model, one fresh process with an empty kernel cache runs perf.dynamic_shapes' generation
protocol for three prompt lengths (``generate``, greedy, 24 new tokens) with our own functions
wrapped in timers: ``from_fx`` (the graph imported again on FakeTensors, symbolic sizes), the
construction of each ``CompiledProgram`` (lowering, choices, the kernel builds), the compiler
runs themselves (their seconds summed: a program's groups build in parallel, one per core, so
this may exceed their wall time) and ``_run_symbolic`` (all of fuseg's part of a call that makes
a symbolic plan, the above included). What is left of a generate is dynamo's and AOTAutograd's
(and the model's own run). ``aot_eager`` runs the same protocol first, in its own process, as
the yardstick of issue 41's goal (fuseg's second generate within 1.5x of its). ``--before DIR``
adds the same protocol run from another checkout (``fuseg_before``: its own code on
``PYTHONPATH``), and ``--rounds N`` repeats the whole alternation N times (aot_eager, before,
fuseg; each in a fresh process with an empty kernel cache), so a change is measured against the
code it changed in one run. With rounds of one: a breakdown, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import collections, functools, json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from perf.dynamic_shapes import _model, LENGTHS, NEW_TOKENS
import runtime.dynamo as d, runtime.compiled.program as prog, runtime.codegen.build as build, runtime.machine.compiler as compiler
acc = collections.Counter()
def timed(label, f):
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[label] += time.perf_counter() - t
    return g
d.from_fx = timed("from_fx", d.from_fx)
# (one kernel is compiled by compiler._compile_into, a group by build._compile_group)
compiler._compile = build._compile = timed("compiler_runs", compiler._compile)
prog.CompiledProgram.__init__ = timed("compiled_program", prog.CompiledProgram.__init__)
d.FusegCompiler._run_symbolic = timed("run_symbolic", d.FusegCompiler._run_symbolic)
if hasattr(prog.CompiledProgram, "_rebuild"):  # Note [kernels built in the background]: at a later call
    prog.CompiledProgram._rebuild = timed("rebuild", prog.CompiledProgram._rebuild)
model = _model(sys.argv[1])
model.forward = torch.compile(model.forward, backend=sys.argv[2])
prompts = [torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n)) for n in LENGTHS]
out = []
with torch.no_grad():
    for k in range(3):
        acc.clear()
        t = time.perf_counter()
        model.generate(prompts[k], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        out.append({"length": LENGTHS[k], "seconds": time.perf_counter() - t, **dict(acc)})
        if hasattr(d, "STATS"):
            out[-1]["built_in_background"] = d.STATS.get("built_in_background", 0)
print("RESULT " + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=["qwen2", "phi3"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--before", default=None, help="a checkout of the code to compare with (run as fuseg_before)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from ...bench import environment, write_record

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    variants = [("aot_eager", "aot_eager", here)]
    if a.before:
        variants.append(("fuseg_before", "fuseg", os.path.abspath(a.before)))
    variants.append(("fuseg", "fuseg", here))
    rows = []
    for name in a.models:
        for round_ in range(a.rounds):
            row: dict = {"model": name, "round": round_}
            for label, backend, tree in variants:  # one after the other, each in a fresh process
                with tempfile.TemporaryDirectory() as cache:
                    env = {**os.environ, "FUSEG_CACHE_DIR": cache, "PYTHONPATH": tree}
                    r = subprocess.run([sys.executable, "-c", _CHILD, name, backend], capture_output=True, text=True,
                                       env=env, cwd=tree)
                line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    row[f"{label}_error"] = r.stderr[-1500:]
                    print(name, label, "ERROR", r.stderr[-500:])
                    continue
                row[label] = steps = json.loads(line[7:])
                for s in steps:
                    print(name, label, " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                for k, v in s.items()), flush=True)
            for label in ("fuseg_before", "fuseg"):
                if "aot_eager" in row and label in row:
                    ratio = row[f"{label}_second_over_aot_eager_second"] = (
                        row[label][1]["seconds"] / row["aot_eager"][1]["seconds"])
                    part = row[f"{label}_part_of_second"] = row[label][1].get("run_symbolic", 0.0)
                    print(name, f"second: {label}/aot_eager {ratio:.2f}, its own part {part:.2f} s", flush=True)
            rows.append(row)
    if a.out:
        write_record({"benchmark": "second prompt length, fuseg's parts (issue 41)",
                      "command": "python -m perf.experiments.shapes.second_length_parts " + " ".join(argv or sys.argv[1:]),
                      "environment": environment("cpu"), "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
