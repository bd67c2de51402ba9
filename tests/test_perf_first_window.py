"""perf/first_window.py (issue 64, goal 2): the first seconds of a compiled model's calls while
its kernels build in the background, per second against eager's; one policy per fresh process."""

from __future__ import annotations

import json

import pytest
import torch

from perf import compiled, first_window
from runtime.codegen import build
from runtime.machine import threads


def test_calls_are_counted_by_the_second_they_start_in() -> None:
    calls = [(0.1, 0.2), (0.5, 0.4), (1.2, 0.1), (2.9, 0.3)]
    rows = first_window.per_second(calls, 0.1, 4)
    assert [r["calls"] for r in rows] == [2, 1, 1, 0]
    assert rows[0]["median_ms"] == pytest.approx(300.0) and rows[0]["mean_over_eager"] == pytest.approx(3.0)
    assert rows[1]["median_over_eager"] == pytest.approx(1.0) and rows[3]["median_over_eager"] is None
    assert "eager_calls" not in rows[0]
    rows = first_window.per_second(calls, 0.1, 4, [(0.3, 0.1), (0.7, 0.3), (2.5, 0.2)])
    assert [r["eager_calls"] for r in rows] == [2, 0, 1, 0]
    assert rows[0]["median_over_same_second_eager"] == pytest.approx(0.3 / 0.2)
    assert rows[1]["median_over_same_second_eager"] is None and rows[2]["median_over_same_second_eager"] == pytest.approx(1.5)


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.lin(x)) * 2 + x


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_window_in_this_process_records_the_builds_and_restores_the_policy(monkeypatch, tmp_path) -> None:
    """One short window with a cold cache and background builds (fuseg's default for inference):
    the builds end (waited for after the window at the latest), the outputs are eager's, and the
    policy the window chose is the environment's again after it."""
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("FUSEG_BACKGROUND_BUILDS", raising=False)
    monkeypatch.setitem(compiled.MODELS, "tiny-window", lambda: (_Tiny().eval(), [torch.randn(4, 16)]))
    torch._dynamo.reset()
    try:
        r = first_window.window("tiny-window", 0.5, "calls-first", 0.05, eager_every=3)
    finally:
        torch._dynamo.reset()
    assert threads._CHOSEN["policy"] is None and build.background_builds_under_way() == 0
    assert r["policy"] == "calls-first" and r["calls"] >= 1 and r["max_diff"] < 1e-4
    assert sum(s["calls"] for s in r["seconds"]) == r["calls"] and len(r["seconds"]) == 1
    assert r["eager_every"] == 3 and "median_over_same_second_eager" in r["seconds"][0]
    assert r["builds_ended_s"] is None or r["builds_ended_s"] <= 0.5 + r["slowest_call_s"]


def test_the_command_runs_each_policy_and_writes_the_record(monkeypatch, tmp_path, capsys) -> None:
    ran = []

    def fake(name, seconds, policy, eager_s, eager_every):
        ran.append((name, seconds, policy, eager_s, eager_every))
        return {"policy": policy, "first_call_s": 1.0, "builds_ended_s": 2.0, "calls": 10, "eager_calls_in_window": 9.0,
                "window_mean_over_eager": 0.9, "slowest_call_s": 0.5, "slowest_call_at_s": 1.0, "eager_median_ms": 1.0,
                "seconds": first_window.per_second([(0.1, 0.001)], 0.001, 2)}

    monkeypatch.setattr(first_window, "run_policy", fake)
    out = tmp_path / "r.json"
    assert first_window.main(["m", "--window", "2", "--policies", "calls-first,cores", "--out", str(out)]) == 0
    assert [r[2] for r in ran] == ["calls-first", "cores"] and ran[0][:2] == ("m", 2.0)
    record = json.loads(out.read_text())
    assert record["protocol"] == "perf.first_window" and "cpu" in record["machine"] and len(record["rows"]) == 2
    assert "calls-first" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        first_window.main(["m", "--policies", "fastest"])
    with pytest.raises(SystemExit):
        first_window.main(["m", "--eager-every", "1"])
