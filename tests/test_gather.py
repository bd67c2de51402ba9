"""Note [gathers at constant affine indices] (runtime/compiled/gather.py): which ``aten.index.Tensor`` calls
become a copy of one strided view, and that every program still gives eager's answer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.compiled.gather import MAX_CHECKED, AffineGather, affine_view
from segmenter import GraphError, capture, segment

from .util import assert_matches_eager

_A = torch.arange


# (x shape, x strides, index tensors, out shape) -> expected (view strides, offset) or None
AFFINE_CASES = {
    "row of a [1, 16] mask, as transformers' masks read it": (
        (1, 16), (16, 1), [torch.zeros(1, 1, 1, 1, dtype=torch.long), _A(16).view(1, 1, 1, 16)], (1, 1, 1, 16),
        ((1, 1, 1, 1), 0)),
    "column layout of the same read": (
        (1, 16), (16, 1), [torch.zeros(1, 1, 1, 1, dtype=torch.long), _A(16).view(1, 1, 16, 1)], (1, 1, 16, 1),
        ((1, 1, 1, 1), 0)),
    "a transposed read of a [3, 4]": ((3, 4), (4, 1), [_A(3).view(1, 3), _A(4).view(4, 1)], (4, 3), ((1, 4), 0)),
    "every other element, from 1": ((10,), (1,), [_A(1, 10, 2)], (5,), ((2,), 1)),
    "negative indices wrap": ((8,), (1,), [_A(-8, 0)], (8,), ((1,), 0)),
    "int32 indices, a strided x": ((4, 5), (1, 4), [_A(4, dtype=torch.int32).view(4, 1), _A(5).view(1, 5)],
                                   (4, 5), ((1, 4), 0)),
    "a repeated index: stride 0": ((6,), (1,), [torch.full((3,), 2)], (3,), ((0,), 2)),
    "not affine: 0, 2, 1": ((3,), (1,), [torch.tensor([0, 2, 1])], (3,), None),
    "descending: a negative step": ((3,), (1,), [torch.tensor([2, 1, 0])], (3,), None),
    "out of range": ((3,), (1,), [torch.tensor([0, 1, 3])], (3,), None),
    "below the negative range": ((3,), (1,), [torch.tensor([-4])], (1,), None),
    "a bool mask": ((3,), (1,), [torch.tensor([True, False, True])], (2,), None),
    "a float index": ((3,), (1,), [torch.tensor([0.0, 1.0])], (2,), None),
    "fewer index tensors than dims: the rest are full slices": ((3, 4), (4, 1), [_A(3)], (3, 4), ((4, 1), 0)),
    "None slots before the index, as falcon reads its fused q/k/v": (
        (2, 32, 6, 16), (3072, 96, 16, 1), [None, None, torch.tensor([-2])], (2, 32, 1, 16), ((3072, 96, 1, 1), 64)),
    "a None slot between two index tensors: the indexed dims go first": (
        (3, 4, 5), (20, 5, 1), [_A(2), None, _A(1, 3)], (2, 4), ((21, 5), 1)),
    "a None slot, not affine": ((3, 4), (4, 1), [None, torch.tensor([0, 3, 1])], (3, 3), None),
    "a None slot, out of range": ((3, 4), (4, 1), [None, torch.tensor([4])], (3, 1), None),
    "only None slots": ((3, 4), (4, 1), [None, None], (3, 4), None),
    "a 0-d index tensor drops its dim": ((3, 4), (4, 1), [None, torch.tensor(2)], (3,), ((4,), 2)),
    "index tensors that do not broadcast": ((3, 4), (4, 1), [_A(3), _A(2)], (3,), None),
    "a shape the graph did not say": ((3,), (1,), [_A(3)], (2,), None),
    "no element": ((3,), (1,), [_A(0)], (0,), None),
    "more elements than are checked": ((MAX_CHECKED + 1,), (1,), [_A(MAX_CHECKED + 1)], (MAX_CHECKED + 1,), None),
}


@pytest.mark.parametrize("case", AFFINE_CASES)
def test_affine_view(case: str) -> None:
    x_shape, x_stride, indices, out_shape, want = AFFINE_CASES[case]
    assert affine_view(x_shape, x_stride, indices, out_shape) == want
    if want is None:
        return
    x = torch.randn(max(sum((n - 1) * s for n, s in zip(x_shape, x_stride)) + 1, 1)).as_strided(x_shape, x_stride)
    stride, offset = want
    view = x.as_strided(out_shape, stride, x.storage_offset() + offset)
    assert torch.equal(view, torch.ops.aten.index.Tensor(x, indices))


def _masks(m):
    """transformers' mask read (the index tensors come from arange: folded when compiled)."""
    c = m.cumsum(-1)
    b = torch.arange(1).view(1, 1, 1, 1)
    k = torch.arange(m.shape[1])
    return c[b, k.view(1, 1, -1, 1)] * 2, c[b, k.view(1, 1, 1, -1)] + c[b, k.view(1, 1, -1, 1)]


