"""JSON graphs with in-place nodes are functionalized on the way in, and keep their meaning."""

from __future__ import annotations

import json

import pytest
import torch

from segmenter import OpKind, op_info
from segmenter.capturing.reference import clone_inputs, run_graph
from segmenter.formats.serialize import GraphFormatError, from_json

from .util import alias_pattern


def _meta(shape, stride, offset=0):
    return {"shape": list(shape), "stride": list(stride), "storage_offset": offset, "dtype": "float32", "device": "cpu"}


def _graph(nodes, outputs, inputs=(("x", (4,), (1,)),)) -> str:
    return json.dumps({
        "schema": "fusion-segmenter/graph", "version": 1, "name": "g",
        "inputs": [{"name": n, "meta": _meta(s, st), "role": "user", "target": None, "storage": i}
                   for i, (n, s, st) in enumerate(inputs)],
        "nodes": [{"name": name, "op": op, "args": args, "kwargs": {}, "outputs": [name],
                   "metas": [_meta((4,), (1,))]} for name, op, args in nodes],
        "outputs": outputs,
    })


X = {"value": "x"}


def _eager_inplace_on_input(x):
    y = x * 2
    x.add_(1)
    x.mul_(y)
    return y


def _eager_dead_inplace(x):
    a = x * 2
    a.add_(1)
    return x.sin()


def _eager_view_after_mutation(x):
    x.add_(1)
    return x[1:]


CASES = [
    ("inplace-on-input", _eager_inplace_on_input, [
        ("y", "aten.mul.Tensor", [X, 2]), ("a", "aten.add_.Tensor", [X, 1]),
        ("b", "aten.mul_.Tensor", [X, {"value": "y"}])], ["y"], [0]),
    ("dead-inplace-on-intermediate", _eager_dead_inplace, [
        ("a", "aten.mul.Tensor", [X, 2]), ("b", "aten.add_.Tensor", [{"value": "a"}, 1]),
        ("s", "aten.sin.default", [X])], ["s"], []),
    ("view-after-mutation", _eager_view_after_mutation, [
        ("a", "aten.add_.Tensor", [X, 1]), ("v", "aten.slice.Tensor", [X, 0, 1, 4])], ["v"], [0]),
]


@pytest.mark.parametrize("name,eager,nodes,outputs,mutated", CASES, ids=[c[0] for c in CASES])
def test_inplace_json_graph_matches_eager(name, eager, nodes, outputs, mutated) -> None:
    g = from_json(_graph(nodes, outputs))
    assert not any(op_info(n.op).mutates for n in g.nodes)
    assert list(g.mutated_inputs) == mutated
    x = torch.randn(4)
    (e_in,), (g_in,) = clone_inputs([x]), clone_inputs([x])
    expected = eager(e_in)
    (got,) = run_graph(g, [g_in])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(g_in, e_in)
    assert alias_pattern([e_in], [expected]) == alias_pattern([g_in], [got])


def test_dead_inplace_is_removed() -> None:
    g = from_json(_graph(CASES[1][2], ["s"]))
    assert [op_info(n.op).kind for n in g.nodes] == [OpKind.ELEMENTWISE] and g.nodes[0].op == "aten.sin.default"


def test_inplace_graph_may_not_also_claim_mutations() -> None:
    d = json.loads(_graph(CASES[0][2], ["y"]))
    d["mutations"] = [{"input": 0, "value": "y"}]
    with pytest.raises(GraphFormatError, match="must not also list"):
        from_json(json.dumps(d))


def test_from_fx_wraps_torch_errors_in_functionalization() -> None:
    """torch's own error while functionalizing an fx graph comes out as a CaptureError (a GraphError)."""
    import torch.fx as fx

    from segmenter import CaptureError, from_fx

    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.output((g.call_function(torch.ops.aten.add_.Tensor, (x, y)),))  # [4] += [3, 4]: cannot broadcast in place
    with pytest.raises(CaptureError, match="RuntimeError: output with shape"):
        from_fx(fx.GraphModule(torch.nn.Module(), g), [torch.randn(4), torch.randn(3, 4)])
