"""Note [sums in chunks] (runtime/codegen/lowering/cascade.py): every generated reduction keeps its error
against float64 within eager's on the same input, at every size.

A differential test: each program runs compiled (the kernels built before the first call, every
segment on a generated kernel: checked through the program's backends) and eager on the same
input, and both are compared with the program run in float64 on that input. The error is the
largest absolute difference over the output, relative to the largest magnitude of the float64
result; ours must be at most twice eager's plus two units of the output dtype's precision (the
last rounding of a value both compute in float and store in the output dtype). Inputs are
uniform in [0, 1) (plus an offset for the variances: cancellation), where an accumulator that
adds one value at a time loses the most.

Sizes: 1, 2^k - 1 and 2^k + 1 around the chunk lengths, up to 2^22 + 1 elements in CI, through
one symbolic plan per program (one kernel build for every size, rows chunked at every length)
and at fixed sizes (a row of a known length up to the chunk is one loop, longer ones chunked).
``--run-slow`` adds 2^24 + 1 and 2^26 + 1 elements.
"""

from __future__ import annotations

import pytest
import torch

from runtime.dynamo import FusegCompiler, compile_with_aot

F = torch.nn.functional


def _whole(x):
    return x.sum(), x.mean(), x.var(), x.std(), torch.linalg.vector_norm(x), x.abs().sum(), (x * x).mean()


def _up(x):
    """A half input as float32 (the float64 reference stays float64)."""
    return x if x.dtype == torch.float64 else x.float()


def _whole_up(x):  # half inputs summed into float32 outputs: the accumulation alone, no half rounding
    return _up(x).sum(), _up(x).mean(), torch.linalg.vector_norm(_up(x), 1)


def _logsumexp(x):
    return torch.logsumexp(x, 0)


def _rows(x):
    return x.sum(-1), x.mean(-1), x.var(-1), torch.linalg.vector_norm(x, dim=-1), torch.logsumexp(x, -1)


def _softmax(x):
    return torch.softmax(x, -1)


def _log_softmax(x):
    return torch.log_softmax(x, -1)


def _layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],))


def _layer_norm_in_float(x):
    """A half-precision row normalized in float and rounded back: our kernel, where a layer norm op
    of a half input runs ATen's (Note [layer norm in low precision runs ATen's])."""
    return F.layer_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],)).to(x.dtype)


def _rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _columns(x):
    return x.sum(0), x.mean(0), x.var(0), torch.linalg.vector_norm(x, dim=0)


def _softmax_columns(x):
    return torch.softmax(x, 0)


def _make(shape, dtype, offset=0.0):
    g = torch.Generator().manual_seed(sum(shape) * 31 + len(shape))
    return (torch.rand(*shape, generator=g, dtype=torch.float64) + offset).to(dtype)


def _outputs(r) -> tuple[torch.Tensor, ...]:
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def _error(got: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item() if ref.numel() else 0.0
    if ref.numel() == 0:
        return 0.0
    diff = (got.double() - ref)
    both_nan = got.isnan() & ref.isnan()
    diff = diff.masked_fill(both_nan, 0.0)
    return diff.abs().max().item() / (scale if scale > 0 else 1.0)


def check(fn, compiled, x: torch.Tensor, what: str) -> None:
    """``compiled(x)`` against eager ``fn(x)``, both against ``fn`` in float64 on the same values."""
    ref = _outputs(fn(x.double()))
    eager = _outputs(fn(x))
    got = _outputs(compiled(x))
    assert len(got) == len(eager)
    for i, (g, e, r) in enumerate(zip(got, eager, ref)):
        assert g.dtype == e.dtype and g.shape == e.shape, f"{what} output {i}"
        assert g.stride() == e.stride(), f"{what} output {i}: strides"
        ours, theirs = _error(g, r), _error(e, r)
        slack = 2 * torch.finfo(e.dtype).eps
        assert ours <= 2 * theirs + slack, f"{what} output {i}: error {ours:.3g} against eager's {theirs:.3g}"


def _kernels_only(compiler: FusegCompiler) -> None:
    """Every program compiled ran each of its segments on a generated kernel (none left to torch)."""
    from runtime.codegen.build import cpu_compiler

    assert compiler.compiled, "nothing compiled"
    if cpu_compiler() is None:  # pragma: no cover - the machines this runs on have g++
        return
    for program in compiler.compiled:
        kinds = {i: k.kind for i, k in program.kernels.items()}
        assert kinds, "no kernel in the program"
        for i in kinds:
            assert program.backend_of[i] == "cpp", program.passed_over.get(i)


#: name -> (program, input shape at size n, variance offset)
DYNAMIC = {
    "whole": (_whole, lambda n: (n,), 3.0),
    "whole-logsumexp": (_logsumexp, lambda n: (n,), 0.0),
    "rows": (_rows, lambda n: (3, n), 3.0),
    "rows-softmax": (_softmax, lambda n: (3, n), 0.0),
    "rows-log-softmax": (_log_softmax, lambda n: (3, n), 0.0),
    "rows-layer-norm": (_layer_norm, lambda n: (3, n), 3.0),
    "rows-rms-norm": (_rms_norm, lambda n: (3, n), 0.0),
    "columns": (_columns, lambda n: (n, 5), 3.0),
    "columns-softmax": (_softmax_columns, lambda n: (n, 5), 0.0),
}
SIZES = (2, 15, 4095, 4097, (1 << 16) + 1, (1 << 22) + 1)
SLOW_SIZES = ((1 << 24) + 1, (1 << 26) + 1)
#: the dtypes each program runs in (float16 and bfloat16 where the kind of pass differs)
DTYPES = {"whole": (torch.float32, torch.float16, torch.bfloat16), "rows": (torch.float32, torch.float16),
          "columns": (torch.float32, torch.bfloat16)}


def _dynamic_cases():
    for name in DYNAMIC:
        for dtype in DTYPES.get(name, (torch.float32,)):
            yield pytest.param(name, dtype, id=f"{name}-{str(dtype).split('.')[1]}")
    for dtype in (torch.float16, torch.bfloat16):
        yield pytest.param("whole-up", dtype, id=f"whole-up-{str(dtype).split('.')[1]}")


DYNAMIC["whole-up"] = (_whole_up, lambda n: (n,), 0.0)


def _run(name: str, dtype: torch.dtype, sizes) -> None:
    fn, shape, offset = DYNAMIC[name]
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=True)
    for n in sizes:
        check(fn, compiled, _make(shape(n), dtype, offset), f"{name} {dtype} at {shape(n)}")
    _kernels_only(compiler)


