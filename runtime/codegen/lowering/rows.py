"""Row kernels for REDUCTION and NORMALIZATION segments (see Note [kernel shapes] in lower.py).

Every reduction of the segment reduces the same dims of the same domain F: the kept dims O and
the reduced dims I. A block takes rows of O and runs one block-wide pass over I per reduction
(later passes use the results of earlier ones), then writes the outputs of shape F in a last pass
and those of shape O (or F with each reduced dim 1, keepdim) from thread 0. ``row_levels`` is the
structural check that a reduced value is only ever read at its own row.

Note [reduced dims anywhere]: the reduced dims need not be the innermost ones (a bias gradient's
sum over the batch, a softmax over channels, a mean over dim 0). A row is still one position of
the kept dims and its elements those of the reduced dims; ``Row.index`` puts each dim's counter
back at its place in F, so every load and store indexes F as the op does, at any strides. Only
the order of memory accesses changes: a pass over a reduced outer dim reads with that dim's
stride (uncoalesced on CUDA). Where the innermost dim is kept, the CPU build runs the column
variant instead (Note [column passes] in columns.py); this per-row one stays the CUDA source.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import torch

from runtime.options import current
from segmenter import Node

from ..kernel import CONST, LINEAR_VIEWS, Body, Param, bind, cuda_tuning, norm_dim, parallel_if, store_output
from ..source import index as ix
from ..source.checks import MAX_EXTENT, dims_arg, float_arg, permutation_arg, shape_ints
from ..source.ctypes_ import Declined, compute_type, literal, store
from . import cascade
from .half_rows import RowHalf, fill_lines, flush_lines
from .pointwise import ELEMENTWISE

__all__ = ["REDUCTIONS", "Chain", "Row", "emit_reductions", "exact", "full_index", "plan_row", "row_levels", "row_loop"]

REDUCTIONS = {
    "aten.sum.dim_IntList", "aten.sum.default", "aten.mean.dim", "aten.mean.default", "aten.amax.default",
    "aten.amin.default", "aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim", "aten.all.dims",
    "aten.all.default", "aten.var.correction", "aten.var_mean.correction", "aten.logsumexp.default",
    "aten._softmax.default", "aten._log_softmax.default", "aten.native_layer_norm.default",
    "aten.linalg_vector_norm.default",
}


@dataclass
class Row:
    """The domain F of a segment's reductions and the dims they reduce (Note [reduced dims
    anywhere]): a row is one position of the kept dims, its elements those of the reduced ones."""

    F: tuple[int, ...]
    reduced: tuple[int, ...]  # sorted dims of F

    @property
    def k(self) -> int:
        return len(self.reduced)

    @property
    def O(self) -> tuple[int, ...]:  # noqa: N802, E743 - the outer shape, as in Note [kernel shapes]
        """The kept dims, in order: a reduction's output without keepdim."""
        return tuple(n for d, n in enumerate(self.F) if d not in self.reduced)

    @property
    def O1(self) -> tuple[int, ...]:  # noqa: N802
        """F with each reduced dim 1: a reduction's output with keepdim."""
        return tuple(1 if d in self.reduced else n for d, n in enumerate(self.F))

    @property
    def I(self) -> tuple[int, ...]:  # noqa: N802, E743
        """The reduced dims, in order: the shape a row's elements are counted in."""
        return tuple(self.F[d] for d in self.reduced)

    @property
    def R(self) -> int:  # noqa: N802
        return math.prod(self.I)

    def index(self, outer: list[str], inner: list[str]) -> list[str]:
        """An index of F from one per kept dim (``outer``) and one per reduced dim (``inner``)."""
        o, i = iter(outer), iter(inner)
        return [next(i) if d in self.reduced else next(o) for d in range(len(self.F))]


def reduced_dims(node: Node, a: dict, rank: int) -> tuple[int, ...]:
    op = node.op
    if op in ("aten._softmax.default", "aten._log_softmax.default"):
        d = norm_dim(a["dim"], rank)  # checked: within [-1, 0] for a 0-d value, which is its own row
        return () if rank == 0 else (d,)
    if op == "aten.native_layer_norm.default":
        k = len(shape_ints(a["normalized_shape"], "normalized_shape"))
        if k > rank:
            raise Declined(f"layer norm over {k} dims of a rank-{rank} tensor")
        return tuple(range(rank - k, rank))
    dims = a.get("dim")
    if op.endswith(".default") and op.split(".")[1] in ("sum", "mean", "any", "all"):
        dims = None
    if isinstance(dims, int):
        dims = [dims]
    if dims is not None and not isinstance(dims, (tuple, list)):
        raise Declined(f"{op}: dim must be a list of dims, got {type(dims).__name__}")
    if dims is None or len(dims) == 0:
        return tuple(range(rank))
    dims = tuple(sorted({norm_dim(d, rank) for d in dims}))  # checked: within [-1, 0] for a 0-d value
    return () if rank == 0 else dims  # a 0-d value reduced over "its" dim 0 is its own row


