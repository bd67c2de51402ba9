"""Embedding lookups and cumulative sums as generated C++ kernels (runtime/codegen/opaque/embedding.py,
Note [embedding kernels]; runtime/codegen/opaque/scan.py, Note [cumsum kernels]): tables of the ones the
cpp backend takes, each against eager (values, strides, aliasing), of the ones it declines, each
with its reason, and the error an index out of range raises instead of a read."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime.codegen import Declined
from runtime.codegen.opaque.embedding import embedding_kernel
from segmenter import SegmentKind, capture, segment

from .util import assert_matches_eager

EMBEDDING, CUMSUM = "aten.embedding.default", "aten.cumsum.default"


def _program(fn, inputs, backend="auto"):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend=backend)


def _segment_of(prog, op: str) -> int:
    (i,) = [s.index for s in prog.plan.segments if s.kind == SegmentKind.OPAQUE and any(n.op == op for n in s.nodes)]
    return i


def _ids(n: int, *shape, dtype=torch.int64):
    return torch.randint(0, n, shape, dtype=dtype)


# (name, program, inputs): index ranks and dtypes, a strided and an expanded index tensor, weight
# dtypes (the rows are copied as stored: half and bfloat16 bit for bit), a transposed and a
# sliced weight, padding_idx (forward unchanged), one row, rows repeated, work worth threads
EMBEDDINGS = [
    ("2d-ids", lambda w, i: F.embedding(i, w), [torch.randn(50, 16), _ids(50, 2, 7)]),
    ("1d-ids", lambda w, i: F.embedding(i, w), [torch.randn(10, 3), _ids(10, 9)]),
    ("0d-id", lambda w, i: F.embedding(i, w), [torch.randn(10, 3), torch.tensor(4)]),
    ("int32-ids", lambda w, i: F.embedding(i, w), [torch.randn(30, 8), _ids(30, 4, 5, dtype=torch.int32)]),
    ("strided-ids", lambda w, i: F.embedding(i[:, ::2], w), [torch.randn(20, 4), _ids(20, 3, 10)]),
    ("expanded-ids", lambda w, i: F.embedding(i.expand(3, 6), w), [torch.randn(20, 4), _ids(20, 1, 6)]),
    ("transposed-ids", lambda w, i: F.embedding(i.t(), w), [torch.randn(20, 4), _ids(20, 5, 3)]),
    ("double", lambda w, i: F.embedding(i, w), [torch.randn(12, 5, dtype=torch.float64), _ids(12, 2, 3)]),
    ("half", lambda w, i: F.embedding(i, w), [torch.randn(12, 6).half(), _ids(12, 2, 3)]),
    ("bfloat16", lambda w, i: F.embedding(i, w), [torch.randn(12, 6).bfloat16(), _ids(12, 2, 3)]),
    ("int-weight", lambda w, i: F.embedding(i, w), [torch.randint(-9, 9, (12, 6)), _ids(12, 4)]),
    ("transposed-weight", lambda w, i: F.embedding(i, w.t()), [torch.randn(6, 40), _ids(40, 2, 5)]),
    ("sliced-weight", lambda w, i: F.embedding(i, w[3:, 1:]), [torch.randn(20, 9), _ids(17, 2, 5)]),
    ("padding-idx", lambda w, i: F.embedding(i, w, padding_idx=0), [torch.randn(10, 4), torch.tensor([[0, 3, 0, 9]])]),
    ("one-row", lambda w, i: F.embedding(i, w), [torch.randn(1, 4), torch.zeros(2, 3, dtype=torch.int64)]),
    ("then-scaled", lambda w, i, p: F.embedding(i, w) * 8.0 + p, [torch.randn(40, 8), _ids(40, 2, 6), torch.randn(6, 8)]),
    ("threaded", lambda w, i: F.embedding(i, w), [torch.randn(300, 256), _ids(300, 4, 64)]),
]


@pytest.mark.parametrize("name,fn,inputs", EMBEDDINGS, ids=[t[0] for t in EMBEDDINGS])
def test_embeddings_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog, EMBEDDING)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_embedding_")
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=0, rtol=0)  # rows copied, never computed
    assert_matches_eager(fn, inputs, prog.graph, program=prog.run_checked, atol=0, rtol=0)


def test_only_the_big_lookup_shares_its_rows_among_threads() -> None:
    bodies = {name: _program(fn, inputs) for name, fn, inputs in EMBEDDINGS if name in ("threaded", "2d-ids")}
    body = {name: p.kernels[_segment_of(p, EMBEDDING)].body for name, p in bodies.items()}
    assert "omp parallel" in body["threaded"] and "omp parallel" not in body["2d-ids"]


@pytest.mark.parametrize("bad", [-1, 50, 2**40, -(2**62)])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_an_index_out_of_range_raises_as_eager_and_reads_nothing(bad, dtype) -> None:
    """Indices are data the program only sees when called: the kernel tests each against the
    weight's rows before it reads one, and the call raises eager's IndexError."""
    if dtype == torch.int32 and not -(2**31) <= bad < 2**31:
        bad = 2**31 - 1
    fn = lambda w, i: F.embedding(i, w)  # noqa: E731
    inputs = [torch.randn(50, 16), _ids(50, 2, 7, dtype=dtype)]
    prog = _program(fn, inputs)
    assert prog.backend_of[_segment_of(prog, EMBEDDING)] == "cpp"
    ids = inputs[1].clone()
    ids[1, 3] = bad
    with pytest.raises(IndexError, match="index out of range in self"):
        fn(inputs[0], ids)
    for call in (prog, prog.run_checked):
        with pytest.raises(IndexError, match="index out of range in self"):
            call(inputs[0], ids)
    assert torch.equal(prog(*inputs)[0], fn(*inputs))  # and the next good call is right


def test_an_embedding_under_torch_compile_raises_for_a_bad_index() -> None:
    model = torch.nn.Embedding(20, 8)
    ids = _ids(20, 2, 5)
    compiled = torch.compile(model, backend="fuseg")
    with torch.no_grad():
        assert torch.equal(compiled(ids), model(ids))
        bad = ids.clone()
        bad[0, 0] = 20
        with pytest.raises(IndexError, match="index out of range in self"):
            compiled(bad)


def test_an_index_tensor_in_another_layout_than_compiled_runs_on_torch_not_misread() -> None:
    fn, inputs = EMBEDDINGS[0][1], EMBEDDINGS[0][2]
    prog = _program(fn, inputs)
    seg = prog.plan.segments[_segment_of(prog, EMBEDDING)]
    launch = prog.launches[seg.index]
    env = dict(zip(prog.graph.input_names, inputs))
    env[seg.inputs[1]] = inputs[1].t().contiguous().t()  # planned contiguous
    launch.run(env)
    assert launch.run.stats["layout_fallbacks"] == 1
    assert torch.equal(env[seg.outputs[0]], fn(*inputs))


# (name, program, inputs, why): lookups the generator declines
EMBEDDINGS_DECLINED = [
    ("empty-rows", lambda w, i: F.embedding(i, w), [torch.randn(10, 0), _ids(10, 3)], "rows of no elements"),
    ("complex", lambda w, i: F.embedding(i, w), [torch.randn(10, 2, dtype=torch.complex64), _ids(10, 3)], "complex"),
]


def test_a_recorded_output_meta_that_contradicts_the_op_is_declined() -> None:
    """See Note [checked source values]: the kernel is sized by the metas; one the op contradicts
    (here rows twice as long as the weight's, which would read past each row) is not believed."""
    fn, inputs = EMBEDDINGS[0][1], EMBEDDINGS[0][2]
    graph = capture(fn, inputs)
    node = next(n for n in graph.nodes if n.op == EMBEDDING)
    lying = dataclasses.replace(node.metas[0], shape=(2, 7, 32), stride=(224, 32, 1))
    with pytest.raises(Declined, match="torch computes"):
        embedding_kernel(graph, dataclasses.replace(node, metas=(lying,)))
    embedding_kernel(graph, node)  # the true one is taken


# (name, program, inputs): dims, dtypes (int and bool promote to int64; float accumulates as
# ATen's CPU kernel does, in double for float32, float for half), strided and transposed inputs,
# one element along the dim, a dtype argument, work worth threads
CUMSUMS = [
    ("bool-mask", lambda m: torch.cumsum(m.ne(0), -1), [torch.randint(0, 2, (2, 32))]),
    ("int32-dim1", lambda x: torch.cumsum(x, 1), [torch.randint(-5, 5, (2, 32), dtype=torch.int32)]),
    ("int64-dim0", lambda x: torch.cumsum(x, 0), [torch.randint(-5, 5, (7, 3))]),
    ("float-rows", lambda x: torch.cumsum(x, -1), [torch.randn(4, 1000)]),
    ("float-cols", lambda x: torch.cumsum(x, 0), [torch.randn(300, 5)]),
    ("float-middle", lambda x: torch.cumsum(x, 1), [torch.randn(3, 40, 5)]),
    ("double", lambda x: torch.cumsum(x, 1), [torch.randn(3, 100, dtype=torch.float64)]),
    ("half", lambda x: torch.cumsum(x, 1), [torch.randn(3, 300).half()]),
    ("bfloat16", lambda x: torch.cumsum(x, 1), [torch.randn(3, 300).bfloat16()]),
    ("transposed", lambda x: torch.cumsum(x.t(), 1), [torch.randn(50, 4)]),
    ("strided", lambda x: torch.cumsum(x[:, ::3], 1), [torch.randn(4, 60)]),
    ("1d", lambda x: torch.cumsum(x, 0), [torch.randn(77)]),
    ("one-along-dim", lambda x: torch.cumsum(x, 1), [torch.randn(5, 1)]),
    ("dtype-int32", lambda x: torch.cumsum(x, 1, dtype=torch.int32), [torch.randint(-3, 3, (2, 9))]),
    ("position-ids", lambda m: (torch.cumsum(m, 1) * m).long() + 1, [torch.ones(2, 16, dtype=torch.int32)]),
    ("threaded", lambda x: torch.cumsum(x, 1), [torch.randn(256, 256)]),
]


@pytest.mark.parametrize("name,fn,inputs", CUMSUMS, ids=[t[0] for t in CUMSUMS])
def test_cumsums_run_as_generated_kernels(name, fn, inputs) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog, CUMSUM)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert prog.kernels[i].name.startswith("fuseg_cumsum_")
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=0, rtol=0)  # ATen's own order and types


