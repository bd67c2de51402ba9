"""The kernel generator (runtime.codegen) on the CPU: every case of tests/kernel_cases.py runs as
generated C++ (the very body the CUDA target gets) against eager, and the exact CUDA source
compiles with nvcc where nvcc is on the PATH."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime import options
from runtime.codegen import Declined
from runtime.codegen.build import compilations, nvcc_check, nvcc_check_many
from segmenter import SegmentKind, capture, segment

from .kernel_cases import CASES, TOL
from .util import assert_matches_eager


def _program(fn, inputs, mode="post", backend="cpp"):
    plan = apply_aliases(segment(capture(fn, [t.clone() if False else t for t in inputs])), mode)
    return runtime.compile(plan, backend=backend)


# the one-op cases ("op:...") make the same kernel in every mode: run those in post only
_MODE_CASES = [(c, m) for c in sorted(CASES) for m in (("post",) if c.startswith("op:") else ("post", "off"))]


@pytest.mark.parametrize("case,mode", _MODE_CASES)
def test_generated_kernels_match_eager(case: str, mode: str) -> None:
    fn, inputs = CASES[case]
    prog = _program(fn, inputs, mode)
    kernel_segments = [s.index for s in prog.plan.segments if s.kind in (
        SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION)]
    assert kernel_segments, "the case has no kernel segment"
    declined = {i: prog.passed_over[i] for i in kernel_segments if prog.backend_of[i] != "cpp"}
    assert declined == {}, declined
    tol = TOL.get(case, 1e-6)
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)


@pytest.mark.parametrize("soft", [False, True])
def test_half_and_bfloat16_conversions_are_bit_exact(soft: bool) -> None:
    """Every fp16 bit pattern to float and back; float values at and between fp16/bf16 values
    (ties included), subnormals, overflow and NaN, against torch's conversions: the branchless
    software versions the CPU runs (Note [fp16 on the CPU]), with and without the ``soft_half``
    option (which changes CUDA's source only)."""
    with options.use(soft_half=soft):
        _check_half_conversions(soft)


def _check_half_conversions(soft: bool) -> None:
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    halves = bits.view(torch.float16)
    prog = _program(lambda h: h.to(torch.float32), [halves])
    assert prog.kernels and all(("#define FUSEG_SOFT_HALF" in k.source("cpu")) == soft
                                for k in prog.kernels.values())
    got, = prog(halves)
    want = halves.to(torch.float32)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~want.isnan()].view(torch.int32), want[~want.isnan()].view(torch.int32))
    f = want[~want.isnan()].to(torch.float64)
    f = f.sort().values
    mids = ((f[1:] + f[:-1]) / 2).to(torch.float32)
    special = torch.tensor([0.0, -0.0, 1e-8, 2.9802322e-08, 65504.0, 65519.99, 65520.0, 1e6, float("inf"),
                            -float("inf"), float("nan"), 1e-40, -5.96e-08])
    xs = torch.cat([want[~want.isnan()], mids, special, torch.randn(100000) * 1000, torch.randn(1000) * 1e-6])
    for dtype in (torch.float16, torch.bfloat16):
        prog = _program(lambda x, dtype=dtype: x.to(dtype), [xs])
        got, = prog(xs)
        want_lp = xs.to(dtype)
        nan = want_lp.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(torch.int16), want_lp[~nan].view(torch.int16)), dtype
        back = _program(lambda x: x.to(torch.float32), [want_lp])(want_lp)[0]
        assert torch.equal(back[~nan].view(torch.int32), want_lp[~nan].to(torch.float32).view(torch.int32))


def test_a_second_compile_of_the_same_segment_compiles_nothing() -> None:
    fn, inputs = CASES["rope"]
    _program(fn, inputs)
    before = dict(compilations)
    _program(fn, inputs)
    assert compilations == before


def _top_level_branches(body: str) -> tuple[str, str]:
    """The two branches of a body that is ``#ifdef __CUDACC__ ... #else ... #endif`` as a whole
    (each may hold conditionals of its own: Note [CUDA launch shapes]'s row passes)."""
    lines = body.splitlines(keepends=True)
    assert lines[0] == "#ifdef __CUDACC__\n", body
    depth, split, end = 0, None, None
    for i, line in enumerate(lines):
        if line.startswith("#if"):
            depth += 1
        elif line.startswith("#endif"):
            depth -= 1
            if depth == 0:
                end = i
                break
        elif line.startswith("#else") and depth == 1:
            split = i
    assert split is not None and end == len(lines) - 1, body
    return "".join(lines[1:split]), "".join(lines[split + 1:end])


