"""What each segment kind accepts: the rule that judges every merge, with a reason for every no.

Note [segment kinds]: a group of ops becomes
  OPAQUE         one op that needs torch; never merged;
  MATMUL         one mm/bmm/addmm plus the views of its operands and its result (and a pointwise
                 epilogue only with ``options.matmul_epilogue``);
  POINTWISE      views, elementwise, broadcast and injective ops (slice/pad/cat as index math);
                 every materialized output has the same number of elements (one loop);
  REDUCTION      reductions over one domain (same input shape, same reduced dims), with their
                 pointwise prologue and epilogue; outputs are full-size or reduced-size;
  NORMALIZATION  a REDUCTION whose result is broadcast back and combined with full-size values
                 (softmax, layer norm, RMS norm): one persistent kernel.
Intermediates inside a kernel are computed inline, so only outputs are constrained. Views never
constrain anything: they are index math, and outputs made by a view are left to the alias pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import cast

import torch

from ..ir.graph import Arg, FusionGraph, Node
from ..ir.ops import OpKind, op_info, resolve_op
from ..ir.symbolic import SizeKey, size_key
from .options import SegmenterOptions
from .segments import SegmentKind

__all__ = ["Domain", "NodeTraits", "Traits", "combine", "node_traits", "too_big"]


@dataclass(frozen=True)
class Domain:
    """The iteration domain of a reduction: its input shape and the dims it reduces."""

    shape: tuple[SizeKey, ...]  # symbolic sizes by their expressions (size_key)
    reduced: tuple[int, ...]

    @property
    def full(self) -> SizeKey:
        return math.prod(self.shape)

    @property
    def kept(self) -> SizeKey:
        return math.prod(n for d, n in enumerate(self.shape) if d not in self.reduced)

    def __str__(self) -> str:
        return f"{list(self.shape)} over dims {list(self.reduced)}"


@dataclass(frozen=True)
class NodeTraits:
    kind: OpKind
    domain: Domain | None  # for reductions
    normalization: bool  # softmax / layer norm as one op


@dataclass(frozen=True)
class Traits:
    """What a group holds, as far as the rules care (its size is the partitioner's: see ``too_big``).
    A few distinct values cover a whole graph, so ``combine``'s answers can be memoized."""

    opaque: str | None = None  # the op, if the group is OPAQUE
    matmuls: int = 0
    computes: bool = False  # holds a non-view op other than the matmul
    domain: Domain | None = None
    normalizes: bool = False

    def kind(self) -> SegmentKind:
        if self.opaque:
            return SegmentKind.OPAQUE
        if self.matmuls:
            return SegmentKind.MATMUL
        if self.domain is not None:
            return SegmentKind.NORMALIZATION if self.normalizes else SegmentKind.REDUCTION
        return SegmentKind.POINTWISE


def _reduced_dims(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    nd = max(len(shape), 1)
    op = resolve_op(node.op)
    args: dict[str, Arg] = dict(node.kwargs)
    if isinstance(op, torch._ops.OpOverload):  # (a higher-order op has no schema, and is no reduction)
        for i, a in enumerate(op._schema.arguments):
            if i < len(node.args):
                args.setdefault(a.name, node.args[i])
    if node.op.startswith("aten.native_layer_norm"):
        normalized = args.get("normalized_shape", ())  # SymInt[]: a tuple (a graph's lists are tuples)
        k = len(normalized) if isinstance(normalized, tuple) else 1
        return tuple(range(len(shape) - k, len(shape)))
    if "batch_norm" in node.op:
        return tuple(d for d in range(len(shape)) if d != 1)
    dims = args.get("dim", None)
    if dims is None or dims == ():
        return tuple(range(len(shape)))
    # a reduction's dim is int, int[1] or int[]: a graph holds a list as a tuple
    picked = (dims,) if isinstance(dims, int) else cast(tuple[int, ...], dims)
    return tuple(sorted({d % nd for d in picked}))


@lru_cache(maxsize=4096)
def _plain_traits(op: str) -> NodeTraits:
    info = op_info(op)
    return NodeTraits(info.kind, None, info.normalization)


# Note [layer norm in low precision runs ATen's]: eager's layer norm of an fp16/bf16 tensor
# computes its mean and variance in float with ATen's Welford cascade (rows of 16-float vectors in
# chunks of 16, merged pairwise: aten/src/ATen/native/cpu/moments_utils.h; CUDA's kernel in its
# own order) and rounds its result once. A fused kernel that sums the row in another order lands
# one bf16 rounding away from eager's value at places (GPT-2, BERT and ViT in bfloat16: max
# 0.016-0.047 at values of about 8, perf/results/amd-epyc-zen4/compiled_realistic_bf16_protocol_cpu.json),
# and the rounding amplifies a last-bit difference of the float result into a half-precision
# one. Copying ATen's order would tie our bits to its vector width, to where its build fused a
# multiply and an add, and to its version. So a layer norm's forward over a half-precision input
# is OPAQUE: ATen's own op, eager's bits on every machine; its neighbours still fuse (the residual
# add before it is written out anyway, as the residual stream). In float32 and float64 it stays a
# NORMALIZATION kernel (eager's last bits are not asked for there: OpInfo's tolerances are).
_HALF = (torch.float16, torch.bfloat16)


def _runs_atens(op: str, dtype: torch.dtype) -> bool:
    """Whether an op the generator takes runs ATen's own op here instead, given its first tensor
    argument's dtype (Note [layer norm in low precision runs ATen's])."""
    return op == "aten.native_layer_norm.default" and dtype in _HALF


def node_traits(graph: FusionGraph, node: Node) -> NodeTraits:
    plain = _plain_traits(node.op)
    if plain.kind != OpKind.REDUCTION:
        return plain
    first = next((a for a in node.args if hasattr(a, "name")), None)
    meta = graph.metas[first.name] if first is not None else None
    if meta is not None and _runs_atens(node.op, meta.dtype):
        return NodeTraits(OpKind.OPAQUE, None, False)
    shape = meta.shape if meta is not None else ()
    # a domain is compared and hashed: symbolic sizes by their expressions (size_key)
    return replace(plain, domain=Domain(size_key(shape), _reduced_dims(node, shape)))


def traits_of(graph: FusionGraph, node: Node, nt: NodeTraits) -> Traits:
    if nt.kind == OpKind.OPAQUE:
        return Traits(opaque=node.op)
    if nt.kind == OpKind.MATMUL:
        return Traits(matmuls=1)
    return Traits(computes=nt.kind != OpKind.VIEW, domain=nt.domain, normalizes=nt.normalization)


def combine(
    a: Traits, b: Traits, out_numels: set[SizeKey], consumer_full_size: bool, options: SegmenterOptions
) -> Traits | str:
    """Traits of the merge of producer group ``a`` and consumer group ``b``, or why not.

    ``out_numels``: element counts of the merged group's materialized outputs;
    ``consumer_full_size``: ``b`` computes values as big as ``a``'s reduction domain (so a
    reduction in ``a`` is broadcast back: NORMALIZATION). Neither is read when either group is
    OPAQUE or holds a matmul (the partitioner relies on it and skips listing the outputs).
    """
    if a.opaque or b.opaque:
        return f"{a.opaque or b.opaque} is OPAQUE (or not supported by the backend): it runs alone on torch"
    if a.matmuls + b.matmuls > 1:
        return "a segment holds one matmul"
    if a.matmuls or b.matmuls:
        other = b if a.matmuls else a
        if other.domain is not None:
            return "a matmul does not fuse with a reduction"
        if other.computes and not (options.matmul_epilogue and a.matmuls):
            return "a matmul absorbs only views of its operands and result (pointwise epilogue: options.matmul_epilogue)"
        merged = Traits(matmuls=1, computes=a.computes or b.computes)
        return _supported(merged, options)
    if a.domain is not None and b.domain is not None and a.domain != b.domain:
        return f"reductions over different domains: {a.domain} vs {b.domain}"
    domain = a.domain or b.domain
    if domain is None:
        if len(out_numels) > 1:
            return f"outputs over different iteration spaces: {sorted(out_numels, key=str)} elements"
        merged = Traits(computes=True)
    else:
        stray = sorted(out_numels - {domain.full, domain.kept}, key=str)
        if stray:
            return (f"an output of {stray[0]} elements is neither the reduction's full size ({domain.full}) "
                    f"nor its reduced size ({domain.kept})")
        normalizes = a.normalizes or b.normalizes or (a.domain is not None and consumer_full_size)
        merged = Traits(computes=True, domain=domain, normalizes=normalizes)
    return _supported(merged, options)


def _supported(t: Traits, options: SegmenterOptions) -> Traits | str:
    kind = t.kind()
    if kind not in options.kernel_kinds:
        return f"the backend runs no {kind.name} kernels"
    return t


def too_big(size: int, options: SegmenterOptions) -> str | None:
    """Why a group of ``size`` ops may not exist, or None."""
    if options.max_ops_per_segment is not None and size > options.max_ops_per_segment:
        return f"segment would hold {size} ops, more than max_ops_per_segment={options.max_ops_per_segment}"
    return None
