"""Sweeps split over machines: ``--shard I/N`` and ``fuseg report merge``.

Note [shards of a sweep]: a sweep's names are sorted and shard I of N (1 <= I <= N) takes every
N-th from the I-th (``sorted(names)[I-1::N]``): the shards are disjoint, their union is the
whole list, their sizes differ by at most one, and the split depends on nothing but the list,
so N machines (a CI matrix, a Slurm array) split it alike without talking to each other. Each
shard writes a sweep record (``record``): its rows, its shard, the whole list's size and digest,
and the environment. ``merge`` joins the records of one sweep and refuses, with the reason, a
shard given twice, rows in two shards, or records of different sweeps, lists, options or
environments (torch, transformers, python): their rows would not compare.
"""

from __future__ import annotations

import hashlib
import json
import platform
from typing import Any

__all__ = ["ShardError", "environment", "merge", "parse_shard", "record", "select"]

KIND = "fuseg-sweep"


class ShardError(ValueError):
    """A bad --shard, or sweep records that do not merge."""


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ShardError(f"--shard {text!r}: expected I/N, e.g. 1/4") from None
    if not 1 <= i <= n:
        raise ShardError(f"--shard {text!r}: I must be between 1 and N")
    return i, n


def select(names: list[str], shard: tuple[int, int] | None) -> list[str]:
    """Shard ``shard`` of ``names`` (Note [shards of a sweep]); all of them for None."""
    if shard is None:
        return list(names)
    i, n = shard
    return sorted(set(names))[i - 1::n]


def _digest(names: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(set(names))).encode()).hexdigest()[:16]


def environment() -> dict[str, Any]:
    import torch

    env = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    return env


def record(sweep: str, all_names: list[str], shard: tuple[int, int] | None, rows: list[dict[str, Any]],
           options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A sweep's (or one shard's) record, as ``fuseg report`` and ``fuseg report merge`` read it."""
    i, n = shard or (1, 1)
    return {"kind": KIND, "sweep": sweep, "shards": [i], "shard_count": n, "total": len(set(all_names)),
            "names_digest": _digest(all_names), "names": select(all_names, shard), "options": options or {},
            "environment": environment(), "rows": rows}


def _row_key(row: dict[str, Any]) -> tuple[str, str]:
    return str(row.get("model")), str(row.get("variant", ""))


def merge(paths: list[str], allow_missing: bool = False) -> dict[str, Any]:
    """One record of the shards' records at ``paths`` (Note [shards of a sweep])."""
    if not paths:
        raise ShardError("nothing to merge")
    records = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise ShardError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(data.get("rows"), list):
            raise ShardError(f"{path}: not a fuseg sweep record (written by a sweep's --out FILE.json)")
        records.append((path, data))
    first_path, first = records[0]
    for path, data in records[1:]:
        for key in ("sweep", "shard_count", "total", "names_digest", "options", "environment"):
            if data.get(key) != first.get(key):
                raise ShardError(f"mismatched shards: {path} has {key} {data.get(key)!r}, {first_path} has "
                                 f"{first.get(key)!r} (shards of one sweep share it)")
    seen_shards: dict[int, str] = {}
    seen_rows: dict[tuple[str, str], str] = {}
    rows, names = [], []
    for path, data in records:
        for s in data["shards"]:
            if s in seen_shards:
                raise ShardError(f"overlapping shards: shard {s}/{first['shard_count']} is in both "
                                 f"{seen_shards[s]} and {path}")
            seen_shards[s] = path
        for row in data["rows"]:
            key = _row_key(row)
            if key in seen_rows:
                raise ShardError(f"overlapping shards: {' / '.join(filter(None, key))} is in both {seen_rows[key]} "
                                 f"and {path}")
            seen_rows[key] = path
            rows.append(row)
        names += data.get("names", [])
    missing = sorted(set(range(1, first["shard_count"] + 1)) - set(seen_shards))
    if missing and not allow_missing:
        count = first["shard_count"]
        raise ShardError(f"missing shards {', '.join(f'{m}/{count}' for m in missing)} "
                         "(--allow-missing merges what is there)")
    merged = dict(first, shards=sorted(seen_shards), names=sorted(set(names)),
                  rows=sorted(rows, key=_row_key))
    return merged