def test_outer_reductions_take_column_passes_on_the_cpu_and_rows_on_cuda() -> None:
    """See Note [column passes]: the body holds both variants; the C++ build takes the tiled one,
    shared among threads where the work is worth it, and the CUDA source the per-row one."""
    bodies = {}
    for case in ("sum-outer-threaded", "sum-outer", "sum-mean"):
        fn, inputs = CASES[case]
        bodies[case] = [k.body for k in _program(fn, inputs).kernels.values()]
    columns = [b for b in bodies["sum-outer-threaded"] + bodies["sum-outer"] if b.startswith("#ifdef __CUDACC__")]
    assert len(columns) == len(bodies["sum-outer-threaded"]) + 2  # sum(0) and mean(1); amax((0, 2)) keeps rows
    for body in columns:
        cuda, cpu = _top_level_branches(body)
        assert "FUSEG_BLOCK" in cuda and "FUSEG_BLOCK" not in cpu
        assert "for (FUSEG_I t = 0; t < tn; ++t)" in cpu
    assert all("#pragma omp parallel for" in _top_level_branches(b)[1] for b in bodies["sum-outer-threaded"])
    assert not any("omp parallel" in _top_level_branches(b)[1] for b in columns[-2:])  # small: one thread
    assert not any("tn" in b for b in bodies["sum-mean"])  # innermost reductions keep the per-row kernel alone


