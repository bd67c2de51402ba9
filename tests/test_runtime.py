"""The runtime: launches, frees, signature checks, and peak memory against eager."""

from __future__ import annotations

import pytest
import torch

import runtime
from alias import MODES, apply_aliases
from perf import zoo
from runtime.memory import PeakTracker, modeled_peak
from segmenter import GraphError, SegmentKind, capture, segment
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs

from .util import assert_matches_eager


def _program(fn, inputs, mode="post"):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), mode))


@pytest.mark.parametrize("name", ["rope-seed", "mlp", "llama-tiny", "gpt2-tiny", "bert-tiny"])
def test_peak_memory_never_above_eager(name: str) -> None:
    fn, inputs = zoo.get(name).factory()
    graph = capture(fn, inputs)
    module = fn if isinstance(fn, torch.nn.Module) else None
    with torch.no_grad():
        with PeakTracker() as eager:
            out = fn(*clone_inputs(inputs))
            del out
        for mode in MODES:
            program = runtime.compile(apply_aliases(segment(graph), mode))
            full = bind_inputs(graph, module, clone_inputs(inputs))
            with PeakTracker() as ours:
                out = program(*full)
                del out
            assert 0 < ours.peak <= eager.peak, (mode, ours.peak, eager.peak)
            assert 0 < modeled_peak(program) <= eager.peak


def test_intermediates_are_freed_after_last_use() -> None:
    def chain(x):
        return torch.cumsum(x.exp(), 0).sin() * 2

    x = torch.randn(4, 8)
    program = _program(chain, [x])
    assert any(launch.frees for launch in program.launches) or len(program.launches) > 1
    with PeakTracker() as t:
        program(x)
    assert t.peak <= 2 * x.numel() * 4


def test_metadata_segments_launch_nothing() -> None:
    program = _program(lambda x: x[1:].t() * 2, [torch.randn(5, 6)])
    backends = {launch.kind: launch.backend for launch in program.launches}
    assert backends.get(SegmentKind.METADATA, "metadata") == "metadata"


@pytest.mark.parametrize(
    "bad,message",
    [
        (lambda x: torch.randn(5, 7), r"expected float32\[5, 6\]"),
        (lambda x: torch.randn(6, 5).t(), "stride"),
        (lambda x: x.double(), "float64"),
        (lambda x: torch.randn(30)[:30].view(5, 6), None),  # same layout, another storage: accepted
    ],
)
def test_inputs_are_checked_against_the_signature(bad, message) -> None:
    x = torch.randn(5, 6)
    program = _program(lambda x: x * 2, [x])
    y = bad(x)
    if message is None:
        torch.testing.assert_close(program(y)[0], y * 2)
        return
    with pytest.raises(GraphError, match=message):
        program(y)


def test_unexpected_shared_storage_is_refused() -> None:
    x, y = torch.randn(4), torch.randn(4)
    program = _program(lambda a, b: a + b, [x, y])
    with pytest.raises(GraphError, match="shares a storage"):
        program(x, x)


def test_backend_choice_records_every_fallback() -> None:
    program = _program(lambda x: (x * 2).sum(), [torch.randn(3)])
    assert set(program.backend_of.values()) == {"cpp"}  # the CPU default where a compiler exists
    (passed,) = program.passed_over.values()
    assert [name for name, _ in passed] == ["nvfuser", "cupy"]  # tried in this order, each with a reason
    assert all(why for _, why in passed)
    assert any(f.startswith("cupy:") for f in program.fallbacks)
    with pytest.raises(ValueError, match="not available"):
        runtime.compile(program.plan, backend="cupy")
    with pytest.raises(ValueError, match="unknown backend"):
        runtime.compile(program.plan, backend="tpu")
    assert runtime.compile(program.plan, backend="torch").passed_over == {}


def test_compiled_module_updates_its_buffers_like_eager() -> None:
    import copy

    bn = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    x = torch.randn(8, 4)
    eager, ours = copy.deepcopy(bn), copy.deepcopy(bn)
    program = runtime.compile_module(ours, [x])
    for _ in range(2):  # running statistics accumulate across calls
        expected = eager(x)
        (got,) = program(x)
        torch.testing.assert_close(got, expected)
    for name, buf in eager.named_buffers():
        torch.testing.assert_close(ours.get_buffer(name), buf, msg=name)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["rope", "rms-norm", "softmax-mlp"])
