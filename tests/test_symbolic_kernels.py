"""Generated kernels of symbolic plans (Note [kernel sizes as arguments] in
runtime/codegen/source/symsizes.py): the same source, so the same binary, whatever size the plan was
made at; sizes read from the symbols' values at the call; the CUDA source compiles too."""

from __future__ import annotations

import shutil

import pytest
import torch

from runtime.codegen.build import nvcc_check_many

from .test_dynamic import DYNAMIC_PROGRAMS, _run_dynamic

#: programs whose kernels are generated (not matmuls or attention on ATen), by the test table's name
KERNEL_PROGRAMS = ["softmax-view-sum", "rms-norm", "layer-norm", "halves", "cat", "expand", "mean-over-dynamic",
                   "transpose-contiguous", "masked-softmax", "embedding"]


def _kernels(name: str, sizes: tuple[int, ...]) -> dict[str, object]:
    fn, make = DYNAMIC_PROGRAMS[name]
    compiler = _run_dynamic(fn, make, sizes)
    (program,) = compiler.compiled
    assert program.sizes is not None
    return {k.name: k for k in program.kernels.values()}


@pytest.mark.parametrize("name", KERNEL_PROGRAMS)
def test_a_plan_made_at_other_sizes_has_the_same_kernels(name: str) -> None:
    """Two plans of one program, made from calls of different sizes, compile the same sources:
    a new size never needs a compiler run (where the plan's conditions hold)."""
    torch._dynamo.reset()
    first = _kernels(name, (9, 11))
    torch._dynamo.reset()
    second = _kernels(name, (21, 23))
    assert first, "the program has generated kernels"
    assert sorted(first) == sorted(second)
    assert any(k.symbols for k in first.values()), "some kernel reads a symbolic size"
    for k in first.values():
        assert k.source("cpu") == second[k.name].source("cpu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_symbolic_kernels_compile_for_cuda() -> None:
    """The CUDA target takes the symbols by value (the CuPy launch passes them, with the grid
    computed at the call); no GPU here: nvcc compiles the exact source CuPy would get."""
    kernels = {}
    for name in KERNEL_PROGRAMS:
        torch._dynamo.reset()
        kernels.update({k: v for k, v in _kernels(name, (9, 11)).items() if v.symbols and v.kind != "embedding"})
    assert kernels
    assert nvcc_check_many(list(kernels.values())) == []
    assert all("const long long fuseg_s" in k.function("cuda") for k in kernels.values())


def test_two_plans_share_nothing_symbolic() -> None:
    """Found by running the dynamic-shape test files in one process: a process-wide cache keyed by
    sizes (the meta kernels' results, runtime/codegen/source/checks.py) handed a second plan of a program
    another plan's SymInts (same expressions, another ShapeEnv, sealed); the second plan's decision
    on them (``s != s // 2``, a slice's bound) asked the sealed one, which raised: the kernel was
    declined and the segment ran on ATen."""
    # (x[:, None, :].expand(-1, 3, -1), then x[:, :h] with h = n // 2, twice)
    for name, sizes in (("expand", (9, 11, 13)), ("halves", (9, 11)), ("halves", (21, 23))):
        torch._dynamo.reset()
        fn, make = DYNAMIC_PROGRAMS[name]
        compiler = _run_dynamic(fn, make, sizes)
        (program,) = compiler.compiled
        assert compiler.symbolic_refused == [] and program.sizes is not None, compiler.symbolic_refused
        assert program.kernels, program.passed_over  # generated, not declined
