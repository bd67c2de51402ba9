"""The CuPy backend on a real GPU against eager CUDA PyTorch (skipped where there is none).

Run by the GPU validation (perf/gpu_validate.sh); on machines without CUDA every test here skips.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

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
