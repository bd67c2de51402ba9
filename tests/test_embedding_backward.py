"""The weight gradient of an embedding (``aten.embedding_dense_backward``) as a generated C++
kernel (runtime/codegen/opaque/embedding.py, Note [embedding backward kernels]): a table of the calls the
cpp backend takes, each equal to eager's to the bit (values, layout), the ones it declines with
the reason, and training through ``torch.compile`` at two lengths against eager."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import runtime
from alias import apply_aliases
from runtime.dynamo import FusegCompiler, compile_with_aot
from segmenter import SegmentKind, from_fx, segment

OP = "aten.embedding_dense_backward.default"


def _backward(rows: int, padding_idx: int = -1, scale: bool = False):
    return lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, rows, padding_idx, scale)


def _program(fn, inputs):
    """``fn`` traced with the op kept whole (capture's decompositions would split it), planned
    and compiled."""
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    return runtime.compile(apply_aliases(segment(graph), "post"))


def _segment_of(prog) -> int:
    (i,) = [s.index for s in prog.plan.segments if s.kind == SegmentKind.OPAQUE and any(n.op == OP for n in s.nodes)]
    return i


def _ids(n: int, *shape, dtype=torch.int64):
    return torch.randint(0, n, shape, dtype=dtype, generator=torch.Generator().manual_seed(sum(shape) + n))


def _repeats(n: int, *shape):
    """Indices that name few rows many times: each row's sum has many terms, in index order."""
    return _ids(3, *shape) * (n // 3)


# (name, program, inputs): index ranks, dtypes and layouts; gradients of other layouts; rows
# named many times (the order of the additions is ATen's); padding_idx, indices outside the
# rows (they add nothing, as in ATen); widths over one block of columns; work worth threads
BACKWARDS = [
    ("2d-ids", _backward(50), [torch.randn(2, 7, 16), _ids(50, 2, 7)]),
    ("1d-ids", _backward(10), [torch.randn(9, 3), _ids(10, 9)]),
    ("0d-id", _backward(10), [torch.randn(3), torch.tensor(4)]),
    ("int32-ids", _backward(30), [torch.randn(4, 5, 8), _ids(30, 4, 5, dtype=torch.int32)]),
    ("strided-ids", lambda g, i: _backward(20)(g, i[:, ::2]), [torch.randn(3, 5, 4), _ids(20, 3, 10)]),
    ("expanded-ids", lambda g, i: _backward(20)(g, i.expand(3, 6)), [torch.randn(3, 6, 4), _ids(20, 1, 6)]),
    ("transposed-grad", lambda g, i: _backward(20)(g.transpose(0, 1), i), [torch.randn(6, 2, 8), _ids(20, 2, 6)]),
    ("column-strided-grad", lambda g, i: _backward(20)(g.transpose(1, 2), i), [torch.randn(2, 8, 6), _ids(20, 2, 6)]),
    ("expanded-grad", lambda g, i: _backward(20)(g.expand(2, 6, 8), i), [torch.randn(1, 6, 8), _ids(20, 2, 6)]),
    ("repeated-rows", _backward(12), [torch.randn(4, 64, 24), _repeats(12, 4, 64)]),
    ("double", _backward(12), [torch.randn(2, 3, 5, dtype=torch.float64), _repeats(12, 2, 3)]),
    ("padding-idx", _backward(10, padding_idx=0), [torch.randn(1, 6, 4), torch.tensor([[0, 3, 0, 9, 3, 0]])]),
    ("out-of-range", _backward(10), [torch.randn(1, 5, 4), torch.tensor([[-1, 3, 10, 2**40, 3]])]),
    ("padding-idx-outside-rows", _backward(10, padding_idx=2**62), [torch.randn(1, 4, 4), torch.tensor([[1, 3, 1, 9]])]),
    ("padding-idx-int64-min", _backward(10, padding_idx=-(2**63)), [torch.randn(1, 4, 4), torch.tensor([[1, 3, 1, 9]])]),
    ("wide", _backward(40), [torch.randn(2, 5, 200), _ids(40, 2, 5)]),
    ("threaded", _backward(300), [torch.randn(4, 64, 256), _repeats(300, 4, 64)]),
]


@pytest.mark.parametrize("name,fn,inputs", BACKWARDS, ids=[t[0] for t in BACKWARDS])
def test_embedding_backwards_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_embedding_backward_")
    want = fn(*inputs)
    for call in (prog, prog.run_checked):
        (got,) = call(*inputs)
        assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
        assert torch.equal(got, want), name  # ATen's sums, in ATen's order, to the bit


def test_a_second_call_starts_from_zeros() -> None:
    fn, inputs = BACKWARDS[0][1], BACKWARDS[0][2]
    prog = _program(fn, inputs)
    other = [torch.randn(2, 7, 16), _ids(50, 2, 7).flip(0)]
    for args in (inputs, other, inputs):
        assert torch.equal(prog(*args)[0], fn(*args))


def test_only_the_big_backward_shares_its_columns_among_threads() -> None:
    bodies = {}
    for name, fn, inputs in BACKWARDS:
        if name in ("threaded", "2d-ids"):
            prog = _program(fn, inputs)
            bodies[name] = prog.kernels[_segment_of(prog)].body
    assert "omp parallel" in bodies["threaded"] and "omp parallel" not in bodies["2d-ids"]


# (name, program, inputs, why): calls the generator declines; they run on ATen, still right
DECLINED = [
    ("scale-by-freq", _backward(10, scale=True), [torch.randn(2, 3, 4), _ids(10, 2, 3)], "scale_grad_by_freq"),
    ("half", _backward(10), [torch.randn(2, 3, 4).half(), _ids(10, 2, 3)], "float16 gradient"),
    ("bfloat16", _backward(10), [torch.randn(2, 3, 4).bfloat16(), _ids(10, 2, 3)], "bfloat16 gradient"),
]


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[t[0] for t in DECLINED])
def test_declined_embedding_backwards_run_on_torch_with_the_reason(name, fn, inputs, why) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog)
    assert prog.backend_of[i] == "torch"
    assert why in str(dict(prog.passed_over[i]).get("cpp")), prog.passed_over[i]
    assert torch.equal(prog(*inputs)[0], fn(*inputs))


