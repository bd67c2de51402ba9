"""nvFuser's inputs as nvFuser takes them (issue 63, goal 2), each fusion run through the import
and the runtime and checked against torch eager on the same inputs.

The table is written from nvFuser's documented frontend semantics (its ``define_tensor`` and
``getExpanded``, ``validateAllocationSizesAndStrides``, ``define_scalar``, the type promotion of
scalars), not from our code: ``contiguity`` is given in allocation order (``stride_order``), a
``None`` in it is a broadcast dim (size 1, or expanded: stride 0), a 0-dim tensor (on the device
or ``is_cpu``) and a scalar input (a Python number or a 0-dim tensor) promote as scalars do, and an
in-place output (``add_output(value, input)``) leaves every other output reading the input's value
from before the update. Every row runs at two sizes, bound to its inputs and as a symbolic plan
called with them (``fd.execute([t0, 2.5])``); values, dtypes, output strides and the inputs after
the call (in-place updates) are compared with eager's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import runtime
from alias import apply_aliases
from segmenter import from_nvfuser, segment
from segmenter.capturing.reference import clone_inputs, run_graph
from segmenter.formats.serialize import GraphFormatError
from segmenter.ir.graph import GraphError

from .test_nvfuser_import import fusion
from .util import layout

F32 = "dtype=DataType.Float"


@dataclass(frozen=True)
class Row:
    name: str
    body: str
    inputs: Callable[[int], list]  # the inputs at a size n
    torch_fn: Callable[..., tuple]  # eager on the same inputs: (outputs...), in-place updates done on the inputs
    #: also as a symbolic plan called with the inputs. Not where a size-1 dim has a stride other
    #: than the dense one: a symbolic plan's guard compares that stride too (a limit, not a wrong result)
    symbolic: bool = True


def _copies(values: list) -> list:
    """Copies of the tensors (same sizes, strides, storage sharing), numbers as they are."""
    tensors = clone_inputs([v for v in values if isinstance(v, torch.Tensor)])
    it = iter(tensors)
    return [next(it) if isinstance(v, torch.Tensor) else v for v in values]


def _expanded(n: int, m: int) -> torch.Tensor:
    return torch.randn(n, 1).expand(n, m)


def _sum_0d_update(t1: torch.Tensor, t2: torch.Tensor) -> tuple:
    old = t2.clone()  # the readers see T2's value from before the update
    t2.copy_(old.expand(t1.shape).sum())
    return t1 * old, t1 + old


def _crossed_updates(t1: torch.Tensor, t2: torch.Tensor, t3: torch.Tensor) -> tuple:
    new_t3, new_t2 = (t1 + t2).sum(), t3 + 1.0
    t3.copy_(new_t3)
    t2.copy_(new_t2)
    return ()


def _neg_update(t0: torch.Tensor, t1: torch.Tensor) -> tuple:
    out = t1 + t0
    t0.neg_()
    return (out,)


ROWS = [
    # contiguity None on a dim of size -1: an expanded broadcast dim (stride 0)
    Row("none_expanded", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, None], {F32}, is_cpu=False, stride_order=[1, 0])
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        fd.add_output(fd.ops.mul(T0, T1))
        fd.add_output(fd.ops.sum(T0, dims=[1], keepdim=False))
    """, lambda n: [_expanded(n, n + 3), torch.randn(n, n + 3)], lambda a, b: (a * b, a.sum(1))),
    # an expanded middle dim between two dense ones
    Row("none_expanded_middle", f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, None, True], {F32}, stride_order=[2, 1, 0])
        fd.add_output(fd.ops.exp(T0))
    """, lambda n: [torch.randn(n, 1, 3).expand(n, 5, 3)], lambda a: (a.exp(),)),
    # contiguity None on a dim the shape says is 1: its stride is free
    Row("none_size_one_any_stride", f"""
        T0 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        fd.add_output(fd.ops.add(T1, T0))
    """, lambda n: [torch.randn(n).as_strided((n, 1), (1, 7)), torch.randn(n, 4)], lambda a, b: (b + a,), False),
    # stride_order [0, 1]: a column-major input, contiguity in allocation order (outer dim first)
    Row("stride_order_transposed", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32}, stride_order=[0, 1])
        fd.add_output(fd.ops.add(T0, 1.0))
    """, lambda n: [torch.randn(n + 2, n).t()], lambda a: (a + 1.0,)),
    # negative stride_order entries count from the end (nvFuser's normalizeStrideOrder): [-2, -1] is [0, 1]
    Row("stride_order_negative", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32}, stride_order=[-2, -1])
        fd.add_output(fd.ops.sub(T0, 1.0))
    """, lambda n: [torch.randn(n + 2, n).t()], lambda a: (a - 1.0,)),
    # allocation order: contiguity[0] is the outer dim (dim 1, strided), contiguity[1] the inner (dim 0)
    Row("stride_order_alloc_contiguity", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], {F32}, stride_order=[0, 1])
        fd.add_output(fd.ops.mul(T0, T0))
    """, lambda n: [torch.randn(n + 1, n + 3)[:, :n].t()], lambda a: (a * a,)),
    # a leading size-1 dim ranked in the middle of the allocation (nvFuser writes these)
    Row("size_one_in_the_middle", f"""
        T0 = fd.define_tensor(shape=[1, -1, -1], contiguity=[True, None, True], {F32}, stride_order=[1, 2, 0])
        fd.add_output(fd.ops.neg(T0))
    """, lambda n: [torch.randn(n, 6).unsqueeze(1).permute(1, 0, 2)], lambda a: (-a,)),
    # a 0-dim tensor: promotes as a scalar (float32 tensor times a float64 0-dim stays float32)
    Row("zero_dim_tensor", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        T1 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Double)
        fd.add_output(fd.ops.mul(T0, T1))
    """, lambda n: [torch.randn(n), torch.tensor(1.5, dtype=torch.float64)], lambda a, s: (a * s,)),
    # an is_cpu 0-dim tensor
    Row("is_cpu_scalar_tensor", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.sub(T0, T1))
    """, lambda n: [torch.randn(n, 3), torch.tensor(0.25)], lambda a, s: (a - s,)),
    # Python scalars: a float for a Double scalar, an int for an Int scalar, into float ops
    Row("python_float_scalar", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        S1 = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(T0, S1))
    """, lambda n: [torch.randn(n), 2.5], lambda a, s: (a * s,)),
    Row("python_int_scalar_into_float_op", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        S1 = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.add(T0, S1))
    """, lambda n: [torch.randn(n), 3], lambda a, s: (a + s,)),
    Row("python_int_for_a_double_scalar", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        S1 = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.div(T0, S1))
    """, lambda n: [torch.randn(n), 4], lambda a, s: (a / float(s),)),
    Row("python_int_scalar_into_int_op", """
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        S1 = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(T0, S1))
    """, lambda n: [torch.randint(-9, 9, (n,)), -7], lambda a, s: (a * s,)),
    # nvFuser's promotion, not torch's: an Int tensor times a Double scalar is Double in nvFuser
    # (Note [scalars promote as nvFuser's] in segmenter/formats/nvfuser/build.py), float32 in torch
    Row("python_float_scalar_into_int_op", """
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        S1 = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.mul(T0, S1))
    """, lambda n: [torch.randint(-9, 9, (n,)), 0.5], lambda a, s: (a.double() * s,)),
    # a 0-dim tensor given for a scalar input
    Row("zero_dim_tensor_for_a_scalar", f"""
        T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        S1 = fd.define_scalar(dtype=DataType.Double)
        fd.add_output(fd.ops.sub(T0, S1))
    """, lambda n: [torch.randn(n), torch.tensor(0.75, dtype=torch.float64)], lambda a, s: (a - s,)),
    # in place (the class of nvFuser #2664): T2 updated with a sum over its broadcast, read by two
    # other outputs, which see T2 from before the update
    Row("in_place_0d_read_by_others", f"""
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32}, is_cpu=False, stride_order=[0])
        T2 = fd.define_tensor(shape=[], contiguity=[], {F32}, is_cpu=False)
        T7 = fd.ops.broadcast_in_dim(T2, shape=T1.shape(), broadcast_dims=[])
        T8 = fd.ops.sum(T7, dims=[0], keepdim=False)
        T9 = fd.ops.mul(T1, T7)
        T10 = fd.ops.add(T1, T7)
        fd.add_output(T8, T2)
        fd.add_output(T9)
        fd.add_output(T10)
    """, lambda n: [torch.randn(n), torch.tensor(0.5)], _sum_0d_update),
    # in place with a value the other output reads: that output sees the NEW value (it reads T4)
    Row("in_place_value_read_by_others", f"""
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32}, stride_order=[0])
        T2 = fd.define_tensor(shape=[], contiguity=[], {F32})
        T4 = fd.ops.add(T2, 1.0)
        T7 = fd.ops.broadcast_in_dim(T4, shape=T1.shape(), broadcast_dims=[])
        fd.add_output(T4, T2)
        fd.add_output(fd.ops.mul(T1, T7))
    """, lambda n: [torch.randn(n), torch.tensor(0.25)], lambda t1, t2: (t1 * t2.add_(1.0),)),
    # two in-place updates, each made from the other's value before the updates
    Row("in_place_crossed_updates", f"""
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32}, stride_order=[0])
        T2 = fd.define_tensor(shape=[], contiguity=[], {F32})
        T3 = fd.define_tensor(shape=[], contiguity=[], {F32})
        T4 = fd.ops.broadcast_in_dim(T2, shape=T1.shape(), broadcast_dims=[])
        T6 = fd.ops.sum(fd.ops.add(T1, T4), dims=[0], keepdim=False)
        T7 = fd.ops.add(T3, 1.0)
        fd.add_output(T6, T3)
        fd.add_output(T7, T2)
    """, lambda n: [torch.randn(n), torch.tensor(0.5), torch.tensor(-2.0)], _crossed_updates),
    # in place on a broadcast-dim input (contiguity None), read by another output
    Row("in_place_broadcast_dim_input", f"""
        T0 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], {F32}, stride_order=[1, 0])
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32}, stride_order=[1, 0])
        T3 = fd.ops.add(T1, T0)
        T4 = fd.ops.neg(T0)
        fd.add_output(T3)
        fd.add_output(T4, T0)
    """, lambda n: [torch.randn(n, 1), torch.randn(n, 8)], _neg_update),
]


def _program(graph):
    return runtime.compile(apply_aliases(segment(graph), "post"), backend="auto")


def _compare(want: tuple, got: list, eager_in: list, ours_in: list) -> None:
    assert len(got) == len(want)
    for j, (e, g) in enumerate(zip(want, got)):
        assert layout(g) == layout(e), f"output {j}: ours {layout(g)}, eager {layout(e)}"
        torch.testing.assert_close(g, e, msg=f"output {j}")
    for i, (e, g) in enumerate(zip(eager_in, ours_in)):
        if isinstance(e, torch.Tensor):
            torch.testing.assert_close(g, e, msg=f"input {i} after the call")


@pytest.mark.parametrize("n", [5, 67])
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_frontend_layouts_match_torch(row: Row, n: int) -> None:
    torch.manual_seed(n)
    inputs = row.inputs(n)
    eager_in = _copies(inputs)
    want = row.torch_fn(*eager_in)
    src = fusion(row.body)
    bound = from_nvfuser(src, _copies(inputs))
    ours_in = _copies(inputs)
    _compare(want, run_graph(bound, ours_in), eager_in, ours_in)  # the graph's own semantics
    ours_in = _copies(inputs)
    _compare(want, _program(bound)(*ours_in), eager_in, ours_in)  # through the runtime's kernels
    if not row.symbolic:
        return
    # defined once, executed with the inputs (fd.execute([t0, 2.5])): a symbolic plan
    symbolic = from_nvfuser(src, _copies(inputs), symbolic=True)
    ours_in = _copies(inputs)
    _compare(want, _program(symbolic)(*ours_in), eager_in, ours_in)


# -- regression tests: each failed before its fix -------------------------------------------------

NONE_DIM = fusion(f"""
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, None], {F32}, is_cpu=False, stride_order=[1, 0])
    fd.add_output(fd.ops.mul(T0, T0))
