"""The negative log-likelihood loss and its gradient as generated C++ kernels (the CPU target only).

Note [nll loss kernels]: a causal LM's loss is ``cross_entropy``, which reaches a training graph
as ``_log_softmax`` and ``aten.nll_loss_forward`` (the backward: ``aten.nll_loss_backward`` and
``_log_softmax_backward_data``). The log-softmaxes are generated row kernels; the two nll ops
ran on ATen, 3.5 and 4.5 us a call for a tiny LM's 64 tokens on this machine kind, where the
work is 64 loads, or zeros and 64 stores. The kernels here are those loops, with ATen's
arithmetic (LossNLL.cpp, read for its semantics):

* forward, reduced (``mean``, ``sum``, and ``none`` of a 1-D input): per row in order, a target
  equal to ``ignore_index`` is skipped (and counted), any other adds ``-x[b, t]`` (``-x[b, t] *
  w[t]`` with a weight, whose ``w[t]`` adds to the total weight) into the first of eight partial
  sums, and after row ``b`` the sums cascade up while ``b``'s next ``level_power`` bits are
  zero (``level_power`` = max(4, ceil(log2(rows)) / 8)): ATen's cascade, so the sum is ATen's
  to the bit. The outputs are the partial sums added from the first, divided by the total
  weight for ``mean``; the total weight is the count of rows not ignored without a weight, the
  weights' partial sums added likewise with one. No rows: NaN for ``mean``, else 0, and a total
  weight of 0.
* forward, ``none`` of a 2-D input: per row ``-x[b, t] * w`` (``w`` = 1 without a weight: the
  product is ATen's, -0 included), 0 where ignored, a total weight of 0.
* backward: the input's gradient is zeros, and per row not ignored ``w[t] * g`` at ``[b, t]``,
  with ``g`` = ``-(grad / total_weight)`` for ``mean``, ``-grad`` otherwise (``none`` of a 2-D
  input: ``-w * grad[b]``).

A target outside ``[0, classes)`` (and not ``ignore_index``) is read past nothing: the kernel
counts it, and the launch raises eager's ``IndexError`` ("Target ... is out of bounds") when
the count is not zero (ATen raises at the first one; its backward of ``none`` does not check and
would write outside the gradient). Taken: float32 and float64 inputs of any layout, 1-D or 2-D,
int64 targets of any layout, a weight or none; half and bfloat16 (whose sums ATen rounds in the
input's type at each step) and uint8 targets are declined and run on ATen. Rows are shared among
threads only where nothing is summed (``none``, the backward) and the work is worth it. In a
program of fixed sizes, chosen by measurement against ATen's op on the machine that runs it, as
a matmul is (Note [choices by measurement] in runtime/autotune.py), on made-up targets of zeros
(runtime/backends/measured.py: a class every loss holds); a symbolic plan measures it once, at
its first sizes (Note [a lookup measured at the plan's first sizes] there); on this machine kind
the kernels won by 2-9x
(2.4 against 19.6 us, 2.0 against 4.6, gpt2-tiny's shapes: the verdicts of that measurement in
one scratch run, 2026-11-28, not committed). ``python -m perf.experiments.embedding_backward
--kernels nll_loss`` times both in training steps (perf/results/amd-epyc-zen4/nll_loss_kernels_cpu.json:
steps 1.5-2.7% shorter on three tiny models).
"""

from __future__ import annotations

import math

import torch

from segmenter import FusionGraph, Node
from segmenter.ir.graph import ValueRef

from ..kernel import Kernel, Param, bind, loop_kernel
from ..source.checks import check_layout, check_segment_metas, int_arg, lone
from ..source.ctypes_ import Declined

__all__ = ["NLL_LOSS_BACKWARD", "NLL_LOSS_FORWARD", "nll_loss_backward_kernel", "nll_loss_forward_kernel",
           "target_error"]

