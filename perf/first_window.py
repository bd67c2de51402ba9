"""The first seconds of a compiled model's calls, while its kernels build in the background,
against eager's (issue 64, goal 2: no slow period).

    python -m perf.first_window [MODEL] [--window 30] [--eager 3] [--policies calls-first,cores]
                                [--eager-every N] [--inductor] [--out perf/results/<machine>/first_window_cpu.json]

Per policy (Note [calls first while kernels build] in runtime/machine/threads.py: how calls run beside the
background compilers), a fresh process with empty kernel caches: eager is timed for ``--eager``
seconds (calls back to back), then ``torch.compile(model, backend="fuseg")``'s first call (its
kernels start building in the background), then its calls back to back for ``--window`` seconds
from the end of that first call, then eager again. The record holds, per second of the window,
the calls made, their median and their mean time over eager's median (eager's calls before and
after, together), the whole window's calls against the calls eager would have made in it, the slowest call and
when it started (where a program waited for its builds: Note [kernels built in the background]),
and when the background builds ended (seconds from the end of the first call; ``None``: not
within the window). ``--eager-every N``: every N-th call of the window is eager's, with the
compilers stopped for it, and each second's median is also taken over that second's eager
median (on a machine other processes share, eager before and after the window can differ 20x:
this compares calls made at the same moment; the builds get none of eager's calls' time).
``--inductor``: Inductor's first call as well, in a fresh process with empty caches
(perf/compiled.py's protocol), for the ratio of the first calls. The policies run one after
another on the same machine: compare them within one run. Outputs are compared with eager's.
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
from typing import Any

__all__ = ["DEFAULT_MODEL", "main", "per_second", "run_policy", "window"]

DEFAULT_MODEL = "llama-tiny"


def per_second(calls: list[tuple[float, float]], eager_s: float, seconds: int,
               eager_calls: list[tuple[float, float]] | None = None) -> list[dict[str, Any]]:
    """``calls`` (start, duration; seconds from the window's start) by whole second of their start:
    how many, their median and mean over ``eager_s`` (eager's median call); with ``eager_calls``
    (eager's calls interleaved with them) also their median over the median of eager's calls in
    the same second (``None`` where that second has none)."""
    rows = []
    for sec in range(seconds):
        ds = [d for t, d in calls if sec <= t < sec + 1]
        row: dict[str, Any] = {"second": sec, "calls": len(ds),
                               "median_ms": round(statistics.median(ds) * 1e3, 4) if ds else None,
                               "median_over_eager": round(statistics.median(ds) / eager_s, 3) if ds else None,
                               "mean_over_eager": round(statistics.fmean(ds) / eager_s, 3) if ds else None}
        if eager_calls is not None:
            es = [d for t, d in eager_calls if sec <= t < sec + 1]
            row["eager_calls"] = len(es)
            row["median_over_same_second_eager"] = (round(statistics.median(ds) / statistics.median(es), 3)
                                                    if ds and es else None)
        rows.append(row)
    return rows


def _timed_for(fn: Any, args: list[Any], seconds: float) -> list[float]:
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return times


def window(name: str, seconds: float, policy: str, eager_s: float, eager_every: int = 0) -> dict[str, Any]:
    """One policy's run, in this process (its caches should be empty: ``run_policy``); the
    policy is the environment's again after it. ``eager_every``: every that many calls of the
    window one is eager's instead, with the compilers stopped for it (eager as it runs with no
    build, at the same moment: on a machine others share, the only fair reference; the builds
    get none of those calls' time)."""
    from runtime.machine import threads

    if eager_every == 1:
        raise ValueError("eager_every=1 leaves the window no call of the compiled model")
    threads.use_policy(policy)
    try:
        return _window(name, seconds, policy, eager_s, eager_every)
    finally:
        threads.use_policy(None)


def _window(name: str, seconds: float, policy: str, eager_s: float, eager_every: int) -> dict[str, Any]:
    import torch

    from runtime.codegen.build import background_builds_under_way, wait_for_background_builds
    from runtime.dynamo import registered_by_name
    from runtime.machine import pause, threads

    from .compiled import MODELS, _max_diff

    registered_by_name()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model, args = MODELS[name]()
    with torch.no_grad():
        want = model(*args)
        before = _timed_for(model, args, eager_s)
        compiled = torch.compile(model, backend="fuseg")
        t0 = time.perf_counter()
        compiled(*args)
        start = time.perf_counter()
        first_s = start - t0
        calls: list[tuple[float, float]] = []
        eager_calls: list[tuple[float, float]] = []
        ended = None if background_builds_under_way() else 0.0
        while (now := time.perf_counter()) - start < seconds or not calls:
            if eager_every and (len(calls) + len(eager_calls)) % eager_every == eager_every - 1:
                with pause.held():
                    now = time.perf_counter()
                    model(*args)
                    eager_calls.append((now - start, time.perf_counter() - now))
                continue
            got = compiled(*args)
            calls.append((now - start, time.perf_counter() - now))
            if ended is None and not background_builds_under_way():
                ended = time.perf_counter() - start
        wait_for_background_builds()  # (eager's calls after the window, with no compiler beside them)
        after = _timed_for(model, args, eager_s)
    eager = statistics.median(before + after)
    n = max(1, math.ceil(seconds))
    window_s = sum(d for _, d in calls)
    return {"policy": policy, "model": name, "threads": torch.get_num_threads(), "cores": threads.cores(),
            "first_call_s": round(first_s, 4), "builds_ended_s": None if ended is None else round(ended, 3),
            "eager_median_ms": round(eager * 1e3, 4),
            "eager_before_ms": round(statistics.median(before) * 1e3, 4),
            "eager_after_ms": round(statistics.median(after) * 1e3, 4),
            "calls": len(calls), "eager_calls_in_window": round(window_s / eager, 1),
            "window_mean_over_eager": round(window_s / len(calls) / eager, 3),
            "last_second_median_over_eager": per_second(calls, eager, n)[-1]["median_over_eager"],
            "slowest_call_s": round(max(d for _, d in calls), 4),
            "slowest_call_at_s": round(max(calls, key=lambda c: c[1])[0], 3),
            "eager_every": eager_every,
            "window_over_interleaved_eager": (round(statistics.median(d for _, d in calls)
                                                    / statistics.median(d for _, d in eager_calls), 3)
                                              if eager_calls else None),
            "window_mean_over_interleaved_eager_mean": (round(statistics.fmean(d for _, d in calls)
                                                              / statistics.fmean(d for _, d in eager_calls), 3)
                                                        if eager_calls else None),
            "max_diff": _max_diff(got, want),
            "seconds": per_second(calls, eager, n, eager_calls if eager_every else None)}


def run_policy(name: str, seconds: float, policy: str, eager_s: float, eager_every: int = 0,
               setup: str = "") -> dict[str, Any]:
    """``window`` in a fresh process with empty kernel caches and fuseg's default of background
    builds for inference graphs; ``setup``: Python run in that process first (an experiment's
    "before": perf/experiments/builds_share.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
                   FUSEG_CACHE_DIR=os.path.join(tmp, "fuseg"))
        for var in ("FUSEG_BACKGROUND_BUILDS", "FUSEG_BUILD_THREADS"):
            env.pop(var, None)
        code = (f"{setup}\nimport json; from perf.first_window import window; "
                f"print(json.dumps(window({name!r}, {seconds!r}, {policy!r}, {eager_s!r}, {eager_every!r})))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip()[-2000:] or f"exit {r.returncode}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def _line(r: dict[str, Any]) -> str:
    key = "median_over_same_second_eager" if r.get("eager_every") else "mean_over_eager"
    secs = " ".join("-" if s[key] is None else f"{s[key]:.2f}" for s in r["seconds"])
    return (f"{r['policy']:12s} first {r['first_call_s']:.2f}s  builds ended {r['builds_ended_s']}s  "
            f"calls {r['calls']} (eager's {r['eager_calls_in_window']})  mean/eager {r['window_mean_over_eager']}  "
            f"slowest {r['slowest_call_s']:.2f}s at {r['slowest_call_at_s']:.1f}s  "
            f"eager {r['eager_median_ms']:.3f} ms\n    per second, {key.replace('_', ' ')}: {secs}")


def main(argv: list[str] | None = None) -> int:
    from runtime.autotune import machine
    from runtime.machine.threads import POLICIES

    from .bench import environment

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--window", type=float, default=30.0, help="seconds of calls after the first (30)")
    ap.add_argument("--eager", type=float, default=3.0, help="seconds of eager calls before and after (3)")
    ap.add_argument("--policies", default="calls-first,cores",
                    help=f"comma-separated, each in a fresh process: {', '.join(POLICIES)}")
    ap.add_argument("--eager-every", type=int, default=0,
                    help="every N-th call of the window eager's, the compilers stopped for it (0: none)")
    ap.add_argument("--inductor", action="store_true", help="Inductor's first call too (a fresh process)")
    ap.add_argument("--out", help="write the record (JSON) here")
    a = ap.parse_args(argv)
    if a.eager_every == 1 or a.eager_every < 0:
        ap.error("--eager-every: 0 (none) or 2 or more")
    policies = [p for p in a.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    rows = []
    for p in policies:
        rows.append(run_policy(a.model, a.window, p, a.eager, a.eager_every))
        print(_line(rows[-1]), flush=True)
    record: dict[str, Any] = {"protocol": "perf.first_window", "model": a.model, "window_s": a.window,
                              "eager_s": a.eager, "eager_every": a.eager_every, "machine": machine(), "environment": environment("cpu"), "rows": rows}
    if a.inductor:
        from .compiled import _first_call

        record["inductor_first_call_s"] = _first_call(a.model, "inductor")["first_s"]
        for r in rows:
            r["first_over_inductor"] = round(r["first_call_s"] / record["inductor_first_call_s"], 3)
        print(f"inductor first call {record['inductor_first_call_s']:.2f}s; fuseg's over it: "
              + ", ".join(f"{r['policy']} {r['first_over_inductor']}" for r in rows))
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
