"""The CuPy backend on a real GPU against eager CUDA PyTorch (skipped where there is none).

Run by the GPU validation (perf/gpu_validate.sh); on machines without CUDA every test here skips.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils import _pytree as pytree

import runtime
from alias import apply_aliases
from runtime.codegen.build import compilations
from segmenter import SegmentKind, capture, segment

from .kernel_cases import CASES, TOL
from .util import assert_matches_eager


def _cuda_ready() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("cupy") is None:
        return False
    import cupy

    return cupy.cuda.is_available()


pytestmark = pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA device and CuPy")


def to_cuda(t: torch.Tensor) -> torch.Tensor:
    """The same tensor on the GPU, with the same sizes, strides and storage offset."""
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = t.as_strided((n,), (1,), 0).cuda()
    return flat.as_strided(t.shape, t.stride(), t.storage_offset())


def _program(fn, inputs, mode="post", backend="cupy"):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), mode), backend=backend)


@pytest.mark.parametrize("mode", ["post", "off"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cupy_kernels_match_eager_cuda(case: str, mode: str) -> None:
    fn, cpu_inputs = CASES[case]
    inputs = [to_cuda(t) for t in cpu_inputs]
    prog = _program(fn, inputs, mode)
    kernel_segments = [s.index for s in prog.plan.segments if s.kind in (
        SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION)]
    declined = {i: prog.passed_over.get(i) for i in kernel_segments if prog.backend_of[i] != "cupy"}
    assert declined == {}, declined
    tol = max(TOL.get(case, 1e-6), 1e-5)
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)


def test_auto_picks_cupy_on_cuda() -> None:
    fn, cpu_inputs = CASES["rope"]
    prog = _program(fn, [to_cuda(t) for t in cpu_inputs], backend="auto")
    assert set(prog.backend_of.values()) == {"cupy"}


def test_second_compile_compiles_nothing_on_cuda() -> None:
    fn, cpu_inputs = CASES["softmax"]
    inputs = [to_cuda(t) for t in cpu_inputs]
    _program(fn, inputs)
    before = dict(compilations)
    _program(fn, inputs)
    assert compilations == before


def test_runs_on_torchs_current_stream() -> None:
    fn, cpu_inputs = CASES["rms-norm"]
    inputs = [to_cuda(t) for t in cpu_inputs]
    prog = _program(fn, inputs)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):  # keep the side stream busy so an unordered launch would read too early
            big = big @ big * 1e-3
        x = inputs[0] * 1.0
        got = prog(x, inputs[1])[0]
    torch.cuda.synchronize()
    torch.testing.assert_close(got, fn(x, inputs[1]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny", "bert-tiny", "rope-seed"])
def test_zoo_models_on_cuda(name: str) -> None:
    from perf import zoo

    fn, cpu_inputs = zoo.get(name).factory()
    if isinstance(fn, torch.nn.Module):
        fn = fn.cuda()
    inputs = [to_cuda(t) if isinstance(t, torch.Tensor) else t for t in cpu_inputs]
    graph = capture(fn, inputs)
    module = fn if isinstance(fn, torch.nn.Module) else None
    for mode in ("post", "pre"):
        prog = runtime.compile(apply_aliases(segment(graph), mode), backend="auto")
        assert "cupy" in prog.backend_of.values()
        assert_matches_eager(fn, inputs, graph, module=module, program=prog, atol=1e-4, rtol=1e-4)


def _dynamic_on_the_gpu(fn, make, sizes):
    """``fn`` under ``torch.compile(dynamic=True)`` on CUDA at each size against eager (values);
    the compiler and the NVRTC compiles each size cost."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    torch._dynamo.reset()
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    compiles = []
    for n in sizes:
        torch.manual_seed(n)
        inputs = [t.cuda() for t in make(n)]
        before = compilations["cuda"]
        with torch.no_grad():
            got, want = compiled(*[t.clone() for t in inputs]), fn(*[t.clone() for t in inputs])
        compiles.append(compilations["cuda"] - before)
        for g, w in zip(pytree.tree_leaves(got), pytree.tree_leaves(want)):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=f"size {n}")
    torch._dynamo.reset()
    return compiler, compiles


@pytest.mark.parametrize("name", ["softmax-view-sum", "rms-norm", "layer-norm", "halves", "masked-softmax",
                                  "transpose-contiguous"])
