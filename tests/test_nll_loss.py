"""The negative log-likelihood loss and its gradient (``aten.nll_loss_forward``,
``aten.nll_loss_backward``) as generated C++ kernels (runtime/codegen/opaque/nll_loss.py, Note [nll loss
kernels]): tables of the calls the cpp backend takes, each equal to eager's to the bit (values,
layouts, both outputs), targets out of range raising as eager does, the declines with their
reasons, and training a tiny LM through ``torch.compile`` at three lengths against eager."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import runtime
from alias import apply_aliases
from segmenter import SegmentKind, from_fx, segment

FORWARD = "aten.nll_loss_forward.default"
BACKWARD = "aten.nll_loss_backward.default"
MEAN, SUM, NONE = 1, 2, 0


def _program(fn, inputs):
    """``fn`` traced with the ops kept whole (capture's decompositions would split them)."""
    graph = from_fx(make_fx(fn)(*inputs), list(inputs))
    return runtime.compile(apply_aliases(segment(graph), "post"))


def _segment_of(prog, op: str) -> int:
    (i,) = [s.index for s in prog.plan.segments if s.kind == SegmentKind.OPAQUE and any(n.op == op for n in s.nodes)]
    return i


def _targets(classes: int, *shape, ignore: int | None = None, every: int = 3):
    t = torch.randint(0, classes, shape, generator=torch.Generator().manual_seed(sum(shape) + classes))
    if ignore is not None and t.dim():
        t[::every] = ignore
    return t


def _logp(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(sum(shape))).log_softmax(-1)


def _forward(reduction: int, ignore: int = -100, weighted: bool = False):
    if weighted:
        return lambda x, t, w: torch.ops.aten.nll_loss_forward(x, t, w, reduction, ignore)
    return lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, reduction, ignore)


# (name, program, inputs): reductions, ignore_index (rows ignored, all ignored, an ignore_index
# that is a class), weights, 1-D inputs, layouts, float64, enough rows for ATen's cascade of
# partial sums to carry over several levels (its order decides the float32 sum's bits)
FORWARDS = [
    ("mean", _forward(MEAN), [_logp(64, 128), _targets(128, 64)]),
    ("sum", _forward(SUM), [_logp(64, 128), _targets(128, 64)]),
    ("none", _forward(NONE), [_logp(64, 128), _targets(128, 64)]),
    ("mean-ignored", _forward(MEAN), [_logp(40, 9), _targets(9, 40, ignore=-100)]),
    ("none-ignored", _forward(NONE), [_logp(40, 9), _targets(9, 40, ignore=-100)]),
    ("mean-all-ignored", _forward(MEAN), [_logp(5, 9), torch.full((5,), -100)]),
    ("ignore-a-class", _forward(SUM, ignore=3), [_logp(30, 6), _targets(6, 30)]),
    ("ignore-int64-min", _forward(MEAN, ignore=-(2**63)), [_logp(30, 6), _targets(6, 30)]),
    ("weighted-mean", _forward(MEAN, weighted=True), [_logp(50, 7), _targets(7, 50, ignore=-100), torch.rand(7)]),
    ("weighted-sum", _forward(SUM, weighted=True), [_logp(50, 7), _targets(7, 50), torch.rand(7)]),
    ("weighted-none", _forward(NONE, weighted=True), [_logp(50, 7), _targets(7, 50, ignore=-100), torch.rand(7)]),
    ("1d-input", _forward(MEAN), [_logp(11), torch.tensor(4)]),
    ("1d-input-none", _forward(NONE, weighted=True), [_logp(11), torch.tensor(4), torch.rand(11)]),
    ("1d-input-ignored", _forward(MEAN), [_logp(11), torch.tensor(-100)]),
    ("transposed-input", lambda x, t: _forward(MEAN)(x.t(), t), [_logp(16, 40), _targets(16, 40)]),
    ("strided-targets", lambda x, t: _forward(SUM)(x, t[::2]), [_logp(20, 8), _targets(8, 40)]),
    ("strided-weight", lambda x, t, w: _forward(MEAN, weighted=True)(x, t, w[::2]),
     [_logp(20, 8), _targets(8, 20), torch.rand(16)]),
    ("double", _forward(MEAN), [_logp(33, 10, dtype=torch.float64), _targets(10, 33, ignore=-100)]),
    ("cascade", _forward(SUM), [_logp(5000, 3), _targets(3, 5000, ignore=-100, every=7)]),
    ("cascade-weighted", _forward(MEAN, weighted=True), [_logp(4099, 4), _targets(4, 4099), torch.rand(4) * 3]),
    ("threaded-none", _forward(NONE), [_logp(70000, 2), _targets(2, 70000)]),
    ("no-rows-mean", _forward(MEAN), [_logp(0, 5), _targets(5, 0)]),
    ("no-rows-sum", _forward(SUM), [_logp(0, 5), _targets(5, 0)]),
]


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == want.dtype
    assert torch.equal(got, want) or (got.isnan().all() and want.isnan().all()), (got, want)


