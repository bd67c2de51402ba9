"""What a prompt crossing a power of two costs under ``backend="fuseg"`` (issue 41; a measurement).

    python -m perf.experiments.shapes.class_crossing --before DIR [--models qwen2 phi3] [--rounds 2]
                                              [--out perf/results/<machine>/class_crossing_cpu.json]

Note [choices at the call] (runtime/backends/at_call.py): a symbolic plan's measured kernels were
chosen once per power-of-two class of their sizes, that class a condition of the plan, so a
prompt in a new class made a new plan. Per model and round, the code before (``--before``, a
checkout on ``PYTHONPATH``) and this checkout each run in a fresh process with an empty kernel
cache and the builds on the caller's thread (FUSEG_BACKGROUND_BUILDS=0, so the change is all
that differs): perf.dynamic_shapes' generation protocol for prompts of 5, 9 and 13 tokens, then
13 again (seen), 17 (its prefill crosses 16) and 33 (crosses 32), each generate timed, with the
symbolic plans counted after each and the tokens compared with eager's. Before and after
alternate within each round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from perf.dynamic_shapes import _model, NEW_TOKENS
import runtime.dynamo as d
model, ref = _model(sys.argv[1]), _model(sys.argv[1])
model.forward = torch.compile(model.forward, backend="fuseg")
out = []
with torch.no_grad():
    for n in (5, 9, 13, 13, 17, 33):
        ids = torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(n))
        t = time.perf_counter()
        got = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        seconds = time.perf_counter() - t
        want = ref.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        out.append({"length": n, "seconds": seconds, "symbolic_plans": d.STATS["symbolic_plans"],
                    "tokens_equal_eager": bool(torch.equal(got, want))})
print("RESULT " + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="a checkout of the code to compare with")
    p.add_argument("--models", nargs="*", default=["qwen2", "phi3"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    from ...bench import environment, write_record

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    rows = []
    for name in a.models:
        for round_ in range(a.rounds):
            for label, tree in (("before", os.path.abspath(a.before)), ("after", here)):
                with tempfile.TemporaryDirectory() as cache:
                    env = {**os.environ, "FUSEG_CACHE_DIR": cache, "PYTHONPATH": tree, "FUSEG_BACKGROUND_BUILDS": "0"}
                    r = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True,
                                       env=env, cwd=tree)
                line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    rows.append({"model": name, "round": round_, "variant": label, "error": r.stderr[-1500:]})
                    print(name, label, "ERROR", r.stderr[-500:], flush=True)
                    continue
                steps = json.loads(line[7:])
                seen = steps[3]["seconds"]
                row = {"model": name, "round": round_, "variant": label, "steps": steps,
                       "crossing_16_over_seen": steps[4]["seconds"] / seen,
                       "crossing_32_over_seen": steps[5]["seconds"] / seen,
                       "plans_made_by_crossings": steps[5]["symbolic_plans"] - steps[3]["symbolic_plans"]}
                rows.append(row)
                print(name, label, f"seen {seen * 1e3:.1f} ms, 17: {steps[4]['seconds'] * 1e3:.1f} ms, "
                      f"33: {steps[5]['seconds'] * 1e3:.1f} ms, plans made {row['plans_made_by_crossings']}", flush=True)
    if a.out:
        write_record({"benchmark": "a prompt crossing a power of two, before and after choices at the call (issue 41)",
                      "command": "python -m perf.experiments.shapes.class_crossing " + " ".join(argv or sys.argv[1:]),
                      "environment": environment("cpu"), "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
