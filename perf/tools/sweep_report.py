"""``fuseg report BASELINE.json CURRENT.json`` on two sweep records (``fuseg profile --suite ...
--out X.json``, merged or not): what changed, exit 1 on a regression.

Rows are matched by model. A regression is: a model that passed and now fails or is missing; a
lower pass rate; more segments, kernels, launches or bytes moved in any alias mode; or a slower
segmentation by the time rule.

Note [one timing per row]: a sweep times each model's
segmentation once, so there is no spread to compare as ``fuseg bench``'s rule does
(perf/tools/report.py); a row is slower when its time grew by more than ``threshold`` (relative) *and*
by more than ``floor_ms`` (absolute), a noise floor standing for the spread it lacks; the sum
over the models both passed is compared by the same rule.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from .profile import MODES
from .report import Report, ReportError

__all__ = ["COUNTED", "compare_sweeps", "is_sweep"]

#: per alias mode, the counts where more is worse
COUNTED = ("segments", "kernels", "launches", "bytes_moved")


def is_sweep(path: str) -> bool:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("kind") == "fuseg-sweep" and not any(
        isinstance(r, dict) and "variant" in r for r in data.get("rows", []))


def _load(path: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("kind") != "fuseg-sweep":
        raise ReportError(f"{path}: not a fuseg sweep record")
    return data, {str(r["model"]): r for r in data["rows"]}


def _ok(row: dict[str, Any] | None) -> bool:
    return row is not None and row.get("status", "ok") == "ok"


def _slower(b: float, c: float, threshold: float, floor_ms: float) -> int:
    """1 slower, -1 faster, 0 within the noise (Note [one timing per row])."""
    if c > b * (1 + threshold) and c - b > floor_ms:
        return 1
    if c < b / (1 + threshold) and b - c > floor_ms:
        return -1
    return 0


def compare_sweeps(baseline: str, current: str, threshold: float = 0.1, floor_ms: float = 5.0) -> Report:
    if threshold < 0 or floor_ms < 0:
        raise ReportError("--threshold and --floor-ms must not be negative")
    rec_b, base = _load(baseline)
    rec_c, cur = _load(current)
    rep = Report(pd.DataFrame(), threshold=threshold,
                 time_rule=f"segmentation time: {threshold:.0%} and {floor_ms:g} ms more (one timing per model)")
    for key in ("sweep", "options", "environment"):
        if rec_b.get(key) != rec_c.get(key):
            rep.notes.append(f"{key} differs: baseline {rec_b.get(key)!r}, current {rec_c.get(key)!r}")
    rate_b = sum(map(_ok, base.values())) / max(len(base), 1)
    rate_c = sum(map(_ok, cur.values())) / max(len(cur), 1)
    if rate_c < rate_b:
        rep.regressions.append(f"pass rate {rate_b:.1%} -> {rate_c:.1%}")
    elif rate_c > rate_b:
        rep.improvements.append(f"pass rate {rate_b:.1%} -> {rate_c:.1%}")
    records, total_b, total_c = [], 0.0, 0.0
    for name in sorted(set(base) | set(cur)):
        b, c = base.get(name), cur.get(name)
        if c is None:
            rep.regressions.append(f"{name}: missing from the current record")
            continue
        if b is None:
            rep.notes.append(f"{name}: new in the current record ({c.get('status', 'ok')})")
            continue
        if _ok(b) and not _ok(c):
            rep.regressions.append(f"{name}: now fails ({c.get('stage')}: {c.get('error')})")
        elif not _ok(b) and _ok(c):
            rep.improvements.append(f"{name}: now passes")
        if not (_ok(b) and _ok(c)):
            continue
        for mode in MODES:
            for k in COUNTED:
                key = f"{mode}_{k}"
                if b.get(key) is not None and c.get(key) is not None and b[key] != c[key]:
                    (rep.regressions if c[key] > b[key] else rep.improvements).append(
                        f"{name}: {key} {b[key]} -> {c[key]}")
        bt, ct = b.get("segment_ms"), c.get("segment_ms")
        verdict = ""
        if bt is not None and ct is not None:
            total_b, total_c = total_b + bt, total_c + ct
            v = _slower(bt, ct, threshold, floor_ms)
            if v:
                (rep.regressions if v > 0 else rep.improvements).append(
                    f"{name}: segment_ms {bt:.4g} -> {ct:.4g}")
                verdict = "slower" if v > 0 else "faster"
        records.append({"model": name, "baseline_ms": bt, "current_ms": ct, "verdict": verdict,
                        "post_kernels": f"{b.get('post_kernels')} -> {c.get('post_kernels')}",
                        "post_segments": f"{b.get('post_segments')} -> {c.get('post_segments')}"})
    v = _slower(total_b, total_c, threshold, floor_ms)
    if v:
        (rep.regressions if v > 0 else rep.improvements).append(
            f"all models' segment_ms {total_b:.4g} -> {total_c:.4g}")
    rep.table = pd.DataFrame(records, columns=["model", "baseline_ms", "current_ms", "verdict", "post_kernels",
                                               "post_segments"])
    return rep
