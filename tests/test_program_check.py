"""Note [a program against its ATen path] (runtime/compiled/trial.py): a CPU program of fixed sizes that
runs generated kernels is tried against the same plan with every segment on torch, on its first
calls, and keeps the faster way; the verdict is kept, so a later program takes that way at once.
Every call computes what eager does either way. No test depends on a timing: the trial's times
are given (``trial._timed``), in a fresh cache dir."""

from __future__ import annotations

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime import autotune
from runtime.codegen.build import cpu_compiler
from runtime.compiled import trial
from segmenter import capture, segment
from tests.test_trial import _ways as _clock  # the trial's timed calls take given seconds each way

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


@pytest.fixture
def measuring(tmp_path, monkeypatch):
    """A fresh cache (verdict file), measuring on, programs tried against their ATen path."""
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    with autotune.fixed("measure"), trial.program_checks(True):
        yield


def _fn(x, y):
    """A pointwise segment and a row reduction: two generated kernels, nothing measured alone."""
    h = torch.tanh(x) * y + 1
    return h - h.sum(-1, keepdim=True), torch.sigmoid(y) * 3


def _inputs(rows: int):
    g = torch.Generator().manual_seed(rows)
    return [torch.randn(rows, 40, generator=g), torch.randn(rows, 40, generator=g)]


def _program(inputs):
    return runtime.compile(apply_aliases(segment(capture(_fn, inputs)), "post"))