def test_full_values_independent_of_the_reduction_are_stored_in_its_first_pass() -> None:
    """Note [full values stored in the first pass] (runtime/codegen/lowering/columns.py): the C++ column
    variant of a bias gradient's segment walks the tile's elements once per reduction pass and
    stores the values there, with no pass of their own; a value that depends on the reduction
    (x - mean) keeps its own pass after it."""
    for case, passes in (("bias-grad-outer", 1), ("centered-outer", 2)):
        fn, inputs = CASES[case]
        prog = _program(fn, inputs)
        (body,) = [k.body for k in prog.kernels.values() if k.body.startswith("#ifdef __CUDACC__")]
        cpu = _top_level_branches(body)[1]
        # (a pass: a loop from the first element, or the blocks of a sum in ATen's order and the
        # elements past them, Note [sums in ATen's order, streamed])
        streamed = len(re.findall(r"for \(; jc\d+ \+ fuseg_cs <=", cpu))
        assert cpu.count("for (FUSEG_I j = 0;") + streamed == passes, (case, cpu)
        assert cpu.count("for (FUSEG_I j = jc") == 2 * streamed, (case, cpu)
        want = fn(*inputs)
        for got, w in zip(prog(*inputs), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(got, w)


def test_declines_fall_back_to_torch_with_the_reason() -> None:
    from runtime.autotune import fixed

    fn = lambda x: (torch.linalg.vector_norm(x, 3, dim=0) * 2, x @ x)  # noqa: E731
    with fixed("aten"):  # the matmul left to ATen (Note [choices by measurement] in runtime/autotune.py)
        prog = _program(fn, [torch.randn(128, 128)], backend="auto")
    reasons = [why for passed in prog.passed_over.values() for name, why in passed if name == "cpp"]
    assert any("vector norm of order 3" in r for r in reasons), reasons
    assert any("ATen's op chosen" in r for r in reasons), reasons
    assert set(prog.backend_of.values()) == {"torch"}
    x = torch.randn(128, 128)
    torch.testing.assert_close(prog(x)[0], fn(x)[0])


def _transposed_plus_itself(x):
    y = torch.nn.functional.layer_norm(x, (16,))
    return y.transpose(1, 2) + y  # heads and sequence of one extent: the same shape, other rows


def _rows_with_transposed(x):
    m = x.mean(-1, keepdim=True)
    return (x * 2 - m).transpose(0, 1) + m  # row i's mean beside row j's values


def _rolled_kept_dim(x):
    y = torch.nn.functional.layer_norm(x, (16,))
    return torch.cat([y[:, 1:], y[:, :1]], 1) * 2  # a roll along a kept dim: Swin's shifted windows


# See Note [permuted full values]: re-indexings of a reduced value that would read another row's
# registers (or write a position the row loop never visits) are declined, and the segment runs
# on torch: a wrong result is never the price of a kernel
_CROSS_ROW = {
    "transposed-plus-itself": (_transposed_plus_itself, [torch.randn(2, 4, 4, 16)], "re-indexed"),
    # rows of 16: a mean of at most 8 terms is unrolled (tests/test_unrolled_sums.py takes 4x4)
    "rows-with-transposed": (_rows_with_transposed, [torch.randn(16, 16)], "re-indexed"),
    "reduce-transposed": (lambda x: torch.softmax(x, -1).transpose(0, 1).sum(-1), [torch.randn(4, 4)],
                          "re-indexed|reduces"),
    "rolled-kept-dim": (_rolled_kept_dim, [torch.randn(3, 4, 16)], "re-indexed"),
    # a slice of each row as big as the reduced size (4 rows of 4, one element each): a value the
    # row loop, which visits the positions of F, has no place to write from
    "part-of-a-row": (lambda x: torch.softmax(x, -1)[..., :1] * 2, [torch.randn(4, 4)], "part of a row"),
    # an expand that would write each element of F to 32 places (MAX_COPIES is 16)
    "many-copies": (lambda x: (torch.softmax(x, -1) * 2)[:, None].expand(4, 32, 4).reshape(128, 4), [torch.randn(4, 4)],
                    "copies"),
}


@pytest.mark.parametrize("case", sorted(_CROSS_ROW))
def test_reduced_values_read_at_other_rows_are_declined(case: str) -> None:
    fn, inputs, why = _CROSS_ROW[case]
    prog = _program(fn, inputs)
    rows = [s.index for s in prog.plan.segments if s.kind in (SegmentKind.REDUCTION, SegmentKind.NORMALIZATION)]
    assert rows, "the case has no row segment"
    reasons = [r for i in rows for name, r in prog.passed_over.get(i, ()) if name == "cpp"]
    assert any(re.search(why, r) for r in reasons), (reasons, [prog.backend_of[i] for i in rows])
    assert_matches_eager(fn, inputs, prog.graph, program=prog)


def test_in_place_update_is_written_by_the_kernel_into_the_input() -> None:
    def fn(x):
        x.add_(1).sin_().mul_(5)
        return None

    x = torch.randn(5, 6)
    prog = _program(fn, [x])
    assert prog.backend_of == {0: "cpp"}
    k = prog.kernels[0]
    assert [p.target for p in k.params if p.output] == [prog.graph.inputs[0].name]
    want = x.clone().add_(1).sin_().mul_(5)
    prog(x)
    torch.testing.assert_close(x, want)


def test_in_place_write_that_would_race_is_declined() -> None:
    def fn(x):
        x.copy_(x.flip(0) * 2)

    x = torch.randn(4, 3)
    want = x.flip(0) * 2
    prog = _program(fn, [x])
    prog(x)
    torch.testing.assert_close(x, want)
    assert all(p.target is None for k in prog.kernels.values() for p in k.params)


def test_layout_mismatch_at_run_time_falls_back_instead_of_misreading() -> None:
    from runtime.backends.kernels import KernelLaunch  # noqa: F401 - the launch under test

    fn, inputs = CASES["strided-input"]
    prog = _program(fn, inputs)
    launch = next(la for la in prog.launches if la.backend == "cpp")
    env = {prog.graph.input_names[0]: inputs[0].contiguous()}  # planned strided, given contiguous
    launch.run(env)
    assert launch.run.stats["layout_fallbacks"] == 1
    torch.testing.assert_close(env[prog.plan.segments[launch.segment].outputs[0]], fn(inputs[0]))


def test_unsupported_op_is_declined_not_miscompiled() -> None:
    from runtime.codegen import lower_segment

    plan = apply_aliases(segment(capture(lambda x: torch.atan2(x, x + 1), [torch.randn(4)])), "post")
    seg = next(s for s in plan.segments if s.is_kernel)
    lay = {v: (plan.graph.metas[v].shape, plan.graph.metas[v].stride) for v in (*seg.inputs, *seg.outputs)}
    with pytest.raises(Declined, match="atan2"):
        lower_segment(plan.graph, seg, lay)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_exact_cuda_sources_compile_with_nvcc() -> None:
    kernels = {}
    for case, (fn, inputs) in sorted(CASES.items()):
        for mode in ("post",) if case.startswith("op:") else ("post", "off"):
            prog = _program(fn, inputs, mode)
            for k in prog.kernels.values():
                kernels[k.name] = k
    assert len(kernels) > len(CASES)
    assert nvcc_check_many(list(kernels.values())) == []
    # and a few alone, as CuPy gets them (prelude and one function)
    for k in sorted(kernels.values(), key=lambda k: k.name)[::40]:
        r = nvcc_check(k)
        assert r.returncode == 0, (k.name, r.stderr[-2000:])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_rejects_a_broken_kernel() -> None:
    """The compile check can fail: a kernel with a typo planted in its body is refused."""
    fn, inputs = CASES["unary"]
    k = next(iter(_program(fn, inputs).kernels.values()))
    from dataclasses import replace

    broken = replace(k, body=k.body.replace(";", " +;", 1))
    assert nvcc_check(broken).returncode != 0
    # in one translation unit with others, the broken one is named (and only it)
    fn2, inputs2 = CASES["softmax"]
    others = list(_program(fn2, inputs2).kernels.values())
    failed = nvcc_check_many([*others, broken])
    assert [name for name, _ in failed] == [broken.name] and "error" in failed[0][1]
    assert nvcc_check_many(others) == []
    assert subprocess is not None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_a_row_kernel_compiles_to_an_object_file() -> None:
    """One full compile (ptxas included) of a row kernel with block reductions; the table above
    goes to PTX only, as NVRTC does for CuPy."""
    fn, inputs = CASES["layer-norm"]
    k = next(iter(_program(fn, inputs).kernels.values()))
    r = nvcc_check(k, ptx_only=False)
    assert r.returncode == 0, r.stderr[-2000:]


def test_cpu_prelude_includes_no_header() -> None:
    """See Note [no headers in the CPU prelude]: a cold cache compiles every kernel of a program before
    its first call, and <cmath> alone was most of each build."""
    from runtime.codegen.source.ctypes_ import prelude

    assert "#include" not in prelude("cpu")
    assert "std::" not in prelude("cpu")


def test_cpu_exp_within_one_ulp_and_exact_at_the_edges() -> None:
    """See Note [vectorizable exp]: the C++ target's float exp against the exact value (in double)."""
    x = torch.cat([torch.linspace(-103.9, 88.72, 1_000_003), torch.randn(10_000) * 10,
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 88.73, -104.0, -87.5, -100.0])])
    prog = _program(lambda t: t.exp(), [x])
    assert prog.backend_of == {0: "cpp"}
    (got,) = prog(x)
    exact = torch.exp(x.double())
    normal = (exact >= torch.finfo(torch.float32).tiny) & (exact <= torch.finfo(torch.float32).max)
    ulp = (got.double() - exact).abs() / (exact.abs() * torch.finfo(torch.float32).eps)
    assert ulp[normal].max() <= 1.0, ulp[normal].max()
    sub = ~normal & torch.isfinite(x)  # denormal results: off by at most one denormal step
    assert ((got.double() - exact)[sub & (exact < 1)].abs() <= 2.0 ** -149).all()
    assert torch.equal(got[-9:].isnan(), torch.tensor([True] + [False] * 8))
    assert got[-8:].tolist() == [float("inf"), 0.0, 1.0, 1.0, float("inf"), 0.0, torch.exp(torch.tensor(-87.5)).item(),
                                 got[-1].item()]
    assert got[-1] > 0  # exp(-100) is a denormal, not flushed to zero


