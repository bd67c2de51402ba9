"""The IR: frozen values, invariants with messages that name the problem, meta propagation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from segmenter import Alias, FusionGraph, GraphError, GraphInput, Mutation, Node, TensorMeta, ValueRef
from segmenter.capturing.meta import meta_mismatches, propagate_metas

F32 = torch.float32


def meta(*shape: int, stride: tuple[int, ...] | None = None, offset: int = 0) -> TensorMeta:
    if stride is None:
        stride = tuple(torch.empty(shape, device="meta").stride())
    return TensorMeta(tuple(shape), stride, offset, F32)


def node(name: str, op: str, *args, out: str | None = None, m: TensorMeta | None = None) -> Node:
    return Node(name, op, tuple(args), (), (out or name,), (m or meta(4, 8),))


X = GraphInput("x", meta(4, 8))


def chain() -> FusionGraph:
    return FusionGraph(
        inputs=(X,),
        nodes=(
            node("s", "aten.slice.Tensor", ValueRef("x"), 1, 2, 6, m=meta(4, 4, stride=(8, 1), offset=2)),
            node("m", "aten.mul.Tensor", ValueRef("s"), 2.0, m=meta(4, 4)),
        ),
        outputs=("m",),
    )


def test_a_small_graph_is_valid_and_frozen() -> None:
    g = chain()
    assert g.input_names == ("x",)
    assert [n.op for n in g.users["s"]] == ["aten.mul.Tensor"]
    assert g.producers["m"].name == "m"
    assert g.inputs[0].storage == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.outputs = ()  # type: ignore[misc]


BAD = [
    ("no outputs", dict(outputs=()), "has no outputs"),
    ("undefined value", dict(nodes=(node("m", "aten.mul.Tensor", ValueRef("nope"), 2.0),), outputs=("m",)),
     "undefined value %nope"),
    ("use before def", dict(nodes=(node("a", "aten.neg.default", ValueRef("b")),
                                   node("b", "aten.neg.default", ValueRef("a"))), outputs=("b",)),
     "uses %b before node 'b' defines it"),
    ("in-place node", dict(nodes=(node("a", "aten.add_.Tensor", ValueRef("x"), 1),), outputs=("a",)),
     "graphs are functional"),
    ("duplicate value", dict(nodes=(node("x", "aten.neg.default", ValueRef("x")),), outputs=("x",)),
     "defined twice"),
    ("undefined output", dict(outputs=("zzz",)), "outputs[0]: undefined value %zzz"),
    ("alias to a later output", dict(output_aliases=(Alias("output", 0),)), "not an earlier output"),
    ("alias to a missing input", dict(output_aliases=(Alias("input", 3),)), "no input 3"),
    ("mutation of a wrong shape", dict(
        nodes=(node("s", "aten.sum.default", ValueRef("x"), m=TensorMeta((), (), 0, F32)),),
        outputs=("s",), mutations=(Mutation(0, "s"),)), "cannot be written into input"),
    ("written back twice", dict(
        nodes=(node("n", "aten.neg.default", ValueRef("x")),), outputs=("n",),
        mutations=(Mutation(0, "n"), Mutation(0, "n"))), "written back twice"),
]


@pytest.mark.parametrize("name,fields,message", BAD, ids=[b[0] for b in BAD])
def test_invariants_name_the_problem(name: str, fields: dict, message: str) -> None:
    base = dict(inputs=(X,), nodes=(node("n", "aten.neg.default", ValueRef("x")),), outputs=("n",))
    base.update(fields)
    with pytest.raises(GraphError) as err:
        FusionGraph(**base)
    assert message in str(err.value)


def test_tensor_meta_bad_rank() -> None:
    with pytest.raises(GraphError, match="differ in rank"):
        TensorMeta((2, 3), (1,), 0, F32)


@pytest.mark.parametrize(
    "m,extent,distinct",
    [
        (TensorMeta((4, 8), (8, 1), 0, F32), 32, 32),
        (TensorMeta((4, 4), (8, 1), 2, F32), 30, 16),  # a column slice
        (TensorMeta((3, 5), (0, 1), 0, F32), 5, 5),  # expanded: stride 0 counts once
        (TensorMeta((0, 5), (5, 1), 7, F32), 7, 0),  # empty
    ],
)
def test_tensor_meta_extent_and_distinct_elements(m: TensorMeta, extent: int, distinct: int) -> None:
    assert m.storage_extent == extent
    assert m.distinct_elements == distinct
    assert m.nbytes == 4 * distinct


def test_same_layout_ignores_unobservable_strides() -> None:
    a = TensorMeta((1, 4), (64, 1), 0, F32)
    assert a.same_layout(TensorMeta((1, 4), (4, 1), 0, F32))
    assert not a.same_layout(TensorMeta((1, 4), (4, 2), 0, F32))


def test_propagation_recomputes_metas_and_finds_contradictions() -> None:
    g = chain()
    assert meta_mismatches(g) == []
    wrong = dataclasses.replace(g.nodes[0], metas=(meta(4, 4),))  # says contiguous, offset 0
    bad = dataclasses.replace(g, nodes=(wrong, g.nodes[1]))
    problems = meta_mismatches(bad)
    assert len(problems) == 1 and "'s'" in problems[0] and "offset=2" in problems[0]
    assert propagate_metas(bad) == g


def test_propagation_keeps_shared_storage_offsets() -> None:
    base = GraphInput("base", meta(4, 8), storage=0)
    part = GraphInput("part", meta(2, 8, offset=16), storage=0)
    g = FusionGraph(
        inputs=(base, part),
        nodes=(node("v", "aten.select.int", ValueRef("part"), 0, 1, m=TensorMeta((8,), (1,), 999, F32)),),
        outputs=("v",),
    )
    assert propagate_metas(g).metas["v"] == TensorMeta((8,), (1,), 24, F32)


def test_propagation_of_a_cuda_graph_on_a_cpu_machine() -> None:
    m = dataclasses.replace(meta(4, 8), device="cuda:0")
    g = FusionGraph(inputs=(GraphInput("x", m),), nodes=(node("t", "aten.permute.default", ValueRef("x"), (1, 0),
                                                          m=TensorMeta((8, 4), (1, 8), 0, F32, "cuda:0")),),
                    outputs=("t",))
    assert meta_mismatches(g) == []
