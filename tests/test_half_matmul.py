"""Note [half matmuls in float] (runtime/backends/half_matmul.py): an fp16/bf16 matmul on the CPU
runs as ATen's float32 op on widened operands, rounded back, where that was measured faster
than ATen's half op; otherwise, with deterministic algorithms, and under fixed choices, ATen's
half op runs as in eager. No test depends on which way a timing comes out: where the outcome
matters the measurement is replaced by a given verdict (as tests/test_autotune.py does)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime import autotune
from runtime.backends import half_matmul
from segmenter import SegmentKind, capture, segment
from tests.test_autotune import _given, cache  # noqa: F401 - the fresh verdict file (a fixture), given verdicts

H, BF = torch.float16, torch.bfloat16
pytestmark = pytest.mark.usefixtures("cache")  # a fresh verdict file, measuring on, in every test


def _program(fn, inputs):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="auto")


def _products(prog) -> list[int]:
    return [s.index for s in prog.plan.segments if s.kind == SegmentKind.MATMUL]


def _conv1d(x, w, b):  # GPT-2's Conv1D: x @ w + b over the flattened tokens
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


def _linear(x, w, b):  # a Linear: x @ w.t() + b
    return F.linear(x, w, b)


def _bmm(a, b):
    return torch.bmm(a, b) * 0.5


def _mm_t(a, b):
    return a @ b.t()


def _inputs(name, dtype, s):
    r = lambda *shape: torch.randn(*shape).to(dtype)  # noqa: E731
    return {
        "conv1d": [r(2, 8 * s, 48), r(48, 40), r(40)],
        "linear": [r(3, 4 * s, 32), r(24, 32), r(24)],
        "bmm": [r(3, 5 * s, 16), r(3, 16, 7 * s)],
        "mm-t": [r(6 * s, 40), r(9, 40)],
    }[name]


PROGRAMS = {"conv1d": _conv1d, "linear": _linear, "bmm": _bmm, "mm-t": _mm_t}


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("dtype", [H, BF])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_product_measured_faster_in_float_runs_in_float(monkeypatch, name, dtype) -> None:
    """Taken where the verdict says float: at two shapes, the values within eager's error against
    float64 (twice it plus one unit of the dtype), eager's dtype, shape and strides."""
    calls = _given(monkeypatch, True)
    fn = PROGRAMS[name]
    for s in (1, 3):
        inputs = _inputs(name, dtype, s)
        prog = _program(fn, inputs)
        assert [prog.backend_of[i] for i in _products(prog)] == ["half-matmul"]
        (got,) = prog(*inputs)
        want = fn(*inputs)
        ref = fn(*[t.double() for t in inputs])
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        assert _error(got, ref) <= 2 * _error(want, ref) + torch.finfo(dtype).eps
    # one measurement per shape, both ways on made-up operands (a kernel of half values beside a
    # product is measured too, its outputs a list: Note [kernels of 16-bit floats measured])
    products = [c for c in calls if isinstance(c[0], torch.Tensor)]
    assert len(products) == 2
    for in_float, aten in products:
        assert in_float.dtype == aten.dtype == dtype and in_float.shape == aten.shape


def test_the_product_is_what_float32_gives_rounded_once(monkeypatch) -> None:
    """The product in float32 and one rounding: the same bits as ATen's float op on the widened
    operands (what ``in_float`` says it is), for an fp16 Conv1D."""
    _given(monkeypatch, True)
    x, w, b = _inputs("conv1d", H, 2)
    (got,) = _program(_conv1d, [x, w, b])(x, w, b)
    assert torch.equal(got, _conv1d(x.float(), w.float(), b.float()).to(H))


def test_a_product_aten_is_faster_at_stays_atens_with_the_reason(monkeypatch) -> None:
    _given(monkeypatch, False)
    inputs = _inputs("conv1d", BF, 1)
    prog = _program(_conv1d, inputs)
    (i,) = _products(prog)
    assert prog.backend_of[i] == "torch"
    assert "ATen's bfloat16 op measured faster" in dict(prog.passed_over[i])["half-matmul"]
    assert torch.equal(prog(*inputs)[0], _conv1d(*inputs))  # eager's op, eager's bits


def test_the_verdict_is_kept_and_a_second_compile_measures_nothing(monkeypatch) -> None:
    calls = _given(monkeypatch, True)
    inputs = _inputs("linear", H, 1)
    _program(_linear, inputs)
    assert len(calls) == 1
    monkeypatch.setattr(autotune, "_MEMORY", {})  # a new process: the file, not memory
    prog = _program(_linear, inputs)
    assert len(calls) == 1
    assert [prog.backend_of[i] for i in _products(prog)] == ["half-matmul"]


