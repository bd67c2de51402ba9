"""Note [a program's ATen path per size class] (runtime/compiled/class_check.py) and Note [a verdict
checked where timings drift] (runtime/compiled/trial.py): a symbolic program (``dynamic=True``) is tried
against its ATen path per size class of its call's sizes, keeps a verdict per class in the
verdict file, and opens a class again where its way's timings drift. Every call is compared with
eager, on both ways. No test depends on a timing: the trial's times are given (``trial._timed``),
by way and by the class the test calls, in a fresh cache dir."""

from __future__ import annotations

import pytest
import torch

from runtime import autotune
from runtime.codegen.build import cpu_compiler
from runtime.compiled import trial

from .test_program_check import _fn, _generated, _inputs, measuring  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")

SMALL, LARGE = 6, 33  # rows: two power-of-two classes ([4, 8) and [32, 64))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _clock(monkeypatch, seconds: dict[tuple[int, str], float]) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """The timed calls take ``seconds[(rows, way)]``, rows being what the test calls now
    (``now["rows"]``); the list gets (rows, way) of every timed call."""
    ran: list[tuple[int, str]] = []
    now = {"rows": 0}

    def timed(way, fn, inputs):
        ran.append((now["rows"], way))
        return fn(*inputs), seconds[(now["rows"], way)]

    monkeypatch.setattr(trial, "_timed", timed)
    return ran, now


def _compiled(fn):
    from runtime.dynamo import FusegCompiler, compile_with_aot

    compiler = FusegCompiler()
    return compiler, torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)


def _exact(compiled, rows: int) -> None:
    inputs = _inputs(rows)
    got, want = compiled(*inputs), _fn(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()


def _program(compiler):
    (prog,) = compiler.compiled
    assert prog.sizes is not None and prog.class_check is not None
    return prog


def _way(prog, bits) -> str:
    return prog.class_check.table[bits].__self__.way  # (a decided class's entry: its ``Steady``)


def _by_rows(prog) -> dict[int, tuple[int, ...]]:
    """The class of each row count the tests call."""
    return {rows: prog.class_check.class_of(*_inputs(rows)) for rows in (SMALL, LARGE)}


def _program_verdicts() -> dict[str, autotune.Verdict]:
    return {k: v for k, v in autotune._MEMORY[autotune.verdict_path()].items() if "ATen path" in k}


TRIED = 2 + 2 * trial.CALLS  # a class's calls until it is decided (none GIVE_UP times the other)


def test_a_symbolic_program_decides_per_size_class(measuring, monkeypatch) -> None:  # noqa: F811
    """Small rows: ATen's path faster; large rows: the kernels. Each class decides on its own
    calls, both ways give eager's values, and a second process with the same cache takes each
    class's way at once."""
    ran, now = _clock(monkeypatch, {(SMALL, "aten"): 1e-3, (SMALL, "kernel"): 1.5e-3,
                                    (LARGE, "aten"): 2e-3, (LARGE, "kernel"): 1e-3})
    compiler, compiled = _compiled(_fn)
    for rows in (SMALL, LARGE):
        now["rows"] = rows
        for _ in range(TRIED + 2):
            _exact(compiled, rows)
    prog = _program(compiler)
    assert len(_generated(prog)) >= 2  # (the checked path: the kernel way)
    classes = _by_rows(prog)
    assert classes[SMALL] != classes[LARGE]
    results = prog.class_check.results
    assert set(results) == set(classes.values())
    assert not results[classes[SMALL]]["kernels"] and results[classes[LARGE]]["kernels"]
    assert _way(prog, classes[SMALL]) == "aten" and _way(prog, classes[LARGE]) == "kernel"
    for rows in (SMALL, LARGE):  # each class's first calls alternated the two ways
        ways = [w for r, w in ran if r == rows]
        assert len(ways) == TRIED and ways[:4] == ["aten", "kernel", "kernel", "aten"]
    verdicts = _program_verdicts()
    assert len(verdicts) == 2 and all(" in [" in k for k in verdicts)  # one a class, keyed by its sizes' classes
    assert sorted(v.kernel for v in verdicts.values()) == [False, True]
    for rows in (SMALL, LARGE):  # decided: the chosen way, eager's values
        now["rows"] = rows
        _exact(compiled, rows)
    assert len(ran) == 2 * TRIED

    # a second process with the same cache: each class's way at once, nothing timed
    monkeypatch.setattr(autotune, "_MEMORY", {})
    torch._dynamo.reset()
    compiler, compiled = _compiled(_fn)
    for rows in (SMALL, LARGE):
        now["rows"] = rows
        for _ in range(3):
            _exact(compiled, rows)
    again = _program(compiler)
    assert len(ran) == 2 * TRIED
    kept = again.class_check.results
    assert all(r["kept"] for r in kept.values())
    assert {b: r["kernels"] for b, r in kept.items()} == {b: r["kernels"] for b, r in results.items()}
    assert _way(again, classes[SMALL]) == "aten" and _way(again, classes[LARGE]) == "kernel"


