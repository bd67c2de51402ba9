"""perf/train_step.py (issue 42, goal 4): its protocol checks a training step against eager (the
loss and every gradient, from the same weights on the same batch) before it times anything."""

from __future__ import annotations

import pytest

from perf.train_step import TRAIN_MODELS, _model, run_model, summary


def test_models_are_small_configs_with_labels() -> None:
    model, ids = _model("llama-tiny")
    assert ids.shape == (2, TRAIN_MODELS["llama-tiny"][4])
    assert model.training and float(model(input_ids=ids, labels=ids).loss) > 0


@pytest.mark.parametrize("name", ["llama-tiny", "bert-tiny"])
def test_a_fuseg_training_step_matches_eager(name: str) -> None:
    row = run_model(name, rounds=1, steps=1, variants_wanted=["eager", "fuseg"])
    check = row["check_against_eager"]["fuseg"]
    assert check["gradients_missing_or_extra"] == 0
    assert check["loss_diff"] < 1e-5
    assert check["max_grad_diff"] < 1e-5 * max(1.0, check["max_grad"])
    assert set(row["step_ms"]) == {"eager", "fuseg"} and "fuseg_over_inductor" not in row


def test_summary_names_the_models_slower_than_inductor() -> None:
    def row(name, ratio):
        return {"model": name, "fuseg_over_inductor": ratio, "fuseg_over_eager": ratio / 2,
                "check_against_eager": {"fuseg": {"max_grad_diff": 1e-7}}}

    s = summary([row("a", 0.9), row("b", 1.2), row("c", 1.0), {"model": "d", "error": "x"}])
    assert s["slower_than_inductor"] == {"b": 1.2}
    assert s["median_fuseg_over_inductor"] == 1.0


def test_several_processes_give_the_median_of_each(monkeypatch) -> None:
    """``--processes N``: each variant's median step over the processes, the median of their
    fuseg/Inductor ratios, every process kept; a failed process is the row's error."""
    import perf.train_step as ts

    steps = iter([(4.0, 2.6, 2.0), (4.4, 1.6, 1.8), (4.2, 2.6, 1.7)])

    def child(name, rounds, steps_, variants):
        e, i, f = next(steps)
        return {"model": name, "shape": [2, 32], "step_ms": {"eager": e, "inductor": i, "fuseg": f},
                "first_step_s": {"eager": 0.0, "inductor": 20.0, "fuseg": 4.0},
                "check_against_eager": {"fuseg": {"max_grad_diff": f * 1e-8}},
                "fuseg_over_eager": f / e, "fuseg_over_inductor": f / i, "inductor_over_eager": i / e}

    monkeypatch.setattr(ts, "_child", child)
    row = ts._processes("llama-tiny", 1, 1, 3)
    assert row["step_ms"] == {"eager": 4.2, "inductor": 2.6, "fuseg": 1.8}
    assert row["fuseg_over_inductor_per_process"] == [2.0 / 2.6, 1.8 / 1.6, 1.7 / 2.6]
    assert row["fuseg_over_inductor"] == 2.0 / 2.6
    assert len(row["processes"]) == 3 and row["check_against_eager"]["fuseg"]["max_grad_diff"] == 2.0e-8
    monkeypatch.setattr(ts, "_child", lambda *a: {"model": "llama-tiny", "error": "boom"})
    assert ts._processes("llama-tiny", 1, 1, 2)["error"] == "boom"


def test_processes_alternate_which_compiled_variant_is_made_first(monkeypatch) -> None:
    """Two identical variants in one process differed by 3-6% with the order they were made in
    (perf.experiments.embedding_backward's A/A trial): Inductor and fuseg swap places from one
    process to the next, eager (the yardstick) first in all."""
    import perf.train_step as ts

    seen = []

    def child(name, rounds, steps_, variants):
        seen.append(list(variants))
        return {"model": name, "error": "stop"} if len(seen) > 3 else {
            "model": name, "shape": [2, 32], "step_ms": {"eager": 4.0, "inductor": 2.0, "fuseg": 2.0},
            "first_step_s": {"eager": 0.0, "inductor": 20.0, "fuseg": 4.0},
            "check_against_eager": {"fuseg": {"max_grad_diff": 0.0}},
            "fuseg_over_eager": 0.5, "fuseg_over_inductor": 1.0, "inductor_over_eager": 0.5}

    monkeypatch.setattr(ts, "_child", child)
    ts._processes("llama-tiny", 1, 1, 3)
    assert seen == [["eager", "inductor", "fuseg"], ["eager", "fuseg", "inductor"], ["eager", "inductor", "fuseg"]]


