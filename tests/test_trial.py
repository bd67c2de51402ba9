"""Note [a kernel tried in its program] (runtime/compiled/trial.py): a program of fixed sizes whose kernels
ATen beat alone runs both ways on its first calls, alternated, and keeps the faster; every call
computes what eager does either way. No test depends on a timing: the verdicts alone and the
trial's times are given."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime import autotune
from runtime.codegen.build import cpu_compiler
from runtime.compiled import trial
from runtime.machine import threads
from segmenter import capture, segment
from tests.test_autotune import _matmul, _verdicts

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache dir (so a fresh verdict file), measuring on, ATen faster alone."""
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    measured: list = []

    def aten_faster(run_kernel, run_aten):
        measured.append((run_kernel(), run_aten()))
        return autotune.Verdict(False, 2.0, 1.0)

    monkeypatch.setattr(autotune, "measure", aten_faster)
    with autotune.fixed("measure"):
        yield measured


def _ways(monkeypatch, aten_s: float, kernel_s: float) -> list[str]:
    """The trial's timed calls take these seconds each way; the list gets the way of every call."""
    ran: list[str] = []

    def timed(way, fn, inputs):
        ran.append(way)
        return fn(*inputs), {"aten": aten_s, "kernel": kernel_s}[way]

    monkeypatch.setattr(trial, "_timed", timed)
    return ran


def _fn(x, w, b):
    return torch.relu(F.linear(torch.tanh(x), w, b)) * 2


def _inputs(rows: int = 16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(rows, 64, generator=g), torch.randn(48, 64, generator=g), torch.randn(48, generator=g)]


def _program(inputs):
    return runtime.compile(apply_aliases(segment(capture(_fn, inputs)), "post"))


def _exact(prog, inputs) -> None:
    """One call of the program against eager: values (a matmul's sums may round apart), strides."""
    (out,) = prog(*inputs)
    want = _fn(*inputs)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert out.stride() == want.stride()


def _tried(monkeypatch, rows: int, aten_s: float, kernel_s: float) -> tuple:
    """Inputs of ``rows`` rows, the trial's ways (``_ways``), their program and its matmul."""
    inputs = _inputs(rows)
    ran = _ways(monkeypatch, aten_s=aten_s, kernel_s=kernel_s)
    prog = _program(inputs)
    return inputs, ran, prog, _matmul(prog)


@pytest.mark.parametrize("rows", [16, 5])
def test_the_kernels_win_in_the_program_and_are_kept_by_later_programs(rows, cache, monkeypatch) -> None:
    inputs, ran, prog, i = _tried(monkeypatch, rows, aten_s=2e-3, kernel_s=1e-3)
    assert len(cache) == 1 and prog.backend_of[i] == "torch" and prog.trial is not None
    calls = 2 + 2 * trial.CALLS
    prog.set_from_outside = "kept"  # (as use_cuda_graphs sets its own): the decision keeps it
    for _ in range(calls):
        _exact(prog, inputs)  # either way, every call
    assert prog.set_from_outside == "kept"
    assert ran[:4] == ["aten", "kernel", "kernel", "aten"]  # pairs alternate their order
    assert sorted(set(ran)) == ["aten", "kernel"] and len(ran) == calls
    assert prog.trial is None and prog.trial_result["kernels"]
    assert prog.trial_result["calls"] == {"aten": trial.CALLS, "kernel": trial.CALLS}
    assert prog.backend_of[i] == "cpp" and "cpp" not in dict(prog.passed_over.get(i, ()))
    assert prog.kernels.get(i) is not None
    _exact(prog, inputs)
    assert len(ran) == calls  # decided: no more trial
    verdicts = _verdicts()
    (key,) = [k for k in verdicts if not k.startswith("program ")]
    assert verdicts[key]["kernel"] and verdicts[key]["kernel_us"] == 2.0  # the isolated times kept
    (record,) = [v for k, v in verdicts.items() if k.startswith("program ")]
    assert record["kernel"] and record["kernel_us"] == pytest.approx(1e3) and record["aten_us"] == pytest.approx(2e3)
    # the same segment in a later program: the kernel from the verdict, nothing measured, no trial
    monkeypatch.setattr(autotune, "_MEMORY", {})
    again = _program(inputs)
    assert again.backend_of[i] == "cpp" and again.trial is None and len(cache) == 1
    _exact(again, inputs)


@pytest.mark.parametrize("rows", [16, 5])
def test_aten_winning_in_the_program_changes_nothing(rows, cache, monkeypatch) -> None:
    inputs, ran, prog, i = _tried(monkeypatch, rows, aten_s=1e-3, kernel_s=1.5e-3)
    source = prog.source
    for _ in range(2 + 2 * trial.CALLS):
        _exact(prog, inputs)
    assert not prog.trial_result["kernels"] and prog.backend_of[i] == "torch"
    assert "measured faster" in dict(prog.passed_over[i])["cpp"] and prog.source == source
    assert [v["kernel"] for k, v in _verdicts().items() if not k.startswith("program ")] == [False]
    monkeypatch.setattr(autotune, "_MEMORY", {})
    assert _program(inputs).trial is None and len(ran) == 2 + 2 * trial.CALLS