def test_a_drift_opens_a_class_again(measuring, monkeypatch) -> None:  # noqa: F811
    """ATen's path wins the small class; then its calls take ten times as long (the machine's load
    changed): ``DRIFT_CALLS`` sampled calls in a row off its trial's times start the trial again,
    which the kernels win; the verdict file says so. The other class is not touched."""
    seconds = {(SMALL, "aten"): 1e-3, (SMALL, "kernel"): 1.5e-3, (LARGE, "aten"): 2e-3, (LARGE, "kernel"): 1e-3}
    ran, now = _clock(monkeypatch, seconds)
    compiler, compiled = _compiled(_fn)
    for rows, calls in ((LARGE, TRIED + 1), (SMALL, TRIED)):  # (the first call compiles: the checked path)
        now["rows"] = rows
        for _ in range(calls):
            _exact(compiled, rows)
    prog = _program(compiler)
    small = _by_rows(prog)[SMALL]
    assert _way(prog, small) == "aten"
    steady = len(ran)
    for _ in range(trial.SAMPLE_EVERY * trial.DRIFT_CALLS - 1):  # sampled within the trial's times: no drift
        _exact(compiled, SMALL)
    assert _way(prog, small) == "aten" and len(ran) == steady + trial.DRIFT_CALLS - 1
    seconds[(SMALL, "aten")] = 10e-3
    for _ in range(trial.SAMPLE_EVERY * trial.DRIFT_CALLS):  # the third sample in a row off: the trial again
        _exact(compiled, SMALL)
    # (the new trial's calls: ten times slower is more than GIVE_UP times the kernels', so it ends early)
    # (the samples: two within its times, three off; then the trial, from its ATen way)
    samples = 2 * trial.DRIFT_CALLS - 1
    assert ran[steady:steady + samples + 2] == [(SMALL, "aten")] * (samples + 1) + [(SMALL, "kernel")]
    result = prog.class_check.results[small]
    assert result["kernels"] and result["reopened"] == 1 and not result["kept"]
    assert _way(prog, small) == "kernel"
    assert prog.class_check.table[small].__self__.every == 2 * trial.SAMPLE_EVERY
    small_key = prog.class_check.key(small)
    assert _program_verdicts()[small_key].kernel
    assert prog.class_check.results[_by_rows(prog)[LARGE]]["reopened"] == 0


def test_deterministic_algorithms_time_nothing(measuring, monkeypatch) -> None:  # noqa: F811
    """Under ``torch.use_deterministic_algorithms(True)`` nothing is timed: a program compiled so
    keeps its kernels at every class; a program compiled before, at a class first met so, too."""
    ran, now = _clock(monkeypatch, {(r, w): s for r in (SMALL, LARGE) for w, s in (("aten", 1e-3), ("kernel", 1.5e-3))})
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        compiler, compiled = _compiled(_fn)
        for rows in (SMALL, LARGE):
            now["rows"] = rows
            for _ in range(4):
                _exact(compiled, rows)
        (prog,) = compiler.compiled
        assert prog.sizes is not None and prog.class_check is None and _generated(prog)
        assert ran == []
    finally:
        torch.use_deterministic_algorithms(was)
    torch._dynamo.reset()
    compiler, compiled = _compiled(_fn)
    now["rows"] = SMALL
    for _ in range(TRIED + 1):  # (the first call compiles: the checked path)
        _exact(compiled, SMALL)
    prog = _program(compiler)
    assert len(ran) == TRIED
    torch.use_deterministic_algorithms(True)
    try:
        now["rows"] = LARGE
        for _ in range(TRIED):
            _exact(compiled, LARGE)
    finally:
        torch.use_deterministic_algorithms(was)
    assert len(ran) == TRIED and list(prog.class_check.results) == [_by_rows(prog)[SMALL]]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))


def test_a_training_step_under_dynamic_shapes_decides_per_class(measuring, monkeypatch) -> None:  # noqa: F811
    """Under ``dynamic=True`` a training graph's forward and backward are symbolic programs of
    their own: each decides per class (ATen's path three times faster by the given clock: each
    class ends on torch after GIVE_UP's few calls); gradients stay eager's at both sizes."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    ran, now = _clock(monkeypatch, {(r, w): s for r in (SMALL, LARGE) for w, s in (("aten", 1e-3), ("kernel", 3e-3))})
    model, ref = _model(), _model()
    compiler = FusegCompiler()
    compiled = torch.compile(model, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    for rows in (SMALL, LARGE):
        now["rows"] = rows
        x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(rows))
        for _ in range(16):  # (a matmul chosen at the call measures its class first: 2 + 2 * SAMPLES calls)
            model.zero_grad(), ref.zero_grad()
            got, want = compiled(x), ref(x)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            got.square().sum().backward()
            want.square().sum().backward()
            for p, q in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4)  # a generated matmul's own order
    checked = [p for p in compiler.compiled if p.class_check is not None]
    assert len(checked) >= 2, [(p.sizes, p.backend_of) for p in compiler.compiled]  # the forward and the backward
    for p in checked:
        results = p.class_check.results
        assert len(results) == 2 and all(not r["kernels"] for r in results.values()), results
        assert all(_way(p, b) == "aten" for b in results)
    assert {r for r, _ in ran} == {SMALL, LARGE}