""")


@pytest.mark.parametrize("n,m", [(4, 5), (33, 130)])
def test_a_none_dim_takes_an_expanded_input(n: int, m: int) -> None:
    x = _expanded(n, m)  # strides [1, 0]: refused as "not the layout contiguity=[True, None] declares"
    (out,) = _program(from_nvfuser(NONE_DIM, [x]))(x)
    torch.testing.assert_close(out, x * x)


@pytest.mark.parametrize("n,m", [(4, 5), (33, 130)])
def test_contiguity_is_read_in_allocation_order(n: int, m: int) -> None:
    body = f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[{{}}], {F32}, stride_order=[0, 1])
        fd.add_output(fd.ops.mul(T0, T0))
    """
    x = torch.randn(m, n + 3)[:, :n].t()  # dim 0 inner (stride 1), dim 1 outer and padded
    (out,) = _program(from_nvfuser(fusion(body.format("False, True")), [x]))(x)
    torch.testing.assert_close(out, x * x)
    with pytest.raises(GraphFormatError, match=r"line 5: fd.define_tensor: .*dim 1 is declared contiguous"):
        from_nvfuser(fusion(body.format("True, False")), [x])


@pytest.mark.parametrize("source,inputs,message", [
    # a None dim of size > 1 with a stride: nvFuser's broadcast dims repeat one value
    (NONE_DIM, lambda: [torch.randn(4, 5)], r"line 5: fd.define_tensor: .*dim 1 is a broadcast dim \(contiguity None\)"),
    (NONE_DIM, lambda: [torch.randn(5, 4).t()], r"dim 1 is a broadcast dim"),
    (NONE_DIM.replace("contiguity=[True, None]", "contiguity=[True]"), lambda: [_expanded(4, 5)],
     r"line 5: fd.define_tensor: contiguity has 1 entries for 2 dims"),
    (NONE_DIM.replace("stride_order=[1, 0]", "stride_order=[1, 1]"), lambda: [_expanded(4, 5)],
     r"line 5: fd.define_tensor: stride_order \[1, 1\] is not a permutation"),
    (NONE_DIM.replace("contiguity=[True, None]", "contiguity=[True, 2]"), lambda: [_expanded(4, 5)],
     r"line 5: fd.define_tensor: contiguity must be a list"),
    (NONE_DIM.replace("[True, None]", "[None, True]"), lambda: [torch.randn(4, 5)],
     r"dim 0 is a broadcast dim \(contiguity None\) of size 4 with stride 5, not 0"),
    (NONE_DIM.replace("[True, None]", "[True, True]"), lambda: [_expanded(4, 5)],
     r"dim 1 is declared contiguous \(stride 1\), its stride is 0"),
])
def test_layouts_that_contradict_the_declaration_are_refused(source: str, inputs, message: str) -> None:
    with pytest.raises(GraphFormatError, match=message):
        from_nvfuser(source, inputs())