def test_cpu_tanh_and_erf_are_accurate() -> None:
    """See Note [vectorizable tanh and erf]: the C++ target's float tanh within 2 ulp of the exact
    value, its erf within 2e-7 absolute (1 ulp relative below 0.5), GELU against eager."""
    x = torch.cat([torch.linspace(-12, 12, 1_000_003), torch.randn(10_000) * 3, torch.logspace(-30, 0, 1000),
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.625, -0.625, 0.5, -0.5])])
    prog = _program(lambda t: (t.tanh(), torch.nn.functional.gelu(t), torch.nn.functional.gelu(t, approximate="tanh")),
                    [x])
    assert prog.backend_of == {0: "cpp"}
    tanh, gelu, gelu_tanh = prog(x)
    exact = torch.tanh(x.double())
    finite = torch.isfinite(x)
    ulp = (tanh.double() - exact).abs() / (exact.abs().clamp_min(torch.finfo(torch.float32).tiny)
                                           * torch.finfo(torch.float32).eps)
    assert ulp[finite].max() <= 2.0, ulp[finite].max()
    assert tanh[-9].isnan() and tanh[-8:-4].tolist() == [1.0, -1.0, 0.0, 0.0]
    assert torch.signbit(tanh[-5])  # tanh(-0.0) is -0.0
    # erf through GELU: 0.5 * x * (1 + erf(x / sqrt(2))), against the exact value in double
    xd = x.double()
    want = 0.5 * xd * (1 + torch.erf(xd / 2**0.5))
    err = (gelu.double() - want).abs()
    assert (err[finite] <= 2e-7 * xd[finite].abs() + 2 * torch.finfo(torch.float32).eps * want[finite].abs()).all()
    # against ATen's own CPU kernel, which ours follows. Where the CPU has AVX-512, eager's GELU
    # runs on oneDNN instead: up to ~1.2e-6 off the exact value near x = -3.5, and NaN for
    # gelu(+inf) (whose exact value, and ATen's, is +inf); ours is closer to the exact value there
    with torch.backends.mkldnn.flags(enabled=False):
        torch.testing.assert_close(gelu, torch.nn.functional.gelu(x), rtol=1e-6, atol=1e-6, equal_nan=True)
    assert gelu[-8].item() == float("inf") and gelu[-7].isnan()  # ATen's: x * 0.5 * (1 + erf) at +-inf
    torch.testing.assert_close(gelu_tanh, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-6, atol=1e-6,
                               equal_nan=True)


def _at(points: list[float], fill: float) -> torch.Tensor:
    """A 5x7 input (the op cases' shape) holding ``points`` first, ``fill`` after."""
    return torch.tensor(points + [fill] * (35 - len(points))).view(5, 7)


# the inputs where eager's float GELU and its backward are furthest from the exact value on an
# AVX-512 CPU (a dense scan of [-8, 0], scratch): oneDNN's GELU 1.2e-6 off at x = -3.468 (ours
# 2e-7); GELU's backward with tanh gives 0 at x = -5.158 where the exact value is -4.4e-6 for a
# gradient of 8 (1 - tanh^2 cancels in float; ours -8.7e-6, the same formula an ulp of tanh away)
_EAGER_LEAST_ACCURATE = {
    "op:gelu.default": [_at([-3.4678800106048584, -3.4766509532928467, -0.75], 0.3)],
    "op:gelu_backward.default": [torch.full((5, 7), 8.0), _at([-5.157840251922607, -0.7533599734306335, -4.88], 1.0)],
}