def test_not_taken_with_deterministic_algorithms_or_fixed_choices(monkeypatch) -> None:
    calls = _given(monkeypatch, True)
    inputs = _inputs("conv1d", H, 1)
    torch.use_deterministic_algorithms(True)
    try:
        prog = _program(_conv1d, inputs)
    finally:
        torch.use_deterministic_algorithms(False)
    (i,) = _products(prog)
    assert prog.backend_of[i] == "torch" and "deterministic" in dict(prog.passed_over[i])["half-matmul"]
    with autotune.fixed("kernel"):
        prog = _program(_conv1d, inputs)
    assert prog.backend_of[i] == "torch" and "fixed" in dict(prog.passed_over[i])["half-matmul"]
    assert calls == []
    assert torch.equal(prog(*inputs)[0], _conv1d(*inputs))


def test_float32_products_are_not_asked(monkeypatch) -> None:
    calls = _given(monkeypatch, True)
    inputs = _inputs("conv1d", torch.float32, 1)
    prog = _program(_conv1d, inputs)
    (i,) = _products(prog)
    assert prog.backend_of[i] != "half-matmul"
    # (the cpp backend's own measurement of its kernel: its launch returns its outputs as a list)
    assert all(t.dtype == torch.float32 for pair in calls for side in pair
               for t in (side if isinstance(side, (list, tuple)) else [side]))


def test_a_big_product_is_measured_on_its_first_rows(monkeypatch) -> None:
    """Past ``_MEASURED_MACS`` multiply-adds both ways run on the first rows of A (and of a bias of
    A's rows), the rest of the layouts as planned, and the times kept are taken to all the rows:
    ATen's in proportion (Note [half matmuls in float])."""
    calls = _given(monkeypatch, True)
    monkeypatch.setattr(half_matmul, "_MEASURED_MACS", 48 * 40 * 4)
    monkeypatch.setattr(half_matmul, "_MIN_ROWS", 4)
    x, w, b = _inputs("conv1d", H, 2)  # 32 rows of A
    _program(lambda x, w, b2: torch.addmm(b2, x.reshape(-1, 48), w), [x, w, b.expand(32, 40).contiguous()])
    ((in_float, aten),) = calls
    assert in_float.shape == aten.shape == (4, 40)
    (verdict,) = [v for k, v in autotune._MEMORY[autotune.verdict_path()].items() if k.startswith("half matmul")]
    assert verdict.aten_us == pytest.approx(2.0 * 32 / 4)  # the given 2 us on 4 rows, for 32
    assert 1.0 <= verdict.kernel_us <= 1.0 * 32 / 4  # the widening of B counted once, the rest in proportion


def test_a_product_of_few_rows_is_measured_whole(monkeypatch) -> None:
    """Never fewer than ``_MIN_ROWS`` rows: a few rows may take another path in ATen."""
    calls = _given(monkeypatch, True)
    monkeypatch.setattr(half_matmul, "_MEASURED_MACS", 48 * 40 * 4)
    x, w, b = _inputs("conv1d", H, 2)  # 32 rows, under _MIN_ROWS
    _program(_conv1d, [x, w, b])
    ((in_float, aten),) = calls
    assert in_float.shape == aten.shape == (32, 40)


def test_a_big_product_is_rounded_into_its_own_buffer(monkeypatch) -> None:
    """A product of at least ``pages.HUGE_MIN`` bytes goes into a buffer the program allocates
    (Note [huge pages for big buffers]): rounded as it is copied there, the same values."""
    from runtime.storage import pages

    _given(monkeypatch, True)
    monkeypatch.setattr(pages, "HUGE_MIN", 1024)
    a, b = torch.randn(64, 40).to(H), torch.randn(40, 48).to(H)  # [64, 48]: 6 KiB
    prog = _program(lambda a, b: torch.mm(a, b), [a, b])
    assert "out=" in prog.source and [prog.backend_of[i] for i in _products(prog)] == ["half-matmul"]
    (got,) = prog(a, b)
    assert got.dtype == H and torch.equal(got, (a.float() @ b.float()).to(H))


def test_an_fp16_gpt2_runs_its_products_in_float_within_eagers_error(monkeypatch) -> None:
    """A whole fp16 model (GPT-2's Conv1D projections, tiny): every product in float, the logits
    within eager's error against the float64 model plus one fp16 unit."""
    from perf.models import MODELS

    _given(monkeypatch, True)
    model, inputs = MODELS["gpt2-tiny"]()
    model = model.eval()
    ref = model.double()(*inputs)
    ref = (ref.logits if hasattr(ref, "logits") else ref[0]).double()
    model = model.to(H)
    prog = runtime.compile_module(model, inputs)
    program = prog.program
    kinds = [program.backend_of[i] for i in _products(program)]
    assert kinds and set(kinds) == {"half-matmul"}
    with torch.no_grad():
        out, want = prog(*inputs), model(*inputs)
    got = out.logits if hasattr(out, "logits") else out[0]
    want = want.logits if hasattr(want, "logits") else want[0]
    assert got.dtype == H and got.shape == want.shape
    assert _error(got, ref) <= 2 * _error(want, ref) + torch.finfo(H).eps


