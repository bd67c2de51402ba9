"""Note [direct inference call] (runtime/dynamo.py): an inference graph whose AOTAutograd runtime
wrapper has nothing to do (no input mutation, no output that aliases, no tokens, no subclasses,
inputs as dynamo passes them) is called straight from dynamo's bytecode; everything else, and any
call the program's entry refuses, goes through AOTAutograd as before."""

from __future__ import annotations

import pytest
import torch

from runtime.dynamo import FusegCompiler, compile_with_aot


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _spy():
    """A backend that compiles as "fuseg" does and keeps each graph's compiler and callable."""
    seen: list[tuple[FusegCompiler, object]] = []

    def backend(gm, example_inputs):
        compiler = FusegCompiler()
        fn = compile_with_aot(compiler, gm, example_inputs)
        seen.append((compiler, fn))
        return fn

    return backend, seen


def _fallbacks(fn) -> int:
    return fn.fuseg_fallbacks[0]


def _softmax_plus(x, w):
    return torch.softmax(x * w, -1) + 1


def test_a_plain_inference_graph_is_called_directly() -> None:
    backend, seen = _spy()
    f = torch.compile(_softmax_plus, backend=backend)
    x, w = torch.randn(4, 8), torch.randn(8)
    with torch.no_grad():
        for _ in range(5):
            x.normal_()  # new values, same tensors: every call computes
            got = f(x, w)
            torch.testing.assert_close(got, _softmax_plus(x, w))
            assert got.stride() == (8, 1)
    ((compiler, fn),) = seen
    assert compiler.direct_refused is None
    assert _fallbacks(fn) == 1  # the first call compiles the program, through AOTAutograd
    assert len(compiler.compiled) == 1


def test_grad_enabled_inputs_without_grad_are_direct_and_outputs_need_no_grad() -> None:
    backend, seen = _spy()
    f = torch.compile(_softmax_plus, backend=backend)
    x, w = torch.randn(4, 8), torch.randn(8)
    for _ in range(3):
        got = f(x, w)
    assert not got.requires_grad and got.grad_fn is None
    torch.testing.assert_close(got, _softmax_plus(x, w))
    ((compiler, fn),) = seen
    assert compiler.direct_refused is None and _fallbacks(fn) == 1


def test_another_storage_offset_falls_back_and_recompiles_ours_only() -> None:
    """Dynamo's guards leave storage offsets out; the program's entry refuses them and the call
    takes AOTAutograd's path, which compiles a program for the new layout."""
    backend, seen = _spy()
    f = torch.compile(lambda x: torch.exp(x) * 2, backend=backend)
    base = torch.randn(100)
    a, b = base[0:40].view(4, 10), base[10:50].view(4, 10)
    with torch.no_grad():
        for t in (a, a, b, b, b):
            torch.testing.assert_close(f(t), torch.exp(t) * 2)
    ((compiler, fn),) = seen
    assert compiler.direct_refused is None
    assert _fallbacks(fn) == 2 and len(compiler.compiled) == 2


def _returns_view(x):
    return x.view(-1), x * 2


def _returns_input(x):
    return x, x * 2


def _mutates(x):
    x.mul_(2)
    return x + 1


def _same_output_twice(x):
    y = x * 2
    return y, y


def _returns_view_of_intermediate(x):
    return (x * 2).view(-1)


@pytest.mark.parametrize("fn, why", [
    (_returns_view, "aliases"),
    (_mutates, "mutates"),
    # dynamo itself returns an input, or one graph output twice: the graph has no alias to make
    (_returns_input, None),
    (_same_output_twice, None),
    # a view of an intermediate that dies: AOTAutograd's wrapper returned no view here either
    (_returns_view_of_intermediate, None),
])
def test_refused_where_the_wrapper_has_work(fn, why) -> None:
    backend, seen = _spy()
    f = torch.compile(fn, backend=backend)
    with torch.no_grad():
        x, ex = torch.empty(3, 4), torch.empty(3, 4)
        for _ in range(3):
            x.copy_(torch.randn(3, 4))
            ex.copy_(x)
            expected = fn(ex)
            got = f(x)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(x, ex)
    ((compiler, out),) = seen
    if why is None:
        assert compiler.direct_refused is None and _fallbacks(out) == 1
    else:
        assert compiler.direct_refused is not None and why in compiler.direct_refused
        assert not hasattr(out, "fuseg_fallbacks")
    if fn is _returns_view:
        assert got[0]._base is x
    if fn is _returns_input:
        assert got[0] is x
    if fn is _same_output_twice:
        assert got[0] is got[1]


def test_training_is_refused() -> None:
    backend, seen = _spy()
    w = torch.randn(8, requires_grad=True)
    f = torch.compile(_softmax_plus, backend=backend)
    x = torch.randn(4, 8)
    f(x, w).sum().backward()
    expected_grad = w.grad.clone()
    w.grad = None
    _softmax_plus(x, w).sum().backward()
    torch.testing.assert_close(expected_grad, w.grad)
    compiler, _ = seen[0]
    assert compiler.direct_refused is not None and "training" in compiler.direct_refused


def test_a_module_with_parameters_is_direct() -> None:
    """Dynamo lifts a module's parameters to graph inputs: the direct call receives them."""
    backend, seen = _spy()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    f = torch.compile(model, backend=backend)
    x = torch.randn(2, 8)
    with torch.no_grad():
        for _ in range(3):
            got = f(x)
        torch.testing.assert_close(got, model(x))
        model[0].weight.add_(1.0)  # a parameter changed in place: read afresh on the next call
        torch.testing.assert_close(f(x), model(x))
    ((compiler, fn),) = seen
    assert compiler.direct_refused is None and _fallbacks(fn) == 1


def test_the_backend_by_name_calls_directly() -> None:
    """``backend="fuseg"`` compiles through compile_with_aot: its graphs are called directly."""
    calls: list[int] = []
    import runtime.dynamo as rd

    real = rd.compile_with_aot

    def counting(compiler, gm, example_inputs):
        fn = real(compiler, gm, example_inputs)
        calls.append(compiler.direct_refused is None and hasattr(fn, "fuseg_fallbacks"))
        return fn

    rd.compile_with_aot = counting
    try:
        f = torch.compile(_softmax_plus, backend="fuseg")
        x, w = torch.randn(4, 8), torch.randn(8)
        with torch.no_grad():
            torch.testing.assert_close(f(x, w), _softmax_plus(x, w))
    finally:
        rd.compile_with_aot = real
    assert calls == [True]


def test_no_grad_then_training_each_get_their_own_graph() -> None:
    """Dynamo guards grad mode: the inference graph's direct call is never used for a call that
    needs autograd; that call gets a training graph through AOTAutograd, with correct grads."""
    backend, seen = _spy()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    f = torch.compile(model, backend=backend)
    x = torch.randn(2, 8)
    with torch.no_grad():
        f(x)
        torch.testing.assert_close(f(x), model(x))
    f(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert [c.direct_refused is None for c, _ in seen] == [True, False]
