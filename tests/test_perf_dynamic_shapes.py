"""perf.dynamic_shapes' bookkeeping (nothing compiled here): the ratios of a round, the variant
that runs another checkout's code, the generate every timing makes (one tiny model, eager)."""

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


def test_the_steady_state_after_the_builds_and_once_settled_are_both_against_inductor() -> None:
    rows = [{"backend": "inductor", "first": 20.0, "new": 0.017, "steady": 0.017},
            {"backend": "fuseg", "second": 2.0, "first": 4.0, "new": 0.03, "steady": 0.03,
             "steady_after_builds": 0.0221, "settled_after_builds": 0.0153}]
    r = ds._ratios(rows)
    assert r["fuseg_steady_after_builds_over_inductor"] == pytest.approx(1.3)
    assert r["fuseg_settled_after_builds_over_inductor"] == pytest.approx(0.9)
    assert "fuseg_settled_after_builds_over_inductor" not in ds._ratios([rows[0], {**rows[1], "settled_after_builds": None}])


def test_a_training_round_names_its_slowest_step_after_the_second() -> None:
    """The training protocol's medians hide one slow step (a new plan at a seen length took 0.4 s
    among 5 ms steps): each backend's slowest step from the third on is recorded too."""
    steps = [5.0, 8.0, 0.005, 0.004, 0.005, 0.006, 0.45, 0.004, 0.005, 0.004, 0.004, 0.005]
    rows = [{"backend": "fuseg", "seconds": steps, "first": 5.0, "new": 0.005, "steady": 0.0045,
             "kernel_builds": [4, 4] + [0] * 10},
            {"backend": "fuseg-before", "seconds": steps[:6] + [0.006] * 6, "second": 8.0},
            {"backend": "eager", "seconds": [0.02] + [0.005] * 11, "steady": 0.005}]
    r = ds._ratios(rows)
    assert r["fuseg_slowest_step_after_second"] == pytest.approx(0.45)
    assert r["before_slowest_step_after_second"] == pytest.approx(0.006)
    assert r["eager_slowest_step_after_second"] == pytest.approx(0.005)
    generate = {"backend": "fuseg", "seconds": steps, "first": 5.0, "new": 0.005, "steady": 0.0045,
                "tokens_equal_eager": [True] * 12}
    assert not any("slowest" in k for k in ds._ratios([generate]))  # (a generate's protocol has its own)


def test_the_code_before_needs_a_checkout() -> None:
    with pytest.raises(ValueError, match="--before DIR"):
        ds._child("generate", "qwen2", "fuseg-before", 1, None)


