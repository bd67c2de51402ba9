"""The generated program (runtime/emit/wrapper.py, Note [generated wrapper]): what its source may hold,
its two variants, the backend registry, and the torch.compile backend's options."""

from __future__ import annotations

import re

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.backends import BACKENDS
from runtime.backends.base import Backend
from runtime.compiled.guards import RELEARN, LearnedGuard
from segmenter import FusionGraph, GraphError, GraphInput, Node, TensorMeta, ValueRef, capture, segment

from .util import assert_matches_eager


def _program(fn, inputs, mode="post", backend="auto"):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), mode), backend=backend)


def test_no_name_from_the_graph_reaches_the_source() -> None:
    evil = "x=__import__('os').system('touch p')"
    f32 = torch.float32
    graph = FusionGraph(
        inputs=(GraphInput(evil, TensorMeta((2, 3), (3, 1), 0, f32)),),
        nodes=(Node("n; import os", "aten.mul.Tensor", (ValueRef(evil), 2.5), (), ("y'); os.system('x",),
                    (TensorMeta((2, 3), (3, 1), 0, f32),)),
               Node("t", "aten.t.default", (ValueRef("y'); os.system('x"),), (), ("z",),
                    (TensorMeta((3, 2), (1, 3), 0, f32),))),
        outputs=("z",),
    )
    for backend in ("torch", "cpp"):
        program = runtime.compile(apply_aliases(segment(graph), "post"), backend=backend)
        assert "os" not in program.source and "import" not in program.source and "2.5" not in program.source
        x = torch.randn(2, 3)
        (z,) = program(x)
        torch.testing.assert_close(z, (x * 2.5).t())


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_safe_variant_under_autograd_and_dispatch_modes(backend: str) -> None:
    """Views a program makes keep autograd's view tracking where autograd records (the safe
    variant); the fast one runs where nothing can observe the difference."""
    def fn(x):
        return x.t(), (x * 2)[1:]

    x = torch.randn(4, 5, requires_grad=True)
    plan = apply_aliases(segment(capture(fn, [x.detach()])), "post")
    program = runtime.compile(plan, backend=backend)
    with torch.no_grad():
        assert_matches_eager(fn, [x.detach()], plan.graph, program=program)
    t, _ = program(x)  # grad mode on, an input requires grad: the safe variant
    assert t._base is x and t.requires_grad


def test_profile_launches_covers_every_launch() -> None:
    def fn(x, w):
        return torch.softmax(x @ w, -1)[:, :3] * 2

    from runtime.autotune import fixed

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with fixed("aten"):  # the matmul and the lone softmax on ATen (Note [choices by measurement]), `* 2` a kernel
        program = _program(fn, [x, w])
    rows = program.profile_launches(x, w, calls=5)
    assert [r["segment"] for r in rows] == [la.segment for la in program.launches]
    assert all(r["us"] >= 0 for r in rows) and sum(r["us"] for r in rows) > 0
    assert {r["backend"] for r in rows} >= {"torch", "cpp"}


def test_registry_order_and_interface() -> None:
    assert [b.name for b in BACKENDS] == ["nvfuser", "cupy", "cpp", "im2col", "half-matmul", "torch"]
    assert all(isinstance(b, Backend) for b in BACKENDS)
    program = _program(lambda x: x.exp() + 1, [torch.randn(3)], backend="torch")
    assert set(program.backend_of.values()) == {"torch"} and program.passed_over == {}


def test_torch_compile_options_choose_the_kernel_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.dynamo

    def fn(x):
        return torch.sin(x) * 2 + 1

    made = []

    def recording(plan, backend="auto", background=False):
        program = runtime.CompiledProgram(plan, backend, background=background)
        made.append((plan.alias_mode, backend, set(program.backend_of.values())))
        return program

    monkeypatch.setattr(runtime.dynamo, "CompiledProgram", recording)
    x = torch.randn(5, 6)
    for options, want in (({"backend": "torch", "alias_mode": "pre"}, ("pre", "torch", {"torch"})),
                          (None, ("post", "auto", {"cpp"}))):
        torch._dynamo.reset()
        made.clear()
        out = torch.compile(fn, backend="fuseg", options=options)(x)
        torch.testing.assert_close(out, fn(x))
        assert made == [want]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(fn, backend="fuseg", options={"alias": "pre"})(x)
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_segments_reading_no_input_run_once_when_compiled(backend: str) -> None:
    """See Note [folded segments]: a triangular matrix built from arange is computed when compiled; the
    program's results do not change, and nothing folded is handed to the caller."""
    def fn(x):
        n = x.shape[-1]
        mask = (torch.arange(n)[None, :] <= torch.arange(n)[:, None]).float()  # feeds a matmul: a launch of its own
        return (x @ mask).softmax(-1)

    x = torch.randn(6, 6)
    program = _program(fn, [x], backend=backend)
    assert program.folded, program.source
    assert all(f"segment {i}: " in program.source and "folded" in program.source for i in program.folded)
    for _ in range(2):
        y = torch.randn(6, 6)
        torch.testing.assert_close(program(y)[0], fn(y))


