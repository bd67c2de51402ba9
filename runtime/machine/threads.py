"""torch's threads while kernels compile in the background (issues 41 and 64).

Note [calls first while kernels build]: the default since issue 64 (goal 2: no slow period; a
call while kernels build runs at least at eager's speed). The older policy below (``"cores"``)
gave the compilers half the cores and ran each call on the rest: on the two-vCPU machines of CI
and the benchmarks, torch ran on one thread until the builds ended, and a program whose ops
use two lost to eager for that long (GPT-2-768: 1.00-1.07x Inductor's right after the first
call, 0.93-0.95x eager once built; issue 64). The compilers at SCHED_IDLE beside torch's full
team (``"idle"``) are no remedy either: an OpenMP team waits at each parallel region for the
member whose core a compiler holds (below: 5-20x). So now, while any background build is
under way, every program's call (its ``entry``, wrapped as below, and ``run_checked``) keeps
torch's own thread count and *stops the compilers for its duration* (``pause.held()``: SIGSTOP to
each compiler's process group, SIGCONT at the return; Note [compilers paused while dynamo
traces] in runtime/machine/pause.py), and the compilers run on every core (``background_jobs``), at
SCHED_IDLE, between calls. What a call runs is then what it would run with no build at all,
the plan's segments that wait for a kernel on torch (the plan's ATen path there), so it runs at
eager's speed or better on any CPU by construction, not by a tuned share of cores. ``cores()``
is the process's affinity (a ``taskset`` or a container's CPU set), not the machine's count.

The bound: calls back to back leave the compilers no time (torch's OpenMP workers also spin a
while after each region), so builds must still end. A program still waiting for its kernels
``WAIT_AFTER_S`` after its builds started waits for them at its next call (runtime/compiled/program.py:
the compilers then have every core, one call pays for the build, and the program runs its
kernels from then on); and calls of other programs (a graph already built beside one that is
not, or a build no call waits for) stop holding the compilers ``HOLD_CALLS_S`` after the builds
started: they run with the cores the compilers leave (the ``"cores"`` policy) until the last
build ends. So the period beside the builds is bounded whatever the caller does, and it is at
eager's speed until the bound. (This is Note [interim calls hold the pause] made general: every
program's calls hold, not only those of the program waiting, and with a bound for all: the
objection below, builds that never finished in a generate loop, was a period without one for
the calls of programs that waited for nothing.) On a machine that other processes oversubscribe
a team of torch's full count is slow with or without builds (eager's too: a tiny LM's eager
call took a median of 26-29 ms with two threads and 1.4-1.7 ms with one on this shared
two-vCPU machine, 2026-12-06, load 6-10): calls first is at eager's speed there, not better. ``FUSEG_BUILD_THREADS=1`` (or ``use_policy("cores")``) keeps the
older policy; ``use_policy("idle")`` neither stops the compilers nor narrows torch (for
measurements: perf/first_window.py times the first seconds of calls under each against eager's,
in one run). Where the pause is off (FUSEG_PAUSE_BUILDS=0) or cannot signal, calls first runs
as ``"idle"``. Choices at the call made while the builds ran are dropped when they end only where
a call ran on fewer threads (their verdicts' keys name the count). perf/first_window.py on this
shared two-vCPU machine (llama-tiny, a 15 s window, every fourth call eager's with the compilers
stopped, load 6-8: indicative only, 2026-12-06): calls first's calls 0.33-1.21x the same
second's eager, the builds waited for at 9.0 s; under ``"idle"`` 1.7-28x in the seconds before
its builds ended.

Note [torch's threads beside background compilers] (the ``"cores"`` policy): background
compilers run under SCHED_IDLE
(Note [kernels built in the background] in runtime/compiled/background.py) so that the caller's threads
take their cores first. On this machine kind (a Firecracker VM of two vCPUs) that protects a
single thread, not torch's OpenMP team: with anything busy in memory or in the kernel on the
other vCPU at SCHED_IDLE, a tiny LM's eager generate of 24 tokens took 0.11-0.57 s instead of
26 ms with torch's two threads, and 27 ms with one (a loop of g++ runs, a loop of ``/bin/true``,
numpy writing 8 MB or allocating 50 MB: each 5-20x; a pure Python spinner at SCHED_IDLE: no
change; scratch runs, 2026-11-28). Each parallel region waits for the thread whose vCPU the
compiler holds. The earlier remedy stopped the compilers for each call of a program still
waiting for its kernels (Note [interim calls hold the pause]): calls ran at 24-81 ms, but the
builds got only the gaps between calls, and in a generate loop with no gaps none finished (four
still under way after sixteen generates).

So the compilers get cores of their own instead: a background build runs at most
``background_jobs()`` compilers (half the cores, at least one), and while any background build
is under way every program's ``entry`` runs torch with the cores left to it (its thread count
less those jobs, at least one), restored when the call returns. The count is per calling
thread in torch's OpenMP backend, so it is set and restored around each call on the thread
that makes it, never from the build thread. Programs register when made; when the first build
starts their entries are wrapped, when the last one ends they are unwrapped (an attribute swap:
a call under way finishes as it began). A class chosen at the call while the builds ran (Note
[choices at the call]) was chosen for the threads left (its verdict's key names them); the way
was kept in the launch's table for good, so every later call in the class ran the way measured
for fewer threads. When the last build ends, those tables are emptied: the next call in each
class looks its verdict up again (or measures it) for torch's own count. And a program made
again while other builds are under way (Note [kernels built in the background]) measures its
fixed choices at torch's own count, the compilers paused for it (``at_own_threads``): it measured
them with the threads left, under the key of torch's own count, computed when it was compiled,
so a verdict for one thread was kept, on disk too, as one for two. Calls outside fuseg's programs (the caller's own ops)
keep their threads. ``FUSEG_BUILD_THREADS=0`` leaves the thread count alone (and the compilers
on every core, as before).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from runtime.options import current

from . import pause, progress

__all__ = ["HOLD_CALLS_S", "POLICIES", "SHARE_OVER_S", "STARVED_SHARE", "STARVED_SPANS", "Starvation", "builds_starved", "at_own_threads", "background_jobs", "beside_builds", "builds_ended",
           "builds_started", "cores", "on_builds_ended", "overdue", "policy", "register", "reserving", "use_policy", "way_now"]

_LOCK = threading.Lock()
_PROGRAMS: weakref.WeakSet = weakref.WeakSet()
_STATE: dict[str, Any] = {"busy": False, "since": 0.0, "fewer": False}
#: what runs for each program when the last build ends (``on_builds_ended``)
_ON_BUILDS_ENDED: list[Callable[[Any], None]] = []


#: the policies (Note [calls first while kernels build]), and the one chosen by ``use_policy``
POLICIES = ("calls-first", "cores", "idle")
_CHOSEN: dict[str, str | None] = {"policy": None}
#: seconds after the builds started beyond which calls stop holding the compilers (Note [calls
#: first while kernels build]: the bound; the same as a program's own wait, ``WAIT_AFTER_S``)
HOLD_CALLS_S = 10.0


#: the compilers' share of the cores since a program's builds started under which it waits for
#: them at once (Note [the wait follows the builds' share]: 1 less the smallest gain recorded)
STARVED_SHARE = 0.15
#: seconds a share is taken over before it decides: a caller's pattern of calls, not one burst of
#: them (the compilers' CPU times also come in ticks of 10 ms)
SHARE_OVER_S = 1.0
#: such spans in a row with a share under ``STARVED_SHARE`` before a program waits
STARVED_SPANS = 2


# Note [the wait follows the builds' share]: under calls first the compilers run only between
# calls (and beside the caller's own work outside fuseg's programs), at SCHED_IDLE. A program
# whose kernels are still building runs its ATen path (eager's ops, ``t_e`` a call); once built,
# its kernels (``t_k``). If the builds need ``B`` seconds of the cores to themselves and get a
# share ``s`` of them, calls first runs ``t_e`` calls for ``B/s`` seconds; waiting for them at once
# runs no call for ``B`` seconds, then ``t_k`` calls: over those ``B/s`` seconds it makes
# ``(1 - s) t_e / t_k`` times as many calls, more wherever ``s < 1 - t_k/t_e``, whatever ``B`` is.
# ``t_k/t_e`` is not known before the kernels exist; the settled records put fuseg at 0.64-0.85x
# eager's call (perf/results/amd-epyc-zen4/compiled_realistic_protocol_cpu.json), so under
# ``STARVED_SHARE`` = 0.15 (1 - 0.85) waiting at once wins on every float32 model recorded (bf16
# models gain less, 0.79-0.98x eager: there a share between 1 - t_k/t_e and 0.15 makes waiting at
# once the worse, by at most 13% fewer calls until calls first would have ended the builds; calls
# back to back give a share near 0, where waiting wins on all). Above it the
# program goes on running its ATen path to the fixed bound (``WAIT_AFTER_S``), as before: a
# caller that leaves cores idle (a server between requests, a generate loop's Python on one
# core) gives the builds their time. The share is measured, not inferred from the time between
# calls: the compilers' CPU seconds over the seconds they existed (runtime/machine/progress.py),
# which counts what they really got of that time (torch's OpenMP workers spin on after a region,
# and each stop and continue costs a signal to every compiler's group). A tiny Llama called back
# to back (calls of about 1.3 ms; dynamo's guards and the loop's Python between them) gave its
# compilers 24-42% of the cores: calls first goes on there, as its kernels gain about 20%
# (0.78-0.84x eager once built), and its builds end near the fixed bound. A share is taken over
# ``SHARE_OVER_S`` (1 s) at least, since the later of the builds' start and the last compile
# (dynamo's trace of a frame, fuseg's making of a program: they hold the compilers by design and
# say nothing of how the caller's calls leave them time), so that it covers the caller's pattern
# of calls, not one burst. phi3-tiny's generate loop (calls with transformers' Python between
# them) gave its compilers 50-57% over the 10 s before the fixed bound; a first version of this
# rule that decided over a quarter second of compiler lifetime, right after dynamo's re-trace at
# the second prompt length, read 13% and waited 8 s for every build queued (scratch runs,
# 2026-12-07). The share is looked at a program's calls after its first one since the builds
# started (the call that starts them never waits: the first call stays short, goal 2), and
# only under calls first with the pause on (under ``"cores"`` the compilers have cores of their
# own; under ``"idle"`` they run beside calls; both keep the fixed bound). Measured before the
# rule (GPT-2-768, calls back to back, this two-vCPU Zen 4, 2026-12-07): its builds took 1.2 s
# with the cores to themselves, yet the call that waited at the 10 s bound still waited 1.17 s
# for them: ten seconds of the ATen path for almost no progress. Before and after
# (perf/results/amd-epyc-zen4/builds_share_cpu.json, ``python -m perf.experiments.builds_share``:
# five realistic models, the first 30 s of calls back to back, each window's mean call over eager's
# at the same moments), with one starved span enough: 0.78-0.96x eager before, 0.75-0.81x after;
# the builds ended at 11.2-12.4 s before, 2.5-3.3 s after. One span did not
# tell apart: back to back, those models' compilers got 4-15% over the first second (startup;
# about 3% a second after it); phi3-tiny's generate loop, right after a new plan, 12% over that
# second in one run and about 50% in another, so a generate loop waited for every build queued
# (5.7 s) where calls first would have ended them in its gaps. So a program waits only after ``STARVED_SPANS`` (2) spans of ``SHARE_OVER_S`` in a
# row each under the threshold (``Starvation``): back to back, GPT-2-768's compilers got 13.6%
# and then 10.5% (then about 3% a second), so it waits at about 2 s instead of 1 s; and the
# generate loop waited at the fixed bound in two probes of two, for 1.05-1.44 s. The same
# experiment with two spans: 0.79-0.92x eager before, 0.71-0.91x after (llama-1024 0.895 ->
# 0.912, no gain there in that run; the others 0.07-0.11 less); builds ended at 11.2-12.1 s
# before, 3.7-4.4 s after.
def builds_starved(share: tuple[float, float] | None) -> bool:
    """Whether a program whose compilers got ``share`` (their share of the cores, and the seconds
    it was taken over: runtime/machine/progress.py's ``share_since``) should
    wait for them now (Note [the wait follows the builds' share]): under calls first with the
    pause on, a share under ``STARVED_SHARE`` taken over ``SHARE_OVER_S`` or more."""
    if share is None or policy() != "calls-first" or not pause.enabled():
        return False
    got, over = share
    return over >= SHARE_OVER_S and got < STARVED_SHARE


class Starvation:
    """A program's look at its compilers' share while its builds are under way (Note [the wait
    follows the builds' share]), span by span: ``look()`` says whether the program waits now."""

    def __init__(self) -> None:
        self.start, self.starved = progress.mark(), 0

    def look(self) -> bool:
        """Whether the last ``STARVED_SPANS`` spans of ``SHARE_OVER_S`` or more since the later of
        the builds' start and the last compile were each starved (``builds_starved``)."""
        start = progress.since_the_last_compile(self.start)
        if start is not self.start:
            self.start, self.starved = start, 0
        share = progress.share_since(self.start)
        if share is None or share[1] < SHARE_OVER_S:
            return False
        self.starved = self.starved + 1 if builds_starved(share) else 0
        self.start = progress.mark()
        return self.starved >= STARVED_SPANS


def policy() -> str:
    """How calls run beside background builds (Note [calls first while kernels build]): the one
    ``use_policy`` chose, else ``"cores"`` where FUSEG_BUILD_THREADS=1, else ``"calls-first"``."""
    chosen = _CHOSEN["policy"]
    if chosen is not None:
        return chosen
    return "cores" if current().build_threads else "calls-first"


def use_policy(name: str | None) -> None:
    """Choose the policy for this process (``None``: the environment's again). ``"calls-first"``
    (the default): torch keeps its threads and the compilers are stopped during each call;
    ``"cores"``: the compilers get half the cores and calls run torch on the rest; ``"idle"``:
    neither (the compilers run at the lowest priority beside calls that keep every thread; for
    measurements: perf/first_window.py)."""
    if name is not None and name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    _CHOSEN["policy"] = name


def reserving() -> bool:
    """Whether background builds get cores of their own (the ``"cores"`` policy)."""
    return policy() == "cores"


def cores() -> int:
    """The cores this process may run on (its affinity, where the system says; else all)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def background_jobs() -> int:
    """How many compilers a background build runs side by side: half the cores where they get
    cores of their own (at least one), else every core (they run only when no call does)."""
    return max(1, cores() // 2) if reserving() else cores()


#: torch's own thread count on this thread while a call runs with fewer (``_with_cores_left``)
_OWN = threading.local()


def _with_cores_left(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)`` with torch's thread count on this thread less half the cores (the
    compilers', at least one), restored after it."""
    n = torch.get_num_threads()
    keep = max(1, n - max(1, cores() // 2))
    if keep == n:
        return fn(*args)
    _STATE["fewer"] = True
    torch.set_num_threads(keep)
    outer, _OWN.n = getattr(_OWN, "n", None), n
    try:
        return fn(*args)
    finally:
        _OWN.n = outer
        torch.set_num_threads(n)


def overdue() -> bool:
    """Whether the builds under way started more than ``HOLD_CALLS_S`` ago (Note [calls first
    while kernels build]: calls then stop holding the compilers)."""
    return _STATE["busy"] and _clock() - _STATE["since"] > HOLD_CALLS_S


def _clock() -> float:
    return time.monotonic()


def way_now() -> str:
    """How a call beside background builds runs now: ``"calls-first"`` (the compilers stopped
    for it), ``"cores"`` (torch on the cores the compilers leave) or ``"idle"`` (as it is)."""
    chosen = policy()
    return "cores" if chosen == "calls-first" and overdue() else chosen


def _beside(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)`` as a call beside background builds runs (``way_now``)."""
    way = way_now()
    if way == "cores":
        return _with_cores_left(fn, args)
    if way == "calls-first":
        with pause.held():
            return fn(*args)
    return fn(*args)


@contextlib.contextmanager
def at_own_threads() -> Iterator[None]:
    """Within: torch at its own thread count, the background compilers paused, where a call beside
    builds runs it with fewer: a program's remake measures its kernels against ATen there, under
    keys that name torch's own count (Note [choices by measurement]). Elsewhere nothing changes."""
    own, now = getattr(_OWN, "n", None), torch.get_num_threads()
    if own is None or own == now:
        yield
        return
    with pause.held():
        torch.set_num_threads(own)
        try:
            yield
        finally:
            torch.set_num_threads(now)


def _wrapped(entry: Callable[..., Any]) -> Callable[..., Any]:
    def entry_beside_builds(*inputs: Any) -> Any:
        return _beside(entry, inputs)

    entry_beside_builds.unwrapped = entry  # type: ignore[attr-defined]
    return entry_beside_builds


def busy() -> bool:
    """Whether background builds are under way (entries run beside them: ``way_now``)."""
    return _STATE["busy"]


def unwrapped(entry: Callable[..., Any]) -> Callable[..., Any]:
    """``entry`` without the wrapping ``builds_started`` gave it."""
    while hasattr(entry, "unwrapped"):
        entry = entry.unwrapped
    return entry


def entry_now(entry: Callable[..., Any]) -> Callable[..., Any]:
    """``entry`` as a program's entry is now: wrapped while background builds hold cores (a
    program that changes its own entry: Note [a kernel tried in its program])."""
    with _LOCK:
        return _wrapped(entry) if _STATE["busy"] else entry


def beside_builds(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)``, as a call beside a background build runs where one is under way (the
    checked path of a call, which does not go through ``entry``)."""
    return _beside(fn, args) if _STATE["busy"] else fn(*args)


def register(program: Any) -> None:
    """``program`` (its ``entry`` just made) is wrapped while background builds are under way."""
    with _LOCK:
        _PROGRAMS.add(program)
        if _STATE["busy"]:
            program.entry = _wrapped(program.entry)


def builds_started() -> None:
    """A background build is under way: every program's entry runs beside it (``_beside``)."""
    with _LOCK:
        if _STATE["busy"]:
            return
        _STATE["busy"], _STATE["since"], _STATE["fewer"] = True, _clock(), False
        for p in list(_PROGRAMS):
            p.entry = _wrapped(p.entry)


def builds_ended() -> None:
    """The last background build is done: entries run with torch's own thread count again, and
    every class a launch chose at the call meanwhile (Note [choices at the call]) is chosen again
    at its next call: its verdict was for the threads the compilers left."""
    with _LOCK:
        if not _STATE["busy"]:
            return
        _STATE["busy"] = False
        fewer, _STATE["fewer"] = _STATE["fewer"], False
        for p in list(_PROGRAMS):
            p.entry = unwrapped(p.entry)
            for choose_again in _ON_BUILDS_ENDED if fewer else ():  # (only after calls on fewer threads)
                choose_again(p)


def on_builds_ended(choose_again: Callable[[Any], None]) -> None:
    """``choose_again(program)`` runs for every registered program when the last background build
    ends (``builds_ended``): runtime/backends/at_call.py registers the emptying of its tables of
    ways chosen at the call, from above this module."""
    _ON_BUILDS_ENDED.append(choose_again)
