"""From how much work a CPU kernel shares its loops among threads, measured on this CPU (issue 42).

Note [thread thresholds measured here]: a generated loop runs on torch's threads (OpenMP) where
its work passes a threshold, a matmul routine where a product's multiply-adds do; below it the
loop runs on the caller's thread alone. A kernel on one thread may instead run beside other
kernels of its chain, each on a thread of its own (Note [kernels side by side] in
runtime/compiled/chains.py), which wakes the threads once for them all. So there are two thresholds of
each kind:

* ``loop`` and ``macs``: from where a kernel's threads are faster than one thread, for a kernel
  that runs alone (the pragmas' tests, the matmul routines' ``FUSEG_PARALLEL_MACS``);
* ``beside_loop`` and ``beside_macs``: below them a kernel may run beside others, on one thread
  (the runner gives a group's kernels one thread each, their own loops' tests notwithstanding);
  from them its own threads run it faster than a pair of kernels side by side runs two.

Where threads pay depends on the CPU, on how many there are and on how long waking them takes:
on the AMD EPYC family 25 model 17 threads beat one thread from about 2^14 elements and 2 x 48^3
multiply-adds, where the constants before were 2^15 and 2^22; and with products threaded from
2^16 or 2^17 multiply-adds while a kernel ran beside others only where it had no threads, the
small products of a tiny BERT's backward left their pairs and its training step took 1.19x and
1.13x the time (scratch before/after, 2026-11-28): hence the second pair. So all four are
measured on the machine that runs the kernels, once, and kept in the kernel cache dir (Note [how
the thresholds are measured] in calibrate.py), as the verdicts of Note [choices by measurement]
(runtime/autotune.py) are; with them what an exp costs in a loop's work (``costly_call``) and
from how many rows a product copies its operand B first (``pack_rows``, ``nn_pack_rows``: Note
[register tiles] in runtime/codegen/source/gemm_prelude.py), the other constants set on one machine that decided speed
inside the kernels:

    current()      -> the thresholds kernels are generated with now: those set by
                      ``FUSEG_THREAD_THRESHOLDS`` (``parse``), else those kept for this machine
                      and thread count, else measured now, else, where nothing can be measured
                      (no compiler, one thread, a library that fails), ``UNMEASURED``; where
                      every measurement was disturbed by another process (Note [a disturbed
                      measurement]), ``UNMEASURED``'s values as "disturbed", nothing kept
    pinned(t)      -> within, ``current()`` is ``t``

Each kernel takes the matmul threshold it was generated with (``Kernel.parallel_macs``, and the
rows from which a product copies its operand first, ``Kernel.pack_rows``: measured alike), so
its source, hence its cache entry, names them; the loop threshold is in its pragmas' text;
whether it may run beside others is ``beside`` in kernel.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from runtime.machine.once import once
from runtime.options import current as current_options
from runtime.options import parse_thread_thresholds

from .source.gemm_prelude import NN_PACK_ROWS, PACK_ROWS

__all__ = ["UNMEASURED", "Thresholds", "current", "measured_by", "parse", "pinned", "resolve", "resolved"]


@dataclass(frozen=True)
class Thresholds:
    """``loop``: elements of work (Note [work of a loop] in kernel.py) from which a loop is shared
    among threads; ``macs``: multiply-adds of one product from which a matmul routine shares its
    panels; ``beside_loop``, ``beside_macs``: below them a kernel may run beside others (0: the
    same as ``loop``, ``macs``); ``how``: where they came from ("measured", "kept", "set",
    "pinned", "unmeasured", "disturbed": ``UNMEASURED``'s where the measurement stayed disturbed); ``costly_call``: what a call of exp, tanh, erf or another libm
    function costs in a loop's element, in plain ops (Note [work of a loop]); ``pack_rows``,
    ``nn_pack_rows``: rows of a product from which its matmul routine copies B first (Note
    [register tiles] in runtime/codegen/source/gemm_prelude.py)."""

    loop: int
    macs: int
    how: str = "measured"
    costly_call: int = 8
    beside_loop: int = 0
    beside_macs: int = 0
    pack_rows: int = PACK_ROWS
    nn_pack_rows: int = NN_PACK_ROWS

    def __post_init__(self) -> None:
        if not self.beside_loop:
            object.__setattr__(self, "beside_loop", self.loop)
        if not self.beside_macs:
            object.__setattr__(self, "beside_macs", self.macs)


#: where nothing is measured (no compiler, one thread, a library that failed) and in tests (which
#: set these): the values chosen by hand before they were measured, on an AMD EPYC and an earlier
#: AVX-512 machine (the matmul one ten times what waking the threads took inside a program
#: there); a kernel then runs beside others exactly where it has no threads
UNMEASURED = Thresholds(1 << 15, 1 << 22, "unmeasured", 8)

_LOCK = threading.Lock()
_STATE: dict[str, Thresholds | None] = {"pinned": None}
#: torch's thread count -> the thresholds resolved for it in this process
_RESOLVED: dict[int, Thresholds] = {}
#: Note [how the thresholds are measured] in calibrate.py, registered there (``measured_by``)
_MEASURER: dict[str, Callable[[int], Thresholds | None] | None] = {"kept_or_measured": None}


def parse(text: str) -> Thresholds:
    """``FUSEG_THREAD_THRESHOLDS``'s value, positive integers: "LOOP,MACS", "LOOP,MACS,COSTLY",
    "LOOP,MACS,COSTLY,BESIDE_LOOP,BESIDE_MACS" or that and ",PACK_ROWS,NN_PACK_ROWS" (what is not
    given: ``UNMEASURED``'s, the beside thresholds equal to LOOP and MACS)."""
    return from_values(parse_thread_thresholds(text))


def from_values(values: tuple[int, ...]) -> Thresholds:
    """The thresholds 2, 3, 5 or 7 positive integers give (``parse``'s values; the ``thread_thresholds`` option)."""
    costly = values[2] if len(values) >= 3 else UNMEASURED.costly_call
    beside = values[3:5] if len(values) >= 5 else [0, 0]
    pack = values[5:7] if len(values) == 7 else [UNMEASURED.pack_rows, UNMEASURED.nn_pack_rows]
    return Thresholds(values[0], values[1], "set", costly, *beside, *pack)


def current() -> Thresholds:
    """The thresholds kernels are generated with now (resolved once a process, unless pinned)."""
    pin = _STATE["pinned"]
    if pin is not None:
        return pin
    threads = torch.get_num_threads()
    return once(_RESOLVED, threads, _LOCK, lambda: resolve(threads))


def resolve(threads: int) -> Thresholds:
    """The thresholds for ``threads`` threads, resolved afresh (``current`` keeps the first for
    the process): the setting, else the kept ones, else measured now and kept, else
    ``UNMEASURED``."""
    values = current_options().thread_thresholds
    if values:
        return from_values(values)
    if threads <= 1:
        return UNMEASURED  # (no loop is shared among one thread: the thresholds decide nothing)
    measurer = _MEASURER["kept_or_measured"]
    return (measurer(threads) if measurer is not None else None) or UNMEASURED


def measured_by(kept_or_measured: Callable[[int], Thresholds | None]) -> None:
    """``kept_or_measured(threads)`` gives ``resolve`` the thresholds kept for this machine, else
    measured now (None where they cannot be): calibrate.py, above this module (it builds its
    library with the kernels' prelude and compiler), registers it when imported; the package's
    ``__init__`` imports it, so it is registered before any kernel asks."""
    _MEASURER["kept_or_measured"] = kept_or_measured


def resolved() -> bool:
    """Whether this process resolved the thresholds for torch's thread count now."""
    return torch.get_num_threads() in _RESOLVED


@contextlib.contextmanager
def pinned(t: Thresholds) -> Iterator[None]:
    """Within: ``current()`` is ``t`` (as "pinned")."""
    outer = _STATE["pinned"]
    _STATE["pinned"] = dataclasses.replace(t, how="pinned")
    try:
        yield
    finally:
        _STATE["pinned"] = outer