@pytest.mark.parametrize("flat", [False, True], ids=["5x7", "35"])
@pytest.mark.parametrize("case", sorted(_EAGER_LEAST_ACCURATE))
def test_op_cases_where_eager_is_off_the_exact_value(case: str, flat: bool) -> None:
    """The generated-kernel check of ``case`` (test_generated_kernels_match_eager, whose inputs are
    random) at the inputs where eager's own float result is furthest from the exact value: found
    as a rare failure of that check (x = -3.47 drawn for GELU; about 2% of draws for GELU's
    backward). Its tolerance is eager's error there plus ours; ours alone stays within the bounds of
    test_cpu_tanh_and_erf_are_accurate and test_cpu_gelu_backward_matches_aten, checked here too."""
    fn = CASES[case][0]
    inputs = [t.reshape(-1) if flat else t for t in _EAGER_LEAST_ACCURATE[case]]
    prog = _program(fn, inputs)
    tol = TOL.get(case, 1e-6)
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)
    exact = fn(*[t.double() for t in inputs])
    exact = exact if isinstance(exact, tuple) else (exact,)
    g = inputs[0].double().abs() if len(inputs) == 2 else torch.ones_like(inputs[0], dtype=torch.float64)
    for got, want in zip(prog(*inputs), exact):
        assert ((got.double() - want).abs() <= 1e-6 * g + 4 * torch.finfo(torch.float32).eps * want.abs()).all()


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_cpu_gelu_backward_matches_aten(approximate: str) -> None:
    """GELU's backward generated whole (runtime/codegen/lowering/pointwise.py, with Note [vectorizable tanh
    and erf]'s erf and tanh), on a million values, the tails, zeros, infinities and NaN: within
    1e-6 * |grad| of the exact value (ATen's op in double), which ATen's float op itself is not
    everywhere with tanh (1.04e-6 off at x = -5.16, where 1 - tanh^2 cancels; ours 5.6e-7, scratch);
    at infinities and NaN, what ATen's float op gives."""
    x = torch.cat([torch.linspace(-12, 12, 1_000_003), torch.randn(10_000) * 3,
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 0.5, -0.5])])
    g = torch.randn_like(x)

    def fn(g, x):
        return torch.ops.aten.gelu_backward(g, x, approximate=approximate)

    prog = _program(fn, [g, x])
    assert prog.backend_of == {0: "cpp"}, prog.passed_over
    (got,) = prog(g, x)
    finite = torch.isfinite(x)
    exact = fn(g.double(), x.double())
    err = (got.double() - exact).abs()[finite]
    assert (err <= 1e-6 * g.double().abs()[finite] + 4 * torch.finfo(torch.float32).eps * exact.abs()[finite]).all()
    with torch.backends.mkldnn.flags(enabled=False):
        torch.testing.assert_close(got[~finite], fn(g, x)[~finite], equal_nan=True)
        if approximate == "none":
            torch.testing.assert_close(got, fn(g, x), rtol=1e-6, atol=1e-6, equal_nan=True)


def test_values_of_outer_loops_are_computed_there() -> None:
    """See Note [hoisted per-loop values]: batch norm's per-channel scale and shift sit in the channel
    loop, not per element, and only the loops above them are collapsed for OpenMP."""
    import torch.nn.functional as F

    def f(x, m, v, w, b):
        return F.hardtanh(F.batch_norm(x, m, v, w, b, eps=1e-3), 0.0, 6.0)

    c = 192
    inputs = [torch.randn(2, c, 16, 16), torch.randn(c), torch.rand(c) + 0.5, torch.randn(c), torch.randn(c)]
    prog = _program(f, inputs)
    (launch,) = [la for la in prog._chosen.values() if getattr(la, "kernel", None) is not None]
    cpu = launch.kernel.source("cpu").split("#else")[-1]
    channel, inner = cpu.index("for (FUSEG_I i_1"), cpu.index("for (FUSEG_I i_2")
    assert "collapse(2)" in cpu
    assert "sqrt(" in cpu[channel:inner] and "sqrt(" not in cpu[inner:]
    assert_matches_eager(f, inputs, prog.plan.graph, program=prog)


def test_hoisting_keeps_branch_values_and_stores_innermost() -> None:
    from runtime.codegen.lowering.lower import _hoist_levels

    ind = "    "
    lines = [ind + "const float t1 = ((float)in0[i_0]);",  # outer loop only
             ind + "const float t2 = (t1 * 2.0f);",  # from an outer value: outer too
             ind + "float c3;",  # a branch's result
             ind + "if (i_1 < 4) {", ind + "  c3 = t1;", ind + "}", ind + "else {", ind + "  c3 = 0.0f;", ind + "}",
             ind + "const float t4 = (c3 + t2);",  # reads the branch: innermost
             ind + "const float t5 = ((float)in1[7]);",  # no counter at all
             ind + "out0[i_0 * 8 + i_1] = t4;"]
    assert _hoist_levels(lines, ind, ["i_0", "i_1"]) == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, -1, 1]


