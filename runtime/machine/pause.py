"""Background compilers stopped while the caller's thread traces or plans (issue 41, goal 2).

Note [compilers paused while dynamo traces]: a background build's compilers run under
SCHED_IDLE (Note [kernels built in the background] in runtime/compiled/background.py), so they take a
core only when no thread of the caller's wants it. That protects the caller's threads from
being preempted, not from sharing the hardware: on this machine kind's two vCPUs a compiler on
the second one slowed dynamo's single-threaded re-trace at the second prompt length of a
generate by up to 1.4-1.75x (phi3, in the runs where 3.7-4.6 s of compiler runs overlapped it;
scratch timers, issue 41's notes), while ``aot_eager`` traced the same graphs alone. So while
something ``hold``s the pause:
  * no background compiler starts (the build thread waits for the release), and
  * those already running are stopped (SIGSTOP to each compiler's process group: the driver,
    cc1plus, as and ld), and continued (SIGCONT) at the release.
What holds it: dynamo's compile of a frame (its compile-start and compile-end callbacks,
registered by runtime/dynamo.py; dynamo counts nested compiles and calls them once around the
outermost), fuseg's own making of a program at a graph's first call (import, plan,
program), and each call of a program while background builds are under way (Note [calls first
while kernels build] in runtime/machine/threads.py; not under its ``"cores"`` policy, FUSEG_BUILD_THREADS=1,
where the compilers have cores of their own and run on, nor past its bound). Builds on the caller's thread (``low_priority=False``: the caller waits for them) are
never paused. The ``pause_builds`` runtime option (FUSEG_PAUSE_BUILDS=0) turns the pause off (perf.dynamic_shapes' ``fuseg-unpaused``
runs that way, for the before/after in one record).

Nothing can stay stopped: a hold that is never released (a callback that is not paired, an
exception between them) is overridden after ``MAX_HOLD_S``, by the build thread that waits on a
stopped or unstarted compiler (it checks every ``_POLL_S``); and whoever waits for the builds
(``release_all``, called by ``wait_for_background_builds`` and by a program that waits for its
own) releases every hold first, since a build that cannot run would never end. Where process
groups cannot be signalled (no ``os.killpg``), compilers are not started during a hold, and
those running run on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

from runtime.options import current

__all__ = ["MAX_HOLD_S", "compilers_under_way", "compiles", "enabled", "held", "hold", "holding", "release", "release_all",
           "run_compiler"]

#: seconds after which a hold is overridden (a leaked one must not stop the builds for good)
MAX_HOLD_S = 120.0
_POLL_S = 0.5
_COND = threading.Condition()
_STATE = {"holds": 0, "since": 0.0, "compiles": 0}  # compiles: holds for a compile so far (``compiles``)
_RUNNING: set[subprocess.Popen] = set()  # background compilers under way, each leader of its group
#: when each compiler under way was asked for (started or waiting for a release to start), and
#: the seconds the ended ones lasted from then (``compilers_under_way``)
_STARTED: dict[int, float] = {}
_LIFE = {"ended": 0.0}
_CAN_STOP = hasattr(os, "killpg") and hasattr(signal, "SIGSTOP")


def enabled() -> bool:
    """The pause is on unless the ``pause_builds`` option is off (FUSEG_PAUSE_BUILDS=0)."""
    return current().pause_builds


def holding() -> bool:
    """Whether a hold is in force now (and not overridden)."""
    with _COND:
        return _in_force()


def _in_force() -> bool:
    return _STATE["holds"] > 0 and time.monotonic() - _STATE["since"] < MAX_HOLD_S


def _signal_all(sig: int) -> None:
    if not _CAN_STOP:
        return
    for proc in _RUNNING:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass  # it ended (or was reaped) meanwhile


def compilers_under_way() -> tuple[float, list[int]]:
    """The seconds background compilers have existed in this process so far, summed over them
    (each from when its build asked for it, so a compiler a hold keeps from starting counts as
    one that gets nothing; those under way until now, stopped or not), and the process ids of
    those running: what runtime/machine/progress.py measures their share of the machine against."""
    with _COND:
        now = time.monotonic()
        return (_LIFE["ended"] + sum(now - t for t in _STARTED.values()),
                [p.pid for p in _RUNNING if p.returncode is None])


def compiles() -> int:
    """How many holds for a compile (dynamo's trace of a frame, fuseg's making of a program, or
    the thread thresholds' measurement) this process has made so far: the time they hold is no
    measure of how a caller's calls share the cores with the compilers (Note [the wait follows
    the builds' share] in runtime/machine/threads.py)."""
    return _STATE["compiles"]


def hold(compile: bool = False) -> None:
    """Stop the background compilers (and start none) until the matching ``release``;
    ``compile``: the hold is for a compile, not a call (``compiles``)."""
    if not enabled():
        return
    with _COND:
        _STATE["compiles"] += compile
        if _STATE["holds"] and not _in_force():
            _override()  # (an expired hold: this one starts its own clock)
        _STATE["holds"] += 1
        if _STATE["holds"] == 1:
            _STATE["since"] = time.monotonic()
            _signal_all(signal.SIGSTOP)


def release() -> None:
    """End one ``hold``; at the last, continue the compilers stopped and start those waiting."""
    with _COND:
        if _STATE["holds"] == 0:
            return  # (overridden by ``release_all`` meanwhile, or the pause was off at the hold)
        _STATE["holds"] -= 1
        if _STATE["holds"] == 0:
            _signal_all(signal.SIGCONT)
            _COND.notify_all()


def release_all() -> None:
    """End every hold at once: someone waits for the builds (or a hold outlived ``MAX_HOLD_S``)."""
    with _COND:
        if _STATE["holds"]:
            _override()


@contextlib.contextmanager
def held(compile: bool = False) -> Iterator[None]:
    """``hold(compile)`` for the block."""
    hold(compile)
    try:
        yield
    finally:
        release()


def run_compiler(cmd: list[str], preexec_fn: Callable[[], None] | None) -> subprocess.CompletedProcess:
    """A background build's compiler: started when no hold is in force, in a process group of its
    own (so that a hold stops its children too), and waited for, stopped or not."""
    token = object()  # (its lifetime counts from here: a compiler that a hold keeps from starting is starved too)
    with _COND:
        _STARTED[id(token)] = time.monotonic()
        try:
            while _STATE["holds"] > 0:
                if not _in_force():
                    _override()
                    break
                _COND.wait(_POLL_S)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True, preexec_fn=preexec_fn)
        except BaseException:
            _LIFE["ended"] += time.monotonic() - _STARTED.pop(id(token))
            raise
        _RUNNING.add(proc)
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=_POLL_S * 4)
                break
            except subprocess.TimeoutExpired:
                with _COND:
                    if _STATE["holds"] > 0 and not _in_force():
                        _override()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL) if _CAN_STOP else proc.kill()
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    finally:
        with _COND:
            _RUNNING.discard(proc)
            _LIFE["ended"] += time.monotonic() - _STARTED.pop(id(token))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _override() -> None:
    """(under ``_COND``) every hold ended, the compilers continued and those waiting started."""
    _STATE["holds"] = 0
    _signal_all(signal.SIGCONT)
    _COND.notify_all()