@pytest.mark.parametrize("name,fn,inputs", FORWARDS, ids=[t[0] for t in FORWARDS])
def test_nll_loss_forwards_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog, FORWARD)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_nll_loss_")
    want = fn(*inputs)
    for call in (prog, prog.run_checked):
        got = call(*inputs)
        assert len(got) == 2
        for g, w in zip(got, want):
            _same(g, w)  # ATen's sums in ATen's cascade: to the bit


def _backward(reduction: int, ignore: int = -100, weighted: bool = False):
    """The gradient of the loss at ``x``: total_weight from the forward, as autograd passes it."""
    def fn(g, x, t, *w):
        weight = w[0] if weighted else None
        _, total = torch.ops.aten.nll_loss_forward(x, t, weight, reduction, ignore)
        return torch.ops.aten.nll_loss_backward(g, x, t, weight, reduction, ignore, total)
    return fn


BACKWARDS = [
    ("mean", _backward(MEAN), [torch.tensor(0.7), _logp(64, 128), _targets(128, 64)]),
    ("sum", _backward(SUM), [torch.tensor(1.3), _logp(64, 128), _targets(128, 64)]),
    ("none", _backward(NONE), [torch.randn(64), _logp(64, 128), _targets(128, 64)]),
    ("none-strided-grad", lambda g, x, t: _backward(NONE)(g[::2], x, t), [torch.randn(80), _logp(40, 9), _targets(9, 40)]),
    ("mean-ignored", _backward(MEAN), [torch.tensor(0.5), _logp(40, 9), _targets(9, 40, ignore=-100)]),
    ("mean-all-ignored", _backward(MEAN), [torch.tensor(1.0), _logp(5, 9), torch.full((5,), -100)]),
    ("weighted-mean", _backward(MEAN, weighted=True), [torch.tensor(2.0), _logp(50, 7), _targets(7, 50, ignore=-100),
                                                      torch.rand(7)]),
    ("weighted-none", _backward(NONE, weighted=True), [torch.randn(50), _logp(50, 7), _targets(7, 50), torch.rand(7)]),
    ("1d-input", _backward(MEAN), [torch.tensor(0.3), _logp(11), torch.tensor(4)]),
    ("1d-input-ignored", _backward(SUM), [torch.tensor(0.3), _logp(11), torch.tensor(-100)]),
    ("transposed-input", lambda g, x, t: _backward(MEAN)(g, x.t(), t), [torch.tensor(1.0), _logp(16, 40), _targets(16, 40)]),
    ("double", _backward(SUM), [torch.tensor(0.9, dtype=torch.float64), _logp(33, 10, dtype=torch.float64),
                                _targets(10, 33, ignore=-100)]),
    ("threaded", _backward(MEAN), [torch.tensor(1.0), _logp(512, 300), _targets(300, 512)]),
]


