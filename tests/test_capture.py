"""Capture from PyTorch: graphs, metas, output aliasing and mutation recorded as eager has them."""

from __future__ import annotations

import copy

import pytest
import torch

from alias import apply_aliases
from perf import zoo
from runtime.compiled.program import CompiledProgram
from segmenter import OPAQUE_OPS, Alias, FusionGraph, OpKind, TensorMeta, op_info, segment
from segmenter.capturing.from_torch import bind_inputs, capture
from segmenter.capturing.reference import clone_inputs, evaluate, run_graph

from .util import alias_pattern, assert_matches_eager, layout


def _strided(shape: tuple[int, ...], offset: int = 3) -> torch.Tensor:
    """A non-contiguous input with a storage offset: the transpose of a slice of a bigger buffer."""
    rows, cols = shape
    base = torch.randn(offset + rows * cols + 5)
    return base[offset : offset + rows * cols].view(cols, rows).t()


# Each row: name, program, inputs, expected output_aliases (source, index) per output,
# expected mutated input indices.
def _p_view(x):
    return x.view(-1)


def _p_clone(x):
    return x.clone()


def _p_select_after_mutation(x):
    y = x[0]
    x.add_(1)
    return y


def _p_twice(x):
    return x, x


def _p_output_of_output(x):
    a = x + 1
    return a, a.view(-1)


def _p_slice_t_pointwise(x):
    return x[1:].t() * 2


def _p_expand_reshape(x):
    return x.unsqueeze(0).expand(3, *x.shape).reshape(-1)


def _p_mutate_and_return(x, y):
    x.mul_(y)
    return x


def _p_dead_inplace(x):
    a = x * 2
    a.add_(1)
    return x.sin()


ALIAS_TABLE = [
    ("view", _p_view, lambda: [torch.randn(4, 6)], [("input", 0)], []),
    ("clone", _p_clone, lambda: [torch.randn(4, 6)], [None], []),
    ("select-after-mutation", _p_select_after_mutation, lambda: [_strided((4, 6))], [("input", 0)], [0]),
    ("returned-twice", _p_twice, lambda: [torch.randn(3)], [("input", 0), ("input", 0)], []),
    ("view-of-output", _p_output_of_output, lambda: [torch.randn(2, 3)], [None, ("output", 0)], []),
    ("strided-slice-pointwise", _p_slice_t_pointwise, lambda: [_strided((4, 6))], [None], []),
    ("reshape-of-expand-is-copy", _p_expand_reshape, lambda: [torch.randn(2, 3)], [None], []),
    ("mutate-and-return", _p_mutate_and_return, lambda: [torch.randn(3, 4), torch.randn(4)], [("input", 0)], [0]),
    ("dead-inplace-on-intermediate", _p_dead_inplace, lambda: [torch.randn(5)], [None], []),
]


@pytest.mark.parametrize("name,fn,make_inputs,aliases,mutated", ALIAS_TABLE, ids=[r[0] for r in ALIAS_TABLE])
def test_alias_and_mutation_table(name, fn, make_inputs, aliases, mutated) -> None:
    torch.manual_seed(0)
    inputs = make_inputs()
    graph = capture(fn, clone_inputs(inputs))
    assert [None if a is None else (a.source, a.index) for a in graph.output_aliases] == aliases
    assert list(graph.mutated_inputs) == mutated
    assert not any(op_info(n.op).mutates for n in graph.nodes)
    assert_matches_eager(fn, inputs, graph)


def test_dead_inplace_on_intermediate_is_removed() -> None:
    graph = capture(_p_dead_inplace, [torch.randn(5)])
    assert [n.op for n in graph.nodes] == ["aten.sin.default"]


def test_inputs_passed_twice_share_storage() -> None:
    def f(a, b):
        return a + b, b[0]

    x = torch.randn(4)
    graph = capture(f, [x, x])
    assert graph.storage_groups() == [(0, 1)]
    assert graph.output_aliases[1] is not None and graph.output_aliases[1].source == "input"
    assert_matches_eager(f, [x, x], graph)