def plan_row(lw, reductions: list[Node]) -> Row:
    row = None
    for node in reductions:
        a = bind(node)
        x = a["input"] if "input" in a else a["self"]
        F = lw.meta(x.name).shape
        dims = reduced_dims(node, a, len(F))
        if any(not 0 <= d < len(F) for d in dims):  # pragma: no cover - reduced_dims normalizes; a guard
            raise Declined(f"{node.op} reduces dims {list(dims)} of a rank-{len(F)} value")
        if row is None:
            row = Row(F, dims)
        elif (row.F, row.reduced) != (F, dims):
            raise Declined(f"reductions over different domains ({list(row.F)} reducing {list(row.reduced)} and "
                           f"{list(F)} reducing {list(dims)})")
    lw.row = row
    return row


# Note [permuted full values]: a full value need not keep F's layout. Qwen3 normalizes each head,
# moves the heads before the sequence, applies RoPE (a slice, neg and cat of halves of the
# normalized dim) and repeats the key heads for grouped-query attention (unsqueeze, expand);
# Swin V2 normalizes and cuts the image into windows (views and transposes). The kernel computes
# each output element by pulling its index back through the ops (lower.py), and a reduced value
# read on the way is the register of the row the loop is at: the result is right exactly when
# the pull-back of the position written lands on the row the loop is at. ``row_levels`` records
# for each full value a ``Chain``: the views (reshape, permute, expand) that take a position of F
# to the value's, and which dims of F each of the value's dims counts. Slice, narrow, cat,
# constant_pad_nd and flip may move elements only along dims that count reduced dims of F alone
# (within the row); values combined elementwise must have one chain, and a reduced value
# broadcast over the row meets only values in F's own layout. The row loop, which visits every
# position of F once, writes an output at its position taken through the chain (``full_index``;
# an expand writes each of its copies). An output that is only part of a row (sliced or padded,
# not cat back to its size) has no such position and is declined, as is any other re-indexing (a
# slice or roll of a kept dim, a reduction of a re-indexed value, a reshape of a part of a row).
PERMUTES = {"aten.transpose.int", "aten.t.default", "aten.permute.default"}
WITHIN_ROW = {"aten.slice.Tensor", "aten.narrow.default", "aten.cat.default", "aten.constant_pad_nd.default",
              "aten.flip.default"}
MAX_COPIES = 16  # positions an expand may write per element of F


@dataclass(frozen=True)
class Chain:
    """The views from F to a full value: ``steps`` of ("reshape", from, to), ("perm", dims) or
    ("expand", from, to); ``shape`` where they lead; ``deps``, per dim of it, the dims of F its
    counter depends on (Note [permuted full values])."""

    steps: tuple
    shape: tuple[int, ...]
    deps: tuple[frozenset[int], ...]

    @staticmethod
    def of(F: tuple[int, ...]) -> Chain:  # noqa: N803
        return Chain((), F, tuple(frozenset({d}) for d in range(len(F))))

    def reshape(self, to: tuple[int, ...]) -> Chain:
        if to == self.shape:
            return self
        if math.prod(to) != math.prod(self.shape) or math.prod(to) == 0:
            raise Declined(f"a view from {list(self.shape)} to {list(to)}")
        deps = [frozenset()] * len(to)
        for ga, gb in ix.reshape_groups(self.shape, to):
            union = frozenset().union(*(self.deps[d] for d in ga))
            for d in gb:
                deps[d] = union
        steps = self.steps
        frm = self.shape
        if steps and steps[-1][0] == "reshape":  # two reshapes are one
            steps, frm = steps[:-1], steps[-1][1]
        return Chain(steps if frm == to else (*steps, ("reshape", frm, to)), to, tuple(deps))

    def permute(self, dims: list[int]) -> Chain:
        if dims == list(range(len(dims))):
            return self
        steps = self.steps
        if steps and steps[-1][0] == "perm":  # two permutes are one
            dims = [steps[-1][1][d] for d in dims]
            steps = steps[:-1]
        chain = Chain(steps, tuple(self.shape[d] for d in dims), tuple(self.deps[d] for d in dims))
        return chain if dims == list(range(len(dims))) else replace(chain, steps=(*steps, ("perm", tuple(dims))))

    def expand(self, to: tuple[int, ...]) -> Chain:
        lead = len(to) - len(self.shape)
        if lead < 0 or any(n != m and n != 1 for n, m in zip(self.shape, to[lead:])):
            raise Declined(f"an expand from {list(self.shape)} to {list(to)}")
        if to == self.shape:
            return self
        copies = math.prod(m for n, m in zip((1,) * lead + self.shape, to) if n != m)
        if copies > MAX_COPIES:
            raise Declined(f"an expand writes {copies} copies of each element (at most {MAX_COPIES} in a row kernel)")
        deps = (frozenset(),) * lead + tuple(dep if n == m else frozenset()
                                              for dep, n, m in zip(self.deps, self.shape, to[lead:]))
        return Chain((*self.steps, ("expand", self.shape, to)), to, deps)

    def positions(self, idx: list[str]) -> list[list[str]]:
        """The positions of the value that the element of F at ``idx`` is written to."""
        out = [list(idx)]
        for step in self.steps:
            if step[0] == "reshape":
                out = [ix.reshape(i, step[2], step[1]) for i in out]
            elif step[0] == "perm":
                out = [[i[d] for d in step[1]] for i in out]
            else:
                frm, to = step[1], step[2]
                lead = len(to) - len(frm)
                out = [list(c) for i in out for c in itertools.product(
                    *([str(k) for k in range(m)] if d < lead or frm[d - lead] != m else [i[d - lead]]
                      for d, m in enumerate(to)))]
        return out