def _cpu_text(source: str) -> str:
    """The CPU side of a kernel body: FUSEG_ON_CPU(cpu, cuda) taken as cpu, CUDA-only lines dropped."""
    import re

    out, skip = [], []
    for line in source.splitlines():
        t = line.strip()
        if t.startswith("#ifdef __CUDACC__"):
            skip.append(True)
        elif t.startswith("#ifndef __CUDACC__"):
            skip.append(False)
        elif t == "#else" and skip:
            skip[-1] = not skip[-1]
        elif t == "#endif" and skip:
            skip.pop()
        elif not any(skip):
            out.append(re.sub(r"FUSEG_ON_CPU\((\w+\[j\]), fuseg_exp\([^()]*\)\)", r"\1", line))
    return "\n".join(out)


# (exps on the CPU, exps in the source): softmax-kept writes the softmax, reduces it and writes
# a view of it, whose index is another expression, so that one read computes its exp again. Its
# row of 64 is one iteration of a block of 64, so CUDA keeps its exps too (Note [row registers]
# in rows.py): 2 in the source, 5 with FUSEG_ROW_REGS=0 (its sum of s * y has a CUDA branch of its
# own beside the CPU's sum in ATen's order, Note [sums in ATen's order], each computing the exp
# where CUDA keeps none); softmax-kept-double's row of 100 over a
# block of 128 does not (CUDA computes the exp where it is read)
@pytest.mark.parametrize("case,cpu,total,regs", [("softmax-kept", 2, 2, "1"), ("softmax-kept", 2, 5, "0"),
                                                 ("softmax-kept-double", 1, 2, "1"), ("softmax-long-row", 2, 2, "1")])
def test_softmax_keeps_its_exps_on_the_cpu(monkeypatch, case: str, cpu: int, total: int, regs: str) -> None:
    """See Note [softmax keeps its exps]: on the CPU each exp of a softmax is computed once, in the sum
    pass, and read back where the softmax is read at the row's own index; a row longer than the
    array computes it again. The values are checked against eager by the kernel cases of the same
    names."""
    monkeypatch.setenv("FUSEG_ROW_REGS", regs)
    fn, inputs = CASES[case]
    prog = _program(fn, inputs)
    (launch,) = [la for la in prog._chosen.values() if getattr(la, "kernel", None) is not None]
    body = launch.kernel.body
    assert _cpu_text(body).count("fuseg_exp(") == cpu
    assert body.count("fuseg_exp(") == total


# See Note [work of a loop]: (program, input shape, whether its CPU loops are shared among threads)
_THREADED = [
    ("add, 16k", lambda x: x + 1, (2, 32, 256), False),  # ~2 us of adds: threads cost more
    ("gelu, 16k", torch.nn.functional.gelu, (2, 32, 256), True),  # an erf per element: 8x the work
    ("silu, 2k", torch.nn.functional.silu, (2, 1024), False),
    ("add, 64k", lambda x: x + 1, (4, 64, 256), True),
    ("sum over rows, 8k", lambda x: x.sum(-1), (2, 4, 32, 32), False),
    ("softmax over rows, 8k", lambda x: torch.softmax(x * 0.25, -1), (2, 4, 32, 32), True),
    ("softmax, one row", lambda x: torch.softmax(x * 0.25, -1), (1, 4096), False),  # one row: nothing to share
]


@pytest.mark.parametrize("name,fn,shape,threaded", _THREADED, ids=[t[0] for t in _THREADED])
def test_loops_are_threaded_by_their_work_not_their_size(name, fn, shape, threaded) -> None:
    inputs = [torch.randn(shape)]
    prog = _program(fn, inputs)
    (launch,) = [la for la in prog._chosen.values() if getattr(la, "kernel", None) is not None]
    assert ("omp parallel for" in _cpu_text(launch.kernel.body)) == threaded
    assert_matches_eager(fn, inputs, prog.plan.graph, program=prog)


def test_work_of_a_loop_counts_costly_calls() -> None:
    from runtime.codegen.kernel import loop_work
    from runtime.codegen.thresholds import current

    assert loop_work(100, ["const float t1 = (in0[i] + in1[i]);"]) == 100
    assert loop_work(100, ["const float t1 = fuseg_exp(in0[i]);", "const float t2 = fuseg_max<float>(log(t1), t1);"]) \
        == 100 * (1 + 2 * current().costly_call)  # a max is a plain op


def test_multiply_add_rounds_twice_as_eager_does() -> None:
    """CPU_FLAGS (runtime/codegen/build.py): no floating-point contraction. Eager rounds x*y and
    then the sum; an FMA rounds once (15362 of these 65536 elements differed on AVX-512)."""
    x, y, z = (torch.randn(64, 1024) for _ in range(3))
    prog = _program(lambda a, b, c: a * b + c, [x, y, z])
    assert prog.backend_of == {0: "cpp"}, prog.passed_over
    (got,) = prog(x, y, z)
    assert torch.equal(got, x * y + z)


