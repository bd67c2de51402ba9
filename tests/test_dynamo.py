"""torch.compile(model, backend="fuseg"): inference and training match eager."""

from __future__ import annotations

import copy

import pytest
import torch

from perf import zoo
from runtime.dynamo import FusegCompiler


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_backend_is_registered_by_name() -> None:
    from torch._dynamo import list_backends

    assert "fuseg" in list_backends(exclude_tags=())


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny", "bert-tiny"])
def test_inference_matches_eager(name: str) -> None:
    model, inputs = zoo.get(name).factory()
    with torch.no_grad():
        expected = model(*inputs)[0]  # the first output (the hidden states), whatever transformers calls it
        got = torch.compile(model, backend="fuseg")(*inputs)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_training_gradients_match_eager() -> None:
    model, inputs = zoo.get("llama-tiny").factory()
    model.train()
    ours = copy.deepcopy(model)
    model(*inputs)[0].square().mean().backward()
    torch.compile(ours, backend="fuseg")(*inputs)[0].square().mean().backward()
    for (name, a), b in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


def _mutates(x, y):
    x.add_(y)
    return x * 2, y.view(-1)


def _mutates_both(a, b):
    a.add_(1)
    b.mul_(2)
    return a + b


def test_input_mutation_lands() -> None:
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ex, ey = x.clone(), y.clone()
    expected = _mutates(ex, ey)
    got = torch.compile(_mutates, backend="fuseg")(x, y)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(x, ex)
    assert got[1].untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def test_same_tensor_for_two_mutated_arguments() -> None:
    x = torch.randn(5)
    ex = x.clone()
    expected = _mutates_both(ex, ex)
    got = torch.compile(_mutates_both, backend="fuseg")(x, x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(x, ex)


@pytest.mark.parametrize("dynamic", [True, False])
def test_symbolic_sizes_planned_once_or_specialized_per_shape(dynamic: bool) -> None:
    """See Note [symbolic plans]: a graph with symbolic sizes gets one plan for every size (the
    default); ``FusegCompiler(dynamic=False)`` specializes it to each call's shapes."""
    compiler = FusegCompiler(dynamic=dynamic)
    from torch._dynamo.backends.common import aot_autograd

    fn = torch.compile(lambda x: (x * 2).softmax(-1), backend=aot_autograd(fw_compiler=compiler), dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 8)
        torch.testing.assert_close(fn(x), (x * 2).softmax(-1))
    if dynamic:
        assert len(compiler.compiled) == 1 and compiler.symbolic_refused == []
        assert compiler.compiled[0].sizes is not None
    else:
        shapes = {p.graph.inputs[-1].meta.shape for p in compiler.compiled}
        assert {(3, 8), (5, 8), (7, 8)} <= shapes


def _scores(s, m):
    return torch.ops.aten._safe_softmax(s * 0.25 + m, -1)


def test_safe_softmax_is_decomposed_into_one_row_kernel() -> None:
    """See Note [decompositions before segmenting]: SDPA's ``_safe_softmax`` (falcon's attention) is
    one normalization segment with the scale and mask before it, not an OPAQUE op on torch; a
    row that is all -inf gives zeros, a row with some -inf a softmax of the rest."""
    from runtime.codegen.build import cpu_compiler
    from runtime.dynamo import aot_backend
    from segmenter import SegmentKind

    s, m = torch.randn(2, 4, 8, 8), torch.zeros(2, 1, 8, 8)
    m[0, 0, 3] = float("-inf")  # every score of row 3 of batch 0, in every head
    m[1, 0, :, 5] = float("-inf")  # one key masked for every query of batch 1
    compiler = FusegCompiler()
    got = torch.compile(_scores, backend=aot_backend(compiler))(s, m)
    expected = _scores(s, m)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert got[0, :, 3].eq(0).all() and not got.isnan().any()
    (program,) = compiler.compiled
    ops = [n.op for seg in program.plan.segments for n in seg.nodes]
    assert "aten._safe_softmax.default" not in ops
    assert [seg.kind for seg in program.plan.segments] == [SegmentKind.NORMALIZATION]
    if cpu_compiler() is not None:
        assert program.backend_of == {0: "cpp"}, program.passed_over


def test_a_callers_dispatch_mode_never_sees_the_compile() -> None:
    """See Note [compiling outside the caller's modes]: the first call compiles; a TorchDispatchMode the
    caller has on sees the program run (real tensors), never our FakeTensor re-run of the graph."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.fake = 0
            self.real = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            if any(isinstance(t, FakeTensor) for t in tensors):
                self.fake += 1
            else:
                self.real += 1
            return func(*args, **(kwargs or {}))

    def fn(x):
        return torch.softmax(x * 2, -1) + 1

    x = torch.randn(4, 8)
    compiler = FusegCompiler()
    run = compiler(make_fx(fn)(x), [x])  # dynamo does not compile under a dispatch mode: called directly
    with Seen() as seen:
        (out,) = run([x])
    torch.testing.assert_close(out, fn(x))
    assert len(compiler.compiled) == 1 and seen.real > 0
    assert seen.fake == 0