NLL_LOSS_FORWARD = "aten.nll_loss_forward.default"
NLL_LOSS_BACKWARD = "aten.nll_loss_backward.default"
_TYPES = {torch.float32: "float", torch.float64: "double"}
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}  # at::Reduction
_LEVELS = 8  # ATen's cascade_sum_num_levels
_NAN = '__builtin_nan("")'  # a quiet NaN of sign 0, as std::numeric_limits<double>::quiet_NaN()


def _operands(graph: FusionGraph, node: Node, a: dict, names: tuple[str, ...]) -> dict[str, tuple]:
    """The tensor arguments ``names`` (a weight may be None), each (value, meta, shape, stride)."""
    out: dict[str, tuple] = {}
    for k in names:
        v = a.get(k)
        if v is None and k == "weight":
            continue
        if not isinstance(v, ValueRef):
            raise Declined(f"{k} is not a tensor value")
        m = graph.metas[v.name]
        shape, stride = check_layout(m.shape, m.stride, k)
        out[k] = (v.name, m, shape, stride)
    return out


def _common(graph: FusionGraph, node: Node, a: dict, ops: dict) -> tuple[str, str, int, object, object]:
    """The checks both kernels make: dtypes, ranks, the weight; returns (C type, reduction, ignore_index,
    rows, classes)."""
    _, xm, xshape, _ = ops["self"]
    _, tm, tshape, _ = ops["target"]
    if xm.dtype not in _TYPES:
        raise Declined(f"a {str(xm.dtype).removeprefix('torch.')} input (float32 and float64 are taken)")
    if tm.dtype != torch.int64:
        raise Declined(f"{str(tm.dtype).removeprefix('torch.')} targets (int64 is taken)")
    if len(xshape) not in (1, 2) or len(tshape) > 1 or (len(xshape) == 1) != (len(tshape) == 0):
        raise Declined(f"an input of {list(xshape)} with targets of {list(tshape)} (2-D with 1-D, 1-D with 0-D taken)")
    reduction = _REDUCTIONS.get(int_arg(a.get("reduction"), "reduction", 0, 2))
    ignore = int_arg(a.get("ignore_index"), "ignore_index", -(2**63), 2**63 - 1)
    if "weight" in ops:
        _, wm, wshape, _ = ops["weight"]
        if wm.dtype != xm.dtype or len(wshape) != 1 or wshape[0] != xshape[-1]:
            raise Declined(f"a weight of {list(wshape)} {wm.dtype} for {xshape[-1]} classes of {xm.dtype}")
    rows = xshape[0] if len(xshape) == 2 else 1
    return _TYPES[xm.dtype], reduction, ignore, rows, xshape[-1]


def _lone(graph: FusionGraph, node: Node, op: str, outputs: int, names: tuple[str, ...]) -> tuple:
    """The checks of both kernels up to their own: the op, its outputs (the first a value), its
    operands ``names``, ``_common``'s, and the recorded outputs against torch's meta kernel.
    Returns (operands, C type, reduction, ignore_index, rows, classes)."""
    if node.op != op:
        raise Declined(f"not an {op.split('.')[1]}")
    if len(node.outputs) != outputs or node.outputs[0] is None:
        raise Declined(f"an {op.split('.')[1]} whose first output is not a value")
    a = bind(node)
    ops = _operands(graph, node, a, names)
    common = _common(graph, node, a, ops)
    # the recorded outputs are what torch's meta kernel computes from these layouts, or not believed
    check_segment_metas(graph, lone(node, tuple(dict.fromkeys(v[0] for v in ops.values()))), {})
    return (ops, *common)


def _element(ops: dict, b: str, t: str) -> str:
    """The C expression of ``x[b, t]`` (``x[t]`` of a 1-D input)."""
    _, _, xshape, xs = ops["self"]
    return f"x_[{t} * {xs[0]}]" if len(xshape) == 1 else f"x_[{b} * {xs[0]} + {t} * {xs[1]}]"


def _target(ops: dict, b: str) -> str:
    _, _, tshape, ts = ops["target"]
    return "t_[0]" if not tshape else f"t_[{b} * {ts[0]}]"


def _weight(ops: dict, t: str) -> str | None:
    return f"w_[{t} * {ops['weight'][3][0]}]" if "weight" in ops else None


