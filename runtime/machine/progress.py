"""How much of the machine background compilers get (Note [the wait follows the builds' share] in
runtime/machine/threads.py).

A compiler (g++'s driver and what it starts: cc1plus, as, ld) runs on one core at a time, so
where nothing else wanted the cores it would use one CPU second per second it exists. Its share
is the CPU seconds it used over the seconds it existed: ``share_since`` sums both over every
background compiler since a ``mark``. CPU seconds come from Linux's /proc: each compiler under way
and its descendants (``/proc/PID/stat``: user and system time, its own and its reaped
children's), and those that ended from this process's reaped children's times
(``resource.getrusage(RUSAGE_CHILDREN)``: it counts any other child this process reaped
meanwhile too, which makes a share look larger, never smaller: a program then waits later, at
the fixed bound, as it did before). Where there is no /proc, nothing is measured (``None``).
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from . import pause

__all__ = ["Mark", "mark", "share_since", "since_the_last_compile"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Mark(NamedTuple):
    """The compilers' CPU seconds and their summed lifetimes at some moment, and how many
    compiles had held them by then (``pause.compiles``)."""
    cpu_s: float
    life_s: float
    compiles: int
    at: float  # (time.monotonic())


def _group_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every descendant it has (its reaped children's included)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack += [int(c) for c in f.read().split()]
        except (OSError, ValueError, IndexError):
            continue  # (it ended meanwhile)
    return total / _TICK


def _ended_cpu() -> float:
    import resource  # (POSIX only: where there is /proc there is this)

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def mark() -> Mark | None:
    """The compilers' CPU seconds and lifetimes now; None where /proc cannot say."""
    if not os.path.exists("/proc/self/stat"):
        return None
    life, pids = pause.compilers_under_way()
    # those under way first, then the ended: one that ends in between counts twice (a larger
    # share, the safe side), never not at all
    live = sum(_group_cpu(p) for p in pids)
    return Mark(live + _ended_cpu(), life, pause.compiles(), time.monotonic())


def since_the_last_compile(start: Mark | None) -> Mark | None:
    """``start``, or a mark taken now where a compile has held the compilers since ``start``
    was taken: the share is measured over the caller's calls, not over a trace of dynamo's
    (Note [the wait follows the builds' share])."""
    if start is not None and start.compiles == pause.compiles():
        return start
    return mark()


def share_since(start: Mark | None) -> tuple[float, float] | None:
    """(the compilers' share of the cores they would have used alone, the seconds since
    ``start`` it is taken over); None where nothing can be measured, or no compiler existed."""
    now = mark()
    if start is None or now is None:
        return None
    life = now.life_s - start.life_s
    if life <= 0:
        return None
    return min(1.0, max(0.0, now.cpu_s - start.cpu_s) / life), now.at - start.at
