"""Lowering a kernel segment to one generated kernel: index math and per-element expressions.

Note [kernel shapes]: a POINTWISE segment becomes one kernel with one grid-stride loop per
distinct output shape (outputs of one shape share a loop and its loads). A REDUCTION or
NORMALIZATION segment becomes a row kernel: every reduction reduces the same dims I of the same
domain F, whose other dims are O (innermost or not: Note [reduced dims anywhere] in rows.py);
each block takes rows of O, runs one block-wide pass over I per reduction (each pass may use the
results of the earlier ones), then writes the outputs of shape F in a last pass and those of
shape O (or F with 1s for I, keepdim) from thread 0. A reduced value may only be read at its own
row: it reaches other values through elementwise ops, broadcasts over I, views (reshapes,
permutes, expands) and slices, cats, pads and flips along I alone, and full outputs are written
where those views take each position of F (Note [permuted full values] in rows.py); the
structural check in ``rows.row_levels`` declines everything else.
Outputs of other shapes that depend on no reduction get pointwise loops of their own.

Values are computed where they are needed, once per loop (a memo per loop body); a branch of
cat/pad/scatter evaluates only its own input, in a block of its own.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re

import torch

from runtime.options import current
from segmenter import FusionGraph, Node, Segment, SegmentKind
from segmenter.ir.graph import ValueRef, view_roots
from segmenter.ir.symbolic import is_symbolic

from ..kernel import (
    CONST,
    RESHAPE,
    VIEW_IDENTITY,
    Body,
    Kernel,
    Param,
    bind,
    branches_with_loads,
    cpu_attributes,
    cuda_ept,
    cuda_tuning,
    half_exact,
    norm_dim,
    parallel_if,
    store_output,
)
from ..source import index as ix
from ..source.checks import (
    MAX_EXTENT,
    check_layout,
    check_segment_metas,
    dims_arg,
    index_arg,
    int_arg,
    permutation_arg,
    shape_ints,
    slice_bounds,
)
from ..source.ctypes_ import COMPUTE, Declined, compute_type, literal, load, storage_type
from ..source.symsizes import sizes_active, smax, smin
from .columns import column_loop, takes_columns
from .fission import fission
from .half_rows import pointwise_rows
from .pointwise import ELEMENTWISE, pow_as_eager
from .rows import REDUCTIONS, ROW_REGISTERS, Chain, Row, exact, plan_row, reduced_dims, row_levels, row_loop
from .tables import tabulate

__all__ = ["GENERATED_KINDS", "Kernel", "Param", "check_kind", "lower_segment"]


class _Lowerer:
    def __init__(self, graph: FusionGraph, seg: Segment, layouts: dict, in_place: dict[str, str]) -> None:
        self.g, self.seg = graph, seg
        self.metas = graph.metas
        self.producer = {o: (n, k) for n in seg.nodes for k, o in enumerate(n.outputs) if o is not None}
        self.layouts = layouts
        self.counter = 0
        self.params: dict[str, Param] = {}
        self.loads: list[tuple[str, str, str]] = []  # (value, offset, loop)
        self.regs: dict[tuple[str, int], str] = {}  # (node, output) -> row variable
        self.in_place = in_place  # node name -> graph input it writes
        self.row: Row | None = None
        self.cache_body: Body | None = None  # the pass body whose loads are kept in row registers
        self.cache_fill = False  # whether a load not cached yet is added to it (reduction passes)
        self.row_cache: dict[tuple[str, str], str] = {}
        self.cache_decls: list[str] = []
        #: a row kernel's fp16 rows converted a row at a time on the CPU (Note [fp16 rows
        #: converted by the row] in half_rows.py), set by row_loop
        self.row_half = None
        #: a CUDA thread's iterations per pass where Note [row registers] (rows.py) holds: its
        #: arrays are this long, indexed by ``it``, and on CUDA only; 0 elsewhere
        self.slots = 0
        #: softmax node -> (its per-row array of exps, the row index they are kept at): Note
        #: [softmax keeps its exps] in rows.py
        self.exp_scratch: dict[str, tuple[str, tuple[str, ...]]] = {}
        #: full value -> the views from F to it: Note [permuted full values] in rows.py
        self.chains: dict[str, Chain] = {}
        #: output value -> (its param, the loop that stores it): Note [outputs read back on the CPU]
        self.stored: dict[str, tuple[Param, str]] = {}
        #: variable -> the half dtype whose values it holds exactly (Note [values already rounded])
        self.exact: dict[str, torch.dtype] = {}

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def meta(self, v: str):
        return self.metas[v]

    # --- values -------------------------------------------------------------------------------

    def value(self, b: Body, v: str, idx: list[str]) -> str:
        """``v`` at index ``idx`` as an expression of its compute type (a variable, mostly)."""
        key = (v, tuple(idx))
        if key in b.memo:
            return b.memo[key]
        if v in self.producer:
            node, k = self.producer[v]
            expr = self.node_value(b, node, k, idx)
        else:
            expr = self.load(b, v, idx)
        ct = compute_type(self.meta(v).dtype)
        name = expr if expr.isidentifier() else b.let(ct, expr)
        stored = self.stored.get(v)
        if stored is not None and stored[1] != b.loop and _read_back(stored[0], self.meta(v)):
            p = stored[0]
            kept = load(p.dtype, f"{p.name}[{ix.linear(idx, p.shape, p.stride)}]")
            name = b.let(ct, f"FUSEG_ON_CPU({kept}, {name})")
        b.memo[key] = name
        return name

    def load(self, b: Body, v: str, idx: list[str]) -> str:
        p = self.params.get(v)
        if p is None:
            shape, stride = self.layouts[v]
            p = self.params[v] = Param(f"in{len(self.params)}", v, self.meta(v).dtype, shape, stride, False)
        off = ix.linear(idx, p.shape, p.stride)
        self.loads.append((v, off, b.loop))
        expr = load(p.dtype, f"{p.name}[{off}]")
        row_array = self.row_half.input_array(b.loop, idx, p) if self.row_half is not None else None
        if row_array is not None:  # Note [fp16 rows converted by the row]: the CPU reads the row's floats
            return f"fuseg_h_kept(FUSEG_ON_CPU({row_array}[j], {self._cached(b, p, off, expr)}))"
        return self._cached(b, p, off, expr)

    def _cached(self, b: Body, p: Param, off: str, expr: str) -> str:
        if b is not self.cache_body:
            return expr
        # a row kernel's pass at the top of its body: each CUDA thread keeps the elements it reads
        # in registers (Note [row registers] in rows.py), so a later pass does not read them again
        key = (p.name, off)
        arr = self.row_cache.get(key)
        if arr is None:
            if not self.cache_fill:
                return expr
            if (len(self.row_cache) + 1) * self.slots > ROW_REGISTERS:
                return expr  # Note [row registers] in rows.py: past its budget, read again
            arr = self.row_cache[key] = self.fresh("k")
            # on CUDA only: the CPU loop reads memory as before
            self.cache_decls.append(f"#ifdef __CUDACC__\n    {compute_type(p.dtype)} {arr}[{self.slots}];\n#endif")
            b.lines.append(f"#ifdef __CUDACC__\n{b.indent}{arr}[it] = {expr};\n#endif")
        return f"FUSEG_ON_CPU({expr}, {arr}[it])"

    def node_value(self, b: Body, node: Node, k: int, idx: list[str]) -> str:
        op = node.op
        out = self.meta(node.outputs[k])
        if (node.name, k) in self.regs:
            return self.regs[(node.name, k)]
        if op in REDUCTIONS:
            return self.reduction_output(b, node, k, idx)
        a = bind(node)
        if op in ELEMENTWISE:
            return self.elementwise(b, node, a, idx)
        if op == "aten._native_batch_norm_legit_no_training.default":
            return self.batch_norm(b, node, k, a, idx)
        if op in VIEW_IDENTITY:
            return self.value(b, a["self"].name, idx)
        if op in CONST:
            val = a[CONST[op]] if isinstance(CONST[op], str) else CONST[op]
            return self.rounded(out.dtype, literal(val, compute_type(out.dtype)))
        x = a.get("self")
        src = self.meta(x.name) if isinstance(x, ValueRef) else None
        if op in RESHAPE:
            return self.value(b, x.name, ix.reshape(idx, src.shape, out.shape))
        if op == "aten.expand.default":
            return self.value(b, x.name, ix.broadcast(idx, src.shape, out.shape))
        if op == "aten.permute.default":
            dims = permutation_arg(a["dims"], src.ndim)
            new = ["0"] * src.ndim
            for d, p in enumerate(dims):
                new[p] = idx[d]
            return self.value(b, x.name, new)
        if op in ("aten.transpose.int", "aten.t.default"):
            new = list(idx)
            if src.ndim >= 2:
                d0, d1 = (norm_dim(a["dim0"], src.ndim), norm_dim(a["dim1"], src.ndim)) if "dim0" in a else (0, 1)
                new[d0], new[d1] = idx[d1], idx[d0]
            return self.value(b, x.name, new)
        if op in ("aten.slice.Tensor", "aten.narrow.default"):
            dim = norm_dim(a["dim"], src.ndim)
            n = src.shape[dim]
            start, _, step = slice_bounds(a, n)
            new = list(idx)
            new[dim] = f"({start} + {idx[dim]} * {step})" if step != 1 else f"({start} + {idx[dim]})"
            return self.value(b, x.name, new)
        if op == "aten.select.int":
            dim = norm_dim(a["dim"], src.ndim)
            i = index_arg(a["index"], src.shape[dim], "select index")
            return self.value(b, x.name, [*idx[:dim], f"{i}", *idx[dim:]])
        if op == "aten.unsqueeze.default":
            dim = norm_dim(a["dim"], out.ndim)
            return self.value(b, x.name, idx[:dim] + idx[dim + 1:])
        if op in ("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default"):
            dims = (range(src.ndim) if op == "aten.squeeze.default" else
                    [norm_dim(a["dim"], src.ndim)] if op == "aten.squeeze.dim" else dims_arg(a["dim"], src.ndim, "squeeze dims"))
            gone = {d for d in dims if src.ndim and src.shape[d] == 1}
            it = iter(idx)
            return self.value(b, x.name, ["0" if d in gone else next(it) for d in range(src.ndim)])
        if op in ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int"):
            dim = norm_dim(a.get("dim", 0), src.ndim)
            if op == "aten.unbind.int":
                return self.value(b, x.name, [*idx[:dim], f"{index_arg(k, src.shape[dim], 'unbind output')}", *idx[dim:]])
            sizes = (shape_ints(a["split_sizes"], "split_sizes") if op == "aten.split_with_sizes.default"
                     else [int_arg(a["split_size"], "split_size", 0)] * (k + 1))
            if len(sizes) <= k or sum(sizes[:k + 1]) > src.shape[dim]:
                raise Declined(f"split output {k} of sizes {sizes} is outside a dim of {src.shape[dim]}")
            new = list(idx)
            new[dim] = f"({sum(sizes[:k])} + {idx[dim]})"
            return self.value(b, x.name, new)
        if op == "aten.flip.default":
            new = list(idx)
            for d in set(dims_arg(a["dims"], src.ndim, "flip dims")):
                new[d] = f"({src.shape[d] - 1} - {idx[d]})"
            return self.value(b, x.name, new)
        if op == "aten.repeat.default":
            repeats = shape_ints(a["repeats"], "repeats")
            off = out.ndim - src.ndim
            if len(repeats) != out.ndim or off < 0:
                raise Declined(f"repeats {list(repeats)} for a rank-{src.ndim} tensor")
            return self.value(b, x.name, ["0" if n == 1 else f"({idx[off + d]} % {n})"
                                          for d, n in enumerate(src.shape)])
        if op in ("aten.cat.default", "aten.stack.default"):
            return self.cat(b, node, a, idx, out)
        if op == "aten.constant_pad_nd.default":
            return self.pad(b, a, idx, out)
        if op in ("aten.slice_scatter.default", "aten.select_scatter.default"):
            return self.scatter(b, node, a, idx, out)
        if op in ("aten.triu.default", "aten.tril.default"):
            if out.ndim < 2:
                raise Declined(f"{op} of a rank-{out.ndim} tensor")
            # j - i lies in (-rows, cols): a diagonal beyond that keeps everything or nothing alike
            d = int_arg(a.get("diagonal", 0), "diagonal", -(2**63), 2**63 - 1)
            d = min(max(d, -out.shape[-2]), out.shape[-1])
            keep = (f"({idx[-1]} - {idx[-2]} >= {d})" if op == "aten.triu.default"
                    else f"({idx[-1]} - {idx[-2]} <= {d})")
            xv = self.value(b, x.name, idx)
            return f"({keep} ? {xv} : ({compute_type(out.dtype)})0)"
        if op in ("aten.arange.start_step", "aten.arange.start", "aten.arange.default"):
            start = a.get("start", 0) if op != "aten.arange.default" else 0
            step = a.get("step", 1) if op == "aten.arange.start_step" else 1
            ct = compute_type(out.dtype)
            return self.rounded(out.dtype, f"(({ct})({literal(start, 'double')} + (double){idx[0]} * {literal(step, 'double')}))")
        raise Declined(f"{op} is not supported by the kernel generator")

    def batch_norm(self, b: Body, node: Node, k: int, a: dict, idx: list[str]) -> str:
        """Inference batch norm over dim 1, as ATen's CPU kernel computes it: per channel
        alpha = weight / sqrt(var + eps) and beta = bias - mean * alpha, then x * alpha + beta."""
        if k != 0:
            raise Declined("batch norm's saved statistics (empty in inference) are left to torch")
        out = self.meta(node.outputs[0])
        x = a.get("input")
        if not isinstance(x, ValueRef) or out.ndim < 2:
            raise Declined("batch norm of a tensor of rank < 2")
        for n in ("momentum", "eps"):
            _check_plain(node, n, a.get(n))
        ct = "double" if out.dtype == torch.float64 else "float"
        c = idx[1]

        def per_channel(name: str) -> str | None:
            v = a.get(name)
            if v is None:
                return None
            m = self.meta(v.name) if isinstance(v, ValueRef) else None
            if m is None or m.shape != (out.shape[1],):
                raise Declined(f"batch norm {name} is not a vector of {out.shape[1]} channels")
            return self.convert(self.value(b, v.name, [c]), m.dtype, ct)

        mean, var = per_channel("running_mean"), per_channel("running_var")
        if mean is None or var is None:
            raise Declined("batch norm without running statistics")
        w, bias = per_channel("weight"), per_channel("bias")
        alpha = b.let(ct, f"(({ct})1 / sqrt({var} + {literal(a.get('eps', 1e-5), ct)}))" + (f" * {w}" if w else ""))
        beta = b.let(ct, f"{bias or f'({ct})0'} - {mean} * {alpha}")
        xv = self.convert(self.value(b, x.name, idx), self.meta(x.name).dtype, ct)
        return self.rounded(out.dtype, f"({xv} * {alpha} + {beta})")

    def rounded(self, dtype: torch.dtype, expr: str) -> str:
        """The value as eager holds it: rounded to its dtype (fp16/bf16 and narrow ints); a
        value already of that half dtype as it is (Note [values already rounded] in runtime/codegen/kernel.py)."""
        if (dtype in (torch.float16, torch.bfloat16) and (self.exact.get(expr) == dtype or half_exact(expr) == dtype)
                and cuda_tuning()):  # (off with the rest of the tuning: a before/after in one run)
            return expr
        if dtype == torch.float16:
            return f"fuseg_h_round({expr})"  # Note [fp16 rounding in float] (runtime/codegen/kernel.py)
        if dtype == torch.bfloat16:
            return f"fuseg_bf_round({expr})"  # Note [bf16 rounding in float] (runtime/codegen/kernel.py)
        if dtype in (torch.int8, torch.uint8, torch.int16, torch.int32):
            return f"((long long)({storage_type(dtype)})({expr}))"
        return expr

    def convert(self, expr: str, from_dtype: torch.dtype | None, ct: str) -> str:
        if from_dtype is not None and COMPUTE[from_dtype] == ct:
            return expr
        if from_dtype == torch.bool:  # a select, not a cast: Note [bool loads as bytes]
            return f"(({expr}) ? ({ct})1 : ({ct})0)"
        return f"(({ct})({expr}))"

    def elementwise(self, b: Body, node: Node, a: dict, idx: list[str]) -> str:
        rule = ELEMENTWISE[node.op]
        out = self.meta(node.outputs[0])
        if rule.how == "out":
            ct = compute_type(out.dtype)
        elif rule.how == "bool":
            ct = "bool"
        else:
            ct = compute_type(self.promoted([a[n] for n in rule.tensors if n in a]))
        args = dict(a)
        for n, v in a.items():  # a rule formats scalars with literal() and only compares strings
            if n in rule.tensors:
                continue
            if isinstance(v, ValueRef):  # a tensor the rule does not read (copy's destination): never formatted
                del args[n]
            else:
                _check_plain(node, n, v)
        for n in rule.tensors:
            v = a.get(n)
            want = "bool" if n in ("condition", "mask") else ct
            if isinstance(v, ValueRef):
                m = self.meta(v.name)
                args[n] = self.convert(self.value(b, v.name, ix.broadcast(idx, m.shape, out.shape)), m.dtype, want)
            elif isinstance(v, (bool, int, float)):
                args[n] = literal(v, want)
            elif isinstance(v, torch.SymInt) and sizes_active():
                # a size as an operand (layer norm's backward divides by the row's length): its C
                # expression over the kernel's size arguments (Note [kernel sizes as arguments])
                args[n] = f"(({want})({v}))"
            elif v is not None:
                raise Declined(f"{node.op}: argument {n} is {type(v).__name__}")
        expr = None
        if node.op == "aten.pow.Tensor_Scalar":  # Note [pow as eager rounds it] (pointwise.py)
            expr = pow_as_eager(args["self"], args.get("exponent"), ct, out.dtype, lambda e: self.rounded(out.dtype, e))
        if expr is None:
            expr = rule.fn(args, ct)
        res_ct, out_ct = ("bool" if rule.how == "cmp" else ct), compute_type(out.dtype)
        if res_ct != out_ct:
            expr = f"(({out_ct})({expr}))"
        return self.rounded(out.dtype, expr)

    def promoted(self, args: list[object]) -> torch.dtype:
        def fake(v: object) -> object:
            if isinstance(v, ValueRef):
                m = self.meta(v.name)
                return torch.empty((1,) * m.ndim, dtype=m.dtype, device="meta")
            return v
        vals = [fake(v) for v in args if v is not None]
        if len(vals) == 1:
            return vals[0].dtype if isinstance(vals[0], torch.Tensor) else torch.float32
        return torch.result_type(vals[0], vals[1])

    # --- injective ops with branches ----------------------------------------------------------

    def choose(self, b: Body, ct: str, cases: list[tuple[str, object]], default: object) -> str:
        """if/else chain: ``cases`` are (condition, fill(body) -> expr); lazily evaluated."""
        var = self.fresh("c")
        b.lines.append(f"{b.indent}{ct} {var};")
        first = True
        arms: list[str] = []  # what each arm assigns (Note [values already rounded])
        for cond, fill in cases:
            br = b.branch()
            e = fill(br)
            arms.append(e)
            b.lines.append(f"{b.indent}{'if' if first else 'else if'} ({cond}) {{")
            b.lines.extend(br.lines)
            b.lines.append(f"{br.indent}{var} = {e};")
            b.lines.append(f"{b.indent}}}")
            first = False
        br = b.branch()
        e = default(br)
        arms.append(e)
        halves = {self.exact.get(a) or half_exact(a) for a in arms}
        if len(halves) == 1 and None not in halves:  # every arm a value of one half dtype: so is var
            self.exact[var] = halves.pop()
        if first:
            b.lines.extend(br.lines)
            b.lines.append(f"{b.indent}{var} = {e};")
        else:
            b.lines.append(f"{b.indent}else {{")
            b.lines.extend(br.lines)
            b.lines.append(f"{br.indent}{var} = {e};")
            b.lines.append(f"{b.indent}}}")
        return var

    def cat(self, b: Body, node: Node, a: dict, idx: list[str], out) -> str:
        ct = compute_type(out.dtype)
        stack = node.op == "aten.stack.default"
        dim = norm_dim(a.get("dim", 0), out.ndim)
        parts = []
        off = 0
        if not isinstance(a["tensors"], tuple) or not all(isinstance(t, ValueRef) for t in a["tensors"]):
            raise Declined(f"{node.op}: tensors must be a list of values")
        for t in a["tensors"]:
            m = self.meta(t.name)
            if not stack and m.ndim == 1 and m.shape[0] == 0 and out.ndim > 1:
                continue  # legacy: cat skips 1-D empty tensors
            n = 1 if stack else m.shape[dim]
            if n:
                parts.append((t.name, m, off, n))
            off += n

        def fill(name: str, m, start: int):
            def f(br: Body) -> str:
                if stack:
                    new = idx[:dim] + idx[dim + 1:]
                else:
                    new = list(idx)
                    new[dim] = f"({idx[dim]} - {start})" if start else idx[dim]
                return self.convert(self.value(br, name, new), m.dtype, ct)
            return f
        if not parts:
            return f"(({ct})0)"
        cases = [(f"{idx[dim]} < {start + n}", fill(name, m, start)) for name, m, start, n in parts[:-1]]
        name, m, start, _ = parts[-1]
        return self.rounded(out.dtype, self.choose(b, ct, cases, fill(name, m, start)))

    def pad(self, b: Body, a: dict, idx: list[str], out) -> str:
        x = a["self"].name
        src = self.meta(x)
        pads = list(shape_ints(a["pad"], "pad", -MAX_EXTENT))
        if len(pads) % 2 or len(pads) > 2 * src.ndim:
            raise Declined(f"pad {pads} for a rank-{src.ndim} tensor")
        ct = compute_type(out.dtype)
        new, conds = list(idx), []
        for j in range(len(pads) // 2):
            d = src.ndim - 1 - j
            lo = pads[2 * j]
            if lo:
                new[d] = f"({idx[d]} - {lo})" if lo > 0 else f"({idx[d]} + {-lo})"
            if lo > 0:
                conds.append(f"{new[d]} >= 0")
            if src.shape[d] + lo < out.shape[d]:
                conds.append(f"{new[d]} < {src.shape[d]}")
        fill = literal(a.get("value", 0), ct)
        if src.numel == 0:
            return fill
        if not conds:
            return self.value(b, x, new)
        return self.choose(b, ct, [(" && ".join(conds), lambda br: self.convert(self.value(br, x, new), src.dtype, ct))],
                           lambda br: fill)

    def scatter(self, b: Body, node: Node, a: dict, idx: list[str], out) -> str:
        x, src = a["self"].name, a["src"].name
        ct = compute_type(out.dtype)
        m = self.meta(x)
        dim = norm_dim(a["dim"], m.ndim)
        n = m.shape[dim]
        if node.op == "aten.select_scatter.default":
            i = index_arg(a["index"], n, "select_scatter index")
            cond, new = f"{idx[dim]} == {i}", idx[:dim] + idx[dim + 1:]
        else:
            start, end, step = slice_bounds(a, n)
            rel = f"({idx[dim]} - {start})"
            cond = f"{idx[dim]} >= {start} && {idx[dim]} < {end}" + (f" && {rel} % {step} == 0" if step != 1 else "")
            new = list(idx)
            new[dim] = rel if step == 1 else f"({rel} / {step})"
        sm = self.meta(src)
        return self.choose(b, ct, [(cond, lambda br: self.convert(self.value(br, src, new), sm.dtype, ct))],
                           lambda br: self.convert(self.value(br, x, idx), m.dtype, ct))

    # --- reductions (row kernels) ---------------------------------------------------------------

    def reduction_output(self, b: Body, node: Node, k: int, idx: list[str]) -> str:
        if self.row is None:
            return self.unrolled_sum(b, node, idx)
        a = bind(node)
        x = a["input"] if "input" in a else a["self"]
        ct = compute_type(self.meta(node.outputs[k]).dtype if node.outputs[k] else torch.float32)
        xv = self.convert(self.value(b, x.name, idx), self.meta(x.name).dtype, ct)
        op = node.op
        if op in ("aten._softmax.default", "aten._log_softmax.default"):
            m, s = self.regs[(node.name, -1)], self.regs[(node.name, -2)]
            if op == "aten._softmax.default":
                e = f"fuseg_exp({xv} - {m})"
                kept = self.exp_scratch.get(node.name)
                if kept is not None and kept[1] == tuple(idx):  # on CUDA too under Note [row registers]
                    e = f"{kept[0]}[FUSEG_ON_CPU(j, it)]" if self.slots else f"FUSEG_ON_CPU({kept[0]}[j], {e})"
                return f"({e} * {self.regs[(node.name, -3)]})"
            return f"({xv} - {m} - log({s}))"
        if op == "aten.native_layer_norm.default" and k == 0:
            mean, rstd = self.regs[(node.name, 1)], self.regs[(node.name, 2)]
            y = f"(({xv} - {mean}) * {rstd})"
            for name in ("weight", "bias"):
                w = a.get(name)
                if isinstance(w, ValueRef):
                    wm = self.meta(w.name)
                    wv = self.convert(self.value(b, w.name, ix.broadcast(idx, wm.shape, self.meta(x.name).shape)),
                                      wm.dtype, ct)
                    y = f"({y} * {wv})" if name == "weight" else f"({y} + {wv})"
            return y
        raise Declined(f"internal: {op} output {k} has no row value")  # pragma: no cover

    def unrolled_sum(self, b: Body, node: Node, idx: list[str]) -> str:
        """See Note [few-term sums unrolled]: a sum (or mean) of at most ``UNROLLED_TERMS`` elements per
        output, written out term by term in a pointwise loop."""
        terms = unrolled_terms(self, node)
        if terms is None:
            raise Declined(f"{node.op} outside a reduction segment")
        a = bind(node)
        x = a["self"]
        src, out = self.meta(x.name), self.meta(node.outputs[0])
        dims = reduced_dims(node, a, src.ndim)
        keep = bool(a.get("keepdim", False))
        ct = compute_type(out.dtype)
        kept = iter([i for d, i in enumerate(idx) if d not in dims] if keep else idx)
        base = [None if d in dims else next(kept) for d in range(src.ndim)]
        acc = None
        for pos in itertools.product(*(range(src.shape[d]) for d in dims)):
            at = dict(zip(dims, pos))
            xv = self.convert(self.value(b, x.name, [str(at[d]) if d in at else base[d] for d in range(src.ndim)]),
                              src.dtype, ct)
            acc = xv if acc is None else f"({acc} + {xv})"
        if node.op == "aten.mean.dim":
            acc = f"({acc} / {literal(terms, ct)})"
        return self.rounded(out.dtype, acc)


#: Note [few-term sums unrolled]: a sum over a dim of two (a mixture of experts adding its top-2
#: experts' outputs, ``view(tokens, 2, hidden).sum(1)``) is a reduction the row kernel declines
#: where a view re-indexes its value (Mixtral: the sum is viewed back to [batch, seq, hidden] and
#: added to the residual), and the segment ran on ATen (14 us a layer). Where a segment's row plan
#: declines and each of its reductions is a float sum or mean of at most this many elements per
#: output, the segment is a pointwise loop over the outputs and each reduced value the sum of its
#: terms, added left to right in the output's compute type, mean then divided by the count. ATen
#: adds an outer dim's elements in that order too (Mixtral's case: the same bits); over the
#: innermost dim its order may differ, by rounding alone.
UNROLLED_TERMS = 8


def unrolled_terms(lw: _Lowerer, node: Node) -> int | None:
    """How many elements each output of ``node`` sums, where it is a sum/mean that may be
    unrolled (Note [few-term sums unrolled]); None otherwise."""
    if node.op not in ("aten.sum.dim_IntList", "aten.mean.dim"):
        return None
    a = bind(node)
    x = a.get("self")
    if not isinstance(x, ValueRef) or len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    src, out = lw.meta(x.name), lw.meta(node.outputs[0])
    if src.ndim == 0 or not a.get("dim") or out.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        return None  # no dims named: a whole-tensor sum; integer sums: a row kernel's job
    terms = math.prod(src.shape[d] for d in reduced_dims(node, a, src.ndim))
    return terms if 1 <= terms <= UNROLLED_TERMS else None


GENERATED_KINDS = frozenset({SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION})


def check_kind(seg: Segment) -> None:
    """Declines a segment of a kind the generator never lowers (MATMUL, OPAQUE), before any work."""
    if seg.kind not in GENERATED_KINDS:
        raise Declined(f"{seg.kind.value} segments run on torch")


def _row_block(R: int) -> int:
    """A row kernel's block on CUDA: the row rounded up to whole warps, from 32 to 512 threads.

    Note [a row's block]: for a row of symbolic length the block is one expression,
    ``min(512, max(32, 32 * ceil(R / 32)))``, computed at each launch like the grid, so it is no
    condition of the plan. It was ``min(512, max(32, ...))`` of Python's own, which decided both
    comparisons from the first call's row and recorded them: a plan made at a row of 48 held only
    for rows longer than one warp and shorter than 512, and qwen2's training, whose backward sums
    over the batch's tokens, made a new plan (0.4-0.6 s, no compiler run, on the CPU and on an H100)
    for a batch of 16-token sequences, seen before the graph was dynamic. The block is not in a
    symbolic kernel's source (it reads ``blockDim.x``: Note [CUDA launch shapes])."""
    return smin(512, smax(32, (R + 31) // 32 * 32))


def lower_segment(graph: FusionGraph, seg: Segment, layouts: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
                  in_place: dict[str, str] | None = None, materialized: frozenset[str] = frozenset()) -> Kernel:
    """One kernel for ``seg``. ``layouts``: value -> (shape, strides) as the kernel will find it
    (inputs) or must write it (outputs); ``in_place``: node name -> graph input it writes."""
    check_kind(seg)
    in_place = {n: t for n, t in (in_place or {}).items() if any(node.name == n for node in seg.nodes)}
    # See Note [checked source values]: every layout formatted is checked, no recorded meta believed
    layouts = {v: check_layout(*lay, f"%{v}") for v, lay in layouts.items()}
    values = [*seg.inputs, *(o for n in seg.nodes for o in n.outputs if o is not None)]
    for v in values:
        check_layout(graph.metas[v].shape, graph.metas[v].stride, f"%{v}")
    check_segment_metas(graph, seg, layouts)
    lw = _Lowerer(graph, seg, layouts, in_place)
    reductions = [n for n in seg.nodes if n.op in REDUCTIONS]
    for o in (o for n in seg.nodes for o in n.outputs if o is not None):
        storage_type(graph.metas[o].dtype)  # declines a dtype the generator has no type for
    if reductions and seg.kind == SegmentKind.POINTWISE:
        raise Declined("a reduction in a pointwise segment")
    if not reductions and seg.kind != SegmentKind.POINTWISE:
        ops = sorted({n.op for n in seg.nodes if n.op not in ELEMENTWISE})
        raise Declined(f"no reduction the generator takes among {', '.join(ops)}")
    writes = {n.outputs[0]: t for n in seg.nodes for t in [in_place.get(n.name)] if t is not None}
    outs: list[Param] = []
    for o in seg.outputs:
        m = graph.metas[o]
        shape, stride = layouts[o]
        outs.append(Param(f"out{len(outs)}", o, m.dtype, shape, stride, True, writes.get(o)))
    loops: list[str] = []
    stores: dict[str, tuple[str, str]] = {}  # output -> (offset, loop)
    unrolled = False
    if reductions:
        try:
            row = plan_row(lw, reductions)
            levels = row_levels(lw, row)
        except Declined:
            if not all(unrolled_terms(lw, n) is not None for n in reductions):
                raise
            lw.row, lw.chains, unrolled = None, {}, True  # Note [few-term sums unrolled]
    if not reductions or unrolled:
        by_shape: dict[tuple[int, ...], list[Param]] = {}
        for p in outs:
            by_shape.setdefault(p.shape, []).append(p)
        grid_n = 1
        for shape, ps in by_shape.items():
            loops.append(_pointwise_loop(lw, shape, ps, stores, "  "))
            grid_n = smax(grid_n, math.prod(shape))
        per_block = 256 * cuda_ept()  # Note [CUDA launch shapes]
        block, grid, kind = 256, smax(1, smin((grid_n + per_block - 1) // per_block, 1 << 20)), "pointwise"
        row = None
    else:
        full, rowouts, side = [], [], []
        for p in outs:
            if levels.get(p.value) == "row":
                rowouts.append(p)
            elif levels.get(p.value) == "full":
                if not exact(lw, p.value):  # Note [permuted full values]
                    raise Declined(f"output {p.value} of shape {list(p.shape)} is part of a row (sliced or padded "
                                   f"after the reduction): the row loop has no position to write it from")
                full.append(p)
            elif p.shape == row.F:
                full.append(p)
            else:
                side.append(p)
        by_shape = {}
        for p in side:
            by_shape.setdefault(p.shape, []).append(p)
        for shape, ps in by_shape.items():
            loops.append(_pointwise_loop(lw, shape, ps, stores, "  "))
        R = row.R
        # 512 threads: on an H100, layer/RMS norm over rows of 4096 ran 1.3-1.7x faster than with 1024, softmax the same (a sweep of
        # forced blocks, a switch since removed: perf/results/nvidia-h100/gpu_row_block_sweep_h100.json)
        block = _row_block(R)
        rows_body = row_loop(lw, row, full, rowouts, stores, block)
        if takes_columns(row):  # Note [column passes]: on the CPU, a tile of rows per thread
            rows_body = f"#ifdef __CUDACC__\n{rows_body}#else\n{column_loop(lw, row, full, rowouts, stores)}#endif\n"
        loops.append(rows_body)
        grid = smax(1, smin(math.prod(row.O), 1 << 20))
        kind = "row"
    _check_in_place(lw, outs, stores)
    body = "".join(loops)
    extents = [grid_n if kind == "pointwise" else math.prod(row.F)]
    extents += [sum((n - 1) * st for n, st in zip(p.shape, p.stride) if n > 0) + 1 for p in (*lw.params.values(), *outs)]
    extents += [graph.metas[v].numel for v in values]  # an index into any value inside the kernel
    # (symbolic extents: 64-bit indices, no condition of the plan on how far they reach)
    index_type = "long long" if is_symbolic(extents) or max(extents) >= 2 ** 30 else "int"
    params = (*lw.params.values(), *outs)
    named = body + index_type + repr([(p.name, p.dtype, p.target) for p in params]) + cpu_attributes(body)
    digest = hashlib.sha1(named.encode()).hexdigest()[:12]
    return Kernel(f"fuseg_{kind}_{digest}", params, body, block, grid, kind, index_type)


_ENUMS = {"rounding_mode": {None, "trunc", "floor"}, "approximate": {"none", "tanh"}}

# Note [outputs read back on the CPU]: a kernel with several loops (one per output shape, side
# loops before a row loop) computes a value where each loop needs it. A value one loop stored as
# an output was computed again in a later loop: llama's RoPE kernel writes cos and sin of the
# positions (two 16x16 outputs) and then, for the key expanded to the query heads (2x2x16x16),
# called libm's cos and sin again for every element, 2560 calls where 512 do. On the CPU the
# loops run one after another (each parallel loop ends at OpenMP's barrier), so a later loop reads
# the element a pointwise loop stored back: ``FUSEG_ON_CPU(out[i], recomputed)``; g++ drops the recomputation as
# dead code (libm calls are pure under -fno-math-errno). CUDA keeps recomputing: another block
# may not have written the element yet. Only where the stored value is the computed one, bit for
# bit: float32 and float64 outputs (compute type = storage type), not written into an input
# (in place), laid out with the value's own shape.


def _read_back(p: Param, m) -> bool:  # noqa: ANN001 - m: the value's TensorMeta
    return p.target is None and p.dtype in (torch.float32, torch.float64) and tuple(p.shape) == tuple(m.shape)


def _check_plain(node: Node, name: str, v: object) -> None:
    """A non-tensor argument of an elementwise op: a scalar (formatted by literal(), which checks
    its type and range), None, a known enum string (compared, never formatted) or a torch enum."""
    if v is None or isinstance(v, (bool, int, float, torch.dtype, torch.layout, torch.device, torch.memory_format)):
        return
    if isinstance(v, str) and v in _ENUMS.get(name, ()):
        return
    raise Declined(f"node {node.name!r} ({node.op}): argument {name} = {type(v).__name__} {v!r:.60}")


# Note [simd pointwise loops]: the innermost CPU loop of a pointwise kernel vectorizes only where
# GCC can prove its pointers apart. The kernels' parameters are ``__restrict__`` (no in-place
# write), but OpenMP's outlined body of a parallel loop reads them from a struct, without the
# qualifier, so GCC versions the loop with a run-time test per pair of pointers, and gives up past
# 10 (``--param vect-max-version-for-alias-checks``): Llama's RoPE over q and k (two outputs,
# four inputs, the loop split in two by Note [one loop per branch range]) ran one element at a
# time, a bf16 one 1040 us against eager's 266 (llama-1024: 2.7 ms of the 4.3 ms its kernels
# took a call; AMD EPYC family 25 model 17, scratch). Such a loop is marked ``omp simd``: no
# iteration depends on another (an element reads its inputs and writes its own outputs), which is
# what the pragma states, so it vectorizes whatever the alias tests would number. Not marked: a
# kernel that writes an input in place (its pointers may meet), one whose loop reads an output
# (Note [outputs read back on the CPU]), and one with an ``if`` (Note [no if-conversion of
# branches]: such a loop keeps GCC's own choice).
_READS_OUTPUT = re.compile(r"\bout\d+\[")


def _simd(lw: _Lowerer, lines: list[str]) -> bool:
    """Whether a CPU pointwise loop of body ``lines`` is marked ``omp simd`` (Note [simd pointwise loops])."""
    if any(p.target for p in lw.params.values()) or branches_with_loads("\n".join(lines)):
        return False
    for line in lines:
        target, eq, value = line.partition(" = ")
        if _READS_OUTPUT.search(value if eq and _READS_OUTPUT.match(target.strip()) else line):
            return False
    return True


def _mark_simd(cpu: list[str], header: str) -> list[str]:
    """``cpu`` with ``#pragma omp simd`` above each line that is the loop ``header`` (by its counter)."""
    counter = header.strip().split(" = ")[0]
    out: list[str] = []
    for line in cpu:
        if line.strip().startswith(counter + " = "):
            out.append("#pragma omp simd")
        out.append(line)
    return out


def _pointwise_loop(lw: _Lowerer, shape: tuple[int, ...], ps: list[Param], stores: dict, indent: str) -> str:
    """Note [pointwise loops]: one body, two loop nests. On CUDA a grid-stride loop over the
    linear index, unravelled into one index per dim. On the CPU one loop per dim of the output
    (size-1 dims have none), so every index is affine in the loop counters: no division per
    element, the innermost loop over unit strides vectorizes, and the outer loops are shared
    among the threads (OpenMP, torch's thread count) where there is enough work (the loop threshold,
    Note [work of a loop])."""
    n = math.prod(shape)
    loop = lw.fresh("L")
    b = Body(lw, loop, indent + "  ")
    idx_vars, unravel, nest = [], [], []
    for d, term in enumerate(ix.unravel_terms("i", shape)):
        if term == "0":
            idx_vars.append("0")
            continue
        name = f"i_{d}"
        unravel.append(f"{b.indent}const FUSEG_I {name} = {term};")
        nest.append(f"{indent}for (FUSEG_I {name} = 0; {name} < {shape[d]}; ++{name})")
        idx_vars.append(name)
    for p in ps:
        store_output(lw, b, p, idx_vars, stores)
        # later loops may read it back (Note [outputs read back on the CPU]); a row kernel's own
        # stores are not recorded: its row and column passes are two variants of one loop
        lw.stored[p.value] = (p, loop)
    ept = cuda_ept()  # Note [CUDA launch shapes]: each thread's elements a block apart
    along = _broadcast_dim(lw, loop, shape, idx_vars, ept)
    if along is not None:  # Note [elements along a broadcast dim]
        along, per = along
        fewer = tuple(n // per if d == along else n for d, n in enumerate(shape))
        terms = ix.unravel_terms("i", fewer)
        cuda = [f"{indent}for (FUSEG_I i = FUSEG_BLOCK * FUSEG_BLOCK_DIM + FUSEG_THREAD; i < {n // per};"
                f" i += FUSEG_NBLOCKS * FUSEG_BLOCK_DIM)",
                f"{indent}FUSEG_UNROLL for (int u_ = 0; u_ < {per}; ++u_) {{"]
        for d, v in enumerate(idx_vars):
            if v == "0":
                continue
            term = terms[d] if d != along else ("(FUSEG_I)u_" if terms[d] == "0" else f"{terms[d]} * {per} + u_")
            cuda.append(f"{b.indent}const FUSEG_I {v} = {term};")
    elif ept == 1:
        cuda = [f"{indent}for (FUSEG_I i = FUSEG_BLOCK * FUSEG_BLOCK_DIM + FUSEG_THREAD; i < {n};"
                f" i += FUSEG_NBLOCKS * FUSEG_BLOCK_DIM) {{", *unravel]
    else:
        cuda = [f"{indent}for (FUSEG_I i_ = FUSEG_BLOCK * (FUSEG_BLOCK_DIM * {ept}) + FUSEG_THREAD; i_ < {n};"
                f" i_ += FUSEG_NBLOCKS * (FUSEG_BLOCK_DIM * {ept}))",
                f"{indent}for (int u_ = 0; u_ < {ept}; ++u_) if (i_ + (FUSEG_I)u_ * FUSEG_BLOCK_DIM < {n}) {{",
                f"{b.indent}const FUSEG_I i = i_ + (FUSEG_I)u_ * FUSEG_BLOCK_DIM;", *unravel]
    loop_vars = [v for v in idx_vars if v != "0"]
    # Note [tables of a small input's values] (tables.py): the CPU loop's own body where it reads
    # tables, filled before the loop; the CUDA loop keeps ``b.lines``
    inputs = {p.name: (p.dtype, p.shape, p.stride) for p in lw.params.values() if not p.output}
    threads = parallel_if(n, b.lines)  # Note [work of a loop]
    lines, fill = tabulate(b.lines, inputs, n, lambda: lw.fresh("fuseg_tab"), threads)
    levels = _hoist_levels(lines, b.indent, loop_vars)
    inner = [line for line, lv in zip(lines, levels) if lv >= len(nest) - 1]
    # Note [one loop per branch range] (fission.py): only below an outer loop, which OpenMP shares
    split = fission(nest[-1], inner, loop_vars[-1], shape[int(loop_vars[-1][2:])], indent) if len(nest) >= 2 else None
    # Note [simd pointwise loops] (not where the innermost loop is the one OpenMP shares)
    simd = bool(nest) and (len(nest) >= 2 or threads is None) and _simd(lw, lines if split is None else split)
    if not any(lv < len(nest) - 1 for lv in levels):
        cpu = list(nest)
        if threads is not None and nest:
            cpu.insert(0, f"#pragma omp parallel for collapse({max(len(nest) - 1, 1)}) schedule(static){threads}")
        if split is not None:
            cpu[-1:] = [f"{indent}{{", *split, f"{indent}}}"]
        if simd:
            cpu = _mark_simd(cpu, nest[-1])
        if split is not None:
            return "\n".join(["#ifdef __CUDACC__", *cuda, *b.lines, f"{indent}}}", "#else", *fill, *cpu, "#endif"]) + "\n"
        if fill:
            return "\n".join(["#ifdef __CUDACC__", *cuda, *b.lines, f"{indent}}}", "#else", *fill, *cpu,
                              f"{indent}{{", *lines, f"{indent}}}", "#endif"]) + "\n"
        rows = pointwise_rows(lw, loop, lines, ps, loop_vars[-1], shape[int(loop_vars[-1][2:])], indent) \
            if simd and len(nest) >= 2 and cpu[-2] == "#pragma omp simd" else None
        if rows is not None:  # Note [fp16 rows converted by the row]: the CPU's body of its own
            body, fill_rows, flush = rows
            return "\n".join(["#ifdef __CUDACC__", *cuda, *b.lines, f"{indent}}}", "#else", *cpu[:-2], f"{indent}{{",
                              *fill_rows, *cpu[-2:], f"{indent}{{", *body, f"{indent}}}", *flush,
                              f"{indent}}}", "#endif"]) + "\n"
        cpu.append(f"{indent}{{")
        return "\n".join(["#ifdef __CUDACC__", *cuda, "#else", *cpu, "#endif", *b.lines, f"{indent}}}"]) + "\n"
    # Note [hoisted per-loop values]: a value that depends only on outer loop counters (batch
    # norm's per-channel scale, a broadcast row of weights) is computed in the loop of its
    # innermost counter, not per element; loops above such a value are the only ones collapsed.
    cpu = [*fill, *(line for line, lv in zip(lines, levels) if lv == -1)]
    first = min(lv for lv in levels if lv >= 0) if any(lv >= 0 for lv in levels) else len(nest) - 1
    if threads is not None and nest:
        cpu.append(f"#pragma omp parallel for collapse({max(min(first + 1, len(nest) - 1), 1)}) schedule(static){threads}")
    opened = 0
    for d, header in enumerate(nest):
        if d == len(nest) - 1 and split is not None:
            cpu.extend(split)
            break
        cpu.append(header)
        mine = [line for line, lv in zip(lines, levels) if lv == d and d < len(nest) - 1]
        # the loop right above a split encloses several loops: braces even with nothing of its own
        if mine or d == len(nest) - 1 or (split is not None and d == len(nest) - 2):
            cpu.append(f"{indent}{{")
            opened += 1
            cpu.extend(mine)
    else:
        cpu.extend(inner)
    cpu.extend([f"{indent}}}"] * opened)
    if simd:
        cpu = _mark_simd(cpu, nest[-1])
    return "\n".join(["#ifdef __CUDACC__", *cuda, *b.lines, f"{indent}}}", "#else", *cpu, "#endif"]) + "\n"


# Note [elements along a broadcast dim]: a CUDA pointwise loop gives each thread ``ept`` elements
# (Note [CUDA launch shapes]), a block apart in the linear index. Where an input is broadcast
# along some dim of the loop (RoPE's cos and sin along the heads, a bias along the rows), the
# thread's elements are taken along that dim instead: ``ept`` consecutive indices of it, the
# other dims the same. The loads that do not depend on that dim are then the same expression in
# every unrolled iteration, which nvcc loads once (the inputs are read-only): RoPE's q and k read
# cos and sin once per four heads, not per head. A warp's threads still take consecutive
# elements of the innermost dim, so each access stays coalesced; the grid is the same. The dim:
# not the innermost of the loop, its extent a multiple of ``ept``, and of those the one the most
# distinct loads (that depend on some other dim) do not depend on. Plain sizes only; a loop with
# no such load keeps the block-apart elements. The H100 runs had RoPE at 1.55-1.94x a copy of
# its bytes: each element read x, its rotated partner, cos and sin. FUSEG_BCAST_EPT=0 turns it off.
# A dim of at most 2 * ept that ept does not divide is taken whole, all of it a thread: Qwen2-7B's
# 7 query heads per KV group, along which the copy of the expanded V is broadcast. H100 run 5
# (perf/results/nvidia-h100/issue44_run5 at 465fcab, one run; its "before" file,
# gpu_bandwidth_whole_h100.json, is in git history): rope-qwen2-7b 1.68x -> 1.49x the copy (kernel
# 0.067 -> 0.057 ms), the other blocks within 0.96-1.02x, the GPU tests of the cases it changes
# passing; so it is on. FUSEG_BCAST_WHOLE=0 turns it off (the before of that measurement).
def _broadcast_dim(lw: _Lowerer, loop: str, shape: tuple[int, ...], idx_vars: list[str],
                   ept: int) -> tuple[int, int] | None:
    """See Note [elements along a broadcast dim]: the dim a CUDA thread's elements run along and how
    many it takes, or None."""
    opts = current()
    if ept == 1 or not opts.bcast_ept or not all(type(n) is int for n in shape):
        return None
    whole = opts.bcast_whole
    dims = [d for d, v in enumerate(idx_vars) if v != "0"]
    offsets = {off for _, off, lp in lw.loads if lp == loop}
    uses = {off: {d for d in dims if re.search(rf"\b{idx_vars[d]}\b", off)} for off in offsets}
    best = None
    for d in dims[:-1]:
        per = ept if shape[d] % ept == 0 else shape[d] if whole and 1 < shape[d] <= 2 * ept else 0
        if not per:
            continue
        free = sum(1 for used in uses.values() if d not in used and used)
        # (the most free loads; of those, the most elements: RoPE's [2, 4, ...] takes the 4 heads,
        # not the batch of 2 taken whole)
        if free and (best is None or (free, per) > (best[0], best[2])):
            best = (free, d, per)
    return None if best is None else best[1:]


_LET = re.compile(r"const [A-Za-z_][A-Za-z0-9_ ]* (t[0-9]+) = (.*);$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _hoist_levels(lines: list[str], indent: str, loop_vars: list[str]) -> list[int]:
    """Per body line, the position in ``loop_vars`` of the innermost counter it depends on (-1:
    none), for the top-level ``const`` lets of the body; every other line (stores, branches,
    and what reads a value they make) is at the innermost loop. Names are the generator's own
    (``i_<d>``, ``t<n>``), so a whole-word scan of the expression finds every dependency."""
    inner = len(loop_vars) - 1
    pos = {v: k for k, v in enumerate(loop_vars)}
    level: dict[str, int] = {}
    out = []
    for line in lines:
        m = _LET.match(line[len(indent):]) if line.startswith(indent) and not line[len(indent)].isspace() else None
        if m is None:
            out.append(inner)
            continue
        lv = -1
        for name in _NAME.findall(m.group(2)):
            if name in pos:
                lv = max(lv, pos[name])
            elif name in level:
                lv = max(lv, level[name])
            elif name[0] in "tc" and name[1:].isdigit():  # a value made inside a branch
                lv = inner
        level[m.group(1)] = lv
        out.append(lv)
    return out


def _check_in_place(lw: _Lowerer, outs: list[Param], stores: dict) -> None:
    """An output written into an input's storage must not race with a read of that storage:
    every read of the input is at the very element the same loop writes."""
    if all(p.target is None for p in outs):
        return
    roots = view_roots(lw.g)  # once per graph (cached on it)
    for p in outs:
        if p.target is None:
            continue
        if lw.row is not None and p.target in lw.params:
            raise Declined(f"writes {p.target} in place in a row kernel that also reads it")
        off, loop = stores[p.value]
        for v, load_off, load_loop in lw.loads:
            if v == p.target and (load_off != off or load_loop != loop):
                raise Declined(f"writes {p.target} in place while reading it at another element")
            if v != p.target and roots.get(v, v) == p.target:
                raise Declined(f"writes {p.target} in place while reading a view of it ({v})")