class _Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.words = torch.nn.Embedding(40, 16, padding_idx=0)
        self.places = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        places = torch.arange(ids.shape[1])
        return self.head(torch.tanh(self.words(ids) + self.places(places))).square().mean()


def test_training_at_two_lengths_takes_the_kernel_and_matches_eager() -> None:
    """The backward graph of both lengths (the second symbolic) runs the kernel; the loss and
    every gradient are eager's."""
    torch.manual_seed(0)
    model = _Tagger()
    compiler = FusegCompiler()
    compiled = torch.compile(model, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    for length in (9, 14, 11):
        ids = _ids(40, 3, length)
        ids[0, :2] = 0  # the padding row gets no gradient
        model.zero_grad(set_to_none=True)
        loss = compiled(ids)
        loss.backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        want_loss = model(ids)
        want_loss.backward()
        torch.testing.assert_close(loss, want_loss, atol=1e-6, rtol=1e-6)
        for g, p in zip(got, model.parameters()):
            assert g.stride() == p.grad.stride()
            torch.testing.assert_close(g, p.grad, atol=1e-6, rtol=1e-6)
        assert torch.all(model.words.weight.grad[0] == 0)
    kernels = [k.name for prog in compiler.compiled for k in prog.kernels.values()]
    assert sum(name.startswith("fuseg_embedding_backward_") for name in kernels) >= 4, kernels  # two tables, two plans
    assert any(prog.sizes is not None for prog in compiler.compiled if any(
        k.name.startswith("fuseg_embedding_backward_") for k in prog.kernels.values())), "no symbolic plan took it"


def test_a_symbolic_program_runs_at_several_token_counts() -> None:
    """One program of symbolic sizes (the token count a symbol), called at three counts."""
    fn = _backward(30)
    inputs = [torch.randn(2, 7, 8), _ids(30, 2, 7)]
    gm = make_fx(fn, tracing_mode="symbolic")(*inputs)
    prog = runtime.compile(apply_aliases(segment(from_fx(gm, list(inputs), symbolic=True)), "post"))
    i = _segment_of(prog)
    assert prog.sizes is not None and prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    for n in (7, 12, 3):
        args = [torch.randn(2, n, 8), _ids(30, 2, n)]
        assert torch.equal(prog(*args)[0], fn(*args))
