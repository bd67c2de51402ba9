"""JSON in/out: exact round trips, and bad files refused with the field that is wrong."""

from __future__ import annotations

import json

import pytest
import torch

from perf import zoo
from segmenter import Alias, FusionGraph, GraphInput, Mutation, Node, OpKind, TensorMeta, ValueRef, capture, op_info
from segmenter.formats.serialize import GraphFormatError, from_json, graph_to_dict, to_json

F32 = torch.float32


def m(shape, stride, offset=0, dtype=F32) -> TensorMeta:
    return TensorMeta(tuple(shape), tuple(stride), offset, dtype)


def small_graph() -> FusionGraph:
    x = GraphInput("x", m((4, 8), (8, 1)))
    part = GraphInput("part", m((2, 8), (1, 2), 3), storage=0)  # shares x's storage, strided, offset
    # written back; its own storage (a write into x would change what the view output t shows)
    acc = GraphInput("acc", m((4, 8), (8, 1)), "buffer", "acc")
    nodes = (
        Node("s", "aten.slice.Tensor", (ValueRef("x"), 1, 2, 6), (), ("s",), (m((4, 4), (8, 1), 2),)),
        Node("c", "aten._to_copy.default", (ValueRef("s"),), (("dtype", torch.bfloat16),), ("c",),
             (m((4, 4), (4, 1), 0, torch.bfloat16),)),
        Node("k", "aten.clamp.default", (ValueRef("x"), float("-inf"), 1.5), (), ("k",), (m((4, 8), (8, 1)),)),
        Node("cat", "aten.cat.default", ((ValueRef("x"), ValueRef("k")), 0), (), ("cat",), (m((8, 8), (8, 1)),)),
        Node("ln", "aten.native_layer_norm.default", (ValueRef("cat"), (8,), None, None, 1e-5), (),
             ("ln", None, None), (m((8, 8), (8, 1)), None, None)),
        Node("t", "aten.permute.default", (ValueRef("x"), (1, 0)), (), ("t",), (m((8, 4), (1, 8)),)),
    )
    return FusionGraph(
        inputs=(x, part, acc), nodes=nodes, outputs=("c", "ln", "t"),
        output_aliases=(None, None, Alias("input", 0, m((8, 4), (1, 8)))),
        mutations=(Mutation(2, "k"),), name="small",
    )


def test_round_trip_is_exact() -> None:
    g = small_graph()
    text = to_json(g)
    back = from_json(text)
    assert back == g
    assert to_json(back) == text
    assert isinstance(back.nodes[0].args[1], int) and isinstance(back.nodes[2].args[2], float)
    assert back.nodes[2].args[1] == float("-inf")


@pytest.mark.parametrize("name", ["rope-seed", "llama-tiny", "bert-tiny"])
def test_captured_graphs_round_trip(name: str) -> None:
    fn, inputs = zoo.get(name).factory()
    g = capture(fn, inputs)
    assert from_json(to_json(g)) == g


def test_shuffled_nodes_are_sorted() -> None:
    d = graph_to_dict(small_graph())
    d["nodes"] = list(reversed(d["nodes"]))
    back = from_json(json.dumps(d))  # the constructor checks the order is topological
    assert set(back.nodes) == set(small_graph().nodes) and back.outputs == small_graph().outputs


def _edit(fn) -> str:
    d = graph_to_dict(small_graph())
    fn(d)
    return json.dumps(d)


def _cycle(d) -> None:
    d["nodes"][0]["args"][0] = {"value": "c"}  # s reads c, c reads s


BAD = [
    ("not json", "{nope", "not valid JSON"),
    ("truncated", to_json(small_graph())[:-40], "not valid JSON"),
    ("top level a list", "[1, 2]", "expected an object"),
    ("wrong schema", _edit(lambda d: d.update(schema="other")), "schema"),
    ("future version", _edit(lambda d: d.update(version=99)), "99 is not supported"),
    ("unknown dtype", _edit(lambda d: d["inputs"][0]["meta"].update(dtype="float99")),
     "inputs[0].meta.dtype: unknown dtype 'float99'"),
    ("undefined value", _edit(lambda d: d["nodes"][1]["args"].__setitem__(0, {"value": "x9"})),
     "nodes[1] (\"c\").args[0]: undefined value 'x9'"),
    ("cycle", _edit(_cycle), "cycle between nodes"),
    ("no outputs", _edit(lambda d: d.update(outputs=[], output_aliases=[], mutations=[])), "has no outputs"),
    ("wrong type", _edit(lambda d: d["nodes"][2].update(outputs=5)), "nodes[2] (\"k\").outputs: expected list"),
    ("missing field", _edit(lambda d: d["nodes"][0].pop("op")), "nodes[0] (\"s\").op: missing"),
    ("huge dimension", _edit(lambda d: d["inputs"][0]["meta"].update(shape=[2**60, 8])), "huge dimension"),
    ("rank mismatch", _edit(lambda d: d["inputs"][0]["meta"].update(stride=[1])), "differ in rank"),
    ("bad role", _edit(lambda d: d["inputs"][0].update(role="weight")), "inputs[0].role"),
    ("bad alias source", _edit(lambda d: d["output_aliases"].__setitem__(2, {"source": "x", "index": 0})),
     "output_aliases[2].source"),
    ("duplicate value", _edit(lambda d: d["nodes"][1].update(outputs=["s"])), "defined twice"),
    ("bad argument", _edit(lambda d: d["nodes"][1]["kwargs"].update(dtype={"dtype": "nope"})), "bad 'dtype'"),
]


@pytest.mark.parametrize("name,text,message", BAD, ids=[b[0] for b in BAD])
def test_bad_files_name_what_is_wrong(name: str, text: str, message: str) -> None:
    with pytest.raises(GraphFormatError) as err:
        from_json(text)
    assert message in str(err.value)


def test_unknown_op_loads_as_opaque_with_a_warning() -> None:
    def edit(d) -> None:
        d["nodes"][5].update(op="mylib.frob.default")
        d["output_aliases"][2] = None  # an unknown op proves no view (see test_alias_claims.py)

    text = _edit(edit)
    with pytest.warns(UserWarning, match="mylib.frob.default"):
        g = from_json(text)
    assert op_info(g.nodes[-1].op).kind == OpKind.OPAQUE


def test_metadata_that_contradicts_an_op_is_refused_naming_the_node() -> None:
    import json as _json

    import torch as _torch

    from segmenter import capture
    from segmenter.formats.serialize import GraphFormatError, from_json, graph_to_dict

    d = graph_to_dict(capture(lambda x: x.sin() * 2, [_torch.randn(4, 4)]))
    d["inputs"][0]["meta"]["shape"] = [4, 5]
    with pytest.raises(GraphFormatError, match="node 'sin' output %sin: recorded float32\\[4, 4\\], torch computes"):
        from_json(_json.dumps(d))
    assert from_json(_json.dumps(d), check_metas=False).inputs[0].meta.shape == (4, 5)