SCALAR = fusion(f"""
    T0 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
    S1 = fd.define_scalar(dtype=DataType.Double)
    fd.add_output(fd.ops.mul(T0, S1))
""")


@pytest.mark.parametrize("n", [5, 1000])
def test_scalar_inputs_take_python_numbers_at_the_call(n: int) -> None:
    t0 = torch.randn(n)
    graph = from_nvfuser(SCALAR, [t0, 2.5])
    torch.testing.assert_close(run_graph(graph, [t0, 2.5])[0], t0 * 2.5)
    program = _program(graph)
    torch.testing.assert_close(program(t0, 2.5)[0], t0 * 2.5)  # was: expected a tensor, got float
    torch.testing.assert_close(program(t0, -3)[0], t0 * -3.0)  # an int for a Double scalar
    torch.testing.assert_close(program(t0, torch.tensor(0.5, dtype=torch.float64))[0], t0 * 0.5)
    symbolic = _program(from_nvfuser(SCALAR))  # defined once, executed with any size
    torch.testing.assert_close(symbolic(t0, 2.5)[0], t0 * 2.5)


@pytest.mark.parametrize("value,message", [
    (True, "bool True is not a torch.float64 value"),
    ("2.5", "expected a tensor, got str"),
])
def test_scalar_inputs_refuse_what_is_no_number_of_their_dtype(value: object, message: str) -> None:
    t0 = torch.randn(4)
    program = _program(from_nvfuser(SCALAR, [t0, 2.5]))
    with pytest.raises(GraphError, match=message):
        program(t0, value)
    int_scalar = from_nvfuser(SCALAR.replace("DataType.Double", "DataType.Int"), [t0, 2])
    with pytest.raises(GraphError, match="float 2.5 is not a torch.int64 value"):
        _program(int_scalar)(t0, 2.5)
    with pytest.raises(GraphError, match="is not a torch.int64 value"):
        run_graph(int_scalar, [t0, 2**70])


