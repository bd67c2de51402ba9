"""fp16/bf16 ops whose core-ATen decomposition rounds between steps that eager computes in fp32
(segmenter/capturing/from_torch.py Note [ops kept whole in low precision]): against eager within OpInfo's
tolerances, on both backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from segmenter import capture, segment
from segmenter.partition.segments import SegmentKind

from .util import assert_matches_eager

TOL = {torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (1e-3, 1e-5)}  # assert_close's, as OpInfo uses


def _r(*shape, dtype):
    return torch.randn(*shape, dtype=dtype)


TABLE = [
    ("logit", lambda x: torch.logit(x, 1e-3), lambda d: [torch.rand(64, dtype=d)]),
    ("addr", lambda a, x, y: torch.addr(a, x, y, beta=0.5, alpha=2.0),
     lambda d: [_r(8, 9, dtype=d), _r(8, dtype=d), _r(9, dtype=d)]),
    ("cross", lambda x, y: torch.linalg.cross(x, y), lambda d: [_r(5, 3, dtype=d), _r(5, 3, dtype=d)]),
    ("interpolate-linear", lambda x: F.interpolate(x, scale_factor=1.7, mode="linear"), lambda d: [_r(1, 2, 5, dtype=d)]),
    ("interpolate-bicubic", lambda x: F.interpolate(x, scale_factor=1.7, mode="bicubic"),
     lambda d: [_r(1, 2, 5, 6, dtype=d)]),
    ("interpolate-trilinear", lambda x: F.interpolate(x, scale_factor=1.7, mode="trilinear"),
     lambda d: [_r(1, 2, 3, 4, 5, dtype=d)]),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,fn,make_inputs", TABLE, ids=[t[0] for t in TABLE])
def test_low_precision_ops_match_eager(name, fn, make_inputs, dtype) -> None:
    torch.manual_seed(0)
    inputs = make_inputs(dtype)
    graph = capture(fn, inputs)
    plan = apply_aliases(segment(graph), "post")
    rtol, atol = TOL[dtype]
    for backend in ("torch", "cpp"):
        assert_matches_eager(fn, inputs, graph, program=runtime.compile(plan, backend=backend), atol=atol, rtol=rtol)


def test_float32_still_decomposes_and_fuses() -> None:
    graph = capture(lambda x: torch.logit(x, 1e-3), [torch.rand(64)])
    assert "aten.logit.default" not in {n.op for n in graph.nodes}


def test_half_exact_recognizes_whole_conversions_only() -> None:
    from runtime.codegen.kernel import half_exact

    assert half_exact("fuseg_bf2f(in0[i * 2 + (j)])") == torch.bfloat16
    assert half_exact("fuseg_h2f(fuseg_f2h((t1 * t2)))") == torch.float16
    assert half_exact("fuseg_h_round((t1 * t2))") == torch.float16
    assert half_exact("fuseg_bf2f(a) + fuseg_bf2f(b)") is None  # a sum of two halves is not one
    assert half_exact("fuseg_bf2f(a) * (float)2") is None
    assert half_exact("(fuseg_bf2f(a))") is None
    assert half_exact("t3") is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 6, 40), (1, 5, 24)])
def test_rope_rounds_only_what_eager_rounds(dtype, shape) -> None:
    """See Note [values already rounded]: a RoPE block's slices, cat and copies of half values make
    no conversion round trip of a value that is already a half (a load, or a view of one), and
    the kernel still matches eager, bit for bit, at two shapes."""
    import re

    from perf import zoo

    B, T, C = shape
    head = C // 4  # 2 heads, 1 group: q, k, v of one head each
    fn, args = zoo._rope(B, T, 2, 1, head, head, dtype)()
    prog = runtime.compile(apply_aliases(segment(capture(fn, args)), "post"), backend="auto")
    conv = "fuseg_bf_round(" if dtype == torch.bfloat16 else "fuseg_h_round("
    loads = {m.group(1) for m in re.finditer(r"const float (t\d+) = fuseg_(?:bf2f|h2f)\(in\d+\[", "".join(
        k.body for k in prog.kernels.values()))}
    assert prog.kernels and loads
    body = "".join(k.body for k in prog.kernels.values())
    for t in loads:
        assert f"{conv}{t}))" not in body, t
    got, want = prog(*args), fn(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def _probe_values(dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Floats at every value of the half ``dtype``, halfway between neighbours (ties both ways),
    one ulp either side of those halfway points, subnormals, the largest floats (some round to
    inf), NaNs, and every float exponent with mantissas at and around the half's rounding bits
    (both signs): the rounding of Note [fp16 rounding in float] picks its step by the exponent."""
    halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).float()
    finite = halves[halves.isfinite()].double().unique()
    mids = ((finite[1:] + finite[:-1]) / 2).float()
    up, down = torch.nextafter(mids, torch.tensor(float("inf"))), torch.nextafter(mids, torch.tensor(-float("inf")))
    special = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1.17e-38, 3.3895e38, 3.3961e38, 3.4028e38, -3.4028e38,
                            65504.0, 65519.99, 65520.0, -65520.0, 2.9802322e-08, 2.98023259e-08, -5.96e-08,
                            float("inf"), -float("inf"), float("nan"), -float("nan")])
    exponents = torch.arange(256, dtype=torch.int64) << 23
    mantissas = torch.tensor([0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0xffff, 0x10000,
                              0x17fff, 0x18000, 0x7fffff], dtype=torch.int64)
    bits = (exponents[:, None] | mantissas[None, :]).flatten()
    sweep = torch.cat([bits, bits | (1 << 31)]).to(torch.int64)
    sweep = torch.where(sweep >= 1 << 31, sweep - (1 << 32), sweep).to(torch.int32).view(torch.float32)
    return torch.cat([halves, mids, up, down, special, sweep, torch.randn(10000) * 1e4, torch.randn(10000) * 1e-5])


