"""perf/compiled.py's bounds: the "floor" variant does no work per call, and the summary tells
models no backend could make faster than eager from the ones fuseg could."""

from __future__ import annotations

import torch

from perf.compiled import _no_work_backend, summary


def test_floor_variant_hands_back_the_outputs_it_computed_when_compiled() -> None:
    def fn(x):
        return torch.softmax(x * 2, -1)

    torch._dynamo.reset()
    x = torch.randn(4, 8)
    c = torch.compile(fn, backend=_no_work_backend)
    first = c(x)
    torch.testing.assert_close(first, fn(x))
    assert c(x) is first  # nothing ran again: the same tensor object


def test_summary_separates_models_below_the_floor() -> None:
    rows = [
        {"model": "tiny", "held_out": False, "fuseg_vs_eager": 1.4, "floor_vs_eager": 1.2, "dynamo_vs_eager": 3.0},
        {"model": "small", "held_out": False, "fuseg_vs_eager": 1.1, "floor_vs_eager": 0.7, "dynamo_vs_eager": 2.0},
        {"model": "big", "held_out": True, "fuseg_vs_eager": 0.5, "floor_vs_eager": 0.01, "dynamo_vs_eager": 1.0},
    ]
    s = summary(rows)["all"]
    assert s["slower_than_eager"] == ["tiny", "small"]
    assert s["floor_slower_than_eager"] == ["tiny"]
    assert s["slower_than_eager_above_floor"] == ["small"]
    assert s["dynamo_alone_slower_than_eager"] == ["tiny", "small"]
    assert summary(rows)["held_out"]["slower_than_eager"] == []


def test_summary_keeps_the_unseen_set_apart() -> None:
    rows = [
        {"model": "zoo", "held_out": False, "set": "zoo", "fuseg_vs_eager": 0.5},
        {"model": "old", "held_out": True, "set": "held_out", "fuseg_vs_eager": 0.4},
        {"model": "new", "held_out": True, "set": "unseen", "fuseg_vs_eager": 1.2},
    ]
    s = summary(rows)
    assert [s[p]["models"] for p in ("all", "zoo", "held_out", "unseen")] == [3, 1, 1, 1]
    assert s["unseen"]["slower_than_eager"] == ["new"] and s["held_out"]["slower_than_eager"] == []
    assert "unseen" not in summary(rows[:2])  # a run without the set says nothing of it


def test_every_model_set_builds_by_name() -> None:
    from perf.models import DEFAULT, HELD_OUT, MODELS, REALISTIC, UNSEEN

    assert set(HELD_OUT) <= set(DEFAULT) and not set(UNSEEN) & set(DEFAULT)
    assert not set(REALISTIC) & (set(DEFAULT) | set(UNSEEN))
    assert set(MODELS) == set(DEFAULT) | set(UNSEEN) | set(REALISTIC)


def test_a_gpu_run_names_the_models_that_miss_issue_44s_targets() -> None:
    rows = [
        {"model": "a", "held_out": False, "fuseg_graphs_vs_inductor": 0.8, "fuseg_graphs_vs_inductor_ro": 1.05},
        {"model": "b", "held_out": False, "fuseg_graphs_vs_inductor": 1.2, "fuseg_graphs_vs_inductor_ro": 1.3},
        {"model": "c", "held_out": False, "fuseg_graphs_vs_inductor": 0.9, "fuseg_graphs_vs_inductor_ro": 1.15},
        {"model": "d", "held_out": False, "inductor_ro_ms": 1.0},  # fuseg_graphs failed: no ratio
    ]
    s = summary(rows)["all"]
    assert s["fuseg_graphs_not_faster_than_inductor"] == ["b"]
    assert s["fuseg_graphs_above_1.1x_inductor_ro"] == ["b", "c"]
    assert s["median_fuseg_graphs_vs_inductor"] == 0.9
    assert "median_fuseg_graphs_vs_inductor" not in summary([{"model": "x", "held_out": False}])["all"]


def test_first_call_records_when_background_kernels_are_ready() -> None:
    """perf.compiled's first-call child: fuseg's first call returns before its kernels are built
    in the background, and the child says when they were; fuseg-foreground builds at once."""
    from perf.compiled import _first_call

    back, fore = _first_call("mlp", "fuseg"), _first_call("mlp", "fuseg-foreground")
    assert back["built_in_background"] >= 1 and fore["built_in_background"] == 0
    assert 0 < back["first_s"] <= back["kernels_ready_s"]
    assert 0 < fore["first_s"] <= fore["kernels_ready_s"]