def test_a_value_the_caller_sees_is_never_folded() -> None:
    def fn(x):
        return x + 1, torch.arange(4.0) * 2, torch.ones(3)[1:]

    x = torch.randn(4)
    program = _program(fn, [x])
    assert not program.folded
    a = program(x)
    a[1].add_(100)  # the caller owns what it gets: the next call is not affected
    a[2].add_(100)
    b = program(x)
    torch.testing.assert_close(b[1], torch.arange(4.0) * 2)
    torch.testing.assert_close(b[2], torch.ones(2))


def test_deleted_names_are_reused_and_a_read_after_del_fails_at_generation() -> None:
    from runtime.emit.wrapper import Code

    code = Code(reuse=True)
    a = code.var("a")
    code.line(f"{a} = 1")
    code.dels(["a"])
    b = code.var("b")
    assert b == a  # the free name is handed on
    with pytest.raises(RuntimeError, match="used after its del"):
        code.var("a")
    plain = Code()
    plain.var("a")
    plain.dels(["a"])
    assert plain.var("b") != plain.var("a")  # without reuse: a name per value, as before


def test_a_long_chain_runs_with_few_locals() -> None:
    def f(x):
        for _ in range(40):
            x = torch.sort(x.sin(), dim=-1).values  # sort: an opaque launch between kernels
        return x

    x = torch.randn(4, 8)
    prog = _program(f, [x])
    code = prog._fast.__code__
    assert code.co_nlocals < 20, code.co_varnames
    assert_matches_eager(f, [x], prog.plan.graph, program=prog)


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_a_long_program_runs_in_parts_that_free_as_one_function_does(backend: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """See Note [program parts]: cut every few lines, the program gives eager's values, frees each
    intermediate at its last use (no frame holds a value a part deleted), and stays one
    function when it is short."""
    import runtime.emit.wrapper as wrapper
    from runtime.memory import PeakTracker

    def f(x):
        for _ in range(6):
            x = torch.sort(x.sin() * 2, dim=-1).values[:, 1:]  # opaque launches between kernels
        return x, x.t()

    x = torch.randn(64, 256)
    whole = _program(f, [x], backend=backend)
    assert "_fuseg_part" not in whole.source
    monkeypatch.setattr(wrapper, "PART_LINES", 3)
    parts = _program(f, [x], backend=backend)
    assert "_fuseg_part3" in parts.source
    assert_matches_eager(f, [x], parts.plan.graph, program=parts)
    peaks = []
    with torch.no_grad():
        for program in (whole, parts):
            with PeakTracker() as t:
                out = program(x.clone())
                del out
            peaks.append(t.peak)
    assert peaks[1] == peaks[0] > 0


def test_cuts_fall_only_at_marks_and_leave_no_short_tail(monkeypatch) -> None:
    from runtime.emit import wrapper
    from runtime.emit.wrapper import Code

    monkeypatch.setattr(wrapper, "PART_LINES", 8)  # every mark kept (one line apart, 8 // 8)
    code = Code(reuse=True)
    for k in range(10):
        code.mark()
        code.line(f"{code.var(str(k))} = {k}")
    cuts = code._cuts(4)
    assert [at for at, _ in cuts] == [4, 8]
    assert cuts[0][1] == ["v0", "v1", "v2", "v3"]  # the locals bound before line 4
    assert [at for at, _ in code._cuts(5)] == [5]  # a cut at 10 would leave an empty last part
    assert code._cuts(6) == []  # under twice the part length: one function


def test_marks_closer_than_an_eighth_of_a_part_are_not_kept(monkeypatch) -> None:
    """See Note [program parts]: listing the live locals at every launch was a pass per launch; only
    marks at least PART_LINES // 8 lines apart are kept, and the cuts fall at those."""
    from runtime.emit import wrapper
    from runtime.emit.wrapper import Code

    monkeypatch.setattr(wrapper, "PART_LINES", 40)
    code = Code(reuse=True)
    for k in range(100):
        code.mark()
        code.line(f"{code.var(str(k))} = {k}")
    assert [at for at, _ in code._marks] == list(range(0, 100, 5))
    assert [at for at, _ in code._cuts(40)] == [40, 80]
    fn, _ = code.program("f", [], f"{code.var('99')}")
    assert fn() == 99


def _doubles_x_then_adds(x, y):
    x.mul_(2)
    return x + y


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_entry_runs_only_on_exact_inputs_in_a_plain_call(backend: str) -> None:
    """``entry`` (what the torch.compile backend calls first): the program's outputs where every
    input has the planned layout, no two share a storage and the call is plain; otherwise None,
    having run nothing (x is not doubled), and the checked call still gives eager's answer."""
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    program = _program(_doubles_x_then_adds, [x.clone(), y.clone()], backend=backend)
    xc = x.clone()
    (out,) = program.entry(xc, y)
    torch.testing.assert_close(out, x * 2 + y)
    torch.testing.assert_close(xc, x * 2)

    shared = torch.randn(4, 5)
    refused = {
        "shape": (torch.randn(5, 4), torch.randn(5, 4)),
        "stride": (torch.randn(5, 4).t(), y.clone()),
        "offset": (torch.randn(30)[1:21].view(4, 5), y.clone()),
        "dtype": (x.double(), y.double()),
        "negative bit": (torch._neg_view(x.clone()), y.clone()),
        "shared storage": (shared, shared),
        "not a tensor": (3, y.clone()),
    }
    for why, (a, b) in refused.items():
        before = a.clone() if isinstance(a, torch.Tensor) else a
        assert program.entry(a, b) is None, why
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, before), f"{why}: entry ran before refusing"

    xg = x.clone().requires_grad_()
    assert program.entry(xg, y) is None  # grad on and an input requires grad: not a plain call
    with torch.no_grad():
        assert program.entry(xg.detach().clone(), y) is not None

    class Watch(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    xc = x.clone()
    with Watch():
        assert program.entry(xc, y) is None
    torch.testing.assert_close(xc, x)
    both = x.clone()
    with pytest.raises(GraphError, match="shares a storage"):  # the checked call says why
        program(both, both)


def test_learned_guard_passes_only_inputs_like_the_ones_it_learned() -> None:
    """See Note [learned layout guard]: nothing passes before anything is learned; afterwards exactly
    what TensorGuards matches (type, dtype, device, sizes, strides, neg/conj bits, requires_grad,
    inference mode), and not storage offsets or storages, which the entry still checks itself."""
    w, x = torch.nn.Parameter(torch.randn(3, 4)), torch.randn(4, 5)
    guard = LearnedGuard()
    assert not guard.check(w, x)
    guard.learn(w, x)
    assert guard.check(w, x) and guard.check(torch.nn.Parameter(torch.randn(3, 4)), torch.randn(4, 5))
    differ = {
        "type": (w.detach(), x),
        "dtype": (w, x.double()),
        "sizes": (w, torch.randn(4, 6)),
        "strides": (w, torch.randn(5, 4).t()),
        "negative bit": (w, torch._neg_view(x)),
        "requires_grad": (torch.nn.Parameter(torch.randn(3, 4), requires_grad=False), x),
        "not a tensor": (w, 3),
    }
    for why, args in differ.items():
        assert not guard.check(*args), why
    with torch.inference_mode():
        assert not guard.check(w, x)
    assert guard.check(w, torch.randn(21)[1:].view(4, 5))  # an offset: left to the entry


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_entry_after_learning_still_refuses_what_no_guard_checks(backend: str) -> None:
    """Once the guard is learned, inputs that pass it are refused for their storage offset, a
    shared storage, or (a kernel reading it) a storage shrunk behind the tensor's back; inputs it
    refuses (another type, inference mode) take the whole check, run, and are relearned at most
    RELEARN times."""
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    program = _program(_doubles_x_then_adds, [x.clone(), y.clone()], backend=backend)
    assert program.entry(x.clone(), y) is not None and program.guard.builds == 1
    shared = torch.randn(4, 5)
    refused = {
        "offset": (torch.randn(21)[1:].view(4, 5), y.clone()),
        "shared storage": (shared.view(4, 5), shared.view(4, 5)),  # two tensors, one storage
    }
    for why, (a, b) in refused.items():
        assert program.guard.check(a, b), why  # the guard alone would let it through
        before = a.clone()
        assert program.entry(a, b) is None, why
        assert torch.equal(a, before), f"{why}: entry ran before refusing"
    if backend == "cpp":  # the kernel reads y from its data pointer: its storage must hold it
        small = torch.randn(4, 5)
        small.untyped_storage().resize_(40)
        assert program.guard.check(x.clone(), small)
        assert program.entry(x.clone(), small) is None
        with pytest.raises(GraphError, match="fewer than its layout reaches"):
            program(x.clone(), small)

    for i in range(2 * RELEARN + 2):  # alternating types: each call is right, rebuilds are capped
        a = torch.nn.Parameter(x.clone(), requires_grad=False) if i % 2 else x.clone()
        (out,) = program.entry(a, y)
        torch.testing.assert_close(out, x * 2 + y)
    assert program.guard.builds == RELEARN
    with torch.inference_mode():
        xc = x.clone()
        (out,) = program.entry(xc, y)
    torch.testing.assert_close(out, x * 2 + y)
    torch.testing.assert_close(xc, x * 2)


def test_generated_code_is_named_by_its_content() -> None:
    """The same program compiled twice has the same code file name (Hypothesis replays a failing
    example and compares where it failed: a counter in the name made every replay look like a new
    failure, reported as flaky and never shrunk); a program of other source text has another name
    (ops and constants are bound under generated names, so programs of one shape share source)."""
    def f(x):
        return (x.sin() + 1).t()

    def g(x):
        return x.cos(), x.t()

    x = torch.randn(3, 4)
    a, b, c = (_program(fn, [x], backend="torch") for fn in (f, f, g))
    assert a.source == b.source
    names = [p._fast.__code__.co_filename for p in (a, b, c)]
    assert names[0] == names[1] != names[2]
    assert names[0].startswith("<fuseg fuseg_program ")


def _reads_two_views(a, b):
    return a * b + 1, (a - b).t()


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_entry_takes_inputs_that_share_a_storage_as_planned(backend: str) -> None:
    """A graph whose inputs share a storage (AOTAutograd's backward graphs: a saved value and its
    detached view) is run by the entry where the call's inputs share storages exactly as planned;
    before, every such call went the checked way (``check_inputs``, about 1 ms a training step of
    a tiny Llama). Inputs that share less or more than the plan says still get None."""
    base = torch.randn(8, 5)
    program = _program(_reads_two_views, [base[:4], base[4:]], backend=backend)
    assert program.graph.storage_groups()
    other = torch.randn(8, 5)
    got = program.entry(other[:4], other[4:])
    assert got is not None
    for g, w in zip(got, _reads_two_views(other[:4], other[4:])):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
    apart = torch.randn(8, 5)
    refused = {
        "two storages where the plan has one": (apart[:4], torch.randn(8, 5)[4:]),
        "the offsets swapped": (other[4:], other[:4]),
    }
    for why, (a, b) in refused.items():
        assert program.entry(a, b) is None, why
    with pytest.raises(GraphError, match="should share a storage"):  # the checked call says why
        program(apart[:4], torch.randn(8, 5)[4:])


def _detached_and_views(x, w):  # a training forward's saved values: y detached, and views of y
    y = torch.softmax(x @ w, -1)
    return y.detach(), y.t(), y[1:], y.view(-1)


@pytest.mark.parametrize("mode", ["off", "post"])
@pytest.mark.parametrize("fn,make,off_copies", [
    (_detached_and_views, lambda: [torch.randn(6, 5), torch.randn(5, 8)], False),
    (lambda q, k, v: (lambda o: (o.detach(), o.transpose(1, 2).reshape(8, 32)))(
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]),
     lambda: [torch.randn(1, 8, 4, 8).transpose(1, 2), torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)], True),
], ids=["softmax", "attention"])
def test_outputs_that_are_views_of_outputs_skip_finish_where_they_lie_in_place(fn, make, off_copies, mode,
                                                                                monkeypatch) -> None:
    """Note [outputs that are views of outputs] (runtime/compiled/outputs.py): where every output that was
    a view is one of another output, and the plan made it one (post), the fast program hands the
    outputs back as they are, with no ``finish`` (eager's values, layouts and sharing); where the
    plan copied one (off: the attention output's detach, a kernel of its own), ``finish`` still
    makes them, as before (off leaves the softmax's views in its kernel's buffer: no finish)."""
    import runtime.compiled.program

    calls = []
    real = runtime.compiled.program.finish
    monkeypatch.setattr(runtime.compiled.program, "finish", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    inputs = make()
    program = _program(fn, inputs, mode=mode)
    assert all(a is None or a.source == "output" for a in program.graph.output_aliases)
    assert any(a is not None for a in program.graph.output_aliases)
    with torch.no_grad():
        assert_matches_eager(fn, inputs, program.graph, program=program)
        assert program.entry(*inputs) is not None
    assert (len(calls) > 0) == (mode == "off" and off_copies), calls


def _returns_inputs(x, w):  # a training forward: the weight saved as it is, a view of it, a repeat
    y = torch.softmax(x @ w, -1)
    return y, w, w.t(), y, y.t()


def _returns_an_input_twice(x):
    return x * 2, x, x


@pytest.mark.parametrize("mode", ["off", "post"])
@pytest.mark.parametrize("fn,make", [
    (_returns_inputs, lambda rows: [torch.randn(rows, 5), torch.randn(5, 8)]),
    (_returns_an_input_twice, lambda rows: [torch.randn(rows, 3)]),
], ids=["weight-and-repeat", "input-twice"])
def test_outputs_that_are_inputs_or_repeats_skip_finish(fn, make, mode, monkeypatch) -> None:
    """Note [outputs that are inputs] (runtime/compiled/outputs.py): inputs handed back (as they are or as
    views) and outputs named twice take the fast return where they lie where the graph says, at
    two shapes; eager's values, layouts and sharing either way. In "off" mode the views of the
    inputs are copies the program made, so ``finish`` makes them again, as before."""
    import runtime.compiled.program

    calls = []
    real = runtime.compiled.program.finish
    monkeypatch.setattr(runtime.compiled.program, "finish", lambda *a, **k: calls.append(1) or real(*a, **k))
    for rows in (6, 9):
        torch.manual_seed(rows)
        inputs = make(rows)
        program = _program(fn, inputs, mode=mode)
        aliases = program.graph.output_aliases
        assert any(a is not None and a.source == "input" for a in aliases)
        calls.clear()
        with torch.no_grad():
            assert_matches_eager(fn, inputs, program.graph, program=program)
            got = program.entry(*inputs)
        assert got is not None
        for k, a in enumerate(aliases):  # the entry's outputs share what eager's share
            if a is not None and a.source == "input":
                assert got[k].untyped_storage()._cdata == inputs[a.index].untyped_storage()._cdata
        needs_finish = mode == "off" and any(
            a is not None and a.source == "input" and program.graph.outputs[k] not in program.graph.input_names
            for k, a in enumerate(aliases))
        assert (len(calls) > 0) == needs_finish, (mode, calls)


def _transposed_twice(x, w):
    return torch.mm(x, w.t().t()), w.t().t(), x.reshape(x.shape).t()


@pytest.mark.parametrize("rows", [6, 9])
def test_a_view_that_changes_nothing_names_the_tensor_it_starts_from(rows: int) -> None:
    """Note [a view that changes nothing] (runtime/compiled/metadata.py): ``t(t(w))`` is ``w`` itself in the
    program (no tensor made), a view that does change the layout is still made; eager's values,
    layouts and sharing, at two shapes."""
    torch.manual_seed(rows)
    inputs = [torch.randn(rows, 5), torch.randn(5, 7)]
    program = _program(_transposed_twice, inputs)
    lines = [ln.strip() for ln in program.source.splitlines()]
    assert sum(bool(re.fullmatch(r"v\d+ = v\d+", ln)) for ln in lines) == 1, program.source  # t(t(w)): w
    made = [ln for ln in lines if re.fullmatch(r"v\d+ = _c\d+\(v\d+, _c\d+, _c\d+, \d+\)", ln)]
    assert len(made) == 1, program.source  # x's transpose is a view made (t(t(w)) for the mm is only read)
    with torch.no_grad():
        assert_matches_eager(_transposed_twice, inputs, program.graph, program=program)
        got = program.entry(*inputs)
    assert got is not None and got[1].untyped_storage()._cdata == inputs[1].untyped_storage()._cdata