def _permutation(node: Node, a: dict, rank: int) -> list[int]:
    """For each dim of a transpose/permute's output, the input dim it is."""
    if node.op == "aten.permute.default":
        return permutation_arg(a["dims"], rank)
    p = list(range(rank))
    if rank >= 2:
        d0, d1 = (norm_dim(a["dim0"], rank), norm_dim(a["dim1"], rank)) if "dim0" in a else (0, 1)
        p[d0], p[d1] = p[d1], p[d0]
    return p


def _moved_dims(node: Node, a: dict, rank: int) -> list[int]:
    """The dims along which a WITHIN_ROW op moves elements (a pad: those it pads or crops)."""
    if node.op == "aten.flip.default":
        return dims_arg(a["dims"], rank, "flip dims")
    if node.op == "aten.constant_pad_nd.default":
        pads = shape_ints(a["pad"], "pad", -MAX_EXTENT)
        if len(pads) % 2 or len(pads) > 2 * rank:
            raise Declined(f"pad {list(pads)} for a rank-{rank} tensor")
        return [rank - 1 - j for j in range(len(pads) // 2) if pads[2 * j] or pads[2 * j + 1]]
    return [norm_dim(a.get("dim", 0), rank)]


def row_levels(lw, row: Row) -> dict[str, str]:
    """Which values depend on a reduction: "row" (one per row, shape O or O+1s) or "full"; sets
    ``lw.chains`` (Note [permuted full values])."""
    O, O1, F = row.O, row.O1, row.F  # noqa: E741
    level: dict[str, str] = {}
    chains: dict[str, Chain] = {}
    own = Chain.of(F)
    for node in lw.seg.nodes:
        outs = [o for o in node.outputs if o is not None]
        if node.op in REDUCTIONS:
            a = bind(node)
            x = a["input"] if "input" in a else a["self"]
            if level.get(x.name) == "row":
                raise Declined(f"{node.op} reduces a reduced value")
            if level.get(x.name) == "full" and chains[x.name] != own:
                raise Declined(f"{node.op} reduces a value re-indexed after a reduction")
            for k, o in enumerate(node.outputs):
                if o is None:
                    continue
                full = node.op in ("aten._softmax.default", "aten._log_softmax.default") or (
                    node.op == "aten.native_layer_norm.default" and k == 0)
                shape = lw.meta(o).shape
                if not full and shape not in (O, O1):
                    raise Declined(f"{node.op} output of shape {list(shape)}")
                level[o] = "full" if full else "row"
                if full:
                    chains[o] = own
            continue
        if node.op in CONST:  # reads no element of its input (full_like & co.)
            continue
        rows = [v for v in node.inputs if level.get(v) == "row"]
        fulls = [v for v in node.inputs if level.get(v) == "full"]
        if not rows and not fulls:
            continue
        mine = {chains[v] for v in fulls}
        chain = next(iter(mine)) if len(mine) == 1 else None  # the full inputs' chain, where they agree
        whole = chain is not None and lw.meta(fulls[0]).shape == chain.shape  # not part of a row
        for o in outs:
            so = lw.meta(o).shape
            new: Chain | None | bool = False  # the output's chain, None for a row value, False: declined
            if len(mine) > 1:
                pass  # values laid out differently: one position would be two rows
            elif node.op in ELEMENTWISE:
                if all((lw.meta(v).shape == O1 and so in (F, O1)) or (lw.meta(v).shape == O and so == O) for v in rows) \
                        and all(lw.meta(v).shape == so for v in fulls) and not (rows and fulls and (so != F or chain != own)):
                    new = chain if fulls else (own if so == F else None)
            elif node.op in LINEAR_VIEWS:
                if rows:
                    new = None if so in (O, O1) else False
                else:
                    new = chain if lw.meta(fulls[0]).shape == so else chain.reshape(so) if whole else False
            elif node.op == "aten.expand.default":
                if rows:
                    new = (own if so == F else None) if lw.meta(rows[0]).shape == O1 and so in (F, O1) else False
                else:
                    new = chain if lw.meta(fulls[0]).shape == so else chain.expand(so) if whole else False
            elif node.op in PERMUTES and not rows:
                new = chain.permute(_permutation(node, bind(node), len(chain.shape)))
            elif node.op in WITHIN_ROW and not rows:
                moved = _moved_dims(node, bind(node), len(chain.shape))
                new = chain if all(chain.deps[d] <= set(row.reduced) for d in moved) else False
            if new is False or (new is None and not (rows and not fulls and so in (O, O1) and so != F)):
                raise Declined(f"a reduced value is re-indexed by {node.op} (shape {list(so)})")
            level[o] = "full" if new is not None else "row"
            if new is not None:
                chains[o] = new
    lw.chains = chains
    return level


def full_index(lw, p: Param, idx: list[str]) -> list[list[str]]:
    """Where the row loop, at position ``idx`` of F, writes full output ``p`` (Note [permuted full
    values]); an output that depends on no reduction, of F's shape, at ``idx`` itself."""
    chain = lw.chains.get(p.value)
    return [list(idx)] if chain is None else chain.positions(idx)


def exact(lw, v: str) -> bool:
    """Whether full value ``v`` has an element for every position its chain leads to."""
    return lw.meta(v).shape == lw.chains[v].shape


_IDENTITY = {"fuseg_sum": "0", "fuseg_any": "0", "fuseg_all": "1"}

# Note [softmax keeps its exps]: softmax's sum pass computes exp(x - max) for every element of the
# row, and its value is that exp over the sum. ATen's CPU kernel stores the exps and scales them;
# ours computed each exp a second time where the value is read (the write pass), which made it
# slower than ATen alone (the reason softmax alone was left to ATen). On the CPU, where one thread
# takes a whole row, the sum pass now keeps each exp in a per-thread array of the row's length
# (on the stack, so rows up to EXP_SCRATCH_BYTES), and a read of the softmax at the row's own
# position ``j`` (the index the passes use, compared as text) reads it back; a read at any other
# index, a longer row and CUDA (a thread holds only part of the row) compute it again as before.
# The stored value is the very expression the write would compute. The write then scales by the
# sum's reciprocal, as ATen does, where it used to divide: that rounding (at most an ulp) is the
# one change in the values.
EXP_SCRATCH_BYTES = 64 * 1024
#: off: a kernel of one row runs its passes on one thread (the before of perf/experiments/half_rows.py;
#: Note [one row's passes shared among threads])
ONE_ROW_THREADS = True

# Note [max without a NaN chain]: a max pass combined ``fuseg_max`` (NaN wins, else the larger),
# which g++ vectorizes as two compares, a mask or and two blends, all on the accumulator: each
# 16-float vector waited for the previous one's whole chain. On one thread over 512x512 floats
# that pass alone took ~78 us against ~8 us for a sum pass (a standalone microbenchmark,
# scratch). On the CPU a float max/min pass now combines with the plain compare (``a > b ? a :
# b``, one vector max instruction) and ORs a NaN flag (``x != x``, off the accumulator's chain)
# beside it: ~10 us there. A row that held a NaN gives NaN (the max of the rest is discarded):
# the canonical quiet NaN, which is what eager's CPU amax gives too, whatever the NaN it met.
# A zero's sign, as before, is the one the order of visits leaves (+0 against -0). CUDA, the
# row cache and integer rows keep ``fuseg_max``/``fuseg_min``. Measured with the row values
# written without an ``if`` (row_loop; one interleaved run of before/after checkouts,
# perf/results/x86-cpu-unrecorded/row_reductions_cpu.json): amax over 512x512 from 9.07x eager's time to 0.86x,
# logsumexp 4.86x to 0.54x, a lone softmax 1.75x to 1.13x; a row sum (neither change) 0.90x, 0.92x.


# Note [row registers]: on CUDA a row kernel's block takes a row, each thread the elements a
# block apart (Note [CUDA launch shapes]). Where the block divides the row's length, every thread
# makes the same number of iterations (``slots``, at most 16), so a pass is a fully unrolled loop
# with no bounds test, and the values its reduction passes load are kept in per-thread arrays
# of ``slots`` indexed by the iteration: after unrolling each index is a constant, so the arrays
# are registers. The later passes (the second of layer norm's, the write) read the registers, not
# memory; softmax keeps its exps there as the CPU keeps them in its row array (Note [softmax
# keeps its exps]): one exp per element instead of two. The H100 runs had softmax at 4096x4096
# 1.30-1.33x a copy of its bytes, with three global reads and two exps per element.
# The old row cache (Note [row cache], removed) did the same with a ``break`` out of
# each iteration past the row's end, and was slower: this one has no exit, so every load of a
# pass can be issued before the first is used. Registers: at most ROW_REGISTERS values per
# thread in these arrays (a load past that budget is read again, as before); ptxas reports no
# spill for the row kernels of the bandwidth bench (tests/test_row_registers.py). The CPU code
# is unchanged: the arrays and ``it`` are on CUDA only. FUSEG_ROW_REGS=0 turns this off (the
# before of perf/gpu_validate.sh's ``loads`` step).
ROW_REGISTERS = 32


def row_registers() -> bool:
    """See Note [row registers]: on unless the ``row_regs`` option is off (FUSEG_ROW_REGS=0)."""
    return current().row_regs


def _identity(combine: str, ct: str) -> str:
    """The value a block reduction starts from: a max from the lowest value, a min from the highest."""
    if combine in _IDENTITY:
        return _IDENTITY[combine]
    low = combine == "fuseg_max"
    if ct in ("float", "double"):
        inf = literal(float("inf"), ct)
        return f"(-{inf})" if low else inf
    if ct == "long long":
        return "(-9223372036854775807LL - 1)" if low else "9223372036854775807LL"
    return "0" if low else "1"  # bool


def row_loop(lw, row: Row, full: list[Param], rowouts: list[Param], stores: dict, block: int) -> str:
    """The loop over a segment's rows, each row's reduction passes and its writes (one block per
    row on CUDA, one thread per row on the CPU).

    Note [row cache]: a row cache kept the inputs of the reduction passes per thread in arrays
    indexed by an iteration that ``break`` out past the row's end (R <= 8 * block). Measured
    slower on an H100 (softmax-4k 0.065 -> 0.080 ms, layer-norm-4k 0.113 -> 0.177;
    perf/results/nvidia-h100/gpu_row_cache_h100.json): the arrays were not kept in registers. It
    was off by default behind a switch and went with it (issue 65); Note [row registers] is what
    keeps a row's values now."""
    O, inner = row.O, row.I  # noqa: E741
    R = row.R
    # See Note [CUDA launch shapes]: with the block a constant of the source, a pass over a row of a
    # known length has a known trip count per thread; up to 16, it is written as such (unrolled)
    counted = (-(-R // block) if cuda_tuning() and isinstance(R, int) and isinstance(block, int)
               and R <= 16 * block else 0)
    # See Note [row registers]: where the block divides the row, each thread's iterations need no guard
    # and the values its reduction passes read are kept in registers on CUDA
    lw.slots = counted if counted and R % block == 0 and row_registers() else 0
    lines = []
    lines.append(f"  for (FUSEG_I row = FUSEG_BLOCK; row < {max(math.prod(O), 0)}; row += FUSEG_NBLOCKS) {{")
    outer = []
    for d, term in enumerate(ix.unravel_terms("row", O)):
        if term == "0":
            outer.append("0")
        else:
            lines.append(f"    const FUSEG_I o_{d} = {term};")
            outer.append(f"o_{d}")
    decl_at = len(lines)
    half = lw.row_half = RowHalf(row, lw.fresh)  # Note [fp16 rows converted by the row]

    def j_loop(loop: str, chunk: bool = False) -> tuple[Body, list[str], list[str]]:
        # (Note [sums in chunks]) a chunked pass's CPU (and generic CUDA) loop covers its chunk
        start, end = ("fuseg_jc + FUSEG_THREAD", "fuseg_je") if chunk else ("FUSEG_THREAD", f"{R}")
        b = Body(lw, loop, "      ")
        head = []
        js = []
        for d, term in enumerate(ix.unravel_terms("j", inner)):
            if term == "0":
                js.append("0")
            else:
                b.lines.append(f"      const FUSEG_I j_{d} = {term};")
                js.append(f"j_{d}")
        idx = row.index(outer, js)
        half.passes[loop] = [(name, n) for name, n in zip(js, inner) if name != "0"]
        if lw.slots:  # Note [row registers]: no guard, the loads of reduction passes kept
            head.extend(["#ifdef __CUDACC__",
                         f"    FUSEG_UNROLL for (int it = 0; it < {lw.slots}; ++it) {{",
                         "      const FUSEG_I j = FUSEG_THREAD + (FUSEG_I)it * FUSEG_BLOCK_DIM;",
                         "#else",
                         f"    for (FUSEG_I j = {start}; j < {end}; j += FUSEG_BLOCK_DIM) {{",
                         "#endif"])
            lw.cache_body = b
        elif counted:  # Note [CUDA launch shapes]: a pass of a known trip count on CUDA, unrolled
            head.extend(["#ifdef __CUDACC__",
                         f"    FUSEG_UNROLL for (int it = 0; it < {counted}; ++it)"
                         f" if (FUSEG_THREAD + (FUSEG_I)it * FUSEG_BLOCK_DIM < {R}) {{",
                         "      const FUSEG_I j = FUSEG_THREAD + (FUSEG_I)it * FUSEG_BLOCK_DIM;",
                         "#else",
                         f"    for (FUSEG_I j = {start}; j < {end}; j += FUSEG_BLOCK_DIM) {{",
                         "#endif"])
        else:
            head.append(f"    for (FUSEG_I j = {start}; j < {end}; j += FUSEG_BLOCK_DIM) {{")
        return b, idx, head

    def simd(head: list[str], clause: str = "", threads: str | None = None) -> list[str]:
        """Note [vectorized row passes]: on the CPU a pass over a row is one loop with no dependence
        between iterations but its reduction, so it is marked ``omp simd`` (the sums reassociate
        into vector lanes, as ATen's vectorized CPU reductions do; max/min keep their NaN rule).
        ``threads``: the pass of a kernel of one row shared among threads (Note [one row's passes
        shared among threads])."""
        pragma = (f"#pragma omp simd{clause}" if threads is None
                  else f"#pragma omp parallel for simd{clause} schedule(static){threads}")
        return ["#ifndef __CUDACC__", pragma, "#endif", *head]

    # Note [one row's passes shared among threads]: a kernel of one row (a reduction into one
    # value: T5's check whether a sum of 2^16 fp16 values holds an inf) ran every pass on one
    # thread, where its rows would have been shared; the passes whose result does not depend on
    # the order of the elements (any, all, a max or min with its NaN flag) and the last pass,
    # which writes each element on its own, are shared among the threads where the row's work is
    # worth it (``parallel_if``). A float sum has its own split (Note [a long row's sum shared
    # among threads]); the others (variances, softmax) keep one thread.
    one_row = all(isinstance(n, int) for n in O) and math.prod(O) == 1

    def shared(b: Body) -> str | None:
        return parallel_if(R, b.lines) if ONE_ROW_THREADS and one_row and isinstance(R, int) else None

    def reduce_pass(ct: str, combine: str, element, aten: bool = False) -> str:
        """One block-wide pass; ``element(body, idx)`` is the value combined. The row variable.
        ``aten``: a sum ATen computes with ``cascade_sum`` (a sum or a mean), in its order on the
        CPU where Note [sums in ATen's order] applies."""
        acc_ct = "int" if ct == "bool" else ct
        ident = _identity(combine, ct)
        acc, res = lw.fresh("acc"), lw.fresh("r")
        # (Note [sums in chunks]) a float sum over a long row adds chunks' partials, compensated
        length = cascade.row_chunk_length(R, inner)
        chunk = combine == "fuseg_sum" and acc_ct in ("float", "double") and length is not None
        in_order = (aten and combine == "fuseg_sum" and not chunk
                    and cascade.aten_order_applies(R, acc_ct, row.reduced == (len(row.F) - 1,)))
        b, idx, head = j_loop(lw.fresh("P"), chunk)
        lw.cache_fill = True
        e = element(b, idx)
        lw.cache_fill = False
        lines.append(f"    {acc_ct} {acc} = ({acc_ct})({ident});")
        if in_order:  # Note [sums in ATen's order]: the CPU's lines; CUDA's pass below, as before
            lines.append("#ifndef __CUDACC__")
            lines.extend(cascade.aten_row_sum(R, acc_ct, acc, b.lines, e, lw.fresh))
            lines.append("#else")
        streamed = chunk and aten and cascade.STREAMED
        if streamed:  # Note [sums in ATen's order, streamed]: the CPU's lines
            lines.append("#ifndef __CUDACC__")
            lines.extend((cascade.split_row_sum if one_row else cascade.streamed_row_sum)(R, acc_ct, acc, b.lines, e, lw.fresh))
            lines.append("#else")
        if chunk:
            comp, part = lw.fresh("comp"), lw.fresh("part")
            lines.append(f"    {acc_ct} {comp} = ({acc_ct})0;")
            lines.extend(cascade.row_chunk_open(R, head[0] == "#ifdef __CUDACC__", length))
            lines.append(f"    {acc_ct} {part} = ({acc_ct})0;")
            lines.extend(simd(head, f" reduction(+:{part}) simdlen({cascade.CHUNK_LANES})"))
            lines.extend(b.lines)
            lines.append(f"      {part} = fuseg_sum<{acc_ct}>({part}, ({acc_ct})({e}));")
            lines.append("    }")
            lines.extend(cascade.chunk_close(acc_ct, acc, comp, part))
            lines.append(f"    {acc} = fuseg_sum_total<{acc_ct}>({acc}, {comp});")
            if streamed:
                lines.append("#endif")
            lines.append(f"    const {acc_ct} {res} = fuseg_block_reduce<{acc_ct}, {combine}<{acc_ct}>>({acc}, ({acc_ct})({ident}));")
            return res
        flagged = acc_ct in ("float", "double") and combine in ("fuseg_max", "fuseg_min")
        if flagged:  # Note [max without a NaN chain]
            nan, x = lw.fresh("nan"), lw.fresh("x")
            lines.extend(["#ifndef __CUDACC__", f"    int {nan} = 0;", "#endif"])
            head = simd(head, f" reduction({combine}_ordered:{acc}) reduction(|:{nan})", shared(b))
        elif acc_ct in ("float", "double", "long long") and combine in ("fuseg_sum", "fuseg_max", "fuseg_min"):
            op = "+" if combine == "fuseg_sum" else combine
            head = simd(head, f" reduction({op}:{acc})")
        elif acc_ct == "int" and combine in ("fuseg_any", "fuseg_all"):  # (values 0 and 1)
            head = simd(head, f" reduction({'|' if combine == 'fuseg_any' else '&'}:{acc})", shared(b))
        lines.extend(head)
        lines.extend(b.lines)
        if flagged:
            lines.extend(["#ifdef __CUDACC__", f"      {acc} = {combine}<{acc_ct}>({acc}, ({acc_ct})({e}));", "#endif",
                          "#ifndef __CUDACC__",
                          f"      const {acc_ct} {x} = ({acc_ct})({e});",
                          f"      {acc} = {combine}_ordered<{acc_ct}>({acc}, {x});",
                          f"      {nan} |= {x} != {x};", "#endif", "    }",
                          "#ifndef __CUDACC__", f"    {acc} = {nan} ? ({acc_ct})__builtin_nan(\"\") : {acc};", "#endif"])
        else:
            lines.append(f"      {acc} = {combine}<{acc_ct}>({acc}, ({acc_ct})({e}));")
            lines.append("    }")
        if in_order:
            lines.append("#endif")
        lines.append(f"    const {acc_ct} {res} = fuseg_block_reduce<{acc_ct}, {combine}<{acc_ct}>>({acc}, ({acc_ct})({ident}));")
        return res

    def row_let(ct: str, expr: str) -> str:
        name = lw.fresh("v")
        lines.append(f"    const {ct} {name} = {expr};")
        return name

    def scratch(ct: str) -> str | None:
        """See Note [softmax keeps its exps]: the per-thread array of a row's exps, or None."""
        if R * (8 if ct == "double" else 4) > EXP_SCRATCH_BYTES:
            return None
        name = lw.fresh("e")
        if lw.slots:  # Note [row registers]: a CUDA thread keeps its own iterations' exps
            lines.extend(["#ifdef __CUDACC__", f"    {ct} {name}[{lw.slots}];", "#else", f"    {ct} {name}[{R}];", "#endif"])
        else:
            lines.extend(["#ifndef __CUDACC__", f"    {ct} {name}[{R}];", "#endif"])
        return name

    emit_reductions(lw, R, reduce_pass, row_let, scratch)
    if full:
        b, idx, head = j_loop(lw.fresh("W"))
        for p in full:
            ats = full_index(lw, p, idx)
            arr = half.output_array(b.loop, ats[0], p) if len(ats) == 1 else None
            if arr is not None:  # Note [fp16 rows converted by the row]: the CPU writes the row's floats
                v = lw.value(b, p.value, ats[0])
                off = ix.linear(ats[0], p.shape, p.stride)
                stores[p.value] = (off, b.loop)
                b.lines.extend(["#ifndef __CUDACC__", f"{b.indent}{arr}[j] = (float)({v});", "#else",
                                f"{b.indent}{p.name}[{off}] = {store(p.dtype, v)};", "#endif"])
                continue
            for at in ats:
                store_output(lw, b, p, at, stores)
        lines.extend(simd(head, threads=shared(b)))
        lines.extend(b.lines)
        lines.append("    }")
        lines.extend(flush_lines(half))
    if rowouts:
        b = Body(lw, lw.fresh("T"), "      ")
        for p in rowouts:
            shape = p.shape
            idx = list(outer) if shape == O else row.index(outer, ["0"] * row.k)
            store_output(lw, b, p, idx, stores)
        # thread 0 of a CUDA block writes the row's values; on the CPU one thread takes the row,
        # and an ``if`` would cost the kernel its loop if-conversion (Note [no if-conversion of
        # branches] in runtime/codegen/kernel.py): a max pass then ran as scalar branches (Note [max without a NaN chain])
        lines.extend(["#ifdef __CUDACC__", "    if (FUSEG_THREAD == 0) {", "#endif", "#ifndef __CUDACC__", "    {", "#endif"])
        lines.extend(b.lines)
        lines.append("    }")
    lines.append("  }")
    lw.cache_body = None
    head = []  # what stands before the row loop
    lines[decl_at:decl_at] = fill_lines(half, shared=False)
    lw.row_half = None
    if lw.cache_decls:  # (Note [row registers]: only with ``lw.slots``)
        lines[decl_at:decl_at] = lw.cache_decls
    lw.slots = 0
    threads = parallel_if(math.prod(row.F), lines)
    head += fill_lines(half, shared=True)  # (before the threads: they share them)
    if threads is not None and math.prod(O) > 1:  # rows shared among CPU threads
        head += ["#ifndef __CUDACC__", f"#pragma omp parallel for schedule(static){threads}", "#endif"]
    return "\n".join(head + lines) + "\n"


def emit_reductions(lw, R: int, reduce_pass, row_let, scratch_array) -> None:  # noqa: ANN001 - see row_loop
    """Every reduction of the segment as passes over a row and values per row, in node order:
    ``reduce_pass(ct, combine, element)`` and ``row_let(ct, expr)`` emit them and return the
    row's value as an expression (the loop structure is the variant's: one thread or block per
    row in ``row_loop``, a tile of rows per thread in ``columns.column_loop``); ``scratch_array(ct)``
    declares the array a softmax keeps its exps in, or returns None. Sets ``lw.regs``."""
    for node in lw.seg.nodes:
        if node.op not in REDUCTIONS:
            continue
        a = bind(node)
        x = a["input"] if "input" in a else a["self"]
        xm = lw.meta(x.name)
        op = node.op
        out0 = lw.meta(next(o for o in node.outputs if o is not None))
        ct = compute_type(out0.dtype)
        if op in ("aten.var_mean.correction", "aten.var.correction") or op == "aten.native_layer_norm.default":
            ct = compute_type(out0.dtype) if op != "aten.native_layer_norm.default" else (
                "double" if xm.dtype == torch.float64 else "float")

        def xval(b: Body, idx: list[str], ct: str = ct, x: str = x.name, xm=xm) -> str:
            return lw.convert(lw.value(b, x, idx), xm.dtype, ct)
        name = op.split(".")[1]
        if name in ("sum", "mean"):
            r = reduce_pass(ct, "fuseg_sum", xval, aten=True)
            lw.regs[(node.name, 0)] = r if name == "sum" else row_let(ct, f"{r} / ({ct}){R}")
        elif name in ("amax", "amin"):
            lw.regs[(node.name, 0)] = reduce_pass(ct, "fuseg_max" if name == "amax" else "fuseg_min", xval)
        elif name in ("any", "all"):
            r = reduce_pass("bool", f"fuseg_{name}", lambda b, idx, x=x.name: f"({lw.value(b, x, idx)} != 0)")
            lw.regs[(node.name, 0)] = row_let("bool", f"({r} != 0)")
        elif name in ("var", "var_mean", "native_layer_norm"):
            s = reduce_pass(ct, "fuseg_sum", xval)
            mean = row_let(ct, f"{s} / ({ct}){R}")
            q = reduce_pass(ct, "fuseg_sum", lambda b, idx, mean=mean, xval=xval: f"(({xval(b, idx)} - {mean}) * ({xval(b, idx)} - {mean}))")
            if name == "native_layer_norm":
                eps = literal(float_arg(a["eps"], "layer norm eps"), ct)
                lw.regs[(node.name, 1)] = mean
                lw.regs[(node.name, 2)] = row_let(ct, f"rsqrt({q} / ({ct}){R} + {eps})")
            else:
                corr = a.get("correction")
                corr = 1 if corr is None else corr
                var = row_let(ct, f"{q} / ({ct})fuseg_max<{ct}>(({ct})0, ({ct})({R} - {literal(corr, ct)}))")
                lw.regs[(node.name, 0)] = var
                if name == "var_mean":
                    lw.regs[(node.name, 1)] = mean
        elif name in ("_softmax", "_log_softmax", "logsumexp"):
            m = reduce_pass(ct, "fuseg_max", xval)
            # exp(x - m) with m = -inf (a row of -inf) is exp(nan): use 0 as the shift there, as torch does;
            # logsumexp shifts by 0 wherever m is infinite (ATen's masked_fill of |max| == inf): a row
            # holding +inf then sums exp(+inf) and gives +inf, where softmax's NaN is eager's too
            inf = literal(float("inf"), ct)
            infinite = f"({m}) == {inf} || ({m}) == -{inf}" if name == "logsumexp" else f"({m}) == -{inf}"
            shift = row_let(ct, f"(({infinite}) ? ({ct})0 : {m})")
            scratch = scratch_array(ct) if name == "_softmax" else None  # Note [softmax keeps its exps]

            def exp_element(b: Body, idx: list[str], xval=xval, shift=shift, scratch=scratch, ct=ct,
                            node=node) -> str:
                e = f"fuseg_exp({xval(b, idx)} - {shift})"
                if scratch is None:
                    return e
                e = b.let(ct, e)
                if lw.slots:  # Note [row registers]: on CUDA too, at the thread's iteration
                    b.lines.append(f"{b.indent}{scratch}[FUSEG_ON_CPU(j, it)] = {e};")
                else:
                    b.lines.extend(["#ifndef __CUDACC__", f"{b.indent}{scratch}[j] = {e};", "#endif"])
                lw.exp_scratch[node.name] = (scratch, tuple(idx))
                return e
            s = reduce_pass(ct, "fuseg_sum", exp_element)
            if name == "logsumexp":
                lw.regs[(node.name, 0)] = row_let(ct, f"log({s}) + {shift}")
            else:
                lw.regs[(node.name, -1)] = shift
                lw.regs[(node.name, -2)] = s
                if name == "_softmax":  # a multiply per element, as ATen's CPU kernel scales by 1 / sum
                    lw.regs[(node.name, -3)] = row_let(ct, f"({ct})1 / {s}")
        elif name == "linalg_vector_norm":
            ord_ = a.get("ord", 2)
            if ord_ == 2:
                r = reduce_pass(ct, "fuseg_sum", lambda b, idx, xval=xval: f"({xval(b, idx)} * {xval(b, idx)})")
                lw.regs[(node.name, 0)] = row_let(ct, f"sqrt({r})")
            elif ord_ == 1:
                lw.regs[(node.name, 0)] = reduce_pass(ct, "fuseg_sum", lambda b, idx, xval=xval: f"fabs({xval(b, idx)})")
            else:
                raise Declined(f"vector norm of order {ord_}")
        else:  # pragma: no cover - REDUCTIONS and this chain list the same ops
            raise Declined(f"{op}")
        for k, o in enumerate(node.outputs):  # round reduced values to their dtype, as eager holds them
            if o is not None and (node.name, k) in lw.regs and lw.meta(o).dtype in (torch.float16, torch.bfloat16):
                lw.regs[(node.name, k)] = row_let("float", lw.rounded(lw.meta(o).dtype, lw.regs[(node.name, k)]))
