"""Note [the protocol] in perf/compiled.py: each benchmark's record carries, per contestant, the
first call, the window of calls after it and the settled time, with fuseg/eager and
fuseg/Inductor per phase; and Note [the speed table] in perf/records.py: the README's speed table
puts the CPU kinds side by side, and ``--check`` tells when it is stale. Tiny models, windows of
a fraction of a second and stand-in backends (dynamo's "eager" and "aot_eager" for Inductor and
fuseg, where the bookkeeping is the point): nothing here asserts a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from perf import compiled, records

PHASES = ("first_call", "window", "settled")


def _check_protocol(p: dict[str, Any], contestants: list[str], window: float) -> None:
    """The fields every benchmark's ``protocol`` has, positive, and ratios that are the ratios of them."""
    assert p["window_s"] == window and p["order"] == contestants
    for c in contestants:
        e = p[c]
        assert "error" not in e, e
        assert e["first_call_s"] > 0 and e["settled_s"] > 0
        w = e["window"]
        assert w["calls"] >= 1 and w["elapsed_s"] > 0
        assert w["mean_s"] == pytest.approx(w["elapsed_s"] / w["calls"])
        assert 0 < w["median_s"] <= w["max_s"] and w["mean_s"] <= w["max_s"]
        assert e["window_vs_eager_settled"] == pytest.approx(w["mean_s"] / p["eager"]["settled_s"])
        every = p.get("eager_every") if c != "eager" else 0
        if "eager_calls" in w:  # Note [eager at the same moments]
            assert every and w["eager_calls"] >= 1 and w["eager_mean_s"] > 0
            assert e["window_vs_eager_same_moments"] == pytest.approx(w["mean_s"] / w["eager_mean_s"])
        else:  # (one in every calls is eager's: a window of that many calls or more has one)
            assert "window_vs_eager_same_moments" not in e and (not every or w["calls"] < every)
    f, eager, ind = p["fuseg"], p["eager"], p["inductor"]
    fs, is_ = f.get("window_vs_eager_same_moments"), ind.get("window_vs_eager_same_moments")
    assert p["fuseg_vs_eager"] == pytest.approx({
        "first_call": f["first_call_s"] / eager["first_call_s"],
        "window": fs if fs is not None else f["window"]["mean_s"] / eager["settled_s"],
        "settled": f["settled_s"] / eager["settled_s"]})
    assert p["fuseg_vs_inductor"] == pytest.approx({
        "first_call": f["first_call_s"] / ind["first_call_s"],
        "window": fs / is_ if fs is not None and is_ is not None else f["window"]["mean_s"] / ind["window"]["mean_s"],
        "settled": f["settled_s"] / ind["settled_s"]})


def test_a_window_counts_every_call_it_times() -> None:
    calls = []
    times = compiled.timed_window(lambda: calls.append(1), 0.05)
    assert len(times) == len(calls) >= 1 and all(t >= 0 for t in times)
    assert len(compiled.timed_window(lambda: None, 1e-9)) == 1  # at least one call, however short the window


def test_a_window_with_a_reference_makes_every_nth_call_the_references() -> None:
    """With ``every`` 3, calls 3, 6, 9, ... are the reference's, each timed apart; the window's own
    calls are the others (Note [eager at the same moments])."""
    made: list[str] = []
    ref_times: list[float] = []
    times = compiled.timed_window(lambda: made.append("c"), 0.05, lambda: made.append("e"), 3, ref_times)
    assert len(times) == made.count("c") and len(ref_times) == made.count("e") >= 1
    assert all(m == ("e" if k % 3 == 2 else "c") for k, m in enumerate(made))
    with pytest.raises(ValueError, match="every"):
        compiled.timed_window(lambda: None, 0.01, lambda: None, 1)