@pytest.mark.parametrize(("name", "dtype"), list(_dynamic_cases()))
def test_reductions_as_exact_as_eager_at_every_size(name: str, dtype: torch.dtype) -> None:
    torch._dynamo.reset()
    _run(name, dtype, SIZES)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "dtype"), list(_dynamic_cases()))
def test_reductions_as_exact_as_eager_past_2_to_the_24(name: str, dtype: torch.dtype) -> None:
    torch._dynamo.reset()
    _run(name, dtype, SLOW_SIZES)


#: fixed sizes: (program, shape, dtype, offset): a row of a known length at, below and above
#: ROW_CHUNK (one loop; chunked), a whole tensor of 2^22 + 1, columns past COLUMN_CHUNK
FIXED = {
    "whole-var-f16": (_whole, ((1 << 22) + 1,), torch.float16, 3.0),
    "whole-sum-f32": (_whole, ((1 << 22) + 1,), torch.float32, 0.0),
    "rows-4096": (_rows, (4, 4096), torch.float32, 3.0),
    "rows-4097": (_rows, (4, 4097), torch.float32, 3.0),
    "softmax-vocab": (_log_softmax, (2, 50257), torch.float32, 0.0),
    "layer-norm-8192": (_layer_norm_in_float, (2, 8192), torch.float16, 3.0),
    "columns-2^20": (_columns, ((1 << 20) + 1, 3), torch.float32, 3.0),
    "columns-257": (_columns, (257, 64), torch.float16, 3.0),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_sizes_as_exact_as_eager(name: str) -> None:
    fn, shape, dtype, offset = FIXED[name]
    torch._dynamo.reset()
    compiler = FusegCompiler()
    compiled = torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=False)
    for seed in (0, 1):  # two inputs: the second call takes the same kernel
        x = _make(shape, dtype, offset + seed)
        check(fn, compiled, x, f"{name} (input {seed})")
    assert len(compiler.compiled) == 1
    _kernels_only(compiler)


def test_a_sum_that_overflows_stays_inf() -> None:
    """The compensation of an inf is NaN (inf - inf): the total keeps the sum's inf (as eager)."""
    fn = _whole_up
    big = torch.full(((1 << 14) + 3,), 60000.0, dtype=torch.float16)
    big[5] = float("inf")
    torch._dynamo.reset()
    compiler = FusegCompiler()
    compiled = torch.compile(lambda x: x.float().sum(), backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    assert compiled(big).item() == float("inf") == fn(big)[0].item()
    big[7] = float("-inf")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.float().sum(), backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    assert compiled(big).isnan().item()
    _kernels_only(compiler)


def _row_kernel(fn, x):
    import runtime
    from alias import apply_aliases
    from segmenter import capture, segment

    prog = runtime.compile(apply_aliases(segment(capture(fn, [x])), "post"), backend="cpp")
    (k,) = [k for k in prog.kernels.values() if k.kind == "row"]
    return prog, k


@pytest.mark.parametrize("n", [4096, 8192, 50257])
def test_rows_past_the_chunk_are_chunked_on_both_targets(n: int) -> None:
    """A row of a known length up to ROW_CHUNK keeps its one loop; a longer one is chunked, on the
    CPU and, where the row is long enough for the generic loop, on CUDA too; the CUDA source
    compiles (nvcc, no GPU needed) either way, and the CPU kernel matches eager."""
    import shutil

    from runtime.codegen.build import ptx_of
    from runtime.codegen.lowering import cascade

    x = _make((2, n), torch.float32)
    prog, k = _row_kernel(_log_softmax, x)
    body = k.body
    assert ("fuseg_sum_into" in body) == (n > cascade.ROW_CHUNK)
    (got,) = _outputs(prog(x))
    torch.testing.assert_close(got, _log_softmax(x))
    if shutil.which("nvcc") is not None:
        assert ".entry" in ptx_of(k.source("cuda"))


def _layer_norm_of_half_in_float(x):
    return F.layer_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],))  # (the float64 reference stays)


def test_a_float_layer_norm_of_a_long_row_is_as_exact_as_eager() -> None:
    """(Note [fp16 on the CPU]) A float layer norm of fp16 rows: with F16C's one-value conversions
    the kernel's loops were scalar and the variance pass added 4096 squares into one accumulator,
    its output 12x eager's error (1.1e-6 against 9.5e-8); vectorized, its lanes keep it at eager's."""
    torch._dynamo.reset()
    compiler = FusegCompiler()
    compiled = torch.compile(_layer_norm_of_half_in_float, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex),
                             dynamic=False)
    x = _make((2, 4096), torch.float16, 3.0)  # rows of mean 3.5, std 0.29, in float16's steps
    check(_layer_norm_of_half_in_float, compiled, x, "a float layer norm of 4096")
    _kernels_only(compiler)
