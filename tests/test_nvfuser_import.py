"""nvFuser Python-frontend fusions read as data (segmenter.from_nvfuser), against torch.

Each case is a frontend program written here from nvFuser's documented op semantics (its bindings
and ops sources: type promotion, broadcast_in_dim, pad order, slice normalization, var_mean's
correction, integer div) and a torch program written apart from it; both run on the same inputs and
everything observable is compared (tests/util.py: values, dtypes, strides, which outputs are views
of which inputs, the inputs afterwards), through the reference semantics and through the runtime.
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import runtime
from alias import apply_aliases
from segmenter import from_nvfuser, read_nvfuser, segment
from segmenter.formats.serialize import GraphFormatError

from .util import assert_matches_eager


def fusion(body: str, inputs: str | None = None) -> str:
    """A repro script: ``body`` as the fusion function, and an ``inputs = [...]`` line if given."""
    text = "from nvfuser import FusionDefinition, DataType\n\n\ndef f(fd: FusionDefinition) -> None:\n"
    text += textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    return text + (f"\n\ninputs = {inputs}\n" if inputs else "")


@dataclass(frozen=True)
class Case:
    name: str
    body: str
    inputs: Callable[[], list[torch.Tensor]]
    torch_fn: Callable[..., object]


def _r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def _i(*shape: int, lo: int = -9, hi: int = 10) -> torch.Tensor:
    return torch.randint(lo, hi, shape)


F32 = "dtype=DataType.Float"
CASES = [
    Case("unary_math", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.ops.sigmoid(fd.ops.exp(T0))
        T2 = fd.ops.rsqrt(fd.ops.abs(T0))
        T3 = fd.ops.neg(fd.ops.tanh(T0))
        fd.add_output(T1)
        fd.add_output(T2)
        fd.add_output(T3)
    """, lambda: [_r(3, 5)], lambda x: (x.exp().sigmoid(), x.abs().rsqrt(), -x.tanh())),
    Case("operators", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        T2 = (T0 + T1) * T0 - T1 / T0
        T3 = -T2
        fd.add_output(T3)
        fd.add_output(T0 < T1)
    """, lambda: [_r(6), _r(6)], lambda a, b: (-((a + b) * a - b / a), a < b)),
    Case("promotion_bf16_and_float", """
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(T0, T1))
        fd.add_output(fd.ops.mul(T0, T0))
    """, lambda: [_r(4, 4, dtype=torch.bfloat16), _r(4, 4)], lambda a, b: (a.float() + b, a * a)),
    # nvFuser reads a Double scalar with its own dtype: an int tensor times it is Double (torch: float32)
    Case("int_tensor_times_double_scalar", """
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        S1 = fd.define_scalar(2.5, dtype=DataType.Double)
        fd.add_output(fd.ops.mul(T0, S1))
        fd.add_output(fd.ops.mul(S1, T0))
        fd.add_output(fd.ops.add(T0, 3))
    """, lambda: [_i(7)], lambda x: (x.double() * 2.5, 2.5 * x.double(), x + 3)),
    Case("float_scalar_keeps_bf16", """
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.BFloat16)
        S1 = fd.define_scalar(0.5, dtype=DataType.Double)
        fd.add_output(fd.ops.sub(S1, T0))
    """, lambda: [_r(8, dtype=torch.bfloat16)], lambda x: (0.5 - x,)),
    # div truncates integers (C's /); truediv promotes them; mod is C's %, remainder Python's
    Case("integer_division", """
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        fd.add_output(fd.ops.div(T0, T1))
        fd.add_output(fd.ops.truediv(T0, T1))
        fd.add_output(fd.ops.mod(T0, T1))
        fd.add_output(fd.ops.remainder(T0, T1))
    """, lambda: [torch.tensor([7, -7, 9, -9, 0]), torch.tensor([2, 2, -4, -4, 3])],
        lambda a, b: (torch.div(a, b, rounding_mode="trunc"), a / b, torch.fmod(a, b), torch.remainder(a, b))),
    Case("float_div_is_true_division", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        fd.add_output(fd.ops.div(T0, 4))
        fd.add_output(fd.ops.pow(T0, 2.0))
        fd.add_output(fd.ops.maximum(T0, fd.ops.neg(T0)))
    """, lambda: [_r(5)], lambda x: (x / 4, x ** 2.0, torch.maximum(x, -x))),
    Case("where_and_comparisons", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        S1 = fd.define_scalar(0.0, dtype=DataType.Double)
        T2 = fd.ops.gt(T0, S1)
        fd.add_output(fd.ops.where(T2, T0, 0.5))
        fd.add_output(fd.ops.where(T2, 1.0, 2.0))
        fd.add_output(fd.ops.logical_not(T2))
    """, lambda: [_r(3, 4)], lambda x: (torch.where(x > 0, x, 0.5),
                                        torch.where(x > 0, torch.tensor(1.0, dtype=torch.float64),
                                                    torch.tensor(2.0, dtype=torch.float64)), ~(x > 0))),
    Case("casts", """
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
        T1 = fd.ops.cast(T0, dtype=DataType.Float)
        T2 = fd.ops.mul(T1, T1)
        T3 = fd.ops.cast(T2, dtype=DataType.BFloat16)
        T4 = fd.ops.cast(T0, DataType.Int32)
        fd.add_output(T3)
        fd.add_output(T4)
    """, lambda: [_r(4, 3, dtype=torch.bfloat16) * 4],
        lambda x: ((x.float() * x.float()).bfloat16(), x.to(torch.int32))),
    Case("broadcast_in_dim_and_expand", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        T1 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], {F32})
        T2 = fd.ops.broadcast_in_dim(T0, shape=[3, 4], broadcast_dims=[1])
        T3 = fd.ops.broadcast_in_dim(T1, shape=[2, 3, 5], broadcast_dims=[1, 2])
        T4 = fd.ops.expand(T1, shape=[-1, 6])
        T5 = fd.ops.broadcast(T0, is_broadcast_dim=[True, False, True])
        fd.add_output(T2)
        fd.add_output(T3)
        fd.add_output(T4)
        fd.add_output(T5)
    """, lambda: [_r(4), _r(3, 1)], lambda a, b: (a.unsqueeze(0).expand(3, 4), b.unsqueeze(0).expand(2, 3, 5),
                                                  b.expand(-1, 6), a[None, :, None])),
    Case("reshape_permute_squeeze", f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], {F32})
        T1 = fd.ops.reshape(T0, new_shape=[2, 12])
        T2 = fd.ops.permute(T0, dims=[2, 0, 1])
        T3 = fd.ops.reshape(T2, [-1, 6])
        T4 = fd.ops.reshape(T0, original_shape=[2, 3, 4], new_shape=[6, 1, 4])
        T5 = fd.ops.squeeze(T4, dims=[1])
        fd.add_output(T1)
        fd.add_output(T2)
        fd.add_output(T3)
        fd.add_output(T5)
    """, lambda: [_r(2, 3, 4)], lambda x: (x.reshape(2, 12), x.permute(2, 0, 1), x.permute(2, 0, 1).reshape(-1, 6),
                                           x.reshape(6, 1, 4).squeeze(1))),
    # slice normalizes like Python: negative from the end, clamped; steps read as torch's
    Case("slices", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.ops.slice(T0, start_indices=[1, -3], end_indices=[100, -1], strides=[1, 1])
        T2 = fd.ops.slice(T0, [0, 0], [5, 7], [2, 3])
        T3 = fd.ops.slice(T0, start_indices=[2, 5], end_indices=[2, 3])
        fd.add_output(T1)
        fd.add_output(T2)
        fd.add_output(T3)
    """, lambda: [_r(5, 7)], lambda x: (x[1:, -3:-1], x[0:5:2, 0:7:3], x[2:2, 5:5])),
    # pad widths run from the last dim outwards (F.pad's order); a negative width crops
    Case("pad", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        S1 = fd.define_scalar(float("-inf"), dtype=DataType.Double)
        fd.add_output(fd.ops.pad(T0, [1, 2]))
        fd.add_output(fd.ops.pad(T0, [0, 0, 3, 1], S1))
        fd.add_output(fd.ops.pad(T0, [-1, 2, 1, -1], 7.0))
    """, lambda: [_r(3, 4)], lambda x: (torch.nn.functional.pad(x, (1, 2)),
                                        torch.nn.functional.pad(x, (0, 0, 3, 1), value=float("-inf")),
                                        torch.nn.functional.pad(x, (-1, 2, 1, -1), value=7.0))),
    Case("cat", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        fd.add_output(fd.ops.cat([T0, T1, T0], dim=-1))
        fd.add_output(fd.ops.cat([T1, T0], 0, manual_padding=0))
    """, lambda: [_r(3, 2), _r(3, 2)], lambda a, b: (torch.cat((a, b, a), -1), torch.cat((b, a), 0))),
    Case("gathers", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        T2 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
        fd.add_output(fd.ops.index_select(T0, T1, dim=0))
        fd.add_output(fd.ops.gather(T0, T2, 1))
        fd.add_output(fd.ops.take_along_axis(T0, T2, dim=1))
    """, lambda: [_r(4, 3), torch.tensor([3, 0, 0, 2]), torch.randint(0, 3, (4, 3))],
        lambda x, i, j: (x.index_select(0, i), torch.gather(x, 1, j), torch.take_along_dim(x, j, 1))),
    Case("reductions", f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int32)
        fd.add_output(fd.ops.sum(T0, dims=[0, 2], keepdim=False, dtype=DataType.Null))
        fd.add_output(fd.ops.sum(T0, [1], True))
        fd.add_output(fd.ops.sum(T0))
        fd.add_output(fd.ops.max(T0, dims=[2]))
        fd.add_output(fd.ops.min(T0, dim=1, keepdim=True))
        fd.add_output(fd.ops.sum(T1, dims=[1]))
        fd.add_output(fd.ops.sum(T1, dims=[0], dtype=DataType.Float))
    """, lambda: [_r(2, 3, 4), _i(3, 5).int()], lambda x, n: (x.sum((0, 2)), x.sum(1, keepdim=True), x.sum(), x.amax(2),
                                                       x.amin(1, keepdim=True), n.sum(1), n.float().sum(0))),
    Case("var_mean_correction", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1, T2 = fd.ops.var_mean(T0, dims=[1], correction=0, keepdim=True)
        T3, T4 = fd.ops.var_mean(T0, [0])
        T5 = fd.ops.var(T0, dims=[1], correction=2)
        fd.add_output(T1)
        fd.add_output(T2)
        fd.add_output(T3)
        fd.add_output(T4)
        fd.add_output(T5)
    """, lambda: [_r(6, 5)], lambda x: (*torch.var_mean(x, 1, correction=0, keepdim=True),
                                        *torch.var_mean(x, 0, correction=1), torch.var(x, 1, correction=2))),
    Case("factories", """
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        S1 = fd.define_scalar(3, dtype=DataType.Int)
        S2 = fd.define_scalar(2, dtype=DataType.Int)
        T3 = fd.ops.iota(5, S1, S2, dtype=DataType.Int)
        T4 = fd.ops.iota(4, 0.5, 0.25, DataType.Float)
        T5 = fd.ops.full(shape=[2, 3], fill_value=1.5, dtype=DataType.BFloat16)
        T6 = fd.ops.full([3], True, DataType.Bool)
        fd.add_output(T3)
        fd.add_output(fd.ops.add(T0, T4))
        fd.add_output(T5)
        fd.add_output(T6)
    """, lambda: [_r(4)], lambda x: (torch.arange(3, 13, 2), x + torch.arange(4) * 0.25 + 0.5,
                                     torch.full((2, 3), 1.5, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bool))),
    Case("linear_and_matmul", f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T2 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        fd.add_output(fd.ops.linear(T0, T1, T2))
        fd.add_output(fd.ops.linear(T0, T1))
        fd.add_output(fd.ops.matmul(T0, fd.ops.permute(T1, dims=[1, 0])))
    """, lambda: [_r(2, 3, 4), _r(5, 4), _r(5)], lambda x, w, b: (torch.nn.functional.linear(x, w, b),
                                                                 torch.nn.functional.linear(x, w), x @ w.t())),
    Case("shape_and_size_read_back", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        V1 = T0.shape()
        S2 = fd.ops.size(T0, 1)
        S3 = fd.ops.mul(S2, 2)
        V4 = fd.define_vector([V1[0], S2], dtype=DataType.Int)
        T5 = fd.ops.reshape(T0, new_shape=[S3, fd.ops.div(fd.ops.size(T0, 0), 2)])
        fd.add_output(fd.ops.full(shape=V4, fill_value=S3, dtype=DataType.Float))
        fd.add_output(T5)
        fd.add_output(fd.ops.broadcast_in_dim(T0, shape=[2, V1[0], T0.size(1)], broadcast_dims=[1, 2]))
    """, lambda: [_r(4, 3)], lambda x: (torch.full((4, 3), 6.0), x.reshape(6, 2), x.expand(2, 4, 3))),
    Case("stride_order", f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], {F32})
        T1 = fd.ops.stride_order(fd.ops.exp(T0), stride_order=[0, 2, 1])
        fd.add_output(T1)
        fd.add_output(fd.ops.neg(T0), stride_order=[1, 0, 2])
    """, lambda: [_r(2, 3, 4)], lambda x: (x.exp().permute(1, 2, 0).contiguous().permute(2, 0, 1),
                                           (-x).permute(2, 0, 1).contiguous().permute(1, 2, 0))),
    # a scalar input is a graph input (a 0-dim tensor); it promotes as a scalar
    Case("scalar_inputs", """
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        S1 = fd.define_scalar(dtype=DataType.Double)
        S2 = fd.define_scalar(None, dtype=DataType.Int)
        S3 = fd.ops.mul(S2, 3)
        T4 = fd.ops.mul(T0, S1)
        fd.add_output(fd.ops.add(T4, S3))
        fd.add_output(fd.ops.where(fd.ops.lt(T0, S1), T0, S1))
    """, lambda: [_r(3, 4), torch.tensor(0.25, dtype=torch.float64), torch.tensor(4)],
        lambda x, s, n: (x * s.float() + (n * 3).float(), torch.where(x < s.float(), x, s.float()))),
    Case("lerp_clamp_and_alpha", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        fd.add_output(fd.ops.lerp(T0, T1, 0.25))
        fd.add_output(fd.ops.clamp(T0, -0.5, 0.5))
        fd.add_output(fd.ops.add_alpha(T0, T1, 2.0))
    """, lambda: [_r(6), _r(6)], lambda a, b: (torch.lerp(a, b, 0.25), a.clamp(-0.5, 0.5), a + 2.0 * b)),
    # set / segment_set are copies: an output made through one is never a view of the input
    Case("copies_are_not_views", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        fd.add_output(fd.ops.set(T0))
        fd.add_output(fd.ops.permute(fd.ops.segment_set(T0), dims=[1, 0]))
        fd.add_output(fd.ops.cast(T0, dtype=DataType.Float))
        fd.add_output(fd.ops.slice(T0, [0, 1], [2, 3]))
    """, lambda: [_r(2, 3)], lambda x: (x.clone(), x.clone().t(), x.clone(), x[0:2, 1:3])),
    # fd.add_output(value, T) with an input T: written into T, not returned (nvFuser's in-place update)
    Case("in_place_update", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T2 = fd.ops.add(T0, T1)
        fd.add_output(fd.ops.mul(T2, 0.5), T0)
        fd.add_output(fd.ops.permute(T0, dims=[1, 0]))
        fd.add_output(T2, alias_input=T1)
    """, lambda: [_r(2, 3), _r(2, 3)], lambda a, b: _in_place(a, b)),
]


def _in_place(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
    t = a.t().clone()  # read before the writes: the fusion's values are functional
    s = a + b
    a.copy_(s * 0.5)
    b.copy_(s)
    return (t,)


def _program(graph, backend: str = "torch"):
    return runtime.compile(apply_aliases(segment(graph), "post"), backend=backend)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_frontend_program_matches_torch(case: Case) -> None:
    torch.manual_seed(0)
    inputs = case.inputs()
    graph = from_nvfuser(fusion(case.body), inputs)
    assert_matches_eager(case.torch_fn, inputs, graph)  # the graph's own semantics
    assert_matches_eager(case.torch_fn, inputs, graph, program=_program(graph))  # through the runtime


def test_in_place_update_is_a_write_back_not_an_output() -> None:
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    graph = from_nvfuser(fusion(next(c for c in CASES if c.name == "in_place_update").body), [a, b])
    assert [m.input for m in graph.mutations] == [0, 1] and len(graph.outputs) == 1
    # the permute of the written input is a copy of its old value, not a view seeing the write
    assert graph.output_aliases == (None,)
    want = a + b
    (out,) = _program(graph, "auto")(a0 := a.clone(), b0 := b.clone())
    torch.testing.assert_close(a0, want * 0.5)  # the caller's tensors hold the values after
    torch.testing.assert_close(b0, want)
    torch.testing.assert_close(out, a.t())


def test_outputs_made_by_views_of_inputs_are_views() -> None:
    graph = from_nvfuser(fusion(next(c for c in CASES if c.name == "copies_are_not_views").body), [torch.randn(2, 3)])
    assert [a is not None for a in graph.output_aliases] == [False, False, False, True]


# -- the two issue fusions, kept as data files ----------------------------------------------------

def _rope_2577_torch(cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """#2577's fusion in torch, from the issue's IR: bf16 storage, the rotation in float."""
    qkv = x.view(2, 1024, 4, 6, 32).permute(0, 2, 3, 1, 4)

    def rope(t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(2, 16, 1024, 32)
        r = t[..., :8]
        rotated = torch.cat(((-r[..., 4:].float()).bfloat16(), r[..., :4]), -1)
        roped = r.float() * cos.float() + rotated.float() * sin.float()
        return torch.cat((roped.bfloat16(), t[..., 8:]), -1)

    v = qkv[:, :, 5:6].expand(2, 4, 4, 1024, 32).reshape(2, 16, 1024, 32)
    return v, rope(qkv[:, :, :4]), rope(qkv[:, :, 4:5].expand(2, 4, 4, 1024, 32))


def _qkv_rope_1597_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """#1597's fusion in torch: LitGPT's split_qkv and full-rotary RoPE at Mistral-7B's heads."""
    B, T, _ = x.shape
    q, k, v = x.view(B, T, 8, 6, 128).permute(0, 2, 3, 1, 4).split((4, 1, 1), dim=2)
    q = q.reshape(B, 32, T, 128)
    k, v = (t.expand(B, 8, 4, T, 128).reshape(B, 32, T, 128) for t in (k, v))

    def rope(t: torch.Tensor) -> torch.Tensor:
        rotated = torch.cat(((-t[..., 64:].float()).bfloat16(), t[..., :64]), -1)
        return (t.float() * cos.float() + rotated.float() * sin.float()).bfloat16()

    return rope(q), rope(k), v


def _data(name: str) -> str:
    from perf.fusions import path_of

    with open(path_of(name), encoding="utf-8") as f:
        return f.read()


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).bfloat16()


def test_2577_fusion_matches_torch_through_the_cpu_kernels() -> None:
    torch.manual_seed(0)
    inputs = [_bf16(1024, 8), _bf16(1024, 8), _bf16(2, 1024, 768)]
    graph = from_nvfuser(_data("nvfuser-2577"), inputs)
    assert_matches_eager(_rope_2577_torch, inputs, graph, program=_program(graph, "auto"))
    # against the zoo's LitGPT RoPE (bf16 arithmetic there, float here): within bf16's rounding
    from perf.zoo import rope_it_all

    v, q, k = _program(graph, "auto")(*inputs)
    rq, rk, rv = rope_it_all(inputs[2], inputs[0], inputs[1], 16, 4, 32, 8)
    for got, want in ((q, rq), (k, rk), (v, rv)):
        torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)


