"""Small float32 attention as generated C++ kernels (the CPU target only).

Note [attention kernels]: under torch.compile, a transformer's ``scaled_dot_product_attention``
reaches us as ATen's ``_scaled_dot_product_flash_attention_for_cpu``, which spends 7-11 us a
call on the bench's tiny shapes (4 heads of 16 tokens by 16 features) on this 2-core machine
kind, nearly all of it around the arithmetic: its blocked loops, buffers and threads are built
for long sequences. It was a fifth to a quarter of every tiny transformer's program. The kernel
here is the arithmetic, one head after another: the scores Q K^T into a buffer on the stack (the
loops of Note [matmul kernels]), each row scaled, masked and soft-maxed in place (max, then exp
and sum, then a multiply by 1 / sum), then P V written straight into the output's rows. A row
whose scores are all -inf (masked out whole) gets zeros and a logsumexp of 0, as ATen's CPU
kernel gives it; the logsumexp (max + log(sum), what the backward reads) is computed only where
the program uses it. Values are not ATen's bits (another summation order, another exp): the
kernel cases check them against eager within the tolerances of float32 arithmetic. A NaN score
makes its row NaN, as SDPA's math backend computes it; ATen's flash kernel drops NaN from a row's
max in ways that depend on the row's length (a query row of NaN scores comes out as zeros there).

Taken: float32 query, key and value of 4 dims with the same batch, key and value of one shape, of
the query's heads or of fewer that group them (grouped-query attention, concrete heads: query head
h reads key head h / (H / Hk)), query, key, value and output contiguous along the feature dim, no dropout, an
optional float32 additive mask of 2 or 4 dims broadcast to the scores, ``is_causal`` (keys past
the query's own index masked: ATen's top-left alignment), any ``scale`` (default 1 /
sqrt(features)), outputs in the layouts torch's meta kernel gives them, at most
``ATTENTION_SCORES`` keys (the query rows go in blocks whose scores fit that many floats on the
stack). Anything else is declined with the reason and runs on ATen. Every size is an argument of
the head's routine (Note [kernel sizes as arguments] in runtime/codegen/source/symsizes.py): under a symbolic plan the
one condition the kernel adds is that bound on the keys, which a growing cache meets for long.
Whether the kernel or ATen's is the faster for a shape is measured on the machine (Note [choices
by measurement] in runtime/autotune.py).

Heads are shared among threads where the work passes the loop threshold (a test in the kernel where
sizes are symbolic). Below it, measured inside llama-tiny's program (2 calls of 4 heads of 16 x
16 scores), waking the threads took a launch from 4.5 to 17 us, although a scratch loop of
back-to-back calls, the threads kept awake, gained 10%.

Note [attention backward kernels]: training hands the backward graph ATen's
``_scaled_dot_product_flash_attention_for_cpu_backward`` (the gradients of query, key and value
from the output's gradient, the output and the forward's logsumexp), which took 40-70 us a call
on gpt2-tiny's 8 heads of 32 x 32 scores by 16 features on this 2-core machine kind (42 us on
one thread: its threads cost more than they share). The kernel is the arithmetic, one head after
another, per block of query rows as in the forward: P = exp(scale Q K^T + mask - logsumexp) (the
forward's, so a row masked out whole, logsumexp 0, gets P = 0 and zero gradients), dP = dO V^T,
dS = P (dP - rowsum(dO * O)) scale, then dV += P^T dO, dK += dS^T Q and dQ = dS K through the
matmul routines (dK and dV zeroed first, each block adding its rows' share). Under grouped-query
attention a thread takes a key head and its group of query heads, each adding to the key's and
value's gradients. It takes what the
forward kernel takes (no dropout, float32, grouped-query heads of concrete sizes, at most
``ATTENTION_SCORES`` keys, a mask of 2 or 4 dims, the feature dim contiguous in every operand and
gradient) and all three gradients computed: a graph where only some are used declines (not done:
writing the others to scratch). Measured alone against ATen's op (Note [choices by measurement]):
at 2 x 4 heads of 128 x 128 by 64, 508-538 against 633-753 us; at 12 heads of 64 x 64 by 64,
246-270 against 312-330; at gpt2-tiny's heads 38-55 against 36-56 us, so there the verdict of
each machine decides.
"""

from __future__ import annotations

import hashlib
import math

import torch

from segmenter import FusionGraph, Node
from segmenter.ir.graph import ValueRef
from segmenter.ir.symbolic import is_symbolic

from .. import thresholds
from ..kernel import BESIDE_MARK, Kernel, Param, bind
from ..source.checks import check_layout, check_segment_metas, float_arg, lone
from ..source.ctypes_ import Declined
from ..source.gemm_prelude import ATTENTION_SCORES
from .gemm import unit_stride

