"""Small float32 matmuls as generated C++ kernels (the CPU target only).

Note [matmul kernels]: the transformers of the bench multiply tiny matrices (a projection of 16
tokens of 64 features by a 64 x 64 weight: 65k multiply-adds), and ATen's ``mm``/``addmm``/``bmm``
spend 3.5-13 us a call on them on the 2-core machines of this project, nearly all of it outside
the arithmetic (dispatch, checks, BLAS's own setup), against ~1 us for the arithmetic itself.
The kernel here is the arithmetic: per batch, C = A @ B (+ X, addmm's bias broadcast to C), by
the register tiles of Note [register tiles] (runtime/codegen/source/gemm_prelude.py), the multiply-adds contracted into
FMAs as BLAS computes them. Two loop shapes, by which of B's dims is contiguous:

* B contiguous along n (``x @ w`` of a Conv1D, ``attn @ v``): ``fuseg_mm_nn``, rows of C times
  vectors of columns, one k at a time, A's element broadcast (A in any layout);
* A and B contiguous along k (``x @ w.t()`` of a Linear, ``q @ k.transpose``): ``fuseg_mm_nt``,
  dot products along k summed across lanes at the end; from a few rows of C (a test in the
  kernel, on the sizes it is called with) B is first copied contiguous along n, a block at a
  time, and the first loop reads the copy.

Every size, stride and offset is an argument of the routines, so a symbolic plan's kernel is
one binary for every size (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py): the generator
decides nothing on a size but what it must (which loop reads the strides), and tests strides
before sizes so that a symbolic size seldom becomes a condition of the plan.

Values are not ATen's bits: the sums run in another order (BLAS's own order depends on the
machine and the sizes). The kernel cases check them against eager within the tolerances of
float32 arithmetic. Taken: one ``mm``, ``addmm`` (beta = alpha = 1) or ``bmm`` in a MATMUL
segment whose other nodes are views, every value float32, the product written contiguously,
each operand read through the layout torch's meta kernels compute for its views (never the
recorded one) and lying inside its input's planned extent. Anything else is declined with the
reason and runs on torch. Whether the kernel or ATen's BLAS is the faster for a shape is not
decided here: it is measured on the machine (Note [choices by measurement] in runtime/autotune.py).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from segmenter import FusionGraph, OpKind, Segment, op_info
from segmenter.ir.graph import ValueRef
from segmenter.ir.symbolic import is_symbolic

from .. import thresholds
from ..kernel import Kernel, Param, bind
from ..source.checks import check_layout, check_segment_metas, int_arg
from ..source.ctypes_ import Declined

__all__ = ["MATMULS", "Product", "matmul_kernel", "product_call", "unit_stride"]

MATMULS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default"})


def _one(v: object, what: str) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 1):
        raise Declined(f"{what} = {v!r:.40} (only 1 is taken)")


def _furthest(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """The furthest element of a layout from its first (-1: no element)."""
    return sum((n - 1) * s for n, s in zip(shape, stride)) if 0 not in shape else -1


def _broadcast(shape: tuple, stride: tuple, to: tuple, name: str) -> tuple[tuple, tuple]:
    """A layout seen broadcast to the shape ``to`` (as ``expand`` sees it: a new or size-1 dim
    repeats, stride 0), computed here so that symbolic sizes need no number."""
    pad = len(to) - len(shape)
    if pad < 0:
        raise Declined(f"bias %{name} of shape {list(shape)} does not broadcast to {list(to)}")
    out = []
    for d, n in enumerate(to):
        if d < pad:
            out.append(0)
        elif shape[d - pad] == n:
            out.append(stride[d - pad])
        elif shape[d - pad] == 1:
            out.append(0)
        else:
            raise Declined(f"bias %{name} of shape {list(shape)} does not broadcast to {list(to)}")
    return to, tuple(out)


def unit_stride(shape: tuple[int, ...], stride: tuple[int, ...], dim: int) -> bool:
    """Whether stepping along ``dim`` moves one element (a dim of size 1 is never stepped along)."""
    return shape[dim] <= 1 or stride[dim] == 1


@dataclass(frozen=True)
class Product:
    """A call of the prelude's matmul routines (Note [register tiles] in runtime/codegen/source/gemm_prelude.py): C (m x n,
    rows ``ldc`` apart, columns contiguous) = A @ B (+ X), every size and stride an argument."""

    loop: str  # "nn": B contiguous along n; "nt": A and B contiguous along k
    args: tuple  # m, n, k, A's strides, B's strides (as the routine takes them), ldc, X's strides

    def __call__(self, a: str, b: str, x: str, c: str) -> str:
        """The call on pointers ``a``, ``b``, ``x`` (the bias, or ``nullptr``) and ``c``."""
        m, n, k, sa, sb, ldc, (sxm, sxn) = self.args
        return (f"fuseg_mm_{self.loop}({m}, {n}, {k}, {a}, {', '.join(f'{v}' for v in sa)}, {b}, {sb}, {c}, {ldc}, "
                f"{x}, {sxm}, {sxn})")


def product_call(m: int, n: int, k: int, a: tuple[int, int], b: tuple[int, int], ldc: int,
                 bias: tuple[int, int] | None) -> Product:
    """The call that computes C (m x n, rows ``ldc`` apart, columns contiguous) = A (m x k, strides
    ``a``) @ B (k x n, strides ``b``), plus X (strides ``bias``: 0 broadcasts) where given; or
    ``Declined`` unless B is contiguous along n, or A and B both along k (Note [matmul kernels]).
    A dim of size 1 is never stepped along: its stride does not matter (strides are tested first:
    a test of a symbolic size is a condition of the plan)."""
    (sam, sak), (sbk, sbn) = a, b
    bs = bias if bias is not None else (0, 0)
    if sbn == 1 or n <= 1:
        return Product("nn", (m, n, k, (sam, sak), sbk, ldc, bs))
    if sbk == 1 and sak == 1 or k <= 1:
        return Product("nt", (m, n, k, (sam,), sbn, ldc, bs))
    raise Declined(f"A of strides {[sam, sak]} and B of strides {[sbk, sbn]}: the kernel reads B contiguous along n, "
                   "or A and B contiguous along k")


def matmul_kernel(graph: FusionGraph, seg: Segment, layouts: dict) -> Kernel:
    """The kernel of ``seg``, a MATMUL segment (Note [matmul kernels]); ``layouts``: value ->
    (shape, strides) planned for its inputs."""
    products = [n for n in seg.nodes if n.op in MATMULS]
    others = [n for n in seg.nodes if n.op not in MATMULS]
    if len(products) != 1 or any(op_info(n.op).kind != OpKind.VIEW for n in others):
        raise Declined("not one mm/addmm/bmm among views")
    node = products[0]
    if len(node.outputs) != 1 or node.outputs[0] is None:
        raise Declined("a matmul without its one output")
    env = check_segment_metas(graph, seg, layouts)  # torch's own layouts of every value
    a = bind(node)
    batched = node.op == "aten.bmm.default"
    if node.op == "aten.addmm.default":
        _one(a.get("beta"), "beta")
        _one(a.get("alpha"), "alpha")
        names = {"A": a.get("mat1"), "B": a.get("mat2"), "X": a.get("self")}
    else:
        names = {"A": a.get("self"), "B": a.get("mat2")}
    if not all(isinstance(v, ValueRef) for v in names.values()):
        raise Declined("a matmul of something other than tensor values")
    out = node.outputs[0]
    values = [*(v.name for v in names.values()), out]
    if any(env[v].dtype != torch.float32 for v in values) or graph.metas[out].dtype != torch.float32:
        raise Declined("a matmul not of float32 values (the generator takes float32)")
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    roots: dict[str, str] = {}  # operand -> the segment input it is a view of
    for v in names.values():
        r = v.name
        while r in made and r not in seg.inputs:
            view = made[r]
            if len(view.inputs) != 1:
                raise Declined(f"operand %{v.name}: made by {view.op} of {len(view.inputs)} values")
            r = view.inputs[0]
        if r not in seg.inputs:
            raise Declined(f"operand %{v.name} is not a view of an input of the segment")
        roots[v.name] = r
    params, cname = [], {}
    for r in dict.fromkeys(roots.values()):
        if graph.metas[r].dtype != torch.float32:  # its layout is counted in its own dtype's elements
            raise Declined(f"input %{r} is {str(graph.metas[r].dtype).removeprefix('torch.')}, seen as float32 by a view")
        shape, stride = check_layout(*(layouts[r] if r in layouts else (graph.metas[r].shape, graph.metas[r].stride)),
                                     f"input %{r}")
        cname[r] = f"p{len(params)}_"
        params.append(Param(cname[r], r, torch.float32, shape, stride, False))
    extent = {p.value: _furthest(p.shape, p.stride) + 1 for p in params}
    ops = {}
    for key, v in names.items():
        t = env[v.name]
        shape, stride = check_layout(tuple(t.shape), t.stride(), f"operand %{v.name}")
        offset = int_arg(t.storage_offset(), f"operand %{v.name} offset", 0)
        if key == "X":  # addmm's bias, broadcast to the product's shape
            shape, stride = _broadcast(shape, stride, tuple(env[out].shape), v.name)
        if 0 not in shape and offset + _furthest(shape, stride) >= extent[roots[v.name]]:
            raise Declined(f"operand %{v.name} reaches past the planned extent of %{roots[v.name]}")
        ops[key] = (shape, stride, offset, cname[roots[v.name]])
    (ashape, astride, *_), (bshape, bstride, *_) = ops["A"], ops["B"]
    batch = ashape[0] if batched else 1
    m, k, n = ashape[-2], ashape[-1], bshape[-1]
    oshape, ostride = check_layout(graph.metas[out].shape, graph.metas[out].stride, f"output %{out}")
    want = (batch, m, n) if batched else (m, n)
    dense = tuple(math.prod(want[d + 1:]) for d in range(len(want)))
    # (an empty product is never written: its strides do not matter)
    if oshape != want or 0 not in want and any(s != d for s, d, e in zip(ostride, dense, want) if e > 1):
        raise Declined(f"an output of {list(oshape)} / {list(ostride)}: the kernel writes {list(want)} contiguously")
    r = 1 if batched else 0  # first matrix dim
    bias = ops["X"][1] if "X" in ops else None
    try:
        call = product_call(m, n, k, astride[r:], bstride[r:], n, bias)
    except Declined:
        raise Declined(f"operands of strides {list(astride)} and {list(bstride)}: the kernel reads B contiguous "
                       "along n, or A and B contiguous along k") from None
    sab = astride[0] if batched else 0
    sbb = bstride[0] if batched else 0
    ap, bp = ops["A"], ops["B"]
    x = f"{ops['X'][3]} + {ops['X'][2]}" if bias is not None else "nullptr"
    lines = [f"  for (FUSEG_I b = 0; b < {batch}; ++b)",
             f"    {call(f'{ap[3]} + {ap[2]} + b * {sab}', f'{bp[3]} + {bp[2]} + b * {sbb}', x, f'y_ + b * {m * n}')};"]
    params.append(Param("y_", out, torch.float32, oshape, ostride, True))
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.shape, p.stride) for p in params])).encode()).hexdigest()[:12]
    macs = m * n * k  # each product's; the routine shares it among threads from the threshold on
    least = thresholds.current()  # (Note [thread thresholds measured here])
    return Kernel(f"fuseg_matmul_{digest}", tuple(params), body, 1, 1, "matmul",
                  beside=not is_symbolic(macs) and macs < least.beside_macs, parallel_macs=least.macs,
                  pack_rows=(least.pack_rows, least.nn_pack_rows))