def test_a_written_0d_input_takes_no_number() -> None:
    src = fusion(f"""
        T0 = fd.define_tensor(shape=[], contiguity=[], {F32})
        fd.add_output(fd.ops.add(T0, 1.0), T0)
    """)
    program = _program(from_nvfuser(src, [torch.tensor(1.0)]))
    with pytest.raises(GraphError, match="the graph writes it"):
        program(1.0)


IN_PLACE_2664 = next(r for r in ROWS if r.name == "in_place_0d_read_by_others")


@pytest.mark.parametrize("n", [1000, 1500])
def test_in_place_update_leaves_other_outputs_reading_the_old_value(n: int) -> None:
    t1, t2 = torch.randn(n), torch.tensor(0.7)
    program = _program(from_nvfuser(fusion(IN_PLACE_2664.body), [t1, t2]))
    ours = t2.clone()
    t9, t10 = program(t1, ours)
    assert torch.equal(t9, t1 * t2) and torch.equal(t10, t1 + t2)  # T2 before the update
    torch.testing.assert_close(ours, t2.expand(n).sum())


@pytest.mark.parametrize("n", [1 << 22, (1 << 22) + 3])
def test_in_place_update_at_nvfusers_size(n: int) -> None:
    """nvFuser #2664's size (2^22): the readers see T2 before the update, and the sum written into
    it is near eager's (it was ~0.3% off while a float accumulator added 2^22 values one by one;
    Note [sums in chunks]). 2^22 copies of one value are the chunks' worst input: each lane's
    rounding errors all lean the same way, and ours is up to ~4x eager's error against the exact
    sum there (2.6e-6 against 6.8e-7 relative at 2^22), which this bounds."""
    t1, t2 = torch.randn(n), torch.tensor(0.7)
    program = _program(from_nvfuser(fusion(IN_PLACE_2664.body), [t1, t2]))
    ours = t2.clone()
    t9, t10 = program(t1, ours)
    assert torch.equal(t9, t1 * t2) and torch.equal(t10, t1 + t2)
    exact = t2.double() * n
    eager_error = (t2.expand(n).sum().double() - exact).abs().item()
    assert (ours.double() - exact).abs().item() <= 5 * eager_error + 1.0, (ours.item(), exact.item())


