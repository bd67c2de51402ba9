"""The op table: every ATen op the segmenter meets, mapped to an OpKind.

Kinds are ordered like TVM's OpPatternKind so that rules read ``kind <= OpKind.INJECTIVE`` and
the kind of a group of ops is the ``max`` of its members.

Where torch already knows a fact, the table reads it from the op schema instead of a hand list:
views are ops whose returns carry a non-writing ``alias_info``; in-place ops are
``schema.is_mutable``; pointwise and reduction ops carry ``torch.Tag.pointwise`` /
``torch.Tag.reduction``; random ops carry ``torch.Tag.nondeterministic_seeded``.
The hand-written entries below are the traps where the schema says too little or too much:

* ``_unsafe_view`` has no alias annotation but is a reshape: VIEW.
* ``clone`` carries the pointwise tag: ELEMENTWISE (a copy kernel, never a view).
* ``_softmax`` / ``_log_softmax`` / ``native_layer_norm`` carry no reduction tag but reduce.
* ``getitem`` and ``_assert_tensor_metadata`` (and friends) are not compute: dropped on capture.
* mutating custom ops reach us as ``auto_functionalized`` / ``with_effects`` higher-order ops
  with no ``alias_info``: OPAQUE, their mutation is described by their arguments.

An op that is in none of these places is OPAQUE and reported by the caller; never a crash.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import lru_cache

import torch

__all__ = [
    "HIGHER_ORDER_OPS",
    "NOT_COMPUTE",
    "OPAQUE_OPS",
    "OpInfo",
    "OpKind",
    "op_info",
    "op_name",
    "op_name_problem",
    "op_refusal",
    "resolve_op",
    "why_not_runnable",
]


class OpKind(enum.IntEnum):
    VIEW = 0
    ELEMENTWISE = 1
    BROADCAST = 2
    INJECTIVE = 3
    REDUCTION = 4
    MATMUL = 5
    OPAQUE = 6


@dataclass(frozen=True)
class OpInfo:
    name: str
    kind: OpKind
    known: bool  # False: not in the table and not classifiable from its schema
    mutates: bool = False  # in-place / out= op (never inside a FusionGraph)
    normalization: bool = False  # a reduction whose result is broadcast back (softmax, norms)
    reason: str = ""  # why OPAQUE


# Ops that are bookkeeping, not compute; capture drops them.
NOT_COMPUTE = frozenset({
    "_operator.getitem",
    "aten._assert_tensor_metadata.default",
    "aten._assert_async.default",
    "aten._assert_async.msg",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range.default",
    "aten.sym_constrain_range_for_size.default",
    "aten._functional_assert_async.msg",
    "aten._functional_assert_scalar.default",
    "aten._functional_sym_constrain_range.default",
})

# The ops that truly need torch, each with the reason (listed in the README).
OPAQUE_OPS: dict[str, str] = {
    # gather/scatter-like: data-dependent addressing
    "aten.embedding.default": "gather by index",
    "aten.index.Tensor": "gather by index",
    "aten.index_select.default": "gather by index",
    "aten.gather.default": "gather by index",
    "aten.index_put.default": "scatter by index",
    "aten.scatter.src": "scatter by index",
    "aten.scatter.value": "scatter by index",
    "aten.scatter_add.default": "scatter by index",
    "aten.scatter_reduce.two": "scatter by index",
    "aten.index_add.default": "scatter by index",
    "aten.embedding_dense_backward.default": "scatter by index",
    "aten.nll_loss_forward.default": "gather by index",
    "aten.nll_loss_backward.default": "scatter by index",
    "aten.as_strided_scatter.default": "overlapping scatter",
    "aten.nonzero.default": "data-dependent shape",
    "aten.masked_select.default": "data-dependent shape",
    "aten._local_scalar_dense.default": "reads a value to the host",
    # attention kernels
    "aten._scaled_dot_product_flash_attention_for_cpu.default": "attention kernel",
    "aten._scaled_dot_product_flash_attention.default": "attention kernel",
    "aten._scaled_dot_product_efficient_attention.default": "attention kernel",
    "aten._scaled_dot_product_cudnn_attention.default": "attention kernel",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": "attention kernel",
    "aten._scaled_dot_product_flash_attention_backward.default": "attention kernel",
    "aten._scaled_dot_product_efficient_attention_backward.default": "attention kernel",
    "aten.scaled_dot_product_attention.default": "attention kernel",
    "aten.native_layer_norm_backward.default": "layer-norm backward: reductions over different dims",
    "aten.native_group_norm_backward.default": "group-norm backward: reductions over different dims",
    # sort/scan-like
    "aten.cumsum.default": "scan",
    "aten.cumprod.default": "scan",
    "aten.sort.default": "sort",
    "aten.sort.stable": "sort",
    "aten.topk.default": "sort",
    "aten.argsort.default": "sort",
    # convolution and pooling: library kernels
    "aten.convolution.default": "library kernel (convolution)",
    "aten.max_pool2d_with_indices.default": "library kernel (pooling)",
    "aten.avg_pool2d.default": "library kernel (pooling)",
    # higher-order ops carrying custom ops (mutation described by their arguments)
    "higher_order.auto_functionalized": "custom op",
    "higher_order.auto_functionalized_v2": "custom op",
    "higher_order.with_effects": "custom op with effects",
}

_TABLE: dict[str, OpKind] = {}


def _register(kind: OpKind, *names: str) -> None:
    for n in names:
        _TABLE[n] = kind


_register(
    OpKind.VIEW,
    "aten._unsafe_view.default",  # no alias annotation in its schema, but a reshape
    "aten.view.default", "aten.reshape.default", "aten.permute.default", "aten.slice.Tensor",
    "aten.select.int", "aten.expand.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.unsqueeze.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unbind.int", "aten.alias.default",
    "aten.as_strided.default", "aten.view.dtype", "aten.t.default", "aten.transpose.int",
    "aten.diagonal.default", "aten.narrow.default", "aten.unfold.default", "aten.chunk.default",
    "aten.detach.default", "aten.lift_fresh.default",
)
_register(
    OpKind.ELEMENTWISE,
    "aten._to_copy.default",  # a cast: no pointwise tag in its schema
    # inference batch norm reads stored statistics: per element, (x - mean[c]) / sqrt(var[c] + eps)
    # * weight[c] + bias[c], no reduction (its other two outputs are empty)
    "aten._native_batch_norm_legit_no_training.default",
    "aten.clone.default", "aten.copy.default", "aten.lift_fresh_copy.default",
)
_register(
    OpKind.BROADCAST,
    "aten.full.default", "aten.full_like.default", "aten.scalar_tensor.default",
    "aten.zeros.default", "aten.zeros_like.default", "aten.ones.default", "aten.ones_like.default",
    "aten.new_full.default", "aten.new_zeros.default", "aten.new_ones.default",
    "aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
    "aten.new_empty.default", "aten.new_empty_strided.default", "aten.expand_copy.default",
)
_register(
    OpKind.INJECTIVE,
    "aten.cat.default", "aten.constant_pad_nd.default", "aten.arange.default",
    "aten.arange.start", "aten.arange.start_step", "aten.iota.default", "aten.flip.default",
    "aten.roll.default", "aten.repeat.default", "aten.triu.default", "aten.tril.default",
    "aten.slice_scatter.default", "aten.select_scatter.default", "aten.diagonal_scatter.default",
    "aten.slice_backward.default", "aten.select_backward.default",
    "aten.permute_copy.default", "aten.view_copy.default", "aten.slice_copy.Tensor",
    "aten.stack.default",
)
_register(
    OpKind.REDUCTION,
    "aten._softmax.default", "aten._log_softmax.default", "aten.native_layer_norm.default",
    "aten.native_group_norm.default", "aten._native_batch_norm_legit_functional.default",
    "aten._native_batch_norm_legit.no_stats",
    "aten.max.dim", "aten.min.dim", "aten.argmax.default", "aten.argmin.default",
    "aten.logsumexp.default", "aten.linalg_vector_norm.default",
    "aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default",
)
_register(
    OpKind.MATMUL,
    "aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default",
    "aten.linear.default", "aten.matmul.default", "aten.addmv.default", "aten.mv.default",
    "aten.dot.default",
)

_NORMALIZATION = frozenset({
    "aten._softmax.default", "aten._log_softmax.default", "aten.native_layer_norm.default",
    "aten.native_group_norm.default", "aten._native_batch_norm_legit_functional.default",
    "aten._native_batch_norm_legit.no_stats",
    "aten._softmax_backward_data.default", "aten._log_softmax_backward_data.default",
})


def op_name(target: object) -> str:
    """The table's name for an fx call_function target (``aten.add.Tensor``)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or "builtins"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


