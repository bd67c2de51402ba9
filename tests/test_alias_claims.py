"""Recorded aliasing, write-backs and shared storages must agree with the ops (issue 14, item 4).

Legit captured programs round-trip and still match eager; claims the ops contradict are refused
naming the field (Note [an alias claim must hold] in segmenter/capturing/recorded.py), whatever the flags.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

import runtime
from alias import apply_aliases, check
from segmenter import capture, segment
from segmenter.capturing.reference import clone_inputs, run_graph, storage_key
from segmenter.formats.serialize import GraphFormatError, from_json, graph_to_dict, to_json
from segmenter.ir.graph import GraphError

from .util import assert_matches_eager


def _after_mutation(x):
    y = x[0]
    x.add_(1)
    return y


def _transposed_after_mutation(x):
    y = x.t()[1:]
    x.mul_(2)
    return y, x


def _dtype_view_after_mutation(x):
    y = x.view(torch.int32)
    x.add_(1)
    return y


def _as_strided_after_mutation(x):
    y = x.as_strided((2, 2), (1, 2), 1)
    x.mul_(2)
    return y


def _write_through_a_view(x):
    v = x.view(2, 6)
    v.add_(1)
    return v.view(4, 3)[1:], x


def _views_of_an_output(x):
    t = x + 1
    return t[0:2], t[2:], t.t()


def _shared_storage(base, part):
    return part.t(), base[1:]


def _twice(x):
    t = x * 2
    return x, x, t, t


def _expanded(x):
    return x.expand(3, 4), x.squeeze(0)



_BASE = torch.randn(16)
LEGIT: list[tuple[str, Callable[..., Any], list[torch.Tensor]]] = [
    ("view-after-mutation", _after_mutation, [torch.randn(3, 4)]),
    ("transposed-view-after-mutation", _transposed_after_mutation, [torch.randn(4, 4)]),
    ("dtype-view-after-mutation", _dtype_view_after_mutation, [torch.randn(3, 4)]),
    ("as-strided-after-mutation", _as_strided_after_mutation, [torch.randn(3, 4)]),
    # the written-back value is itself a view (of add): the output's chain passes through it
    ("write-through-a-view", _write_through_a_view, [torch.randn(3, 4)]),
    ("views-of-an-output", _views_of_an_output, [torch.randn(4, 4)]),
    ("shared-storage", _shared_storage, [_BASE, _BASE[2:6].view(2, 2)]),
    ("returned-twice", _twice, [torch.randn(2, 3)]),
    ("expanded-input", _expanded, [torch.randn(1, 4)]),
]


def _empty_claim_with_another_shape() -> dict[str, Any]:
    d = _captured(lambda x: x.expand(2, 0), torch.empty(0))
    d["output_aliases"][0]["layout"]["shape"] = [0, 2]
    return d



@pytest.mark.parametrize("name,fn,inputs", LEGIT, ids=[c[0] for c in LEGIT])
def test_captured_aliasing_loads_and_matches_eager(name, fn, inputs) -> None:
    graph = capture(fn, clone_inputs(inputs))
    assert any(a is not None for a in graph.output_aliases)
    for check_metas in (True, False):
        loaded = from_json(to_json(graph), check_metas=check_metas)
        assert loaded == graph
    assert_matches_eager(fn, inputs, loaded)
    program = runtime.compile(apply_aliases(segment(loaded), "post"), backend="torch")
    assert_matches_eager(fn, inputs, loaded, program=program)


def test_a_view_output_that_claims_nothing_is_handed_back_as_a_copy() -> None:
    """The converse: no claim, no alias. The values are the view's; the storage is fresh."""
    x = torch.randn(4, 4)
    d = graph_to_dict(capture(lambda x: x.t()[1:], [x]))
    d["output_aliases"] = [None]
    g = from_json(json.dumps(d))
    for backend in ("torch", "cpp"):
        prog = runtime.compile(apply_aliases(segment(g), "post"), backend=backend)
        for run in (lambda a: run_graph(g, a), lambda a, prog=prog: prog(*a)):
            (xi,) = clone_inputs([x])
            (out,) = run([xi])
            torch.testing.assert_close(out, x.t()[1:], rtol=0, atol=0)
            assert storage_key(out) != storage_key(xi)