def test_1597_fusion_binds_to_any_batch_and_sequence() -> None:
    torch.manual_seed(0)
    for B, T in ((1, 8), (2, 3)):
        inputs = [_bf16(B, T, 6144), _bf16(T, 128), _bf16(T, 128)]
        graph = from_nvfuser(_data("nvfuser-1597"), inputs)
        assert_matches_eager(_qkv_rope_1597_torch, inputs, graph, program=_program(graph, "auto"))


@pytest.mark.parametrize("name,kernels,nvfuser_kernels", [("nvfuser-2577", 3, None), ("nvfuser-1597", 1, 5)])
def test_issue_fusions_take_fewer_kernels_than_nvfuser_made(name: str, kernels: int, nvfuser_kernels) -> None:
    from perf.fusions import FUSIONS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # built on the CPU here
        fusion_ = read_nvfuser(_data(name))  # bound by the script's own inputs list, at the issue's sizes
    stats = apply_aliases(segment(fusion_.graph), "post").stats()
    assert stats["kernels"] == kernels and stats["opaque"] == 0
    assert FUSIONS[name].nvfuser_kernels == nvfuser_kernels
    assert nvfuser_kernels is None or stats["kernels"] < nvfuser_kernels
    assert fusion_.bound_from == "the script's inputs" and fusion_.symbolic


