"""Sums over long rows that stay as exact as ATen's (Note [sums in chunks]).

Note [sums in chunks]: a float accumulator that adds values one by one loses the low bits of
each as it grows, and past 2^24 additions of similar values it stops growing at all: a row kernel
that summed a 2^25-element row into one accumulator per vector lane gave a float16 variance 2-5%
off and a float32 sum of 0.3s 2e-4 off (issue 63), where ATen's ``cascade_sum``
(aten/src/ATen/native/cpu/SumKernel.cpp) is within 1e-7. A float sum or mean now adds in ATen's
own order on the CPU (Note [sums in ATen's order, streamed], below); the other sums (a variance's,
a norm's, a softmax's, and every long sum on CUDA) over a row longer than
``ROW_CHUNK`` elements (or of a symbolic length) are cut into chunks of
``ROW_CHUNK_LENGTH``: each chunk is the same vectorized loop as before into a fresh partial
(``ROW_CHUNK_LENGTH`` / ``CHUNK_LANES`` additions per lane on the CPU, ``ROW_CHUNK_LENGTH`` per
thread on CUDA), and the partials are added into the row's sum
with their rounding errors kept aside (Neumaier's compensated sum, ``fuseg_sum_into``), which are
added back at the end unless the sum is inf or NaN (``fuseg_sum_total``: the compensation of an
inf is NaN, and eager's inf must stay inf). The error is then that of one chunk's lanes plus a
few units in the last place, whatever the length: from 1 element to 2^31. A pass the compiler
cannot vectorize (an element's position found by dividing by a size known only at the call) has
one accumulator, not a vector of them: it chunks every ``SCALAR_CHUNK`` elements (a symbolic
variance over two dims was 50x eager's error with 2500 values in one accumulator). Column passes
(Note [column passes]), whose accumulators each add one value per reduced element, chunk every
``COLUMN_CHUNK`` elements the same way. Rows of a known length up to the chunk are emitted as
before: the row sizes of real models' norms and softmaxes get the same loops and the same speed.
The chunks are visited in order and a CUDA block's threads are combined in a fixed tree, so a
sum is the same on every call. Not at ATen's error, chunked: a long row of one repeated value,
whose roundings all lean one way (a sum of 2^22 copies of 0.7 was ~4x eager's error against the
exact sum; in ATen's order it is 1.0-1.5x, eager's order on its threads being another);
chunks of 1024 bring it to ~4x less but cost plain row sums 8-16% on the AMD EPYC of the records
(the record reductions_speed_chunk1024_cpu.json of the AMD EPYC Zen 4, in git history at bb1e4af), so they were not taken. Max, min, any, all and integer sums are exact and not chunked.
The lanes are fixed (``simdlen``), not left to the compiler: g++ 12.2 with -march=native on an
Intel Xeon with AVX-512 (tuned as rocketlake: 256-bit vectors preferred) summed each chunk in 8
lanes, and a float32 sum of 100000 values in [-100, 100] was 10x eager's error (0.012 against
0.0011); in 16 lanes (one 512-bit vector there, two 256-bit ones elsewhere) 0.0033, and faster
(6.2 against 7.4 us; scratch).
"""

from __future__ import annotations

import torch

__all__ = ["ATEN_SUM_LANES", "CHUNK_LANES", "COLUMN_CHUNK", "ROW_CHUNK", "ROW_CHUNK_LENGTH", "SCALAR_CHUNK", "aten_order_applies", "aten_row_sum",
           "chunk_close", "chunked", "column_chunk_open", "row_chunk_open", "row_chunk_length"]

#: rows of a known length up to this keep their one loop (the sizes of real models' norms)
ROW_CHUNK = 4096
#: partial sums a chunk's vectorized pass keeps on the CPU (``omp simd simdlen``), whatever vector
#: width the compiler prefers (Note [sums in chunks])
CHUNK_LANES = 16
#: elements of a row a chunk of a longer row pass covers per thread (the CPU: the row's thread)
ROW_CHUNK_LENGTH = 4096
#: the same where the pass cannot be vectorized (one accumulator adds every element of a chunk)
SCALAR_CHUNK = 64
#: reduced elements a chunk of a column pass covers (each accumulator adds one per element)
COLUMN_CHUNK = 256


