"""Sums over long rows that stay as exact as ATen's (Note [sums in chunks]).

Note [sums in chunks]: a float accumulator that adds values one by one loses the low bits of
each as it grows, and past 2^24 additions of similar values it stops growing at all: a row kernel
that summed a 2^25-element row into one accumulator per vector lane gave a float16 variance 2-5%
off and a float32 sum of 0.3s 2e-4 off (issue 63), where ATen's ``cascade_sum``
(aten/src/ATen/native/cpu/SumKernel.cpp) is within 1e-7. A sum pass over a row longer than
``ROW_CHUNK`` elements (or of a symbolic length) is therefore cut into chunks of
``ROW_CHUNK_LENGTH``: each chunk is the same vectorized loop as before into a fresh partial
(``ROW_CHUNK_LENGTH`` / vector width additions per lane on the CPU, ``ROW_CHUNK_LENGTH`` per
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
sum is the same on every call. Not at ATen's error: a long row of one repeated value, whose
roundings all lean one way (~4x eager's error against the exact sum over 2^22 copies of 0.7);
chunks of 1024 bring it to ~4x less but cost plain row sums 8-16% on the AMD EPYC of the records
(perf/results/amd-epyc-zen4/reductions_speed_chunk1024_cpu.json), so they were not taken. Max, min, any, all and integer sums are exact and not chunked.
"""

from __future__ import annotations

import torch

__all__ = ["COLUMN_CHUNK", "ROW_CHUNK", "ROW_CHUNK_LENGTH", "SCALAR_CHUNK", "chunk_close", "chunked", "column_chunk_open", "row_chunk_open",
           "row_chunk_length"]

#: rows of a known length up to this keep their one loop (the sizes of real models' norms)
ROW_CHUNK = 4096
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
