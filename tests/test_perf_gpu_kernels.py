"""perf/gpu/gpu_kernels.py's plumbing, on the CPU (the profiler's CPU ops stand in for kernels)."""

from __future__ import annotations

import json

from perf.gpu.gpu_kernels import main, profile_kernels


def test_each_variant_gets_its_kernels_sorted_by_time() -> None:
    (row,) = profile_kernels(["mlp"], ["fuseg", "dynamo"], calls=2, device="cpu", top=5)
    assert row["fuseg_max_abs_diff"] < 1e-4 and row["dynamo_max_abs_diff"] < 1e-4
    for v in ("fuseg", "dynamo"):
        t = row[v]
        assert t["kernels_per_call"] > 0 and 0 < len(t["top"]) <= 5
        times = [r["us_per_call"] for r in t["top"]]
        assert times == sorted(times, reverse=True)
        assert t["us_per_call"] >= sum(times) - 1e-6
    assert row["us_per_call_fuseg_minus_dynamo"] == row["fuseg"]["us_per_call"] - row["dynamo"]["us_per_call"]


def test_a_variant_that_fails_is_recorded_and_the_record_written(tmp_path) -> None:
    out = tmp_path / "k.json"
    assert main(["mlp", "--device", "cpu", "--variants", "fuseg,no-such-variant", "--calls", "1", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    (row,) = rec["rows"]
    assert "fuseg" in row and row["no-such-variant_error"].startswith("KeyError")
    assert "us_per_call_fuseg_minus_no-such-variant" not in row
    assert rec["environment"]["device"] == "cpu"
