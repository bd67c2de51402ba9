"""Choices by measurement (runtime/autotune.py, Note [choices by measurement]): the cpp backend's
verdict for a matmul, an attention or a lone softmax against ATen comes from this machine's cache
where it holds one and is measured (then kept) where it does not; a damaged or unwritable cache
is a cache; deterministic algorithms measure nothing; a symbolic plan's verdict is one per size
class, chosen at the call (Note [choices at the call]). No test here depends on which way a timing comes out: where the
outcome matters the measurement is replaced by a given verdict."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime import autotune
from runtime.codegen.build import cpu_compiler
from segmenter import SegmentKind, capture, segment

pytestmark = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache dir (so a fresh verdict file), measuring on."""
    monkeypatch.setenv("FUSEG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    with autotune.fixed("measure"):
        yield tmp_path


def _given(monkeypatch, kernel: bool) -> list:
    """Measurements return this verdict; the list gets a call per measurement."""
    calls: list = []

    def fake(run_kernel, run_aten):
        calls.append((run_kernel(), run_aten()))  # both run: each launch works on made-up inputs
        return autotune.Verdict(kernel, 1.0, 2.0) if kernel else autotune.Verdict(False, 2.0, 1.0)

    monkeypatch.setattr(autotune, "measure", fake)
    return calls


def _linear():
    return (lambda x, w, b: F.linear(x, w, b)), [torch.randn(16, 64), torch.randn(48, 64), torch.randn(48)]


def _program(fn, inputs, backend="auto"):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend=backend)


def _matmul(prog) -> int:
    (i,) = [s.index for s in prog.plan.segments if s.kind == SegmentKind.MATMUL]
    return i


def _verdicts() -> dict:
    """The verdict file's verdicts, as the dicts of its lines (Note [the verdict file is a log])."""
    with open(autotune.verdict_path(), encoding="utf-8") as f:
        lines = f.read().splitlines()
    return {v["key"]: v for v in map(json.loads, lines[1:])}


def test_a_measured_verdict_is_kept_and_later_choices_come_from_the_cache(cache, monkeypatch) -> None:
    fn, inputs = _linear()
    calls = _given(monkeypatch, kernel=True)
    prog = _program(fn, inputs)
    i = _matmul(prog)
    assert prog.backend_of[i] == "cpp" and len(calls) == 1
    (key,) = _verdicts()
    assert prog.kernels[i].name in key
    torch.testing.assert_close(prog(*inputs)[0], fn(*inputs), atol=1e-5, rtol=1e-5)
    # the cache says ATen (as another process could have measured it): nothing is measured again
    with open(autotune.verdict_path(), "a") as f:
        f.write(json.dumps({"key": key, "kernel": False, "kernel_us": 2.0, "aten_us": 1.0}) + "\n")
    monkeypatch.setattr(autotune, "_MEMORY", {})
    prog = _program(fn, inputs)
    assert prog.backend_of[i] == "torch" and "measured faster" in dict(prog.passed_over[i])["cpp"]
    assert len(calls) == 1
    torch.testing.assert_close(prog(*inputs)[0], fn(*inputs), atol=0, rtol=0)
    assert _program(fn, inputs, backend="cpp").backend_of[i] == "cpp"  # asked for: never measured, never declined


def test_a_kernel_that_loses_runs_on_aten_from_its_first_program(cache, monkeypatch) -> None:
    fn, inputs = _linear()
    calls = _given(monkeypatch, kernel=False)
    prog = _program(fn, inputs)
    i = _matmul(prog)
    assert len(calls) == 1 and prog.backend_of[i] == "torch"
    assert "measured faster" in dict(prog.passed_over[i])["cpp"]
    assert [v["kernel"] for v in _verdicts().values()] == [False]
    torch.testing.assert_close(prog(*inputs)[0], fn(*inputs), atol=0, rtol=0)


