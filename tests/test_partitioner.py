"""The fx partitioner API: our segments as fx partitions, views left as plain calls."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.operator_support import OperatorSupportBase

from runtime.partitioner import FusegPartitioner


def _program(x, w):
    h = (x * 2).sin()  # pointwise
    y = h @ w  # matmul
    return y.t(), y.softmax(-1)  # a view of y (metadata) and a normalization


def _gm():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    return make_fx(_program, tracing_mode="fake")(x, w), (x, w)


def test_partitions_are_our_segments() -> None:
    gm, _ = _gm()
    partitions = FusegPartitioner(gm).propose_partitions()
    ops = [sorted(str(n.target).split(".")[1] for n in p.nodes) for p in partitions]
    assert ops == [["mul", "sin"], ["mm"], ["_softmax"]]


def test_fused_module_matches_and_views_stay_plain_calls() -> None:
    gm, (x, w) = _gm()
    fused = FusegPartitioner(gm).partition_and_fuse()
    submodules = [n for n in fused.graph.nodes if n.op == "call_module"]
    assert len(submodules) == 3
    top_level = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert "aten.t.default" in top_level or "aten.permute.default" in top_level
    for got, want in zip(fused(x, w), _program(x, w)):
        torch.testing.assert_close(got, want)


class _NoSin(OperatorSupportBase):
    def is_node_supported(self, submodules, node) -> bool:
        return node.target is not torch.ops.aten.sin.default


def test_operator_support_policy_keeps_rejected_nodes_out() -> None:
    gm, (x, w) = _gm()
    part = FusegPartitioner(gm, operator_support=_NoSin())
    partitions = part.propose_partitions()
    assert all(n.target is not torch.ops.aten.sin.default for p in partitions for n in p.nodes)
    fused = part.fuse_partitions(partitions)
    for got, want in zip(fused(x, w), _program(x, w)):
        torch.testing.assert_close(got, want)