def test_low_precision_error_is_within_twice_eagers(case: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    if case == "rope":
        fn, inputs = zoo._rope(1, 64, 4, 2, 16, 8, torch.float32)()
    elif case == "rms-norm":
        fn, inputs = _rms, [torch.randn(16, 64, generator=g), torch.randn(64, generator=g)]
    else:
        def fn(x, w):
            return torch.softmax(x @ w, -1) * 3
        inputs = [torch.randn(16, 32, generator=g), torch.randn(32, 32, generator=g)]
    low = [t.to(dtype) for t in inputs]
    reference = [o.double() for o in fn(*[t.double() for t in inputs])] if case == "rope" else [fn(*[t.double() for t in inputs]).double()]
    eager = fn(*clone_inputs(low))
    eager = list(eager) if isinstance(eager, (tuple, list)) else [eager]
    program = _program(fn, low)
    ours = program(*clone_inputs(low))
    for e, o, r in zip(eager, ours, reference):
        assert o.dtype == e.dtype == dtype
        eager_err = (e.double() - r).abs().max().item()
        our_err = (o.double() - r).abs().max().item()
        assert our_err <= 2 * eager_err + 1e-6, (our_err, eager_err)


def test_mutating_an_input_with_overlapping_elements_raises_as_eager() -> None:
    from segmenter import FusionGraph, GraphInput, Mutation, Node, TensorMeta, ValueRef

    meta = TensorMeta((3, 4), (0, 1), 0, torch.float32)  # an expanded row: every row is one memory
    graph = FusionGraph(
        inputs=(GraphInput("x", meta),),
        nodes=(Node("y", "aten.add.Tensor", (ValueRef("x"), 1), (), ("y",), (TensorMeta((3, 4), (4, 1), 0, torch.float32),)),),
        outputs=("y",), mutations=(Mutation(0, "y"),),
    )
    x = torch.zeros(1, 4).expand(3, 4)
    with pytest.raises(RuntimeError, match="more than one element"):
        x.add_(1)  # eager
    program = runtime.compile(apply_aliases(segment(graph), "post"))
    with pytest.raises(RuntimeError, match="more than one element"):
        program(x)
    assert x.sum() == 0  # nothing was written


def test_values_crossing_a_boundary_keep_their_planned_dim_order() -> None:
    """In pre/off modes a value crossing launches is a fresh dense copy in its planned dim order
    (as CUDA attention's permuted output must stay, for the views after it), not .contiguous()."""
    from runtime.codegen.source.index import dense_strides

    def fn(x):
        return torch.cumsum(x.transpose(1, 2) * 2, 1)

    x = torch.randn(4, 6, 5)
    for backend in ("torch", "cpp"):
        prog = runtime.compile(apply_aliases(segment(capture(fn, [x])), "pre"), backend=backend)
        boundary = [v for s in prog.plan.segments if s.kind.value == "opaque" for v in s.inputs]
        meta = prog.graph.metas[boundary[0]]
        assert meta.stride != dense_strides(meta.shape, tuple(sorted(meta.stride, reverse=True)))  # permuted
        env = {prog.graph.input_names[0]: x}
        for launch in prog.launches:
            launch.run(env)
            if boundary[0] in env:
                assert env[boundary[0]].stride() == meta.stride, backend
                break
    for t in (torch.empty(2, 3, 4, 5).permute(0, 2, 1, 3), torch.empty(3, 4).t(), torch.empty(2, 3),
              torch.empty(1, 1, 5, 5).expand(2, 3, 5, 5), torch.empty(1, 5, 1).expand(4, 5, 3).transpose(0, 1)):
        assert dense_strides(tuple(t.shape), t.stride()) == torch.empty_like(t).stride()


# in-place updates whose new value is cast back to the input's dtype: the write-back op is
# _to_copy(dtype=...), whose .out overload takes no dtype (issue 15: batch norm in bf16/fp16).
# Each returns a value apart from the input, so that the write-back may go in place.
def _bf16_add(r, x):
    r.add_(x)
    return x * 2


def _fp16_mul(r, x):
    r.mul_(x)
    return x.sum()


def _running_mean(m, x):
    mean = x.float().mean(0)
    m.mul_(0.9).add_(mean * 0.1)
    return x - mean


_CAST_WRITE_BACKS = {
    "bf16 += fp32": (_bf16_add, [torch.randn(4, 3).bfloat16(), torch.randn(4, 3)]),
    "fp16 *= fp32": (_fp16_mul, [torch.randn(5).half(), torch.randn(5)]),
    "running mean in bf16": (_running_mean, [torch.randn(6).bfloat16(), torch.randn(8, 6).bfloat16()]),
}


@pytest.mark.parametrize("case", sorted(_CAST_WRITE_BACKS))
def test_write_back_through_a_cast_matches_eager(case: str) -> None:
    from .util import assert_matches_eager

    fn, inputs = _CAST_WRITE_BACKS[case]
    graph = capture(fn, clone_inputs(inputs))
    for mode in MODES:
        for backend in ("torch", "cpp"):
            prog = runtime.compile(apply_aliases(segment(graph), mode), backend=backend)
            assert_matches_eager(fn, inputs, graph, program=prog, atol=1e-2, rtol=1e-2)
            assert prog.copy_write_backs == {0: "aten._to_copy.out takes no dtype, layout arguments"}


def test_a_lone_softmax_is_chosen_against_aten_when_choosing_by_itself() -> None:
    """Note [choices by measurement] (runtime/autotune.py): under "auto" a segment that is one
    softmax and nothing else runs where this machine's verdict says (here fixed: ATen, with the
    reason; the kernel); fused, or with the cpp backend asked for, it is a kernel."""
    from runtime.autotune import fixed
    from runtime.codegen.build import cpu_compiler

    if cpu_compiler() is None:
        pytest.skip("no C++ compiler")
    x = torch.randn(8, 32)

    def compiled(fn, backend="auto"):
        return runtime.compile(apply_aliases(segment(capture(fn, [x])), "post"), backend=backend)

    for fn in (lambda t: t.softmax(-1), lambda t: t.log_softmax(-1)):
        with fixed("aten"):
            prog = compiled(fn)
            assert prog.backend_of == {0: "torch"}
            assert "ATen's op chosen" in dict(prog.passed_over[0])["cpp"]
            torch.testing.assert_close(prog(x)[0], fn(x), rtol=0, atol=0)
            assert compiled(fn, backend="cpp").backend_of == {0: "cpp"}
            assert compiled(lambda t: (t * 2).softmax(-1)).backend_of == {0: "cpp"}
        assert compiled(fn).backend_of == {0: "cpp"}


def test_ensure_passes_planned_layouts_through_and_conforms_the_rest() -> None:
    from runtime.storage.layout import ensure
    from segmenter import TensorMeta

    m = TensorMeta((4, 8), (8, 1), 0, torch.float32)
    spec = (m.stride, m.shape, m.dtype, m, "value %y")
    x = torch.randn(4, 8)
    assert ensure(x, spec) is x  # the usual case: the very tensor
    t = torch.randn(8, 4).t()  # same shape and dtype, other strides: copied into the plan
    got = ensure(t, spec)
    assert got.stride() == (8, 1) and torch.equal(got, t)
    with pytest.raises(GraphError, match="value %y"):
        ensure(torch.randn(4, 8, dtype=torch.float64), spec)
    with pytest.raises(GraphError, match="value %y: the op returned int"):
        ensure(3, spec)


def _svd_every_other_and_second(x):
    y = torch.linalg.svdvals(x)  # made by an op that runs on ATen: the views are of its buffer
    return y[0::2], y[1:2]


def _svd_first_and_last(x):
    y = torch.linalg.svdvals(x)
    return y[0:1], y[4:5]


def _svd_row_and_bits(x):
    y = torch.linalg.svdvals(x)
    return y[1:4], y[2:3].view(torch.int32), y[::4]


@pytest.mark.parametrize("mode", ["off", "pre", "post"])
@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("fn", [_svd_every_other_and_second, _svd_first_and_last, _svd_row_and_bits],
                         ids=lambda f: f.__name__)
def test_outputs_recorded_as_views_of_an_output_hold_their_own_values(fn, backend: str, mode: str) -> None:
    """Found through op_db's linalg.cond trained under torch.compile: outputs that are views of
    one intermediate (not an output) are recorded as views of the first of them. The first was
    handed back as a buffer of its own (a copy, or kept a copy by the post pass), and the others
    were made as views of that buffer in the recorded layout: out of bounds (refused by torch) or,
    where that buffer was big enough (``y[0::2]`` leaves holes), reading its uninitialized
    elements: a silent wrong value. Now each keeps its values and the storage sharing eager has."""
    x = torch.randn(5, 5)
    graph = capture(fn, [x])
    program = runtime.compile(apply_aliases(segment(graph), mode), backend=backend)
    assert_matches_eager(fn, [x], graph, program=program)


def test_a_kernel_is_not_given_a_value_on_another_device() -> None:
    """Regression (found on the H100): ``x * s`` with ``x`` on CUDA and ``s`` a CPU scalar tensor
    (which ATen reads on the host) became a CuPy kernel handed the CPU pointer, an illegal memory
    access. A value on another device than the kernel's leaves the segment to torch."""
    import dataclasses

    from runtime.backends.kernels import device_problem

    graph = capture(lambda x, s: x * s, [torch.randn(4, 8), torch.tensor(3.0)])
    (seg,) = [s for s in segment(graph).segments if s.nodes]
    x, s = seg.inputs
    metas = graph.metas
    on = {v: dataclasses.replace(metas[v], device="cuda:0") for v in metas}
    metas.update(on)
    assert device_problem(graph, seg, torch.device("cuda", 0)) is None
    assert device_problem(graph, seg, torch.device("cuda")) is None
    assert "cuda:0" in device_problem(graph, seg, torch.device("cuda", 1))
    assert "on cuda:0, the kernel on cpu" in device_problem(graph, seg, torch.device("cpu"))
    metas[s] = dataclasses.replace(metas[s], device="cpu")
    why = device_problem(graph, seg, torch.device("cuda", 0))
    assert why is not None and f"%{s} is on cpu" in why