def test_the_verdict_file_names_the_machine(cache, monkeypatch) -> None:
    _given(monkeypatch, kernel=True)
    _program(*_linear())
    machine = json.loads(open(autotune.verdict_path()).readline())["machine"]
    assert set(machine) >= {"cpu", "cpu_flags", "compiler", "compiler_flags", "torch"}
    assert machine["compiler"].startswith(cpu_compiler())


def test_a_damaged_verdict_file_reads_as_empty_and_is_rewritten(cache, monkeypatch) -> None:
    with open(autotune.verdict_path(), "wb") as f:
        f.write(b"\x00{not json")
    calls = _given(monkeypatch, kernel=True)
    fn, inputs = _linear()
    prog = _program(fn, inputs)
    assert prog.backend_of[_matmul(prog)] == "cpp" and len(calls) == 1
    assert [v["kernel"] for v in _verdicts().values()] == [True]
    with open(autotune.verdict_path(), "w") as f:  # the right JSON, the wrong fields
        f.write(json.dumps({"machine": autotune.machine()}) + "\n" + json.dumps({"key": "x", "kernel": "yes"}) + "\n")
    monkeypatch.setattr(autotune, "_MEMORY", {})
    assert autotune.lookup("x") is None


def test_an_unwritable_verdict_file_keeps_the_verdicts_for_the_process(cache, monkeypatch) -> None:
    os.mkdir(autotune.verdict_path())  # a directory where the file goes: it can be neither read nor replaced
    calls = _given(monkeypatch, kernel=False)
    fn, inputs = _linear()
    prog = _program(fn, inputs)
    i = _matmul(prog)
    assert prog.backend_of[i] == "torch" and len(calls) == 1
    assert _program(fn, inputs).backend_of[i] == "torch" and len(calls) == 1  # remembered, not measured again
    assert os.path.isdir(autotune.verdict_path())


def test_deterministic_algorithms_measure_nothing_and_run_aten(cache, monkeypatch) -> None:
    calls = _given(monkeypatch, kernel=True)
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        fn, inputs = _linear()
        prog = _program(fn, inputs)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
    i = _matmul(prog)
    assert prog.backend_of[i] == "torch" and "use_deterministic_algorithms" in dict(prog.passed_over[i])["cpp"]
    assert calls == [] and not os.path.exists(autotune.verdict_path())


def test_a_lone_softmax_and_an_attention_are_measured_too(cache, monkeypatch) -> None:
    calls = _given(monkeypatch, kernel=False)
    x = torch.randn(8, 32)
    prog = _program(lambda t: t.softmax(-1), [x])
    assert prog.backend_of == {0: "torch"} and len(calls) == 1
    fused = _program(lambda t: (t * 2).softmax(-1), [x])
    assert fused.backend_of == {0: "cpp"} and len(calls) == 1  # fused: nothing to compare with
    from runtime.dynamo import FusegCompiler, aot_backend

    torch._dynamo.reset()
    compiler = FusegCompiler()
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with torch.no_grad():
        got = torch.compile(sdpa, backend=aot_backend(compiler))(q, k, v)
    (program,) = compiler.compiled
    assert "torch" in program.backend_of.values() and len(calls) == 2
    torch.testing.assert_close(got, sdpa(q, k, v), atol=0, rtol=0)
    torch._dynamo.reset()


# (name, program, inputs, measured): fused kernels of 16-bit floats are measured against their
# ATen ops, those of float32 values are not (Note [kernels of 16-bit floats measured])
def _h(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=dtype)


HALF_KERNELS = [  # (name, program, its inputs of a shape, measured)
    ("fp16-add", lambda x, y: x + y, lambda r, c: [_h(r, c), _h(r, c)], True),
    ("bf16-gelu", lambda x: F.gelu(x * 2), lambda r, c: [_h(r, c, dtype=torch.bfloat16)], True),
    ("fp16-rows-to-float", lambda x: F.layer_norm(x.float(), (x.shape[-1],)), lambda r, c: [_h(r, c)], True),
    ("float-to-bf16", lambda x: (x * 3).to(torch.bfloat16), lambda r, c: [torch.randn(r, c)], True),
    ("fp16-masked-fill", lambda x, m: x.masked_fill(m, 0.0) * 2, lambda r, c: [_h(r, c), torch.rand(r, c) > 0.5], True),
    ("float32-add", lambda x, y: x + y, lambda r, c: [torch.randn(r, c), torch.randn(r, c)], False),
]


