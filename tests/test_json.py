"""segmenter.formats.serialize against hand-built graphs: exact round trips, literal types, node order, bad files."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from segmenter.formats.serialize import GraphFormatError, dump, from_json, graph_from_dict, graph_to_dict, load, to_json
from segmenter.ir.graph import Alias, Arg, FusionGraph, GraphError, GraphInput, Mutation, Node, TensorMeta, ValueRef
from segmenter.ir.ops import OpKind, op_info

F32, BF16 = torch.float32, torch.bfloat16
V = ValueRef


def meta(shape: tuple[int, ...], stride: tuple[int, ...] | None = None, offset: int = 0, dtype: torch.dtype = F32,
         ) -> TensorMeta:
    if stride is None:  # contiguous
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return TensorMeta(shape, stride, offset, dtype)


def node(name: str, op: str, args: tuple[Arg, ...], m: TensorMeta, kwargs: tuple[tuple[str, Arg], ...] = ()) -> Node:
    return Node(name, op, args, kwargs, (name,), (m,))


def big_graph() -> FusionGraph:
    inputs = (
        GraphInput("x", meta((4, 8))),
        GraphInput("xs", meta((3, 4), (1, 8), 2), storage=0),  # a strided, offset view of x's storage
        GraphInput("w", meta((8,)), "parameter", "ln.weight"),
        GraphInput("b", meta((4, 8)), "buffer", "stats"),
    )
    nodes = (
        node("s", "aten.slice.Tensor", (V("x"), 1, 2, 6), meta((4, 4), (8, 1), 2)),
        node("m", "aten.mul.Tensor", (V("s"), 2.0), meta((4, 4))),
        node("r", "aten.sum.dim_IntList", (V("m"), (1,), False), meta((4,))),
        node("c", "aten._to_copy.default", (V("r"),), meta((4,), dtype=BF16), (("dtype", BF16),)),
        # independent of s..c yet after them: a stable sort must keep it here (a FIFO Kahn would not)
        node("k", "aten.clamp.default", (V("x"), float("-inf"), float("inf")), meta((4, 8))),
        node("cat", "aten.cat.default", ((V("x"), V("k")), 0), meta((8, 8))),
        Node("ln", "aten.native_layer_norm.default", (V("cat"), (8,), V("w"), None, 1e-5), (),
             ("ln", None, None), (meta((8, 8)), None, None)),
        node("t", "aten.permute.default", (V("x"), (1, 0)), meta((8, 4), (1, 8))),
        node("t2", "aten.alias.default", (V("t"),), meta((8, 4), (1, 8))),
        node("e", "aten.empty.memory_format", ((2, 3),), meta((2, 3)),
             (("memory_format", torch.contiguous_format), ("device", torch.device("cpu")), ("dtype", F32),
              ("layout", torch.strided), ("pin_memory", False))),  # not sorted: kwargs order must survive
        # math.nan, not float("nan"): a fresh nan object never equals itself, so neither would the graph
        node("nb", "aten.nan_to_num.default", (V("b"), math.nan, None, None), meta((4, 8))),
    )
    return FusionGraph(
        inputs, nodes, outputs=("c", "ln", "t", "t2", "e"),
        output_aliases=(None, None, Alias("input", 0, meta((8, 4), (1, 8))), Alias("output", 2), None),
        mutations=(Mutation(3, "nb"),), name="big",
    )


def chain_graph() -> FusionGraph:
    """One topological order only, so any shuffle of its nodes must load back as exactly this."""
    x = GraphInput("x", meta((4, 8)))
    nodes = (
        node("s", "aten.slice.Tensor", (V("x"), 1, 2, 6), meta((4, 4), (8, 1), 2)),
        node("m", "aten.mul.Tensor", (V("s"), 2.0), meta((4, 4))),
        node("r", "aten.sum.dim_IntList", (V("m"), (1,), False), meta((4,))),
        node("c", "aten._to_copy.default", (V("r"),), meta((4,), dtype=BF16), (("dtype", BF16),)),
    )
    return FusionGraph((x,), nodes, ("c",), name="chain")


def test_round_trip_is_exact_both_ways(tmp_path: Path) -> None:
    g = big_graph()
    text = to_json(g)
    back = from_json(text)
    assert back == g and to_json(back) == text
    assert graph_from_dict(graph_to_dict(g)) == g
    pretty = to_json(g, indent=2)
    assert to_json(from_json(pretty), indent=2) == pretty
    dump(g, tmp_path / "g.json")
    assert load(tmp_path / "g.json") == g
    assert back.storage_groups() == [(0, 1)]


# Equality alone cannot see these: 2.0 == 2, False == 0, inf == inf; nan != nan.
LITERALS = [
    ("s", 1, 1, int),
    ("m", 1, 2.0, float),
    ("r", 1, (1,), tuple),
    ("r", 2, False, bool),
    ("k", 1, float("-inf"), float),
    ("k", 2, float("inf"), float),
    ("cat", 0, (V("x"), V("k")), tuple),
    ("ln", 4, 1e-5, float),
]


@pytest.mark.parametrize("name,pos,value,kind", LITERALS)
def test_literal_types_survive(name: str, pos: int, value: object, kind: type) -> None:
    back = {n.name: n for n in from_json(to_json(big_graph())).nodes}
    got = back[name].args[pos]
    assert type(got) is kind and got == value


def test_nan_and_torch_objects_survive() -> None:
    back = {n.name: n for n in from_json(to_json(big_graph())).nodes}
    assert math.isnan(back["nb"].args[1])
    assert back["e"].kwargs == big_graph().nodes[9].kwargs
    assert [type(v) for _, v in back["e"].kwargs] == [torch.memory_format, torch.device, torch.dtype, torch.layout, bool]


def test_documented_encoding() -> None:
    nodes = {n["name"]: n for n in graph_to_dict(big_graph())["nodes"]}
    assert nodes["cat"]["args"] == [[{"value": "x"}, {"value": "k"}], 0]
    assert nodes["k"]["args"][1:] == [{"float": "-inf"}, {"float": "inf"}]
    assert nodes["e"]["kwargs"] == {"memory_format": {"memory_format": "contiguous_format"}, "device": {"device": "cpu"},
                                    "dtype": {"dtype": "float32"}, "layout": {"layout": "strided"}, "pin_memory": False}
    assert list(nodes["e"]["kwargs"]) == ["memory_format", "device", "dtype", "layout", "pin_memory"]
    assert nodes["ln"]["outputs"] == ["ln", None, None] and nodes["ln"]["metas"][1:] == [None, None]
    assert json.loads(to_json(big_graph()))["inputs"][1]["meta"] == {
        "shape": [3, 4], "stride": [1, 8], "storage_offset": 2, "dtype": "float32", "device": "cpu"}


@pytest.mark.parametrize("order", list(itertools.permutations(range(4)))[::5])
def test_shuffled_chain_loads_as_the_original(order: tuple[int, ...]) -> None:
    d = graph_to_dict(chain_graph())
    d["nodes"] = [d["nodes"][i] for i in order]
    assert from_json(json.dumps(d)) == chain_graph()


def test_reversed_graph_loads_with_the_same_nodes() -> None:
    g = big_graph()
    d = graph_to_dict(g)
    d["nodes"].reverse()
    back = from_json(json.dumps(d))  # FusionGraph itself refuses a non-topological order
    assert set(back.nodes) == set(g.nodes)
    assert dataclasses.replace(back, nodes=g.nodes) == g


def test_unknown_op_loads_as_opaque_with_one_warning() -> None:
    d = graph_to_dict(big_graph())
    for n in d["nodes"]:
        if n["name"] in ("t", "t2"):
            n["op"] = "mylib.frob.default"
    d["output_aliases"][2:4] = [None, None]  # an unknown op proves no view (see test_alias_claims.py)
    with pytest.warns(UserWarning, match="mylib.frob.default: torch has no such op; it loads as OPAQUE") as record:
        g = from_json(json.dumps(d))
    assert sum("mylib.frob.default" in str(w.message) for w in record) == 1
    info = op_info(g.nodes[g.node_index["t"]].op)
    assert info.kind == OpKind.OPAQUE and not info.known


def _edit(fn: Callable[[dict[str, Any]], object]) -> str:
    d = graph_to_dict(big_graph())
    fn(d)
    return json.dumps(d)


def _swap_uses(d: dict[str, Any]) -> None:
    d["nodes"][0]["args"][0] = {"value": "m"}  # s reads m while m reads s


def _node(d: dict[str, Any], k: int) -> dict[str, Any]:
    return d["nodes"][k]


BAD: list[tuple[str, str, str]] = [
    ("malformed", "{nope", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("truncated", to_json(big_graph())[:-40], "not valid JSON"),
    ("top level list", "[1, 2]", "top level: expected an object, got list"),
    ("wrong schema", _edit(lambda d: d.update(schema="other/graph")), "schema: expected 'fusion-segmenter/graph'"),
    ("missing schema", _edit(lambda d: d.pop("schema")), "schema:"),
    ("future version", _edit(lambda d: d.update(version=2)), "version: 2 is not supported (supported: 1)"),
    ("boolean version", _edit(lambda d: d.update(version=True)), "version: true is not supported"),
    ("missing version", _edit(lambda d: d.pop("version")), "version: missing"),
    ("unknown dtype", _edit(lambda d: d["inputs"][0]["meta"].update(dtype="float99")),
     "inputs[0].meta.dtype: unknown dtype 'float99'"),
    ("undefined value", _edit(lambda d: _node(d, 1)["args"].__setitem__(0, {"value": "x9"})),
     "nodes[1] (\"m\").args[0]: undefined value 'x9'"),
    ("undefined in list", _edit(lambda d: _node(d, 5)["args"][0].__setitem__(1, {"value": "q"})),
     "nodes[5] (\"cat\").args[0]: undefined value 'q'"),
    ("undefined in kwargs", _edit(lambda d: _node(d, 1).update(args=[{"value": "s"}], kwargs={"other": {"value": "zz"}})),
     "nodes[1] (\"m\").kwargs.other: undefined value 'zz'"),
    ("keyword the op does not take", _edit(lambda d: _node(d, 9)["kwargs"].update(out={"value": "zz"})),
     "nodes[9] (\"e\").kwargs.out: aten.empty.memory_format has no argument 'out'"),
    ("undefined output", _edit(lambda d: d["outputs"].__setitem__(0, "zz")), "outputs[0]: undefined value %zz"),
    ("cycle", _edit(_swap_uses), "cycle between nodes 's' -> 'm' -> 's'"),
    ("self cycle", _edit(lambda d: _node(d, 7)["args"].__setitem__(0, {"value": "t"})), "cycle between nodes 't' -> 't'"),
    ("no outputs", _edit(lambda d: d.update(outputs=[], output_aliases=[], mutations=[])), "'big' has no outputs"),
    ("wrong type", _edit(lambda d: _node(d, 2).update(outputs=5)), "nodes[2] (\"r\").outputs: expected list, got int"),
    ("missing field", _edit(lambda d: _node(d, 0).pop("op")), "nodes[0] (\"s\").op: missing"),
    ("missing meta field", _edit(lambda d: d["inputs"][2]["meta"].pop("stride")), "inputs[2].meta.stride: missing"),
    ("huge dimension", _edit(lambda d: d["inputs"][0]["meta"].update(shape=[2**60, 8])), "inputs[0].meta: huge dimension"),
    ("negative size", _edit(lambda d: d["inputs"][0]["meta"].update(shape=[-4, 8])), "inputs[0].meta: negative size"),
    ("rank mismatch", _edit(lambda d: _node(d, 1)["metas"][0].update(stride=[1])),
     "nodes[1] (\"m\").metas[0]: shape (4, 4) and stride (1,) differ in rank"),
    ("unknown role", _edit(lambda d: d["inputs"][2].update(role="weight")), "inputs[2].role: 'weight'"),
    ("alias source", _edit(lambda d: d["output_aliases"][3].update(source="x")), "output_aliases[3].source: 'x'"),
    ("alias index", _edit(lambda d: d["output_aliases"][2].update(index=7)), "output_aliases[2]: no input 7"),
    ("aliases not a list", _edit(lambda d: d.update(output_aliases=5)), "output_aliases: expected list, got int"),
    ("mutations not a list", _edit(lambda d: d.update(mutations={})), "mutations: expected list, got dict"),
    ("duplicate output", _edit(lambda d: _node(d, 1).update(outputs=["s"])), "value 's' defined twice"),
    ("duplicate input", _edit(lambda d: d["inputs"][1].update(name="x")), "inputs[1]: duplicate value name 'x'"),
    ("bad dtype argument", _edit(lambda d: _node(d, 3)["kwargs"].update(dtype={"dtype": "nope"})),
     "nodes[3] (\"c\").kwargs.dtype: bad 'dtype' argument 'nope'"),
    ("unhashable argument", _edit(lambda d: _node(d, 3)["kwargs"].update(dtype={"dtype": [1]})),
     "kwargs.dtype: bad 'dtype' argument [1]"),
    ("deep argument", _edit(lambda d: _node(d, 0)["args"].append(json.loads("[" * 200 + "]" * 200))),
     "nodes[0] (\"s\").args[4]"),
    ("huge integer", "[" + "9" * 5000 + "]", "not valid JSON"),
    # names are identifiers of the graph only (Note [names are identifiers of the graph only])
    ("empty input name", _edit(lambda d: d["inputs"][0].update(name="")), "inputs[0].name: empty name"),
    ("newline in node name", _edit(lambda d: _node(d, 1).update(name="m\nx")), "nodes[1].name: name 'm\\nx' holds"),
    ("bidi override in value name", _edit(lambda d: _node(d, 1).update(outputs=["m\u202e"])),
     'nodes[1] ("m").outputs[0]: name'),
    ("long graph name", _edit(lambda d: d.update(name="g" * 300)), "graph.name: name of 300 characters (at most 256)"),
    ("name not a string", _edit(lambda d: d["outputs"].__setitem__(0, 3)), "outputs[0]: expected a name (string), got int"),
    ("control in target", _edit(lambda d: d["inputs"][2].update(target="ln.\x00weight")), "inputs[2].target: name"),
    ("control in mutation value", _edit(lambda d: d["mutations"][0].update(value="nb\r")), "mutations[0].value: name"),
    ("keyword that is a Python keyword", _edit(lambda d: _node(d, 3)["kwargs"].update({"class": 1})),
     "nodes[3] (\"c\").kwargs: keyword 'class' is not an argument name"),
    ("keyword with code", _edit(lambda d: _node(d, 3)["kwargs"].update({"a=1,b": 1})), "keyword 'a=1,b' is not"),
    ("dunder keyword", _edit(lambda d: _node(d, 3)["kwargs"].update({"__class__": 1})), "keyword '__class__' is not"),
    ("string argument with a control character", _edit(lambda d: _node(d, 0)["args"].append("a\x00")),
     "nodes[0] (\"s\").args[4]: a string argument must be printable"),
    ("op that is not an op name", _edit(lambda d: _node(d, 1).update(op="load_library.__call__.__call__")),
     "nodes[1] (\"m\").op: 'load_library.__call__.__call__' is not an op name (a dunder namespace or overload)"),
    ("op of two parts", _edit(lambda d: _node(d, 1).update(op="torch.sin")), "nodes[1] (\"m\").op: 'torch.sin' is not"),
    ("op reading a file", _edit(lambda d: _node(d, 1).update(op="aten.from_file.default")),
     "nodes[1] (\"m\").op: aten.from_file.default: its string argument 'filename' reaches outside"),
    ("op talking to other processes", _edit(lambda d: _node(d, 1).update(op="_c10d_functional.wait_tensor.default")),
     "ops of namespace '_c10d_functional' reach outside"),
    ("op argument that is not an op", _edit(lambda d: _node(d, 0)["args"].append({"op": "import_module.__call__.__call__"})),
     "nodes[0] (\"s\").args[4]: 'import_module.__call__.__call__' is not an op name"),
]


@pytest.mark.parametrize("text,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_files_name_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(GraphFormatError) as err:
        from_json(text)
    assert message in str(err.value)
    assert isinstance(err.value, GraphError)  # callers that catch GraphError catch these too