@pytest.mark.parametrize(("dtype", "rounds", "narrows"), [(torch.bfloat16, "fuseg_bf_round(", "fuseg_f2bf("),
                                                     (torch.float16, "fuseg_h_round(", "fuseg_f2h(")])
def test_round_in_float_is_bit_exact(dtype, rounds, narrows) -> None:
    """See Note [bf16 rounding in float] and Note [fp16 rounding in float]: a float rounded to bf16
    or fp16 inside a kernel (``fuseg_bf_round``, ``fuseg_h_round``: no narrowing) has eager's bits
    for every probe value: ties, subnormals, overflow to inf, NaNs (a NaN stays a NaN)."""
    from tests.util import compiled_post

    xs = _probe_values(dtype)
    fn = lambda x: x.to(dtype).to(torch.float32) * 1.0  # noqa: E731
    prog = compiled_post(fn, [xs], backend="cpp")
    body = "".join(k.body for k in prog.kernels.values())
    assert rounds in body and narrows not in body, body
    got, want = prog(xs)[0], fn(xs)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.parametrize("shape", [(4, 300), (3, 77)])
def test_bf16_results_stored_as_their_bits_match_eager(shape) -> None:
    """A bf16 kernel stores a value it already rounded as its top 16 bits (``fuseg_bf_bits``, no
    second rounding), with eager's bits, at two shapes; inputs hold infs, NaNs and subnormals."""
    from tests.util import compiled_post

    torch.manual_seed(0)
    a = torch.randn(*shape).to(torch.bfloat16)
    b = torch.randn(*shape).to(torch.bfloat16)
    a.view(-1)[:6] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e-39, -1e-39, 3e38])
    fn = lambda a, b: (a * b + a) * torch.rsqrt((a.float() * a.float()).mean(-1, keepdim=True) + 1e-6).to(a.dtype)  # noqa: E731
    prog = compiled_post(fn, [a, b], backend="cpp")
    body = "".join(k.body for k in prog.kernels.values())
    assert "fuseg_bf_bits(" in body and "fuseg_f2bf(" not in body, body
    got, want = prog(a, b)[0], fn(a, b)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="no nvcc")
def test_bf16_helpers_compile_for_cuda_once_per_unit() -> None:
    """The helpers of Note [bf16 rounding in float] are defined with each kernel that calls them,
    guarded: two such kernels in one translation unit compile with nvcc (and each alone does)."""
    from runtime.codegen.build import nvcc_check_many
    from tests.util import compiled_post

    for dtype, guard in ((torch.bfloat16, "FUSEG_BF_HELPERS"), (torch.float16, "FUSEG_H_HELPERS")):
        x = torch.randn(8, 256, dtype=dtype)
        one = compiled_post(lambda a, b: (a * b + a).sum(-1), [x, x], backend="cpp")
        two = compiled_post(lambda a, b: (a - b) * 2, [x, x], backend="cpp")
        kernels = [*one.kernels.values(), *two.kernels.values()]
        assert len(kernels) == 2 and all(guard in k.source("cuda") for k in kernels)
        assert nvcc_check_many(kernels) == []