def test_an_input_returned_without_a_claim_is_a_copy() -> None:
    """Found by the hostile fuzzer: alias.check said such an output "would alias an input"; the
    runtime (like finish) hands back a copy, which is what a graph claiming nothing means."""
    d = _captured(lambda x: x.sin(), torch.randn(4))
    d["outputs"].insert(0, d["inputs"][0]["name"])
    d["output_aliases"] = [None, None]
    g = from_json(json.dumps(d))
    sf = segment(g)
    for mode in ("post", "pre", "off"):
        plan = apply_aliases(sf, mode)
        assert check(sf, plan) == []
        for backend in ("torch", "cpp"):
            x = torch.randn(4)
            out = runtime.compile(plan, backend=backend)(x)
            assert torch.equal(out[0], x) and storage_key(out[0]) != storage_key(x)


# -- claims the ops contradict ------------------------------------------------------------

_CAPTURED: dict[str, str] = {}


def _captured(fn: Callable[..., Any], *inputs: torch.Tensor) -> dict[str, Any]:
    """A fresh dict of the captured graph (captured once per program: capture takes a second)."""
    layouts = [(tuple(t.shape), t.stride(), t.storage_offset()) for t in inputs]
    key = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno}:{layouts}"
    if key not in _CAPTURED:
        _CAPTURED[key] = json.dumps(graph_to_dict(capture(fn, list(inputs))))
    return json.loads(_CAPTURED[key])


def _node(d: dict[str, Any], op: str) -> dict[str, Any]:
    return next(n for n in d["nodes"] if n["op"] == op)


def _sin_claimed_a_view(layout_dtype: str | None) -> dict[str, Any]:
    """The issue's case: a computed output claimed a view of the input (a float64 layout read the
    input's bytes reinterpreted)."""
    d = _captured(lambda x: x.sin(), torch.randn(4, 4))
    layout = None
    if layout_dtype is not None:
        layout = {"shape": [2, 4], "stride": [4, 1], "storage_offset": 0, "dtype": layout_dtype, "device": "cpu"}
    d["output_aliases"] = [{"source": "input", "index": 0, "layout": layout}]
    return d


def _wrong_layout() -> dict[str, Any]:
    d = _captured(lambda x: x.t(), torch.randn(4, 4))
    d["output_aliases"][0]["layout"]["stride"] = [4, 1]
    return d


def _layout_on_another_device() -> dict[str, Any]:
    d = _captured(lambda x: x.t(), torch.randn(4, 4))
    d["output_aliases"][0]["layout"]["device"] = "meta"
    return d


def _view_of_the_other_input() -> dict[str, Any]:
    d = _captured(lambda x, y: x.t(), torch.randn(4, 4), torch.randn(4, 4))
    d["output_aliases"][0]["index"] = 1
    return d


def _reads_before_the_write() -> dict[str, Any]:
    """select(x) instead of select(add(x)): the output shows x's old values, the view the new."""
    d = _captured(_after_mutation, torch.randn(3, 4))
    _node(d, "aten.select.int")["args"][0] = {"value": d["inputs"][0]["name"]}
    return d


def _as_strided_of_the_written_value() -> dict[str, Any]:
    """as_strided maps storage positions: over the fresh value at offset 0 it reads other elements
    than over the input, which starts at offset 2."""
    d = _captured(_after_mutation, torch.randn(14)[2:].view(3, 4))
    n = _node(d, "aten.select.int")
    n.update(op="aten.as_strided.default", args=[n["args"][0], [4], [1], 0])
    d["output_aliases"][0]["layout"].update(storage_offset=0)
    return d


def _output_views_another_value() -> dict[str, Any]:
    d = _captured(_views_of_an_output, torch.randn(4, 4))
    d["nodes"][2]["args"][0] = {"value": d["inputs"][0]["name"]}  # slice_2 of x, not of t
    return d


def _output_of_a_copied_output() -> dict[str, Any]:
    d = _captured(lambda x: (x[0:2], x[2:]), torch.randn(4, 4))
    d["output_aliases"] = [None, {"source": "output", "index": 0, "layout": d["output_aliases"][1]["layout"]}]
    return d


def _output_copied_because_shared() -> dict[str, Any]:
    d = _captured(_views_of_an_output, torch.randn(4, 4))
    d["output_aliases"][1] = None  # output 1 now comes back as a copy... and output 2 views output 0
    d["output_aliases"][2] = {"source": "output", "index": 1, "layout": d["output_aliases"][2]["layout"]}
    return d


def _mutation_into_overlap() -> dict[str, Any]:
    d = _captured(lambda x: x + 1, torch.randn(4, 4))
    d["inputs"][0]["meta"]["stride"] = [0, 1]
    _node(d, "aten.add.Tensor")["metas"][0]["stride"] = [4, 1]
    d["mutations"] = [{"input": 0, "value": d["outputs"][0]}]
    return d


