"""The op table: kinds from schemas and tags, with the known traps handled."""

from __future__ import annotations

import pytest

from segmenter import OPAQUE_OPS, OpKind, op_info
from segmenter.ir.ops import NOT_COMPUTE

TABLE = [
    # op, kind, why this row matters
    ("aten.view.default", OpKind.VIEW, "alias_info on its return"),
    ("aten.slice.Tensor", OpKind.VIEW, "alias_info on its return"),
    ("aten.split_with_sizes.default", OpKind.VIEW, "returns a list of aliases"),
    ("aten._unsafe_view.default", OpKind.VIEW, "trap: no alias annotation, still a reshape"),
    ("aten.clone.default", OpKind.ELEMENTWISE, "trap: pointwise tag, a copy, never a view"),
    ("aten._to_copy.default", OpKind.ELEMENTWISE, "a cast without the pointwise tag"),
    ("aten.add.Tensor", OpKind.ELEMENTWISE, "pointwise tag"),
    ("aten.where.self", OpKind.ELEMENTWISE, "pointwise tag"),
    ("aten.full.default", OpKind.BROADCAST, "a scalar broadcast to a shape"),
    ("aten.cat.default", OpKind.INJECTIVE, "index math"),
    ("aten.constant_pad_nd.default", OpKind.INJECTIVE, "index math"),
    ("aten.slice_scatter.default", OpKind.INJECTIVE, "functionalized slice write"),
    ("aten.sum.dim_IntList", OpKind.REDUCTION, "reduction tag"),
    ("aten.any.dim", OpKind.REDUCTION, "reduction tag"),
    ("aten._softmax.default", OpKind.REDUCTION, "trap: no reduction tag"),
    ("aten.native_layer_norm.default", OpKind.REDUCTION, "reduces without the tag"),
    ("aten.addmm.default", OpKind.MATMUL, "cuBLAS-class"),
    ("aten.bmm.default", OpKind.MATMUL, "cuBLAS-class"),
    ("aten.embedding.default", OpKind.OPAQUE, "gather"),
    ("aten.cumsum.default", OpKind.OPAQUE, "scan"),
    ("aten.native_dropout.default", OpKind.OPAQUE, "random (nondeterministic_seeded tag)"),
    ("aten.rand_like.default", OpKind.OPAQUE, "random"),
    ("higher_order.auto_functionalized", OpKind.OPAQUE, "mutating custom op"),
]


@pytest.mark.parametrize("op,kind,why", TABLE, ids=[r[0] for r in TABLE])
def test_op_kind(op: str, kind: OpKind, why: str) -> None:
    info = op_info(op)
    assert info.kind == kind, why
    assert info.known


def test_kinds_are_ordered_for_max() -> None:
    assert OpKind.VIEW < OpKind.ELEMENTWISE < OpKind.BROADCAST < OpKind.INJECTIVE < OpKind.REDUCTION
    assert OpKind.REDUCTION < OpKind.MATMUL < OpKind.OPAQUE
    assert max(OpKind.ELEMENTWISE, OpKind.INJECTIVE) == OpKind.INJECTIVE


@pytest.mark.parametrize("op", ["aten.add_.Tensor", "aten.copy_.default", "aten.mul.out"])
def test_mutation_read_from_schema(op: str) -> None:
    info = op_info(op)
    assert info.mutates and info.kind == OpKind.OPAQUE


def test_normalization_flag() -> None:
    assert op_info("aten._softmax.default").normalization
    assert not op_info("aten.sum.dim_IntList").normalization


def test_unknown_op_is_opaque_not_an_error() -> None:
    info = op_info("mylib.frobnicate.default")
    assert info.kind == OpKind.OPAQUE and not info.known and info.reason


def test_bookkeeping_ops_are_not_compute() -> None:
    assert "aten._assert_tensor_metadata.default" in NOT_COMPUTE
    assert "_operator.getitem" in NOT_COMPUTE


def test_every_listed_opaque_op_has_a_reason() -> None:
    assert all(reason for reason in OPAQUE_OPS.values())
