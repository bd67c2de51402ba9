"""Whether a measurement of the thread thresholds was disturbed by another process (issue 64).

Note [a disturbed measurement]: the thresholds are measured once per machine and kept (Note [how
the thresholds are measured] in calibrate.py), so a measurement taken while another process held
a core is kept and used by every later process unless it is recognised. What such a process does
to a ladder is not noise: a threaded call whose second thread cannot run waits at OpenMP's
barrier for a whole scheduler slice of the other process. A file kept on the AMD EPYC (Zen 4, 2
vCPUs) while another process kept the second core busy had, for the loop on the threads, 8.0 ms
at 2^9 elements, 16-20 ms at 2^10 .. 2^17 and 2^20, and 26 us and 43 us at 2^18 and 2^19, where
one thread took 0.9 .. 177 us; so ``loop`` came out 2^21 (threads never pay) where a quiet
machine measures 2^14 (the loop on the threads 0.69 .. 56 us), and a bf16 RMS norm over 256 x
1024 then ran on one thread, 151 us against about 90. Its side-by-side ladders had the same
16-20 ms figures (two loops of 2^13 side by side: 16 ms, one after the other: 1.8 us).

The rule, on each ladder's medians (size, the first way's ns, the second's), each way apart:

* a way's median at a size is disturbed where it is more than ``SLACK`` times the same way's
  median at a larger size: the same work on the same threads over fewer elements (rows, products)
  cannot honestly take longer (the slack is for noise). Where the way ran otherwise at the larger size (one after the
  other, each on the threads from the threshold just measured: ``beside_*``'s second way), the
  threads could make the larger size faster by up to their count, so the bound is ``SLACK``
  times the threads there;
* at the largest size, where the work (0.1 .. 1.4 ms on the EPYC) dwarfs waking the threads,
  one way's median is disturbed where it is more than ``SLACK`` times the threads times the
  other's: no way of doing the same work is faster than another by more than its threads.

On the file above the first rule finds the loop's threaded median at 2^9 305 times its median at
2^18 (at 2^17, 803 times), the second the threaded median at 2^20 113 times one thread's; on a quiet machine's
ladders (this EPYC, all six) no median is more than 1.09 times a larger size's of the same way,
and at the largest size the two ways are at most 1.98 times apart (a product on two threads, a
product whose B is copied first). So ``SLACK`` = 4 leaves a margin of 3.7 and 4 for an honest
machine (a clock that ramps up, a noisier CPU), and a call that waits out a slice of 0.75 ms or
more (a scheduler's least; 8-20 ms were seen here) is found wherever the same way took under
0.19 ms at some larger size, which is all but the largest sizes of the loops and products. What
it cannot find: a disturbance that moved fewer than half of a size's calls (it leaves the median
alone); one that moved every size of a way alike, the largest within the second rule's bound of
the other way (on many threads, whose bound is wide); and, in ``beside_*``, a median of the second
way at its last size on one thread within the wider bound (it has only sizes on the threads above).

Why the median stays the figure, not a low quantile or the least call: a disturbance of fewer
than half the calls leaves the median where it was already, and one that hits most calls (the
case above: the other process kept the core for the whole ladder) moves every quantile but the
least, which judges threads by their luckiest call rather than a kernel's typical one, and
cannot give the honest time when the core is not there to be had. No figure repairs such a
ladder; measuring again when the core is free does (calibrate.py says when, and what a process
uses meanwhile).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LADDERS", "SLACK", "disturbed", "rungs_disturbed"]

#: how many times the same way's time at a larger size a median may be (and, times the threads,
#: the other way's at the largest size) before it is disturbed: Note [a disturbed measurement]
SLACK = 4.0
#: the ladders of a measurement (``{name}_ns`` in its record) and their two ways, as said
LADDERS = {"loop": ("one thread", "the threads"), "macs": ("one thread", "the threads"),
           "beside_loop": ("side by side", "one after the other"),
           "beside_macs": ("side by side", "one after the other"),
           "pack_rows": ("B read in place", "B copied first"), "nn_pack_rows": ("B read in place", "B copied first")}


def _ns(value: float) -> str:
    return f"{value / 1e6:.3g} ms" if value >= 1e6 else f"{value / 1e3:.3g} us"


def rungs_disturbed(name: str, ladder: Sequence[Sequence[float]], threads: int, alone: int | None = None) -> list[str]:
    """What Note [a disturbed measurement] finds disturbed in ``ladder`` (size, the first way's
    ns, the second's; any order; a part of a ladder judges as the ladder of its sizes) of the
    ladder ``name``, measured on ``threads`` threads, each said in a line; ``alone``: for
    ``beside_*``, the threshold from which its second way ran on the threads. Raises ValueError
    or TypeError where the ladder is not one."""
    rows = sorted((int(size), float(first), float(second)) for size, first, second in ladder)
    found: list[str] = []
    bound = SLACK * max(1, threads)
    ways = LADDERS.get(name, ("the first way", "the second way"))
    for way in (1, 2):
        threaded = (lambda size: alone is not None and size >= alone) if way == 2 and name.startswith("beside") else (
            lambda size: False)
        for i, row in enumerate(rows):
            for later in rows[i + 1:]:
                allowed = SLACK if threaded(later[0]) == threaded(row[0]) else bound
                if row[way] > allowed * later[way]:
                    found.append(f"{name} at {row[0]}: {ways[way - 1]} {_ns(row[way])}, at {later[0]} {_ns(later[way])}")
                    break
    if rows:
        size, first, second = rows[-1]
        if max(first, second) > bound * min(first, second):
            slow, fast = (0, 1) if first > second else (1, 0)
            found.append(f"{name} at {size}: {ways[slow]} {_ns(max(first, second))}, {ways[fast]} "
                         f"{_ns(min(first, second))}")
    return found


def disturbed(detail: Mapping[str, Any], alone: Mapping[str, int]) -> list[str]:
    """What Note [a disturbed measurement] finds disturbed in the ladders of a measurement's
    record ``detail`` (``{name}_ns`` for each of ``LADDERS`` it holds, ``threads``), each said in
    a line; empty where nothing is. ``alone``: ``loop`` and ``macs``, the thresholds the
    ``beside_*`` ladders' second way ran with. Raises ValueError, TypeError or KeyError where the
    record is not one."""
    threads = int(detail["threads"])
    found: list[str] = []
    for name in LADDERS:
        ladder = detail.get(f"{name}_ns")
        if ladder:
            found += rungs_disturbed(name, ladder, threads, alone.get(name.removeprefix("beside_")))
    return found
