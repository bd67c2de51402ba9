"""fp16 rows converted a row at a time on the CPU (Note [fp16 rows converted by the row]).

Note [fp16 rows converted by the row]: the CPU converts fp16 in software (Note [fp16 on the
CPU]: about sixteen vector operations a value in, nineteen out), because GCC 12 vectorizes no
loop of F16C's one-value conversions; a row kernel (a norm, a softmax, T5's inf check) paid that
once per pass for every fp16 input it reads, and once per output it writes, and a pointwise
kernel once per load and store. Where a row's elements of an fp16 input are contiguous (``base +
j``, j the element's index in the row) and the row is short enough, the row kernel's CPU code
converts them once at the row's start into a float array on the thread's stack
(``fuseg_h2f_run``: F16C's eight-wide ``vcvtph2ps``, software where the CPU has no F16C), and
every pass reads the array (a weight every row reads, once before the row loop); an fp16 output
written at the row's own index is written into a float array by the last pass and converted
after it (``fuseg_f2h_run``: ``vcvtps2ph`` rounding to nearest even, as ATen's vectorized
conversions). A pointwise kernel's innermost loop (below an outer loop that holds the arrays;
marked ``omp simd``, no tables, no branch ranges) does the same with its loads and stores at a
unit step of the loop's counter (``pointwise_rows``: the offsets as the lowering wrote them).
Both conversions are exact (fp16 to float) or the same rounding as the software one; a NaN keeps
its payload's high bits where the software conversion gave the one quiet NaN. CUDA keeps its
loads (``FUSEG_ON_CPU``; a pointwise kernel's CPU body is its own copy). Loads at other indices
(a broadcast along the row, a permuted or strided read), 1-d loops and symbolic rows read as
before. At most ``SCRATCH_BYTES`` of arrays a kernel (beside softmax's exps). Forced kernels on
two threads of the Intel Xeon with AMX, before and after in one process (scratch): an fp16 RMS
norm over 256 x 1024 0.43x its time (0.26x eager's), SiLU-times over 256 x 2816 0.73x, an add
over 256 x 1024 0.37x, a softmax over 16 x 1024 0.69x, the tanh GELU over 128 x 3072 0.94x (its
eight rounds stay in software); eager's bits wherever they were.
"""

from __future__ import annotations

import math
import re

import torch

from ..kernel import Param
from ..source import index as ix

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


# --- the innermost loop of a pointwise kernel -------------------------------------------------

_TERM = re.compile(r"^(i_\d+)( \* \d+)?$|^\d+$")


def _base_of(off: str, inner: str) -> str | None:
    """``off`` less its term ``inner`` (a unit step), where the rest are outer counters times
    constants (or constants); else None."""
    terms = off.split(" + ")
    if terms.count(inner) != 1:
        return None
    rest = [t for t in terms if t != inner]
    if not all(_TERM.match(t) and not t.startswith(inner + " ") for t in rest):
        return None
    return " + ".join(rest) if rest else "0"


def pointwise_rows(lw, loop: str, lines: list[str], outputs: list[Param], inner: str, n: object,  # noqa: ANN001 - lw: lower._Lowerer
                   indent: str) -> tuple[list[str], list[str], list[str]] | None:
    """Note [fp16 rows converted by the row] for a pointwise kernel's innermost loop (counter
    ``inner``, ``n`` iterations): its CPU ``lines`` with the fp16 loads and stores at a unit step
    of ``inner`` read from and written into float arrays, and the lines that fill the arrays
    before the loop and convert the outputs after it; None where none applies."""
    if not ROWS or not isinstance(n, int) or n <= 0:
        return None
    outs = {p.name: p for p in outputs if p.dtype == torch.float16}
    ins = {p.name: p for p in lw.params.values() if not p.output and p.dtype == torch.float16}
    arrays: dict[tuple[str, str], str] = {}  # (param, base) -> array
    reads: dict[tuple[str, str], set[str]] = {}  # (param, base) -> the offsets read from it
    text = "\n".join(lines)
    for _, off, lp in lw.loads:
        if lp != loop:
            continue
        for name in ins:
            if f"fuseg_h2f({name}[{off}])" in text:
                base = _base_of(off, inner)
                if base is None:
                    continue
                if (name, base) not in arrays and (len(arrays) + 1) * n * 4 <= SCRATCH_BYTES:
                    arrays[(name, base)] = lw.fresh("hrow")
                if (name, base) in arrays:
                    reads.setdefault((name, base), set()).add(off)
    stores: dict[int, tuple[str, str, str]] = {}  # line -> (param, base, value)
    for k, line in enumerate(lines):
        target, eq, value = line.strip().partition(" = ")
        name = target.split("[")[0]
        if not eq or name not in outs or not (value.startswith("fuseg_f2h((float)(") and value.endswith("));")):
            continue
        base = _base_of(target[len(name) + 1:-1], inner)
        if base is not None and (name, base) not in arrays and (len(arrays) + 1) * n * 4 <= SCRATCH_BYTES:
            arrays[(name, base)] = lw.fresh("hout")
            stores[k] = (name, base, value[len("fuseg_f2h((float)("):-len("));")])
    if not arrays:
        return None
    out = []
    for k, line in enumerate(lines):
        if k in stores:
            name, base, value = stores[k]
            out.append(f"{line[:len(line) - len(line.lstrip())]}{arrays[(name, base)]}[{inner}] = (float)({value});")
            continue
        for (name, base), offs in reads.items():
            for off in offs:
                line = line.replace(f"fuseg_h2f({name}[{off}])", f"{arrays[(name, base)]}[{inner}]")
        out.append(line)
    fill = [f"{indent}  float {arr}[{n}];" for arr in arrays.values()]
    fill += [f"{indent}  fuseg_h2f_run({arr}, {name} + ({base}), {n});" for (name, base), arr in arrays.items() if name in ins]
    flush = [f"{indent}  fuseg_f2h_run({name} + ({base}), {arr}, {n});" for (name, base), arr in arrays.items() if name in outs]
    return out, fill, flush
