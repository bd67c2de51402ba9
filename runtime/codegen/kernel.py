"""Kernels and their parameters, the op sets the lowering dispatches on, and the statement
builder (``Body``) shared by the pointwise lowering (runtime/codegen/lowering/lower.py) and the row kernels (runtime/codegen/lowering/rows.py)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import torch

from runtime.options import current
from segmenter import Node
from segmenter.ir.ops import resolve_op

from . import thresholds
from .source import index as ix
from .source.checks import dim_arg
from .source.ctypes_ import Declined, prelude, storage_type, store
from .source.gemm_prelude import NN_PACK_ROWS, PACK_ROWS
from .source.symsizes import sizes_active
from .vector_width import pragma

__all__ = ["CONST", "HALF_HELPERS", "cpu_attributes", "H_HELPERS", "cuda_ept", "cuda_tuning", "half_exact", "half_helpers", "soft_half", "translation_unit", "LINEAR_VIEWS", "loop_kernel", "loop_work", "beside", "BESIDE_MARK", "parallel_if", "routine_defines", "routine_settings", "RESHAPE", "VIEW_IDENTITY", "Body", "Kernel", "Param", "bind", "norm_dim",
           "store_output"]


@dataclass(frozen=True)
class Param:
    """One kernel argument: a tensor the kernel reads (input) or writes (output)."""

    name: str  # C name
    value: str  # graph value
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    output: bool
    target: str | None = None  # the graph input this output is written into (in place)


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    body: str  # the kernel's statements, the same for both targets
    block: int  # threads per block on CUDA
    grid: int  # blocks on CUDA
    kind: str  # "pointwise" | "row"
    index_type: str = "long long"  # "int" where every index and offset fits in 31 bits
    #: what the function returns: "void", or "long long" for a CPU kernel that counts the
    #: elements it refused (an index out of range: Note [embedding kernels] in runtime/codegen/opaque/embedding.py)
    returns: str = "void"
    #: set by a generator whose kernel calls the prelude's matmul routines where each product
    #: is under the beside threshold: the kernel may run beside others (``beside``)
    beside: bool = False
    #: the multiply-adds from which the prelude's matmul routines share a product among threads,
    #: for a kernel that calls them (runtime/codegen/opaque/gemm.py, runtime/codegen/opaque/attention.py, runtime/codegen/opaque/matconv.py): the thresholds it was
    #: generated with (Note [thread thresholds measured here] in thresholds.py), so its source
    #: names them; with the rows from which a product copies B first (nt, nn)
    parallel_macs: int | None = None
    pack_rows: tuple[int, int] | None = None

    def source(self, target: str) -> str:
        soft = soft_half(target)
        return (f"{pragma(target)}#define FUSEG_I {self.index_type}\n{soft}{routine_defines([self], target)}"
                f"{prelude(target)}\n{self.function(target)}")

    @property
    def symbols(self) -> tuple[int, ...]:
        """The plan's symbols the body reads (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py)."""
        return tuple(sorted({int(k) for k in _SYMBOL.findall(self.body)}))

    def function(self, target: str) -> str:
        """The kernel's function alone (``source`` is the prelude and it; a translation unit of
        several kernels has the prelude once and redefines ``FUSEG_I`` before each function).
        A kernel with symbolic sizes takes their values last: on the CPU an array (``fuseg_S``,
        one pointer more for ctypes and the chain runner), on CUDA each by value."""
        # no two parameters share memory unless an output is written into an input (in place)
        restrict = "" if any(p.target for p in self.params) else " __restrict__"
        args = ", ".join(f"{'' if p.output else 'const '}{storage_type(p.dtype)}*{restrict} {p.name}"
                         for p in self.params)
        if target == "cuda" and self.returns != "void":
            raise Declined(f"kernel {self.name} returns a value: the CPU target only")
        symbols = self.symbols
        body = self.body
        if symbols and target == "cuda":  # by value: the launch passes them (runtime/backends/cupy.py)
            args += "".join(f", const long long fuseg_s{k}" for k in symbols)
        elif symbols:
            args += ", const long long* __restrict__ fuseg_S"
            body = "".join(f"  const long long fuseg_s{k} = fuseg_S[{k}];\n" for k in symbols) + body
        qual = 'extern "C" __global__' if target == "cuda" else 'extern "C"' + cpu_attributes(self.body)
        # Note [CUDA launch shapes]; a kernel of symbolic sizes keeps blockDim.x: its block comes from
        # the first call's sizes, and a plan made for other sizes must find the same source
        if target == "cuda" and isinstance(self.block, int) and not symbols and cuda_tuning():
            return (f"{half_helpers(body)}#undef FUSEG_BLOCK_DIM\n#define FUSEG_BLOCK_DIM ((FUSEG_I){self.block})\n"
                    f"{qual} void __launch_bounds__({self.block}) {self.name}({args}) {{\n{body}}}\n"
                    f"#undef FUSEG_BLOCK_DIM\n#define FUSEG_BLOCK_DIM ((FUSEG_I)blockDim.x)\n")
        return f"{half_helpers(body)}{qual} {self.returns} {self.name}({args}) {{\n{body}}}\n"


