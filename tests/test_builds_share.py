"""Note [the wait follows the builds' share] (runtime/machine/threads.py): a program whose kernels
are still building waits for them at a call after its first one where the compilers got under
``STARVED_SHARE`` of the wall time since the builds started (calls back to back hold them
stopped), and goes on running its ATen path where the caller leaves them time. The time holds
stopped them is counted by ``pause.stopped_seconds`` (a given clock here)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from runtime.codegen import build
from runtime.machine import pause, threads

from .test_background_builds import _planned
from .test_dynamic import check_size as _check


@pytest.fixture
def clock(monkeypatch):
    """A clock of our own for the pause, no hold before or after."""
    now = [50.0]
    monkeypatch.setattr(pause, "_clock", lambda: now[0])
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    pause.release_all()
    yield now
    pause.release_all()


def test_the_time_holds_stop_the_compilers_is_counted(clock) -> None:
    start = pause.stopped_seconds()
    with pause.held():
        clock[0] += 2.0
        with pause.held():  # (holds nest: counted once)
            clock[0] += 1.0
        assert pause.stopped_seconds() - start == pytest.approx(3.0)  # the hold in force, so far
        clock[0] += 0.5
    clock[0] += 10.0  # no hold: not counted
    assert pause.stopped_seconds() - start == pytest.approx(3.5)
    pause.hold()
    clock[0] += 4.0
    pause.release_all()  # (someone waits for the builds)
    assert pause.stopped_seconds() - start == pytest.approx(7.5)
    pause.hold()
    clock[0] += pause.MAX_HOLD_S + 30  # a hold never released counts until it is overridden
    assert pause.stopped_seconds() - start == pytest.approx(7.5 + pause.MAX_HOLD_S)


def test_nothing_is_counted_where_the_pause_is_off(clock, monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "0")
    start = pause.stopped_seconds()
    with pause.held():
        clock[0] += 5.0
    assert pause.stopped_seconds() == start


# (elapsed, stopped, policy, pause on) -> whether the program waits now
STARVED = [
    ((1.0, 1.0, "calls-first", True), True),     # calls back to back: no time between them
    ((4.0, 3.5, "calls-first", True), True),     # share 0.125
    ((4.0, 3.3, "calls-first", True), False),    # share 0.175
    ((2.0, 0.2, "calls-first", True), False),    # a caller mostly idle
    ((2.0, 2.5, "calls-first", True), True),     # (a hold counted from before the builds: share 0)
    ((0.0, 0.0, "calls-first", True), False),    # no time yet: nothing to measure
    ((1.0, 1.0, "cores", True), False),          # the compilers have cores of their own
    ((1.0, 1.0, "idle", True), False),           # they run beside the calls
    ((1.0, 1.0, "calls-first", False), False),   # the pause is off: calls never stop them
]


@pytest.mark.parametrize(("case", "waits"), STARVED, ids=[str(c) for c, _ in STARVED])
def test_a_program_waits_at_once_only_where_its_builds_are_starved(case, waits, monkeypatch) -> None:
    elapsed, stopped, policy, on = case
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1" if on else "0")
    monkeypatch.setitem(threads._CHOSEN, "policy", policy)
    assert threads.builds_starved(elapsed, stopped) is waits


@pytest.fixture
def held_builds(monkeypatch, tmp_path):
    """Builds in the background, in a cold cache, held back until a program waits for them (its
    ``pause.release_all``) or the test lets them go (``.set()``); calls first with the pause on,
    and a bound (``WAIT_AFTER_S``) that no test here reaches."""
    from runtime.compiled import program as program_module

    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_CPU", {})
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "1")
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    monkeypatch.setitem(threads._CHOSEN, "policy", "calls-first")
    monkeypatch.setattr(program_module, "WAIT_AFTER_S", 600.0)
    real, release_all = build.build_cpu_many, pause.release_all
    opened = threading.Event()

    def held(*args, **kwargs):
        assert opened.wait(60), "the test never let the build go"
        return real(*args, **kwargs)

    def waited() -> None:
        opened.waited = True  # type: ignore[attr-defined]
        opened.set()
        release_all()

    opened.waited = False  # type: ignore[attr-defined]
    monkeypatch.setattr(build, "build_cpu_many", held)
    monkeypatch.setattr(pause, "release_all", waited)
    torch._dynamo.reset()
    yield opened
    opened.set()
    build.wait_for_background_builds()
    torch._dynamo.reset()


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_calls_back_to_back_wait_for_the_builds(held_builds) -> None:
    """The call that started the builds runs torch (it never waits: goal 2's first call); calls
    back to back after it (the caller's own checks held too: every moment of it is a call here)
    soon find that the compilers had no time since, and one waits for them: from then on every
    call runs the kernels, on three sizes, against eager."""
    compiler, compiled, fn, make, program = _planned("rms-norm")  # (its size-9 call started the builds)
    assert program._building is not None and "cpp" not in program.backend_of.values()
    calls = 0
    with pause.held():
        while program._building is not None and calls < 1000:
            _check(compiled, fn, make, 11 + calls % 2)
            calls += 1
    assert held_builds.waited and program._building is None, (calls, program.passed_over)
    assert "cpp" in program.backend_of.values() and calls > 1, (calls, program.passed_over)
    _check(compiled, fn, make, 13)


@pytest.mark.skipif(build.cpu_compiler() is None, reason="no C++ compiler")
def test_a_caller_that_leaves_the_compilers_time_does_not_wait(held_builds) -> None:
    """The same program with the caller idle between its calls (as a server between requests):
    the compilers' share is high, so its calls run torch's ops and return while the build is
    still held; once it is let go, a call runs the kernels."""
    compiler, compiled, fn, make, program = _planned("rms-norm")
    assert program._building is not None
    for n in (11, 12, 11):
        time.sleep(max(0.2, 2 * (time.monotonic() - program._building_since)))  # (a share of 2/3 or more)
        _check(compiled, fn, make, n)
    assert not held_builds.waited and program._building is not None
    assert "cpp" not in program.backend_of.values()
    held_builds.set()
    build.wait_for_background_builds()
    _check(compiled, fn, make, 13)
    assert program._building is None and "cpp" in program.backend_of.values(), program.passed_over