# Note [op names are data]: an op name in a graph file is looked up, never followed. torch.ops is a
# module whose attributes include ``load_library`` and ``import_module``, and whose lookups make
# up namespaces on demand, so ``getattr`` along a dotted name reaches arbitrary callables. A name
# resolves only if it is ``namespace.op.overload`` (identifiers, no dunder namespace or overload),
# the dispatcher itself has that schema (not a TorchScript-only op such as ``aten.save``), and the
# objects found are an ``_OpNamespace``, an ``OpOverloadPacket`` and an ``OpOverload``; or if it is
# one of the higher-order ops below. Ops that reach outside the graph's tensors (files, printing,
# the profiler, other processes) are refused even though torch has them: see ``op_refusal``.
HIGHER_ORDER_OPS = frozenset({"auto_functionalized", "auto_functionalized_v2", "with_effects"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_OP_NAME = 256
# Namespaces whose ops talk to other processes, the profiler or the TorchScript runtime.
_OUTSIDE_NAMESPACES = frozenset({"prim", "profiler", "c10d", "_c10d_functional", "_c10d_functional_autograd",
                                 "symm_mem", "debugprims", "debug_mode_ops", "_dtensor"})
# String arguments that pick a mode of the computation. Any other string argument (a file name,
# a message to print, a process group, a profiler range) reaches outside: its op is refused.
_MODE_STRINGS = frozenset({
    "approximate", "reduce", "rounding_mode", "mode", "interpolation", "padding", "padding_side", "equation",
    "indexing", "UPLO", "ord", "p", "pad_mode", "side", "norm", "driver", "assert_msg", "api_name",
    "attr", "binary_attr", "unary_attr", "unary_algorithm", "post_op_name", "post_op_algorithm",
    "binary_post_op", "unary_post_op", "unary_post_op_algorithm", "reduction", "acc_policy",
})


def op_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be an op name at all (None: it is well formed). Well formed is
    ``namespace.op.overload`` or ``higher_order.op``, of identifiers, with no dunder namespace or
    overload (an op itself may be a dunder: ``aten.__and__.Tensor``)."""
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if len(name) > _MAX_OP_NAME:
        return f"op name of {len(name)} characters (at most {_MAX_OP_NAME})"
    parts = name.split(".")
    shape_ok = len(parts) == 3 or (len(parts) == 2 and parts[0] == "higher_order")
    if not shape_ok or not all(_IDENT.fullmatch(p) for p in parts):
        return f"{name!r} is not an op name (namespace.op.overload, each an identifier)"
    if parts[0].startswith("__") or parts[-1].startswith("__"):
        return f"{name!r} is not an op name (a dunder namespace or overload)"
    return None


def op_refusal(name: str) -> str | None:
    """Why an op torch has may still not run from a graph (None: it may)."""
    ns = name.split(".")[0]
    if ns in _OUTSIDE_NAMESPACES:
        return f"{name}: ops of namespace {ns!r} reach outside the graph's tensors"
    op = resolve_op(name, checked=False)
    if isinstance(op, torch._ops.OpOverload):
        for a in op._schema.arguments:
            if "str" in str(a.type) and a.name not in _MODE_STRINGS:
                return f"{name}: its string argument {a.name!r} reaches outside the graph's tensors"
    return None


def why_not_runnable(name: str) -> str:
    """Why ``resolve_op(name)`` is None, for an error message: the name's problem, the op's
    refusal, or that torch has no such op."""
    return op_name_problem(name) or op_refusal(name) or f"op {name} is not known to torch"


def _find_overload(ns: str, op: str, overload: str) -> torch._ops.OpOverload | None:
    qualified = f"{ns}::{op}"
    try:  # the dispatcher's own table: no Python attribute is touched yet
        torch._C._dispatch_find_schema_or_throw(qualified, "" if overload == "default" else overload)
    except RuntimeError:
        return None
    namespace = vars(torch.ops).get(ns)
    if namespace is None:
        if hasattr(type(torch.ops), ns):  # a method of torch.ops, not a namespace
            return None
        namespace = getattr(torch.ops, ns)  # makes the namespace: the dispatcher has ops in it
    if not isinstance(namespace, torch._ops._OpNamespace):
        return None
    packet = vars(namespace).get(op)
    if packet is None:
        if hasattr(type(namespace), op):
            return None
        try:
            packet = getattr(namespace, op)
        except AttributeError:
            return None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    try:
        found = getattr(packet, overload)
    except AttributeError:
        return None
    return found if isinstance(found, torch._ops.OpOverload) else None


@lru_cache(maxsize=4096)  # bounded: a hostile file may hold a million distinct names
def resolve_op(name: str, checked: bool = True) -> torch._ops.OpOverload | torch._ops.HigherOrderOperator | None:
    """``aten.add.Tensor`` -> torch.ops.aten.add.Tensor; None for anything that is not an op
    torch has, or (``checked``) an op refused by ``op_refusal``. See Note [op names are data]."""
    if op_name_problem(name) is not None:
        return None
    parts = name.split(".")
    if len(parts) == 2:
        if parts[1] not in HIGHER_ORDER_OPS:
            return None
        found = vars(torch.ops.higher_order).get(parts[1]) or torch._ops._higher_order_ops.get(parts[1])
        return found if isinstance(found, torch._ops.HigherOrderOperator) else None
    found = _find_overload(*parts)
    if found is None or (checked and op_refusal(name) is not None):
        return None
    return found


@lru_cache(maxsize=4096)
def op_info(name: str) -> OpInfo:
    """Classify an op by name. Unknown ops are OPAQUE with ``known=False``, never an error."""
    if name in OPAQUE_OPS:
        return OpInfo(name, OpKind.OPAQUE, True, reason=OPAQUE_OPS[name])
    op = resolve_op(name)
    if op is not None and not isinstance(op, torch._ops.OpOverload):
        return OpInfo(name, OpKind.OPAQUE, False, reason="higher-order op")
    if op is not None:
        schema = op._schema
        writes = any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)
        if schema.is_mutable or writes:
            return OpInfo(name, OpKind.OPAQUE, True, mutates=True, reason="mutates its arguments")
        if torch.Tag.nondeterministic_seeded in op.tags:
            return OpInfo(name, OpKind.OPAQUE, True, reason="random")
    if name in _TABLE:
        return OpInfo(name, _TABLE[name], True, normalization=name in _NORMALIZATION)
    if op is None:
        return OpInfo(name, OpKind.OPAQUE, False, reason="unknown op")
    if any(r.alias_info is not None for r in op._schema.returns):
        return OpInfo(name, OpKind.VIEW, True)
    if torch.Tag.pointwise in op.tags:
        return OpInfo(name, OpKind.ELEMENTWISE, True)
    if torch.Tag.reduction in op.tags:
        return OpInfo(name, OpKind.REDUCTION, True)
    return OpInfo(name, OpKind.OPAQUE, False, reason="not in the op table")
