"""Tensor constants belong to the graph: captured (torch.export's lifted constants, fx get_attr),
held by value in the IR and in JSON, bound when compiled, and never handed out to be mutated."""

from __future__ import annotations

import base64
import copy
import json
import math
import struct

import pytest
import torch

from alias import apply_aliases, check
from runtime.compiled.program import CompiledProgram
from runtime.dynamo import FusegCompiler
from segmenter import FusionGraph, GraphConstant, GraphError, GraphInput, Node, TensorMeta, ValueRef, capture, segment
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs, run_graph
from segmenter.formats.serialize import GraphFormatError, from_json, graph_to_dict, to_json

from .util import assert_matches_eager


def _list_index(x):
    return x[[1, 2]]


def _tensor_in_body(x):
    return x * torch.tensor([1.0, -2.0, 3.0])


def _masked_sum(x, mask):
    return torch.masked.sum(x, 1, mask=mask)


def _masked_amax(x, mask):
    return torch.masked.amax(x, 0, mask=mask)


def _int_constant_index(x):
    return torch.gather(x, 1, torch.tensor([[0, 2], [1, 0], [2, 2], [0, 1]]))


def _constant_returned(x):
    return x + 1, torch.tensor([5.0, 6.0])


class _WithAttr(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.scale = torch.tensor([0.5, 2.0, -1.0])  # a plain attribute: neither parameter nor buffer

    def forward(self, x):
        return self.lin(x) * self.scale


def _x():
    return [torch.randn(4, 3)]


def _x_mask():
    return [torch.randn(4, 3), torch.tensor([[True, False, True]] * 2 + [[False, False, True]] * 2)]


PROGRAMS = [
    ("list-index", _list_index, _x),
    ("tensor-in-body", _tensor_in_body, _x),
    ("masked-sum", _masked_sum, _x_mask),
    ("masked-amax", _masked_amax, _x_mask),
    ("int-constant-index", _int_constant_index, _x),
    ("constant-returned", _constant_returned, _x),
]


@pytest.mark.parametrize("name,fn,make", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_capture_and_compile_match_eager(name, fn, make) -> None:
    torch.manual_seed(0)
    inputs = make()
    graph = capture(fn, inputs)
    assert graph.constants and all(i.role == "user" for i in graph.inputs)
    assert_matches_eager(fn, inputs, graph)
    segmented = segment(graph)
    for mode in ("post", "pre", "off"):
        plan = apply_aliases(segmented, mode)
        assert not check(segmented, plan), check(segmented, plan)
        assert_matches_eager(fn, inputs, graph, program=CompiledProgram(plan))
    assert_matches_eager(fn, inputs, graph, program=CompiledProgram(apply_aliases(segmented, "post"), backend="cpp"))


def test_module_tensor_attribute_is_a_constant() -> None:
    torch.manual_seed(0)
    model = _WithAttr()
    inputs = _x()
    graph = capture(model, inputs)
    assert [c.meta.shape for c in graph.constants] == [(3,)]
    with torch.no_grad():
        assert_matches_eager(model, inputs, graph, module=model)
        program = CompiledProgram(apply_aliases(segment(graph), "post"))
        assert_matches_eager(model, inputs, graph, module=model, program=program)


def test_a_returned_constant_cannot_be_changed_by_the_caller() -> None:
    graph = capture(_constant_returned, _x())
    program = CompiledProgram(apply_aliases(segment(graph), "post"))
    x = torch.randn(4, 3)
    _, c = program(x)
    c.add_(100)  # the caller owns what it got
    _, again = program(x)
    torch.testing.assert_close(again, torch.tensor([5.0, 6.0]))
    _, c = run_graph(graph, [x])
    c.add_(100)
    torch.testing.assert_close(run_graph(graph, [x])[1], torch.tensor([5.0, 6.0]))


@pytest.mark.parametrize("name,fn,make", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_torch_compile_with_constants(name, fn, make) -> None:
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        inputs = make()
        expected = fn(*clone_inputs(inputs))
        compiler = FusegCompiler()
        from torch._dynamo.backends.common import aot_autograd

        got = torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, keep_inference_input_mutations=True))(
            *clone_inputs(inputs))
        torch.testing.assert_close(got, expected)
        assert compiler.compiled, "the fuseg compiler was not used"
    finally:
        torch._dynamo.reset()


def _hf(name: str):
    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=100)
    if name == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small, num_key_value_heads=2,
                                                                     max_position_embeddings=64))
    if name == "falcon":
        return transformers.FalconForCausalLM(transformers.FalconConfig(hidden_size=32, num_hidden_layers=1,
                                                                        num_attention_heads=4, vocab_size=100))
    return transformers.DebertaV2Model(transformers.DebertaV2Config(**small, max_position_embeddings=64))


@pytest.mark.parametrize("name", ["qwen2", "falcon", "deberta-v2"])
def test_transformers_models_with_constants_through_torch_compile(name: str) -> None:
    """Default configs (small sizes, random weights): each builds tensors in its forward."""
    torch.manual_seed(0)
    model = _hf(name).eval()
    ids = torch.randint(0, 100, (1, 8))
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            expected = model(ids)
            got = torch.compile(model, backend="fuseg")(ids)
    finally:
        torch._dynamo.reset()
    # the first output (logits, or deberta's hidden states), by position: field names are transformers'
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