def test_a_new_size_compiles_no_cuda_kernel(name: str) -> None:
    """Note [kernel sizes as arguments] on the GPU: a program under ``torch.compile(dynamic=True)``
    at three sizes against eager; its CUDA kernels take the sizes by value, so after the first
    size's plan no NVRTC compile runs (``compilations["cuda"]``), even where a size gets a plan of
    its own (the same kernel sources)."""
    from .test_dynamic import DYNAMIC_PROGRAMS

    fn, make = DYNAMIC_PROGRAMS[name]
    compiler, compiles = _dynamic_on_the_gpu(fn, make, (9, 21, 40))
    programs = compiler.compiled  # (a size that breaks a plan's condition gets a plan of its own)
    assert programs and all(p.sizes is not None for p in programs), compiler.symbolic_refused
    assert all("cupy" in p.backend_of.values() for p in programs), [p.passed_over for p in programs]
    assert any(k.symbols for p in programs for k in p.kernels.values())
    assert compiles[1:] == [0, 0], (compiles, len(programs))


@pytest.mark.parametrize("name", ["row-softmax", "row-sum", "column-mean", "tokens-sum"])
def test_rows_of_any_length_run_one_plan_on_the_gpu(name: str) -> None:
    """Note [a row's block] on the GPU: rows from 9 to 600 elements through one symbolic plan made at
    48, each launch with the block its row needs (computed at the call), values as eager's, no NVRTC
    compile after the first size."""
    from .test_dynamic import ROW_LENGTH_PROGRAMS

    fn, make = ROW_LENGTH_PROGRAMS[name]
    compiler, compiles = _dynamic_on_the_gpu(fn, make, (48, 32, 9, 300, 600))
    assert len(compiler.compiled) == 1, [p.sizes.condition_text() for p in compiler.compiled]
    (program,) = compiler.compiled
    assert "cupy" in program.backend_of.values(), program.passed_over
    assert compiles[1:] == [0, 0, 0, 0], compiles


def test_half_conversions_on_the_gpu_are_bit_exact() -> None:
    """See Note [half conversions on the GPU]: the cvt instructions against torch's CUDA conversions,
    every fp16 bit pattern to float and back, and floats at and between fp16/bf16 values (ties
    included), subnormals, overflow and NaN, to fp16 and bf16; and with FUSEG_SOFT_HALF's software
    versions too (FUSEG_CUDA_TUNING=0), which the CPU test checks against torch's CPU conversions."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).cuda()
    halves = bits.view(torch.float16)
    prog = _program(lambda h: h.to(torch.float32) * 1, [halves])
    assert "cupy" in prog.backend_of.values(), prog.passed_over
    (got,) = prog(halves)
    want = halves.to(torch.float32)
    ok = ~want.isnan()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[ok].view(torch.int32), want[ok].view(torch.int32))
    f = want[ok].double().sort().values
    mids = ((f[1:] + f[:-1]) / 2).float()
    special = torch.tensor([0.0, -0.0, 1e-8, 2.9802322e-08, 65504.0, 65519.99, 65520.0, 1e6, float("inf"),
                            -float("inf"), float("nan"), 1e-40, -5.96e-08], device="cuda")
    xs = torch.cat([want[ok], mids, special, torch.randn(100000, device="cuda") * 1000])
    for dtype in (torch.float16, torch.bfloat16):
        prog = _program(lambda x, dtype=dtype: x.to(dtype) * 1, [xs])
        assert "cupy" in prog.backend_of.values(), prog.passed_over
        (low,) = prog(xs)
        want_lp = xs.to(dtype)
        nan = want_lp.isnan()
        assert torch.equal(low.isnan(), nan)
        assert torch.equal(low[~nan].view(torch.int16), want_lp[~nan].view(torch.int16)), dtype


def test_half_conversions_in_software_on_the_gpu(monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_CUDA_TUNING", "0")
    test_half_conversions_on_the_gpu_are_bit_exact()


@pytest.mark.parametrize("rows", [6, 9])
def test_a_float32_bias_is_added_after_the_product_on_cuda(rows: int) -> None:
    """See Note [a matmul's bias after it]: by default on CUDA in float32 each addmm is an mm, its bias
    added in the CuPy kernel that reads the product; values and layouts match eager at two shapes."""
    import torch.nn.functional as F

    def mlp(x, w1, b1, w2, b2, g, beta):
        h = F.gelu(F.linear(x, w1, b1))
        return F.layer_norm(F.linear(h, w2, b2) + x, (x.shape[-1],), g, beta)

    inputs = [t.cuda() for t in (torch.randn(rows, 16), torch.randn(32, 16), torch.randn(32), torch.randn(16, 32),
                                 torch.randn(16), torch.randn(16), torch.randn(16))]
    prog = _program(mlp, inputs)
    ops = [n.op for n in prog.plan.graph.nodes]
    assert "aten.addmm.default" not in ops and ops.count("aten.mm.default") == 2
    adds = [s.index for s in prog.plan.segments if "aten.add.Tensor" in {n.op for n in s.nodes}]
    assert adds and all(prog.backend_of[i] == "cupy" for i in adds)
    assert_matches_eager(mlp, inputs, prog.graph, program=prog, atol=1e-4, rtol=1e-4)
