"""The fuseg command line: targets, listings, JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from perf.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_segment_builtin_example(capsys) -> None:
    code, out, _ = run(capsys, "segment", "rms-norm")
    assert code == 0
    assert "1 segments" in out and "NORMALIZATION" in out and "kernels 1" in out


def test_segment_explain_lists_boundaries_and_bytes(capsys) -> None:
    code, out, _ = run(capsys, "segment", "mlp", "--explain")
    assert code == 0
    assert "modeled bytes: read" in out
    assert "%addmm: s0 -> s1: a matmul absorbs only views" in out


def test_segment_json_is_machine_readable(capsys) -> None:
    code, out, _ = run(capsys, "segment", "softmax", "--json")
    data = json.loads(out)
    assert code == 0 and data["graph"]["schema"] == "fusion-segmenter/graph"
    assert data["segmentation"]["segments"][0]["kind"] == "normalization"
    assert data["segmentation"]["stats"]["launches"] == 1


def test_module_factory_and_json_file_targets(capsys, tmp_path) -> None:
    path = tmp_path / "g.json"
    code, _, err = run(capsys, "export", "tests.factories:pointwise", "-o", str(path))
    assert code == 0 and "wrote" in err
    code, out, _ = run(capsys, "segment", str(path), "--graph")
    assert code == 0 and "aten.sin.default" in out and "1 segments" in out


def test_max_ops_cuts_every_op(capsys) -> None:
    code, out, _ = run(capsys, "segment", "rms-norm", "--max-ops", "1")
    assert code == 0 and "6 segments" in out


@pytest.mark.parametrize(
    "target,message",
    [
        ("no-such-model", "unknown model 'no-such-model'"),
        ("missing.json", "no such file"),
        ("tests.factories:not_a_pair", "must return (fn_or_module, example_inputs"),
        ("tests.factories:absent", "has no callable 'absent'"),
        ("no_such_pkg.mod:f", "cannot import 'no_such_pkg.mod'"),
    ],
)
def test_bad_targets_give_one_line_errors(capsys, target: str, message: str) -> None:
    code, out, err = run(capsys, "segment", target)
    assert code == 2 and out == ""
    assert err.startswith("fuseg: error:") and message in err and err.count("\n") == 1


def test_malformed_json_file(capsys, tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schema": "fusion-segmenter/graph", "version": 1, "name": "g", "inputs": 3}')
    code, _, err = run(capsys, "segment", str(path))
    assert code == 2 and "graph.inputs: expected list, got int" in err


def test_examples_lists_the_zoo(capsys) -> None:
    code, out, _ = run(capsys, "examples")
    assert code == 0 and "rope-seed" in out and "llama-tiny" in out


def test_run_checks_against_eager(capsys) -> None:
    code, out, _ = run(capsys, "run", "rms-norm", "--alias", "pre")
    assert code == 0 and "against eager" in out and "aliasing agrees" in out and "peak memory" in out


def test_run_json_graph_against_its_semantics(capsys, tmp_path) -> None:
    path = tmp_path / "g.json"
    run(capsys, "export", "tests.factories:pointwise", "-o", str(path))
    code, out, _ = run(capsys, "run", str(path), "--json")
    result = json.loads(out)
    assert code == 0 and result["reference"] == "graph semantics" and result["max_abs_diff"] == 0


def test_profile_columns_are_consistent(capsys) -> None:
    from perf.profile import COLUMNS

    code, out, err = run(capsys, "profile", "rope-seed", "softmax", "gpt2-tiny", "--format", "json")
    records = json.loads(out)
    assert code == 0 and "[3/3]" in err  # progress on stderr
    assert [list(r)[0] for r in records] == ["model"] * 3 and list(records[0]) == COLUMNS
    for r in records:
        for mode in ("off", "pre", "post"):
            assert r[f"{mode}_launches"] == r[f"{mode}_kernels"] + r[f"{mode}_opaque"]
            assert r[f"{mode}_segments"] == r[f"{mode}_launches"] + r[f"{mode}_metadata"]
            assert r[f"{mode}_bytes_moved"] >= r["bytes_floor"]
        assert r["post_kernels"] <= r["pre_kernels"]


@pytest.mark.parametrize("fmt,marker", [("csv", "model,nodes,"), ("markdown", "| model | nodes |"), ("table", "model")])
def test_profile_formats(capsys, tmp_path, fmt, marker) -> None:
    out_file = tmp_path / "p.txt"
    code, _, _ = run(capsys, "profile", "softmax", "--format", fmt, "--out", str(out_file))
    assert code == 0 and marker in out_file.read_text()


def test_profile_unknown_model(capsys) -> None:
    code, out, err = run(capsys, "profile", "nope")
    assert code == 2 and "unknown model 'nope'" in err and err.count("\n") == 1


def test_run_refuses_meta_examples(capsys) -> None:
    code, _, err = run(capsys, "run", "rope-llama3-8b")
    assert code == 2 and "meta tensors" in err