# -- a script's own inputs list with expanded tensors (nvFuser's test_issue1706 writes these) --------

@pytest.mark.parametrize("n,m", [(4, 6), (9, 33)])
def test_a_scripts_inputs_list_reads_expanded_tensors(n: int, m: int) -> None:
    src = fusion(f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[None, True, None], {F32}, stride_order=[2, 1, 0])
        fd.add_output(fd.ops.mul(T0, 3.0))
    """, inputs=f"[torch.randn(({n}, 1), dtype=torch.float32, device='cuda:0').expand(2, -1, {m})]")
    graph = from_nvfuser(src, symbolic=False)  # bound to the script's list
    (inp,) = graph.inputs
    assert (inp.meta.shape, inp.meta.stride) == ((2, n, m), (0, 1, 0))
    x = torch.randn(n, 1).expand(2, n, m)
    (out,) = _program(graph)(x)
    torch.testing.assert_close(out, x * 3.0)


@pytest.mark.parametrize("call,message", [
    ("torch.randn(4, 3).expand(4, 5)", r"line 9: inputs: expand: dim 1 of size 3 cannot become 5"),
    ("torch.randn(4, 1).expand(5)", r"line 9: inputs: expand sizes must be at most 64 integers .* at least the tensor's 2"),
    ("torch.randn(4, 1).expand(-1, 4611686018427387904)", r"line 9: inputs: expand sizes must be .* integers in \[-1, "),
    ("torch.randn(4, 1).expand(2**40, 4, 1)", r"line 9: inputs: a BinOp is not a literal argument"),
    ("torch.randn(4, 1).expand(-2, 4, 1)", r"line 9: inputs: expand sizes must be"),
    ("torch.randn(4, 1).expand('a', 2)", r"line 9: inputs: expand sizes must be"),
    ("torch.randn(4, 1).expand(1048576, 1048576, 4, 1048576)", r"line 9: inputs: size \[1048576, 1048576, 4, 1048576\]"),
])
def test_expand_in_an_inputs_list_is_checked(call: str, message: str) -> None:
    src = fusion(f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, None], {F32})
        fd.add_output(T0)
    """, inputs=f"[{call}]")
    with pytest.raises(GraphFormatError, match=message):
        from_nvfuser(src, symbolic=False)
