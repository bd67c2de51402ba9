"""``hf:ARCH[:key=value,...]`` targets and ``fuseg profile --suite transformers`` (perf/hf.py,
perf/tools/suite.py): built from transformers' config classes, small by default, nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from perf import hf
from perf.targets import TargetError, load_program
from perf.tools import suite
from perf.tools.cli import main
from perf.tools.run import run_target

pytest.importorskip("transformers")


@pytest.mark.parametrize("spec,expected", [
    ("hf:gpt2", ("gpt2", {})),
    ("hf:bert:num_hidden_layers=1,hidden_act=gelu", ("bert", {"num_hidden_layers": 1, "hidden_act": "gelu"})),
    ("hf:t5:d_model=32,tie_word_embeddings=False,dropout_rate=0.0",
     ("t5", {"d_model": 32, "tie_word_embeddings": False, "dropout_rate": 0.0})),
])
def test_parse(spec: str, expected: tuple) -> None:
    assert hf.parse(spec) == expected


@pytest.mark.parametrize("spec,message", [("hf:", "no architecture"), ("hf:bert:layers", "is not key=value"),
                                          ("hf:no-such-arch", "hf:no-such-arch: Unrecognized model")])
def test_bad_specs_are_one_line_errors(spec: str, message: str) -> None:
    with pytest.raises((hf.HfSpecError, TargetError), match=message):
        load_program(spec)


@pytest.mark.parametrize("spec,cls,inputs", [
    ("hf:gpt2", "GPT2LMHeadModel", ["input_ids"]),  # a causal LM
    ("hf:bert", "BertModel", ["input_ids"]),  # an encoder (bert's causal-LM variant is not its model)
    ("hf:t5", "T5ForConditionalGeneration", ["input_ids", "decoder_input_ids"]),  # an encoder-decoder
    ("hf:vit", "ViTModel", ["pixel_values"]),  # a vision model
])
def test_small_models_of_each_family(spec: str, cls: str, inputs: list[str]) -> None:
    model, example = hf.build(spec)
    assert type(model.model).__name__ == cls and list(model.names) == inputs
    config = model.model.config
    assert getattr(config, "vocab_size", 0) <= 128
    assert getattr(config, "hidden_size", None) == 64  # (through gpt2's and t5's attribute maps)
    assert all(t.device.type == "cpu" for t in example)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000


def test_user_keys_override_the_small_defaults_under_any_alias() -> None:
    model, _ = hf.build("hf:gpt2:n_layer=1,n_embd=32")
    assert model.model.config.num_hidden_layers == 1 and model.model.config.hidden_size == 32
    assert len(model.model.transformer.h) == 1


def test_hf_target_runs_and_matches_eager() -> None:
    result = run_target(load_program("hf:bert:num_hidden_layers=1"))
    assert result["reference"] == "eager" and result["max_abs_diff"] < 1e-4
    assert result["strides_agree"] and result["aliasing_agrees"] and result["mutated_inputs_agree"]


def test_real_size_on_meta_is_profiled(capsys) -> None:
    model, example = hf.build("hf:bert:num_hidden_layers=1", real_size=True)
    assert model.model.config.hidden_size == 768 and model.model.config.vocab_size == 30522  # the config's own
    assert all(p.device.type == "meta" for p in model.parameters()) and example[0].device.type == "meta"
    code = main(["profile", "hf:bert:num_hidden_layers=1", "--real-size", "--format", "json"])
    out = capsys.readouterr().out
    row = json.loads(out)[0]
    assert code == 0 and row["model"] == "hf:bert:num_hidden_layers=1" and row["post_kernels"] > 0
    assert row["bytes_floor"] > 30522 * 768 * 4  # the real embedding table is read


def test_suite_subset_makes_a_table_with_failures_and_their_reasons(capsys, tmp_path: Path, monkeypatch) -> None:
    assert suite.names("^(bert|gpt2)$") == ["bert", "gpt2"]
    assert len(suite.names(limit=3)) == 3 and len(suite.names()) > 300
    real_build = hf.build

    def build(spec: str, real_size: bool = False):
        if spec == "hf:gpt2":
            raise hf.HfSpecError("hf:gpt2: refused for this test")
        return real_build(spec, real_size)

    monkeypatch.setattr(hf, "build", build)
    out_csv = tmp_path / "suite.csv"
    code = main(["profile", "--suite", "transformers", "--filter", "^(bert|gpt2)$", "--out", str(out_csv)])
    out = capsys.readouterr().out
    assert code == 0
    assert "1/2 architectures profiled (50% pass rate)" in out
    assert "gpt2 (build): HfSpecError: hf:gpt2: refused for this test" in out
    df = pd.read_csv(out_csv)
    assert list(df["model"]) == ["bert", "gpt2"] and list(df["status"]) == ["ok", "failed"]
    bert = df.iloc[0]
    assert bert["post_kernels"] > 0 and bert["post_metadata"] > 0 and bert["off_metadata"] == 0
    for ext, marker in ((".md", "| model | status |"), (".html", "<table")):
        path = tmp_path / f"suite{ext}"
        suite.write_table(df, str(path))
        assert marker in path.read_text()


def test_suite_with_inductor_counts_its_kernels(monkeypatch) -> None:
    import perf.tools.profile

    monkeypatch.setattr(perf.tools.profile, "inductor_kernels", lambda fn, inputs: 7 if isinstance(fn, torch.nn.Module)
                        else None)
    df = suite.run_suite(["bert"], inductor=True, progress=False)
    assert df.iloc[0]["status"] == "ok" and df.iloc[0]["inductor_kernels"] == 7


def test_a_model_too_large_at_the_small_sizes_is_refused_before_its_weights_exist() -> None:
    with pytest.raises(hf.HfSpecError, match="parameters at the small sizes, over the"):
        hf.build("hf:gpt2:n_embd=512,vocab_size=50000", max_params=1_000_000)


def test_a_slow_architecture_gets_a_row_with_the_time_limit(monkeypatch) -> None:
    import time

    monkeypatch.setattr(hf, "build", lambda spec, real_size=False: time.sleep(5))
    row = suite._one("bert", real_size=False, inductor=False, timeout=0.2)
    assert row["status"] == "failed" and row["stage"] == "build" and "took longer than 0.2 s" in row["error"]
    assert row["seconds"] < 4
