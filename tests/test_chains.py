"""Note [one native call for a chain of kernels] (runtime/compiled/chains.py): which launches the fast
program runs as one native call, where their values live, and that everything observable stays
eager's (values, layouts, sharing, inputs written, errors)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime.codegen.build import cpu_compiler
from runtime.codegen.runner import MAX_ARGS, split_result
from runtime.compiled.chains import ALIGN, _place
from segmenter import SegmenterOptions, capture, segment

from .util import assert_matches_eager

needs_compiler = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


def _compiled(fn, inputs, chains=True, **options):
    plan = apply_aliases(segment(capture(fn, inputs), SegmenterOptions(**options)), "post")
    return plan, runtime.compile_program(plan, backend="cpp", chains=chains)


def _mlp(x, w1, w2):
    return (F.gelu(x @ w1) @ w2 + x).tanh()


def _split_by_sort(x, w):
    a = (x @ w).sin()
    s = a.sort(dim=1).values  # ATen's, between two chains; reads a after the first
    return (s @ w).cos()


def _view_of_product_read_after(x, w):
    y = x @ w
    return y.view(4, 16).t(), (y.sin() @ w).exp()


def _lone_kernel(x, w):
    return (x * w).sin()


def _three_pointwise(x, w):
    return x.sin().cos().exp() * w


def _writes_its_input(x, w):
    x.mul_(2)
    return (x.sin() @ w).cos()


def _many_inputs(w, *xs):
    return (torch.cat([x * (1 + i / 64) for i, x in enumerate(xs)]) @ w).sin().exp()


def _small(n=8):
    return lambda: [torch.randn(n, n), torch.randn(n, n)]


# (name, program, inputs, segmenter options, kernels per chain)
CASES = [
    ("matmuls and pointwise: one chain", _mlp, lambda: [torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 16)], {}, [4]),
    ("an ATen op between: two chains", _split_by_sort, _small(), {}, [2, 2]),
    ("a view of a product read after the chain", _view_of_product_read_after, _small(), {}, [4]),
    ("one kernel: launched on its own", _lone_kernel, _small(), {}, []),
    ("one op a segment: a chain of three", _three_pointwise, _small(), {"max_ops_per_segment": 1}, [4]),
    ("values past VALUE_BYTES: on their own", _three_pointwise, _small(512), {"max_ops_per_segment": 1}, []),
    ("an input written in place", _writes_its_input, _small(), {}, [3]),
    (f"a kernel of more than {MAX_ARGS} arguments: on its own", _many_inputs,
     lambda: [torch.randn(8, 8), *(torch.randn(1, 8) for _ in range(MAX_ARGS + 2))], {}, [2]),
]


@needs_compiler
@pytest.mark.parametrize("name, fn, make, options, kernels", CASES, ids=[c[0] for c in CASES])
def test_chains(name, fn, make, options, kernels) -> None:
    inputs = make()
    plan, program = _compiled(fn, inputs, **options)
    assert [c.kernels for c in program.chains] == kernels, program.source
    assert_matches_eager(fn, inputs, plan.graph, program=program)
    assert_matches_eager(fn, make(), plan.graph, program=program)  # fresh inputs: nothing kept from the last call
    assert program.source.count("_slots.buffer_info()") == len(kernels)
    # the same program with every kernel launched on its own gives the same bits
    _, alone = _compiled(fn, inputs, chains=False, **options)
    assert alone.chains == [] and "_slots" not in alone.source
    a, b = program(*[t.clone() for t in inputs]), alone(*[t.clone() for t in inputs])
    for x, y in zip(a, b):
        assert torch.equal(x, y) and x.stride() == y.stride()


@needs_compiler
def test_values_read_after_a_chain_get_their_own_buffers() -> None:
    """The sine the sort reads after the first chain has a buffer of its own; the product it
    reads, which nothing reads after the chain, is in the arena."""
    inputs = _small()()
    plan, program = _compiled(_split_by_sort, inputs)
    first = program.chains[0]
    sort_input = next(n for n in plan.graph.nodes if n.op == "aten.sort.default").inputs[0]
    assert sort_input == "sin" and first.arena == {"mm": 0} and first.arena_bytes == 8 * 8 * 4
    assert re.search(r"v\d+ = _c\d+\(_c\d+, _c\d+, _c\d+\)\n    _arena = ", program.source)


@needs_compiler
def test_values_whose_lifetimes_do_not_overlap_share_bytes() -> None:
    """sin -> cos -> exp -> mul, one op a segment: each value dies at the next step, so two
    slots of 256 bytes take turns."""
    inputs = _small()()
    _, program = _compiled(_three_pointwise, inputs, max_ops_per_segment=1)
    (chain,) = program.chains
    offsets = [chain.arena[v] for v in ("sin", "cos", "exp")]
    assert offsets == [0, 256, 0] and chain.arena_bytes == 512


@needs_compiler
def test_a_counting_kernel_stops_the_chain_and_raises_as_eager() -> None:
    def fn(ids, w, w2):
        return (F.embedding(ids, w) @ w2).sin()

    w, w2 = torch.randn(10, 8), torch.randn(8, 8)
    plan, program = _compiled(fn, [torch.tensor([[1, 2, 3]]), w, w2])
    assert [c.kernels for c in program.chains] == [3]
    with pytest.raises(IndexError, match=r"index out of range in self \(2 of the indices %\w+ outside \[0, 10\)\)"):
        program(torch.tensor([[1, 12, -11]]), w, w2)
    with pytest.raises(IndexError, match="index out of range in self"):
        fn(torch.tensor([[1, 12, -11]]), w, w2)
    assert_matches_eager(fn, [torch.tensor([[9, 0, 4]]), w, w2], plan.graph, program=program)


@needs_compiler
def test_the_fast_program_calls_once_where_it_launched_each_kernel() -> None:
    inputs = [torch.randn(8, 16), torch.randn(16, 32), torch.randn(32, 16)]
    _, program = _compiled(_mlp, inputs)
    _, alone = _compiled(_mlp, inputs, chains=False)
    assert len(re.findall(r"\.data_ptr\(\)", program.source)) == 5  # three inputs, the output, the arena
    assert program.source.count("_c") < alone.source.count("_c")
    # the safe variant and a profile launch every kernel on its own
    assert "_slots" not in program._program_function(fast=False)[1]
    assert len(program.profile_launches(*inputs, calls=2)) == len(program.launches)


# (name, values as (first step, last step, bytes), offsets, bytes in all)
PLACES = [
    ("one value", [(0, 0, 10)], [0], ALIGN),
    ("overlapping: disjoint", [(0, 1, 64), (1, 2, 64)], [0, 64], 128),
    ("written where the other is last read: disjoint", [(0, 1, 64), (1, 1, 64)], [0, 64], 128),
    ("after the last read: reused", [(0, 1, 64), (2, 3, 64)], [0, 0], 64),
    ("a gap fits a smaller one", [(0, 5, 64), (0, 1, 128), (0, 5, 64), (2, 3, 64)], [0, 64, 192, 64], 256),
    ("a gap too small is skipped", [(0, 5, 64), (0, 1, 64), (0, 5, 64), (2, 3, 128)], [0, 64, 128, 192], 320),
    ("empty values take a slot", [(0, 0, 0), (0, 0, 0)], [0, 64], 128),
]


@pytest.mark.parametrize("name, values, offsets, total", PLACES, ids=[p[0] for p in PLACES])
def test_place(name, values, offsets, total) -> None:
    got, top = _place([(f"v{i}", *v) for i, v in enumerate(values)])
    assert [got[f"v{i}"] for i in range(len(values))] == offsets and top == total


def test_runner_result() -> None:
    assert split_result(5 << 20 | 3) == (2, 5)
    with pytest.raises(RuntimeError, match="more arguments"):
        split_result(-1)



@needs_compiler
def test_a_value_named_like_the_arena_is_its_own_slot() -> None:
    """A graph file names its values: an input called ``_arena`` is still that input, never the
    chain's buffer (the arena's slot is keyed by no name)."""
    import json

    from segmenter.formats.serialize import from_json, to_json

    inputs = _small()()
    graph = capture(_three_pointwise, inputs)
    doc = json.loads(to_json(graph))
    renamed = json.dumps(doc).replace('"x"', '"_arena"')
    assert '"_arena"' in renamed
    graph = from_json(renamed)
    program = runtime.compile_program(apply_aliases(segment(graph, SegmenterOptions(max_ops_per_segment=1)), "post"),
                                      backend="cpp")
    assert [c.kernels for c in program.chains] == [4] and program.chains[0].arena
    (out,) = program(*inputs)
    torch.testing.assert_close(out, _three_pointwise(*inputs))
