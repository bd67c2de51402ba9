"""fp16 rows converted a row at a time on the CPU (Note [fp16 rows converted by the row]).

Note [fp16 rows converted by the row]: the CPU converts fp16 in software (Note [fp16 on the
CPU]: about sixteen vector operations a value in, nineteen out), because GCC 12 vectorizes no
loop of F16C's one-value conversions; a row kernel (a norm, a softmax, T5's inf check) paid that
once per pass for every fp16 input it reads, and once per output it writes. Where a row's
elements of an fp16 input are contiguous (``base + j``, j the element's index in the row) and
the row is short enough, the row kernel's CPU code converts them once at the row's start into a
float array on the thread's stack (``fuseg_h2f_run``: F16C's eight-wide ``vcvtph2ps``, software
where the CPU has no F16C), and every pass reads the array; an fp16 output written at the row's
own index is written into a float array by the last pass and converted after it
(``fuseg_f2h_run``: ``vcvtps2ph`` rounding to nearest even, as ATen's vectorized conversions).
Both are exact (fp16 to float) or the same rounding as the software conversion; a NaN keeps its
payload's high bits where the software conversion gave the one quiet NaN. CUDA keeps its loads
(``FUSEG_ON_CPU``). Loads at other indices (a broadcast, a permuted read) and symbolic rows read
as before. At most ``SCRATCH_BYTES`` of arrays a kernel (beside softmax's exps).
"""

from __future__ import annotations

import math
import re

import torch

from ..kernel import Param

__all__ = ["SCRATCH_BYTES", "RowHalf", "fill_lines", "flush_lines"]

SCRATCH_BYTES = 96 * 1024
#: off: every pass converts its fp16 loads (the before of perf/experiments/half_rows.py)
ROWS = True


_OUTER = re.compile(r"^(o_\d+|\d+)$")


class RowHalf:
    """The arrays of one row kernel: inputs converted at the row's start, outputs after the last
    pass (Note [fp16 rows converted by the row])."""

    def __init__(self, row, fresh) -> None:  # noqa: ANN001 - rows.Row, lw.fresh
        self.fresh = fresh
        self.R = math.prod(row.I) if all(isinstance(n, int) for n in row.F) else None
        self.ins: dict[tuple[str, str], tuple[Param, str]] = {}  # (param name, base) -> (param, array)
        self.outs: dict[tuple[str, str], tuple[Param, str]] = {}
        #: pass loop -> its element's index variables, one per reduced dim longer than 1, and their sizes
        self.passes: dict[str, list[tuple[str, int]]] = {}

    def base(self, loop: str, idx: list[str], p: Param) -> str | None:
        """Where ``p``'s row starts, where pass ``loop`` reads (or writes) it at ``idx`` at the row's
        base plus j: every index variable of the pass at its place, row-major and dense in ``p``, the
        other terms the row's own indices (or constants); else None."""
        js = self.passes.get(loop)
        if not ROWS or js is None or self.R is None or p.dtype != torch.float16:
            return None
        if not all(isinstance(n, int) for n in (*p.shape, *p.stride)):
            return None
        terms = [(i, n, s) for i, n, s in zip(idx, p.shape, p.stride) if n != 1 and s != 0]
        names = {name for name, _ in js}
        inner = [t for t in terms if t[0] in names]
        others = [t for t in terms if t[0] not in names]
        if [t[0] for t in inner] != [name for name, _ in js] or not all(_OUTER.match(t[0]) for t in others):
            return None
        expect = 1
        for (_, n, s), (_, size) in zip(reversed(inner), reversed(js)):
            if n != size or s != expect:
                return None
            expect *= n
        from ..source import index as ix

        return ix.linear([t[0] for t in others], tuple(t[1] for t in others), tuple(t[2] for t in others))

    def _room(self) -> bool:
        return self.R is not None and (len(self.ins) + len(self.outs) + 1) * self.R * 4 <= SCRATCH_BYTES

    def input_array(self, loop: str, idx: list[str], p: Param) -> str | None:
        """The array that holds ``p``'s row, where a pass ``loop`` reads it at the row's base plus j."""
        base = self.base(loop, idx, p)
        if base is None:
            return None
        if (p.name, base) in self.ins:
            return self.ins[(p.name, base)][1]
        if not self._room():
            return None
        arr = self.fresh("hrow")
        self.ins[(p.name, base)] = (p, arr)
        return arr

    def output_array(self, loop: str, at: list[str], p: Param) -> str | None:
        """The array the last pass writes ``p``'s row into, where it writes at the row's base plus j."""
        base = self.base(loop, at, p)
        if base is None or (p.name, base) in self.outs or not self._room():
            return None
        arr = self.fresh("hout")
        self.outs[(p.name, base)] = (p, arr)
        return arr


def fill_lines(h: RowHalf, shared: bool) -> list[str]:
    """The CPU's declarations and conversions: ``shared``, of the rows every row reads (a weight:
    no index of the row in its base), once before the row loop (its threads read them); else the
    others, at a row's start."""
    lines = [f"    float {arr}[{h.R}];" for p, arr in h.outs.values()] if not shared else []
    for (_, base), (p, arr) in h.ins.items():
        if ("o_" in base) != shared:
            lines.append(f"    float {arr}[{h.R}];")
            lines.append(f"    fuseg_h2f_run({arr}, {p.name} + ({base}), {h.R});")
    return ["#ifndef __CUDACC__", *lines, "#endif"] if lines else []


def flush_lines(h: RowHalf) -> list[str]:
    """The CPU's conversions of the output arrays after the last pass."""
    if not h.outs:
        return []
    return (["#ifndef __CUDACC__"]
            + [f"    fuseg_f2h_run({p.name} + ({base}), {arr}, {h.R});" for (_, base), (p, arr) in h.outs.items()]
            + ["#endif"])
