"""The segmenter: tables of small programs with the segments they must give."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perf import zoo
from segmenter import FusionGraph, GraphInput, Node, OpKind, TensorMeta, ValueRef, op_info
from segmenter.capturing.from_torch import capture
from segmenter.capturing.meta import propagate_metas
from segmenter.partition.greedy import segment
from segmenter.partition.options import SegmenterOptions
from segmenter.partition.rules import node_traits
from segmenter.partition.segments import SegmentedFusion, SegmentKind

P, R, N, M, OP = (SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION,
                 SegmentKind.MATMUL, SegmentKind.OPAQUE)


def _chain(x):
    return ((x * 2).sin() + 1).exp()


def _softmax_by_hand(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _layer_norm_by_hand(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + 1e-5) * w + b


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _two_axes(x):
    return x.sum(0), x.sum(1)


def _reduce_then_reduce(x):
    return x.exp().sum(1).sum(0)


def _sum_with_epilogue(x):
    return (x * 2).sum(-1).sqrt()


def _opaque_cut(x):
    return torch.cumsum(x.sin(), 0).cos()


def _cat_slices(x):
    return torch.cat((x[:, :2].sin(), x[:, 2:]), 1) * 2


def _pad(x):
    return F.pad(x.exp(), (1, 1)) + 1


def _diamond(x, w):
    a = x.exp()
    return a + a @ w


def _conv_bn_relu6_residual(x, w, m, v, g, b):
    y = F.conv2d(x, w, padding=1)
    return F.conv2d(F.hardtanh(F.batch_norm(y, m, v, g, b, eps=1e-3), 0.0, 6.0) + x, w, padding=1)


_lin = torch.nn.Linear(8, 16)

# name, program, inputs, expected segment kinds in execution order
TABLE = [
    ("pointwise-chain", _chain, lambda: [torch.randn(4, 8)], [P]),
    ("softmax", lambda x: torch.softmax(x, -1), lambda: [torch.randn(4, 8)], [N]),
    ("softmax-by-hand", _softmax_by_hand, lambda: [torch.randn(4, 8)], [N]),
    ("layer-norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), lambda: [torch.randn(4, 8), torch.randn(8), torch.randn(8)], [N]),
    ("layer-norm-by-hand", _layer_norm_by_hand, lambda: [torch.randn(4, 8), torch.randn(8), torch.randn(8)], [N]),
    ("rms-norm", _rms_norm, lambda: [torch.randn(4, 8), torch.randn(8)], [N]),
    ("two-reductions-different-axes", _two_axes, lambda: [torch.randn(4, 8)], [R, R]),
    ("reduction-of-a-reduction", _reduce_then_reduce, lambda: [torch.randn(4, 8)], [R, R]),
    ("reduction-with-prologue-and-epilogue", _sum_with_epilogue, lambda: [torch.randn(4, 8)], [R]),
    ("linear-3d-is-one-matmul", _lin, lambda: [torch.randn(2, 3, 8)], [M]),
    ("opaque-cuts", _opaque_cut, lambda: [torch.randn(4, 8)], [P, OP, P]),
    ("cat-of-slices-joins", _cat_slices, lambda: [torch.randn(4, 8)], [P]),
    ("pad-joins", _pad, lambda: [torch.randn(4, 8)], [P]),
    ("diamond-through-matmul", _diamond, lambda: [torch.randn(8, 8), torch.randn(8, 8)], [P, M, P]),
    # inference batch norm reads stored statistics: pointwise, one kernel with ReLU6 and the residual
    ("conv-bn-relu6-residual", _conv_bn_relu6_residual,
     lambda: [torch.randn(2, 4, 5, 5), torch.randn(4, 4, 3, 3), torch.randn(4), torch.rand(4) + 0.5, torch.randn(4),
              torch.randn(4)], [OP, P, OP]),
]


@pytest.mark.parametrize("name,fn,make_inputs,kinds", TABLE, ids=[t[0] for t in TABLE])
def test_segment_table(name, fn, make_inputs, kinds) -> None:
    graph = capture(fn, make_inputs())
    sf = segment(graph)
    assert [s.kind for s in sf.segments] == kinds, _listing(sf)
    check_segmentation(sf)


def test_linear_absorbs_its_views() -> None:
    sf = segment(capture(_lin, [torch.randn(2, 3, 8)]))
    ops = [n.op for n in sf.segments[0].nodes]
    assert "aten.addmm.default" in ops and "aten.permute.default" in ops and "aten.view.default" in ops


def test_diamond_is_cut_with_a_cycle_reason() -> None:
    sf = segment(capture(_diamond, [torch.randn(8, 8), torch.randn(8, 8)]))
    reasons = {(b.producer, b.consumer): b.reason for b in sf.boundaries}
    assert "cycle" in reasons[(0, 2)]
    assert "matmul" in reasons[(0, 1)]


def test_rope_seed_is_one_pointwise_kernel_at_the_floor() -> None:
    fn, inputs = zoo.get("rope-seed").factory()
    sf = segment(capture(fn, inputs))
    assert [s.kind for s in sf.segments] == [P]
    stats = sf.stats()
    assert stats["bytes_moved"] == stats["bytes_floor"]


def test_max_ops_per_segment_forces_cuts() -> None:
    graph = capture(_chain, [torch.randn(4, 8)])
    sf = segment(graph, SegmenterOptions(max_ops_per_segment=1))
    assert len(sf.segments) == len(graph.nodes)
    assert all("max_ops_per_segment" in b.reason for b in sf.boundaries)


def test_fuel_bisects_merges() -> None:
    graph = capture(_chain, [torch.randn(4, 8)])
    assert len(segment(graph, SegmenterOptions(fuel=0)).segments) == len(graph.nodes)
    assert len(segment(graph, SegmenterOptions(fuel=1)).segments) == len(graph.nodes) - 1
    assert segment(graph, SegmenterOptions(fuel=0)).boundaries[0].reason == "not tried: out of fuel"


def test_backend_without_normalization_kernels() -> None:
    graph = capture(_softmax_by_hand, [torch.randn(4, 8)])
    sf = segment(graph, SegmenterOptions(kernel_kinds=frozenset({P, R, M})))
    assert N not in {s.kind for s in sf.segments}
    assert any("NORMALIZATION" in b.reason for b in sf.boundaries)


def test_deterministic() -> None:
    model, inputs = zoo.get("llama-tiny").factory()
    graph = capture(model, inputs)
    assert segment(graph) == segment(graph)


def test_stats_definitions() -> None:
    model, inputs = zoo.get("gpt2-tiny").factory()
    sf = segment(capture(model, inputs))
    s = sf.stats()
    assert s["launches"] == s["kernels"] + s["opaque"]
    assert s["segments"] == s["launches"] + s["metadata"]
    assert s["bytes_moved"] >= s["bytes_floor"] > 0
    assert s["opaque"] == sum(op_info(n.op).kind == OpKind.OPAQUE for n in sf.graph.nodes)


def _listing(sf: SegmentedFusion) -> str:
    return "\n".join(f"{s.kind.name}: {[n.op for n in s.nodes]}" for s in sf.segments)


# -- an independent check of every segmentation ---------------------------------------------------

def check_segmentation(sf: SegmentedFusion) -> None:
    """Every node in exactly one segment, segments in a valid order, each obeying its kind."""
    graph = sf.graph
    names = [n.name for s in sf.segments for n in s.nodes]
    assert sorted(names) == sorted(n.name for n in graph.nodes)
    made_by = {o: s.index for s in sf.segments for n in s.nodes for o in n.outputs if o is not None}
    for s in sf.segments:
        for v in s.inputs:  # produced by an earlier segment, or a graph input
            assert v in graph.input_names or made_by[v] < s.index, (v, s.index)
        kinds = [op_info(n.op).kind for n in s.nodes]
        if s.kind == OP:
            assert len(s.nodes) == 1 and kinds == [OpKind.OPAQUE]
            continue
        assert OpKind.OPAQUE not in kinds
        if s.kind == M:
            assert kinds.count(OpKind.MATMUL) == 1
            assert all(k in (OpKind.MATMUL, OpKind.VIEW) for k in kinds)
            continue
        assert OpKind.MATMUL not in kinds
        view_made = {o for n in s.nodes if op_info(n.op).kind == OpKind.VIEW for o in n.outputs}
        numels = {graph.metas[o].numel for o in s.outputs if o not in view_made}
        domains = {node_traits(graph, n).domain for n in s.nodes if op_info(n.op).kind == OpKind.REDUCTION}
        if s.kind == P:
            assert not domains and len(numels) <= 1
        else:
            assert len(domains) == 1
            (d,) = domains
            assert numels <= {math.prod(d.shape), d.kept}


# -- property: random DAGs --------------------------------------------------------------------------

_UNARY = ["aten.sin.default", "aten.exp.default", "aten.neg.default"]
_BINARY = ["aten.add.Tensor", "aten.mul.Tensor"]


@st.composite
def random_graphs(draw: st.DrawFn) -> FusionGraph:
    n = draw(st.sampled_from([2, 3, 4]))
    meta = TensorMeta((n, n), (n, 1), 0, torch.float32)
    inputs = tuple(GraphInput(f"in{i}", meta) for i in range(draw(st.integers(1, 3))))
    values = [i.name for i in inputs]
    nodes = []
    for k in range(draw(st.integers(1, 14))):
        pick = st.sampled_from(values)
        choice = draw(st.sampled_from(["unary", "binary", "sum", "mm", "t", "cumsum"]))
        name = f"v{k}"
        if choice == "unary":
            node = Node(name, draw(st.sampled_from(_UNARY)), (ValueRef(draw(pick)),), (), (name,), (meta,))
        elif choice == "binary":
            op = draw(st.sampled_from(_BINARY))
            node = Node(name, op, (ValueRef(draw(pick)), ValueRef(draw(pick))), (), (name,), (meta,))
        elif choice == "sum":  # reduce, then broadcast back so every value stays [n, n]
            red = f"r{k}"
            dim = draw(st.sampled_from([0, 1, -1]))
            nodes.append(Node(red, "aten.sum.dim_IntList", (ValueRef(draw(pick)), (dim,), True), (), (red,), (meta,)))
            node = Node(name, "aten.add.Tensor", (ValueRef(draw(pick)), ValueRef(red)), (), (name,), (meta,))
        elif choice == "mm":
            node = Node(name, "aten.mm.default", (ValueRef(draw(pick)), ValueRef(draw(pick))), (), (name,), (meta,))
        elif choice == "t":
            node = Node(name, "aten.permute.default", (ValueRef(draw(pick)), (1, 0)), (), (name,), (meta,))
        else:
            node = Node(name, "aten.cumsum.default", (ValueRef(draw(pick)), 0), (), (name,), (meta,))
        nodes.append(node)
        values.append(name)
    outs = draw(st.lists(st.sampled_from(values[len(inputs):]), min_size=1, max_size=3, unique=True))
    return propagate_metas(FusionGraph(inputs, tuple(nodes), tuple(outs)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.booleans(), st.sampled_from([None, 1, 3]))
def test_random_dags_segment_into_valid_acyclic_segments(graph: FusionGraph, horizontal: bool, max_ops) -> None:
    sf = segment(graph, SegmenterOptions(allow_horizontal=horizontal, max_ops_per_segment=max_ops))
    check_segmentation(sf)
    if max_ops is not None:
        assert all(len(s.nodes) <= max_ops for s in sf.segments)