# Note [no if-conversion of branches]: g++ 12.2 at -O3 miscompiled a kernel whose loop held an
# if/else on an outer counter with a load of another dtype in each arm (cat of int32 + 1 and a
# float input into float64 along dim 0: zeros for the float rows; the source was right, and -O0,
# -fno-tree-loop-vectorize or -fno-tree-loop-if-convert gave the right values; regression test in
# tests/test_codegen.py). If-conversion of such a loop must turn each arm's loads into masked
# loads. Our kernels hold conditional loads only inside ``if`` statements (cat, pad, scatter,
# conv's padding, embedding's range check): every other condition is a ternary between values
# already computed, whose loads are unconditional. So a kernel with an ``if`` is built without
# loop if-conversion (a function attribute; the rest of the command line still holds, as
# tests/test_codegen.py checks), and every other kernel keeps it: a clamp's ternaries then become
# vector selects (turning it off for all kernels cost mobilenet-v2 1.17x). ``if (0)``/``if (1)``,
# the constant tests loop fission leaves (Note [one loop per branch range]), g++ removes first.
_BRANCH = re.compile(r"\bif \((?![01]\))")
_SYMBOL = re.compile(r"\bfuseg_s(\d+)\b")


def cpu_lines(body: str) -> list[str]:
    """The lines of a kernel body that a CPU build compiles: all but ``__CUDACC__``'s own
    sections (``#ifdef __CUDACC__``, the ``#else`` of ``#ifndef __CUDACC__``). Unbalanced
    directives (not something the lowering writes) give every line."""
    flip = {"cuda": "cpu", "cpu": "cuda", "both": "both"}
    sections: list[str] = []  # per open #if: whose section this is
    lines = []
    for line in body.splitlines():
        d = line.strip()
        if d.startswith("#if"):
            sections.append({"#ifdef __CUDACC__": "cuda", "#ifndef __CUDACC__": "cpu"}.get(d, "both"))
        elif d in ("#else", "#endif"):
            if not sections:
                return body.splitlines()
            if d == "#else":
                sections[-1] = flip[sections[-1]]
            else:
                sections.pop()
        elif "cuda" not in sections:
            lines.append(line)
    return lines if not sections else body.splitlines()


def branches_with_loads(body: str) -> bool:
    """Whether a CPU build of a kernel body has an ``if`` statement (Note [no if-conversion of
    branches])."""
    return any(_BRANCH.search(line) for line in cpu_lines(body))


