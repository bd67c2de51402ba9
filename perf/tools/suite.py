"""``fuseg profile --suite transformers``: every architecture transformers ships, profiled.

Each architecture is built as ``hf:ARCH`` (perf/hf.py: its config class, small sizes, random
weights) and profiled like any target (perf/tools/profile.py's record); one that does not build,
capture or segment gets a row with its stage and the reason instead, so the sweep reports a
pass rate. ``--limit``, ``--filter`` (a regular expression on the name) and ``--shard I/N``
(Note [shards of a sweep], perf/shards.py) choose the architectures.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pandas as pd

from .. import hf
from ..targets import from_factory
from .profile import COLUMNS, MODES, profile_target

__all__ = ["SUITE_COLUMNS", "names", "run_suite", "summary", "write_table"]

SUITE_COLUMNS = ["model", "status", "stage", "error", "seconds"] + [c for c in COLUMNS if c != "model" and
                                                                   not c.startswith("nvfuser")]


def names(pattern: str | None = None, limit: int | None = None) -> list[str]:
    """The suite's architectures (``hf.architectures()``), matching ``pattern``, the first ``limit``."""
    found = [a for a in hf.architectures() if pattern is None or re.search(pattern, a)]
    return found[:limit] if limit is not None else found


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' and torch's own warnings and error logs (a FakeTensor op that failed is logged
    at ERROR before it raises): the row keeps the reason, the terminal keeps the progress bar."""
    loggers = [logging.getLogger(n) for n in ("torch._subclasses.fake_tensor", "transformers", "torch.export")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class ArchTimeout(Exception):
    """An architecture that took longer than the suite gives one."""


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``ArchTimeout`` in this thread after ``seconds`` (SIGALRM: the main thread of a
    Unix process only; elsewhere no limit), so one slow architecture cannot stall a sweep."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(_signum: int, _frame: Any) -> None:
        raise ArchTimeout(f"took longer than {seconds:g} s (--arch-timeout)")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _why(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:300]


def _one(arch: str, real_size: bool, inductor: bool, timeout: float | None = None) -> dict[str, Any]:
    spec = f"hf:{arch}"
    row: dict[str, Any] = {"model": arch, "status": "ok", "stage": "", "error": ""}
    t0 = time.perf_counter()
    stage = "build"
    try:
        with _quiet(), _time_limit(timeout):
            model, inputs = hf.build(spec, real_size=real_size)
            stage = "capture"
            target = from_factory((model, inputs), spec)
            stage = "segment"
            row.update(profile_target(arch, target, inductor=False))
            if inductor and not real_size:
                stage = "inductor"
                from .profile import inductor_kernels

                row["inductor_kernels"] = inductor_kernels(target.fn, target.inputs or [])
    except Exception as e:  # noqa: BLE001 - each architecture's failure is a row with its reason
        row.update(status="failed", stage=stage, error=_why(e))
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def run_suite(archs: list[str], real_size: bool = False, inductor: bool = False,
              progress: bool = True, timeout: float | None = 300) -> pd.DataFrame:
    """One row per architecture (``SUITE_COLUMNS``), with a progress bar on stderr; ``timeout``:
    the seconds one architecture may take (its row then says so)."""
    from tqdm import tqdm

    rows = []
    bar = tqdm(archs, desc="transformers", unit="arch", disable=not progress, dynamic_ncols=True)
    for arch in bar:
        bar.set_postfix_str(arch)
        rows.append(_one(arch, real_size, inductor, timeout))
    df = pd.DataFrame(rows, columns=SUITE_COLUMNS)
    for c in SUITE_COLUMNS[5:]:  # counts stay integers beside a failed row's empty cells
        if c != "segment_ms":
            df[c] = df[c].astype("Int64")
    return df


def summary(df: pd.DataFrame) -> str:
    """The pass rate, then per alias mode the mean segments, kernels and metadata ops of the rows that passed."""
    ok = df[df["status"] == "ok"]
    lines = [f"transformers suite: {len(ok)}/{len(df)} architectures profiled"
             f" ({100 * len(ok) / max(len(df), 1):.0f}% pass rate)"]
    if not ok.empty:
        for mode in MODES:
            lines.append(f"  {mode:4s}: segments {ok[f'{mode}_segments'].sum():.0f}, kernels "
                         f"{ok[f'{mode}_kernels'].sum():.0f}, metadata ops {ok[f'{mode}_metadata'].sum():.0f} "
                         f"(over {len(ok)} models)")
        if ok["inductor_kernels"].notna().any():
            lines.append(f"  Inductor: kernels {ok['inductor_kernels'].sum():.0f}")
    failed = df[df["status"] != "ok"]
    if not failed.empty:
        lines.append("failures:")
        lines += [f"  {r.model} ({r.stage}): {r.error}" for r in failed.itertuples(index=False)]
    return "\n".join(lines)


def write_table(df: pd.DataFrame, path: str) -> None:
    """The table as the file's extension says: .csv, .md (markdown), .html (a JSON sweep record
    is written by the caller: it carries the shard and the environment)."""
    if path.endswith(".csv"):
        df.to_csv(path, index=False)
    elif path.endswith(".md"):
        from .profile import render

        with open(path, "w") as f:
            f.write(render(df, "markdown") + "\n")
    elif path.endswith(".html"):
        df.to_html(path, index=False, na_rep="")
    else:
        raise OSError(f"--out {path}: expected a .json, .csv, .md or .html file")
