"""Note [kernels built in the background] (runtime/compiled/background.py): a program's new kernels (a
symbolic plan's, or those of a program of fixed sizes of an inference graph) compile off the
caller's thread; until they are built, torch runs their segments, then the program runs its
kernels. Each program runs on sizes before and after its builds are let go,
against eager (values, strides, aliasing, inputs afterwards)."""

from __future__ import annotations

import threading

import pytest
import torch

from runtime.codegen import build

from .test_dynamic import DYNAMIC_PROGRAMS
from .test_dynamic import check_size as _check


@pytest.fixture(autouse=True)
def _cold_cache(tmp_path, monkeypatch):
    """A cache with nothing in it, in this process too, and builds in the background."""
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_CPU", {})
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "1")
    torch._dynamo.reset()
    yield
    build.wait_for_background_builds()  # (a build a test let go finishes here, not in the next test)
    torch._dynamo.reset()


@pytest.fixture
def gate(monkeypatch):
    """The background builds held back until ``gate.set()``; ``gate.started`` counts them once
    their thread has reached them (``gate.reached(n)`` waits for that: the build's thread may not
    have run yet when the call that submitted it returns). A build held here makes no progress
    whatever the caller does, so a program does not wait for it sooner than ``WAIT_AFTER_S``
    (Note [the wait follows the builds' share] measures the compilers' share of the time:
    tests/test_builds_share.py)."""
    from runtime.machine import threads

    monkeypatch.setattr(threads, "STARVED_SHARE", 0.0)
    real = build.build_cpu_many
    opened = threading.Event()
    opened.started = 0  # type: ignore[attr-defined]
    entered = threading.Condition()

    def reached(n: int, timeout: float = 60.0) -> int:
        with entered:
            entered.wait_for(lambda: opened.started >= n, timeout)
        return opened.started

    opened.reached = reached  # type: ignore[attr-defined]

    def held(*args, **kwargs):
        with entered:
            opened.started += 1  # type: ignore[attr-defined]
            entered.notify_all()
        assert opened.wait(60), "the test never let the build go"
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "build_cpu_many", held)
    yield opened
    opened.set()  # (a build still held: let it finish)


def _compiled(fn):
    from runtime.dynamo import FusegCompiler, compile_with_aot

    compiler = FusegCompiler()
    return compiler, torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)


def _planned(name: str):
    """The program of ``name`` compiled, called at size 7 (static) and 9 (its symbolic plan made,
    its build started): the compiler, the compiled function, the program and its symbolic plan."""
    fn, make = DYNAMIC_PROGRAMS[name]
    compiler, compiled = _compiled(fn)
    _check(compiled, fn, make, 7)
    _check(compiled, fn, make, 9)
    (program,) = [p for p in compiler.compiled if p.sizes is not None]
    return compiler, compiled, fn, make, program


def _waiting(program) -> list[int]:
    """The segments ``program`` runs on torch until its background build is done."""
    return [i for i, b in program.backend_of.items() if b == "torch" and any(
        "background" in why for _, why in program.passed_over.get(i, ()))]