# Note [no partial redundancy elimination around inlined math]: fuseg_exp, fuseg_erf and
# fuseg_tanh (Note [vectorizable exp], runtime/codegen/source/ctypes_.py) are branch-free as written, ternaries that
# if-conversion turns into vector selects. g++ 12.2's PRE (-ftree-pre, on at -O3) can move
# their computations into the arms of those ternaries once several are inlined into one loop
# with other values: the loop then has control flow that if-conversion leaves, and it is not
# vectorized at all ("control flow in loop", -fopt-info-vec). Found in bert-tiny's backward: a
# layer norm backward that recomputes GELU (two erf and an exp an element), whose last row
# pass stayed scalar: 52.2 us a call, 8.2 us built without PRE, outputs bit for bit the same
# (its source built both ways, called alternately; scratch). Dropping any one statement of that
# pass, or PRE, let it vectorize. So a CPU kernel that calls them is built without PRE (a
# function attribute, as Note [no if-conversion of branches]); other kernels keep it. The same
# holds for fuseg_max and fuseg_min (a NaN test and a choice, both ternaries): T5's fp16 guard
# clamps each value between bounds selected once by a bool (whether any value was infinite) and
# then normalizes the row; PRE moved that selection into control flow and the row's passes
# stayed scalar: 786 us a call in t5-encoder-512's fp16 program (launch by launch, an Intel Xeon)
# where ATen's ops took 233 us; built without PRE, 235 us alone against ATen's 535-695 us (the
# measured choice, made-up rows). tests/test_vectorized_loops.py has its shape.
_INLINED_MATH = re.compile(r"\bfuseg_(?:exp\(|erf\(|tanh\(|max<|min<)")


def cpu_attributes(body: str) -> str:
    """The attributes a CPU build of a kernel body is compiled with (Note [no if-conversion of
    branches], Note [no partial redundancy elimination around inlined math]): part of the
    kernel's name, so a kernel built otherwise is measured afresh (its verdicts are keyed by name)."""
    return (" FUSEG_NO_IF_CONVERT" if branches_with_loads(body) else "") + (
        " FUSEG_NO_PRE" if calls_inlined_math(body) else "")


def calls_inlined_math(body: str) -> bool:
    """Whether a CPU build of a kernel body calls fuseg_exp, fuseg_erf, fuseg_tanh, fuseg_max or
    fuseg_min (Note [no partial redundancy elimination around inlined math])."""
    return any(_INLINED_MATH.search(line) for line in cpu_lines(body))


# Note [CUDA launch shapes]: what a CUDA kernel is told of its launch. A kernel is always launched
# with ``Kernel.block`` threads (runtime/backends/cupy.py), so its source says so: FUSEG_BLOCK_DIM
# is that constant and the function carries ``__launch_bounds__`` of it (not in a kernel of
# symbolic sizes, whose block follows a size: Note [kernel sizes as arguments] wants one source
# for every plan of a graph; the H100 run at f5db8b0 compiled a kernel at a new size). A row pass
# over a row of known length R is then written, on CUDA, as a loop of ceil(R / block) iterations
# (8 for rows of 4096 with 512 threads; runtime/codegen/lowering/rows.py, up to 16), which nvcc unrolls, issuing the row's
# loads together instead of one at a time (the strided ``for j = thread; j < R; j += block`` was
# not unrolled even with the block a constant: PTX of 21 loads against 24 for three passes of 8):
# the H100 run at 7559d64 had softmax / layer norm / RMS norm over 4096x4096 at 1.31-1.36x the time
# of a copy of the same bytes, against Inductor's 1.0. A pointwise loop takes ``cuda_ept()``
# elements per thread (a grid that many times smaller; each thread's elements a block apart, so a
# warp's accesses stay contiguous), for the same reason. These numbers (4 elements, 16 iterations)
# are constants, measured only as a whole on one H100 (FUSEG_CUDA_TUNING below), not per device. FUSEG_CUDA_TUNING=0 turns these, the GPU's own half
# conversions (Note [half conversions on the GPU] in runtime/codegen/source/ctypes_.py) and the skipped round trips of
# Note [values already rounded] (on both targets) off: the code as it was before,
# for a before/after measurement in one run (perf/gpu_validate.sh). Read when a kernel is lowered
# (EPT) or its source made (the rest).
def cuda_tuning() -> bool:
    """See Note [CUDA launch shapes]: on unless the ``cuda_tuning`` option is off (FUSEG_CUDA_TUNING=0)."""
    return current().cuda_tuning


def soft_half(target: str) -> str:
    """``#define FUSEG_SOFT_HALF`` where the software fp16/bf16 conversions are asked for on CUDA:
    with FUSEG_CUDA_TUNING=0, or the ``soft_half`` option (written on either target; the CPU runs
    the software fp16 conversions anyway, Note [fp16 on the CPU] in runtime/codegen/source/ctypes_.py); else
    nothing. The source, hence the cache key, changes."""
    if (target == "cuda" and not cuda_tuning()) or current().soft_half:
        return "#define FUSEG_SOFT_HALF\n"
    return ""