@pytest.mark.parametrize("name,fn,make,measured", HALF_KERNELS, ids=[t[0] for t in HALF_KERNELS])
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-faster", "aten-faster"])
def test_kernels_of_16_bit_floats_are_measured(name, fn, make, measured, kernel, cache, monkeypatch) -> None:
    calls = _given(monkeypatch, kernel=kernel)
    for shape in ((8, 64), (5, 1000)):  # (a program of other sizes: other kernels, measured afresh)
        inputs = make(*shape)
        before = len(calls)
        prog = _program(fn, inputs)
        computed = [s.index for s in prog.plan.segments if s.kind != SegmentKind.METADATA]
        assert len(calls) - before == (len(computed) if measured else 0)
        ran = "cpp" if kernel or not measured else "torch"
        assert all(prog.backend_of[i] == ran for i in computed), (prog.backend_of, prog.passed_over)
        want = fn(*inputs)
        (got,) = prog(*inputs)
        if ran == "torch":
            assert torch.equal(got, want)  # ATen's ops, as eager runs them
        else:  # (a generated erf may round a bf16 value the other way)
            torch.testing.assert_close(got, want)


def test_kernels_of_16_bit_floats_run_unmeasured_under_deterministic_algorithms(cache, monkeypatch) -> None:
    calls = _given(monkeypatch, kernel=False)
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x = torch.randn(8, 64, dtype=torch.float16)
        prog = _program(lambda x, y: x + y, [x, x])
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)
    assert calls == [] and prog.backend_of == {0: "cpp"}
    assert torch.equal(prog(x, x)[0], x + x)


def test_size_classes() -> None:
    assert [autotune.size_class(n) for n in (0, 1, 2, 3, 7, 8, 1000)] == [
        (0, 1), (1, 2), (2, 4), (2, 4), (4, 8), (8, 16), (512, 1024)]


def _varying(monkeypatch, verdicts: list[bool]) -> list:
    """A class chosen at the call is decided on its calls (Note [a class measured on its
    calls]) with one timed call of each way (``SAMPLES``), and its verdict is these in turn (kernel
    or ATen, round again past the end); the list gets the timings of each verdict."""
    from runtime.backends import at_call

    calls: list = []

    def fake(kernel_us, aten_us):
        calls.append((list(kernel_us), list(aten_us)))
        kernel = verdicts[(len(calls) - 1) % len(verdicts)]
        return autotune.Verdict(kernel, 1.0, 2.0) if kernel else autotune.Verdict(False, 2.0, 1.0)

    monkeypatch.setattr(autotune, "verdict_of", fake)
    monkeypatch.setattr(at_call, "SAMPLES", 1)
    monkeypatch.setattr(at_call, "_TRIALS", {})
    return calls


#: calls of a size that decide its class with ``SAMPLES`` 1: the kernel and ATen untimed, then
#: timed, and one more (the first call of a graph runs under a mode of AOTAutograd's own)
_DECIDE = 5


