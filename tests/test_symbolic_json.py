"""Graph files with symbolic sizes (Note [symbols in graph files] in segmenter/formats/symbolic_json.py):
named symbols with ranges, sizes as expressions; one segmentation and one program for every
size in the ranges, checked against torch at several sizes; hostile symbol fields refused,
naming the field."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from alias import apply_aliases
from runtime.compiled.program import CompiledProgram
from segmenter import segment
from segmenter.formats.serialize import GraphFormatError, from_json, graph_from_dict, to_json
from segmenter.ir.symbolic import sizes_of


def _meta(shape, stride, dtype="float32"):
    return {"shape": shape, "stride": stride, "storage_offset": 0, "dtype": dtype, "device": "cpu"}


def _input(name, shape, stride, storage):
    return {"name": name, "meta": _meta(shape, stride), "role": "user", "target": None, "storage": storage}


def _node(name, op, args, shape, stride, kwargs=None):
    return {"name": name, "op": op, "args": args, "kwargs": kwargs or {}, "outputs": [name], "metas": [_meta(shape, stride)]}


def _v(name):
    return {"value": name}


def _graph(name, symbols, inputs, nodes, outputs):
    return {"schema": "fusion-segmenter/graph", "version": 1, "name": name, "symbols": symbols,
            "inputs": inputs, "nodes": nodes, "outputs": outputs}


RMS = _graph("rms", {"S": {"hint": 16, "max": 4096}},
             [_input("x", [2, "S", 64], ["64*S", 64, 1], 0), _input("w", [64], [1], 1)],
             [_node("sq", "aten.mul.Tensor", [_v("x"), _v("x")], [2, "S", 64], ["64*S", 64, 1]),
              _node("m", "aten.mean.dim", [_v("sq"), [-1], True], [2, "S", 1], ["S", 1, 1]),
              _node("r", "aten.rsqrt.default", [_v("m")], [2, "S", 1], ["S", 1, 1]),
              _node("y", "aten.mul.Tensor", [_v("x"), _v("r")], [2, "S", 64], ["64*S", 64, 1]),
              _node("z", "aten.mul.Tensor", [_v("y"), _v("w")], [2, "S", 64], ["64*S", 64, 1]),
              _node("v", "aten.view.default", [_v("z"), [{"size": "2*S"}, 64]], ["2*S", 64], [64, 1])],
             ["v"])

# a transpose read by a pointwise kernel, two symbols
TWO = _graph("two", {"B": {"hint": 3, "max": 64}, "T": {"hint": 10, "max": 1024}},
             [_input("a", ["B", "T"], ["T", 1], 0), _input("b", ["T", "B"], ["B", 1], 1)],
             [_node("bt", "aten.t.default", [_v("b")], ["B", "T"], [1, "B"]),
              _node("s", "aten.add.Tensor", [_v("a"), _v("bt")], ["B", "T"], ["T", 1]),
              _node("e", "aten.exp.default", [_v("s")], ["B", "T"], ["T", 1])],
             ["e"])

CAT = _graph("cat", {"N": {"hint": 5}},
             [_input("x", ["N", 4], [4, 1], 0), _input("y", [3, 4], [4, 1], 1)],
             [_node("c", "aten.cat.default", [[_v("x"), _v("y")]], ["N+3", 4], [4, 1]),
              _node("r", "aten.relu.default", [_v("c")], ["N+3", 4], [4, 1])],
             ["r"])

PROGRAMS = {
    "rms": (RMS, lambda n: [torch.randn(2, n, 64), torch.randn(64)],
            lambda x, w: (x * torch.rsqrt((x * x).mean(-1, keepdim=True)) * w).view(-1, 64)),
    "two": (TWO, lambda n: [torch.randn(3, n), torch.randn(n, 3)], lambda a, b: (a + b.t()).exp()),
    "cat": (CAT, lambda n: [torch.randn(n, 4), torch.randn(3, 4)], lambda x, y: torch.cat([x, y]).relu()),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_program_runs_every_size(name: str) -> None:
    raw, make, reference = PROGRAMS[name]
    graph = from_json(json.dumps(raw))
    assert sizes_of(graph) is not None
    program = CompiledProgram(apply_aliases(segment(graph), "post"))
    assert program.sizes is not None
    for n in (4, 9, 17):
        inputs = make(n)
        (got,) = program(*inputs)
        want = reference(*inputs)
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape and got.stride() == want.stride()


def test_round_trip_keeps_names_ranges_and_expressions() -> None:
    graph = from_json(json.dumps(RMS))
    text = to_json(graph)
    again = from_json(text)
    assert str(again) == str(graph)
    data = json.loads(text)
    assert data["symbols"] == {"S": {"hint": 16, "min": 2, "max": 4096}}
    assert data["inputs"][0]["meta"]["stride"] == ["64*S", 64, 1]
    assert data["nodes"][-1]["args"][1] == [{"size": "2*S"}, 64]


def test_segment_shows_one_segmentation_for_all_sizes() -> None:
    from segmenter.partition.explain import describe_segments

    sf = segment(from_json(json.dumps(RMS)))
    text = describe_segments(sf)
    assert "symbolic sizes: S in [2, 4096] (hint 16)" in text
    assert "float32" not in text.split("symbolic sizes")[1]  # the ranges, then the conditions
    plan = apply_aliases(sf, "post")
    assert [s.kind.name for s in plan.segments] == ["NORMALIZATION", "METADATA"]


def _with(**changes):
    raw = copy.deepcopy(RMS)
    for path, value in changes.items():
        *keys, last = path.split("__")
        target = raw
        for k in keys:
            target = target[int(k)] if k.isdigit() else target[k]
        target[int(last) if last.isdigit() else last] = value
    return raw


HOSTILE = {
    "undeclared symbol": (_with(inputs__0__meta__shape=[2, "Q", 64]), "is not a declared symbol"),
    "code in a size": (_with(inputs__0__meta__shape=[2, "__import__('os')", 64]), "unexpected"),
    "attribute chain": (_with(inputs__0__meta__shape=[2, "S.real", 64]), "unexpected"),
    "minus": (_with(inputs__0__meta__stride=["64*S-1", 64, 1]), "unexpected"),
    "power": (_with(inputs__0__meta__stride=["S**2", 64, 1]), "unexpected"),
    "huge integer": (_with(inputs__0__meta__stride=["99999999999999999999*S", 64, 1]), "too large"),
    "past the limits at the maxima": (_with(inputs__0__meta__stride=["1000000000000*S", 64, 1]), "at the symbols' maxima"),
    "long expression": (_with(inputs__0__meta__stride=["+".join(["S"] * 200), 64, 1]), "characters"),
    "deep parentheses": (_with(inputs__0__meta__stride=["(" * 20 + "S" + ")" * 20, 64, 1]), "nested"),
    "unclosed": (_with(inputs__0__meta__stride=["(S", 64, 1]), "ends too early"),
    "bad name": (_with(symbols={"S S": {"hint": 4}}), "identifier"),
    "keyword name": (_with(symbols={"lambda": {"hint": 4}}), "identifier"),
    "hint below 2": (_with(symbols={"S": {"hint": 1, "min": 1}}), "specialized"),
    "max too big": (_with(symbols={"S": {"hint": 4, "max": 2**40}}), "max"),
    "hint out of range": (_with(symbols={"S": {"hint": 9000, "max": 4096}}), "min <= hint <= max"),
    "unknown field": (_with(symbols={"S": {"hint": 4, "eval": "x"}}), "expected"),
    "not an object": (_with(symbols=["S"]), "expected an object"),
    "bool hint": (_with(symbols={"S": {"hint": True}}), "expected an integer"),
    "size argument of code": (_with(nodes__5__args__1=[{"size": "open('x')"}, 64]), "unexpected"),
    "too many symbols": (_with(symbols={f"S{i}": {"hint": 4} for i in range(65)}), "at most 64"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_symbols_are_refused_naming_the_field(case: str) -> None:
    raw, message = HOSTILE[case]
    with pytest.raises(GraphFormatError, match=message) as e:
        graph_from_dict(raw)
    where = str(e.value).split(":")[0]
    assert where.startswith(("symbols", "inputs[0].meta", "nodes[5]")), str(e.value)


def test_an_equality_the_plan_assumed_is_checked_at_every_call() -> None:
    """A plan that found two symbols equal (``a + b`` broadcasts only where A == B) prints its
    sizes with one of them: a call where they differ must be refused, never run with the other's
    size (the condition was simplified away by the very replacement it made)."""
    raw = _graph("eq", {"A": {"hint": 5}, "B": {"hint": 5}},
                 [_input("a", ["A"], [1], 0), _input("b", ["B"], [1], 1)],
                 [_node("s", "aten.add.Tensor", [_v("a"), _v("b")], ["A"], [1])], ["s"])
    program = CompiledProgram(apply_aliases(segment(from_json(json.dumps(raw))), "post"))
    a, b = torch.randn(9), torch.randn(9)
    torch.testing.assert_close(program(a, b)[0], a + b)
    assert program.entry(torch.randn(9), torch.randn(12)) is None
    with pytest.raises(ValueError, match="condition"):
        program(torch.randn(9), torch.randn(12))