def cuda_ept() -> int:
    """Elements per thread of a CUDA pointwise loop (Note [CUDA launch shapes])."""
    return 4 if cuda_tuning() else 1


def routine_settings(kernel: Kernel) -> tuple[int, int, int] | None:
    """What a kernel that calls the matmul routines was generated with (the matmul threshold and
    the two pack rows: Note [thread thresholds measured here]); None for any other kernel."""
    if kernel.parallel_macs is None:
        return None
    return (kernel.parallel_macs, *(kernel.pack_rows or (PACK_ROWS, NN_PACK_ROWS)))


def routine_defines(kernels: list[Kernel], target: str) -> str:
    """The matmul routines' settings of the kernels that call them, defined before the prelude
    (one set per source: ``ValueError`` where they differ); where none calls them the routines
    are compiled but never called, and the settings are any."""
    values = {routine_settings(k) for k in kernels} - {None}
    if len(values) > 1:
        raise ValueError(f"kernels generated with different matmul settings in one source: {sorted(values)}")
    if target != "cpu":
        return ""
    macs, pack, nn_pack = values.pop() if values else (1 << 62, PACK_ROWS, NN_PACK_ROWS)
    return (f"#define FUSEG_PARALLEL_MACS {macs}LL\n#define FUSEG_PACK_ROWS {pack}\n"
            f"#define FUSEG_NN_PACK_ROWS {nn_pack}\n")


def translation_unit(kernels: list[Kernel], target: str) -> str:
    """One source holding every kernel of ``kernels`` (distinct names), the prelude once."""
    return pragma(target) + soft_half(target) + routine_defines(kernels, target) + prelude(target) + "\n" + "".join(
        f"#undef FUSEG_I\n#define FUSEG_I {k.index_type}\n{k.function(target)}" for k in kernels)


# Note [work of a loop]: an element of a loop that calls exp, tanh, erf or a libm function costs
# far more than one of adds and multiplies (eager on one thread over 16k floats, on this 2-core
# machine kind: an add 5.5 us with its dispatch, a GELU 23.5 us; our GELU loop about 1.8 ns an
# element), so a loop's work is its elements times its ops, each such call counted as so many
# plain ops (``Thresholds.costly_call``, measured on the machine: Note [thread thresholds measured
# here] in thresholds.py; 8 on that machine kind): a GELU over 16k elements is worth threads, an
# add is not.
_COSTLY = re.compile(r"\b(?:fuseg_exp|fuseg_tanh|fuseg_erf|exp2|expm1|log|log2|log10|log1p|sin|cos|tan|sinh|cosh|"
                     r"asin|acos|atan|erf|erfc|pow)\(")


def loop_work(elements: int, lines: list[str]) -> int:
    """See Note [work of a loop]: ``elements`` times the per-element cost of the body ``lines``."""
    costly = thresholds.current().costly_call  # (measured: Note [thread thresholds measured here])
    return elements * (1 + costly * sum(len(_COSTLY.findall(line)) for line in lines))


#: the tail of a parallel loop's pragma whose work is under the beside threshold: its kernel may
#: run beside others, where the runner gives it one thread (``beside``)
BESIDE_MARK = " /* may run beside */"


def beside(kernel: Kernel) -> bool:
    """Whether the CPU kernel may run beside other kernels of its chain, on one thread each (Note
    [kernels side by side] in runtime/compiled/chains.py): each of its parallel loops has work under the
    beside threshold (Note [thread thresholds measured here] in thresholds.py), and a kernel that
    calls the matmul routines (one generated with ``parallel_macs``) only where its generator
    says each product is under it."""
    if any("omp parallel" in line and BESIDE_MARK not in line for line in kernel.body.splitlines()):
        return False
    return kernel.beside or kernel.parallel_macs is None