def test_window_ratios_are_taken_against_eager_at_the_same_moments() -> None:
    """fuseg/eager's window: fuseg's mean over the eager calls among its window (not eager's
    settled time, measured minutes later); fuseg/Inductor's: that over Inductor's same ratio. A
    contestant whose window has no eager call falls back to the plain ratio of the means."""
    order = ["eager", "inductor", "fuseg"]
    first = {"eager": 0.1, "inductor": 20.0, "fuseg": 2.0}
    windows = {"eager": [0.1] * 4, "inductor": [0.3] * 4, "fuseg": [0.2] * 4}
    settled = {"eager": 0.1, "inductor": 0.09, "fuseg": 0.08}
    p = compiled.protocol_record(30.0, order, first, windows, settled, None,
                                 {"inductor": [0.2, 0.2], "fuseg": [0.25, 0.25]})
    assert p["fuseg"]["window"]["eager_calls"] == 2 and p["fuseg"]["window"]["eager_mean_s"] == pytest.approx(0.25)
    assert p["fuseg"]["window_vs_eager_same_moments"] == pytest.approx(0.8)
    assert p["inductor"]["window_vs_eager_same_moments"] == pytest.approx(1.5)
    assert p["fuseg_vs_eager"]["window"] == pytest.approx(0.8)  # not 0.2 / 0.1 (eager settled)
    assert p["fuseg_vs_inductor"]["window"] == pytest.approx(0.8 / 1.5)  # not 0.2 / 0.3
    assert "window_vs_eager_same_moments" not in p["eager"]
    plain = compiled.protocol_record(30.0, order, first, windows, settled, None, {"fuseg": [0.25]})
    assert plain["fuseg_vs_inductor"]["window"] == pytest.approx(0.2 / 0.3)
    assert plain["fuseg_vs_eager"]["window"] == pytest.approx(0.8)


def test_the_record_of_a_contestant_that_failed_has_no_ratio_to_it() -> None:
    p = compiled.protocol_record(2.0, ["eager", "inductor", "fuseg"], {"eager": 0.1, "fuseg": 3.0},
                                 {"eager": [0.1, 0.1], "fuseg": [0.4, 0.2, 0.3]}, {"eager": 0.1, "fuseg": 0.05},
                                 {"inductor": {"error": "BackendCompilerFailed: x"}})
    assert p["inductor"] == {"error": "BackendCompilerFailed: x"} and "fuseg_vs_inductor" not in p
    assert p["fuseg"]["window"]["calls"] == 3 and p["fuseg"]["window"]["median_s"] == pytest.approx(0.3)
    assert p["fuseg_vs_eager"] == pytest.approx({"first_call": 30.0, "window": 3.0, "settled": 0.5})


@pytest.fixture
def stand_ins(monkeypatch):
    """Inductor and fuseg as dynamo's "eager" and "aot_eager" (compiled in milliseconds)."""
    real = compiled._compile

    def compile_(fn, variant):
        if variant in ("inductor", "fuseg"):
            torch._dynamo.reset()  # (a backend per contestant: dynamo would reuse the other's graphs)
            return torch.compile(fn, backend={"inductor": "eager", "fuseg": "aot_eager"}[variant]), None
        return real(fn, variant)

    monkeypatch.setattr(compiled, "_compile", compile_)


def test_compiled_protocol_records_each_phase_per_contestant(stand_ins) -> None:
    row = compiled.protocol_model("mlp", window=0.2, rounds=2, calls=3, order=("eager", "fuseg", "inductor"))
    p = row["protocol"]
    _check_protocol(p, ["eager", "fuseg", "inductor"], 0.2)
    assert p["fuseg"]["builds_under_way_after_window"] >= 0 and p["fuseg"]["waited_for_builds_s"] >= 0
    # the settled keys of a bench_compiled row (what the summary and the README's tables read)
    assert row["fuseg_ms"] == pytest.approx(1e3 * p["fuseg"]["settled_s"])
    assert row["fuseg_vs_eager"] == pytest.approx(p["fuseg_vs_eager"]["settled"])
    assert row["fuseg_vs_inductor"] == pytest.approx(p["fuseg_vs_inductor"]["settled"])
    assert row["first_call_vs_inductor"] == pytest.approx(p["fuseg_vs_inductor"]["first_call"])
    assert row["fuseg_max_abs_diff"] < 1e-5 and row["inductor_max_abs_diff"] < 1e-5
    s = compiled.summary([row])["all"]["protocol"]
    assert s["median_fuseg_vs_inductor"] == pytest.approx(p["fuseg_vs_inductor"])
    assert s["window_slower_than_eager"] == (["mlp"] if p["fuseg_vs_eager"]["window"] > 1 else [])


