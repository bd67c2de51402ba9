"""from_fx: GraphModules with FakeTensor metadata, as AOTAutograd hands them to a backend."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from segmenter import Alias, FusionGraph, op_info
from segmenter.capturing.fx_import import CaptureError, from_fx
from segmenter.capturing.reference import clone_inputs

from .util import assert_matches_eager


def _mutating(x, y):
    x.mul_(2)
    return x + y, y.view(-1)


def test_copy_epilogue_becomes_a_mutation() -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    gm = make_fx(torch.func.functionalize(_mutating, remove="mutations"))(*clone_inputs([x, y]))
    assert any(n.target is torch.ops.aten.copy_.default for n in gm.graph.nodes)
    graph = from_fx(gm, [x, y])
    assert [(m.input, graph.producers[m.value].op) for m in graph.mutations] == [(0, "aten.mul.Tensor")]
    assert not any(op_info(n.op).mutates for n in graph.nodes)
    assert graph.output_aliases[0] is None
    assert graph.output_aliases[1] is not None and graph.output_aliases[1].source == "input"
    assert graph.output_aliases[1].index == 1
    assert_matches_eager(_mutating, [x, y], graph)


def test_inplace_graph_is_functionalized_first() -> None:
    def f(x):
        t = x * 2
        t.add_(1)
        x.sub_(t)
        return t

    x = torch.randn(5)
    gm = make_fx(f)(*clone_inputs([x]))
    assert any(op_info(f"aten.{n.target._opname}.{n.target._overloadname}").mutates
               for n in gm.graph.nodes if n.op == "call_function")
    graph = from_fx(gm, [x])
    assert list(graph.mutated_inputs) == [0]
    assert_matches_eager(f, [x], graph)


def test_mutated_inputs_as_extra_outputs() -> None:
    def functional(x, y):
        new_x = x * 2
        return new_x, new_x + y

    x, y = torch.randn(4), torch.randn(4)
    gm = make_fx(functional)(x, y)
    graph = from_fx(gm, [x, y], input_updates={0: 0})
    assert len(graph.outputs) == 1 and list(graph.mutated_inputs) == [0]

    def eager(x, y):
        x.mul_(2)
        return x + y

    assert_matches_eager(eager, [x, y], graph)


def test_symbolic_graph_is_specialized_to_example_shapes() -> None:
    def f(x):
        return (x * x.shape[0]).sum(-1)

    x = torch.randn(3, 5)
    gm = make_fx(f, tracing_mode="symbolic")(x)
    graph = from_fx(gm, [x])
    assert graph.metas[graph.outputs[0]].shape == (3,)
    assert_matches_eager(f, [x], graph)


def test_metas_come_from_fake_tensors_with_strides_and_offsets() -> None:
    def f(x):
        return x[1:].t().exp()

    base = torch.randn(50)
    x = base[2:26].view(4, 6)
    gm = make_fx(f, tracing_mode="fake")(x)
    graph = from_fx(gm, [x])
    assert graph.inputs[0].meta.storage_offset == 2
    sliced = graph.metas[graph.nodes[0].outputs[0]]
    assert (sliced.shape, sliced.stride, sliced.storage_offset) == ((3, 6), (6, 1), 8)


def test_torch_compile_aot_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.backends.common import aot_autograd

    seen: list[FusionGraph] = []

    def fw_compiler(gm: torch.fx.GraphModule, example_inputs):
        seen.append(from_fx(gm, example_inputs))
        return gm

    backend = aot_autograd(fw_compiler=fw_compiler, keep_inference_input_mutations=True)
    torch._dynamo.reset()
    compiled = torch.compile(_mutating, backend=backend, fullgraph=True)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        compiled(*clone_inputs([x, y]))
    torch._dynamo.reset()
    assert len(seen) == 1
    graph = seen[0]
    assert list(graph.mutated_inputs) == [0]
    assert_matches_eager(_mutating, [x, y], graph)


def test_wrong_number_of_example_inputs() -> None:
    gm = make_fx(lambda x: x + 1)(torch.randn(2))
    with pytest.raises(CaptureError, match="1 placeholders but 2 example inputs"):
        from_fx(gm, [torch.randn(2), torch.randn(2)])


def test_output_alias_of_output() -> None:
    def f(x):
        a = x.exp()
        return a, a[0]

    x = torch.randn(3, 2)
    graph = from_fx(make_fx(f)(x), [x])
    assert graph.output_aliases[0] is None
    assert graph.output_aliases[1] == Alias("output", 0, graph.output_aliases[1].layout)
    assert_matches_eager(f, [x], graph)