def parallel_if(elements: int, lines: list[str]) -> str | None:
    """Whether a CPU loop of ``elements`` running ``lines`` is shared among threads (its work
    against the loop threshold), as the tail of an OpenMP pragma: None (one thread), "" (threads),
    ``BESIDE_MARK`` (threads, where the kernel runs alone), or, where the work is a symbolic
    size, an ``if(...)`` clause that decides at the call, so the choice is no condition of the
    plan (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py)."""
    work, least = loop_work(elements, lines), thresholds.current()
    if isinstance(work, torch.SymInt) and sizes_active():
        return f" if({work} >= {least.loop})"
    if work < least.loop:
        return None
    return BESIDE_MARK if work < least.beside_loop else ""


def loop_kernel(prefix: str, kind: str, lines: list[str], work: object | None, clause: str,
                params: tuple[Param, ...], returns: str = "void") -> Kernel:
    """A CPU kernel of a lone op written as C ``lines`` (runtime/codegen/opaque/embedding.py, runtime/codegen/opaque/nll_loss.py): the loop
    after the ``// loops`` mark shared among threads where ``work`` is worth it (``parallel_if``;
    None: one thread, a sum in order), ``clause`` the pragma's own additions; named ``prefix``
    and a hash of its body and parameters."""
    threads = None if work is None else parallel_if(work, [])
    if threads is not None:
        lines.insert(lines.index("// loops") + 1, f"#pragma omp parallel for{clause} schedule(static){threads}")
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.dtype) for p in params])).encode()).hexdigest()[:12]
    return Kernel(f"{prefix}_{digest}", params, body, 1, 1, kind, "long long", returns=returns)


VIEW_IDENTITY = {"aten.alias.default", "aten.detach.default", "aten.lift_fresh.default"}
RESHAPE = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}
CONST = {"aten.full.default": "fill_value", "aten.full_like.default": "fill_value",
          "aten.scalar_tensor.default": "s", "aten.new_full.default": "fill_value",
          "aten.zeros.default": 0, "aten.zeros_like.default": 0, "aten.new_zeros.default": 0,
          "aten.ones.default": 1, "aten.ones_like.default": 1, "aten.new_ones.default": 1}
# views that keep every element's row-major position: a value over the reduction's domain seen
# through them still has its row where the row kernel computed it
LINEAR_VIEWS = RESHAPE | VIEW_IDENTITY | {"aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
                                             "aten.squeeze.default"}


def bind(node: Node) -> dict[str, object]:
    """The node's arguments by schema name, defaults filled in."""
    op = resolve_op(node.op)
    if not isinstance(op, torch._ops.OpOverload):
        raise Declined(f"{node.op} is not an ATen op")
    schema = op._schema
    out: dict[str, object] = {a.name: v for a, v in zip(schema.arguments, node.args)}
    out.update(node.kwargs)
    for a in schema.arguments:
        if a.name not in out and a.has_default_value():
            out[a.name] = a.default_value
    return out


def norm_dim(d: object, rank: int) -> int:
    """A dim argument checked (an int within the rank: Note [checked source values]) and normalized."""
    return dim_arg(d, rank)


class Body:
    """Statements of one loop body (or branch), with the values already computed in it."""

    def __init__(self, lw: Any, loop: str, indent: str, memo: dict | None = None) -> None:  # lw: lower._Lowerer
        self.lw, self.loop, self.indent = lw, loop, indent
        self.lines: list[str] = []
        self.memo: dict = dict(memo or {})

    def let(self, ctype: str, expr: str) -> str:
        name = self.lw.fresh("t")
        self.lines.append(f"{self.indent}const {ctype} {name} = {expr};")
        half = half_exact(expr)
        if half is not None:  # Note [values already rounded]
            self.lw.exact[name] = half
        return name

    def branch(self) -> Body:
        return Body(self.lw, self.loop, self.indent + "  ", self.memo)