def test_variants_are_made_in_the_order_asked(monkeypatch) -> None:
    import torch

    made = []
    real = torch.compile

    def compile_(model, backend=None, **kw):  # (Inductor's compile is left out: the order is the point)
        made.append("inductor" if backend == "inductor" else "fuseg")
        return real(model, backend="eager" if backend == "inductor" else backend, **kw)

    monkeypatch.setattr(torch, "compile", compile_)
    row = run_model("llama-tiny", rounds=1, steps=1, variants_wanted=["eager", "fuseg", "inductor"])
    assert made == ["fuseg", "inductor"]
    assert row["order"] == ["eager", "fuseg", "inductor"]


def test_separate_processes_time_each_compiled_variant_alone_against_eager(monkeypatch) -> None:
    """``--separate N``: Inductor and fuseg each in processes of their own (eager first in every
    one, the yardstick), N of each, alternated; fuseg/Inductor is the ratio of their median
    ratios to eager; the first steps, each its process's first compile, their medians' ratio."""
    import perf.train_step as ts

    seen = []
    ratios = iter([0.5, 0.6, 0.55, 0.45])  # inductor, fuseg, fuseg, inductor (the second pair swapped)
    firsts = iter([20.0, 5.0, 7.0, 30.0])

    def child(name, rounds, steps_, variants):
        seen.append(list(variants))
        r = next(ratios)
        v = variants[1]
        row = {"model": name, "order": list(variants), "step_ms": {"eager": 4.0, v: 4.0 * r},
               "first_step_s": {"eager": 0.01, v: next(firsts)}}
        if v == "fuseg":
            row["check_against_eager"] = {"fuseg": {"max_grad_diff": 1e-8}}
        return row

    monkeypatch.setattr(ts, "_child", child)
    row = ts.separate("llama-tiny", 1, 1, 2)
    assert seen == [["eager", "inductor"], ["eager", "fuseg"], ["eager", "fuseg"], ["eager", "inductor"]]
    assert row["inductor_over_eager"] == pytest.approx(0.475) and row["fuseg_over_eager"] == pytest.approx(0.575)
    assert row["fuseg_over_inductor"] == pytest.approx(0.575 / 0.475)
    assert len(row["runs"]["fuseg"]) == 2 and row["check_against_eager"]["fuseg"]["max_grad_diff"] == 1e-8
    assert row["first_step_s"] == {"inductor": 25.0, "fuseg": 6.0}
    assert row["first_step_fuseg_over_inductor"] == pytest.approx(6.0 / 25.0)


def test_separate_with_the_floor_times_aot_eager_in_processes_of_its_own(monkeypatch) -> None:
    """``--separate N --floor``: aot_eager (dynamo's trace and AOTAutograd's, no compiler) in N
    processes too, its order swapped with the others'; its first step over Inductor's is the floor."""
    import perf.train_step as ts

    seen = []
    firsts = {"inductor": iter([20.0, 30.0]), "fuseg": iter([5.0, 7.0]), "aot_eager": iter([4.0, 6.0])}

    def child(name, rounds, steps_, variants):
        seen.append(variants[1])
        v = variants[1]
        row = {"model": name, "order": list(variants), "step_ms": {"eager": 4.0, v: 2.0},
               "first_step_s": {"eager": 0.01, v: next(firsts[v])}}
        if v != "inductor":
            row["check_against_eager"] = {v: {"max_grad_diff": 1e-8}}
        return row

    monkeypatch.setattr(ts, "_child", child)
    row = ts.separate("llama-tiny", 1, 1, 2, floor=True)
    assert seen == ["inductor", "fuseg", "aot_eager", "aot_eager", "fuseg", "inductor"]
    assert row["first_step_s"] == {"inductor": 25.0, "fuseg": 6.0, "aot_eager": 5.0}
    assert row["first_step_floor_over_inductor"] == pytest.approx(0.2) and row["aot_eager_over_eager"] == 0.5
    with pytest.raises(SystemExit):
        ts.main(["--floor", "llama-tiny"])


def test_a_step_without_fuseg_has_no_fuseg_ratio() -> None:
    row = run_model("llama-tiny", rounds=1, steps=1, variants_wanted=["eager"])
    assert set(row["step_ms"]) == {"eager"} and "fuseg_over_eager" not in row
