"""``fuseg report BASELINE.json CURRENT.json``: what changed between two ``fuseg bench`` records.

Rows are matched by (model, variant). Counts (kernels launched, kernels and launches planned,
metadata ops) are compared exactly: more is a regression, fewer an improvement. Times are
compared with a noise-aware rule: a regression is a median slower by more than ``threshold``
(relative) *and* a current 10th percentile above the baseline's 90th (the spreads do not
overlap); improvements are the mirror image. A variant whose outputs stopped matching eager, that
now fails, or that is missing from the current record is a regression. The command exits 1 when
there is any regression, so CI can gate on it.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["Report", "ReportError", "compare", "render_html", "render_markdown"]

COUNTS = ("kernels_launched", "kernels_planned", "launches_planned", "metadata_ops")


class ReportError(ValueError):
    """An input that is not a fuseg bench record."""


@dataclass
class Report:
    table: pd.DataFrame
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    threshold: float = 0.1
    #: how times were compared (None: ``fuseg bench``'s rule, below)
    time_rule: str | None = None


def _load(path: str) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ReportError(f"{path}: not a fuseg bench record (expected an object with a 'rows' list)")
    rows = {}
    for k, r in enumerate(data["rows"]):
        if not isinstance(r, dict) or not isinstance(r.get("model"), str) or not isinstance(r.get("variant"), str):
            raise ReportError(f"{path}: rows[{k}] has no string 'model' and 'variant'")
        rows[(r["model"], r["variant"])] = r
    return data.get("environment") or {}, rows


def compare(baseline: str, current: str, threshold: float = 0.1) -> Report:
    if threshold < 0:
        raise ReportError("--threshold must not be negative")
    env_b, base = _load(baseline)
    env_c, cur = _load(current)
    rep = Report(pd.DataFrame(), threshold=threshold)
    for key in ("device", "gpu", "torch"):
        if env_b.get(key) != env_c.get(key):
            rep.notes.append(f"{key} differs: baseline {env_b.get(key)!r}, current {env_c.get(key)!r}"
                             " (times are not comparable across machines)")
    records = []
    for key in sorted(set(base) | set(cur)):
        name = f"{key[0]} / {key[1]}"
        b, c = base.get(key), cur.get(key)
        if c is None:
            rep.regressions.append(f"{name}: missing from the current record")
            continue
        if b is None:
            rep.notes.append(f"{name}: new in the current record")
            continue
        if c.get("error") and not b.get("error"):
            rep.regressions.append(f"{name}: now fails ({c['error']})")
            continue
        if b.get("ok") is not False and c.get("ok") is False:
            rep.regressions.append(f"{name}: outputs no longer match eager (max abs diff {c.get('max_abs_diff')})")
        for k in COUNTS:
            if b.get(k) is not None and c.get(k) is not None and b[k] != c[k]:
                (rep.regressions if c[k] > b[k] else rep.improvements).append(f"{name}: {k} {b[k]} -> {c[k]}")
        bm, cm = b.get("median_ms"), c.get("median_ms")
        verdict = ""
        if bm and cm:
            ratio = cm / bm
            if ratio > 1 + threshold and c.get("p10_ms", cm) > b.get("p90_ms", bm):
                rep.regressions.append(f"{name}: median {bm:.4g} ms -> {cm:.4g} ms ({ratio:.2f}x)")
                verdict = "slower"
            elif ratio < 1 / (1 + threshold) and c.get("p90_ms", cm) < b.get("p10_ms", bm):
                rep.improvements.append(f"{name}: median {bm:.4g} ms -> {cm:.4g} ms ({ratio:.2f}x)")
                verdict = "faster"
        else:
            ratio = None
        records.append({"model": key[0], "variant": key[1], "baseline_ms": bm, "current_ms": cm,
                        "ratio": None if ratio is None else round(ratio, 3), "verdict": verdict,
                        "kernels": f"{b.get('kernels_launched')} -> {c.get('kernels_launched')}"})
    rep.table = pd.DataFrame(records, columns=["model", "variant", "baseline_ms", "current_ms", "ratio", "verdict",
                                               "kernels"])
    return rep


def _markdown_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no rows in common)"
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns)
    def fmt(v):
        return (f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v)))
    return head + "\n" + "\n".join("| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False))


def render_markdown(rep: Report) -> str:
    out = [f"# fuseg report: {len(rep.regressions)} regression(s), {len(rep.improvements)} improvement(s)",
           rep.time_rule or f"time threshold: {rep.threshold:.0%} on the median, with non-overlapping 10-90% spreads",
           ""]
    for title, items in (("Regressions", rep.regressions), ("Improvements", rep.improvements), ("Notes", rep.notes)):
        if items:
            out += [f"## {title}", *[f"- {i}" for i in items], ""]
    out += ["## All rows", _markdown_table(rep.table)]
    return "\n".join(out)


def render_html(rep: Report, path: str) -> None:
    plot = ""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        df = rep.table.dropna(subset=["ratio"])
        if not df.empty:
            fig, ax = plt.subplots(figsize=(8, max(3, 0.25 * len(df))))
            ax.barh([f"{m} / {v}" for m, v in zip(df.model, df.variant)], df.ratio)
            ax.axvline(1.0, color="k", lw=0.8)
            ax.set_xlabel("current / baseline median time")
            plt.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100)
            plt.close(fig)
            plot = f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
    except ImportError:
        plot = "<p>(no plot: matplotlib is not installed; pip install -e '.[plot]')</p>"
    lists = "".join(f"<h2>{t}</h2><ul>{''.join(f'<li>{i}</li>' for i in items)}</ul>"
                    for t, items in (("Regressions", rep.regressions), ("Improvements", rep.improvements),
                                     ("Notes", rep.notes)) if items)
    html = (f"<html><head><meta charset='utf-8'><title>fuseg report</title></head><body>"
            f"<h1>fuseg report: {len(rep.regressions)} regression(s)</h1>{lists}{plot}"
            f"{rep.table.to_html(index=False)}</body></html>")
    with open(path, "w") as f:
        f.write(html)