def _check_target(ignore: int, classes: object, then: str) -> list[str]:
    literal = "(-9223372036854775807LL - 1)" if ignore == -(2**63) else f"{ignore}LL"  # (no literal of int64's minimum)
    return [f"    if (t == {literal}) {{ {then} }}",
            f"    if (t < 0 || t >= (long long)({classes})) {{ bad += 1; continue; }}"]


def _params(ops: dict, outputs: list[tuple[str, str, object]]) -> tuple[Param, ...]:
    params = [Param(c, ops[k][0], ops[k][1].dtype, ops[k][2], ops[k][3], False)
              for c, k in (("x_", "self"), ("t_", "target"), ("w_", "weight"), ("g_", "grad_output"),
                           ("tw_", "total_weight")) if k in ops]
    for c, value, meta in outputs:
        params.append(Param(c, value, meta.dtype, tuple(meta.shape), tuple(meta.stride), True))
    return tuple(params)


def _loop(prefix: str, lines: list[str], params: tuple[Param, ...], work: object | None) -> Kernel:
    """A loss kernel counting its targets out of range; its rows shared among threads where
    ``work`` is worth it (None: a sum in order, one thread)."""
    return loop_kernel(prefix, "nll_loss", lines, work, " reduction(+:bad)", params, "long long")


def _contiguous_scalar(meta, what: str) -> None:
    shape, _ = check_layout(meta.shape, meta.stride, what)
    if shape != ():
        raise Declined(f"{what} of {list(shape)}: a 0-D tensor is written")


