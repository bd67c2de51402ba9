"""torch's threads while kernels compile in the background (issue 41).

Note [torch's threads beside background compilers]: background compilers run under SCHED_IDLE
(Note [kernels built in the background] in runtime/background.py) so that the caller's threads
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
keep their threads. The ``build_threads`` runtime option off (``FUSEG_BUILD_THREADS=0``) leaves the thread count alone (and the compilers
on every core, as before).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from runtime.options import current

__all__ = ["at_own_threads", "background_jobs", "beside_builds", "builds_ended", "builds_started", "register",
           "reserving"]

_LOCK = threading.Lock()
_PROGRAMS: weakref.WeakSet = weakref.WeakSet()
_STATE = {"busy": False}


def reserving() -> bool:
    """Whether background builds get cores of their own (the ``build_threads`` option, FUSEG_BUILD_THREADS)."""
    return current().build_threads


def background_jobs() -> int:
    """How many compilers a background build runs side by side."""
    cores = os.cpu_count() or 1
    return max(1, cores // 2) if reserving() else cores


#: torch's own thread count on this thread while a call runs with fewer (``_with_cores_left``)
_OWN = threading.local()


def _with_cores_left(fn: Callable[..., Any], args: tuple) -> Any:
    """``fn(*args)`` with torch's thread count on this thread less the compilers' (at least one),
    restored after it."""
    n = torch.get_num_threads()
    keep = max(1, n - background_jobs())
    if keep == n:
        return fn(*args)
    torch.set_num_threads(keep)
    outer, _OWN.n = getattr(_OWN, "n", None), n
    try:
        return fn(*args)
    finally:
        _OWN.n = outer
        torch.set_num_threads(n)


@contextlib.contextmanager
def at_own_threads() -> Iterator[None]:
    """Within: torch at its own thread count, the background compilers paused, where a call beside
    builds runs it with fewer: a program's remake measures its kernels against ATen there, under
    keys that name torch's own count (Note [choices by measurement]). Elsewhere nothing changes."""
    own, now = getattr(_OWN, "n", None), torch.get_num_threads()
    if own is None or own == now:
        yield
        return
    from .codegen import pause

    with pause.held():
        torch.set_num_threads(own)
        try:
            yield
        finally:
            torch.set_num_threads(now)


def _wrapped(entry: Callable[..., Any]) -> Callable[..., Any]:
    def entry_beside_builds(*inputs: Any) -> Any:
        return _with_cores_left(entry, inputs)

    entry_beside_builds.unwrapped = entry  # type: ignore[attr-defined]
    return entry_beside_builds


def busy() -> bool:
    """Whether background builds hold cores now (entries run torch on the threads they leave)."""
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
    """``fn(*args)``, with the cores a background build leaves where one is under way (the
    checked path of a call, which does not go through ``entry``)."""
    return _with_cores_left(fn, args) if _STATE["busy"] else fn(*args)


def register(program: Any) -> None:
    """``program`` (its ``entry`` just made) is wrapped while background builds are under way."""
    if not reserving():
        return
    with _LOCK:
        _PROGRAMS.add(program)
        if _STATE["busy"]:
            program.entry = _wrapped(program.entry)


def builds_started() -> None:
    """A background build is under way: every program's entry leaves its cores to it."""
    if not reserving():
        return
    with _LOCK:
        if _STATE["busy"]:
            return
        _STATE["busy"] = True
        for p in list(_PROGRAMS):
            p.entry = _wrapped(p.entry)


def builds_ended() -> None:
    """The last background build is done: entries run with torch's own thread count again, and
    every class a launch chose at the call meanwhile (Note [choices at the call]) is chosen again
    at its next call: its verdict was for the threads the compilers left."""
    from .backends.at_call import ChosenAtCall

    with _LOCK:
        if not _STATE["busy"]:
            return
        _STATE["busy"] = False
        for p in list(_PROGRAMS):
            p.entry = unwrapped(p.entry)
            for launch in getattr(p, "_chosen", {}).values():
                if isinstance(launch, ChosenAtCall):
                    launch.table.clear()