# -- binding the sizes (Note [symbolic or bound sizes]; symbolic ones: tests/test_nvfuser_symbolic.py) --

SYMBOLIC = """
    T0 = fd.define_tensor(shape=[-1, 8], contiguity=[True, True], dtype=DataType.Float, stride_order=[1, 0])
    fd.add_output(fd.ops.exp(T0))
"""


def test_symbolic_dims_bind_to_the_inputs_argument_first() -> None:
    script = fusion(SYMBOLIC, inputs="[torch.randn(3, 8, device='cuda:0')]")
    f = read_nvfuser(script, [torch.randn(5, 8)])
    assert f.graph.inputs[0].meta.shape == (5, 8) and f.bound_from == "inputs argument" and not f.notes
    assert [(s.input, s.line, s.dims, s.sizes) for s in f.symbolic] == [("T0", 5, (0,), (5,))]


def test_symbolic_dims_bind_to_the_scripts_inputs_list_next() -> None:
    script = fusion(SYMBOLIC, inputs="[torch.randn(3, 8, dtype=torch.float32, device='cuda:0').as_strided((3, 8), (8, 1))]")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = read_nvfuser(script, symbolic=False)
    assert f.graph.inputs[0].meta.shape == (3, 8) and f.bound_from == "the script's inputs" and f.bound
    kept = read_nvfuser(script, warn=False)  # by default the list only hints the symbols
    assert not kept.bound and kept.sizes is not None and list(kept.sizes.hints.values()) == [3]
    if not torch.cuda.is_available():  # built on the CPU, and said so
        assert f.graph.inputs[0].meta.device == "cpu" and "CPU" in f.notes[0]
        assert any("built on the CPU" in str(w.message) for w in caught)