def test_input_and_its_slice_share_storage() -> None:
    def f(base, part):
        return base.sum() + part.sum(), part.t()

    base = torch.randn(4, 3)
    inputs = [base, base[:2]]
    graph = capture(f, inputs)
    assert graph.storage_groups() == [(0, 1)]
    assert graph.output_aliases[1] == Alias("input", 0, TensorMeta((3, 2), (1, 3), 0, torch.float32))
    assert_matches_eager(f, inputs, graph)


def _mutate_both(a, b):
    a.add_(1)
    b.mul_(2)
    return a + b


def _mutate_overlapping_halves(a, b):
    a.mul_(2)
    b.add_(1)
    return b.sum(0)


@pytest.mark.parametrize(
    "fn,make_args",
    [(_mutate_both, lambda base: [base, base]),
     (_mutate_overlapping_halves, lambda base: [base.view(4, 3)[:3], base.view(4, 3)[1:]]),
     (_mutate_both, lambda base: [base[:6], base[6:]])],
    ids=["same-tensor-twice", "overlapping-slices", "disjoint-slices"],
)
def test_mutating_arguments_that_share_a_storage(fn, make_args) -> None:
    base = torch.randn(12)
    args = make_args(base)
    graph = capture(fn, args)
    assert [i.role for i in graph.inputs] == ["storage"]
    assert list(graph.mutated_inputs) == [0]
    assert_matches_eager(fn, args, graph)
    import runtime
    from alias import MODES, apply_aliases

    for mode in MODES:  # and through segments, the alias pass and the runtime
        assert_matches_eager(fn, args, graph, program=runtime.compile(apply_aliases(segment(graph), mode)))


def test_batch_norm_running_stats_are_buffer_mutations() -> None:
    bn = torch.nn.BatchNorm1d(4).train()
    x = torch.randn(8, 4)
    graph = capture(copy.deepcopy(bn), [x])
    mutated = {graph.inputs[i].target for i in graph.mutated_inputs}
    assert {"running_mean", "running_var", "num_batches_tracked"} <= mutated
    assert all(graph.inputs[i].role == "buffer" for i in graph.mutated_inputs)
    eager_bn, graph_bn = copy.deepcopy(bn), copy.deepcopy(bn)
    from segmenter.capturing.reference import run_graph

    expected = eager_bn(x)
    (got,) = run_graph(graph, bind_inputs(graph, graph_bn, [x]))
    torch.testing.assert_close(got, expected)
    for name, buf in eager_bn.named_buffers():
        torch.testing.assert_close(graph_bn.get_buffer(name), buf, msg=name)


def _assert_metas_match_real_run(graph: FusionGraph, inputs: list[torch.Tensor]) -> None:
    env = evaluate(graph, inputs)
    for name, meta in graph.metas.items():
        real = TensorMeta.from_tensor(env[name])
        assert real.same_layout(meta), f"%{name}: recorded {meta}, real run {real}"


def test_rope_seed_capture_matches_eager() -> None:
    fn, inputs = zoo.get("rope-seed").factory()
    graph = capture(fn, inputs)
    assert all(op_info(n.op).kind != OpKind.OPAQUE for n in graph.nodes)
    assert graph.output_aliases == (None, None, None)  # q/k/v reshapes are real copies in eager
    _assert_metas_match_real_run(graph, inputs)
    assert_matches_eager(fn, inputs, graph)


HF_MODELS = ["gpt2-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny", "bert-tiny"]


@pytest.mark.parametrize("name", HF_MODELS)
def test_transformers_models_capture(name: str) -> None:
    pytest.importorskip("transformers")
    model, inputs = zoo.get(name).factory()
    graph = capture(model, inputs)
    for node in graph.nodes:
        info = op_info(node.op)
        assert info.known, f"{node.op} is not in the op table"
        if info.kind == OpKind.OPAQUE:
            assert node.op in OPAQUE_OPS, node.op
    full = bind_inputs(graph, model, inputs)
    _assert_metas_match_real_run(graph, full)
    with torch.no_grad():
        assert_matches_eager(model, inputs, graph, module=model, atol=1e-4, rtol=1e-4)