def _shuffled(m):
    return m[:, torch.tensor([0, 2, 1, 3])] + 1


def _gathered_input(x):
    return x[torch.arange(2).view(2, 1), torch.arange(0, 6, 2).view(1, 3)]


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("fn, inputs, gathers", [
    (_masks, [torch.randint(0, 3, (1, 16))], 3),
    (_shuffled, [torch.randn(3, 4)], 0),  # not affine: ATen's index
    (_gathered_input, [torch.randn(2, 6)], 1),  # a graph output gathered from a graph input
])
def test_programs_with_gathers_match_eager(fn, inputs, gathers: int, backend: str) -> None:
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    program = runtime.compile(plan, backend=backend)
    assert sum(isinstance(launch, AffineGather) for launch in program._chosen.values()) == gathers
    assert_matches_eager(fn, inputs, plan.graph, program=program)
    with torch.no_grad():  # the fast variant too (assert_matches_eager's inputs need no grad either way)
        assert_matches_eager(fn, inputs, plan.graph, program=program)


def test_a_gathered_output_is_memory_of_its_own() -> None:
    x = torch.randn(2, 6)
    program = runtime.compile(apply_aliases(segment(capture(_gathered_input, [x])), "post"))
    (out,) = program(x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    out.add_(1)
    torch.testing.assert_close(out - 1, _gathered_input(x))


def test_negative_constant_indices_wrap_as_atens_do() -> None:
    def fn(x):
        return x[torch.arange(3) - 3] * 2  # -3, -2, -1: the last three

    x = torch.randn(5)
    plan = apply_aliases(segment(capture(fn, [x])), "post")
    program = runtime.compile(plan)
    assert any(isinstance(launch, AffineGather) for launch in program._chosen.values())
    assert_matches_eager(fn, [x], plan.graph, program=program)


def _folded_gather(x):
    mask = torch.arange(16).view(1, 16).expand(2, 16)  # reads no input: folded when compiled
    return x * mask[torch.arange(1).view(1, 1), torch.arange(16).view(1, 16)]


def test_a_gather_of_folded_values_is_folded() -> None:
    """See Note [folded segments]: an aten.index.Tensor whose every input is folded is folded too."""
    x = torch.randn(1, 16)
    plan = apply_aliases(segment(capture(_folded_gather, [x])), "post")
    program = runtime.compile(plan)
    index = [s.index for s in plan.segments if any(n.op == "aten.index.Tensor" for n in s.nodes)]
    assert index and set(index) <= program.folded
    assert_matches_eager(_folded_gather, [x], plan.graph, program=program)


def test_a_folded_gather_out_of_range_raises_on_every_call_as_in_eager() -> None:
    """A graph (from a file, say) whose folded index is out of range: folding it raises, so the
    program folds without it, and the gather raises when called, as eager's would."""
    def fn(x):
        return x + torch.arange(5)[torch.arange(3) + 2]

    graph = capture(fn, [torch.randn(3)])
    add = next(n for n in graph.nodes if n.op == "aten.add.Tensor" and 2 in n.args)
    bad = dataclasses.replace(add, args=tuple(3 if a == 2 else a for a in add.args))
    graph = dataclasses.replace(graph, nodes=tuple(bad if n is add else n for n in graph.nodes))
    program = runtime.compile(apply_aliases(segment(graph), "post"))
    index = [s.index for s in program.plan.segments if any(n.op == "aten.index.Tensor" for n in s.nodes)]
    assert index and not set(index) & program.folded
    for _ in range(2):
        with pytest.raises(IndexError):
            program(torch.randn(3))


def test_a_gathered_input_whose_storage_shrank_is_refused() -> None:
    """The view a gather makes of a graph input checks no storage bounds: the entry and the checked
    call refuse an input whose storage was shrunk behind its back (eager would read past it)."""
    x = torch.randn(2, 6)
    program = runtime.compile(apply_aliases(segment(capture(_gathered_input, [x])), "post"))
    assert any(isinstance(launch, AffineGather) for launch in program._chosen.values())
    (out,) = program(x)
    torch.testing.assert_close(out, _gathered_input(x))
    small = torch.randn(2, 6)
    small.untyped_storage().resize_(8)
    assert program.entry(small) is None
    with pytest.raises(GraphError, match="fewer than its layout reaches"):
        program(small)