def test_unbound_symbolic_dims_are_refused_naming_the_line() -> None:
    with pytest.raises(GraphFormatError, match=r"line 5: fd.define_tensor: shape=\[-1, 8\]: give inputs"):
        from_nvfuser(fusion(SYMBOLIC), symbolic=False)
    x = torch.randn(5, 8)  # symbolic (the default), it reads
    graph = read_nvfuser(fusion(SYMBOLIC), warn=False).graph
    assert_matches_eager(lambda t: (t.exp(),), [x], graph, program=_program(graph, "auto"))


@pytest.mark.parametrize("inputs,message", [
    ([torch.randn(5, 9)], "fixes"),
    ([torch.randn(5, 8, dtype=torch.float64)], "float64"),
    ([torch.randn(8, 5).t()], "strides"),
    ([torch.randn(5, 8), torch.randn(2)], "2 inputs given for the 1"),
    ([2.0], "is a number"),
])
def test_inputs_that_contradict_the_definition_are_refused(inputs, message: str) -> None:
    with pytest.raises(GraphFormatError, match=message):
        from_nvfuser(fusion(SYMBOLIC), inputs)


# -- the other spellings of a fusion --------------------------------------------------------------

OLD_STYLE = """
import torch
from nvfuser import FusionDefinition, DataType

inputs = [torch.randn(4, 6, device='cuda'), torch.randn(6, dtype=torch.float32, device='cuda')]

def nvfuser_fusion(fd: FusionDefinition) -> None:
    T0 = fd.from_pytorch(inputs[0])
    T1 = fd.from_pytorch(inputs[1])
    T2 = fd.ops.broadcast_in_dim(T1, [4, 6], [1])
    fd.add_output(fd.ops.add(T0, T2))

with FusionDefinition() as fd:
    nvfuser_fusion(fd)
out = fd.execute(inputs)
"""