# Note [values already rounded]: eager rounds each fp16/bf16 op's result to its dtype, so the
# lowering wraps a node's float result in a round trip (``fuseg_bf2f(fuseg_f2bf(x))``, runtime/codegen/lowering/lower.py's
# ``rounded``). A value that is already a bf16 (a load, a view of one, a copy, the other half of a
# cat, an earlier round trip) comes back unchanged from it, yet each one cost a conversion pair per
# element: a RoPE block's element made ten of them. ``half_exact`` recognizes an expression whose
# value is exactly a half (the result of ``fuseg_bf2f``/``fuseg_h2f``, whatever its argument), and
# ``Body.let`` records the variables bound to one, so ``rounded`` returns them as they are.
_HALF_CALLS = (("fuseg_bf2f(", torch.bfloat16), ("fuseg_bf_round(", torch.bfloat16), ("fuseg_h2f(", torch.float16),
               ("fuseg_h_round(", torch.float16), ("fuseg_h_kept(", torch.float16))


def half_exact(expr: str) -> torch.dtype | None:
    """The half dtype whose values ``expr`` takes only (a whole call of its conversion to float), or None."""
    for prefix, dtype in _HALF_CALLS:
        if expr.startswith(prefix) and expr.endswith(")"):
            depth = 0
            for k in range(len(prefix) - 1, len(expr)):
                c = expr[k]
                if c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                    if depth == 0:
                        return dtype if k == len(expr) - 1 else None
    return None


def store_output(lw, b: Body, p: Param, idx: list[str], stores: dict) -> None:
    v = lw.value(b, p.value, idx)
    off = ix.linear(idx, p.shape, p.stride)
    stores[p.value] = (off, b.loop)
    if p.dtype == torch.bfloat16 and (lw.exact.get(v) or half_exact(v)) == torch.bfloat16:
        value = f"fuseg_bf_bits({v})"  # already a bf16: its top half is it (Note [bf16 rounding in float])
    else:
        value = store(p.dtype, v)
    b.lines.append(f"{b.indent}{p.name}[{off}] = {value};")


# Note [bf16 rounding in float]: eager rounds every bf16 op's result, so a bf16 kernel rounds each
# node's float value to bf16 and back (Note [values already rounded]). Written as the two
# conversions, ``fuseg_bf2f(fuseg_f2bf(x))``, GCC 12 vectorizes it as a narrowing to 16-bit lanes
# (a cross-lane permute) and a widening back, per element, and stores the final value through one
# more rounding: an RMS norm over 256x1024 bf16 took 151 us on one thread of the AMD EPYC family
# 25 model 17, 4x its float32 kernel's 37 us. ``fuseg_bf_round`` rounds in the 32-bit lanes
# (the same bits: round to nearest even, a NaN kept quiet with its sign as ``fuseg_f2bf`` keeps it)
# and a value already a bf16 is stored as its top 16 bits (``fuseg_bf_bits``): 87 us (scratch, one
# thread, the same kernel otherwise). On CUDA, where a conversion is one ``cvt``, the round is the
# two conversions. The two functions are defined with the kernels that call them (``HALF_HELPERS``,
# guarded for a translation unit of several kernels), not in the prelude, so the source, hence the
# cache entry, of every other kernel stays as it was.
HALF_HELPERS = r"""#ifndef FUSEG_BF_HELPERS
#define FUSEG_BF_HELPERS
#ifdef __CUDA_ARCH__
FUSEG_FN float fuseg_bf_round(float f) { return fuseg_bf2f(fuseg_f2bf(f)); }
#else
FUSEG_FN float fuseg_bf_round(float f) {
  const unsigned int x = fuseg_f2bits(f);
  const unsigned int r = ((x & 0x7fffffffu) > 0x7f800000u) ? (x | 0x400000u) : (x + 0x7fffu + ((x >> 16) & 1u));
  return fuseg_bits2f(r & 0xffff0000u);
}
#endif
FUSEG_FN unsigned short fuseg_bf_bits(float f) { return (unsigned short)(fuseg_f2bits(f) >> 16); }
#endif
"""
# Note [fp16 rounding in float]: as Note [bf16 rounding in float] for fp16 on the CPU: the round
# trip through 16 bits (``fuseg_h2f(fuseg_f2h(x))``, each of them a branchless conversion: Note
# [fp16 on the CPU]) costs both conversions per op, so ``fuseg_h_round`` rounds in the 32-bit
# lanes to the same value, by adding and taking away a power of two M = 2^(k + 13), k the
# exponent of |x| clamped to [-14, 16]: the sum's ulp is fp16's step at x's exponent (2^-24 for
# every subnormal), so the hardware's rounding to nearest even rounds |x| to fp16's precision and
# taking M away is exact. A result of 65520 and up (rounded: 65536 and up) becomes inf by
# scaling by 2^112 and back (exact below 2^16, past float's range from it); the sign is put
# back by its bit (-0 and small negatives rounded to 0 stay negative); a NaN stays a NaN (its
# payload quieted, as F16C's conversions keep it, where the round trip gives the one quiet NaN).
# Eleven vector operations where selecting among the subnormal, normal, inf and NaN cases took
# about seventeen: equal to the round trip for all 2^32 floats but the NaNs' payloads (a scratch
# program); an fp16 GELU (tanh form, eight rounds an element) over 128 x 3072 on one thread of
# the Intel Xeon with AMX took 1.26x less (1600 -> 1265 us, scratch).
H_HELPERS = r"""#ifndef FUSEG_H_HELPERS
#define FUSEG_H_HELPERS
#ifdef __CUDA_ARCH__
FUSEG_FN float fuseg_h_round(float f) { return fuseg_h2f(fuseg_f2h(f)); }
#else
FUSEG_FN float fuseg_h_round(float f) {
  const unsigned int x = fuseg_f2bits(f), a = x & 0x7fffffffu, sign = x ^ a, e = a & 0x7f800000u;
  const unsigned int k = e > 0x38800000u ? e : 0x38800000u;
  const float m = fuseg_bits2f((k < 0x47800000u ? k : 0x47800000u) + (13u << 23));
  const float r = ((fuseg_bits2f(a) + m) - m) * 5.192296858534828e+33f * 1.925929944387236e-34f;
  return fuseg_bits2f(fuseg_f2bits(r) | sign);
}
#endif
#endif
"""