# -- the IR and JSON ---------------------------------------------------------------------------

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def _values(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([[True, False, True], [False, False, True]])
    if dtype.is_complex:
        return torch.tensor([[1 + 2j, -0.0 - 1j, complex(math.inf, math.nan)], [3j, 0, -1]], dtype=dtype)
    if dtype.is_floating_point:
        return torch.tensor([[-0.0, math.inf, -math.inf], [math.nan, 1e-3, -7.5]], dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([[info.min, info.max, 0], [1, -1 if info.min < 0 else 2, 3]], dtype=dtype)


def _graph_with(c: torch.Tensor) -> FusionGraph:
    const = GraphConstant.from_tensor("k", c)
    x = GraphInput("x", TensorMeta.from_tensor(torch.empty(2, 3, dtype=c.dtype)))
    node = Node("y", "aten.clone.default", (ValueRef("k"),), (), ("y",), (const.meta,))
    return FusionGraph(inputs=(x,), nodes=(node,), outputs=("y",), constants=(const,), name="g")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_json_round_trip_is_exact_for_every_dtype(dtype) -> None:
    c = _values(dtype)
    graph = _graph_with(c)
    again = from_json(to_json(graph))
    assert again == graph and hash(again) == hash(graph)
    got = again.constants[0].tensor()
    assert got.dtype == dtype and got.shape == c.shape
    assert bytes(got.contiguous().untyped_storage()) == bytes(c.contiguous().untyped_storage())  # nan payloads, -0.0
    x = torch.zeros(2, 3, dtype=dtype)
    (y,) = run_graph(again, [x])
    assert bytes(y.untyped_storage()) == bytes(c.untyped_storage())


def test_constants_take_part_in_equality_and_hashing() -> None:
    a = _graph_with(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    b = _graph_with(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]]))
    c = _graph_with(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    assert a != b and a == c and hash(a) == hash(c)
    assert "constant %k" in str(a)


def test_a_captured_graph_with_constants_round_trips() -> None:
    graph = capture(_masked_sum, _x_mask())
    again = from_json(to_json(graph))
    assert again == graph
    assert_matches_eager(_masked_sum, _x_mask(), again)


def test_documented_byte_encoding() -> None:
    d = graph_to_dict(_graph_with(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])))
    (entry,) = d["constants"]
    assert entry["meta"]["shape"] == [2, 3] and entry["meta"]["dtype"] == "float32"
    assert base64.b64decode(entry["data"], validate=True) == struct.pack("<6f", 1, 2, 3, 4, 5, 6)  # little-endian


def _constant_entry(**change) -> str:
    d = graph_to_dict(_graph_with(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])))
    d["constants"][0].update(change)
    return json.dumps(d)


def _renamed_to_x() -> dict:
    d = json.loads(_constant_entry(name="x"))
    d["nodes"][0]["args"] = [{"value": "x"}]
    return d


def _meta(**change):
    meta = {"shape": [2, 3], "stride": [3, 1], "storage_offset": 0, "dtype": "float32", "device": "cpu"}
    meta.update(change)
    return meta


HOSTILE = [
    ("short data", _constant_entry(data=base64.b64encode(b"\0" * 20).decode()), "24 bytes"),
    ("long data", _constant_entry(data=base64.b64encode(b"\0" * 28).decode()), "24 bytes"),
    ("not base64", _constant_entry(data="!!!not base64!!!"), "constants[0].data: not valid base64"),
    ("data not a string", _constant_entry(data=[1, 2, 3]), "constants[0].data"),
    ("unknown dtype", _constant_entry(meta=_meta(dtype="float99")), "constants[0].meta.dtype: unknown dtype"),
    ("non-contiguous", _constant_entry(meta=_meta(stride=[1, 2])), "contiguous"),
    ("offset", _constant_entry(meta=_meta(storage_offset=1)), "contiguous"),
    ("huge", _constant_entry(meta=_meta(shape=[2**40, 3], stride=[3, 1])), "constants[0]: 13194139533312 bytes"),
    ("bad name", _constant_entry(name="k; import os"), "constants[0].name"),
    ("name clash", json.dumps(_renamed_to_x()), "constants[0]: value name 'x' is also inputs[0]"),
    ("missing meta", json.dumps({**json.loads(_constant_entry()), "constants": [{"name": "k", "data": ""}]}),
     "constants[0].meta: missing"),
    ("constants not a list", json.dumps({**json.loads(_constant_entry()), "constants": {"k": 1}}), "constants"),
]


@pytest.mark.parametrize("name,text,words", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_constants_are_refused(name, text, words) -> None:
    with pytest.raises(GraphFormatError) as err:
        from_json(text)
    assert words in str(err.value)


def test_constant_data_must_match_its_meta_in_the_ir() -> None:
    meta = TensorMeta((2,), (1,), 0, torch.float32, "cpu")
    with pytest.raises(GraphError, match="8 bytes"):
        GraphConstant("k", meta, b"\0" * 7)


def test_constants_are_moved_to_the_graph_device_when_compiled() -> None:
    graph = capture(_tensor_in_body, _x())
    program = CompiledProgram(apply_aliases(segment(graph), "post"))
    assert all(t.device == torch.device(c.meta.device) for c, t in zip(graph.constants, program.constants.values()))


def test_bind_inputs_needs_no_constants() -> None:
    graph = capture(_list_index, _x())
    x = torch.randn(4, 3)
    assert len(bind_inputs(graph, None, [x])) == 1
    assert copy.deepcopy(graph) == graph


def test_json_graph_with_inplace_nodes_and_a_constant() -> None:
    d = graph_to_dict(_graph_with(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])))
    d["nodes"] = [{"name": "a", "op": "aten.add_.Tensor", "args": [{"value": "x"}, {"value": "k"}], "kwargs": {},
                   "outputs": ["a"], "metas": [d["inputs"][0]["meta"]]}]
    d["outputs"] = []
    graph = from_json(json.dumps(d))
    assert list(graph.mutated_inputs) == [0] and len(graph.constants) == 1
    x = torch.ones(2, 3)
    run_graph(graph, [x])
    torch.testing.assert_close(x, torch.tensor([[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]]))