WITH_BLOCK = """
import nvfuser
with nvfuser.FusionDefinition() as fd:
    t0 = fd.define_tensor(sizes=[4, 6], strides=[6, 1], dtype=nvfuser.DataType.Float, static_sizes=True)
    t1 = fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=nvfuser.DataType.Float)
    fd.add_output(fd.ops.add(t0, fd.ops.broadcast_in_dim(t1, shape=[4, 6], broadcast_dims=[1])))
"""

SUBCLASS = """
from nvfuser_direct import FusionDefinition, DataType

class Model(FusionDefinition):
    def definition(self) -> None:
        a = self.define_tensor(shape=[4, 6], contiguity=True, dtype=DataType.Float)
        b = self.define_tensor([6], [True], DataType.Float)
        self.add_output(self.ops.add(a, self.ops.broadcast_in_dim(b, [4, 6], [1])))
"""


@pytest.mark.parametrize("source", [OLD_STYLE, WITH_BLOCK, SUBCLASS], ids=["from_pytorch", "with_block", "subclass"])
def test_every_spelling_of_a_fusion_reads_the_same(source: str) -> None:
    x, y = torch.randn(4, 6), torch.randn(6)
    graph = from_nvfuser(source, [x, y])
    assert_matches_eager(lambda a, b: (a + b,), [x, y], graph, program=_program(graph))