def chunked(R: object, chunk: int) -> bool:  # noqa: N803 - R: a row's length, as in rows.py
    """Whether a sum over ``R`` elements is cut into chunks: a symbolic length always (the loop
    decides at the call, a row of one chunk runs it once), a known one past ``chunk``."""
    return isinstance(R, torch.SymInt) or not isinstance(R, int) or R > chunk


def row_chunk_length(R: object, inner: tuple) -> int | None:  # noqa: N803
    """A row sum pass's chunk, or None (one loop): ``ROW_CHUNK_LENGTH`` past ``ROW_CHUNK`` where
    its loop vectorizes; ``SCALAR_CHUNK`` where the position of an element in the reduced dims is
    found by dividing by a size known only at the call (two or more reduced dims, an inner one
    symbolic: no vector integer division, so the compiler leaves the loop scalar and one
    accumulator would add every element of a chunk)."""
    if any(not isinstance(n, int) for n in inner[1:]):
        return SCALAR_CHUNK if chunked(R, SCALAR_CHUNK) else None
    return ROW_CHUNK_LENGTH if chunked(R, ROW_CHUNK) else None


def row_chunk_open(R: object, cuda_unrolled: bool, length: int = ROW_CHUNK_LENGTH) -> list[str]:  # noqa: N803
    """The head of a row pass's chunk loop (``fuseg_jc`` to ``fuseg_je``, a thread's ``length``
    iterations a block apart). ``cuda_unrolled``: the pass's CUDA loop is the unrolled one of at
    most 16 iterations a thread (Note [CUDA launch shapes]), which needs no chunks: on CUDA the
    loop runs once, in a block of its own."""
    step = f"(FUSEG_I){length} * FUSEG_BLOCK_DIM"
    loop = [f"    for (FUSEG_I fuseg_jc = 0; fuseg_jc < ({R}); fuseg_jc += {step}) {{",
            f"    const FUSEG_I fuseg_je = ({R}) - fuseg_jc < {step} ? ({R}) : fuseg_jc + {step};"]
    if not cuda_unrolled:
        return loop
    return ["#ifndef __CUDACC__", *loop, "#else", "    {", "#endif"]


def column_chunk_open(R: object) -> list[str]:  # noqa: N803
    """The head of a column pass's chunk loop over reduced elements ``fuseg_jc`` to ``fuseg_je``."""
    return [f"    for (FUSEG_I fuseg_jc = 0; fuseg_jc < ({R}); fuseg_jc += {COLUMN_CHUNK}) {{",
            f"    const FUSEG_I fuseg_je = ({R}) - fuseg_jc < {COLUMN_CHUNK} ? ({R}) : fuseg_jc + {COLUMN_CHUNK};"]


def chunk_close(ct: str, acc: str, comp: str, part: str) -> list[str]:
    """A chunk's partial added into the sum (compensated), and the chunk loop closed."""
    return [f"    fuseg_sum_into<{ct}>({acc}, {comp}, {part});", "    }"]


# Note [sums in ATen's order]: a float32 or float64 sum (or mean) over a row of a known length
# reduced along the innermost dim adds its elements in the order of ATen's CPU ``cascade_sum``
# (aten/src/ATen/native/cpu/SumKernel.cpp, ``vectorized_inner_sum``), so its bits are eager's:
# vectors of ``ATEN_SUM_LANES`` lanes (ATen dispatches its sum at AVX2's width even on an AVX-512
# CPU: 8 floats, 4 doubles; its generic vectors have the same width), read four at a time into
# four accumulators, which cascade every 16 (or more) steps up four levels; the vectors left over
# go into the first accumulator, the four are added in order, then the scalars past the last
# vector are summed from 0 and the lanes added to them one by one. A mean is that sum divided by
# the length, as ATen's CPU mean is. Half precision rounding made the difference visible: T5's
# RMS norm (a mean of squares in float) in bfloat16 differed from eager by one rounding at 80
# values of its output; with this order it is eager's bit for bit. The CUDA source keeps its
# block-wide sum (ATen's CUDA order is another), and rows longer than ``ROW_CHUNK``, of a symbolic
# length, or shorter than a vector keep theirs (Note [sums in chunks]). Checked against
# ``torch.sum`` and ``torch.mean`` over rows of 8 to 4096 (tests/test_aten_sum_order.py).
ATEN_SUM_LANES = {"float": 8, "double": 4}


