"""The fuseg command line: targets, listings, JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from perf.tools.cli import main


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
    from perf.tools.profile import COLUMNS

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


def test_profile_generated_kernels_inductor_and_plot(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "k.png"
    code, out, _ = run(capsys, "profile", "softmax", "rms-norm", "--inductor", "--format", "json", "--plot", str(png))
    assert code == 0
    for r in json.loads(out):
        assert r["post_generated"] <= r["post_kernels"]
        assert isinstance(r["inductor_kernels"], int) and r["inductor_kernels"] >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bench_record(tmp_path, name: str, rows: list[dict]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"environment": {"device": "cpu"}, "rows": rows}))
    return str(path)


_ROW = {"model": "softmax", "variant": "fuseg-post-auto", "median_ms": 1.0, "p10_ms": 0.95, "p90_ms": 1.05,
        "kernels_launched": 1, "ok": True}


def test_bench_then_report_on_identical_records_passes(capsys, tmp_path) -> None:
    out = tmp_path / "b.json"
    code, _, err = run(capsys, "bench", "softmax", "--device", "cpu", "--mode", "post", "--backend", "torch",
                       "--backend", "cpp", "--repeat", "5", "--warmup", "1", "--out", str(out))
    assert code == 0, err
    rec = json.loads(out.read_text())
    assert {r["variant"] for r in rec["rows"]} == {"eager", "fuseg-post-torch", "fuseg-post-cpp"}
    assert all(r["ok"] and r["median_ms"] > 0 and r["p10_ms"] <= r["p90_ms"] for r in rec["rows"])
    assert rec["environment"]["device"] == "cpu" and "torch" in rec["environment"]
    code, report, _ = run(capsys, "report", str(out), str(out), "--html", str(tmp_path / "r.html"))
    assert code == 0 and "0 regression(s)" in report
    assert "<table" in (tmp_path / "r.html").read_text()


def test_report_flags_planted_regressions(capsys, tmp_path) -> None:
    base = _bench_record(tmp_path, "base.json", [_ROW, {**_ROW, "variant": "eager"}])
    slower = {**_ROW, "median_ms": 1.5, "p10_ms": 1.4, "p90_ms": 1.6}
    cur = _bench_record(tmp_path, "cur.json", [slower, {**_ROW, "variant": "eager", "kernels_launched": 2}])
    code, report, _ = run(capsys, "report", base, cur)
    assert code == 1
    assert "softmax / fuseg-post-auto: median 1 ms -> 1.5 ms (1.50x)" in report
    assert "softmax / eager: kernels_launched 1 -> 2" in report
    # noise: a slower median whose spread overlaps the baseline's is not a regression
    noisy = {**_ROW, "median_ms": 1.2, "p10_ms": 1.0, "p90_ms": 1.4}
    code, report, _ = run(capsys, "report", base, _bench_record(tmp_path, "n.json", [noisy, {**_ROW, "variant": "eager"}]))
    assert code == 0, report
    code, report, _ = run(capsys, "report", base, _bench_record(tmp_path, "m.json", [_ROW]))
    assert code == 1 and "missing from the current record" in report


@pytest.mark.parametrize("content,message", [
    ("[1, 2]", "not a fuseg bench record"), ("{\"rows\": [{\"model\": 3}]}", "rows[0] has no string 'model'"),
    ("{nope", "not JSON"),
])
def test_report_bad_input_is_one_line(capsys, tmp_path, content, message) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, _, err = run(capsys, "report", str(bad), str(bad))
    assert code == 2 and message in err and err.count("\n") == 1


def test_bench_unknown_model(capsys) -> None:
    code, _, err = run(capsys, "bench", "nope", "--device", "cpu")
    assert code == 2 and "unknown model 'nope'" in err


def test_bench_refuses_meta_weights(capsys) -> None:
    code, _, err = run(capsys, "bench", "bert-base", "--device", "cpu")
    assert code == 2 and "meta device" in err and err.count("\n") == 1


def test_run_says_which_way_it_ran(capsys) -> None:
    """Issue 63, goal 4: by default every kernel is built before the call, and the output says how
    many segments ran on generated kernels and how many on torch."""
    from runtime.codegen.build import cpu_compiler

    code, out, _ = run(capsys, "run", "rms-norm")
    assert code == 0 and "kernels built before the first call" in out
    if cpu_compiler() is not None:
        assert "ran: 1 segment on generated kernels (cpp: 1), 0 on torch while their kernels build" in out
    code, out, _ = run(capsys, "run", "rms-norm", "--json")
    result = json.loads(out)
    assert result["builds"] == "before the first call" and result["segments_run"]["waiting_for_builds"] == 0
    assert result["segments_run"]["on_kernels"] + result["segments_run"]["on_torch"] == result["launches"]


def test_run_with_background_builds_says_torch_ran(capsys, tmp_path, monkeypatch) -> None:
    """``--background-builds``: a kernel not built yet when the call comes (held back here, in a
    cold cache) runs on torch, and the output says so; the values still match eager."""
    import threading

    from runtime.codegen import build

    if build.cpu_compiler() is None:
        pytest.skip("no C++ compiler: no kernels to build")
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_CPU", {})
    gate = threading.Event()
    real = build.build_cpu_many

    def held(*args, **kwargs):
        gate.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "build_cpu_many", held)
    try:
        code, out, _ = run(capsys, "run", "rms-norm", "--background-builds", "--json")
    finally:
        gate.set()
        build.wait_for_background_builds()
    result = json.loads(out)
    assert code == 0 and result["builds"] == "in the background" and result["max_abs_diff"] < 1e-5
    assert result["segments_run"] == {"on_kernels": 0, "kernels_by_backend": {}, "waiting_for_builds": 1,
                                      "on_torch": 0, "metadata": 0}
    assert "0 segments on generated kernels, 1 on torch while their kernels build" in result["ran"]
