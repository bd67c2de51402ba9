"""is_true_view shares an answer between view nodes that agree in op, arguments and every
layout involved (alias/analysis.py), and only between those."""

from __future__ import annotations

import json

import torch

from alias.analysis import _plain, is_true_view
from segmenter import capture
from segmenter.formats.serialize import from_json, to_json


def _two_slices():
    return capture(lambda x: (x[1:3] * 2, x[1:3] + 1), [torch.randn(4, 4)])


def _slices(g):
    return [n for n in g.nodes if n.op == "aten.slice.Tensor"]


def test_nodes_alike_share_one_answer() -> None:
    g = _two_slices()
    a, b = _slices(g)
    assert is_true_view(g, a) == (True, "")
    assert is_true_view(g, b) is is_true_view(g, a)  # the second node was answered from the first


def test_a_different_recorded_layout_gets_its_own_answer() -> None:
    # the second slice claims another storage offset: same op, arguments and input, other output meta
    d = json.loads(to_json(_two_slices()))
    nodes = [n for n in d["nodes"] if n["op"] == "aten.slice.Tensor"]
    nodes[1]["metas"][0]["storage_offset"] += 4
    g = from_json(json.dumps(d), check_metas=False)
    a, b = _slices(g)
    assert is_true_view(g, a) == (True, "")
    ok, why = is_true_view(g, b)
    assert not ok and "recorded layout" in why


def test_only_plain_ints_make_a_shared_key() -> None:
    # 1, 1.0 and True are one dict key: a node with a bool or float argument is answered alone
    assert _plain([0, 1, (2, 3), None])
    assert not _plain([True])
    assert not _plain([1.0])
    assert not _plain([(1, True)])
    assert not _plain(["a"])


def _symbolic_views():
    """A graph file with two symbols of one hint: two views alike in every size expression, and
    one whose sizes are equal to theirs only at the hints."""
    from .test_symbolic_json import _graph, _input, _node, _v

    d = _graph("views", {"S": {"hint": 8, "max": 4096}, "T": {"hint": 8, "max": 4096}},
               [_input("x", [2, "S", 64], ["64*S", 64, 1], 0), _input("y", [2, "T", 64], ["64*T", 64, 1], 1)],
               [_node("a", "aten.mul.Tensor", [_v("x"), _v("x")], [2, "S", 64], ["64*S", 64, 1]),
                _node("b", "aten.add.Tensor", [_v("x"), _v("x")], [2, "S", 64], ["64*S", 64, 1]),
                _node("c", "aten.exp.default", [_v("y")], [2, "T", 64], ["64*T", 64, 1]),
                _node("va", "aten.view.default", [_v("a"), [{"size": "2*S"}, 64]], ["2*S", 64], [64, 1]),
                _node("vb", "aten.view.default", [_v("b"), [{"size": "2*S"}, 64]], ["2*S", 64], [64, 1]),
                _node("vc", "aten.view.default", [_v("c"), [{"size": "2*T"}, 64]], ["2*T", 64], [64, 1])],
               ["va", "vb", "vc"])
    return from_json(json.dumps(d))


def test_symbolic_views_alike_share_one_answer(monkeypatch) -> None:
    """See Note [symbolic plans]: the layers of a model of symbolic sizes key alike by their size
    expressions (the key raised TypeError before, so each node was derived again: a sixth of
    fuseg's own time at a generate's second length); a view whose sizes are equal only at the
    hints (T for S) is answered on its own."""
    import alias.analysis as analysis

    g = _symbolic_views()
    derived = []
    real = analysis._is_true_view
    monkeypatch.setattr(analysis, "_is_true_view", lambda graph, node: derived.append(node.name) or real(graph, node))
    va, vb, vc = (n for n in g.nodes if n.op == "aten.view.default")
    assert is_true_view(g, va) == (True, "")
    assert is_true_view(g, vb) is is_true_view(g, va)
    assert is_true_view(g, vc) == (True, "")
    assert derived == ["va", "vc"]
    from segmenter.ir.symbolic import is_symbolic

    assert is_symbolic(g.metas["va"]) and is_symbolic(va.args[1])  # (sizes of symbols, arguments too)