# --- eager's bits in half precision ------------------------------------------------------------

def _same_bits(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many values differ from eager's, NaN matching NaN."""
    same = (got == want) | (got.isnan() & want.isnan())
    return int((~same).sum())


POW_EXPONENTS = (2, 3, -2, -1, 0.5, -0.5, 1.5, 4, -3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(1 << 16,), (37, 129)], ids=["65536", "37x129"])
def test_pow_by_a_scalar_gives_eagers_bits(dtype, shape) -> None:
    """Note [pow as eager rounds it] (runtime/codegen/lowering/pointwise.py): ATen's bf16 ``x ** 3``
    and ``x ** -2`` round between their multiplies; a kernel that rounds once differed from eager
    at about a fifth of the values."""
    from .util import compiled_post

    torch.manual_seed(0)
    x = (torch.randn(*shape) * 3).to(dtype)
    for e in POW_EXPONENTS:
        def fn(t: torch.Tensor, e: float = e) -> torch.Tensor:
            return torch.pow(t, e) * 1.5  # (with a multiply: a kernel, not a lone op)
        prog = compiled_post(fn, [x], backend="cpp")
        assert set(prog.backend_of.values()) == {"cpp"}, (e, prog.backend_of)
        (got,) = prog(x)
        want = fn(x)
        if e == -0.5 and dtype == torch.bfloat16:
            # ATen's scalar loop, which takes the last (n mod 64) values of a contiguous run
            # after its vector loop, rounds sqrt's result before the division there: eager's
            # own bits depend on the position. The vector loop's values must be eager's.
            n = x.numel()
            diff = ~((got == want) | (got.isnan() & want.isnan()))
            assert all(i >= n - n % 64 for i in diff.flatten().nonzero().flatten().tolist()), e
        else:
            assert _same_bits(got, want) == 0, e


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(256, 768), (3, 50, 512)], ids=["256x768", "3x50x512"])
def test_a_half_precision_layer_norm_gives_eagers_bits(dtype, shape) -> None:
    """Note [layer norm in low precision runs ATen's] (segmenter/partition/rules.py): the norm is
    ATen's own op, its neighbours still our kernels. Fused, it summed the row in another order than
    ATen's and differed from eager by one bf16 rounding at places (6 values of 256x768 here)."""
    from .util import compiled_post

    def fn(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return h, F.layer_norm(h, (shape[-1],), w, b, 1e-5) * 2

    torch.manual_seed(0)
    n = shape[-1]
    inputs = [(torch.randn(*shape) * 4).to(dtype), torch.randn(*shape).to(dtype),
              (torch.randn(n) * 0.2 + 1).to(dtype), (torch.randn(n) * 0.1).to(dtype)]
    prog = compiled_post(fn, inputs, backend="cpp")
    kinds = [(s.kind, [n.op for n in s.nodes]) for s in prog.plan.segments]
    assert kinds == [(SegmentKind.POINTWISE, ["aten.add.Tensor"]), (SegmentKind.OPAQUE, ["aten.native_layer_norm.default"]),
                     (SegmentKind.POINTWISE, ["aten.mul.Tensor"])], kinds
    assert prog.backend_of == {0: "cpp", 2: "cpp"}, prog.backend_of  # (an OPAQUE segment runs torch's op)
    got, want = prog(*inputs), fn(*inputs)
    for g, w in zip(got, want):
        assert _same_bits(g, w) == 0


def test_a_float32_layer_norm_is_still_our_kernel() -> None:
    from .util import compiled_post

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x * 2, (64,), w, b)

    prog = compiled_post(fn, [torch.randn(8, 64), torch.randn(64), torch.randn(64)], backend="cpp")
    assert [s.kind for s in prog.plan.segments] == [SegmentKind.NORMALIZATION] and prog.backend_of == {0: "cpp"}