def test_a_way_far_slower_ends_the_trial_early(cache, monkeypatch) -> None:
    inputs = _inputs()
    ran = _ways(monkeypatch, aten_s=1e-3, kernel_s=1e-3 * (trial.GIVE_UP + 1))
    prog = _program(inputs)
    for _ in range(2 + 4):
        _exact(prog, inputs)
    assert prog.trial_result == {**prog.trial_result, "kernels": False, "calls": {"aten": 2, "kernel": 2}}
    assert len(ran) == 6


def test_a_close_trial_is_timed_longer(cache, monkeypatch) -> None:
    """Ways 2% apart are not decided at ``CALLS`` timed calls each; the trial goes on to
    ``CLOSE_CALLS`` each, then the faster (the kernels here) keeps the program (Note [a close trial
    is timed longer]). Every call gives eager's values meanwhile."""
    inputs = _inputs()
    ran = _ways(monkeypatch, aten_s=1.02e-3, kernel_s=1e-3)
    prog = _program(inputs)
    for _ in range(2 + 2 * trial.CALLS):
        _exact(prog, inputs)
    assert prog.trial is not None  # (close: not decided yet)
    for _ in range(2 * (trial.CLOSE_CALLS - trial.CALLS)):
        _exact(prog, inputs)
    assert prog.trial is None and len(ran) == 2 + 2 * trial.CLOSE_CALLS
    assert prog.trial_result["kernels"] and prog.trial_result["calls"] == {"aten": trial.CLOSE_CALLS,
                                                                            "kernel": trial.CLOSE_CALLS}
    assert trial.close([1.0, 1.04, 0.98], [1.0]) and not trial.close([1.06], [1.0])


def test_calls_beside_background_builds_or_off_the_fast_entry_are_not_timed(cache, monkeypatch) -> None:
    inputs = _inputs()
    ran = _ways(monkeypatch, aten_s=2e-3, kernel_s=1e-3)
    prog = _program(inputs)
    monkeypatch.setitem(threads._STATE, "busy", True)
    for _ in range(3):
        _exact(prog, inputs)
    monkeypatch.setitem(threads._STATE, "busy", False)
    assert ran == [] and prog.trial.calls == 0
    # inputs that need grad, with grad on: not the fast entry (None), the checked call runs
    grad = [t.clone().requires_grad_() for t in inputs]
    (out,) = prog(*grad)
    torch.testing.assert_close(out, _fn(*inputs), atol=1e-5, rtol=1e-5)
    assert prog.trial.calls == 0 and prog.trial.times == {"aten": [], "kernel": []}


def test_training_at_two_lengths_tries_each_program_and_matches_eager(cache, monkeypatch) -> None:
    """Through torch.compile: a forward and a backward per length, each program of fixed sizes
    with a matmul ATen beat alone, tried and won by the kernels; loss and gradients as eager's
    at every step, on both lengths."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    _ways(monkeypatch, aten_s=2e-3, kernel_s=1e-3)
    compilers: list[FusegCompiler] = []

    def backend(gm, example):
        compilers.append(FusegCompiler(dynamic=False))
        return compile_with_aot(compilers[-1], gm, example)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32))
    compiled = torch.compile(model, backend=backend, dynamic=False)
    torch._dynamo.reset()
    for rows in (8, 24):
        x = torch.randn(rows, 32)
        for _ in range(2 + 2 * trial.CALLS + 1):
            model.zero_grad()
            (compiled(x) ** 2).mean().backward()
            got = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            for g, p in zip(got, model.parameters()):
                torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-5)
    programs = [p for c in compilers for p in c.compiled]
    assert len(programs) == 4  # a forward and a backward per length
    tried = [p for p in programs if p.trial_result is not None]
    assert tried and all(p.trial_result["kernels"] and p.trial is None for p in tried)
    for p in tried:
        assert all(p.backend_of[s] == "cpp" for s in p.trial_result["segments"])


def test_a_program_whose_other_way_cannot_be_made_runs_as_measured(cache, monkeypatch) -> None:
    from runtime.compiled.program import CompiledProgram

    inputs = _inputs()
    finish = CompiledProgram._finish

    def fails_without_build(self, chosen, build=True):
        if not build:
            raise RuntimeError("made up: the second way fails")
        return finish(self, chosen, build)

    monkeypatch.setattr(CompiledProgram, "_finish", fails_without_build)
    prog = _program(inputs)
    i = _matmul(prog)
    assert prog.trial is None and prog.backend_of[i] == "torch"
    assert "measured faster" in dict(prog.passed_over[i])["cpp"]
    for _ in range(3):
        _exact(prog, inputs)
    assert prog.trial_result is None
