"""Note [no partial redundancy elimination around inlined math] (runtime/codegen/kernel.py): a
CPU kernel that calls fuseg_exp, fuseg_erf or fuseg_tanh is built without g++'s PRE, which left
the last row pass of a layer norm backward recomputing GELU (bert-tiny's backward) as scalar
code: with the attribute every loop of that kernel vectorizes (what the compiler reports), and
its values are eager's; a kernel without those calls keeps PRE."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen.kernel import translation_unit
from runtime.machine.compiler import CPU_FLAGS, cpu_compiler
from segmenter import capture, segment


def _ln_backward_with_gelu(h, mean, rstd, w, go):
    """A layer norm backward over GELU(h), and GELU's own backward (the shape of bert-tiny's)."""
    y = torch.nn.functional.gelu(h)
    xh = (y - mean) * rstd
    gw = go * w
    s1 = gw.sum(-1, keepdim=True)
    s2 = (gw * xh).sum(-1, keepdim=True)
    gx = rstd / 64 * (gw * 64 - s1 - xh * s2)
    return torch.ops.aten.gelu_backward(gx, h), go * xh


def _inputs(rows: int = 64):
    g = torch.Generator().manual_seed(rows)
    h = torch.randn(rows, 64, generator=g)
    y = torch.nn.functional.gelu(h)
    return [h, y.mean(-1, keepdim=True), y.var(-1, keepdim=True, correction=0).add(1e-12).rsqrt(),
            torch.randn(64, generator=g), torch.randn(rows, 64, generator=g)]


def _kernels(fn, inputs):
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")
    return prog, [la.kernel for la in prog._chosen.values() if getattr(la, "kernel", None) is not None]


@pytest.mark.parametrize("rows", [64, 37])
def test_a_kernel_calling_inlined_math_is_built_without_pre_and_matches_eager(rows: int) -> None:
    inputs = _inputs(rows)
    prog, kernels = _kernels(_ln_backward_with_gelu, inputs)
    with_math = [k for k in kernels if "fuseg_erf(" in k.body]
    assert with_math and all("FUSEG_NO_PRE" in k.function("cpu") for k in with_math)
    got, want = prog(*inputs), _ln_backward_with_gelu(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        assert g.stride() == w.stride()


def test_a_kernel_without_it_keeps_pre() -> None:
    _, kernels = _kernels(lambda a, b: torch.where(a > b, a * b + 1, b), [torch.randn(64, 64), torch.randn(64, 64)])
    assert kernels and all("FUSEG_NO_PRE" not in k.function("cpu") for k in kernels)


@pytest.mark.skipif(cpu_compiler() is None or "clang" in (cpu_compiler() or ""), reason="g++'s vectorizer report")
def test_every_loop_of_that_kernel_vectorizes() -> None:
    """The compiler's own report (-fopt-info-vec-missed) on the kernel's translation unit: no loop
    left scalar for control flow (the failure PRE caused)."""
    _, kernels = _kernels(_ln_backward_with_gelu, _inputs())
    with_math = [k for k in kernels if "fuseg_erf(" in k.body]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.cpp")
        with open(src, "w") as f:
            f.write(translation_unit(with_math, "cpu"))
        r = subprocess.run([cpu_compiler(), *CPU_FLAGS, "-fopt-info-vec-missed", "-o", os.path.join(tmp, "k.so"), src],
                           capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "control flow in loop" not in r.stderr, [line for line in r.stderr.splitlines() if "control flow" in line]