# Note [fp16 rows converted by the row] (runtime/codegen/lowering/half_rows.py): a row of fp16
# values converted to floats, and back, eight at a time with F16C's instructions (GCC's and
# clang's builtins for them: no header to parse), the rest (and every value on a CPU without
# F16C) by the software conversions; ``fuseg_h_kept`` marks a value read from such a row (it is
# an fp16 value: Note [values already rounded]).
H_ROWS = r"""#ifndef FUSEG_H_ROWS
#define FUSEG_H_ROWS
FUSEG_FN float fuseg_h_kept(float f) { return f; }
#ifndef __CUDACC__
#if defined(__F16C__)
typedef short fuseg_v8hi __attribute__((vector_size(16)));
typedef float fuseg_v8sf __attribute__((vector_size(32)));
#endif
static inline void fuseg_h2f_run(float* __restrict__ d, const unsigned short* __restrict__ s, long n) {
  long i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    fuseg_v8hi h; __builtin_memcpy(&h, s + i, 16);
    const fuseg_v8sf f = __builtin_ia32_vcvtph2ps256(h);
    __builtin_memcpy(d + i, &f, 32);
  }
#endif
  for (; i < n; ++i) d[i] = fuseg_h2f(s[i]);
}
static inline void fuseg_f2h_run(unsigned short* __restrict__ d, const float* __restrict__ s, long n) {
  long i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    fuseg_v8sf f; __builtin_memcpy(&f, s + i, 32);
    const fuseg_v8hi h = __builtin_ia32_vcvtps2ph256(f, 0);
    __builtin_memcpy(d + i, &h, 16);
  }
#endif
  for (; i < n; ++i) d[i] = fuseg_f2h(s[i]);
}
#endif
#endif
"""


def half_helpers(body: str) -> str:
    """``HALF_HELPERS`` and ``H_HELPERS`` where ``body`` calls them (Note [bf16 rounding in float],
    Note [fp16 rounding in float]), else nothing."""
    return ((HALF_HELPERS if "fuseg_bf_round(" in body or "fuseg_bf_bits(" in body else "")
            + (H_HELPERS if "fuseg_h_round(" in body else "")
            + (H_ROWS if any(f in body for f in ("fuseg_h_kept(", "fuseg_h2f_run(", "fuseg_f2h_run(")) else ""))