@pytest.mark.parametrize("name,fn,inputs", BACKWARDS, ids=[t[0] for t in BACKWARDS])
def test_nll_loss_backwards_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog, BACKWARD)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_nll_loss_backward_")
    want = fn(*inputs)
    for call in (prog, prog.run_checked):
        (got,) = call(*inputs)
        _same(got, want)


def test_a_second_call_starts_from_zeros() -> None:
    fn, inputs = BACKWARDS[0][1], BACKWARDS[0][2]
    prog = _program(fn, inputs)
    other = [inputs[0], inputs[1], _targets(128, 64)[torch.randperm(64, generator=torch.Generator().manual_seed(1))]]
    for args in (inputs, other, inputs):
        (got,) = prog(*args)
        assert torch.equal(got, fn(*args))


@pytest.mark.parametrize("fn,inputs,at,bad", [
    (_forward(MEAN), [_logp(6, 5), torch.tensor([0, 1, 4, 2, 3, 4])], 1, 5),
    (_forward(NONE), [_logp(6, 5), torch.tensor([0, 1, 4, 2, 3, 4])], 1, -1),
    (_backward(SUM), [torch.tensor(1.0), _logp(6, 5), torch.tensor([0, 1, 2, 2, 3, 4])], 2, 7),
], ids=["forward-mean", "forward-none-negative", "backward"])
def test_targets_out_of_range_raise_as_eager(fn, inputs, at, bad) -> None:
    prog = _program(fn, inputs)
    assert all(prog.backend_of[_segment_of(prog, op)] == "cpp"
               for op in (FORWARD, BACKWARD) if any(n.op == op for s in prog.plan.segments for n in s.nodes))
    wrong = [x.clone() for x in inputs]
    wrong[at][2] = bad
    with pytest.raises(IndexError, match="out of bounds"):
        fn(*wrong)
    with pytest.raises(IndexError, match="out of bounds"):
        prog(*wrong)
    want = fn(*inputs)
    want = want if isinstance(want, tuple) else (want,)
    assert all(torch.equal(g, w) for g, w in zip(prog(*inputs), want, strict=True))  # (and a good call after it)


# (name, program, inputs, reason): what the kernels leave to ATen
DECLINED = [
    ("bfloat16", _forward(MEAN), [_logp(8, 5).bfloat16(), _targets(5, 8)], "bfloat16"),
    ("half", _forward(SUM), [_logp(8, 5).half(), _targets(5, 8)], "float16"),
]


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[t[0] for t in DECLINED])
def test_declined_losses_run_on_aten_with_the_reason(name, fn, inputs, why) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog, FORWARD)
    assert prog.backend_of[i] == "torch"
    assert why in dict(prog.passed_over[i])["cpp"]
    for g, w in zip(prog(*inputs), fn(*inputs)):
        _same(g, w)


def test_training_a_tiny_lm_at_three_lengths_takes_the_kernels() -> None:
    """Through ``torch.compile``: the loss graphs run the kernels (a symbolic plan from the
    second length on), loss and every gradient equal to eager's within float32 rounding."""
    import copy

    transformers = pytest.importorskip("transformers")
    from runtime.dynamo import FusegCompiler, compile_with_aot

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, n_positions=64, vocab_size=50,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).train()
    ref = copy.deepcopy(model)
    compiler = FusegCompiler()
    step = torch.compile(model, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    for n in (8, 12, 16):
        ids = torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(n))
        ids[0, -2:] = -100  # labels ignored, as padding is
        loss = step(input_ids=ids.clamp(min=0), labels=ids).loss
        loss.backward()
        want = ref(input_ids=ids.clamp(min=0), labels=ids).loss
        want.backward()
        torch.testing.assert_close(loss, want, atol=1e-6, rtol=1e-6)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)
        model.zero_grad(), ref.zero_grad()
    names = [k.name for p in compiler.compiled for k in p.kernels.values() if k is not None]
    assert any(n.startswith("fuseg_nll_loss_backward_") for n in names)
    assert any(n.startswith("fuseg_nll_loss_") and "backward" not in n for n in names)
