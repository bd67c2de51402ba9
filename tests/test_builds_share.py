"""Note [the wait follows the builds' share] (runtime/machine/threads.py): a program whose kernels
are still building waits for them at a call after its first one where its compilers got under
``STARVED_SHARE`` of the cores they would use alone (calls back to back hold them stopped), and
goes on running its ATen path where the caller leaves them time. The share is measured from the
compilers' CPU times (runtime/machine/progress.py): here of real processes, a compiler that
spins for half a CPU second before it runs the real one."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time

import pytest
import torch

from runtime.codegen import build
from runtime.machine import pause, progress, threads

from .test_background_builds import _planned
from .test_dynamic import check_size as _check
from .test_pause import _wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat") or build.cpu_compiler() is None,
                                reason="needs Linux's /proc and a C++ compiler")

#: a "compiler" that uses half a CPU second, stopped or not, then runs ``$@``
_SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"


def _spinner(tmp_path, then: str = "") -> str:
    script = tmp_path / "spin"
    script.write_text(f'#!/bin/sh\n"{sys.executable}" -c "{_SPIN}"\n{then}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_compiler_held_stopped_has_no_share_and_one_let_run_has_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    script = _spinner(tmp_path)
    done = threading.Thread(target=pause.run_compiler, args=([script], None))
    done.start()
    assert _wait_for(lambda: pause.compilers_under_way()[1]), "the compiler never started"
    with pause.held():
        start = progress.mark()
        time.sleep(0.4)
        held = progress.share_since(start)
    start = progress.mark()
    time.sleep(0.2)
    ran = progress.share_since(start)
    done.join(30)
    assert held is not None and ran is not None
    assert held[1] >= 0.4 and held[0] < 0.1, held  # (CPU time comes in ticks of 10 ms)
    assert ran[1] >= 0.2 and ran[0] > 0.25, ran  # (a core of its own, or one shared with a test beside it)
    assert pause.compilers_under_way()[1] == []


def test_a_compiler_a_hold_keeps_from_starting_counts_as_starved(tmp_path, monkeypatch) -> None:
    """A compiler asked for while a hold is in force does not start (Note [compilers paused while
    dynamo traces]); its lifetime counts from the asking, so its share is nothing, not unmeasured
    (calls back to back that never let it start once never made a program wait)."""
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    with pause.held():
        start = progress.mark()
        done = threading.Thread(target=pause.run_compiler, args=([_spinner(tmp_path)], None))
        done.start()
        time.sleep(0.3)
        life, running = pause.compilers_under_way()
        share = progress.share_since(start)
        assert running == [] and share is not None and share[0] == 0.0, (life, running, share)
    done.join(30)
    assert not done.is_alive()


# (share, seconds it was taken over, policy, pause on) -> whether the program waits now
STARVED = [
    ((0.0, 1.5, "calls-first", True), True),      # calls back to back: the compilers stopped
    ((0.12, 1.0, "calls-first", True), True),
    ((0.2, 3.0, "calls-first", True), False),     # a caller that leaves them time
    ((0.0, 0.5, "calls-first", True), False),     # too short to say: a burst of calls
    ((0.0, 1.5, "cores", True), False),           # the compilers have cores of their own
    ((0.0, 1.5, "idle", True), False),            # they run beside the calls
    ((0.0, 1.5, "calls-first", False), False),    # the pause is off: calls never stop them
]


@pytest.mark.parametrize(("case", "waits"), STARVED, ids=[str(c) for c, _ in STARVED])
def test_a_program_waits_at_once_only_where_its_builds_are_starved(case, waits, monkeypatch) -> None:
    share, over, policy, on = case
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1" if on else "0")
    monkeypatch.setitem(threads._CHOSEN, "policy", policy)
    assert threads.builds_starved((share, over)) is waits


def test_nothing_measured_is_no_reason_to_wait(monkeypatch) -> None:
    monkeypatch.setitem(threads._CHOSEN, "policy", "calls-first")
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    assert progress.share_since(None) is None and not threads.builds_starved(None)


def test_a_program_waits_after_spans_in_a_row_each_starved(monkeypatch) -> None:
    """``Starvation``: spans of ``SHARE_OVER_S`` are looked at one after another; the program waits
    once ``STARVED_SPANS`` of them in a row had a share under ``STARVED_SHARE`` (one span with more
    starts the count again; so does a compile). The shares are given here."""
    monkeypatch.setitem(threads._CHOSEN, "policy", "calls-first")
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    shares: list = []
    monkeypatch.setattr(progress, "mark", lambda: progress.Mark(0.0, 0.0, pause.compiles(), 0.0))
    monkeypatch.setattr(progress, "share_since", lambda start: shares.pop(0))
    watch = threads.Starvation()
    assert threads.STARVED_SPANS == 2
    seen = []
    for share in [None, (0.0, 0.4), (0.1, 1.0), (0.5, 1.2), (0.1, 1.0), (0.12, 1.1)]:
        shares.append(share)
        seen.append(watch.look())
    # (nothing measured; too short; starved once; not starved; starved once; twice: wait)
    assert seen == [False, False, False, False, False, True]
    shares.append((0.1, 1.0))
    with pause.held(compile=True):
        pass
    assert watch.look() is False and watch.starved == 1  # (a compile: counted again from it)


def test_a_compile_starts_the_share_again(monkeypatch) -> None:
    """A compile (dynamo's trace, fuseg's making of a program) holds the compilers by design: the
    share is taken again from its end, not across it; a call's hold changes nothing."""
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    start = progress.mark()
    with pause.held():  # (a call's)
        pass
    assert progress.since_the_last_compile(start) is start
    with pause.held(compile=True):
        pass
    again = progress.since_the_last_compile(start)
    assert again is not start and again.compiles == pause.compiles() == start.compiles + 1
    assert progress.since_the_last_compile(again) is again


