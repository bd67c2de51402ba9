"""Note [views passed as pointers] (runtime/compiled/pointers.py): which views the fast program does not
make, what the kernels that read them are handed, and how long their sources live; and the
storage checks for inputs read through views made without the dispatcher."""

from __future__ import annotations

import re

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen.build import cpu_compiler
from segmenter import GraphError, SegmenterOptions, capture, segment

from .util import assert_matches_eager

needs_compiler = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


def _compiled(fn, inputs, backend="cpp", **options):
    plan = apply_aliases(segment(capture(fn, inputs), SegmenterOptions(**options)), "post")
    return plan, runtime.compile(plan, backend=backend, chains=False)  # launch by launch: chains are tests/test_chains.py


def _mm_view_sin(x, w):
    return (x @ w).view(2, 4, 8).sin()


def _mm_slice_sin(x, w):
    return (x @ w)[:, 4:].sin()


def _view_is_an_output(x, w):
    y = (x @ w).view(2, 4, 8)
    return y, y.sin()


def _view_read_by_aten_too(x, w):
    y = (x @ w)[:, 4:]
    return y.sin(), y @ w[4:, ::2]  # a matmul the generator declines (B strided along n and k): ATen's


def _two_kernels_read_one_view(x, w):
    y = (x @ w).view(2, 4, 8)
    return y.sin(), y.exp() @ w


def _input_slice_alone(x, w):
    return x[2:].exp() + 1


# (program, options, the views passed as pointers: view -> (source, bytes past the source's start))
CASES = [
    ("reshape of a matmul's output, read by a kernel", _mm_view_sin, {}, {"view": ("mm", 0)}),
    ("slice at an offset", _mm_slice_sin, {}, {"slice_1": ("mm", 16)}),
    ("the view is an output: made", _view_is_an_output, {}, {}),
    ("read by an ATen matmul too: made", _view_read_by_aten_too, {}, {}),
    # (the second view, of exp, is read by the matmul kernel alone: Note [matmul kernels])
    ("read by two kernels", _two_kernels_read_one_view, {}, {"view": ("mm", 0), "view_1": ("exp", 0)}),
    ("a view of a graph input", _input_slice_alone, {"max_ops_per_segment": 1}, {"slice_1": ("x", 64)}),
]


@needs_compiler
@pytest.mark.parametrize("name, fn, options, expected", CASES, ids=[c[0] for c in CASES])
def test_views_passed_as_pointers(name, fn, options, expected) -> None:
    inputs = [torch.randn(8, 8), torch.randn(8, 8)]
    plan, program = _compiled(fn, inputs, **options)
    assert program.pointers == expected
    assert_matches_eager(fn, inputs, plan.graph, program=program)
    # those views are not made (the safe variant makes every one), and each kernel is handed the
    # source's pointer at the view's offset
    safe_source = program._program_function(fast=False)[1]
    assert _views_made(program.source) == _views_made(safe_source) - len(expected)
    for delta in {d for _, d in expected.values() if d}:
        assert f".data_ptr() + {delta})" in program.source


def _views_made(source: str) -> int:
    """Lines that make a view: ``vN = reinterpret(vM, shape, stride, offset)``."""
    return len(re.findall(r"= _c\d+\(v\d+, _c\d+, _c\d+, \d+\)$", source, re.M))


@needs_compiler
def test_the_source_lives_until_the_last_kernel_that_reads_its_view() -> None:
    """The source's local is deleted right after the last launch that reads its view, not at
    the METADATA segment (where the view tensor used to hold its storage alive)."""
    def fn(x, w, w2):
        y = (x @ w).view(2, 4, 8)  # y's source is deleted... after the second kernel
        a = y.sin() @ w2.view(8, 8)
        return y.exp() + a.view(2, 4, 8)

    inputs = [torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)]
    plan, program = _compiled(fn, inputs)
    assert set(program.pointers) >= {"view"}
    assert_matches_eager(fn, inputs, plan.graph, program=program)
    lines = program.source.splitlines()
    src = re.match(r"\s+(v\d+) = ", next(ln for ln in lines if "matmul" not in ln and " = _c" in ln)).group(1)
    reads = [i for i, ln in enumerate(lines) if f"{src}.data_ptr()" in ln][1:]  # the first is the matmul writing it
    dels = [i for i, ln in enumerate(lines) if ln.strip().startswith("del ") and re.search(rf"\b{src}\b", ln)]
    assert len(reads) == 2 and dels and dels[0] == reads[-1] + 1, program.source


