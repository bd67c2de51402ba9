"""The short summary at the end of perf/gpu_validate.sh: what each step did, and issue 44's goals.

    python -m perf.gpu.gpu_summary OUT_DIR [--tag h100]

Reads what the script left in ``OUT_DIR``: ``steps.txt`` (one line a step: name, exit status,
seconds, budget), the test shards' JUnit files, the dynamic-shapes records, the compiled-model
record and the bandwidth record; prints the summary and writes it to ``gpu_validate_summary_<tag>.txt`` beside them.
Every figure comes from those files; a step that left none is reported as missing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET
from typing import Any

__all__ = ["main", "summarize", "junit_counts"]


def junit_counts(paths: list[str]) -> dict[str, Any]:
    """Totals over JUnit files, and the ids of the tests that failed or errored."""
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "files": len(paths), "failed": []}
    for p in paths:
        try:
            root = ET.parse(p).getroot()
        except (ET.ParseError, OSError) as e:
            total.setdefault("unreadable", []).append(f"{os.path.basename(p)}: {e}")
            continue
        for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
            for k in ("tests", "failures", "errors", "skipped"):
                total[k] += int(suite.get(k, 0))
            for case in suite.iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    total["failed"].append(f"{case.get('classname')}::{case.get('name')}")
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return total


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _fmt(x: Any, spec: str = "{:.2f}") -> str:
    return spec.format(x) if isinstance(x, (int, float)) else "-"


def summarize(out: str, tag: str) -> str:
    lines = [f"GPU validation summary ({tag}), from {out}"]
    steps = os.path.join(out, "steps.txt")
    if os.path.exists(steps):
        with open(steps) as f:
            lines += ["steps:"] + [f"  {line.rstrip()}" for line in f if line.strip()]
    env = _load(os.path.join(out, f"gpu_env_{tag}.json"))
    if env:
        lines.append("device: " + ", ".join(f"{k} {env.get(k)}" for k in
                                            ("gpu", "driver", "cuda", "torch", "cupy", "triton", "git_commit")))
    t = junit_counts(sorted(glob.glob(os.path.join(out, f"gpu_tests_{tag}_shard*.xml"))))
    if t["files"]:
        lines.append(f"tests: {t['passed']} passed, {t['failures']} failed, {t['errors']} errors, "
                     f"{t['skipped']} skipped of {t['tests']} ({t['files']} shards)")
        lines += [f"  FAILED {name}" for name in t["failed"][:40]]
        if len(t["failed"]) > 40:
            lines.append(f"  ... and {len(t['failed']) - 40} more")
    else:
        lines.append("tests: no JUnit file (the step did not run or was cut)")
    compiled = _load(os.path.join(out, f"gpu_compiled_{tag}.json"))
    if compiled:
        lines.append(f"compiled models ({compiled.get('command', '')}), medians in ms:")
        for r in compiled.get("rows", []):
            errors = [k for k in r if k.endswith("_error")]
            replays = [p.get("counts", {}) and p["counts"].get("replayed") for p in r.get("fuseg_graphs_programs", [])]
            refused = sorted({p["refused"] for p in r.get("fuseg_graphs_programs", []) if p.get("refused")})
            lines.append(
                f"  {r['model']:>13}  eager {_fmt(r.get('eager_ms'), '{:.3f}')}  inductor {_fmt(r.get('inductor_ms'), '{:.3f}')}"
                f"  inductor_ro {_fmt(r.get('inductor_ro_ms'), '{:.3f}')}  fuseg {_fmt(r.get('fuseg_ms'), '{:.3f}')}"
                f"  fuseg_graphs {_fmt(r.get('fuseg_graphs_ms'), '{:.3f}')}"
                f"  graphs/inductor {_fmt(r.get('fuseg_graphs_vs_inductor'))}"
                f"  graphs/inductor_ro {_fmt(r.get('fuseg_graphs_vs_inductor_ro'))}  replays {replays}"
                + (f"  not captured: {refused}" if refused else "") + (f"  errors: {errors}" if errors else ""))
        part = compiled.get("summary", {}).get("all", {})
        lines.append(f"  missed: slower than Inductor {part.get('fuseg_graphs_not_faster_than_inductor')}; "
                     f"above 1.1x reduce-overhead {part.get('fuseg_graphs_above_1.1x_inductor_ro')}; "
                     f"models asked {len(compiled.get('models_asked', []))}, done {len(compiled.get('rows', []))}")
    else:
        lines.append("compiled models: no record")
    fused = _load(os.path.join(out, f"gpu_compiled_bias_fused_{tag}.json"))
    if fused and compiled:
        lines.append("A matmul's bias after it (Note [a matmul's bias after it]): fuseg's time in ms with "
                     "FUSEG_BIAS_AFTER_MATMUL=0 (before, step bias) and on (after, step compiled), one run:")
        now = {r["model"]: r for r in compiled.get("rows", [])}
        for r in fused.get("rows", []):
            a = now.get(r["model"], {})
            parts = []
            for v in ("fuseg", "fuseg_graphs"):
                b_ms, a_ms = r.get(f"{v}_ms"), a.get(f"{v}_ms")
                ratio = a_ms / b_ms if a_ms and b_ms else None
                parts.append(f"{v} before {_fmt(b_ms, '{:.3f}')} after {_fmt(a_ms, '{:.3f}')} after/before {_fmt(ratio)}")
            lines.append(f"  {r['model']:>13}  " + "  ".join(parts))
    _dynamic(lines, out, tag)
    bw = _load(os.path.join(out, f"gpu_bandwidth_{tag}.json"))
    if bw:
        lines.append("bandwidth (time / copy of the floor's bytes; the profiler's kernel time in brackets):")
        for r in bw.get("rows", []):
            if "error" in r:
                lines.append(f"  {r['case']:>24}  ERROR {r['error'][:120]}")
                continue
            lines.append(f"  {r['case']:>24}  fuseg/copy {_fmt(r.get('fuseg_vs_copy'))} ({_fmt(r.get('fuseg_device_vs_copy'))})"
                         f"  fuseg/eager {_fmt(r.get('fuseg_vs_eager'))}  fuseg/inductor {_fmt(r.get('fuseg_vs_inductor'))}"
                         f"  {_fmt(r.get('fuseg_GBps'), '{:.0f}')} GB/s (copy {_fmt(r.get('copy_GBps'), '{:.0f}')})"
                         + ("" if r.get("fuseg_ok", True) else "  MISMATCH"))
        s = bw.get("summary", {})
        lines.append(f"  missed: above target {s.get('above_target')}; rows not faster than eager or Inductor "
                     f"{s.get('rows_not_faster_than_eager_or_inductor')}")
    else:
        lines.append("bandwidth: no record")
    _before_after(lines, bw, _load(os.path.join(out, f"gpu_bandwidth_before_{tag}.json")),
                  "CUDA tuning (Note [CUDA launch shapes]): fuseg's time with FUSEG_CUDA_TUNING=0 (before) "
                  "and on (after), one run; after/before of the wall time and of the profiler's kernel time "
                  "(a small case's wall time is mostly the host's):")
    _before_after(lines, bw, _load(os.path.join(out, f"gpu_bandwidth_loads_{tag}.json")),
                  "Loads kept (Note [row registers] in runtime/codegen/lowering/rows.py, Note [elements along a broadcast "
                  "dim] in lower.py): fuseg's time with FUSEG_ROW_REGS=0 FUSEG_BCAST_EPT=0 (before) and on "
                  "(after), one run:")
    _before_after(lines, bw, _load(os.path.join(out, f"gpu_bandwidth_whole_off_{tag}.json")),
                  "A small dim taken whole (Note [elements along a broadcast dim]): fuseg's time with "
                  "FUSEG_BCAST_WHOLE=0 (before) and on (after, the bandwidth step), one run:")
    gk = _load(os.path.join(out, f"gpu_kernels_{tag}.json"))
    for r in (gk or {}).get("rows", []):
        parts = [f"{v} {r[v]['kernels_per_call']:.0f} kernels {r[v]['us_per_call']:.1f} us" for v in r
                 if isinstance(r[v], dict) and "us_per_call" in r[v]]
        lines.append(f"kernels per call (perf.gpu.gpu_kernels), {r['model']}: " + ", ".join(parts))
    lo = _load(os.path.join(out, f"gpu_launch_overhead_{tag}.json"))
    if lo:
        lines.append("host time per call of a one-kernel program, us: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in lo.get("us_per_call", {}).items())
                     + (f"; graphs refused: {lo['cuda_graph_refused']}" if lo.get("cuda_graph_refused") else ""))
    rope = _load(os.path.join(out, f"gpu_launch_overhead_rope_{tag}.json"))
    if rope:
        lines.append("host time per call of the rope-seed program (medians of alternating rounds), us: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in rope.get("us_per_call", {}).items()))
    return "\n".join(lines) + "\n"


def _dynamic(lines: list[str], out: str, tag: str) -> None:
    """perf.dynamic_shapes' records of the step ``dynamic`` (issue 41): per backend, the seconds of
    the first two lengths and the steady state; for fuseg its builds (NVRTC compiles) per length,
    whether its tokens (generation) or its loss and gradients (training) matched eager's, and its
    symbolic plans or why a graph got none."""
    for kind in ("generate", "train"):
        rec = _load(os.path.join(out, f"gpu_dynamic_{kind}_{tag}.json"))
        if rec is None:
            lines.append(f"dynamic shapes ({kind}): no record")
            continue
        for model, res in rec.get("results", {}).items():
            for r in res.get("runs", []):
                head = f"dynamic shapes ({kind}), {model}, {r.get('backend')}:"
                if "error" in r:
                    lines.append(f"{head} ERROR {' '.join(r['error'])[:200]}")
                    continue
                ms = {k: r[k] * 1e3 if isinstance(r.get(k), (int, float)) else None for k in ("new", "steady")}
                parts = [f"first {_fmt(r.get('first'))} s, second {_fmt(r.get('second'))} s, "
                         f"new {_fmt(ms['new'], '{:.1f}')} ms, steady {_fmt(ms['steady'], '{:.1f}')} ms"]
                if r.get("kernel_builds") is not None:
                    parts.append(f"builds per length {r['kernel_builds']}")
                if "tokens_equal_eager" in r:
                    eq = r["tokens_equal_eager"] + r.get("tokens_equal_eager_later_lengths", [])
                    parts.append(f"tokens equal eager's {sum(eq)} of {len(eq)}")
                if "max_grad_diff" in r:
                    parts.append(f"loss / gradient max diff {r['max_loss_diff']:.1e} / {r['max_grad_diff']:.1e}")
                secs = r.get("seconds") or []
                if len(secs) > 2:  # the slowest call once dynamo has made the graphs dynamic, and its full collections
                    k = max(range(2, len(secs)), key=secs.__getitem__)
                    gc_ms = (r.get("full_gc_ms") or [None] * len(secs))[k]
                    parts.append(f"slowest from the third call {secs[k] * 1e3:.1f} ms (call {k + 1}, full collections "
                                 f"{'not recorded' if gc_ms is None else f'{gc_ms:.0f} ms'})")
                prof = r.get("profile")
                if prof:  # (perf.dynamic_shapes --profile: one generate under the profiler)
                    parts.append(f"profiled generate {prof['wall_ms']:.0f} ms: {prof['device_kernels']} device kernels "
                                 f"({prof['device_ms']:.1f} ms), {prof['launch_calls']} launch calls, "
                                 f"{prof['aten_calls']} ATen calls")
                plans = r.get("fuseg_programs")
                if plans:
                    parts.append(f"symbolic plans {plans.get('symbolic_plans')}, specialized "
                                 f"{plans.get('specialized_programs')}, refused {plans.get('symbolic_refused')}")
                lines.append(f"{head} " + "; ".join(parts))
            ratios = res.get("ratios") or {}
            if "fuseg_second_over_aot_eager_second" in ratios:
                lines.append(f"  fuseg second / aot_eager second {ratios['fuseg_second_over_aot_eager_second']:.2f}; "
                             f"new / steady {_fmt(ratios.get('fuseg_new_over_steady'))}")
            if "fuseg_steady_over_inductor" in ratios:  # (issue 41: at or under Inductor's steady state)
                lines.append(f"  fuseg / Inductor: steady {_fmt(ratios['fuseg_steady_over_inductor'])}, settled after the "
                             f"builds {_fmt(ratios.get('fuseg_settled_after_builds_over_inductor'))}, first "
                             f"{_fmt(ratios.get('fuseg_first_over_inductor'))}")


def _before_after(lines: list[str], bw: dict[str, Any] | None, before: dict[str, Any] | None, heading: str) -> None:
    """fuseg's time in ``before`` (a bandwidth record made with a change switched off) beside the
    bandwidth record's, case by case: wall time and the profiler's kernel time."""
    if not (before and bw):
        return
    lines.append(heading)
    was = {r["case"]: r for r in before.get("rows", []) if "error" not in r}
    for r in bw.get("rows", []):
        b = was.get(r["case"])
        if b is None or "error" in r or not b.get("fuseg_ms") or not r.get("fuseg_ms"):
            continue
        dev = (f"  kernel {b['fuseg_device_ms']:.4f} -> {r['fuseg_device_ms']:.4f} ms, after/before "
               f"{r['fuseg_device_ms'] / b['fuseg_device_ms']:.2f}"
               if b.get("fuseg_device_ms") and r.get("fuseg_device_ms") else "")
        lines.append(f"  {r['case']:>24}  before {b['fuseg_ms']:.4f} ms  after {r['fuseg_ms']:.4f} ms  "
                     f"after/before {r['fuseg_ms'] / b['fuseg_ms']:.2f}  before/copy {_fmt(b.get('fuseg_vs_copy'))}"
                     + dev)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--tag", default="gpu")
    a = p.parse_args(argv)
    text = summarize(a.out, a.tag)
    with open(os.path.join(a.out, f"gpu_validate_summary_{a.tag}.txt"), "w") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