#: programs of tests/test_dynamic.py with a segment a generated kernel takes
PROGRAMS = ["softmax-view-sum", "rms-norm", "layer-norm", "matmul", "causal-attention", "masked-softmax",
            "mean-over-dynamic", "mutates-input", "views-of-input", "embedding"]


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
@pytest.mark.parametrize("name", PROGRAMS)
def test_torch_runs_the_segments_until_the_kernels_are_built(name: str, gate) -> None:
    """Sizes 9 and 11 while the build is held (torch runs the kernel segments; no new plan), then
    the build let go and sizes 13 and 15 on the same plan with its kernels, compiling nothing."""
    fn, make = DYNAMIC_PROGRAMS[name]
    compiler, compiled = _compiled(fn)
    # size 7 first: dynamo compiles the first call for static sizes, the second with symbolic ones
    _check(compiled, fn, make, 7)
    for n in (9, 11):
        _check(compiled, fn, make, n)
    (program,) = [p for p in compiler.compiled if p.sizes is not None]
    waiting = _waiting(program)
    assert waiting and gate.reached(1) == 1 and build.background_builds_under_way() == 1, program.passed_over
    assert not program.kernels.keys() & set(waiting)
    gate.set()
    compiler.wait_for_builds()
    assert program._building is None
    assert all(program.backend_of[i] == "cpp" for i in waiting), program.passed_over
    assert set(waiting) <= program.kernels.keys()
    before = build.compilations["cpu"]
    for n in (13, 15):
        _check(compiled, fn, make, n)
    assert build.compilations["cpu"] == before
    assert [p for p in compiler.compiled if p.sizes is not None] == [program]


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_static_inference_program_runs_torch_until_its_kernels_are_built(name: str, gate, monkeypatch) -> None:
    """By default (inference graphs in the background) a program of fixed sizes starts its build
    at its first call and runs its kernel segments on torch meanwhile: two calls while the build
    is held, then the build let go and two calls with its kernels, compiling nothing more. Each
    call against eager: values, strides, aliasing, inputs afterwards."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    monkeypatch.delenv("FUSEG_BACKGROUND_BUILDS")
    fn, make = DYNAMIC_PROGRAMS[name]
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=False)
    for _ in range(2):
        _check(compiled, fn, make, 9)
    (program,) = compiler.compiled
    assert program.sizes is None  # (a program of fixed sizes, not a symbolic plan)
    waiting = _waiting(program)
    assert waiting and gate.reached(1) == 1, program.passed_over
    assert not program.kernels.keys() & set(waiting)
    gate.set()
    compiler.wait_for_builds()
    assert program._building is None
    assert all(program.backend_of[i] == "cpp" for i in waiting), program.passed_over
    before = build.compilations["cpu"]
    for _ in range(2):
        _check(compiled, fn, make, 9)
    assert build.compilations["cpu"] == before
    assert compiler.compiled == [program]
    # another size: a program of its own (dynamic=False), built in the background too, then its kernels
    for _ in range(2):
        _check(compiled, fn, make, 11)
    assert len(compiler.compiled) == 2 and compiler.compiled[1].sizes is None
    other = compiler.compiled[1]
    waiting = _waiting(other)
    assert waiting
    compiler.wait_for_builds()
    _check(compiled, fn, make, 11)
    assert other._building is None and all(other.backend_of[i] == "cpp" for i in waiting), other.passed_over


def _step_against_eager(compiled, f, x: torch.Tensor, w: torch.Tensor) -> None:
    """One backward through ``compiled(x, w).sum()``: the gradients of both against eager's."""
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    compiled(xg, wg).sum().backward()
    xe, we = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    f(xe, we).sum().backward()
    torch.testing.assert_close(xg.grad, xe.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(wg.grad, we.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_static_training_graph_builds_at_once(monkeypatch, gate) -> None:
    """The default leaves training graphs of fixed sizes as they were: their kernels are built
    before the first step returns (gradients against eager)."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    monkeypatch.delenv("FUSEG_BACKGROUND_BUILDS")
    gate.set()
    compiler = FusegCompiler()
    f = lambda x, w: torch.nn.functional.layer_norm(x @ w, (w.shape[1],)).relu()  # noqa: E731
    compiled = torch.compile(f, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=False)
    w = torch.randn(16, 24)
    for n in (9, 11):  # (a forward and a backward program per size: dynamic=False)
        _step_against_eager(compiled, f, torch.randn(n, 16), w)
    assert len(compiler.compiled) == 4 and all(p.sizes is None and p._building is None for p in compiler.compiled)
    assert all("cpp" in p.backend_of.values() for p in compiler.compiled)
    assert gate.started == 0


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_call_after_the_build_is_done_runs_the_kernels() -> None:
    """No one waits: the first call that finds the build done makes the program again with its
    kernels, and runs them."""
    compiler, compiled, fn, make, program = _planned("rms-norm")
    assert program._building is not None
    for future in program._building:
        future.result(timeout=120)
    assert program.backend_of != program._after_build[1]  # (not yet made again: no call since)
    _check(compiled, fn, make, 11)
    assert program._building is None and "cpp" in program.backend_of.values(), program.passed_over


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_warm_cache_builds_nothing_in_the_background() -> None:
    """Kernels already in the cache are loaded at once: no interim program."""
    fn, make = DYNAMIC_PROGRAMS["rms-norm"]
    compiler, compiled = _compiled(fn)
    for n in (7, 9):
        _check(compiled, fn, make, n)
    compiler.wait_for_builds()
    torch._dynamo.reset()
    build._CPU.clear()  # (the disk cache alone has them now)
    compiler, compiled = _compiled(fn)
    for n in (7, 9):
        _check(compiled, fn, make, n)
    (program,) = [p for p in compiler.compiled if p.sizes is not None]
    assert program._building is None and "cpp" in program.backend_of.values(), program.passed_over


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_background_build_that_fails_is_done_again_at_once(monkeypatch) -> None:
    """Nothing is lost where the background build raises (here: before any compiler ran): the
    first call that finds it done makes the program again, which builds its kernels itself, as
    it would have without the background."""
    failed = []

    def broken(*args, **kwargs):
        failed.append(1)
        raise OSError("the background build failed")

    monkeypatch.setattr(build, "build_cpu_many", broken)
    fn, make = DYNAMIC_PROGRAMS["layer-norm"]
    compiler, compiled = _compiled(fn)
    _check(compiled, fn, make, 7)
    before = build.compilations["cpu"]
    _check(compiled, fn, make, 9)  # the plan is made, the build fails at once
    (program,) = [p for p in compiler.compiled if p.sizes is not None]
    compiler.wait_for_builds()
    assert failed == [1] and program._building is None
    assert build.compilations["cpu"] > before  # built here, on the caller's thread
    assert "cpp" in program.backend_of.values(), program.passed_over
    assert not any("background" in why for passed in program.passed_over.values() for _, why in passed)
    for n in (11, 13):
        _check(compiled, fn, make, n)


def test_it_is_on_for_inference_graphs_by_default_and_the_environment_sets_it(monkeypatch) -> None:
    from runtime.dynamo import FusegCompiler

    assert FusegCompiler().background_builds is True  # (this module's fixture sets it)
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "0")
    assert FusegCompiler().background_builds is False
    assert FusegCompiler(background_builds=True).background_builds is True
    monkeypatch.delenv("FUSEG_BACKGROUND_BUILDS")
    assert FusegCompiler().background_builds == "inference"  # the default
    assert FusegCompiler(background_builds=False).background_builds is False


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
@pytest.mark.parametrize("training", [False, True])
def test_by_default_inference_graphs_build_in_the_background_and_training_graphs_at_once(
        monkeypatch, gate, training: bool) -> None:
    """A symbolic plan of an inference graph (no grad: generation) starts its build in the
    background; those of a training step (forward and backward) build at once, as its steps run
    their kernels back to back. Values and gradients against eager at three sizes either way."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    monkeypatch.delenv("FUSEG_BACKGROUND_BUILDS")
    if training:
        gate.set()  # (nothing should wait on it)
    compiler = FusegCompiler()
    f = lambda x, w: torch.nn.functional.layer_norm(x @ w, (w.shape[1],)).relu()  # noqa: E731
    compiled = torch.compile(f, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    w = torch.randn(16, 24)
    for n in (5, 9, 13):
        x = torch.randn(n, 16)
        if training:
            _step_against_eager(compiled, f, x, w)
        else:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x, w), f(x, w), atol=1e-5, rtol=1e-5)
    symbolic = [p for p in compiler.compiled if p.sizes is not None]
    assert symbolic
    if training:
        assert len(symbolic) == 2 and all(p._building is None for p in symbolic)  # forward and backward
        assert all("cpp" in p.backend_of.values() for p in symbolic)
    else:
        assert symbolic[0]._building is not None and gate.reached(1) == 1


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_program_waits_for_its_builds_after_the_grace_period(gate, monkeypatch) -> None:
    """See Note [kernels built in the background]: a build not done when ``WAIT_AFTER_S`` has passed
    since it started is waited for at the next call (a machine busy on every core gives a
    compiler that runs only on idle cores no time): that call runs the kernels."""
    from runtime.compiled import program as program_module

    compiler, compiled, fn, make, program = _planned("rms-norm")
    assert program._building is not None
    _check(compiled, fn, make, 11)  # within the grace period: torch runs the segments
    assert program._building is not None
    monkeypatch.setattr(program_module, "WAIT_AFTER_S", 0.0)
    threading.Timer(0.2, gate.set).start()  # (the build is let go while the call waits for it)
    _check(compiled, fn, make, 13)
    assert program._building is None and "cpp" in program.backend_of.values(), program.passed_over


@pytest.mark.skipif(not hasattr(build.os, "SCHED_IDLE"), reason="no SCHED_IDLE on this system")
def test_a_background_compiler_runs_only_on_idle_cores(monkeypatch, tmp_path) -> None:
    """The compiler of a background build (and every process it starts) has Linux's SCHED_IDLE
    policy from its start; a build the caller waits for does not. The compiler here is a script
    that records the policy a process it starts inherits, then runs the real compiler."""
    import stat
    import sys

    cxx = build.cpu_compiler()
    if cxx is None or not hasattr(build.os, "SCHED_IDLE"):
        pytest.skip("needs a C++ compiler and Linux's SCHED_IDLE")
    policies = tmp_path / "policies"
    script = tmp_path / "cxx"
    script.write_text(f'#!/bin/sh\n"{sys.executable}" -c "import os; print(os.sched_getscheduler(0))" >> "{policies}"\n'
                      f'exec "{cxx}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    build._compile(str(script), 'extern "C" void fuseg_probe() {}\n', "a probe", str(tmp_path), True)
    build._compile(str(script), 'extern "C" void fuseg_probe() {}\n', "a probe", str(tmp_path), False)
    assert [int(p) for p in policies.read_text().split()] == [build.os.SCHED_IDLE, build.os.SCHED_OTHER]


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_the_builds_under_way_are_counted_and_can_be_waited_for(gate) -> None:
    """What perf.dynamic_shapes reads after its protocol: builds under way, then none once
    waited for (the program then runs its kernels from its next call)."""
    compiler, compiled, fn, make, program = _planned("layer-norm")
    assert build.background_builds_under_way() == 1
    threading.Timer(0.2, gate.set).start()
    build.wait_for_background_builds()
    assert build.background_builds_under_way() == 0
    _check(compiled, fn, make, 11)
    assert program._building is None and "cpp" in program.backend_of.values(), program.passed_over


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_remake_beside_other_builds_measures_with_torchs_own_threads(gate, monkeypatch) -> None:
    """See Note [torch's threads beside background compilers]: a program is made again at the first
    call that finds its builds done, and times its measured kernels against ATen then (Note
    [choices by measurement]). Where other builds were still under way, that call ran torch on
    the threads the compilers leave, and the measurement with it, recorded under the key of
    torch's own count (computed when the program was compiled). The remake now runs at torch's
    own count, the compilers paused meanwhile."""
    from runtime import autotune
    from runtime.dynamo import FusegCompiler, compile_with_aot
    from runtime.machine import threads

    monkeypatch.setenv("FUSEG_BUILD_THREADS", "1")  # (the "cores" policy: Note [calls first while kernels build])
    if not threads.reserving() or threads.background_jobs() >= 2:
        pytest.skip("needs a machine where builds leave torch fewer threads than its own (2 cores)")
    measured_with: list[int] = []

    def fake(run_kernel, run_aten):
        measured_with.append(torch.get_num_threads())
        run_kernel(), run_aten()
        return autotune.Verdict(True, 1.0, 2.0)

    monkeypatch.setattr(autotune, "measure", fake)
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.delenv("FUSEG_BACKGROUND_BUILDS")  # (the default: an inference graph's program builds in the background)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)
    fn, make = DYNAMIC_PROGRAMS["matmul"]
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=False)
    try:
        with autotune.fixed("measure"):
            _check(compiled, fn, make, 9)
            (program,) = compiler.compiled
            assert _waiting(program) and gate.reached(1) == 1, program.passed_over
            gate.set()
            for future in program._building:  # (its build done; the program not made again yet)
                future.result(timeout=120)
            threads.builds_started()  # (as if another program's build were still under way)
            try:
                _check(compiled, fn, make, 9)  # (the call that makes it again, and measures)
            finally:
                threads.builds_ended()
        assert program._building is None
        assert measured_with == [2], measured_with
    finally:
        torch.set_num_threads(threads_before)