def test_a_branch_per_dim_with_two_input_dtypes_is_not_miscompiled() -> None:
    """Found by tests/test_fuzz_dynamo.py: ``cat([y_int32 + 1, x.to(float64)])`` along dim 0 gave
    zeros for x's rows. The kernel source was right; g++ 12.2 at -O3 with -fno-trapping-math
    if-converted the two branches (an int load, a float load) and vectorized them wrongly (so did
    -mno-avx512f; -O0, -fno-tree-loop-vectorize or -fno-tree-loop-if-convert gave the right
    values). A kernel with an ``if`` is built without loop if-conversion (Note [no if-conversion
    of branches])."""
    def f(x, y):
        return torch.cat([y + 1, x.to(torch.float64)], 0)

    x = torch.tensor([[4.6230, -0.8803], [-6.5364, 1.7053]])
    y = torch.tensor([[5, -1], [-7, 2]], dtype=torch.int32)
    prog = _program(f, [x, y])
    assert "cpp" in prog.backend_of.values(), prog.passed_over
    (got,) = prog(x, y)
    assert torch.equal(got, f(x, y))


def _kernel_functions(prog) -> list[str]:
    return [la.kernel.function("cpu") for la in prog._chosen.values() if getattr(la, "kernel", None) is not None]


def test_only_kernels_with_if_statements_lose_if_conversion() -> None:
    """See Note [no if-conversion of branches]: a cat along an outer dim (an ``if`` per row range,
    a load in each arm) is built without loop if-conversion; a clamp (ternaries between computed
    values) keeps it; so does a cat along the last dim once loop fission made its tests constant."""
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    outer = _program(lambda a, b: torch.cat([a + 1, b * 2], 0), [x, y])
    clamp = _program(lambda a: a.clamp(-0.5, 0.5) * 2, [x])
    last = _program(lambda a, b: torch.cat([a + 1, b * 2], 1), [x, y])
    (fo,), (fc,), (fl,) = (_kernel_functions(p) for p in (outer, clamp, last))
    assert "if (" in fo and "FUSEG_NO_IF_CONVERT" in fo
    assert "FUSEG_NO_IF_CONVERT" not in fc
    assert "if (1)" in fl and "FUSEG_NO_IF_CONVERT" not in fl
    for prog, fn, ins in ((outer, lambda a, b: torch.cat([a + 1, b * 2], 0), [x, y]),
                          (clamp, lambda a: a.clamp(-0.5, 0.5) * 2, [x]),
                          (last, lambda a, b: torch.cat([a + 1, b * 2], 1), [x, y])):
        (got,) = prog(*ins)
        assert torch.equal(got, fn(*ins))