__all__ = ["ATTENTION", "ATTENTION_BACKWARD", "ATTENTION_SCORES", "attention_backward_kernel", "attention_kernel"]

ATTENTION = "aten._scaled_dot_product_flash_attention_for_cpu.default"
ATTENTION_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"
_FLOAT_MAX = float(torch.finfo(torch.float32).max)


def _work(heads: int, lq: int, s: int, e: int) -> int:
    """Note [work of a loop] for the scores: an exp each (a costly call: Note [thread thresholds measured here]), and two multiply-adds
    a feature, 16 to a vector."""
    return heads * lq * s * (1 + thresholds.current().costly_call + e // 8)


def attention_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``_scaled_dot_product_flash_attention_for_cpu`` (Note
    [attention kernels])."""
    if node.op != ATTENTION:
        raise Declined("not a flash attention for the CPU")
    if len(node.outputs) != 2 or node.outputs[0] is None:
        raise Declined("an attention without its output")
    out, lse = node.outputs
    at = _Attention(graph, node, ("query", "key", "value"), [out] + ([lse] if lse is not None else []))
    (qs, qt), (ks, kt), (vs, vt) = at.layouts
    b, h, lq, e = qs
    s = ks[2]
    layouts = at.written({out: "output", lse: "logsumexp"})
    ot = layouts[out][1]
    at.contiguous_features(("query", "key", "value", "output"), (qt, kt, vt, ot))
    scale = at.scale
    params = [*at.input_params(("q_", "k_", "v_")), *at.mask_params, Param("y_", out, torch.float32, *layouts[out], True)]
    _, _, msm, msn = at.mask_strides
    osb, osh, osm, _ = ot
    lsb = lsh = lsm = 0
    if lse is not None:
        lsb, lsh, lsm = layouts[lse][1]
        params.append(Param("l_", lse, torch.float32, *layouts[lse], True))
    qsb, qsh, qsm, _ = qt
    ksb, ksh, ksn, _ = kt
    vsb, vsh, vss, _ = vt
    mptr = at.mask_pointer
    kh = "h" if at.group == 1 else f"(h / {at.group})"  # the key head of query head h
    lptr = f"l_ + b * {lsb} + h * {lsh}" if lse is not None else "nullptr"
    lines = [
        "// loops",
        f"  for (FUSEG_I bh = 0; bh < {b * h}; ++bh) {{",
        f"    const FUSEG_I b = bh / {h}, h = bh % {h};",
        f"    fuseg_attention_head({lq}, {s}, {e}, q_ + b * {qsb} + h * {qsh}, {qsm}, k_ + b * {ksb} + {kh} * {ksh}, {ksn},",
        f"      v_ + b * {vsb} + {kh} * {vsh}, {vss}, {mptr}, {msm}, {msn}, {int(at.causal)}, (float){float(scale)!r},",
        f"      y_ + b * {osb} + h * {osh}, {osm}, {lptr}, {lsm});",
        "  }",
    ]
    return _heads_kernel("fuseg_attention", lines, params, b * h, _work(b * h, lq, s, e), e)


def attention_backward_kernel(graph: FusionGraph, node: Node) -> Kernel:
    """The kernel of ``node``, a lone ``_scaled_dot_product_flash_attention_for_cpu_backward``
    (Note [attention backward kernels])."""
    if node.op != ATTENTION_BACKWARD:
        raise Declined("not a flash attention's backward for the CPU")
    if len(node.outputs) != 3 or any(o is None for o in node.outputs):
        raise Declined("an attention's backward without its three gradients")
    dq, dk, dv = node.outputs
    at = _Attention(graph, node, ("query", "key", "value", "grad_out", "out", "logsumexp"), [dq, dk, dv])
    (qs, qt), (ks, kt), (vs, vt), (gs, gt), (os_, ot), (ls, lt) = at.layouts
    b, h, lq, e = qs
    s = ks[2]
    if gs != qs or os_ != qs or ls != (b, h, lq):
        raise Declined(f"grad_out {list(gs)}, out {list(os_)} and logsumexp {list(ls)} for a query of {list(qs)}")
    layouts = at.written({dq: "grad_query", dk: "grad_key", dv: "grad_value"})
    (_, dqt), (_, dkt), (_, dvt) = layouts[dq], layouts[dk], layouts[dv]
    at.contiguous_features(("query", "key", "value", "grad_out", "out", "grad_query", "grad_key", "grad_value"),
                           (qt, kt, vt, gt, ot, dqt, dkt, dvt))
    params = [*at.input_params(("q_", "k_", "v_", "g_", "o_", "l_")), *at.mask_params]
    params += [Param(c, value, torch.float32, *layouts[value], True) for c, value in (("dq_", dq), ("dk_", dk), ("dv_", dv))]
    _, _, msm, msn = at.mask_strides
    mptr = at.mask_pointer

    def at_head(c: str, stride: tuple, head: str = "h") -> str:  # a head's first element and its row stride
        return f"{c} + b * {stride[0]} + {head} * {stride[1]}, {stride[2]}"

    # a thread per key head (each query head of its group adds to its key's and value's gradients)
    g, hk = at.group, ks[1]
    lines = [
        "// loops",
        f"  for (FUSEG_I bh = 0; bh < {b * hk}; ++bh) {{",
        f"    const FUSEG_I b = bh / {hk}, hk = bh % {hk};",
        f"    for (FUSEG_I h = hk * {g}; h < (hk + 1) * {g}; ++h)",
        f"      fuseg_attention_head_backward({lq}, {s}, {e}, {at_head('g_', gt)}, {at_head('q_', qt)},",
        f"        {at_head('k_', kt, 'hk')}, {at_head('v_', vt, 'hk')}, {at_head('o_', ot)}, {at_head('l_', lt)}, {mptr},",
        f"        {msm}, {msn}, {int(at.causal)}, (float){float(at.scale)!r}, {at_head('dq_', dqt)},",
        f"        {at_head('dk_', dkt, 'hk')}, {at_head('dv_', dvt, 'hk')}, h == hk * {g});",
        "  }",
    ]
    # (the forward's work twice over: the scores and dP, then three products)
    return _heads_kernel("fuseg_attention_backward", lines, params, b * hk, 2 * _work(b * h, lq, s, e), e)


def _heads_kernel(prefix: str, lines: list[str], params: list[Param], heads: object, work: object,
                  features: object) -> Kernel:
    """The kernel of a loop over heads (``lines``): shared among threads where ``work`` passes
    the loop threshold. It may run beside other kernels (Note [kernels side by side] in
    runtime/compiled/chains.py) where that work and each of its products (a block's scores, at most
    ``ATTENTION_SCORES``, by ``features``) stay under the beside thresholds (Note [thread
    thresholds measured here] in runtime/codegen/thresholds.py)."""
    least = thresholds.current()
    if is_symbolic(work):  # decided in the kernel, on the sizes it is called with: no condition of the plan
        lines.insert(1, f"#pragma omp parallel for schedule(static) if ({heads} > 1 && {work} >= {least.loop})")
    elif heads > 1 and work >= least.loop:  # type: ignore[operator]
        lines.insert(1, "#pragma omp parallel for schedule(static)" + (BESIDE_MARK if work < least.beside_loop else ""))
    body = "\n".join(lines) + "\n"
    digest = hashlib.sha1((body + repr([(p.name, p.value, p.shape, p.stride) for p in params])).encode()).hexdigest()[:12]
    one = not is_symbolic(features) and ATTENTION_SCORES * features < least.beside_macs  # type: ignore[operator]
    return Kernel(f"{prefix}_{digest}", tuple(params), body, 1, 1, "attention", beside=one,
                  parallel_macs=least.macs, pack_rows=(least.pack_rows, least.nn_pack_rows))


class _Attention:
    """What the forward and the backward kernel check alike: the tensor arguments (``tensors``,
    then ``attn_mask``) are values, no dropout, ``is_causal`` a bool, ``scale`` a float32 (default
    1 / sqrt(features)), float32 values, the recorded outputs torch's (``written``); query (the
    first tensor) of 4 dims, key and value of its batch, heads and features; at most
    ``ATTENTION_SCORES`` keys; a mask of 2 or 4 dims broadcast to the scores."""

    def __init__(self, graph: FusionGraph, node: Node, tensors: tuple[str, ...], outputs: list[str]) -> None:
        a = bind(node)
        self.graph = graph
        self.args = {name: a.get(name) for name in tensors}
        mask = a.get("attn_mask")
        if not all(isinstance(t, ValueRef) for t in self.args.values()) or not (mask is None or isinstance(mask, ValueRef)):
            raise Declined("an attention of something other than tensor values")
        self.mask = mask
        if float_arg(a.get("dropout_p"), "dropout_p") != 0.0:
            raise Declined("an attention with dropout (random: left to ATen)")
        causal = a.get("is_causal")
        if not isinstance(causal, bool):
            raise Declined(f"is_causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        scale = a.get("scale")
        if scale is not None:
            scale = float_arg(scale, "scale")
            if abs(scale) > _FLOAT_MAX:
                raise Declined(f"scale = {scale}: not a float32")
        inputs = [t.name for t in (*self.args.values(), mask) if t is not None]
        # the recorded outputs are the op's, or not believed (and torch checks the arguments)
        self.env = check_segment_metas(graph, lone(node, tuple(dict.fromkeys(inputs))), {})
        if any(graph.metas[t].dtype != torch.float32 for t in inputs + outputs):
            raise Declined("an attention not of float32 values (the generator takes float32)")
        self.layouts = [check_layout(graph.metas[t.name].shape, graph.metas[t.name].stride, f"%{t.name}")
                        for t in self.args.values()]
        by_name = dict(zip(self.args, self.layouts))
        (qs, _), (ks, _), (vs, _) = by_name["query"], by_name["key"], by_name["value"]
        if not len(qs) == len(ks) == len(vs) == 4:
            raise Declined("query, key and value not of 4 dims")
        b, h, lq, e = qs
        s = ks[2]
        hk = ks[1]
        if ks != (b, hk, s, e) or vs != ks:
            raise Declined(f"key {list(ks)} and value {list(vs)} for a query of {list(qs)}: the kernel takes one "
                           "batch and feature size for all three, and one shape for key and value")
        #: query heads per key head (grouped-query attention: each group of query heads reads one)
        self.group = 1
        if hk != h:
            if is_symbolic(h) or is_symbolic(hk) or hk <= 0 or h % hk:
                raise Declined(f"key {list(ks)} for a query of {list(qs)}: heads that do not group the query's "
                               "(or grouped-query attention of symbolic heads)")
            self.group = h // hk
        if 0 in qs or s == 0:
            raise Declined("an empty attention")
        if s > ATTENTION_SCORES:  # (under a symbolic plan, a condition on the keys: a wide one)
            raise Declined(f"{s} keys: more than a row of scores the kernel keeps ({ATTENTION_SCORES}); ATen's blocked kernel")
        self.scale = 1.0 / math.sqrt(e) if scale is None else scale
        self.mask_params: list[Param] = []
        self.mask_strides: tuple = (0, 0, 0, 0)
        if mask is not None:
            ms, mt = check_layout(graph.metas[mask.name].shape, graph.metas[mask.name].stride, f"mask %{mask.name}")
            if len(ms) not in (2, 4):
                raise Declined(f"a mask of {len(ms)} dims (2 or 4 are taken)")
            full = (b, h, lq, s)[4 - len(ms):]
            if any(n not in (1, f) for n, f in zip(ms, full)):
                raise Declined(f"a mask of {list(ms)} for scores of {[b, h, lq, s]}")
            # a dim of size 1 is broadcast: stride 0
            self.mask_strides = (0,) * (4 - len(ms)) + tuple(st if n > 1 else 0 for n, st in zip(ms, mt))
            self.mask_params.append(Param("m_", mask.name, torch.float32, ms, mt, False))

    def input_params(self, names: tuple[str, ...]) -> list[Param]:
        """The tensor arguments as the kernel's inputs, named ``names`` in order."""
        return [Param(c, t.name, torch.float32, *layout, False)
                for c, t, layout in zip(names, self.args.values(), self.layouts)]

    @property
    def mask_pointer(self) -> str:
        """The mask's first element for head ``h`` of batch ``b`` (``nullptr``: no mask)."""
        msb, msh, _, _ = self.mask_strides
        return f"m_ + b * {msb} + h * {msh}" if self.mask is not None else "nullptr"

    def written(self, what: dict[str | None, str]) -> dict[str, tuple[tuple, tuple]]:
        """The layouts of the outputs (value -> what it is; None: not computed), each torch's."""
        layouts = {}
        for value, name in what.items():
            if value is None:
                continue
            m = self.graph.metas[value]
            shape, stride = check_layout(m.shape, m.stride, f"{name} %{value}")
            want = self.env[value]
            # (a dim of size 1 is never stepped along: its stride does not matter)
            if shape != tuple(want.shape) or any(n > 1 and st != w for n, st, w in zip(shape, stride, want.stride())):
                raise Declined(f"{name} %{value} recorded as {list(shape)} / {list(stride)}: torch's meta kernel "
                               f"gives {list(want.shape)} / {list(want.stride())}")
            layouts[value] = (shape, stride)
        return layouts

    def contiguous_features(self, names: tuple[str, ...], strides: tuple[tuple, ...]) -> None:
        """Declined unless each of these (query-shaped or key-shaped) steps by one along the features."""
        qs = self.layouts[0][0]
        if not all(unit_stride(qs, st, 3) for st in strides):
            raise Declined(f"{' / '.join(names)} of strides {' / '.join(str(list(st)) for st in strides)}: "
                           "the kernel reads and writes them contiguous along the features")
