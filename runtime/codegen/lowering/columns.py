"""Reductions over outer dims on the CPU: a tile of rows per thread, the rows in the inner loop.

Note [column passes]: where a segment's reductions keep the innermost dim of their domain F (a
sum over the batch, a mean over channels, a softmax over dim 1), the per-row kernel (rows.py)
reads each row with the stride of an outer dim, an element at a time: on this 2-core machine
kind a sum over dim 0 of 1024x1024 floats took 2275 us against ATen's 117 (one scratch run).
ATen's CPU reductions keep a vector of neighbouring outputs instead, and so does this variant:
the rows (positions of the kept dims, in row-major order) are taken ``TILE`` at a time; each pass
over the reduced elements is a loop over them with, inside, a loop over the tile's rows that
updates one accumulator per row, an ``omp simd`` loop over neighbouring addresses where the
innermost kept dim is contiguous. A value per row (a mean, a max, a reciprocal) is an array of
the tile's length; the element expressions are the per-row variant's, the same ops in the same
order per row (``rows.emit_reductions``), so results are the per-row kernel's. Tiles are shared
among threads by work (Note [work of a loop]). CUDA keeps the per-row kernel (a block per row):
the body holds both, chosen by ``__CUDACC__``.
"""

from __future__ import annotations

import math

import torch

from ..kernel import Body, Param, parallel_if, store_output
from ..source import index as ix
from . import cascade
from .rows import Row, _identity, emit_reductions, full_index

__all__ = ["TILE", "column_loop", "takes_columns"]

#: rows a tile holds at most (accumulators per pass: TILE values on its thread's stack)
TILE = 64


def takes_columns(row: Row) -> bool:
    """Whether the column variant is generated for the CPU: some dim is reduced, the innermost
    dim of the domain is kept (with more than one position), and more than one row."""
    last = len(row.F) - 1
    return bool(row.reduced) and last not in row.reduced and row.F[last] > 1 and math.prod(row.O) > 1