def test_a_round_whose_fuseg_failed_is_still_recorded(monkeypatch, tmp_path) -> None:
    """A round with no ratio (fuseg failed in its child) is written with its error; the summary
    printed after each model raised KeyError there (the H100's run, 2026-11-27)."""
    import json

    def child(kind, name, backend, repeats, before=None, device="cpu"):
        if backend == "fuseg":
            return {"model": name, "backend": backend, "error": ["InvalidBackend: 'fuseg'"]}
        return {"model": name, "backend": backend, "first": 1.0, "second": 0.5, "new": 0.1, "steady": 0.1}

    monkeypatch.setattr(ds, "_child", child)
    out = tmp_path / "r.json"
    assert ds.main(["--models", "qwen2", "--backends", "aot_eager", "fuseg", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["results"]["qwen2"]["runs"]
    assert [r.get("error") for r in runs] == [None, ["InvalidBackend: 'fuseg'"]]


def test_the_child_passes_its_device_only_off_the_cpu(monkeypatch) -> None:
    """``--device cuda`` reaches the child as a fifth value; on the CPU the child's command is
    what an older checkout's protocol takes (four values)."""
    import subprocess

    seen = []

    def run(cmd, **kw):
        seen.append(cmd[cmd.index("--child") + 1:])
        return subprocess.CompletedProcess(cmd, 0, stdout='{"first": 1}\n', stderr="")

    monkeypatch.setattr(ds.subprocess, "run", run)
    ds._child("generate", "qwen2", "fuseg", 2)
    ds._child("train", "qwen2", "fuseg", 2, device="cuda")
    assert seen == [["generate", "qwen2", "fuseg", "2"], ["train", "qwen2", "fuseg", "2", "cuda"]]


def test_fuseg_is_found_by_name_or_registered(monkeypatch) -> None:
    """``registered_by_name``: True where dynamo finds "fuseg" (the entry point of the installed
    project); where it does not (a registry without it), the backend is registered under the
    name, False is returned, and ``torch.compile(backend="fuseg")`` works."""
    import torch
    from torch._dynamo.backends import registry

    from runtime.dynamo import registered_by_name

    assert registered_by_name() is True
    monkeypatch.setattr(registry, "_BACKENDS", {k: v for k, v in registry._BACKENDS.items() if k != "fuseg"})
    monkeypatch.setattr(registry, "_COMPILER_FNS", {k: v for k, v in registry._COMPILER_FNS.items() if k != "fuseg"})
    monkeypatch.setattr(registry, "_lazy_import", lambda: None)  # (no entry point to discover)
    assert registered_by_name() is False
    assert registered_by_name() is True  # (registered now)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: (x * 2).sin(), backend="fuseg")
    x = torch.randn(5)
    torch.testing.assert_close(fn(x), (x * 2).sin())
    torch._dynamo.reset()


def test_every_generate_makes_the_same_number_of_tokens() -> None:
    """phi3's tiny config (random weights) emits its end token after 11 tokens on the 13-token
    prompt, the protocol's seen length, and after 20-24 on the others: new lengths were compared
    with a seen one doing half the work. The protocol holds every generate to NEW_TOKENS."""
    model = ds._model("phi3")
    for n in (13, 17):
        ids = ds._ids((1, n), n)
        assert ds._generate(model, ids).shape == (1, n + ds.NEW_TOKENS)
    free = model.generate(ds._ids((1, 13), 13), max_new_tokens=ds.NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert free.shape[1] < 13 + ds.NEW_TOKENS  # (what the protocol used to time, so the test can fail)


def test_full_collections_are_timed_per_call() -> None:
    """A full collection (0.2-0.3 s of these heaps) lands in whichever call it falls in: the record
    keeps its time per timed call, and nothing for a call with none."""
    import gc

    clock = ds._FullCollections()
    try:
        clock.take()
        gc.collect(1)  # (a younger generation is not counted)
        assert clock.take() == 0.0
        garbage = [[] for _ in range(20000)]
        for a, b in zip(garbage, garbage[1:]):
            a.append(b)
            b.append(a)
        del garbage, a, b
        gc.collect()
        assert clock.take() > 0.0
        assert clock.take() == 0.0  # (taken)
    finally:
        gc.callbacks.remove(clock._callback)


def test_a_profiled_generate_counts_its_ops(monkeypatch) -> None:
    """``--profile``: one generate under torch's profiler, its ATen calls and costliest host ops
    counted (on the CPU no device kernel and no launch); the children are told by the environment."""
    model = ds._model("phi3")
    monkeypatch.setattr(ds, "_DEVICE", "cpu")
    prof = ds._profiled_generate(model, ds._ids((1, 9), 9))
    assert prof["wall_ms"] > 0 and prof["aten_calls"] > 24  # (24 decode steps, several ops each)
    assert prof["device_kernels"] == 0 and prof["launch_calls"] == 0
    assert prof["top_host_ops"] and all(len(r) == 3 for r in prof["top_host_ops"])
    seen = {}
    monkeypatch.setattr(ds, "_child", lambda *a, **k: seen.setdefault("env", ds.os.environ.get(ds._PROFILE_ENV)) and
                        {"backend": a[2], "error": ["stub"]})
    monkeypatch.setenv(ds._PROFILE_ENV, "0")  # (undone after the test, whatever main sets)
    ds.main(["--models", "qwen2", "--backends", "eager", "--profile", "--out", "/dev/null"])
    assert seen["env"] == "1"


def test_the_verdicts_are_counted_by_their_thread_count(monkeypatch) -> None:
    """A process's verdicts by the torch thread count in their keys: one made beside background
    builds names fewer threads (what to look for in a process slow after its builds)."""
    from runtime import autotune

    v = autotune.Verdict(True, 1.0, 2.0)
    monkeypatch.setattr(autotune, "_MEMORY", {"/a": {"k; threads 2; s0 in [8, 16)": v, "j; threads 1": v},
                                              "/b": {"m; threads 2": v}})
    assert ds._verdicts_by_threads() == {"threads 2": 2, "threads 1": 1}


def test_each_forward_call_of_a_generate_is_timed() -> None:
    """A generate's forward calls, timed on the host: its prefill, then one per decode step,
    with its slowest call named (which call of a slow generate stalled). The timer keeps
    forward's signature (generate reads it to decide what to pass) and the tokens."""
    import inspect

    import torch

    model, ref = ds._model("phi3"), ds._model("phi3")
    params = list(inspect.signature(model.forward).parameters)
    timer = ds._ForwardTimes(model)
    assert list(inspect.signature(model.forward).parameters) == params
    ids = ds._ids((1, 9), 9)
    with torch.no_grad():
        got = ds._generate(model, ids)
    t = timer.take()
    assert t["calls"] == ds.NEW_TOKENS  # (the prefill makes the first token, each decode step one more)
    assert 0 <= t["slowest"][0] < t["calls"] and t["slowest"][1] >= t["median_ms"] > 0
    assert t["sum_ms"] >= t["prefill_ms"] > 0
    assert timer.take() == {"calls": 0}  # (taken)
    with torch.no_grad():
        assert torch.equal(got, ds._generate(ref, ids))


def test_a_training_round_compares_the_settled_steps_of_each_backend() -> None:
    """After the checked steps, every backend steps through the lengths again unchecked
    (``settled``: a size class's first calls measure both ways on an empty cache, Note [a class
    measured on its calls], so the checked steps' median holds trials): settled against settled."""
    rows = [{"backend": "inductor", "first": 20.0, "second": 18.0, "new": 0.003, "steady": 0.003, "settled": 0.0025},
            {"backend": "eager", "first": 0.01, "second": 0.003, "new": 0.003, "steady": 0.003, "settled": 0.0029},
            {"backend": "fuseg", "first": 6.0, "second": 7.0, "new": 0.005, "steady": 0.004, "settled": 0.002,
             "kernel_builds": [5, 4] + [0] * 10}]
    r = ds._ratios(rows)
    assert r["fuseg_settled_over_inductor"] == pytest.approx(0.8)
    assert r["fuseg_settled_over_eager"] == pytest.approx(0.002 / 0.0029)
    assert r["fuseg_steady_over_inductor"] == pytest.approx(0.004 / 0.003)  # (the checked steps' still there)
    assert "fuseg_settled_over_inductor" not in ds._ratios([{**rows[0], "settled": None}, rows[2]])


def test_interleaved_training_times_every_backend_in_one_process() -> None:
    """``--train --interleaved``: the backends' copies of one model step on the same batches in
    one process, the order rotating, the length marked dynamic; each timed pass gives every
    backend one step a length, and each loss is compared with eager's."""
    import torch

    torch._dynamo.reset()
    try:
        out = ds.run_train_interleaved("qwen2", ["eager", "aot_eager"], passes=1, warm=1)
    finally:
        torch._dynamo.reset()
    n = len(set(ds.TRAIN_LENGTHS))
    assert {b: len(v) for b, v in out["seconds"].items()} == {"eager": n, "aot_eager": n}
    assert set(out["median"]) == {"eager", "aot_eager"} and all(v > 0 for v in out["median"].values())
    assert out["max_loss_diff_vs_eager"]["aot_eager"] < 1e-5
    assert out["ratios"] == {}  # (fuseg's ratios only)


def test_interleaved_training_is_refused_where_it_means_nothing(monkeypatch, tmp_path) -> None:
    import json

    for argv in (["--interleaved"], ["--train", "--interleaved", "--backends", "fuseg", "fuseg"],
                 ["--train", "--interleaved", "--backends", "fuseg-before", "fuseg", "--before", "x"]):
        with pytest.raises(SystemExit, match="--interleaved"):
            ds.main(argv)
    seen = []

    def child(kind, name, backend, repeats, before=None, device="cpu"):
        seen.append((kind, name, backend, repeats))
        return {"model": name, "backend": backend, "ratios": {"fuseg_over_inductor": 0.9}}

    monkeypatch.setattr(ds, "_child", child)
    out = tmp_path / "r.json"
    ds.main(["--train", "--interleaved", "--models", "qwen2", "--backends", "inductor", "fuseg", "--rounds", "2",
             "--passes", "3", "--out", str(out)])
    assert seen == [("train-interleaved", "qwen2", "inductor,fuseg", 3)] * 2
    rounds = json.loads(out.read_text())["results"]["qwen2"]["rounds"]
    assert [r["ratios"] for r in rounds] == [{"fuseg_over_inductor": 0.9}] * 2