@pytest.fixture
def spinning_compiler(monkeypatch, tmp_path):
    """Builds in the background, in a cold cache, by a compiler that spins half a CPU second
    first; calls first with the pause on, and a bound (``WAIT_AFTER_S``) no test here reaches;
    ``waited`` says whether a program waited for its builds (its ``pause.release_all``)."""
    from runtime.compiled import program as program_module

    monkeypatch.setenv("CXX", _spinner(tmp_path, f'exec "{build.cpu_compiler()}" "$@"'))
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setattr(build, "_CPU", {})
    monkeypatch.setenv("FUSEG_BACKGROUND_BUILDS", "1")
    monkeypatch.setenv("FUSEG_PAUSE_BUILDS", "1")
    monkeypatch.setitem(threads._CHOSEN, "policy", "calls-first")
    monkeypatch.setattr(program_module, "WAIT_AFTER_S", 600.0)
    release_all, waited = pause.release_all, []

    def release_and_note() -> None:
        waited.append(time.monotonic())
        release_all()

    monkeypatch.setattr(pause, "release_all", release_and_note)
    torch._dynamo.reset()
    yield waited
    release_all()
    build.wait_for_background_builds()
    torch._dynamo.reset()


def test_calls_back_to_back_wait_for_the_builds(spinning_compiler) -> None:
    """The call that started the builds runs torch (it never waits: goal 2's first call); calls
    back to back after it (the caller's own checks held too: every moment of it is a call here)
    keep the compiler stopped, and one waits for it once its share was measured: from then on
    every call runs the kernels, on three sizes, against eager."""
    compiler, compiled, fn, make, program = _planned("rms-norm")  # (its size-9 call started the builds)
    assert program._building is not None and "cpp" not in program.backend_of.values()
    calls, end = 0, time.monotonic() + 60
    with pause.held():
        while program._building is not None and time.monotonic() < end:
            _check(compiled, fn, make, 11 + calls % 2)
            calls += 1
    assert spinning_compiler and program._building is None, (calls, program.passed_over)
    assert "cpp" in program.backend_of.values() and calls > 1, (calls, program.passed_over)
    _check(compiled, fn, make, 13)


def test_a_caller_that_leaves_the_compilers_time_does_not_wait(spinning_compiler) -> None:
    """The same program with the caller idle between its calls (as a server between requests):
    the compiler runs meanwhile, its share is high, and no call waits for it; its calls run
    torch's ops until the build is done, then the kernels."""
    compiler, compiled, fn, make, program = _planned("rms-norm")
    assert program._building is not None
    calls, end = 0, time.monotonic() + 60
    while program._building is not None and time.monotonic() < end:
        time.sleep(0.1)
        _check(compiled, fn, make, 11 + calls % 2)
        calls += 1
    assert not spinning_compiler and program._building is None, (calls, program.passed_over)
    assert "cpp" in program.backend_of.values() and calls > 3, (calls, program.passed_over)
    _check(compiled, fn, make, 13)