def _exact(prog, inputs) -> None:
    got, want = prog(*inputs), _fn(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()


def _generated(prog) -> list[int]:
    return sorted(i for i, b in prog.backend_of.items() if b == "cpp")


@pytest.mark.parametrize("rows", [6, 33])
def test_a_program_slower_than_its_aten_path_runs_on_torch(rows, measuring, monkeypatch) -> None:
    inputs = _inputs(rows)
    ran = _clock(monkeypatch, aten_s=1e-3, kernel_s=1.5e-3)
    prog = _program(inputs)
    kernels = _generated(prog)
    assert len(kernels) >= 2 and prog.trial is not None
    calls = 2 + 2 * trial.CALLS
    for _ in range(calls):
        _exact(prog, inputs)  # either way, every call
    assert len(ran) == calls and sorted(set(ran)) == ["aten", "kernel"]
    assert prog.trial is None and not prog.trial_result["kernels"]
    assert prog.trial_result["against"] == "its ATen path"
    assert _generated(prog) == [] and prog.kernels == {}
    for i in kernels:
        assert prog.backend_of[i] == "torch"
        assert "ATen path" in dict(prog.passed_over[i])["cpp"]
    _exact(prog, inputs)
    assert len(ran) == calls  # decided: no more trial
    (verdict,) = [v for k, v in autotune._MEMORY[autotune.verdict_path()].items() if "ATen path" in k]
    assert not verdict.kernel and verdict.aten_us == pytest.approx(1e3) and verdict.kernel_us == pytest.approx(1.5e3)
    # a later process with the same cache: the ATen path at once, no trial, nothing timed
    monkeypatch.setattr(autotune, "_MEMORY", {})
    again = _program(inputs)
    assert again.trial is None and _generated(again) == [] and again.trial_result["kept"]
    _exact(again, inputs)
    assert len(ran) == calls


@pytest.mark.parametrize("rows", [6, 33])
def test_a_program_faster_than_its_aten_path_keeps_its_kernels(rows, measuring, monkeypatch) -> None:
    inputs = _inputs(rows)
    ran = _clock(monkeypatch, aten_s=2e-3, kernel_s=1e-3)
    prog = _program(inputs)
    kernels = _generated(prog)
    source = prog.source
    for _ in range(2 + 2 * trial.CALLS):
        _exact(prog, inputs)
    assert prog.trial_result["kernels"] and _generated(prog) == kernels and prog.source == source
    monkeypatch.setattr(autotune, "_MEMORY", {})
    again = _program(inputs)
    assert again.trial is None and _generated(again) == kernels
    _exact(again, inputs)
    assert len(ran) == 2 + 2 * trial.CALLS


def test_no_trial_where_choices_are_fixed_or_deterministic(measuring, monkeypatch) -> None:
    inputs = _inputs(6)
    ran = _clock(monkeypatch, aten_s=1e-3, kernel_s=9e-3)
    with autotune.fixed("kernel"):
        assert _program(inputs).trial is None
    with trial.program_checks(False):
        assert _program(inputs).trial is None
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        prog = _program(inputs)
        assert prog.trial is None and _generated(prog)  # its kernels, whatever a timer would say
        for _ in range(4):
            _exact(prog, inputs)
    finally:
        torch.use_deterministic_algorithms(was)
    assert ran == []


def test_a_training_step_is_tried_forward_and_backward(measuring, monkeypatch) -> None:
    """Under torch.compile a training graph's forward and backward are programs of their own:
    each is tried; with ATen's path faster, both end on torch, and gradients stay eager's."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    ran = _clock(monkeypatch, aten_s=1e-3, kernel_s=1.5e-3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    ref.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    compiler = FusegCompiler()
    compiled = torch.compile(model, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    x = torch.randn(8, 16)
    for _ in range(2 + 2 * trial.CALLS + 1):
        model.zero_grad(), ref.zero_grad()
        compiled(x).square().sum().backward()
        ref(x).square().sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)  # a generated matmul sums in its own order
    tried = [p for p in compiler.compiled if p.trial_result is not None]
    assert len(tried) >= 2, [p.trial_result for p in compiler.compiled]  # the forward and the backward
    assert all(not p.trial_result["kernels"] and not _generated(p) for p in tried)
    assert ran


def test_a_drift_tries_a_fixed_program_again(measuring, monkeypatch) -> None:
    """See Note [a verdict checked where timings drift]. ATen's path wins, then its calls take ten
    times as long: one call in ``SAMPLE_EVERY`` is timed, and ``DRIFT_CALLS`` of them in a row off
    the trial's times start the trial again; the kernels win it and the program takes them back.
    A verdict kept from an earlier process is watched the same way."""
    inputs = _inputs(6)
    seconds = {"aten": 1e-3, "kernel": 1.5e-3}

    def timed(way, fn, args):
        ran.append(way)
        return fn(*args), seconds[way]

    ran: list[str] = []
    monkeypatch.setattr(trial, "_timed", timed)
    prog = _program(inputs)
    kernels = _generated(prog)
    calls = 2 + 2 * trial.CALLS
    for _ in range(calls + trial.SAMPLE_EVERY * trial.DRIFT_CALLS - 1):  # sampled, within its times
        _exact(prog, inputs)
    assert not prog.trial_result["kernels"] and prog.trial is None and _generated(prog) == []
    assert ran[calls:] == ["aten"] * (trial.DRIFT_CALLS - 1)
    seconds["aten"] = 10e-3
    for _ in range(trial.SAMPLE_EVERY * trial.DRIFT_CALLS):
        _exact(prog, inputs)  # (drifted at the third sample: the trial again, ended early by GIVE_UP)
    assert prog.trial is None and prog.trial_result["kernels"] and prog.trial_result["reopened"] == 1
    assert _generated(prog) == kernels
    (verdict,) = [v for k, v in autotune._MEMORY[autotune.verdict_path()].items() if "ATen path" in k]
    assert verdict.kernel and verdict.aten_us == pytest.approx(1e4)
    # a later process: the kernels at once, kept; their calls drift too (now ten times slower)
    monkeypatch.setattr(autotune, "_MEMORY", {})
    seconds["kernel"] = 15e-3
    again = _program(inputs)
    assert again.trial is None and again.trial_result["kept"] and _generated(again) == kernels
    for _ in range(trial.SAMPLE_EVERY * trial.DRIFT_CALLS + 2 + 2 * trial.CALLS):
        _exact(again, inputs)
    assert not again.trial_result["kernels"] and again.trial_result["reopened"] == 1 and _generated(again) == []
