"""Note [dynamo's values, translated] (segmenter/capturing/dynamo_values.py): a symbolic graph that writes
nothing takes its nodes' values from dynamo's, in our symbols, instead of running the graph again
on FakeTensors. Every graph so made is checked against the one the propagation makes from the
same graph and arguments (nodes, layouts over the symbols, aliases), and each program runs on
three sizes against eager (values, strides, aliasing, inputs afterwards)."""

from __future__ import annotations

import copy

import pytest
import torch

import runtime.dynamo as rd
import segmenter.capturing.fx_import as fx_import

from .test_dynamic import DYNAMIC_PROGRAMS, _run_dynamic


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _render(graph) -> str:
    return f"{graph}\n{[None if a is None else (a.source, a.index, str(a.layout)) for a in graph.output_aliases]}"


@pytest.fixture
def both_ways(monkeypatch):
    """Each symbolic ``from_fx`` of the compiler also made by propagation, and compared; returns
    the record: how many graphs were translated, and how many fell back."""
    record = {"translated": 0, "fell_back": 0, "graphs": 0}
    original, translate = rd.from_fx, fx_import.translated

    def counted(*args, **kwargs):
        done = translate(*args, **kwargs)
        record["translated" if done is not None else "fell_back"] += 1
        return done

    def compared(gm, args, **kwargs):
        if not kwargs.get("symbolic"):
            return original(gm, args, **kwargs)
        propagated = original(gm, list(args), **{**kwargs, "number_outputs": {}}, translate=False)
        graph = original(gm, args, **kwargs)
        assert _render(graph) == _render(propagated)
        record["graphs"] += 1
        return graph

    monkeypatch.setattr(fx_import, "translated", counted)
    monkeypatch.setattr(rd, "from_fx", compared)
    return record


@pytest.mark.parametrize("name", sorted(n for n in DYNAMIC_PROGRAMS if n != "mutates-input"))
def test_the_translated_graph_is_the_propagated_one(name: str, both_ways) -> None:
    fn, make = DYNAMIC_PROGRAMS[name]
    compiler = _run_dynamic(fn, make, (9, 11, 13))
    assert compiler.symbolic_refused == []
    assert both_ways == {"translated": 1, "fell_back": 0, "graphs": 1}


def test_a_graph_that_writes_is_retraced_not_translated(both_ways) -> None:
    fn, make = DYNAMIC_PROGRAMS["mutates-input"]
    _run_dynamic(fn, make, (9, 11, 13))
    assert both_ways["translated"] == 0 and both_ways["graphs"] == 1


def test_training_graphs_translated(both_ways) -> None:
    """A tiny Llama's forward and backward graphs at a second and third sequence length (the
    forward returns SymInts saved for the backward, which takes them): test_dynamic's training
    test (loss and every gradient against eager), with every symbolic graph compared."""
    from . import test_dynamic

    test_dynamic.test_training_on_several_sequence_lengths()
    assert both_ways["graphs"] >= 2 and both_ways["fell_back"] == 0, both_ways
    assert both_ways["translated"] == both_ways["graphs"]


def test_generation_graphs_translated(both_ways) -> None:
    """A tiny Qwen2's generate with the default cache at three prompt lengths: tokens equal
    eager's, and every symbolic graph was translated."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100, max_position_embeddings=128,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    ours = copy.deepcopy(model)
    ours.forward = torch.compile(ours.forward, backend="fuseg")
    with torch.no_grad():
        for n in (5, 9, 13):
            ids = torch.randint(3, 100, (1, n), generator=torch.Generator().manual_seed(n))
            want = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
            got = ours.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
            assert torch.equal(got, want), n
    assert both_ways["graphs"] >= 1 and both_ways["fell_back"] == 0, both_ways
    assert both_ways["translated"] == both_ways["graphs"]


def _two_views(x):
    return (x * 2)[1:], x.t()


def test_a_node_without_a_value_falls_back_to_propagation(monkeypatch) -> None:
    """A node whose ``meta['val']`` is missing (a pass added it without one) is no guess: the
    graph is propagated on FakeTensors instead, and the program is still right on three sizes."""
    calls = {"propagated": 0}
    propagate, original = fx_import._propagated, rd.from_fx

    def counted(*args, **kwargs):
        calls["propagated"] += 1
        return propagate(*args, **kwargs)

    def without_a_value(gm, args, **kwargs):
        if kwargs.get("symbolic"):
            mul = next(n for n in gm.graph.nodes if n.op == "call_function" and "mul" in str(n.target))
            mul.meta.pop("val")
        return original(gm, args, **kwargs)

    monkeypatch.setattr(fx_import, "_propagated", counted)
    monkeypatch.setattr(rd, "from_fx", without_a_value)
    compiler = _run_dynamic(_two_views, lambda n: [torch.randn(n, 3)], (9, 11, 13))
    assert compiler.symbolic_refused == [] and calls["propagated"] == 1
