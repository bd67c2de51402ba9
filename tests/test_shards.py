"""Sharded sweeps: ``--shard I/N``, ``fuseg report merge`` and ``fuseg report`` on sweep records
(Note [shards of a sweep] in perf/shards.py, Note [one timing per row] in perf/tools/sweep_report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf.shards import ShardError, merge, parse_shard, record, select
from perf.tools.cli import main

NAMES = [f"arch{k:02d}" for k in range(23)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 23, 30])
def test_shards_are_disjoint_and_their_union_is_the_whole(n: int) -> None:
    shards = [select(NAMES, (i, n)) for i in range(1, n + 1)]
    assert sorted(sum(shards, [])) == sorted(NAMES)  # the union, each name once
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    # the split depends on the list only, not on its order
    assert [select(list(reversed(NAMES)), (i, n)) for i in range(1, n + 1)] == shards


@pytest.mark.parametrize("text,message", [("3/2", "between 1 and N"), ("0/2", "between 1 and N"),
                                          ("a/b", "expected I/N"), ("2", "expected I/N")])
def test_bad_shard_is_refused(text: str, message: str) -> None:
    with pytest.raises(ShardError, match=message):
        parse_shard(text)


def _rows(names: list[str], **extra: object) -> list[dict]:
    return [{"model": n, "status": "ok", "post_kernels": 3, "post_segments": 4, **extra} for n in names]


def _write(path: Path, rec: dict) -> str:
    path.write_text(json.dumps(rec))
    return str(path)


def _shard_files(tmp_path: Path, n: int = 3) -> list[str]:
    return [_write(tmp_path / f"s{i}.json", record("suite:x", NAMES, (i, n), _rows(select(NAMES, (i, n)))))
            for i in range(1, n + 1)]


def test_merge_joins_every_shards_rows(tmp_path: Path) -> None:
    merged = merge(_shard_files(tmp_path))
    assert [r["model"] for r in merged["rows"]] == sorted(NAMES)
    assert merged["shards"] == [1, 2, 3] and merged["names"] == sorted(NAMES)


def test_merge_refuses_a_shard_given_twice(tmp_path: Path) -> None:
    files = _shard_files(tmp_path)
    with pytest.raises(ShardError, match="overlapping shards: shard 2/3 is in both"):
        merge([files[0], files[1], files[1]])


def test_merge_refuses_rows_in_two_shards(tmp_path: Path) -> None:
    files = _shard_files(tmp_path, 2)
    wrong = record("suite:x", NAMES, (2, 2), _rows(select(NAMES, (2, 2)) + ["arch00"]))  # arch00 is shard 1's
    with pytest.raises(ShardError, match="overlapping shards: arch00 is in both"):
        merge([files[0], _write(tmp_path / "wrong.json", wrong)])


@pytest.mark.parametrize("field,value", [("shard_count", 4), ("sweep", "suite:y"), ("names_digest", "0" * 16),
                                         ("environment", {"torch": "0.0"}), ("options", {"real_size": True})])
def test_merge_refuses_mismatched_shards(tmp_path: Path, field: str, value: object) -> None:
    files = _shard_files(tmp_path, 2)
    other = json.loads(Path(files[1]).read_text())
    other[field] = value
    with pytest.raises(ShardError, match=f"mismatched shards: .* has {field}"):
        merge([files[0], _write(tmp_path / "other.json", other)])


def test_merge_refuses_missing_shards_unless_allowed(tmp_path: Path) -> None:
    files = _shard_files(tmp_path)
    with pytest.raises(ShardError, match="missing shards 2/3"):
        merge([files[0], files[2]])
    assert merge([files[0], files[2]], allow_missing=True)["shards"] == [1, 3]


def test_merge_refuses_a_file_that_is_no_sweep_record(tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="not a fuseg sweep record"):
        merge([_write(tmp_path / "bench.json", {"rows": []})])


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_sharded_profile_merged_equals_the_whole_and_reports_clean(capsys, tmp_path: Path) -> None:
    models = ["softmax", "layer-norm", "rms-norm", "mlp", "tests.factories:pointwise"]
    whole = tmp_path / "whole.json"
    assert _cli(capsys, "profile", *models, "--shard", "1/1", "--out", str(whole))[0] == 0
    parts = []
    for i in (1, 2):
        parts.append(str(tmp_path / f"part{i}.json"))
        assert _cli(capsys, "profile", *models, "--shard", f"{i}/2", "--out", parts[-1])[0] == 0
    assert {r["model"] for r in json.loads(Path(parts[0]).read_text())["rows"]}.isdisjoint(
        r["model"] for r in json.loads(Path(parts[1]).read_text())["rows"])
    merged = tmp_path / "merged.json"
    code, _, err = _cli(capsys, "report", "merge", *parts, "--out", str(merged))
    assert code == 0 and "5 rows from shards [1, 2] of 2" in err
    rows = {r["model"]: r for r in json.loads(merged.read_text())["rows"]}
    expected = {r["model"]: r for r in json.loads(whole.read_text())["rows"]}
    assert rows.keys() == expected.keys()
    for name, row in rows.items():  # the same counts as one machine's sweep (times aside)
        assert {k: v for k, v in row.items() if k != "segment_ms"} == \
            {k: v for k, v in expected[name].items() if k != "segment_ms"}
    code, out, _ = _cli(capsys, "report", str(merged), str(merged))
    assert code == 0 and "0 regression(s)" in out
    # refusals are one line and exit 2
    code, _, err = _cli(capsys, "report", "merge", parts[0], parts[0], "--out", str(tmp_path / "x.json"))
    assert code == 2 and "overlapping shards" in err


def _sweep(tmp_path: Path, name: str, rows: list[dict]) -> str:
    return _write(tmp_path / name, record("suite:x", [r["model"] for r in rows], None, rows))


BASE = [{"model": "a", "status": "ok", "post_segments": 4, "post_kernels": 3, "post_launches": 3,
         "post_bytes_moved": 1000, "segment_ms": 20.0},
        {"model": "b", "status": "ok", "post_segments": 2, "post_kernels": 2, "post_launches": 2,
         "post_bytes_moved": 500, "segment_ms": 10.0}]


@pytest.mark.parametrize("change,code,message", [
    ({}, 0, "0 regression(s)"),
    ({"post_kernels": 4}, 1, "a: post_kernels 3 -> 4"),
    ({"post_segments": 5}, 1, "a: post_segments 4 -> 5"),
    ({"post_bytes_moved": 1200}, 1, "a: post_bytes_moved 1000 -> 1200"),
    ({"post_kernels": 2}, 0, "a: post_kernels 3 -> 2"),  # fewer: an improvement
    ({"status": "failed", "stage": "capture", "error": "boom"}, 1, "pass rate 100.0% -> 50.0%"),
    ({"segment_ms": 24.0}, 0, "0 regression(s)"),  # 20% slower but 4 ms: under the 5 ms floor
    ({"segment_ms": 60.0}, 1, "a: segment_ms 20 -> 60"),  # 3x and 40 ms
])
def test_report_on_sweeps_exits_1_on_a_regression(capsys, tmp_path: Path, change: dict, code: int,
                                                  message: str) -> None:
    base = _sweep(tmp_path, "base.json", BASE)
    cur = _sweep(tmp_path, "cur.json", [{**BASE[0], **change}, BASE[1]])
    got, out, _ = _cli(capsys, "report", base, cur)
    assert got == code and message in out, out


def test_report_on_sweeps_counts_a_missing_model(capsys, tmp_path: Path) -> None:
    base = _sweep(tmp_path, "base.json", BASE)
    cur = _sweep(tmp_path, "cur.json", BASE[1:])
    got, out, _ = _cli(capsys, "report", base, cur)
    assert got == 1 and "a: missing from the current record" in out


def test_a_sharded_bench_record_merges(monkeypatch, tmp_path: Path) -> None:
    import perf.bench

    monkeypatch.setattr(perf.bench, "bench", lambda models, device, **kw: [
        {"model": m, "variant": v, "median_ms": 1.0} for m in models for v in ("eager", "fuseg-post-auto")])
    models = ["softmax", "layer-norm", "rms-norm"]
    paths = []
    for i in (1, 2):
        paths.append(str(tmp_path / f"b{i}.json"))
        rec = perf.bench.run_bench(select(models, (i, 2)), "cpu", paths[-1], shard=((i, 2), models))
        assert rec["kind"] == "fuseg-sweep" and rec["sweep"] == "bench" and rec["shards"] == [i]
        assert rec["environment"]["device"] == "cpu"  # bench's own environment: where the times were taken
    merged = merge(paths)
    assert sorted({r["model"] for r in merged["rows"]}) == sorted(models) and len(merged["rows"]) == 6