def test_a_file_with_several_fusions_names_one() -> None:
    two = fusion(SYMBOLIC) + "\n\ndef g(fd):\n" + textwrap.indent(textwrap.dedent(SYMBOLIC).strip(), "    ") + "\n"
    with pytest.raises(GraphFormatError, match="2 fusions in the script .f, g.: name one"):
        from_nvfuser(two, [torch.randn(2, 8)])
    assert from_nvfuser(two, [torch.randn(2, 8)], name="g").name == "g"


# -- the command line -----------------------------------------------------------------------------

def test_cli_segments_a_script_and_says_what_its_dims_became(capsys, tmp_path) -> None:
    import json

    from perf.tools.cli import main

    path = tmp_path / "repro.py"
    path.write_text(fusion(SYMBOLIC, inputs="[torch.randn(3, 8, device='cuda:0')]"))
    assert main(["segment", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 segments" in out and "-1 dims are symbols, hinted by the script's inputs" in out
    assert "%T0 (line 5): dims [0] are [T0_0]" in out and "T0_0 in [2, 2147483648] (hint 3)" in out
    assert main(["segment", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["nvfuser"]["symbolic"] == [{"input": "T0", "line": 5, "dims": [0], "sizes": ["T0_0"]}]
    assert not record["nvfuser"]["bound"] and record["graph"]["symbols"] == {"T0_0": {"hint": 3, "min": 2, "max": 2**31}}
    graph = read_nvfuser(path.read_text(), warn=False).graph  # what it showed runs at other sizes
    for n in (2, 7):
        x = torch.randn(n, 8)
        assert_matches_eager(lambda t: (t.exp(),), [x], graph, program=_program(graph, "auto"))


def test_cli_profile_puts_nvfusers_quoted_counts_beside_ours(capsys) -> None:
    from perf.tools.cli import main

    assert main(["profile", "nvfuser-2577", "nvfuser-1597"]) == 0
    out = capsys.readouterr().out
    assert "nvFuser (quoted from its issue, not measured) against ours" in out
    table = out.split("nvFuser (quoted from its issue, not measured) against ours")[1]
    row = next(line for line in table.splitlines() if line.startswith("nvfuser-1597"))
    assert row.split()[1:6] == ["8", "5", "2", "1", "1"]  # nvFuser 8 segments, 5 kernels; ours 2, 1 kernel, 1 view
    assert main(["examples"]) == 0 and "nvfuser-2577" in capsys.readouterr().out


def test_nested_calls_and_operators_are_read_once() -> None:
    from segmenter.formats.nvfuser.script import read_script

    body = f"""
        T0 = fd.define_tensor(shape=[4], contiguity=[True], {F32})
        T1 = fd.ops.add(fd.ops.exp(T0) + T0, -fd.ops.abs(T0))
        fd.add_output(T1 * (2 * 3))
    """
    calls = read_script(fusion(body)).calls
    assert [c.func for c in calls] == ["define_tensor", "ops.exp", "ops.add", "ops.abs", "ops.neg", "ops.add",
                                       "ops.mul", "add_output"]
    assert calls[6].args[1] == 6  # arithmetic on numbers, folded
    x = torch.randn(4)
    graph = from_nvfuser(fusion(body), [x])
    assert len(graph.nodes) == 6
    assert_matches_eager(lambda t: ((t.exp() + t + -t.abs()) * 6,), [x], graph)