def test_a_symbolic_plans_verdict_is_one_per_size_class_chosen_at_the_call(cache, monkeypatch) -> None:
    """See Note [choices at the call]: the kernel is one source for every size; its verdict holds for
    the power-of-two class of the sizes it reads, measured on the calls in that class (Note [a
    class measured on its calls]: each way timed on its own calls), and no condition of the plan:
    9 and 13 rows share a verdict (the kernel), 17 gets its own (ATen here), 5 its own (the
    kernel): one plan, no compiler run after the first size, every value eager's, whichever way
    ran."""
    from runtime.codegen import build
    from runtime.dynamo import FusegCompiler, compile_with_aot

    calls = _varying(monkeypatch, [True, False, True])
    torch._dynamo.reset()
    compiler = FusegCompiler()
    fn = torch.compile(lambda x, w: x @ w.t(), backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    w = torch.randn(24, 32)
    with torch.no_grad():
        for n in (9, 13):
            x = torch.randn(n, 32)
            for _ in range(_DECIDE):
                torch.testing.assert_close(fn(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
        assert len(compiler.compiled) == 1 and len(calls) == 1
        assert [len(t) for t in calls[0]] == [1, 1]  # (one timed call each way)
        builds = build.compilations["cpu"]
        for n in (17, 5, 20, 12):
            x = torch.randn(n, 32)
            for _ in range(_DECIDE):
                got = fn(x, w)
                torch.testing.assert_close(got, x @ w.t(), atol=1e-5, rtol=1e-5)
                assert got.stride() == (x @ w.t()).stride()
    assert len(compiler.compiled) == 1 and len(calls) == 3 and build.compilations["cpu"] == builds
    verdicts = _verdicts()
    classes = {k.rsplit(" in ", 1)[-1]: v["kernel"] for k, v in verdicts.items()}  # (the rows' size is read last)
    assert classes == {"[8, 16)": True, "[16, 32)": False, "[4, 8)": True}, verdicts
    (program,) = compiler.compiled
    (i,) = [s.index for s in program.plan.segments if s.kind == SegmentKind.MATMUL]
    assert program.backend_of[i] == "cpp" and program.chosen_at_call == {i}
    assert sorted(program._chosen[i].measured) == [(5, 6, 3), (5, 6, 4), (5, 6, 5)]  # (24, 32 and the rows)
    # another process finds the verdicts in the cache: nothing is measured again
    torch._dynamo.reset()
    monkeypatch.setattr(autotune, "_MEMORY", {})
    compiler = FusegCompiler()
    fn = torch.compile(lambda x, w: x @ w.t(), backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    with torch.no_grad():
        for n in (9, 13, 17, 5):
            x = torch.randn(n, 32)
            torch.testing.assert_close(fn(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
    assert len(calls) == 3
    torch._dynamo.reset()


def test_a_choice_at_the_call_keeps_aliasing_and_runs_under_grad(cache, monkeypatch) -> None:
    """A measured kernel chosen at the call in a symbolic program whose output is viewed and
    returned with its view, at three sizes in three classes, against eager: values, strides and
    the view's storage; then the same under autograd (a training graph), gradients included."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    _varying(monkeypatch, [True, False, True, False, True, False])

    def f(x, w):
        y = torch.relu(x @ w.t())
        return y, y.t(), y.sum(0)

    torch._dynamo.reset()
    compiler = FusegCompiler()
    fn = torch.compile(f, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    w = torch.randn(24, 32)
    with torch.no_grad():
        for n in (3, 9, 17):
            x = torch.randn(n, 32)
            for _ in range(_DECIDE):  # (the kernel and ATen each run: Note [a class measured on its calls])
                got, want = fn(x, w), f(x, w)
                for g, e in zip(got, want):
                    torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
                    assert g.stride() == e.stride()
                assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    for n in (3, 9, 17) * _DECIDE:
        x = torch.randn(n, 32, requires_grad=True)
        wg = w.clone().requires_grad_(True)
        sum(t.sum() for t in fn(x, wg)).backward()
        xe, we = x.detach().clone().requires_grad_(True), w.clone().requires_grad_(True)
        sum(t.sum() for t in f(xe, we)).backward()
        torch.testing.assert_close(x.grad, xe.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(wg.grad, we.grad, atol=1e-4, rtol=1e-4)
    assert all(p.chosen_at_call for p in compiler.compiled) and len(compiler.compiled) >= 3  # inference, forward, backward
    torch._dynamo.reset()


def test_measuring_gives_both_times() -> None:
    verdict = autotune.measure(lambda: torch.ones(4).sum(), lambda: torch.ones(4).sum())
    assert verdict.kernel_us > 0 and verdict.aten_us > 0 and verdict.kernel == (verdict.kernel_us <= verdict.aten_us)


def test_a_choice_at_the_call_measures_nothing_under_a_callers_dispatch_mode(cache, monkeypatch) -> None:
    """A call in an undecided class made under a dispatch mode of the caller's (a FLOP counter, a
    tracer) runs the kernel once, untimed, so the mode sees no more than one run; the class's
    calls without the mode measure it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from runtime.dynamo import FusegCompiler, compile_with_aot

    class Seen(TorchDispatchMode):
        ops: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    calls = _varying(monkeypatch, [True, False])
    torch._dynamo.reset()
    compiler = FusegCompiler()
    fn = torch.compile(lambda x, w: x @ w.t(), backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    w = torch.randn(24, 32)
    with torch.no_grad():
        for _ in range(_DECIDE):
            fn(torch.randn(9, 32), w)
    assert len(calls) == 1
    (program,) = compiler.compiled
    (i,) = program.chosen_at_call
    launch = program._chosen[i]
    ran: list[str] = []
    kernel, aten = (lambda *a: ran.append("kernel")), (lambda *a: ran.append("aten"))
    bits, x = (5, 6, 5), torch.randn(17, 32)
    trial = launch._choose(kernel, aten, bits, x, w)
    assert launch.table[bits] is trial and ran == []
    with Seen():
        for _ in range(3):
            launch.table[bits](x, w)
    assert ran == ["kernel"] * 3 and len(calls) == 1 and Seen.ops == []
    for _ in range(4):
        launch.table[bits](x, w)
    assert ran[3:] == ["kernel", "aten", "kernel", "aten"]  # one way a call, in turn
    assert len(calls) == 2 and launch.table[bits] is aten  # (the second given verdict: ATen)
    torch._dynamo.reset()


def test_launches_of_one_kernel_share_a_classs_trial(cache, monkeypatch) -> None:
    """Two launches of one kernel source (a model's layers) measure a class together: their
    calls take turns in one trial, and both take the verdict; a trial under way follows a fixed
    policy (``autotune.fixed``) untimed."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    calls = _varying(monkeypatch, [False])
    launches = []
    for _ in range(2):
        torch._dynamo.reset()
        compiler = FusegCompiler()
        fn = torch.compile(lambda x, w: x @ w.t(), backend=lambda gm, ex, c=compiler: compile_with_aot(c, gm, ex), dynamic=True)
        with torch.no_grad():
            fn(torch.randn(9, 32), torch.randn(24, 32))  # (under AOTAutograd's mode: the kernel, untimed)
        (program,) = compiler.compiled
        (i,) = program.chosen_at_call
        launches.append(program._chosen[i])
    torch._dynamo.reset()
    a, b = launches
    assert a.kernel.name == b.kernel.name and a is not b
    ran: list[str] = []
    ways = {k: ((lambda *_, k=k: ran.append(f"{k} kernel")), (lambda *_, k=k: ran.append(f"{k} aten"))) for k in "ab"}
    bits = (6, 6, 5)
    ta, tb = a._choose(*ways["a"], bits), b._choose(*ways["b"], bits)
    assert ta.func.__self__ is tb.func.__self__  # one trial
    with autotune.fixed("aten"):
        ta()
    assert ran == ["a aten"]
    ta(), tb(), ta(), tb()
    assert ran[1:] == ["a kernel", "b aten", "a kernel", "b aten"] and len(calls) == 1
    assert b.table[bits] is ways["b"][1] and a.table[bits] is ta  # (a hears of the verdict at its next call)
    ta()
    assert ran[-1] == "a aten" and a.table[bits] is ways["a"][1] and len(calls) == 1
    assert b.measured == [bits] and a.measured == []


def test_the_verdict_file_is_a_log_appended_a_line_a_verdict(cache) -> None:
    """See Note [the verdict file is a log]: the machine's line, then a line a verdict, appended; a
    line another process appended meanwhile is kept, a line cut short is no verdict, a later line
    for a key wins."""
    path = autotune.verdict_path()
    autotune.record("k1", autotune.Verdict(True, 1.0, 2.0))
    lines = open(path).read().splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == {"machine": autotune.machine()}
    with open(path, "a") as f:  # another process's verdict, then a write cut short
        f.write(json.dumps({"key": "k2", "kernel": False, "kernel_us": 3.0, "aten_us": 1.0}) + "\n")
        f.write('{"key": "k3", "kern')
    autotune.record("k1", autotune.Verdict(False, 5.0, 2.0))
    assert len(open(path).read().splitlines()) == 5  # appended on a line of its own: nothing written again
    autotune._MEMORY.clear()
    assert autotune.lookup("k1") == autotune.Verdict(False, 5.0, 2.0)
    assert autotune.lookup("k2") == autotune.Verdict(False, 3.0, 1.0) and autotune.lookup("k3") is None


def test_a_verdict_file_of_another_form_or_overgrown_is_written_again_whole(cache) -> None:
    path = autotune.verdict_path()
    with open(path, "w") as f:  # one JSON object with every verdict (how fuseg wrote it before)
        json.dump({"machine": autotune.machine(), "verdicts": {"old": {"kernel": True, "kernel_us": 1, "aten_us": 2}}}, f)
    autotune.record("new", autotune.Verdict(True, 1.0, 2.0))
    lines = open(path).read().splitlines()
    assert json.loads(lines[0]) == {"machine": autotune.machine()} and [json.loads(x)["key"] for x in lines[1:]] == ["new"]
    with open(path, "a") as f:  # many processes recording one key
        for _ in range(100):
            f.write(json.dumps({"key": "new", "kernel": True, "kernel_us": 1.0, "aten_us": 2.0}) + "\n")
    autotune._MEMORY.clear()
    assert autotune.lookup("new") is not None
    autotune.record("other", autotune.Verdict(False, 2.0, 1.0))
    assert [json.loads(x)["key"] for x in open(path).read().splitlines()[1:]] == ["new", "other"]


def _traced(fn, inputs):
    """``fn`` traced with its ops kept whole (capture's decompositions would split a lookup's
    backward and the loss), planned and compiled under ``backend="auto"``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from segmenter import from_fx

    return runtime.compile(apply_aliases(segment(from_fx(make_fx(fn)(*inputs), list(inputs))), "post"))


# (name, program, inputs, op): lone ops ATen has a kernel of its own for; those that read indices
# measured on made-up ones
INDEXED = [
    ("embedding", lambda w, i: F.embedding(i, w), [torch.randn(50, 16), torch.randint(0, 50, (4, 8))],
     "aten.embedding.default"),
    ("embedding-backward", lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 50, -1, False),
     [torch.randn(4, 8, 16), torch.randint(0, 50, (4, 8))], "aten.embedding_dense_backward.default"),
    ("cumsum", lambda x: x.cumsum(1), [torch.randn(6, 40)], "aten.cumsum.default"),
    ("nll-loss", lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, 1, -100),
     [torch.randn(32, 20).log_softmax(-1), torch.randint(0, 20, (32,))], "aten.nll_loss_forward.default"),
    ("nll-loss-backward", lambda g, x, t: torch.ops.aten.nll_loss_backward(
        g, x, t, None, 1, -100, torch.ops.aten.nll_loss_forward(x, t, None, 1, -100)[1]),
     [torch.tensor(1.0), torch.randn(32, 20).log_softmax(-1), torch.randint(0, 20, (32,))],
     "aten.nll_loss_backward.default"),
]


@pytest.mark.parametrize("name,fn,inputs,op", INDEXED, ids=[t[0] for t in INDEXED])
@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-faster", "aten-faster"])
def test_lookups_losses_and_cumsums_are_measured(name, fn, inputs, op, kernel, cache, monkeypatch) -> None:
    """Issue 42, goal 1: the embedding and nll-loss kernels (and their backwards) and a float
    cumsum are chosen by measurement too, index inputs made up as zeros (a valid row and class
    whatever the table). Both ways run on the made-up inputs (``_given`` calls both)."""
    calls = _given(monkeypatch, kernel=kernel)
    prog = _traced(fn, inputs)
    (i,) = [s.index for s in prog.plan.segments if any(n.op == op for n in s.nodes)]
    assert len(calls) == (2 if name == "nll-loss-backward" else 1), "not measured"  # (that one holds a forward too)
    assert prog.backend_of[i] == ("cpp" if kernel else "torch"), prog.passed_over.get(i)
    if not kernel:
        assert "measured faster" in dict(prog.passed_over[i])["cpp"]
    want = fn(*inputs)
    for g, w in zip(prog(*inputs), want if isinstance(want, tuple) else (want,), strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel-faster", "aten-faster"])
def test_in_a_symbolic_plan_lookups_and_cumsums_are_measured_at_its_first_sizes(kernel, cache, monkeypatch) -> None:
    """Issue 42, goal 1, in symbolic plans: a lookup's and a float cumsum's kernel is measured
    against ATen once, at the plan's first sizes (made-up inputs, as in a program of fixed sizes),
    and the winner runs at every size: no choice at the call (each stays a plain launch, in its
    chain) and no condition on the sizes (one plan for all three). They used to run unmeasured."""
    from runtime.backends.at_call import ChosenAtCall
    from runtime.dynamo import FusegCompiler, aot_backend

    calls = _given(monkeypatch, kernel=kernel)
    torch._dynamo.reset()
    compiler = FusegCompiler()
    w = torch.randn(50, 16)
    fn = lambda i, m: (F.embedding(i, w), m.cumsum(-1))  # noqa: E731
    compiled = torch.compile(fn, backend=aot_backend(compiler), dynamic=True)
    try:
        with torch.no_grad():
            for n in (5, 9, 13, 40):
                i, m = torch.randint(0, 50, (2, n)), torch.randn(2, n)
                for g, e in zip(compiled(i, m), fn(i, m), strict=True):
                    assert torch.equal(g, e)
    finally:
        torch._dynamo.reset()
    symbolic = [p for p in compiler.compiled if p.sizes is not None]
    assert len(symbolic) == 1, [p.sizes.condition_text() for p in symbolic]
    (p,) = symbolic
    kinds = {k.kind for k in p.kernels.values() if k is not None}
    assert not any(isinstance(launch, ChosenAtCall) for launch in p._chosen.values())
    if kernel:
        assert {"embedding", "scan"} <= kinds, kinds
    else:
        assert not {"embedding", "scan"} & kinds, kinds
        assert set(p.backend_of.values()) == {"torch"}, p.backend_of
        assert all("measured faster" in dict(why)["cpp"] for why in p.passed_over.values()), p.passed_over
    fixed = [q for q in compiler.compiled if q.sizes is None]  # (the first size's program: measured too)
    assert len(calls) == 2 * (len(fixed) + 1)


def test_a_choice_at_the_call_made_beside_builds_is_made_again_after_them(cache, monkeypatch) -> None:
    """See Note [torch's threads beside background compilers]: while builds are under way a program
    runs torch with the cores the compilers leave (one of two here), and a class chosen at the call
    then is chosen for that thread count (its verdict's key says so). The way chosen was kept in
    the launch's table for good: once the builds were done, every later call in the class ran the
    way measured for one thread. Now the tables are emptied when the last build ends, and the next
    call looks its class up again, for torch's own count."""
    from runtime.dynamo import FusegCompiler, compile_with_aot
    from runtime.machine import threads

    monkeypatch.setenv("FUSEG_BUILD_THREADS", "1")  # (the "cores" policy: Note [calls first while kernels build])
    if not threads.reserving() or threads.background_jobs() >= 2:
        pytest.skip("needs a machine where builds leave torch fewer threads than its own (2 cores)")
    asked: list[str] = []
    monkeypatch.setattr(autotune, "lookup", lambda key: asked.append(key) or autotune.Verdict(
        "threads 1" not in key, 1.0, 2.0))
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)
    torch._dynamo.reset()
    compiler = FusegCompiler()
    fn = torch.compile(lambda x, w: x @ w.t(), backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    w = torch.randn(24, 32)
    try:
        with torch.no_grad():
            x = torch.randn(9, 32)
            fn(x, w)  # (the plan; its class chosen now, with torch's own threads)
            (program,) = compiler.compiled
            (i,) = program.chosen_at_call
            program._chosen[i].table.clear()  # (as if its first call had come while builds were under way)
            threads.builds_started()
            try:
                torch.testing.assert_close(fn(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
            finally:
                threads.builds_ended()
            assert asked and "threads 1" in asked[-1], asked
            asked.clear()
            torch.testing.assert_close(fn(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
            assert asked and "threads 2" in asked[-1], asked
            x = torch.randn(20, 32)  # (another size, in another class: the same plan, two threads)
            torch.testing.assert_close(fn(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
            assert "threads 2" in asked[-1] and "[16, 32)" in asked[-1], asked
            assert compiler.compiled == [program]
    finally:
        torch.set_num_threads(threads_before)
        torch._dynamo.reset()


class _Clock:
    """A stand-in for ``time.perf_counter``: each way's call advances it by the call's given time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def way(self, seconds: list[float], steady: float):
        it = iter(seconds)

        def call() -> None:
            self.now += next(it, steady)
        return call


def test_one_disturbed_call_of_a_slow_op_decides_no_verdict(monkeypatch) -> None:
    """See Note [choices by measurement]. A slow op's sides are timed a call at a time; another
    process holding a core for a scheduler slice (here 3 ms) during one of the kernel's calls must
    not send the segment to ATen for good: the median is of three calls each, not two."""
    clock = _Clock()
    monkeypatch.setattr(autotune.time, "perf_counter", clock)
    # untimed first calls, then the kernel's first timed call disturbed; steady: kernel 0.2 ms, ATen 0.6 ms
    kernel = clock.way([2e-4, 3e-3], 2e-4)
    aten = clock.way([6e-4], 6e-4)
    v = autotune.measure(kernel, aten)
    assert v.kernel and v.kernel_us == pytest.approx(200.0) and v.aten_us == pytest.approx(600.0)
    # a real difference still decides: ATen's steady 0.1 ms beats the kernel's 0.2 ms
    clock = _Clock()
    monkeypatch.setattr(autotune.time, "perf_counter", clock)
    assert not autotune.measure(clock.way([], 2e-4), clock.way([], 1e-4)).kernel


def test_a_close_measurement_is_timed_longer(monkeypatch) -> None:
    """See Note [a close measurement is timed longer]. A slow op's three calls each can put the
    slower way ahead where the two are a few percent apart (here the kernel's calls 1.00 ms but
    one of ATen's three 1.02 ms and two 0.97 ms, then ATen 1.05 ms steady): the measurement goes on
    to ``CLOSE_CALLS`` calls each, and the steady difference decides."""
    clock = _Clock()
    monkeypatch.setattr(autotune.time, "perf_counter", clock)
    calls = {"kernel": 0, "aten": 0}

    def counted(name, way):
        def call() -> None:
            calls[name] += 1
            way()
        return call

    kernel = counted("kernel", clock.way([], 1.0e-3))
    aten = counted("aten", clock.way([1.05e-3, 0.97e-3, 1.02e-3, 0.97e-3], 1.05e-3))
    v = autotune.measure(kernel, aten)
    assert v.kernel and v.kernel_us == pytest.approx(1000.0) and v.aten_us == pytest.approx(1050.0)
    # the untimed first call and CLOSE_CALLS timed ones each way
    assert calls == {"kernel": autotune.CLOSE_CALLS + 1, "aten": autotune.CLOSE_CALLS + 1}
    # ways far apart stop at three timed calls each
    clock = _Clock()
    monkeypatch.setattr(autotune.time, "perf_counter", clock)
    calls.update(kernel=0, aten=0)
    v = autotune.measure(counted("kernel", clock.way([], 1.0e-3)), counted("aten", clock.way([], 1.5e-3)))
    assert v.kernel and calls == {"kernel": 4, "aten": 4}