_MAX_MIN_ROWS = {
    "amax": lambda a: a.amax(-1),
    "amin": lambda a: a.amin(-1),
    "amax kept, scaled": lambda a: (a * 2).amax(-1, keepdim=True) + 1,
    "softmax": lambda a: torch.softmax(a * 0.5, -1),
    "logsumexp": lambda a: torch.logsumexp(a, -1),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cols", [7, 64, 100, 512])
@pytest.mark.parametrize("name", sorted(_MAX_MIN_ROWS))
def test_row_max_min_nan_rule(name: str, cols: int, dtype: torch.dtype) -> None:
    """Note [max without a NaN chain] (rows.py): the CPU max/min pass takes the plain compare
    and a NaN flag beside it. Rows with one NaN (first, last, in the vector tail, inside), two
    NaNs of either sign, all -inf, all +inf, signed zeros and plain values give eager's values:
    NaN exactly where eager has NaN, the rest equal (max and min; which zero a row of +0 and -0
    gives depends on the order the zeros are visited, in eager as here) or within rounding."""
    fn = _MAX_MIN_ROWS[name]
    x = torch.randn(12, cols, dtype=dtype)
    nan = float("nan")
    x[0, 0] = nan
    x[1, cols - 1] = nan
    x[2, (cols // 16) * 16 if cols % 16 else cols // 2] = nan
    x[3, cols // 3] = -nan
    x[3, cols // 2] = nan
    x[4] = -float("inf")
    x[5] = float("inf")
    x[6] = 0.0
    x[6, ::2] = -0.0
    x[7] = -0.0
    prog = _program(fn, [x])
    assert all("FUSEG_NO_IF_CONVERT" not in f for f in _kernel_functions(prog))
    (got,), want = prog(x), fn(x)
    assert torch.equal(got.isnan(), want.isnan()), (got, want)
    keep = ~want.isnan()
    if name.startswith(("amax", "amin")):
        assert torch.equal(got[keep], want[keep])
    else:
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name,fn", [
    ("amax", lambda a: a.amax(-1)),
    ("amin", lambda a: a.amin(-1)),
    ("mean kept", lambda a: a.mean(-1, keepdim=True)),
    ("logsumexp", lambda a: torch.logsumexp(a, -1)),
])
def test_row_outputs_keep_if_conversion(name: str, fn) -> None:
    """A row kernel's values per row are written by thread 0 of the row's block, a test that is
    CUDA's alone: on the CPU one thread takes the whole row. Written as an ``if`` in both builds,
    it turned loop if-conversion off for the whole CPU kernel (Note [no if-conversion of
    branches]), and the max pass's NaN rule (ternaries) stayed scalar branches: amax over
    512x512 took 164 us against eager's 14 (scratch, one thread). The CPU build has no ``if``
    now; every value still matches eager, NaN rows included."""
    x = torch.randn(64, 512)
    x[3, 100] = float("nan")
    prog = _program(fn, [x])
    funcs = _kernel_functions(prog)
    assert funcs and all("FUSEG_NO_IF_CONVERT" not in f for f in funcs), funcs
    got, want = prog(x), fn(x)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-6, atol=1e-6)


def _rope_table(inv, k):
    pos = torch.arange(16)
    freqs = pos[:, None].to(inv.dtype) * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos() * 1.0, emb.sin() * 1.0
    rot = torch.cat([-k[..., 8:], k[..., :8]], -1)
    ke = k * cos[None, None] + rot * sin[None, None]
    return cos, sin, ke[:, :, None].expand(1, 2, 2, 16, 16).clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_later_loops_read_earlier_outputs_back_on_the_cpu(dtype: torch.dtype) -> None:
    """See Note [outputs read back on the CPU]: llama's RoPE kernel (the segmenter cuts this program
    in two; torch.compile's graph of llama-tiny gives the one kernel, merged here by hand): cos
    and sin of a 16x16 table are outputs of the first loop, and the loop of the key expanded to
    the query heads (2x2x16x16) reads them back on the CPU, where it called cos and sin again;
    CUDA recomputes them. Values: eager's; the key is bit for bit what the kernel computes from
    the cos and sin it returned. A bf16 table is not read back (the stored value is rounded)."""
    from runtime.codegen import lower_segment
    from runtime.codegen.build import build_cpu
    from segmenter import Segment

    inv, k = torch.rand(8, dtype=dtype), torch.randn(1, 2, 16, 16, dtype=dtype)
    plan = apply_aliases(segment(capture(_rope_table, [inv, k])), "post")
    g = plan.graph
    assert sum(s.is_kernel for s in plan.segments) == 2  # and the views between them
    nodes = tuple(n for s in plan.segments for n in s.nodes)
    made = {o for n in nodes for o in n.outputs if o is not None}
    inputs = tuple(dict.fromkeys(v for s in plan.segments for v in s.inputs if v not in made))
    merged = Segment(0, plan.segments[0].kind, nodes, inputs, tuple(g.outputs), 0, 0)
    lay = {v: (g.metas[v].shape, g.metas[v].stride) for v in (*inputs, *g.outputs)}
    kernel = lower_segment(g, merged, lay)
    reads = {r for r in ("out0", "out1") if f"FUSEG_ON_CPU(((float){r}[" in kernel.body}  # cos, sin
    assert reads == ({"out0", "out1"} if dtype == torch.float32 else set()), kernel.body
    fn = build_cpu(kernel)
    args = {g.input_names[0]: inv, g.input_names[1]: k}
    outs = [torch.empty(g.metas[v].shape, dtype=g.metas[v].dtype) for v in g.outputs]
    fn(*[args[p.value].data_ptr() for p in kernel.params if not p.output], *[o.data_ptr() for o in outs])
    cos, sin, ke = outs
    for got, want in zip(outs, _rope_table(inv, k)):
        torch.testing.assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-5)
    if dtype == torch.float32:
        rot = torch.cat([-k[..., 8:], k[..., :8]], -1)
        mine = (k * cos[None, None] + rot * sin[None, None])[:, :, None].expand(1, 2, 2, 16, 16)
        assert torch.equal(ke, mine)


def test_the_attribute_keeps_the_command_line_rules() -> None:
    """The function attribute that turns if-conversion off must not bring FP contraction back
    (GCC's optimize attribute applies on top of the command line): x*y + z in a kernel with an
    ``if`` still rounds the product first, as eager does, on every element."""
    x, y, z = (torch.randn(64, 1024) for _ in range(3))
    w = torch.randn(8, 1024)

    def f(a, b, c, d):
        return torch.cat([a * b + c, d], 0)

    prog = _program(f, [x, y, z, w])
    (fn,) = _kernel_functions(prog)
    assert "FUSEG_NO_IF_CONVERT" in fn
    (got,) = prog(x, y, z, w)
    assert torch.equal(got, f(x, y, z, w))


def test_cpu_lines_skip_cuda_sections_only() -> None:
    from runtime.codegen.kernel import branches_with_loads, cpu_lines

    body = "\n".join(["#ifdef __CUDACC__", "  if (a) x;", "#else", "  cpu1;", "#endif",
                      "#ifndef __CUDACC__", "  cpu2;", "#else", "  if (b) y;", "#endif",
                      "#if FOO", "  both;", "#ifdef __CUDACC__", "  cuda;", "#endif", "#endif", "  if (1) z;"])
    assert cpu_lines(body) == ["  cpu1;", "  cpu2;", "  both;", "  if (1) z;"]
    assert not branches_with_loads(body)
    assert branches_with_loads(body + "\n  if (i_0 < 2) {")
    # directives the lowering never writes unbalanced: every line counts, so the branch does too
    assert branches_with_loads("#ifdef __CUDACC__\n  if (a) x;")
    assert branches_with_loads("#endif\n  if (a) x;")