def aten_order_applies(R: object, acc_ct: str, innermost: bool) -> bool:  # noqa: N803
    """Whether a row sum pass is emitted in ATen's order (Note [sums in ATen's order])."""
    lanes = ATEN_SUM_LANES.get(acc_ct)
    return lanes is not None and innermost and isinstance(R, int) and lanes <= R <= ROW_CHUNK


def _ceil_log2(x: int) -> int:
    """ATen's ``CeilLog2``: at least 1, the bits of x - 1 past that."""
    return 1 if x <= 2 else (x - 1).bit_length()


def aten_row_sum(R: int, ct: str, acc: str, body: list[str], element: str, fresh) -> list[str]:  # noqa: N803, ANN001
    """The CPU lines that set ``acc`` (declared by the caller) to the sum of ``element`` over
    ``j`` in [0, R) in ATen's order; ``body`` computes ``element`` from ``j``. ``fresh(prefix)``
    names the loop's variables. The elements are computed first, in one vectorized loop as any
    pass computes them, into an array of the row (at most ``ROW_CHUNK`` values); the sum then
    reads it in ATen's order, the four accumulators of ``lanes`` lanes side by side as one array
    (accumulator q's lane l at q * lanes + l: a step reads 4 * lanes consecutive values)."""
    lanes = ATEN_SUM_LANES[ct]
    n_vec = R // lanes
    ilp = n_vec // 4
    power = max(4, _ceil_log2(ilp) // 4)
    step, mask = 1 << power, (1 << power) - 1
    w = 4 * lanes
    v, a, i, t = (fresh(p) for p in ("av", "aa", "ai", "at"))
    lines = [f"    {ct} {v}[{R}];", "#pragma omp simd", f"    for (FUSEG_I j = 0; j < {R}; ++j) {{", *body,
             f"      {v}[j] = ({ct})({element});", "    }"]
    # (the cascade is laid out here, R being known: a kernel with an ``if`` is built without
    # if-conversion, Note [no if-conversion of branches], which left a bf16 RMS norm's write
    # pass scalar, 7x slower; and a row too short to fill the first level's steps never
    # cascades: its upper levels stay +0, and adding +0 changes no sum, so they are left out)
    blocks = ilp // step
    levels = 4 if blocks else 1
    lines += [f"    {ct} {a}[{levels}][{w}] = {{}};"]

    def reads(first: int, last: int) -> list[str]:  # the steps first..last-1 into the first level
        return [f"    for (FUSEG_I {i} = {first}; {i} < {last}; ++{i}) {{",
                f"      for (int {t} = 0; {t} < {w}; ++{t}) {{ {a}[0][{t}] += {v}[{i} * {w} + {t}]; }}", "    }"]

    for blk in range(blocks):
        lines += reads(blk * step, (blk + 1) * step)
        done = (blk + 1) * step
        for lv in range(1, 4):
            lines.append(f"    for (int {t} = 0; {t} < {w}; ++{t}) {{ {a}[{lv}][{t}] += {a}[{lv - 1}][{t}]; {a}[{lv - 1}][{t}] = ({ct})0; }}")
            if done & (mask << (lv * power)):
                break
    if ilp > blocks * step:
        lines += reads(blocks * step, ilp)
    for lv in range(1, levels):
        lines.append(f"    for (int {t} = 0; {t} < {w}; ++{t}) {{ {a}[0][{t}] += {a}[{lv}][{t}]; }}")
    # (from here on a few vectors' worth, written out: GCC unrolls loops this short rather than
    # vectorize them as loops, and pairs the statements itself)
    for vec in range(ilp * 4, n_vec):  # the (at most three) vectors past the last four: the first accumulator
        lines += [f"    {a}[0][{x}] += {v}[{vec * lanes + x}];" for x in range(lanes)]
    for q in range(1, 4):
        lines += [f"    {a}[0][{x}] += {a}[0][{q * lanes + x}];" for x in range(lanes)]
    lines.append(f"    {acc} = ({ct})0;")
    lines += [f"    {acc} += {v}[{x}];" for x in range(n_vec * lanes, R)]
    lines += [f"    {acc} += {a}[0][{x}];" for x in range(lanes)]
    return lines


# Note [sums in ATen's order, streamed]: a float sum or mean (what ATen computes with its
# ``cascade_sum``) over a row longer than ``ROW_CHUNK``, of a symbolic length, or over outer dims
# (a column pass) adds in ATen's order as well, its elements
# computed as it reads them (no array of the row). Rows: the four accumulators of
# ``ATEN_SUM_LANES`` lanes of Note [sums in ATen's order] (``w`` values read a step), in blocks of
# 2^p steps, p = max(4, CeilLog2(steps) / 4) computed at the call (``fuseg_cascade_power``), each
# block cascading up to four levels: ATen's ``row_sum`` and ``multi_row_sum``
# (aten/src/ATen/native/cpu/SumKernel.cpp). Columns: one accumulator per column of a tile, in
# blocks of 2^p reduced elements cascading the same way (ATen's ``vectorized_outer_sum``, which
# sums every column in groups of 32 so; a thread's last columns under 32 it sums another way).
# The chunked sums of Note [sums in chunks] added 256 values into each accumulator before
# compensating, where ATen's cascade adds at most 16 to 32: on normal values their error was 2-7x
# eager's (a row of 2^20 + 3 through a symbolic plan: 4.2e-6 against 6.2e-7 relative to the
# largest sum; a sum over dim 0 of 50^3: 2.9e-7 against 1.1e-7; tests/test_peer_suite.py), and
# the error of a long row sum grows with its length as ATen's does (log-like), not as a chunk's.
# A row's bits are eager's where one of eager's threads takes the row whole and the kernel reads
# it along the innermost dim; a column's where eager sums it in a group of 32
# (tests/test_aten_sum_order.py). The level to cascade to is chosen by a ternary, not an ``if``
# (Note [no if-conversion of branches]). CUDA keeps the chunks (its order is a block's), and so
# do the other sums (a variance's, a norm's, a softmax's): ATen's variance accumulates in double
# (Welford), and a column variance over 2^22 + 1 values cascaded was 5.5e-7 off where eager's was
# 4.3e-8 (tests/test_reduction_accuracy.py), within it with the compensated chunks.
# ``STREAMED`` False gives the CPU the chunks again: perf/reductions.py measures one against the
# other in one process.
STREAMED = True


def streams(R: object, acc_ct: str) -> bool:  # noqa: N803
    """Whether a column pass's float sum (or mean) over ``R`` elements cascades (at least a step
    of 16; a shorter one is the cascade's first block)."""
    return STREAMED and acc_ct in ("float", "double") and (not isinstance(R, int) or R >= 16)


def _levels(a: str, n: str, when: str, up: str, lv: str, t: str, ct: str, top: int = 3) -> list[str]:
    """A block's cascade: level ``lv`` takes level ``lv - 1`` for lv up to 1, 2 or 3, where the
    count ``when`` of steps done is a multiple of 2^p, 2^2p or 2^3p (ATen's masks); ``top``: the
    highest level filled, 1 or 3 (the cascade goes no further)."""
    if top == 1:
        return [f"    for (FUSEG_I {t} = 0; {t} < {n}; ++{t}) {{ {a}[1][{t}] += {a}[0][{t}]; {a}[0][{t}] = ({ct})0; }}"]
    return [f"    const int {up} = ({when} & (fuseg_cm << fuseg_cp)) ? 1 : (({when} & (fuseg_cm << (2 * fuseg_cp))) ? 2 : 3);",
            f"    for (int {lv} = 1; {lv} <= {up}; ++{lv})",
            f"      for (FUSEG_I {t} = 0; {t} < {n}; ++{t}) {{ {a}[{lv}][{t}] += {a}[{lv} - 1][{t}]; {a}[{lv} - 1][{t}] = ({ct})0; }}"]


def streamed_row_sum(R: object, ct: str, acc: str, body: list[str], element: str, fresh, lo: str = "0") -> list[str]:  # noqa: N803, ANN001
    """The CPU lines (a block of their own but for ``acc``, declared by the caller) that set
    ``acc`` to the sum of ``element`` over ``j`` in [lo, lo + R) in ATen's order (Note [sums in
    ATen's order, streamed]); ``body`` computes ``element`` from ``j``, and is written once per loop."""
    lanes = ATEN_SUM_LANES[ct]
    w = 4 * lanes
    a, i, t, up, lv, nv, ilp, ie, q, p4 = (fresh(p) for p in ("sa", "si", "st", "su", "sl", "snv", "silp", "sie", "sq", "sfour"))

    def reads(j: str, n: int, into: str) -> list[str]:
        return ["#pragma omp simd", f"      for (FUSEG_I {t} = 0; {t} < {n}; ++{t}) {{", f"      const FUSEG_I j = {lo} + {j};",
                *body, f"      {into} += ({ct})({element});", "      }"]

    lines = ["    {",
             f"    {ct} {a}[4][{w}] = {{}};",
             f"    const FUSEG_I {nv} = ({R}) / {lanes}, {ilp} = {nv} / 4;",
             f"    const int fuseg_cp = fuseg_cascade_power({ilp});",
             "    const FUSEG_I fuseg_cs = (FUSEG_I)1 << fuseg_cp, fuseg_cm = fuseg_cs - 1;",
             f"    FUSEG_I {i} = 0;",
             f"    for (; {i} + fuseg_cs <= {ilp};) {{",
             f"      for (FUSEG_I {ie} = {i} + fuseg_cs; {i} < {ie}; ++{i}) {{",
             *reads(f"{i} * {w} + {t}", w, f"{a}[0][{t}]"),
             "      }",
             *_levels(a, str(w), i, up, lv, t, ct),
             "    }",
             f"    for (; {i} < {ilp}; ++{i}) {{",
             *reads(f"{i} * {w} + {t}", w, f"{a}[0][{t}]"),
             "    }",
             f"    for (FUSEG_I {t} = 0; {t} < {w}; ++{t}) {{ {a}[0][{t}] += {a}[1][{t}]; {a}[0][{t}] += {a}[2][{t}]; {a}[0][{t}] += {a}[3][{t}]; }}",
             # the (at most three) vectors past the last four: the first accumulator
             f"    for (FUSEG_I {i} = {ilp} * 4; {i} < {nv}; ++{i}) {{",
             *reads(f"{i} * {lanes} + {t}", lanes, f"{a}[0][{t}]"),
             "    }",
             f"    for (int {lv} = 1; {lv} < 4; ++{lv})",
             f"      for (FUSEG_I {t} = 0; {t} < {lanes}; ++{t}) {a}[0][{t}] += {a}[0][{lv} * {lanes} + {t}];",
             # a row shorter than a vector: ATen's four interleaved scalar accumulators, the
             # elements past them into the first (``row_sum``), the four added in order; a longer
             # one: the scalars past the last vector summed from 0, then the lanes (the unused
             # side's values are +0, which changes no sum)
             f"    const FUSEG_I {q} = ({R}) < {lanes} ? ({R}) / 4 : 0;",
             f"    {ct} {p4}[4] = {{}};",
             f"    for (FUSEG_I {t} = 0; {t} < 4 * {q}; ++{t}) {{", f"      const FUSEG_I j = {lo} + {t};", *body,
             f"      {p4}[{t}] += ({ct})({element});", "    }",
             f"    {acc} = {p4}[0];",
             f"    for (FUSEG_I j = {lo} + (({R}) < {lanes} ? 4 * {q} : {nv} * {lanes}); j < {lo} + ({R}); ++j) {{", *body,
             f"      {acc} += ({ct})({element});", "    }",
             f"    for (FUSEG_I {t} = 0; {t} < {lanes}; ++{t}) {acc} += {a}[0][{t}];",
             f"    {acc} = (({acc} + {p4}[1]) + {p4}[2]) + {p4}[3];",
             "    }"]
    return lines


def column_levels(R: object) -> int:  # noqa: N803
    """The cascade levels a column pass over ``R`` elements keeps: two where ``R`` is known and
    short of a second level's step (the upper two would stay +0, which changes no sum), else four.
    Two levels took a sum over 50 rows of 2500 columns from 1.38x the chunked pass's time to
    1.12-1.16x (the Intel Xeon with AMX, scratch, three runs); three levels where a fourth is
    never reached were no faster within the noise of a 512-row sum (1.11-1.46x either way)."""
    if not isinstance(R, int):
        return 4
    step = 1 << max(4, _ceil_log2(R) // 4)
    return 2 if R < step * step else 4


def column_cascade_open(R: object, a: str, n: str, ct: str, tile: int) -> list[str]:  # noqa: N803
    """Before a column pass's blocks: the levels ``a`` of ``tile`` accumulators each."""
    levels = column_levels(R)
    return [f"    {ct} {a}[{levels}][{tile}];",
            f"    for (int fuseg_cl = 0; fuseg_cl < {levels}; ++fuseg_cl) for (FUSEG_I t = 0; t < {n}; ++t) {a}[fuseg_cl][t] = ({ct})0;",
            "    {",
            f"    const int fuseg_cp = fuseg_cascade_power({R});",
            "    const FUSEG_I fuseg_cs = (FUSEG_I)1 << fuseg_cp, fuseg_cm = fuseg_cs - 1;"]


def column_block_close(R: object, a: str, n: str, done: str, fresh, ct: str) -> list[str]:  # noqa: N803, ANN001
    """After a column pass's block of 2^p elements (``done`` of them read so far): its cascade."""
    return _levels(a, n, done, fresh("su"), fresh("sl"), "t", ct, column_levels(R) - 1)


def column_cascade_close(R: object, a: str, n: str, acc: str) -> list[str]:  # noqa: N803
    """The levels added into the first, in ATen's order, as the pass's sums ``acc``."""
    total = f"{a}[0][t]"
    for lv in range(1, column_levels(R)):
        total = f"({total} + {a}[{lv}][t])"
    return [f"    for (FUSEG_I t = 0; t < {n}; ++t) {acc}[t] = {total};", "    }"]


# Note [a long row's sum shared among threads]: ATen sums a tensor into one value (a row that is the
# whole output) in two passes (``parallel_reduce``'s ``two_pass_reduction``,
# aten/src/ATen/native/TensorIteratorReduce.cpp): from ``GRAIN`` elements and with more than one
# thread, ``at::parallel_for`` cuts the row into one chunk per thread (ceil(n / threads) elements,
# no more chunks than n / GRAIN rounded up), each chunk's cascade sum goes into its thread's slot of
# a buffer of zeros (one slot per thread of the pool), and the buffer is then summed in ATen's
# order. A kernel of one row did the whole row on one thread: a sum of 2^22 floats took 1.8x
# eager's time on two threads of the Intel Xeon of perf/results/intel-xeon-amx/reductions_cpu.json
# (0.99x with the threads, that record), and a single row was the one case where the streamed sum
# could not give eager's bits. Such a pass (one row of the
# kernel, a float sum or mean streamed) now does the same in an OpenMP region of the pool's
# threads: eager's bits with the same thread count, where eager's threads are OpenMP's (torch's
# libgomp is the one the kernels load). A kernel that runs beside others (Note [kernels side by
# side]) runs on one thread: one chunk, within eager's error, not its bits.
GRAIN = 32768


def split_row_sum(R: object, ct: str, acc: str, body: list[str], element: str, fresh) -> list[str]:  # noqa: N803, ANN001
    """The CPU lines that set ``acc`` (declared by the caller) to the sum of ``element`` over
    ``j`` in [0, R) as ATen sums one row into one value (Note [a long row's sum shared among
    threads]): the chunks' sums into the pool's slots, then the slots summed as a row."""
    n, m, parts, th, grains, nth, chunk, lo, ln, part, k = (fresh(x) for x in (
        "sn", "sm", "sp", "sth", "sg", "snt", "sch", "slo", "sln", "spt", "sk"))
    return ["    {",
            f"    const long long {n} = ({R});",
            f"    const int {m} = omp_get_max_threads();",
            f"    {ct} {parts}[{m}];",
            f"    for (int {k} = 0; {k} < {m}; ++{k}) {parts}[{k}] = ({ct})0;",
            f"#pragma omp parallel if({n} >= {GRAIN} && {m} > 1)",
            "    {",
            f"    const long long {th} = omp_get_num_threads(), {grains} = ({n} + {GRAIN - 1}) / {GRAIN};",
            f"    const long long {nth} = {th} < {grains} ? {th} : ({grains} > 0 ? {grains} : 1);",
            f"    const long long {chunk} = ({n} + {nth} - 1) / {nth};",
            f"    const long long {lo} = (long long)omp_get_thread_num() * {chunk};",
            f"    const long long {ln} = {lo} >= {n} ? 0 : ({n} - {lo} < {chunk} ? {n} - {lo} : {chunk});",
            f"    {ct} {part};",
            *streamed_row_sum(ln, ct, part, body, element, fresh, f"(FUSEG_I){lo}"),
            f"    {parts}[omp_get_thread_num()] += {part};",
            "    }",
            *streamed_row_sum(m, ct, acc, [], f"{parts}[j]", fresh),
            "    }"]
