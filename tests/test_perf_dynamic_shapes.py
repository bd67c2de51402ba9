"""perf.dynamic_shapes' bookkeeping (no model is run here): the ratios of a round, the variant
that runs another checkout's code."""

from __future__ import annotations

import pytest

from perf import dynamic_shapes as ds


def test_ratios_compare_fuseg_and_the_code_before_with_aot_eager() -> None:
    rows = [{"backend": "aot_eager", "second": 2.0},
            {"backend": "fuseg-before", "second": 3.0, "new_after_builds": 0.03, "seen_after_builds": 0.01},
            {"backend": "fuseg", "second": 2.5, "first": 4.0, "new": 0.02, "steady": 0.02,
             "new_after_builds": 0.011, "seen_after_builds": 0.01, "kernel_builds_later_lengths": [0, 0, 0]},
            {"backend": "inductor", "error": ["x"]}]
    r = ds._ratios(rows)
    assert r["before_second_over_aot_eager_second"] == pytest.approx(1.5)
    assert r["before_new_after_builds_over_seen"] == pytest.approx(3.0)
    assert r["fuseg_second_over_aot_eager_second"] == pytest.approx(1.25)
    assert r["fuseg_new_after_builds_over_seen"] == pytest.approx(1.1)
    assert not any("inductor" in k for k in r)  # (a backend that failed gives no ratio)


def test_the_code_before_needs_a_checkout() -> None:
    with pytest.raises(ValueError, match="--before DIR"):
        ds._child("generate", "qwen2", "fuseg-before", 1, None)