def column_loop(lw, row: Row, full: list[Param], rowouts: list[Param], stores: dict) -> str:  # noqa: ANN001 - lw: lower._Lowerer
    """The CPU loops of a row kernel whose rows are positions of outer dims (Note [column passes])."""
    O, R, rows = row.O, row.R, math.prod(row.O)  # noqa: E741
    # a tile is a run of the innermost kept dim (contiguous in F): its row counter is affine in t
    last = O[-1]
    # (a symbolic run: tiles of TILE, the last one short by ``tn``; no condition on its length)
    tile = TILE if isinstance(last, torch.SymInt) else min(TILE, last)
    chunks = -(-last // tile)
    tiles = rows // last * chunks
    lines = [f"  for (FUSEG_I q = 0; q < {tiles}; ++q) {{",
             f"    const FUSEG_I c0 = (q % {chunks}) * {tile};",
             f"    const FUSEG_I tn = {last} - c0 < {tile} ? {last} - c0 : {tile};"]
    outer = []
    for d, term in enumerate(ix.unravel_terms(f"(q / {chunks})", O[:-1])):
        if term == "0":
            outer.append("0")
        else:
            lines.append(f"    const FUSEG_I o_{d} = {term};")
            outer.append(f"o_{d}")
    outer.append("(c0 + t)")

    def j_terms() -> tuple[list[str], list[str]]:
        decls, js = [], []
        for d, term in enumerate(ix.unravel_terms("j", row.I)):
            if term == "0":
                js.append("0")
            else:
                decls.append(f"      const FUSEG_I j_{d} = {term};")
                js.append(f"j_{d}")
        return decls, js

    def element_pass(loop: str, each, chunk: bool = False, span: tuple[str, str] | None = None) -> None:  # noqa: ANN001 - each(body, idx) -> the lines after the body's
        decls, js = j_terms()
        b = Body(lw, loop, "        ")  # run per row of the tile (t); ``outer`` indexes its kept dims
        after = each(b, row.index(outer, js))
        start, end = ("fuseg_jc", "fuseg_je") if chunk else ("0", f"{R}")  # Note [sums in chunks]
        if span is not None:  # (Note [sums in ATen's order, streamed]: a block, or the elements past the last)
            start, end = span
        lines.append(f"    for (FUSEG_I j = {start}; j < {end}; ++j) {{")
        lines.extend(decls)
        lines.extend(["#pragma omp simd", "      for (FUSEG_I t = 0; t < tn; ++t) {"])
        lines.extend(b.lines)
        lines.extend(after)
        lines.extend(["      }", "    }"])

    def write(b: Body, idx: list[str]) -> list[str]:
        for p in full:
            for at in full_index(lw, p, idx):
                store_output(lw, b, p, at, stores)
        return []  # the stores are the body's own lines

    # Note [full values stored in the first pass]: full outputs that depend on no reduction (a
    # bias gradient's segment: GELU's backward, written whole, and its sum over the batch) are
    # stored by the first pass over the tile, which computes their elements anyway; a pass of
    # their own computed them again (bert-256's backward: 1.0 ms a segment for 256x1024, twice
    # GELU's backward alone, scratch). Not where one is written into an input (a later pass may
    # read the input there).
    early = bool(full) and all(p.value not in lw.chains and p.target is None for p in full)
    written = [False]  # (set by the pass that stored them)

    def reduce_pass(ct: str, combine: str, element, aten: bool = False) -> str:  # noqa: ANN001 - element(body, idx) -> expr
        # (``aten``: a sum ATen computes with its cascade, added in that order: Note [sums in
        # ATen's order, streamed])
        acc_ct = "int" if ct == "bool" else ct
        acc = lw.fresh("acc")
        lines.append(f"    {acc_ct} {acc}[{tile}];")
        lines.append(f"    for (FUSEG_I t = 0; t < tn; ++t) {acc}[t] = ({acc_ct})({_identity(combine, ct)});")
        stored = early and not written[0]

        def each(b: Body, idx: list[str]) -> list[str]:
            update = f"        {into}[t] = {combine}<{acc_ct}>({into}[t], ({acc_ct})({element(b, idx)}));"
            if stored:
                write(b, idx)
            return [update]
        if combine == "fuseg_sum" and aten and cascade.streams(R, acc_ct):
            # (Note [sums in ATen's order, streamed]) blocks of 2^p elements, cascading; the rest
            lv, done = lw.fresh("lv"), lw.fresh("jc")
            into = f"{lv}[0]"
            lines.extend(cascade.column_cascade_open(R, lv, "tn", acc_ct, tile))
            lines.append(f"    FUSEG_I {done} = 0;")
            lines.append(f"    for (; {done} + fuseg_cs <= ({R}); {done} += fuseg_cs) {{")
            element_pass(lw.fresh("P"), each, span=(done, f"{done} + fuseg_cs"))
            lines.extend(cascade.column_block_close(R, lv, "tn", f"({done} + fuseg_cs)", lw.fresh, acc_ct))
            lines.append("    }")
            element_pass(lw.fresh("P"), each, span=(done, f"{R}"))
            lines.extend(cascade.column_cascade_close(R, lv, "tn", acc))
            if stored:
                written[0] = True
            return f"{acc}[t]"
        # (Note [sums in chunks]) each accumulator adds one value per reduced element, so a float
        # sum over many adds partials of COLUMN_CHUNK elements, compensated
        chunk = combine == "fuseg_sum" and acc_ct in ("float", "double") and cascade.chunked(R, cascade.COLUMN_CHUNK)
        into = acc
        if chunk:
            comp, into = lw.fresh("comp"), lw.fresh("part")
            lines.append(f"    {acc_ct} {comp}[{tile}], {into}[{tile}];")
            lines.append(f"    for (FUSEG_I t = 0; t < tn; ++t) {comp}[t] = ({acc_ct})0;")
            lines.extend(cascade.column_chunk_open(R))
            lines.append(f"    for (FUSEG_I t = 0; t < tn; ++t) {into}[t] = ({acc_ct})0;")
        element_pass(lw.fresh("P"), each, chunk)
        if chunk:
            lines.extend(["    for (FUSEG_I t = 0; t < tn; ++t) {", *cascade.chunk_close(acc_ct, f"{acc}[t]", f"{comp}[t]", f"{into}[t]")])
            lines.append("    }")
            lines.append(f"    for (FUSEG_I t = 0; t < tn; ++t) {acc}[t] = fuseg_sum_total<{acc_ct}>({acc}[t], {comp}[t]);")
        if stored:
            written[0] = True
        return f"{acc}[t]"

    def row_let(ct: str, expr: str) -> str:
        name = lw.fresh("v")
        lines.append(f"    {ct} {name}[{tile}];")
        lines.append(f"    for (FUSEG_I t = 0; t < tn; ++t) {name}[t] = {expr};")
        return f"{name}[t]"

    lw.exp_scratch = {}  # the per-row variant's kept exps are not this variant's
    emit_reductions(lw, R, reduce_pass, row_let, lambda ct: None)
    if full and not written[0]:
        element_pass(lw.fresh("W"), write)
    if rowouts:
        b = Body(lw, lw.fresh("T"), "      ")
        for p in rowouts:
            store_output(lw, b, p, list(outer) if p.shape == O else row.index(outer, ["0"] * row.k), stores)
        lines.append("    for (FUSEG_I t = 0; t < tn; ++t) {")
        lines.extend(b.lines)
        lines.append("    }")
    lines.append("  }")
    head = []
    threads = parallel_if(math.prod(row.F), lines)
    if threads is not None and tiles > 1:  # tiles shared among threads
        head.append(f"#pragma omp parallel for schedule(static){threads}")
    return "\n".join(head + lines) + "\n"

