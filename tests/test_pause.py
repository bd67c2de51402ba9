"""Note [compilers paused while dynamo traces] (runtime/machine/pause.py): while dynamo compiles a
frame, or fuseg makes a program, background compilers are stopped and none is started; at the
release they go on and the builds finish; a hold never released, or a wait for the builds,
cannot leave them stopped. The compiler here is the machine's own, behind a script that writes
its process id and sleeps first, so that a test sees it start, stop and go on."""

from __future__ import annotations

import os
import stat
import time

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen import build
from runtime.machine import pause
from segmenter import capture, segment


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _group_states(pgid: int) -> list[str]:
    """The state letters of the processes in process group ``pgid`` (the compiler's driver and
    what it started)."""
    states = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                states.append(fields[0])
    return states


def _group_stopped(pgid: int) -> bool:
    """Every process of the group stopped (``T``), but for two that cannot run either: a driver
    caught in vfork while the child it made is stopped before its exec waits there,
    uninterruptibly, and shows ``D``, not ``T`` (CI saw it; so does stopping ``g++`` at random
    moments, about one time in fifty), and a child that ended before the stop (``Z``). At least
    one ``T``, so a group in disk wait alone is not taken for stopped."""
    states = _group_states(pgid)
    return "T" in states and all(s in ("T", "D", "Z") for s in states)