def _two_writes_into_one_storage() -> dict[str, Any]:
    d = _captured(lambda x, y: (x + 1, y + 1), torch.randn(4), torch.randn(4))
    d["inputs"][1]["storage"] = d["inputs"][0]["storage"]
    d["mutations"] = [{"input": 0, "value": d["outputs"][0]}, {"input": 1, "value": d["outputs"][1]}]
    return d


def _storage_across_devices() -> dict[str, Any]:
    d = _captured(lambda x, y: x + 1, torch.randn(4), torch.randn(4))
    d["inputs"][1]["storage"] = d["inputs"][0]["storage"]
    d["inputs"][1]["meta"]["device"] = "meta"
    return d


REFUSED: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("computed-output-claimed-a-view", lambda: _sin_claimed_a_view(None),
     "output_aliases[0]: claims output 0 (%sin) is a view of input 0 ('x'), but it is not a view of it: "
     "%sin is made by aten.sin.default"),
    ("float64-layout-over-a-computed-output", lambda: _sin_claimed_a_view("float64"), "output_aliases[0]: claims"),
    ("view-with-another-layout", _wrong_layout, "output_aliases[0]: claims output 0 (%permute) is a view of input 0 "
     "('x') with layout float32[4, 4], but its view ops give float32[4, 4] stride=[1, 4]"),
    ("layout-on-another-device", _layout_on_another_device, "output_aliases[0]: claims output 0 (%permute) is a view "
     "of input 0 ('x') on device meta, but it is on cpu"),
    ("view-of-the-other-input", _view_of_the_other_input, "but it is not a view of it: %x is another input"),
    ("reads-before-the-write", _reads_before_the_write, "output_aliases[0]: claims output 0 (%select_1) is a view of "
     "input 0 ('x'), but that storage is written back"),
    ("as-strided-of-the-written-value", _as_strided_of_the_written_value, "output_aliases[0]: claims output 0 "
     "(%select_1) is a view of input 0 ('x') through as_strided of the written-back value %add, which reads other "
     "elements of the storage than that value's"),
    ("output-views-another-value", _output_views_another_value, "output_aliases[1]: claims output 1 (%slice_2) is a "
     "view of output 0 (%slice_1), but they view different values (%x, %add)"),
    ("view-of-an-output-handed-back-as-a-copy", _output_of_a_copied_output, "both view input 'x'"),
    ("view-of-an-output-copied-as-shared", _output_copied_because_shared, "output_aliases[2]: claims output 2 "
     "(%permute) is a view of output 1 (%slice_2), but output 0 views the same value first"),
    ("write-into-overlapping-elements", _mutation_into_overlap, "mutations[0]: input 'x' (float32[4, 4] stride=[0, 1]) "
     "has elements that share memory"),
    ("two-writes-into-one-storage", _two_writes_into_one_storage, "mutations[1]: input 'y' shares its storage with "
     "input 'x', also written back"),
    ("storage-across-devices", _storage_across_devices, "inputs[1].storage: shares storage 0 with inputs[0] on cpu"),
    ("empty-view-with-another-shape", _empty_claim_with_another_shape, "output_aliases[0]: claims output 0"),
]


@pytest.mark.parametrize("check_metas", [True, False])
@pytest.mark.parametrize("name,make,message", REFUSED, ids=[c[0] for c in REFUSED])
def test_claims_the_ops_contradict_are_refused(name, make, message: str, check_metas: bool) -> None:
    with pytest.raises(GraphFormatError) as err:
        from_json(json.dumps(make()), check_metas=check_metas)
    assert message in str(err.value)


def test_inputs_declared_to_share_a_storage_must_share_it() -> None:
    """A claim on input 1 proved through input 0 holds only if the two really share a storage at
    the call: inputs that are declared to and do not are refused (they were read as if they did)."""
    base = torch.randn(16)
    d = _captured(lambda x, y: x.t(), base[:16].view(4, 4), base[:16].view(4, 4))
    assert d["inputs"][0]["storage"] == d["inputs"][1]["storage"]
    d["output_aliases"][0]["index"] = 1
    g = from_json(json.dumps(d))  # the claim holds for inputs that share a storage
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    prog = runtime.compile(apply_aliases(segment(g), "post"), backend="torch")
    for run in (lambda: run_graph(g, [x, y]), lambda: prog(x, y)):
        with pytest.raises(GraphError, match="input 'y' should share a storage with input 'x'"):
            run()
    shared = torch.randn(16)
    (out,) = prog(shared.view(4, 4), shared.view(4, 4))
    assert torch.equal(out, shared.view(4, 4).t())