def _in_turn(monkeypatch, verdicts: list[bool]) -> list:
    """Measurements return these verdicts in turn (float way or ATen); the list gets the shapes of
    A each measurement made up."""
    calls: list = []

    def fake(run_kernel, run_aten):
        calls.append(tuple(run_aten().shape))
        kernel = verdicts[len(calls) - 1]
        return autotune.Verdict(kernel, 1.0, 2.0) if kernel else autotune.Verdict(False, 2.0, 1.0)

    monkeypatch.setattr(autotune, "measure", fake)
    return calls


def _symbolic_product(compiler):
    from runtime.dynamo import compile_with_aot

    torch._dynamo.reset()
    return torch.compile(lambda x, w: x @ w, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)


def test_a_symbolic_plans_product_is_chosen_again_for_each_size_class(monkeypatch) -> None:
    """The plan's first sizes (40 rows) measured faster in float; the class of 2-3 rows is
    measured at its first call (ATen here) and runs eager's op, eager's bits; 50 and 60 rows share
    40's class (float32's product rounded once). One plan, two measurements; another process
    measures nothing (Note [half matmuls chosen by class])."""
    from runtime.dynamo import FusegCompiler

    calls = _in_turn(monkeypatch, [True, False])
    compiler = FusegCompiler()
    fn = _symbolic_product(compiler)
    w = torch.randn(32, 24).to(H)
    with torch.no_grad():
        for n in (40, 3, 50, 2, 60):
            x = torch.randn(n, 32).to(H)
            got = fn(x, w)
            want = (x.float() @ w.float()).to(H) if n >= 32 else x @ w
            assert torch.equal(got, want) and got.stride() == (x @ w).stride(), n
    assert calls == [(40, 24), (3, 24)]
    (program,) = compiler.compiled
    assert program.sizes is not None
    (i,) = _products(program)
    assert program.backend_of[i] == "half-matmul"
    by_class = program._chosen[i].by_class
    assert len(by_class.measured) == 1 and by_class.measured[0].startswith("half matmul in float: aten.mm.default float16 (2, 4)x")
    assert sorted(by_class.table.values(), key=lambda f: f.__name__) == [half_matmul.in_float, half_matmul.on_aten]
    monkeypatch.setattr(autotune, "_MEMORY", {})  # a new process: the verdicts come from the file
    compiler = FusegCompiler()
    fn = _symbolic_product(compiler)
    with torch.no_grad():
        for n in (40, 3):
            x = torch.randn(n, 32).to(H)
            assert torch.equal(fn(x, w), (x.float() @ w.float()).to(H) if n >= 32 else x @ w)
    assert len(calls) == 2
    torch._dynamo.reset()


def test_a_class_chosen_at_the_call_runs_atens_op_under_deterministic_algorithms(monkeypatch) -> None:
    """Deterministic algorithms on at a call of a product chosen by class (dynamo compiles again
    when they change; a program called as it is still gets here): ATen's op, eager's bits, in a
    class the table holds as float too, and nothing measured or kept."""
    from runtime.dynamo import FusegCompiler

    calls = _in_turn(monkeypatch, [True])
    compiler = FusegCompiler()
    fn = _symbolic_product(compiler)
    w = torch.randn(32, 24).to(H)
    x = torch.randn(40, 32).to(H)
    with torch.no_grad():
        for _ in range(2):  # (the first call runs under a dispatch mode of AOTAutograd's: the float way, nothing kept)
            assert torch.equal(fn(x, w), (x.float() @ w.float()).to(H))
    (program,) = compiler.compiled
    (i,) = _products(program)
    by_class = program._chosen[i].by_class
    table = dict(by_class.table)
    assert list(table.values()) == [half_matmul.in_float]
    torch.use_deterministic_algorithms(True)
    try:
        for n in (40, 5):
            x = torch.randn(n, 32).to(H)
            assert torch.equal(by_class(torch.ops.aten.mm.default, x, w), x @ w)
    finally:
        torch.use_deterministic_algorithms(False)
    assert calls == [(40, 24)] and by_class.measured == [] and by_class.table == table
    torch._dynamo.reset()