def test_compiled_main_writes_a_protocol_record(stand_ins, monkeypatch, tmp_path) -> None:
    """``--protocol --window``: one (here in-process) protocol per model, Inductor and fuseg
    swapping places from one model to the next; the record names the machine and the window."""
    seen = []

    def child(name, window, rounds, calls, order, dtype="float32", eager_every=compiled.EAGER_EVERY):
        seen.append((order, eager_every))
        return compiled.protocol_model(name, window, rounds, calls, order, dtype, eager_every)

    monkeypatch.setattr(compiled, "protocol_child", child)
    out = tmp_path / "r.json"
    assert compiled.main(["mlp", "softmax", "--protocol", "--window", "0.1", "--rounds", "1", "--calls", "2",
                          "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert seen == [(("eager", "inductor", "fuseg"), 5), (("eager", "fuseg", "inductor"), 5)]
    assert d["protocol_window_s"] == 0.1 and d["first_calls"] == 0 and d["eager_every"] == 5
    assert {"cpu", "cpu_flags", "compiler", "torch_threads"} <= set(d["environment"])
    for row, (order, _) in zip(d["rows"], seen):
        _check_protocol(row["protocol"], list(order), 0.1)
        assert row["protocol"]["eager_every"] == 5
    assert set(d["summary"]["all"]["protocol"]["median_fuseg_vs_eager"]) == set(PHASES)
    seen.clear()  # --eager-every 0: no eager call in a window, the ratios against eager's settled time
    assert compiled.main(["mlp", "--protocol", "--window", "0.1", "--rounds", "1", "--calls", "2",
                          "--eager-every", "0", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert seen == [(("eager", "inductor", "fuseg"), 0)] and d["eager_every"] == 0
    _check_protocol(d["rows"][0]["protocol"], ["eager", "inductor", "fuseg"], 0.1)
    assert "eager_calls" not in d["rows"][0]["protocol"]["fuseg"]["window"]
    with pytest.raises(SystemExit):
        compiled.main(["mlp", "--protocol", "--eager-every", "1"])


def test_compiled_protocol_in_bfloat16_casts_the_model_and_says_so(stand_ins, monkeypatch, tmp_path) -> None:
    """``--dtype bfloat16``: the model's parameters and floating inputs in bf16 (what each contestant
    runs), the record and each row name the dtype; without --protocol it is refused."""
    fn, inputs = compiled.load_model("mlp", "cpu", "bfloat16")
    assert {p.dtype for p in fn.parameters()} == {torch.bfloat16}
    assert all(t.dtype == torch.bfloat16 for t in inputs if t.is_floating_point())
    monkeypatch.setattr(compiled, "protocol_child",
                        lambda name, window, rounds, calls, order, dtype, eager_every: compiled.protocol_model(
                            name, window, rounds, calls, order, dtype, eager_every))
    out = tmp_path / "r.json"
    assert compiled.main(["mlp", "--protocol", "--window", "0.1", "--rounds", "1", "--calls", "2",
                          "--dtype", "bfloat16", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["dtype"] == "bfloat16" and d["rows"][0]["dtype"] == "bfloat16" and d["first_calls"] == 0
    _check_protocol(d["rows"][0]["protocol"], ["eager", "inductor", "fuseg"], 0.1)
    with pytest.raises(SystemExit):
        compiled.main(["mlp", "--dtype", "bfloat16"])


def test_a_train_step_protocol_undoes_the_windows_updates_before_the_check() -> None:
    """With a window each variant takes more steps than the others before the check; their
    updates are undone, so fuseg's step still matches eager's from the same weights (and the eager
    steps among fuseg's window are a copy's of their own)."""
    from perf.train_step import run_model, summary

    row = run_model("llama-tiny", rounds=1, steps=2, variants_wanted=["eager", "fuseg"], window=0.3, eager_every=2)
    p = row["protocol"]
    assert p["order"] == ["eager", "fuseg"] and p["window_s"] == 0.3 and p["eager_every"] == 2
    # every second step of fuseg's window an eager copy's (Note [eager at the same moments]), none in eager's
    w = p["fuseg"]["window"]
    assert w["eager_calls"] >= 1 and p["fuseg_vs_eager"]["window"] == pytest.approx(w["mean_s"] / w["eager_mean_s"])
    assert "eager_calls" not in p["eager"]["window"]
    for v in ("eager", "fuseg"):
        assert p[v]["window"]["calls"] >= 1 and p[v]["first_call_s"] == row["first_step_s"][v]
        assert p[v]["settled_s"] == pytest.approx(row["step_ms"][v] / 1e3)
    assert p["fuseg_vs_eager"]["settled"] == pytest.approx(row["fuseg_over_eager"])
    assert "fuseg_vs_inductor" not in p
    check = row["check_against_eager"]["fuseg"]
    assert check["loss_diff"] < 1e-5 and check["max_grad_diff"] < 1e-5 * max(1.0, check["max_grad"])
    row["fuseg_over_inductor"] = 1.0  # (the summary reads rows with Inductor)
    assert summary([row])["protocol"]["median_fuseg_vs_eager"]["window"] == p["fuseg_vs_eager"]["window"]


def test_processes_merge_their_protocols_number_by_number() -> None:
    from perf.train_step import _median_tree

    a = {"window_s": 1.0, "order": ["eager", "fuseg"], "fuseg": {"window": {"calls": 3, "mean_s": 0.1}}}
    b = {"window_s": 1.0, "order": ["fuseg", "eager"], "fuseg": {"window": {"calls": 5, "mean_s": 0.3}}}
    c = {"window_s": 1.0, "order": ["eager", "fuseg"], "fuseg": {"window": {"calls": 4, "mean_s": 0.2}}}
    assert _median_tree([a, b, c]) == {"window_s": 1.0, "order": ["eager", "fuseg"],
                                       "fuseg": {"window": {"calls": 4, "mean_s": 0.2}}}


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph dynamo hands a backend has a symbolic size among its inputs."""
    for n in gm.graph.nodes:
        v = n.meta.get("example_value") if n.op == "placeholder" else None
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape)):
            return True
    return False


def _graphs_seen_by(name: str, seen: list[tuple[str, bool]]) -> Any:
    """A backend that runs the graph as it is and notes, per graph, whether its sizes are symbolic."""
    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append((name, _symbolic(gm)))
        return gm.forward
    return backend


def test_a_contestant_compiles_as_if_alone_in_its_process() -> None:
    """A plain second ``torch.compile`` of a function whose sizes
    changed under the first one starts with symbolic sizes; ``compile_alone`` starts static (Note
    [contestants compile alone])."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1

    torch._dynamo.reset()
    seen: list[tuple[str, bool]] = []
    first = compiled.compile_alone(f, backend=_graphs_seen_by("first", seen))
    first(torch.ones(3))
    first(torch.ones(4))
    torch.compile(f, backend=_graphs_seen_by("plain", seen))(torch.ones(5))
    alone = compiled.compile_alone(f, backend=_graphs_seen_by("alone", seen))
    alone(torch.ones(6))
    alone(torch.ones(7))
    assert seen == [("first", False), ("first", True), ("plain", True), ("alone", False), ("alone", True)]
    torch._dynamo.reset()


def test_a_generate_protocol_times_new_lengths_in_its_window(monkeypatch) -> None:
    """Stand-in backends that note their graphs: each contestant's first generate compiles graphs
    of fixed sizes, as in a process of its own, whoever came before it (Note [contestants compile
    alone]); the second length makes them symbolic."""
    from perf import dynamic_shapes as ds

    monkeypatch.setattr(ds, "LENGTHS", (5, 9, 13))
    monkeypatch.setattr(ds, "NEW_TOKENS", 2)
    real = ds._compiled_forward
    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(ds, "_compiled_forward", lambda model, backend: real(
        model, _graphs_seen_by(backend, seen) if backend != "eager" else backend))
    torch._dynamo.reset()
    row = ds.run_generate_protocol("qwen2", ["eager", "inductor", "fuseg"], 0.2, 2, eager_every=2)
    p = row["protocol"]
    assert p["eager_every"] == 2  # (an eager copy's generates among a compiled backend's: _check_protocol)
    _check_protocol(p, ["eager", "inductor", "fuseg"], 0.2)
    for b in ("eager", "inductor", "fuseg"):
        assert 1 <= p[b]["window_lengths_new"] <= 2 and len(row["settled_seconds"][b]) == 2
        assert row["tokens_equal_eager"][b] == [True, True]
    for b in ("inductor", "fuseg"):
        graphs = [symbolic for name, symbolic in seen if name == b]
        assert graphs[0] is False and True in graphs, (b, graphs)
    assert ds.protocol_orders(["eager", "inductor", "fuseg"], 3) == [
        ["eager", "inductor", "fuseg"], ["eager", "fuseg", "inductor"], ["eager", "inductor", "fuseg"]]


def test_generate_protocol_main_writes_a_record(monkeypatch, tmp_path) -> None:
    from perf import dynamic_shapes as ds

    def child(kind, name, backend, repeats, before=None, device="cpu", window=None):
        assert kind == "protocol" and window == 0.5 and before is None
        order = backend.split(",")
        first = {b: 1.0 + k for k, b in enumerate(order)}
        return {"model": name, "protocol": compiled.protocol_record(window, order, first, {b: [0.2, 0.1] for b in order},
                                                                    {b: 0.1 * (k + 1) for k, b in enumerate(order)})}

    monkeypatch.setattr(ds, "_child", child)
    out = tmp_path / "g.json"
    assert ds.main(["--protocol", "--window", "0.5", "--models", "qwen2", "phi3", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["benchmark"] == "dynamic_shapes/generate-protocol" and d["protocol_window_s"] == 0.5
    assert d["results"]["phi3"]["protocol"]["order"] == ["eager", "fuseg", "inductor"]
    assert set(d["summary"]["protocol"]["median_fuseg_vs_inductor"]) == set(PHASES)
    with pytest.raises(SystemExit):
        ds.main(["--protocol", "--train"])


# --- the README's speed table from two CPU kinds ---------------------------------------------

def _machine(results: Path, folder: str, name: str, cpu: str) -> Path:
    d = results / folder
    d.mkdir(parents=True)
    (d / "machine.json").write_text(json.dumps({"name": name, "cpu": cpu, "gpu": None, "about": f"{name}."}))
    return d


def _record(path: Path, data: dict[str, Any], row: str, date: str = "2026-12-07") -> None:
    data["record"] = {"what": "x", "date": date, "commit": None, "command": "python -m perf.compiled", "row": row}
    path.write_text(json.dumps(data))


def _compiled_record(cpu: str, models: dict[str, tuple[float, float]], protocol: bool) -> dict[str, Any]:
    rows = []
    for name, (e, i) in models.items():
        row: dict[str, Any] = {"model": name, "held_out": False, "fuseg_vs_eager": e, "fuseg_vs_inductor": i}
        if protocol:
            row["protocol"] = {"window_s": 30.0, "fuseg_vs_eager": {"first_call": 40.0, "window": 1.25, "settled": e},
                               "fuseg_vs_inductor": {"first_call": 0.2, "window": 0.95, "settled": i}}
        rows.append(row)
    return {"benchmark": "compiled models, cpu", "environment": {"cpu": cpu}, "rows": rows,
            "summary": compiled.summary(rows)}


@pytest.fixture
def two_cpu_kinds(tmp_path) -> Path:
    results = tmp_path / "perf" / "results"
    old = _machine(results, "cpu-old", "Old CPU, 2 vCPUs", "Old CPU")
    new = _machine(results, "cpu-new", "New CPU, 2 vCPUs", "New CPU")
    gpu = results / "gpu-box"
    gpu.mkdir()
    (gpu / "machine.json").write_text(json.dumps({"name": "A GPU", "cpu": None, "gpu": "G", "about": "."}))
    # an older record without the protocol's fields, and a later one with them
    _record(old / "compiled.json", _compiled_record("Old CPU (family 1)", {"gpt2-768": (0.8, 0.9)}, False),
            "Inference, old")
    _record(new / "compiled.json", _compiled_record("New CPU (family 2)", {"gpt2-768": (1.1, 1.3), "vit-768": (0.5, 0.7)},
                                                    True), "Inference, new")
    _record(new / "train.json", {"results": [{"model": "llama-tiny", "fuseg_over_eager": 0.6, "fuseg_over_inductor": 0.9,
                                              "check_against_eager": {"fuseg": {"max_grad_diff": 1e-7}}}],
                                 "summary": {"median_fuseg_over_eager": 0.6, "median_fuseg_over_inductor": 0.9,
                                             "max_grad_diff": 1e-7}}, "Training step")
    order = ["eager", "inductor", "fuseg"]
    generate = compiled.protocol_record(30.0, order, {"eager": 1.0, "inductor": 20.0, "fuseg": 4.0},
                                        {"eager": [0.1] * 3, "inductor": [0.5, 0.1], "fuseg": [0.2, 0.05, 0.05]},
                                        {"eager": 0.1, "inductor": 0.04, "fuseg": 0.03})
    _record(new / "generate.json", {"benchmark": "dynamic_shapes/generate-protocol", "results": {"qwen2": {
        "model": "qwen2", "protocol": generate}}, "summary": {"protocol": compiled.protocol_summary(
            [{"model": "qwen2", "protocol": generate}])}}, "Generation")
    return results


def test_the_speed_table_puts_each_cpu_kind_in_a_column(two_cpu_kinds) -> None:
    text = records.speed_table(records.load(two_cpu_kinds))
    lines = text.splitlines()
    assert "| Workload | Model | New CPU, 2 vCPUs | Old CPU, 2 vCPUs |" in lines  # (no GPU machine)
    assert "| Inference | gpt2-768 | 1.10x / 1.30x; first 30 s 1.25x / 0.95x | 0.80x / 0.90x |" in lines
    assert "| Inference | vit-768 | 0.50x / 0.70x; first 30 s 1.25x / 0.95x |  |" in lines
    assert "| Training step | llama-tiny | 0.60x / 0.90x |  |" in lines
    assert lines.index("| Inference | vit-768 | 0.50x / 0.70x; first 30 s 1.25x / 0.95x |  |") < lines.index(
        "| Training step | llama-tiny | 0.60x / 0.90x |  |")
    assert "| Generation, new prompt lengths | qwen2 | 0.30x / 0.75x; first 30 s 1.00x / 0.33x |  |" in lines
    assert "[compiled.json](perf/results/{}) (2026-12-07)".format("cpu-old/compiled.json") in text  # (not a path of the tree)
    # the per-record table under it: the protocol's headline in "Also"
    full = records.table(records.load(two_cpu_kinds))
    assert "first 30 s after the first call 1.25x / 0.95x" in full
    assert "| Generation | New CPU, 2 vCPUs | 1 models | 0.30x | 0.75x | settled generate; first 30 s after" in full


def test_the_readme_summary_gives_each_workloads_median_and_worst_per_cpu_kind(two_cpu_kinds) -> None:
    loaded = records.load(two_cpu_kinds)
    text = records.speed_summary(loaded)
    lines = text.splitlines()
    assert "| Workload | New CPU, 2 vCPUs | Old CPU, 2 vCPUs |" in lines
    # new CPU: gpt2 1.10/1.30 and vit 0.50/0.70 -> median 0.80/1.00, worst 1.10/1.30; its window 1.25/0.95
    assert ("| Inference | 0.80x / 1.00x, worst 1.10x / 1.30x (2 models); first 30 s: 1.25x / 0.95x, worst 1.25x / 0.95x | "
            "0.80x / 0.90x, worst 0.80x / 0.90x (1 models) |") in lines
    assert "| Training step | 0.60x / 0.90x, worst 0.60x / 0.90x (1 models) |  |" in lines
    assert lines.index("| Training step | 0.60x / 0.90x, worst 0.60x / 0.90x (1 models) |  |") < [
        i for i, line in enumerate(lines) if line.startswith("| Generation")][0]
    assert records.table(loaded).startswith(text)  # the README's table: the summary, then every headline record
    assert "## Speed per model and CPU kind" in records.index(loaded)  # each model's figures: the records' index
    assert records.speed_table(loaded) in records.index(loaded)


def test_a_later_record_of_a_machine_overrides_an_earlier_ones_model(two_cpu_kinds) -> None:
    _record(two_cpu_kinds / "cpu-old" / "again.json",
            _compiled_record("Old CPU (family 1)", {"gpt2-768": (0.7, 0.75)}, False), "Inference, again", "2026-12-08")
    lines = records.speed_table(records.load(two_cpu_kinds)).splitlines()
    assert "| Inference | gpt2-768 | 1.10x / 1.30x; first 30 s 1.25x / 0.95x | 0.70x / 0.75x |" in lines


def test_a_bfloat16_record_is_a_workload_of_its_own(two_cpu_kinds) -> None:
    """A ``perf.compiled --dtype bfloat16`` record's models (the same names as float32's) go in a
    workload row of their own, after float32's, and leave float32's figures as they were."""
    data = _compiled_record("New CPU (family 2)", {"gpt2-768": (0.9, 1.05)}, True)
    data["dtype"] = "bfloat16"
    _record(two_cpu_kinds / "cpu-new" / "bf16.json", data, "Inference, bf16", "2026-12-08")
    lines = records.speed_table(records.load(two_cpu_kinds)).splitlines()
    assert "| Inference | gpt2-768 | 1.10x / 1.30x; first 30 s 1.25x / 0.95x | 0.80x / 0.90x |" in lines
    bf16 = "| Inference, bfloat16 | gpt2-768 | 0.90x / 1.05x; first 30 s 1.25x / 0.95x |  |"
    assert bf16 in lines and lines.index(bf16) < [i for i, x in enumerate(lines) if x.startswith("| Training")][0]
    summary = records.speed_summary(records.load(two_cpu_kinds)).splitlines()
    assert any(x.startswith("| Inference, bfloat16 | 0.90x / 1.05x, worst 0.90x / 1.05x (1 models)") for x in summary)


def test_check_tells_a_stale_speed_table(two_cpu_kinds, monkeypatch, capsys) -> None:
    root = two_cpu_kinds.parent.parent
    readme = root / "README.md"
    readme.write_text(f"# r\n{records.BEGIN}\nold\n{records.END}\n")
    monkeypatch.setattr(records, "RESULTS", two_cpu_kinds)
    monkeypatch.setattr(records, "README", readme)
    monkeypatch.setattr(records, "ROOT", root)
    assert records.main(["--check"]) == 1
    assert "README.md is out of date" in capsys.readouterr().err
    assert records.main([]) == 0 and records.main(["--check"]) == 0
    assert "| Inference | 0.80x / 1.00x, worst 1.10x / 1.30x (2 models)" in readme.read_text()
    # a new record on one CPU kind makes the table stale again
    _record(two_cpu_kinds / "cpu-old" / "again.json",
            _compiled_record("Old CPU (family 1)", {"gpt2-768": (0.7, 0.75)}, True), "Inference, again", "2026-12-08")
    assert records.main(["--check"]) == 1
