"""The inner loops of generated CPU kernels vectorize: GCC's own report (``-fopt-info-vec``) on
the kernels' sources, built with the flags the runtime builds them with.

Note [bool loads as bytes] (runtime/codegen/source/ctypes_.py): a loop that read a ``bool`` tensor through
a ``bool*`` and computed in float was not vectorized by GCC 12 with AVX-512 ("no vectype for
stmt"), so every masked_fill / where under a mask ran one element at a time (a masked softmax of
64x1024 took 3.5x eager's time). These programs are the shapes that found it.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch

from runtime.machine.compiler import CPU_FLAGS, cpu_compiler
from tests.util import compiled_post

_CXX = cpu_compiler()
pytestmark = pytest.mark.skipif(
    _CXX is None or "clang" in os.path.basename(_CXX), reason="the report read here is GCC's")


def _masked_softmax(x, b, m):
    return torch.softmax((x * 0.25 + b).masked_fill(m, -3.4e38), -1)


def _masked_fill(x, m):
    return x.masked_fill(m, 0.0) * 2.0


def _where(c, x, y):
    return torch.where(c, x, y) + 1.0


def _masked_sum(x, m):
    return (x * m).sum(-1)


def _mask_any(x):
    return (x > 0).any(-1)


def _rms_norm(x, w):  # Note [bf16 rounding in float]: its rounds and stores in the 32-bit lanes
    return w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _silu_mul(a, b):
    return torch.nn.functional.silu(a) * b


def _rope_q_k(qp, kp, cos, sin):  # HF Llama's RoPE over q and k (Note [simd pointwise loops])
    def rot(x):
        return torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
    q, k = qp.view(1, 64, 16, 64).transpose(1, 2), kp.view(1, 64, 16, 64).transpose(1, 2)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def _rope_inputs(dtype):
    # (64 tokens of 16 heads: work enough for OpenMP's threads, whose outlined loop loses the
    # pointers' __restrict__)
    return lambda: [torch.randn(64, 1024).to(dtype), torch.randn(64, 1024).to(dtype),
                    torch.randn(1, 1, 64, 64).to(dtype), torch.randn(1, 1, 64, 64).to(dtype)]


def _t5_guard(h, y, w):  # Note [no partial redundancy elimination around inlined math]: bounds selected once
    x = h + y
    big = torch.where(x.isinf().any(), torch.finfo(x.dtype).max - 1000, torch.finfo(x.dtype).max)
    return _rms_norm(x.clamp(min=-big, max=big), w)


def _t5_check(h, y):  # T5's overflow check on its own: a sum kept, and whether it holds an inf
    x = h + y
    return x, x.isinf().any()


CASES = {
    "masked softmax": (_masked_softmax, lambda: [torch.randn(64, 1024), torch.randn(1024), torch.rand(64, 1024) > 0.8]),
    "masked_fill": (_masked_fill, lambda: [torch.randn(64, 1024), torch.rand(64, 1024) > 0.5]),
    "where": (_where, lambda: [torch.rand(64, 1024) > 0.5, torch.randn(64, 1024), torch.randn(64, 1024)]),
    "float times bool, summed": (_masked_sum, lambda: [torch.randn(64, 1024), torch.rand(64, 1024) > 0.5]),
    "any of a comparison": (_mask_any, lambda: [torch.randn(64, 1024)]),
    "bf16 RMS norm": (_rms_norm, lambda: [torch.randn(64, 1024, dtype=torch.bfloat16),
                                          torch.randn(1024, dtype=torch.bfloat16)]),
    "bf16 silu times": (_silu_mul, lambda: [torch.randn(64, 1024, dtype=torch.bfloat16),
                                            torch.randn(64, 1024, dtype=torch.bfloat16)]),
    "RoPE over q and k": (_rope_q_k, _rope_inputs(torch.float32)),
    "bf16 RoPE over q and k": (_rope_q_k, _rope_inputs(torch.bfloat16)),
    # (Note [fp16 on the CPU]) loops of F16C's one-value conversions stayed scalar
    "fp16 RoPE over q and k": (_rope_q_k, _rope_inputs(torch.float16)),
    "fp16 silu times": (_silu_mul, lambda: [torch.randn(64, 1024, dtype=torch.float16),
                                            torch.randn(64, 1024, dtype=torch.float16)]),
    "fp16 RMS norm": (_rms_norm, lambda: [torch.randn(64, 1024, dtype=torch.float16),
                                          torch.randn(1024, dtype=torch.float16)]),
    "fp16 clamp to bounds T5 selects": (_t5_guard, lambda: [torch.randn(64, 1024, dtype=torch.float16),
                                                            torch.randn(64, 1024, dtype=torch.float16),
                                                            torch.randn(1024, dtype=torch.float16)]),
    "fp16 sum and whether it holds an inf (T5's check)": (_t5_check, lambda: [
        torch.randn(128, 512, dtype=torch.float16), torch.randn(128, 512, dtype=torch.float16)]),
    "all of a comparison": (lambda x: (x > -4).all(-1), lambda: [torch.randn(64, 1024)]),
    "float clamp to bounds T5 selects": (_t5_guard, lambda: [torch.randn(64, 1024), torch.randn(64, 1024),
                                                             torch.randn(1024)]),
    "float layer norm of fp16 rows": (
        lambda x: torch.nn.functional.layer_norm(x.float(), (x.shape[-1],)),
        lambda: [torch.randn(64, 4096, dtype=torch.float16)]),
}


def _cpu_only(lines: list[str]) -> list[str]:
    """``lines`` with those the CPU build leaves out (``__CUDACC__`` branches) blanked."""
    out, stack = [], []  # per open #if: is the current branch CUDA's alone; does #else flip that
    for line in lines:
        d = line.strip()
        if d.startswith("#if"):
            about_cuda = d in ("#ifdef __CUDACC__", "#ifndef __CUDACC__")
            stack.append([d == "#ifdef __CUDACC__", about_cuda])
        elif d.startswith("#else") and stack:
            stack[-1][0] = stack[-1][1] and not stack[-1][0]
        elif d.startswith("#endif") and stack:
            stack.pop()
        out.append("" if any(cuda for cuda, _ in stack) else line)
    return out


def _without_row_conversions(lines: list[str]) -> list[str]:
    """``lines`` with the helpers of Note [fp16 rows converted by the row] blanked: F16C's
    conversions written as vectors already, and their tails of fewer than eight values."""
    out, depth = [], 0  # the #if nesting within the helpers' block (0: outside it)
    for line in lines:
        d = line.strip()
        if depth == 0 and d == "#ifndef FUSEG_H_ROWS":
            depth = 1
        elif depth and d.startswith("#if"):
            depth += 1
        elif depth and d.startswith("#endif"):
            depth -= 1
            out.append("")
            continue
        out.append("" if depth else line)
    return out


def _inner_loops(function: str) -> list[tuple[int, int]]:
    """(first, last) 1-based line numbers (in ``function``) of each loop that contains no other
    loop: GCC reports a vectorized loop at a line of its body, not always at the ``for``."""
    lines = _without_row_conversions(_cpu_only(function.splitlines()))
    inner = []
    for i in [i for i, line in enumerate(lines) if re.match(r"\s*for \(", line)]:
        depth, opened = 0, False
        for j in range(i, len(lines)):
            if j > i and re.match(r"\s*for \(", lines[j]):
                break  # a nested loop (or the next one: the body has closed by then)
            depth += lines[j].count("{") - lines[j].count("}")
            opened = opened or "{" in lines[j]
            if opened and depth <= 0:
                inner.append((i + 1, j + 1))
                break
    return inner


@pytest.mark.parametrize("name", sorted(CASES))
def test_inner_loops_vectorize(name, tmp_path):
    fn, make = CASES[name]
    inputs = make()
    prog = compiled_post(fn, inputs, backend="cpp")
    for got, want in zip(prog(*inputs), fn(*inputs) if isinstance(fn(*inputs), tuple) else [fn(*inputs)]):
        # a half intermediate may be one unit of its dtype off eager's where exp is ours (Note
        # [vectorizable exp]: within 1 ulp in float) and the float lands near a rounding boundary; a
        # product of it then up to two (fp16 SiLU times a value: 2 units at most over 30 seeds)
        half = got.dtype in (torch.float16, torch.bfloat16)
        torch.testing.assert_close(got, want, **({"rtol": 4 * torch.finfo(got.dtype).eps, "atol": 1e-5} if half else {}))
    assert prog.kernels, "no generated kernel to read"
    for index, kernel in prog.kernels.items():
        src = kernel.source("cpu")
        start = src.count("\n") - kernel.function("cpu").count("\n")  # the function's first line, 0-based
        inner = [(start + a, start + b) for a, b in _inner_loops(kernel.function("cpu"))]
        assert inner, f"segment {index}: no loop found in\n{kernel.function('cpu')}"
        path = tmp_path / f"k{index}.cpp"
        path.write_text(src)
        flags = [f for f in CPU_FLAGS if f != "-shared"]
        report = subprocess.run([_CXX, *flags, "-c", "-fopt-info-vec-optimized", str(path), "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
        vectorized = [int(m.group(1)) for m in re.finditer(
            rf"{re.escape(path.name)}:(\d+):\d+: optimized: loop vectorized", report)]
        missed = [(a, b) for a, b in inner if not any(a <= n <= b for n in vectorized)]
        assert not missed, (f"segment {index}: inner loops at lines {missed} not vectorized\n"
                            + "\n\n".join("\n".join(src.splitlines()[a - 1:b]) for a, b in missed))


def _in_place(x, y):
    x.mul_(2.0).add_(y)
    return x


_SIMD = {  # (fn, inputs, whether the innermost loop is marked omp simd: Note [simd pointwise loops])
    "two outputs, four inputs": (_rope_q_k, _rope_inputs(torch.float32), True),
    "an add of two 2-d inputs": (lambda x, y: x * 2.0 + y, lambda: [torch.randn(64, 1024), torch.randn(64, 1024)], True),
    "an in-place update (written to an output of its own)": (
        _in_place, lambda: [torch.randn(64, 1024), torch.randn(64, 1024)], True),
    "a pad of the last dim (its branch ranges split: if (0) / if (1))": (
        lambda x: torch.nn.functional.pad(x, (1, 1)) * 2.0, lambda: [torch.randn(64, 1022)], True),
    "a pad of rows (an if around a load)": (
        lambda x: torch.nn.functional.pad(x, (0, 0, 1, 1)) * 2.0, lambda: [torch.randn(62, 1024)], False),
}


@pytest.mark.parametrize("name", sorted(_SIMD))
def test_which_pointwise_loops_are_marked_simd(name) -> None:
    fn, make, marked = _SIMD[name]
    inputs = make()
    want = fn(*[t.clone() for t in inputs])
    prog = compiled_post(fn, [t.clone() for t in inputs], backend="cpp")
    assert prog.kernels, "no generated kernel"
    cpu = "".join(k.function("cpu").split("#else")[-1] for k in prog.kernels.values())
    assert ("#pragma omp simd\n" in cpu) == marked, cpu
    args = [t.clone() for t in inputs]
    got = prog(*args)
    for g, w in zip(got, want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_a_loop_whose_pointers_may_meet_is_not_marked_simd() -> None:
    """See Note [simd pointwise loops]. A kernel writing an input in place, or a loop reading an
    output back, keeps GCC's own choice (the pragma would state what is not so)."""
    from types import SimpleNamespace

    from runtime.codegen.lowering.lower import _simd

    body = ["    const float t2 = ((float)in0[i_0 * 8 + i_1]);", "    out0[i_0 * 8 + i_1] = ((float)(t2));"]
    apart = SimpleNamespace(params={"in0": SimpleNamespace(target=None), "out0": SimpleNamespace(target=None)})
    in_place = SimpleNamespace(params={"in0": SimpleNamespace(target=None), "out0": SimpleNamespace(target="in0")})
    assert _simd(apart, body) and not _simd(in_place, body)
    assert not _simd(apart, [*body, "    const float t3 = ((float)out0[i_0 * 8 + (i_1 + 1)]);"])
    assert not _simd(apart, [*body, "    if (i_0 > 2) {", "    }"])
