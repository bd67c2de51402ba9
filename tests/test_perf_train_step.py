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
