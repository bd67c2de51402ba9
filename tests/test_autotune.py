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
    with open(autotune.verdict_path(), encoding="utf-8") as f:
        return json.load(f)["verdicts"]


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
    data = json.load(open(autotune.verdict_path()))
    data["verdicts"][key]["kernel"] = False
    with open(autotune.verdict_path(), "w") as f:
        json.dump(data, f)
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
    machine = json.load(open(autotune.verdict_path()))["machine"]
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
    with open(autotune.verdict_path(), "w") as f:
        json.dump({"verdicts": {"x": {"kernel": "yes"}}}, f)  # the right JSON, the wrong fields
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


def test_size_classes() -> None:
    assert [autotune.size_class(n) for n in (0, 1, 2, 3, 7, 8, 1000)] == [
        (0, 1), (1, 2), (2, 4), (2, 4), (4, 8), (8, 16), (512, 1024)]


def _varying(monkeypatch, verdicts: list[bool]) -> list:
    """Measurements return these verdicts in turn (kernel or ATen); the list gets a call each."""
    calls: list = []

    def fake(run_kernel, run_aten):
        calls.append((run_kernel(), run_aten()))
        kernel = verdicts[len(calls) - 1]
        return autotune.Verdict(kernel, 1.0, 2.0) if kernel else autotune.Verdict(False, 2.0, 1.0)

    monkeypatch.setattr(autotune, "measure", fake)
    return calls


def test_a_symbolic_plans_verdict_is_one_per_size_class_chosen_at_the_call(cache, monkeypatch) -> None:
    """Note [choices at the call]: the kernel is one source for every size; its verdict holds for
    the power-of-two class of the sizes it reads, measured at the first call in that class on the
    call's own inputs, and no condition of the plan: 9 and 13 rows share a verdict (the kernel),
    17 gets its own (ATen here), 5 its own (the kernel): one plan, no compiler run after the first
    size, every value eager's."""
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
            torch.testing.assert_close(fn(x, w), x @ w.t(), atol=1e-5, rtol=1e-5)
        assert len(compiler.compiled) == 1 and len(calls) == 1
        builds = build.compilations["cpu"]
        for n in (17, 5, 20, 12):
            x = torch.randn(n, 32)
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
            got, want = fn(x, w), f(x, w)
            for g, e in zip(got, want):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
                assert g.stride() == e.stride()
            assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    for n in (3, 9, 17):
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
    """A call in a new class made under a dispatch mode of the caller's (a FLOP counter, a
    tracer) runs the kernel, unmeasured and not kept, so the mode sees none of a measurement's
    runs; a call in that class without the mode measures it."""
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
        for _ in range(2):  # (the first call runs under a mode of AOTAutograd's own: measured at the second)
            fn(torch.randn(9, 32), w)
    assert len(calls) == 1
    (program,) = compiler.compiled
    (i,) = program.chosen_at_call
    launch = program._chosen[i]
    ran: list[str] = []
    kernel, aten = (lambda *a: ran.append("kernel")), (lambda *a: ran.append("aten"))
    bits, x = (5, 6, 5), torch.randn(17, 32)
    with Seen():
        way = launch._choose(kernel, aten, bits, x, w)
    assert way is kernel and bits not in launch.table and len(calls) == 1 and ran == [] and Seen.ops == []
    way = launch._choose(kernel, aten, bits, x, w)
    assert len(calls) == 2 and launch.table[bits] is way is aten  # (the second given verdict: ATen)
    torch._dynamo.reset()
