"""A transcendental of a small input, computed once per call into a table, not per element.

Note [tables of a small input's values]: a CPU pointwise kernel computes every intermediate
inline, per element of its loop. Where the loop reads a small input broadcast over it and applies
a transcendental to it right away, that function runs once per element of the loop, not once per
element of the input: the backward of a fused-qkv RoPE (phi3) recomputes ``sin`` and ``cos`` of
the (1, seq, head_dim) angle table for every element of q's and k's gradients, batch and heads
over, 12-16x each value, scalar glibc calls (the loop's branches keep g++ from vectorizing), and
that kernel took 70 us of a 1.1 ms backward (``profile_launches``, phi3-tiny's training step).
Here each such ``f(in[...])`` of the CPU loop reads ``table[...]`` instead, a stack array filled
before the loop (and before OpenMP's threads start) with ``f`` of each element the input spans.
The CUDA loop is left as it was (a GPU's sin is a few instructions).

Where the loop makes at least ``MIN_REUSE`` times as many calls as the table, and exact: a
float32 input of plain sizes, spanning at most ``TABLE_MAX`` elements; ``f`` one of the unary
functions below, on the loaded value itself (the same call on the same float, so the same bits).
The bounds are counts of calls, not times measured on a CPU: none of the three constants was
tuned. A table shorter than ``PARALLEL_FILL`` is filled by one thread while the loop's calls are
shared by all of them, so on a machine with more than ``MIN_REUSE`` threads a short table can
cost more than each thread's share of the calls it replaces (this 2-thread machine kind was
the only one measured: tests/test_tables.py and the phi3/Llama kernels above). The table covers the input's whole span, so every index the loop computes
into the input is one of the table's: a gap of a strided span is computed too, harmlessly.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["MIN_REUSE", "PARALLEL_FILL", "TABLE_MAX", "tabulate"]

#: most elements a table holds (32 KB of float32 on the stack: Llama's (1, 128, 64) angles fit)
TABLE_MAX = 8192
#: a table at least this long is filled by OpenMP's threads (where the loop's are)
PARALLEL_FILL = 2048
#: least elements of the loop per element of the input for a table
MIN_REUSE = 4
#: the functions tabulated: libm's, through the prelude's wrappers (fuseg_math), each a scalar
#: call per element (``fuseg_exp`` and ``fuseg_tanh`` are the prelude's own and vectorize: not these)
FUNCTIONS = frozenset({"sin", "cos", "tan", "exp2", "expm1", "log", "log2", "log10", "log1p",
                       "sinh", "cosh", "asin", "acos", "atan", "erf", "erfc"})

_LOAD = re.compile(r"^(\s*)const float (t[0-9]+) = \(\(float\)(in[0-9]+)\[(.*)\]\);$")
_CALL = re.compile(r"^(\s*)const float (t[0-9]+) = ([a-z0-9]+)\((t[0-9]+)\);$")


def _span(shape: tuple, stride: tuple) -> int | None:
    """Elements from the first to the last one a layout reaches, plus one; None for a symbolic
    size or a negative stride."""
    if not all(type(n) is int for n in (*shape, *stride)) or any(s < 0 for s in stride):
        return None
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def tabulate(lines: list[str], inputs: dict, loop_elements: int, fresh: Callable[[], str],
             threads: str | None = None) -> tuple[list[str], list[str]]:
    """See Note [tables of a small input's values]: ``lines`` (a CPU loop body) with each tabulated
    call reading its table, and the statements that fill the tables (before the loop). ``inputs``
    maps a C parameter name to its (dtype, shape, stride); ``loop_elements`` is the loop's;
    ``fresh`` names each table (unique in the kernel: a kernel may have several loops);
    ``threads``: the loop's OpenMP clause (``parallel_if``), None where it runs on one thread.
    Returns ``lines`` itself and no statements where nothing qualifies."""
    import torch

    from segmenter.ir.symbolic import size_hint  # a heuristic: no condition of a symbolic plan

    loads: dict[str, tuple[str, str]] = {}  # load variable -> (input, index expression)
    for line in lines:
        m = _LOAD.match(line)
        if m is not None:
            loads[m.group(2)] = (m.group(3), m.group(4))
    if not loads:
        return lines, []
    tables: dict[tuple[str, str], str] = {}
    fill: list[str] = []
    out = list(lines)
    for k, line in enumerate(lines):
        m = _CALL.match(line)
        if m is None or m.group(3) not in FUNCTIONS or m.group(4) not in loads:
            continue
        name, index = loads[m.group(4)]
        dtype, shape, stride = inputs.get(name, (None, (), ()))
        span = _span(shape, stride) if dtype == torch.float32 else None
        if span is None or not 0 < span <= TABLE_MAX or size_hint(loop_elements) < MIN_REUSE * span:
            continue
        key = (name, m.group(3))
        table = tables.get(key)
        if table is None:
            table = tables[key] = fresh()
            fill.append(f"  float {table}[{span}];")
            if threads is not None and span >= PARALLEL_FILL:
                fill.append(f"#pragma omp parallel for schedule(static){threads}")
            fill.append(f"  for (FUSEG_I k_ = 0; k_ < {span}; ++k_) {table}[k_] = {m.group(3)}((float){name}[k_]);")
        out[k] = f"{m.group(1)}const float {m.group(2)} = {table}[{index}];"
    return (out, fill) if tables else (lines, [])