def _wait_for(cond, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def slow_compiler(tmp_path, monkeypatch):
    """A fresh kernel (its source names a fresh cache), the cache empty, and CXX a script that
    appends its pid to ``pids`` and sleeps ``SLEEP`` seconds before it runs the real compiler."""
    if not os.path.exists("/proc/self/stat") or build.cpu_compiler() is None:
        pytest.skip("needs Linux's /proc and a C++ compiler")
    prog = runtime.compile(apply_aliases(segment(capture(lambda x: (x * 3.5).sin(), [torch.randn(8, 4)])), "post"),
                           backend="cpp")
    (kernel,) = [k for k in prog.kernels.values() if k.kind == "pointwise"]
    pids = tmp_path / "pids"
    script = tmp_path / "cxx"
    script.write_text(f'#!/bin/sh\necho $$ >> "{pids}"\nsleep 1\nexec "{build.cpu_compiler()}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    monkeypatch.setattr(build, "_CPU", {})
    yield kernel, pids
    pause.release_all()
    build.wait_for_background_builds()


def _pid(pids) -> int | None:
    return int(pids.read_text().split()[0]) if pids.exists() and pids.read_text().strip() else None


def _built(future) -> None:
    (fn,) = future.result(timeout=60)
    assert callable(fn), fn  # a function, not a Declined


def test_a_hold_stops_a_running_compiler_and_the_release_continues_it(slow_compiler):
    kernel, pids = slow_compiler
    before = build.compilations["cpu"]
    future = build.build_cpu_later([kernel])
    assert _wait_for(lambda: _pid(pids) is not None), "the compiler never started"
    pid = _pid(pids)
    with pause.held():
        assert pause.holding()
        assert _wait_for(lambda: _group_stopped(pid), 5), _group_states(pid)
        time.sleep(1.5)  # longer than the script's sleep: stopped, it has not gone on
        assert _group_stopped(pid) and not future.done(), _group_states(pid)
    assert not pause.holding()
    assert "T" not in _group_states(pid)
    _built(future)
    assert build.compilations["cpu"] == before + 1


def test_no_compiler_starts_during_a_hold(slow_compiler):
    kernel, pids = slow_compiler
    pause.hold()
    try:
        future = build.build_cpu_later([kernel])
        time.sleep(1.0)
        assert _pid(pids) is None and not future.done()
    finally:
        pause.release()
    _built(future)
    assert _pid(pids) is not None


def test_holds_nest_and_only_the_last_release_lets_go(slow_compiler):
    kernel, pids = slow_compiler
    pause.hold()
    pause.hold()
    future = build.build_cpu_later([kernel])
    pause.release()
    time.sleep(0.5)
    assert pause.holding() and _pid(pids) is None
    pause.release()
    _built(future)


def test_a_wait_for_the_builds_ends_every_hold(slow_compiler):
    kernel, pids = slow_compiler
    pause.hold()
    future = build.build_cpu_later([kernel])
    build.wait_for_background_builds()  # (would never return if the hold stood)
    assert future.done() and not pause.holding()
    _built(future)
    pause.release()  # the hold it ended: nothing left to release, no error
    assert not pause.holding()


def test_a_hold_never_released_is_overridden(slow_compiler, monkeypatch):
    kernel, pids = slow_compiler
    monkeypatch.setattr(pause, "MAX_HOLD_S", 0.5)
    pause.hold()
    future = build.build_cpu_later([kernel])
    _built(future)  # within the timeout, with no release
    assert not pause.holding()


def test_off_with_the_environment(slow_compiler, monkeypatch):
    kernel, pids = slow_compiler
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "0")
    pause.hold()
    assert not pause.holding()
    future = build.build_cpu_later([kernel])
    assert _wait_for(lambda: _pid(pids) is not None, 5)
    _built(future)
    pause.release()


def test_dynamo_compiles_and_fusegs_planning_hold_the_pause(monkeypatch):
    """Inside dynamo's compile of a frame (our backend is called there) and while fuseg makes a
    program (at the graph's first call), a hold is in force; after the call, none."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "0")  # (the build on the caller's thread: seen while planning)
    seen: dict[str, bool] = {}
    torch._dynamo.reset()  # (which clears dynamo's callbacks: the compiler made next registers them)
    compiler = FusegCompiler()
    from runtime.backends import cpp

    real = cpp.build_cpu_many

    def watched(*args, **kwargs):  # (a foreground build: called while the program is made)
        seen.setdefault("planning", pause.holding())
        return real(*args, **kwargs)

    monkeypatch.setattr(cpp, "build_cpu_many", watched)
    monkeypatch.setattr(build, "_CPU", {})

    def backend(gm, example_inputs):
        seen["dynamo"] = pause.holding()
        return compile_with_aot(compiler, gm, example_inputs)

    try:
        fn = torch.compile(lambda x: (x * 1.25).cos() + 1, backend=backend)
        x = torch.randn(5, 3)
        torch.testing.assert_close(fn(x), (x * 1.25).cos() + 1)
    finally:
        torch._dynamo.reset()
    assert seen == {"dynamo": True, "planning": True}
    assert not pause.holding()


def test_calls_beside_background_compilers_stop_them_and_keep_torchs_threads(slow_compiler, monkeypatch):
    """Note [calls first while kernels build] (runtime/machine/threads.py), the default: while a program's
    kernels are compiled in the background, each call of it (the first, through ``run_checked``,
    and the later ones, through ``entry``) and of a program made before the build runs with the
    compilers stopped and torch at its own thread count; between calls the compilers run, and
    once the kernels are built nothing is held."""
    from runtime.compiled.program import CompiledProgram
    from runtime.machine import threads

    monkeypatch.delenv("FUSEG_BUILD_THREADS", raising=False)
    assert threads.policy() == "calls-first"
    own = torch.get_num_threads()
    _, pids = slow_compiler
    y = torch.randn(6, 5)
    earlier = runtime.compile(apply_aliases(segment(capture(lambda y: y.exp() + 2, [y])), "post"), backend="cpp")
    before = len(pids.read_text().split()) if pids.exists() else 0  # (its own build ran the script too)
    fn = lambda x: (x * 3.5).sin()  # noqa: E731 - the fixture's program: its kernel is the fresh one
    x = torch.randn(8, 4)
    program = CompiledProgram(apply_aliases(segment(capture(fn, [x])), "post"), "cpp", background=True)
    assert program._building is not None, "no build in the background"
    assert _wait_for(lambda: pids.exists() and len(pids.read_text().split()) > before), "the compiler never started"
    pid = int(pids.read_text().split()[before])
    seen: list[tuple[int, bool, str]] = []

    def look() -> None:
        # (a stop signal lands at once, but the state may read as running a moment longer)
        seen.append((torch.get_num_threads(), pause.holding(),
                     "T" if _wait_for(lambda: _group_stopped(pid), 5) else str(_group_states(pid))))

    for name in ("_entry_now", "_fast"):
        real = getattr(program, name)
        setattr(program, name, lambda *args, real=real: (look(), real(*args))[1])
    torch.testing.assert_close(program.run_checked(x), [fn(x)])
    torch.testing.assert_close(program(x), [fn(x)])
    # the earlier program's generated entry, wrapped when the build started, observed inside the wrapper
    inner = threads.unwrapped(earlier.entry)
    assert inner is not earlier.entry
    earlier.entry = threads._wrapped(lambda *a: (look(), inner(*a))[1])
    torch.testing.assert_close(earlier(y), [y.exp() + 2])
    assert len(seen) == 3 and all(n == own and held and state == "T" for n, held, state in seen), seen
    assert not pause.holding() and "T" not in _group_states(pid)
    program.wait_for_builds()
    build.wait_for_background_builds()
    seen.clear()
    torch.testing.assert_close(program(x), [fn(x)])
    assert program._building is None and not pause.holding() and seen == []


def test_a_program_called_back_to_back_still_ends_with_its_kernels(slow_compiler, monkeypatch):
    """The bound of Note [calls first while kernels build]: calls with no gap between them give the
    stopped compilers no time, so a program still waiting for its kernels ``WAIT_AFTER_S`` after
    its builds started waits for them at its next call (the compilers then run on every core),
    and runs its kernels from then on."""
    from runtime.compiled import program as program_module
    from runtime.compiled.program import CompiledProgram

    monkeypatch.delenv("FUSEG_BUILD_THREADS", raising=False)
    monkeypatch.setattr(program_module, "WAIT_AFTER_S", 1.0)
    fn = lambda x: (x * 3.5).sin()  # noqa: E731 - the fixture's program: its kernel is the fresh one
    x = torch.randn(8, 4)
    program = CompiledProgram(apply_aliases(segment(capture(fn, [x])), "post"), "cpp", background=True)
    assert program._building is not None, "no build in the background"
    end = time.monotonic() + 60
    calls = 0
    while program._building is not None and time.monotonic() < end:
        torch.testing.assert_close(program(x), [fn(x)])
        calls += 1
    assert program._building is None, "the builds never ended"
    assert "cpp" in program.backend_of.values() and calls > 1, (calls, program.passed_over)
    torch.testing.assert_close(program(x), [fn(x)])


@pytest.fixture
def two_threads_or_more():
    """torch with one thread more than a background build's compilers, so that a call beside
    them keeps exactly one (Note [torch's threads beside background compilers])."""
    from runtime.machine import threads

    was = torch.get_num_threads()
    torch.set_num_threads(threads.background_jobs() + 1)
    yield threads.background_jobs() + 1
    torch.set_num_threads(was)


@pytest.fixture
def cores_policy(monkeypatch):
    """The ``"cores"`` policy (FUSEG_BUILD_THREADS=1), set before ``two_threads_or_more`` counts."""
    monkeypatch.setenv("FUSEG_BUILD_THREADS", "1")


def test_calls_beside_background_compilers_leave_them_cores(slow_compiler, cores_policy, two_threads_or_more):
    """Note [torch's threads beside background compilers] (runtime/machine/threads.py), the ``"cores"``
    policy (FUSEG_BUILD_THREADS=1): while a build
    runs in the background, every call of a program (one made before the build started, and the
    one waiting for it; through ``entry`` and through ``run_checked``) runs torch with the cores
    the compilers leave it, the compilers running on (not stopped); after each call, and once
    every build is done, torch's own thread count again, and the entries unwrapped."""
    from runtime.compiled.program import CompiledProgram
    from runtime.machine import threads

    full = two_threads_or_more
    _, pids = slow_compiler
    y = torch.randn(6, 5)
    earlier = runtime.compile(apply_aliases(segment(capture(lambda y: y.exp() + 2, [y])), "post"), backend="cpp")
    before = len(pids.read_text().split()) if pids.exists() else 0  # (its own build ran the script too)
    fn = lambda x: (x * 3.5).sin()  # noqa: E731 - the fixture's program: its kernel is the fresh one
    x = torch.randn(8, 4)
    program = CompiledProgram(apply_aliases(segment(capture(fn, [x])), "post"), "cpp", background=True)
    assert program._building is not None, "no build in the background"
    assert hasattr(program.entry, "unwrapped") and hasattr(earlier.entry, "unwrapped")
    assert _wait_for(lambda: pids.exists() and len(pids.read_text().split()) > before), "the compiler never started"
    pid = int(pids.read_text().split()[before])
    seen: list[tuple[int, bool, str]] = []

    def watch(prog, name):
        real = getattr(prog, name)

        def watched(*args):
            seen.append((torch.get_num_threads(), pause.holding(), _state(pid)))
            return real(*args)
        setattr(prog, name, watched)

    watch(program, "_entry_now")
    watch(program, "_fast")
    torch.testing.assert_close(program.run_checked(x), [fn(x)])  # (the checked path: _fast)
    torch.testing.assert_close(program(x), [fn(x)])  # (entry: the interim program's)
    # the earlier program's generated entry, wrapped when the build started, observed inside the wrapper
    inner = earlier.entry.unwrapped
    earlier.entry = threads._wrapped(
        lambda *a: (seen.append((torch.get_num_threads(), pause.holding(), _state(pid))), inner(*a))[1])
    torch.testing.assert_close(earlier(y), [y.exp() + 2])
    assert len(seen) == 3, seen
    assert all(n == 1 and not held and state != "T" for n, held, state in seen), seen
    assert torch.get_num_threads() == full
    program.wait_for_builds()
    build.wait_for_background_builds()
    assert _wait_for(lambda: not threads._STATE["busy"], 5)
    assert not hasattr(program.entry, "unwrapped") and not hasattr(earlier.entry, "unwrapped")
    seen.clear()
    program._fast = lambda *a, real=program._fast: (seen.append(torch.get_num_threads()), real(*a))[1]
    torch.testing.assert_close(program.run_checked(x), [fn(x)])
    assert seen == [full]


def test_with_the_idle_policy_calls_run_as_they_are(slow_compiler, two_threads_or_more):
    """``use_policy("idle")`` (what perf/first_window.py measures beside the others): calls keep
    torch's threads and the compilers run on (at the lowest priority) beside them."""
    from runtime.compiled.program import CompiledProgram
    from runtime.machine import threads

    threads.use_policy("idle")
    try:
        x = torch.randn(8, 4)
        program = CompiledProgram(apply_aliases(segment(capture(lambda x: (x * 3.5).sin(), [x])), "post"), "cpp",
                                  background=True)
        assert program._building is not None
        seen = []
        real = program._entry_now
        program._entry_now = lambda *a: (seen.append((torch.get_num_threads(), pause.holding())), real(*a))[1]
        program(x)
        assert seen == [(two_threads_or_more, False)]
        program.wait_for_builds()
    finally:
        threads.use_policy(None)
