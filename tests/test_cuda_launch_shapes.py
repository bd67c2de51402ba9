"""Note [CUDA launch shapes] (runtime/codegen/kernel.py) and Note [half conversions on the GPU]
(ctypes_.py): what a generated CUDA kernel's source says of its launch, with the tuning on and
off. These are checked here as source and through nvcc (no GPU); the kernels' values on a GPU
are tests/test_gpu.py's, which run every kernel case against eager CUDA PyTorch."""

from __future__ import annotations

import shutil

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen.build import nvcc_check_many
from segmenter import capture, segment


def _kernels(fn, inputs):
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="auto")
    return list(prog.kernels.values())


def _pointwise_and_row():
    (pw,) = _kernels(lambda x: (x * 2).sin() + 1, [torch.randn(3000)])
    (row,) = _kernels(lambda x: torch.softmax(x, -1), [torch.randn(64, 4096)])
    return pw, row


def test_the_block_is_a_constant_of_the_source(monkeypatch) -> None:
    monkeypatch.delenv("FUSEG_CUDA_TUNING", raising=False)
    pw, row = _pointwise_and_row()
    assert (pw.block, row.block) == (256, 512)
    for k in (pw, row):
        src = k.source("cuda")
        assert f"__launch_bounds__({k.block}) {k.name}(" in src
        assert f"#define FUSEG_BLOCK_DIM ((FUSEG_I){k.block})" in src
        assert "#define FUSEG_SOFT_HALF" not in src
        assert "__launch_bounds__" not in k.source("cpu")
    # four elements a thread: a grid four times smaller than one a thread
    assert pw.grid == -(-3000 // 1024)
    assert "u_ < 4" in pw.body
    # a row of 4096 over 512 threads: each pass 8 iterations, on CUDA only (the CPU loop as before)
    assert row.body.count("for (int it = 0; it < 8; ++it)") == 3
    assert row.body.count("for (FUSEG_I j = FUSEG_THREAD; j < 4096; j += FUSEG_BLOCK_DIM)") == 3


def test_tuning_off_is_the_code_before(monkeypatch) -> None:
    monkeypatch.setenv("FUSEG_CUDA_TUNING", "0")
    pw, row = _pointwise_and_row()
    assert pw.grid == -(-3000 // 256)
    assert "u_" not in pw.body and "it <" not in row.body
    for k in (pw, row):
        src = k.source("cuda")
        assert "__launch_bounds__" not in src
        assert "#define FUSEG_SOFT_HALF" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("tuning", ["1", "0"])
def test_kernels_of_several_blocks_compile_in_one_unit(monkeypatch, tuning: str) -> None:
    """A translation unit of kernels with different blocks (each redefines FUSEG_BLOCK_DIM for
    itself) and half conversions either way, through nvcc for sm_90 and sm_75 (no bf16 cvt)."""
    monkeypatch.setenv("FUSEG_CUDA_TUNING", tuning)
    pw, row = _pointwise_and_row()
    (half,) = _kernels(lambda x, y: (x * y).to(torch.float16) + 1, [torch.randn(300).bfloat16(), torch.randn(300).bfloat16()])
    for arch in ("sm_90", "sm_75"):
        assert nvcc_check_many([pw, row, half], arch=arch) == [], arch


@pytest.mark.parametrize("name", ["softmax-view-sum", "masked-softmax", "rms-norm"])
def test_a_new_size_gets_no_new_cuda_source(name: str) -> None:
    """Regression (the H100 run at f5db8b0: tests/test_gpu.py's
    test_a_new_size_compiles_no_cuda_kernel compiled one kernel at the third size): a row
    kernel of symbolic length takes its block from the first call's size, and a size that
    needs another block gets a plan of its own. With the block written into the source, that
    plan's kernel was a new source, so NVRTC ran. A kernel with symbolic sizes keeps the block
    out of its source (blockDim.x): every plan's CUDA sources are the first plan's."""
    from runtime.dynamo import FusegCompiler, compile_with_aot

    from .test_dynamic import DYNAMIC_PROGRAMS

    fn, make = DYNAMIC_PROGRAMS[name]
    torch._dynamo.reset()
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    with torch.no_grad():
        for n in (9, 21, 40):
            compiled(*make(n))
    torch._dynamo.reset()
    programs = compiler.compiled
    assert programs and all(p.sizes is not None for p in programs), compiler.symbolic_refused
    first = {k.source("cuda") for k in programs[0].kernels.values()}
    assert first
    for p in programs[1:]:
        assert {k.source("cuda") for k in p.kernels.values()} <= first