# (name, program, inputs, why): cumulative sums the generator declines
CUMSUMS_DECLINED = [
    ("float-to-double", lambda x: torch.cumsum(x, 1, dtype=torch.float64), [torch.randn(2, 9)], "float32 into float64"),
    ("int-to-float", lambda x: torch.cumsum(x, 1, dtype=torch.float32), [torch.randint(0, 4, (2, 9))], "int64 into float32"),
    ("0d", lambda x: torch.cumsum(x, 0), [torch.tensor(3.0)], "0-d"),
]


DECLINED = [(EMBEDDING, *d) for d in EMBEDDINGS_DECLINED] + [(CUMSUM, *d) for d in CUMSUMS_DECLINED]


@pytest.mark.parametrize("op,name,fn,inputs,why", DECLINED, ids=[f"{d[0].split('.')[1]}-{d[1]}" for d in DECLINED])
def test_lookups_the_generator_declines_run_on_torch_with_the_reason(op, name, fn, inputs, why) -> None:
    prog = _program(fn, inputs)
    i = _segment_of(prog, op)
    assert prog.backend_of[i] == "torch"
    assert why in dict(prog.passed_over[i])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=0, rtol=0)


def test_the_torch_backend_still_runs_both_on_aten() -> None:
    fn = lambda w, i: torch.cumsum(F.embedding(i, w), 1)  # noqa: E731
    inputs = [torch.randn(20, 4), _ids(20, 2, 6)]
    prog = _program(fn, inputs, backend="torch")
    assert prog.kernels == {}
    assert {launch.backend for launch in prog.launches if launch.kind == SegmentKind.OPAQUE} == {"torch"}
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=0, rtol=0)


def _positions(x):
    ids = torch.ones(2, 16, dtype=torch.int64, device=x.device).cumsum(1) - 1  # reads no input: folded
    return x + ids.to(x.dtype)


def test_a_cumsum_of_folded_values_is_folded() -> None:
    """See Note [folded segments]: a cumsum of position ids made from nothing (opt's mask) runs once."""
    x = torch.randn(2, 16)
    prog = _program(_positions, [x])
    assert _segment_of(prog, CUMSUM) in prog.folded
    assert_matches_eager(_positions, [x], prog.graph, program=prog, atol=0, rtol=0)