def nll_loss_forward_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``aten.nll_loss_forward`` (Note [nll loss kernels])."""
    ops, ct, reduction, ignore, rows, classes = _lone(graph, node, NLL_LOSS_FORWARD, 2, ("self", "target", "weight"))
    ym, twm = node.metas[0], node.metas[1]
    yshape, ystride = check_layout(ym.shape, ym.stride, "output")
    if ym.dtype != ops["self"][1].dtype or (node.outputs[1] is not None and twm.dtype != ym.dtype):
        raise Declined(f"outputs of {ym.dtype} for an input of {ops['self'][1].dtype}")
    outputs = [("y_", node.outputs[0], ym)]
    if node.outputs[1] is not None:
        _contiguous_scalar(twm, "total weight")
        outputs.append(("tw_out", node.outputs[1], twm))
    store_tw = "tw_out[0] = total;" if node.outputs[1] is not None else "(void)total;"
    w = _weight(ops, "t")
    x = _element(ops, "b", "t")
    if reduction == "none" and len(ops["self"][2]) == 2:
        if yshape != (rows,):
            raise Declined(f"an output of {list(yshape)} for {rows} rows")
        lines = ["  long long bad = 0;",
                 f"  const {ct} total = 0;",
                 f"  {store_tw}",
                 "// loops",
                 f"  for (FUSEG_I b = 0; b < (FUSEG_I)({rows}); ++b) {{",
                 f"    const long long t = {_target(ops, 'b')};",
                 *_check_target(ignore, classes, f"y_[b * {ystride[0]}] = 0; continue;"),
                 f"    y_[b * {ystride[0]}] = -{x} * {w if w else f'({ct})1'};",
                 "  }",
                 "  return bad;"]
        return _loop("fuseg_nll_loss", lines, _params(ops, outputs), rows)
    _contiguous_scalar(ym, "output")
    weighted = w is not None
    add = ([f"    const {ct} wv = {w};", f"    lps[0] -= {x} * wv;", "    wps[0] += wv;"] if weighted
           else [f"    lps[0] -= {x};"])
    lines = [
        "  long long bad = 0, ignored = 0;",
        f"  const long long n = (long long)({rows});",
        "  if (n == 0) {",
        f"    const {ct} total = 0;",
        f"    {store_tw}",
        f"    y_[0] = {_NAN if reduction == 'mean' else '0'};",
        "    return 0;",
        "  }",
        "  long long cl = 0;",
        "  while (cl < 63 && (1LL << cl) < n) ++cl;  // ceil(log2(n))",
        "  const long long lp = cl / 8 > 4 ? cl / 8 : 4;",
        "  const long long mask0 = (1LL << lp) - 1;",
        f"  {ct} lps[{_LEVELS}] = {{0}}, wps[{_LEVELS}] = {{0}};",
        "  for (long long b = 0; b < n; ++b) {",
        f"    const long long t = {_target(ops, 'b')};",
        *_check_target(ignore, classes, "ignored += 1; continue;"),
        *add,
        f"    for (long long j = 0; j + 1 < {_LEVELS}; ++j) {{",
        "      if ((b & (mask0 << (j * lp))) != 0) break;",
        "      wps[j + 1] += wps[j]; lps[j + 1] += lps[j];",
        "      wps[j] = 0; lps[j] = 0;",
        "    }",
        "  }",
        f"  {ct} total = 0, sum = 0;",
        f"  for (int j = 0; j < {_LEVELS}; ++j) sum += lps[j];",
        (f"  for (int j = 0; j < {_LEVELS}; ++j) total += wps[j];" if weighted
         else f"  total = ({ct})(n - ignored);"),
        *(["  sum /= total;"] if reduction == "mean" else []),
        "  y_[0] = sum;",
        f"  {store_tw}",
        "  return bad;",
    ]
    return _loop("fuseg_nll_loss", lines, _params(ops, outputs), None)


def nll_loss_backward_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``aten.nll_loss_backward`` (Note [nll loss kernels])."""
    ops, ct, reduction, ignore, rows, classes = _lone(graph, node, NLL_LOSS_BACKWARD, 1,
                                                      ("self", "target", "weight", "grad_output", "total_weight"))
    xm = ops["self"][1]
    for k in ("grad_output", "total_weight"):
        if ops[k][1].dtype != xm.dtype:
            raise Declined(f"a {k} of {ops[k][1].dtype} for an input of {xm.dtype}")
    gm = node.metas[0]
    gshape, gstride = check_layout(gm.shape, gm.stride, "gradient")
    if gshape != ops["self"][2] or gm.dtype != xm.dtype or (gm.numel and not gm.is_contiguous()):
        raise Declined(f"a gradient of {list(gshape)} strides {list(gstride)}: a contiguous one of the input's shape is written")
    _, _, goshape, gos = ops["grad_output"]
    if math.prod(ops["total_weight"][2]) != 1:
        raise Declined("a total weight of more than one element")
    w = _weight(ops, "t")
    per_row = reduction == "none" and len(ops["self"][2]) == 2
    if per_row:
        if goshape != (rows,):
            raise Declined(f"a grad_output of {list(goshape)} for {rows} rows")
        value = f"-{w if w else f'({ct})1'} * g_[b * {gos[0]}]"
        head = []
    else:
        if math.prod(goshape) != 1:
            raise Declined(f"a grad_output of {list(goshape)} for a reduced loss")
        grad = "g_[0] / tw_[0]" if reduction == "mean" else "g_[0]"
        head = [f"  const {ct} grad = -({grad});"]
        value = f"{w} * grad" if w else "grad"
    at = "gi_[t]" if len(gshape) == 1 else f"gi_[b * {classes} + t]"
    lines = ["  long long bad = 0;", *head,
             "// loops",
             f"  for (FUSEG_I b = 0; b < (FUSEG_I)({rows}); ++b) {{",
             f"    for (FUSEG_I c = 0; c < (FUSEG_I)({classes}); ++c) gi_[b * {classes} + c] = ({ct})0;",
             f"    const long long t = {_target(ops, 'b')};",
             *_check_target(ignore, classes, "continue;"),
             f"    {at} = {value};",
             "  }",
             "  return bad;"]
    outputs = [("gi_", node.outputs[0], gm)]
    return _loop("fuseg_nll_loss_backward", lines, _params(ops, outputs), rows * classes)


def target_error(count: int, classes: object) -> None:
    """What a loss raises for ``count`` targets outside ``[0, classes)`` (eager's words first)."""
    raise IndexError(f"Target is out of bounds: {count} of the targets outside [0, {classes}) "
                     "and not ignore_index")