@needs_compiler
def test_the_safe_variant_makes_every_view() -> None:
    inputs = [torch.randn(8, 8), torch.randn(8, 8)]
    plan, program = _compiled(_mm_view_sin, inputs)
    assert program.pointers
    safe_source = program._program_function(fast=False)[1]
    assert "data_ptr() +" not in safe_source and _views_made(safe_source) == 1
    made = re.search(r"(v\d+) = _c\d+\(v\d+, _c\d+, _c\d+, 0\)$", safe_source, re.M).group(1)
    assert f"{made}.data_ptr()" in safe_source  # the kernel reads the view made
    x = torch.randn(8, 8, requires_grad=True)  # grad on and an input needs it: the safe variant runs
    (out,) = program(x, inputs[1])
    torch.testing.assert_close(out, _mm_view_sin(x, inputs[1]).detach())


def _transposed_weight(x, w):
    return x @ w.t()


def _slice_read_by_a_kernel_and_a_matmul(x, w):
    return x[2:].sin(), x[2:] @ w


# Note [kernel reads stay in storage], for views made without the dispatcher: an input whose storage
# was shrunk behind its back (eager's view ops raise on it) is refused, never read past its end.
# (program, options, which input is shrunk, bytes its storage must hold)
SHRUNK = [
    ("a view made from the plan before a matmul", _transposed_weight, {}, 1, 256),
    ("a METADATA view read by a kernel and a matmul", _slice_read_by_a_kernel_and_a_matmul,
     {"max_ops_per_segment": 1}, 0, 256),
    ("a view passed as a pointer", _input_slice_alone, {"max_ops_per_segment": 1}, 0, 256),
]


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("name, fn, options, shrunk, need", SHRUNK, ids=[c[0] for c in SHRUNK])
def test_inputs_read_through_views_are_checked(name, fn, options, shrunk, need, backend) -> None:
    if backend == "cpp" and cpu_compiler() is None:
        pytest.skip("no C++ compiler")
    inputs = [torch.randn(8, 8), torch.randn(8, 8)]
    _, program = _compiled(fn, inputs, backend=backend, **options)
    assert program._storage_needs.get(shrunk) == need
    args = [t.clone() for t in inputs]
    args[shrunk].untyped_storage().resize_(need - 4)
    with pytest.raises(RuntimeError):  # eager: its view op refuses the storage
        fn(*args)
    assert program.entry(*args) is None  # the fast entry runs nothing
    with pytest.raises(GraphError, match="storage holds 252 bytes"):
        program(*args)


_A = torch.arange


def _mask_reads(m):
    """transformers' mask read: a cumsum read at constant affine indices (folded when compiled)."""
    c = m.cumsum(-1)
    b, k = _A(1).view(1, 1, 1, 1), _A(m.shape[1])
    return c[b, k.view(1, 1, -1, 1)] * 2, c[b, k.view(1, 1, 1, -1)] + c[b, k.view(1, 1, -1, 1)]


def _rows_of_an_intermediate(x):
    return x.cumsum(-1)[_A(1, 3).view(2, 1), _A(6).view(1, 6)] * 2


def _every_other_column(x):
    return x.cumsum(-1)[_A(2).view(2, 1), _A(0, 6, 2).view(1, 3)] * 2


def _rows_of_an_input(x):
    return x[_A(2).view(2, 1), _A(6).view(1, 6)] * 2


def _rows_of_an_input_then_written(x):
    g = x[_A(2).view(2, 1), _A(6).view(1, 6)]
    x.mul_(3)  # the gather holds the old values
    return g + 1


def _gather_is_an_output(x):
    g = x.cumsum(-1)[_A(2).view(2, 1), _A(6).view(1, 6)]
    return g, g * 2


# Note [views passed as pointers], for gathers at constant affine indices:
# (program, input, the gathers read where they lie: sorted (source, bytes) pairs)
GATHERS = [
    ("transformers' mask reads", _mask_reads, torch.randint(0, 3, (1, 16)), [("cumsum", 0)] * 3),
    ("rows of an intermediate, at an offset", _rows_of_an_intermediate, torch.randn(4, 6), [("cumsum", 24)]),
    ("other strides than planned: copied", _every_other_column, torch.randn(4, 6), []),
    ("from a graph input: copied", _rows_of_an_input, torch.randn(4, 6), []),
    ("from a graph input written later: copied", _rows_of_an_input_then_written, torch.randn(4, 6), []),
    ("an output: copied", _gather_is_an_output, torch.randn(4, 6), []),
]


@needs_compiler
@pytest.mark.parametrize("name, fn, x, expected", GATHERS, ids=[c[0] for c in GATHERS])
def test_gathers_read_where_they_lie(name, fn, x, expected) -> None:
    plan, program = _compiled(fn, [x])
    gathers = [s for s in plan.segments if any(n.op == "aten.index.Tensor" for n in s.nodes)]
    assert gathers and not set(s.index for s in gathers) & program.folded
    assert sorted(program.pointers.values()) == expected
    with torch.no_grad():
        assert_matches_eager(fn, [x], plan.graph, program=program)
    assert program.source.count(".copy_(") == len(gathers) - len(expected)
