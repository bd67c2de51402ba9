"""is_true_view shares an answer between view nodes that agree in op, arguments and every
layout involved (alias/analysis.py), and only between those."""

from __future__ import annotations

import json

import torch

from alias.analysis import _plain, is_true_view
from segmenter import capture
from segmenter.serialize import from_json, to_json


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
