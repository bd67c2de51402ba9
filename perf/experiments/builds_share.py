"""The first seconds of calls with and without Note [the wait follows the builds' share].

    python -m perf.experiments.builds_share [--models gpt2-768,llama-1024,bert-768,vit-768,t5-encoder-512]
        [--window 30] [--eager 2] [--eager-every 4] [--out perf/results/<machine>/builds_share_cpu.json]

Note [the wait follows the builds' share] (runtime/machine/threads.py): a program whose kernels
build in the background waits for them at once where the compilers got under ``STARVED_SHARE``
of the wall time since the builds started. Per model, perf/first_window.py's window (the
default policy, calls first: a fresh process with empty caches, the first call, then calls
back to back for ``--window`` seconds) runs twice, one process after the other: "before" with
``STARVED_SHARE`` set to 0 in its process (the program waits only at the fixed bound,
``WAIT_AFTER_S``), "after" as the library runs. Every ``--eager-every``-th call of each window is
eager's, the compilers stopped for it: each window's mean call is compared with the mean of
those eager calls made at the same moments (this machine's speed drifts within a run).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..bench import environment, write_record
from ..first_window import run_policy

MODELS = "gpt2-768,llama-1024,bert-768,vit-768,t5-encoder-512"
BEFORE = "from runtime.machine import threads; threads.STARVED_SHARE = 0.0"


def _row(r: dict[str, Any]) -> dict[str, Any]:
    keep = ("first_call_s", "builds_ended_s", "calls", "slowest_call_s", "slowest_call_at_s",
            "window_mean_over_interleaved_eager_mean", "window_over_interleaved_eager", "max_diff")
    return {k: r[k] for k in keep} | {"per_second_median_over_same_second_eager":
                                      [s["median_over_same_second_eager"] for s in r["seconds"]]}


def main(argv: list[str] | None = None) -> int:
    from runtime.autotune import machine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=MODELS, help="comma-separated perf.compiled model names")
    p.add_argument("--window", type=float, default=30.0)
    p.add_argument("--eager", type=float, default=2.0, help="seconds of eager calls before and after each window")
    p.add_argument("--eager-every", type=int, default=4)
    p.add_argument("--out", default=None)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.eager_every < 2:
        p.error("--eager-every: 2 or more (the comparison is with eager's calls at the same moments)")
    rows = []
    for name in [m for m in a.models.split(",") if m]:
        before = _row(run_policy(name, a.window, "calls-first", a.eager, a.eager_every, setup=BEFORE))
        after = _row(run_policy(name, a.window, "calls-first", a.eager, a.eager_every))
        key = "window_mean_over_interleaved_eager_mean"
        rows.append({"model": name, "before": before, "after": after,
                     "after_over_before_window_mean": round(after[key] / before[key], 3),
                     "calls_after_over_before": round(after["calls"] / before["calls"], 3)})
        print(f"{name:16s} window mean / same-moment eager: before {before[key]:.3f} (builds ended "
              f"{before['builds_ended_s']} s)  after {after[key]:.3f} (builds ended {after['builds_ended_s']} s)  "
              f"calls {before['calls']} -> {after['calls']}", flush=True)
    write_record({"experiment": "perf.experiments.builds_share", "window_s": a.window, "eager_every": a.eager_every,
                  "machine": machine(), "environment": environment("cpu"), "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