def test_capture_with_meta_weights_needs_no_memory() -> None:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        cfg = transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=32000, use_cache=False,
        )
        model = transformers.LlamaModel(cfg).eval()
    graph = capture(model, [torch.zeros(1, 256, dtype=torch.long, device="meta")])
    weight = next(i for i in graph.inputs if i.target == "embed_tokens.weight")
    assert weight.meta.shape == (32000, 4096) and weight.meta.device == "meta"
    assert graph.metas[graph.outputs[0]].shape == (1, 256, 4096)


def test_capture_under_fake_tensor_mode() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        lin = torch.nn.Linear(1024, 4096)
        x = torch.randn(8, 1024)
    graph = capture(lin, [x])
    assert [n.op for n in graph.nodes if op_info(n.op).kind == OpKind.MATMUL] == ["aten.addmm.default"]
    assert graph.metas[graph.outputs[0]].shape == (8, 4096)


def test_strided_input_layout_is_kept() -> None:
    x = _strided((4, 6), offset=7)
    graph = capture(_p_slice_t_pointwise, [x])
    assert layout(x)[:3] == (graph.inputs[0].meta.shape, graph.inputs[0].meta.stride, 7)
    sliced = graph.metas[graph.nodes[0].outputs[0]]
    assert sliced.storage_offset == x[1:].storage_offset()


def test_unknown_op_is_opaque_and_reported() -> None:
    @torch.library.custom_op("fuseg_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    def f(x):
        return torch.ops.fuseg_test.twice(x).sin()

    with pytest.warns(UserWarning, match="fuseg_test.twice.default"):
        graph = capture(f, [torch.randn(3)])
    info = op_info(graph.nodes[0].op)
    assert info.kind == OpKind.OPAQUE and not info.known
    assert_matches_eager(f, [torch.randn(3)], graph)


def _causal_lm(name: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    if name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       intermediate_size=64, vocab_size=100, max_position_embeddings=64)
        return transformers.LlamaForCausalLM(cfg).eval()
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_causal_lm_with_its_default_cache_is_captured(name: str) -> None:
    """use_cache is on by default: the model returns a cache object, flattened to its tensors
    (logits, then each layer's keys and values) with a warning saying so."""
    from segmenter.capturing.outputs import output_tensors

    torch.manual_seed(0)
    model = _causal_lm(name)
    assert model.config.use_cache
    ids = torch.randint(0, 100, (1, 8))
    # the cache's field and class names are transformers' (5.24 renamed past_key_values to cache):
    # what is checked is that the warning says a 4-tensor object was flattened, not what it is called
    with pytest.warns(UserWarning, match=r"flattened to their tensors: output\.\w+ \(\w+: 4 tensors\)"):
        graph = capture(model, (ids,))
    with torch.no_grad():
        expected = output_tensors(model(ids)).tensors
        plan = apply_aliases(segment(graph), "post")
        for got in (run_graph(graph, bind_inputs(graph, model, [ids])),
                    CompiledProgram(plan)(*bind_inputs(graph, model, [ids]))):
            assert len(got) == len(expected) == 5
            for g, e in zip(got, expected):
                assert layout(g) == layout(e)
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
            assert alias_pattern([ids], got) == alias_pattern([ids], expected)


def test_non_tensor_outputs_are_named_when_left_out() -> None:
    def f(x):
        return x + 1, 3, {"scale": 2.0, "y": x * 2}

    with pytest.warns(UserWarning, match=r"left out \(not tensors\): output\[1\] \(int\), output\[2\].scale \(float\)"):
        graph = capture(f, (torch.randn(3),))
    assert len(graph.outputs) == 2
