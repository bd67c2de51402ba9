"""Small float32 matmuls as generated C++ kernels (runtime/codegen/opaque/gemm.py, Note [matmul
kernels]): a table of the ones the cpp backend takes, each against eager (values, strides,
aliasing), in both loop shapes and every tail of their tiles; a table of the ones it declines,
each with its reason; and the layouts it reads coming from torch's meta kernels, never from
recorded metas."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runtime
from alias import apply_aliases
from runtime.codegen import Declined
from runtime.codegen.opaque import gemm
from segmenter import SegmentKind, capture, segment

from .util import assert_matches_eager

TOL = 1e-5  # float32 sums in another order than BLAS's
# A sum of k float32 products in another order differs by about k * 2^-24 of the products' size:
# at k = 600 that is ~4e-5, beyond TOL for an element near zero (the full suite drew such inputs).
K_TOL = {"linear-k-blocks": 1e-4}
_GEN = torch.Generator().manual_seed(1234)  # the cases' inputs do not depend on the tests run before


def _program(fn, inputs, backend="auto"):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend=backend)


def _matmuls(prog) -> list[int]:
    return [s.index for s in prog.plan.segments if s.kind == SegmentKind.MATMUL]


def _r(*shape):
    return torch.randn(*shape, generator=_GEN)


# (name, program, inputs, loop): "nn" where B is contiguous along n, "nt" where A and B are
# contiguous along k. In "nt", from PACK_ROWS rows of C the kernel copies B contiguous along n (a
# block of k at a time, FUSEG_KC) and runs the "nn" tiles; below, dot products (one row alone: its
# own tile). In "nn", at most 2 rows and more than 4 tiles of columns read B row by row, and from
# FUSEG_NN_PACK_ROWS rows B's panels are copied contiguous first. Shapes
# cover whole register tiles and every tail (rows past the tile, columns past the last vector,
# k past the last vector and past a block of k), bias broadcasts, views with offsets, for the
# machine's vector width (Note [register tiles] in runtime/codegen/source/gemm_prelude.py).
MATMULS = [
    ("linear", lambda x, w, b: F.linear(x, w, b), [_r(16, 64), _r(64, 64), _r(64)], "nt"),
    ("linear-no-bias", lambda x, w: F.linear(x, w), [_r(16, 64), _r(32, 64)], "nt"),
    ("linear-tails", lambda x, w, b: F.linear(x, w, b), [_r(7, 19), _r(6, 19), _r(6)], "nt"),
    ("linear-3d", lambda x, w, b: F.linear(x, w, b), [_r(2, 8, 48), _r(40, 48), _r(40)], "nt"),
    ("linear-one-row", lambda x, w: F.linear(x, w), [_r(1, 33), _r(9, 33)], "nt"),
    ("linear-one-row-bias", lambda x, w, b: F.linear(x, w, b), [_r(1, 300), _r(37, 300), _r(37)], "nt"),
    ("linear-two-rows", lambda x, w, b: F.linear(x, w, b), [_r(2, 70), _r(23, 70), _r(23)], "nt"),
    ("linear-three-rows", lambda x, w, b: F.linear(x, w, b), [_r(3, 40), _r(13, 40), _r(13)], "nt"),
    ("linear-four-rows", lambda x, w: F.linear(x, w), [_r(4, 21), _r(30, 21)], "nt"),
    ("linear-packed", lambda x, w, b: F.linear(x, w, b), [_r(64, 64), _r(128, 64), _r(128)], "nt"),
    ("linear-packed-edges", lambda x, w, b: F.linear(x, w, b), [_r(2, 20, 35), _r(21, 35), _r(21)], "nt"),
    ("linear-packed-strided-rows", lambda x, w: F.linear(x[:, 1:], w[3:]), [_r(33, 50), _r(20, 49)], "nt"),
    ("linear-k-blocks", lambda x, w, b: F.linear(x, w, b), [_r(13, 600), _r(27, 600), _r(27)], "nt"),
    ("conv1d-style", lambda x, w, b: torch.addmm(b, x, w), [_r(16, 64), _r(64, 192), _r(192)], "nn"),
    ("nn-tails", lambda x, w: x @ w, [_r(9, 21), _r(21, 117)], "nn"),
    ("nn-narrow", lambda x, w: x @ w, [_r(5, 8), _r(8, 3)], "nn"),
    ("nn-one-column", lambda x, w: x @ w, [_r(6, 8), _r(8, 1)], "nn"),
    ("nn-transposed-a", lambda x, w: x.t() @ w, [_r(24, 10), _r(24, 80)], "nn"),
    ("nn-sliced", lambda x, w: x[1:, 2:] @ w[2:, 3:], [_r(10, 30), _r(30, 70)], "nn"),
    ("nn-decode-rows", lambda x, w, b: torch.addmm(b, x, w), [_r(1, 40), _r(40, 300), _r(300)], "nn"),
    # from FUSEG_NN_PACK_ROWS rows B's panels are copied contiguous, a block of k at a time
    ("nn-many-rows-k-blocks", lambda x, w, b: torch.addmm(b, x, w), [_r(70, 300), _r(300, 37), _r(37)], "nn"),
    ("nn-many-rows-strided-b", lambda x, w: x @ w[:, 2:], [_r(64, 20), _r(20, 50)], "nn"),
    ("nn-decode-two-rows", lambda x, w: x @ w, [_r(2, 33), _r(33, 257)], "nn"),
    ("nn-two-rows-narrow", lambda x, w: x @ w, [_r(2, 33), _r(33, 45)], "nn"),
    ("bias-matrix", lambda b, x, w: torch.addmm(b, x, w), [_r(6, 20), _r(6, 5), _r(5, 20)], "nn"),
    ("bias-column", lambda b, x, w: torch.addmm(b, x, w), [_r(6, 1), _r(6, 5), _r(5, 40)], "nn"),
    ("bias-transposed", lambda b, x, w: torch.addmm(b.t(), x, w), [_r(40, 6), _r(6, 5), _r(5, 40)], "nn"),
    ("bias-column-nt", lambda b, x, w: torch.addmm(b, x, w.t()), [_r(6, 1), _r(6, 16), _r(9, 16)], "nt"),
    ("bias-transposed-packed", lambda b, x, w: torch.addmm(b.t(), x, w.t()), [_r(40, 30), _r(30, 70), _r(40, 70)],
     "nt"),
    ("empty-k", lambda x, w, b: torch.addmm(b, x, w), [_r(4, 0), _r(0, 5), _r(5)], "nn"),
    ("empty-k-nt", lambda x, w, b: torch.addmm(b, x, w.t()), [_r(12, 0), _r(5, 0), _r(5)], "nn"),
    ("bmm-nn", lambda a, b: torch.bmm(a, b), [_r(4, 16, 16), _r(4, 16, 16)], "nn"),
    ("bmm-nt", lambda q, k: q @ k.transpose(1, 2), [_r(4, 16, 16), _r(4, 16, 16)], "nt"),
    ("bmm-heads", lambda q, k: q.view(2, 16, 4, 8).transpose(1, 2).reshape(8, 16, 8) @ k.transpose(1, 2),
     [_r(2, 16, 32), _r(8, 16, 8)], "nt"),
    ("bmm-expanded", lambda a, b: torch.bmm(a, b.expand(3, 12, 20)), [_r(3, 5, 12), _r(1, 12, 20)], "nn"),
    ("then-gelu", lambda x, w, b: F.gelu(F.linear(x, w, b)), [_r(8, 64), _r(256, 64), _r(256)], "nt"),
    ("output-viewed", lambda x, w: (x @ w).view(2, 3, 10), [_r(6, 7), _r(7, 10)], "nn"),
    # (the dtype view runs in a METADATA segment before the matmul: the kernel reads a float32 value)
    ("int8-seen-as-float", lambda x, w: x.view(torch.float32) @ w, [_r(4, 6).view(torch.int8), _r(6, 5)], "nn"),
    # what ATen's BLAS was left before the kernels were measured against it (Note [choices by measurement])
    ("large", lambda x, w: x @ w, [_r(128, 128), _r(128, 128)], "nn"),
]


@pytest.mark.parametrize("name,fn,inputs,loop", MATMULS, ids=[t[0] for t in MATMULS])
def test_matmuls_run_as_generated_kernels(name, fn, inputs, loop) -> None:
    prog = _program(fn, inputs)
    (i,) = _matmuls(prog)
    assert prog.backend_of[i] == "cpp", prog.passed_over.get(i)
    assert f"fuseg_mm_{loop}(" in prog.kernels[i].body
    tol = K_TOL.get(name, TOL)
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=tol, rtol=tol)
    assert_matches_eager(fn, inputs, prog.graph, program=prog.run_checked, atol=tol, rtol=tol)


def test_a_module_of_linears_matches_eager_under_torch_compile() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
    x = torch.randn(2, 8, 32)
    compiled = torch.compile(model, backend="fuseg")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=TOL, rtol=TOL)


def test_the_kernel_reads_the_inputs_it_is_called_with_each_time() -> None:
    fn, inputs = MATMULS[0][1], MATMULS[0][2]
    prog = _program(fn, inputs)
    for _ in range(3):
        fresh = [torch.randn_like(t) for t in inputs]
        torch.testing.assert_close(prog(*fresh)[0], fn(*fresh), atol=TOL, rtol=TOL)


# (name, program, inputs, why): matmuls the generator declines (they run on torch, as before)
DECLINED = [
    ("double", lambda x, w: x @ w, [_r(4, 5).double(), _r(5, 6).double()], "float32"),
    ("half", lambda x, w: x @ w, [_r(4, 5).half(), _r(5, 6).half()], "float32"),
    ("beta", lambda b, x, w: torch.addmm(b, x, w, beta=0.5), [_r(6), _r(4, 5), _r(5, 6)], "beta = 0.5"),
    ("alpha", lambda b, x, w: torch.addmm(b, x, w, alpha=2), [_r(6), _r(4, 5), _r(5, 6)], "alpha = 2"),
    ("strided-both", lambda x, w: x.t() @ w.t(), [_r(5, 4), _r(6, 5)], "contiguous"),
    ("columns-of-b", lambda x, w: x @ w[:, ::2], [_r(4, 5), _r(5, 12)], "contiguous"),
]


@pytest.mark.parametrize("name,fn,inputs,why", DECLINED, ids=[t[0] for t in DECLINED])
def test_matmuls_the_generator_declines_run_on_torch_with_the_reason(name, fn, inputs, why) -> None:
    prog = _program(fn, inputs)
    (i,) = _matmuls(prog)
    assert prog.backend_of[i] == "torch"
    assert why in dict(prog.passed_over[i])["cpp"]
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=0, rtol=0)


def test_the_torch_backend_still_runs_matmuls_on_aten() -> None:
    fn, inputs = MATMULS[0][1], MATMULS[0][2]
    prog = _program(fn, inputs, backend="torch")
    assert prog.kernels == {}
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=0, rtol=0)


def _linear_segment(fn, inputs):
    graph = capture(fn, inputs)
    plan = apply_aliases(segment(graph), "post")
    (seg,) = [s for s in plan.segments if s.kind == SegmentKind.MATMUL]
    return graph, seg


def test_a_recorded_view_layout_is_not_believed() -> None:
    """See Note [checked source values]: the permute inside the segment is recorded with the strides
    of a weight that is not transposed; the kernel reads through torch's strides (the transpose),
    so the program still computes eager's values."""
    fn, inputs = MATMULS[0][1], MATMULS[0][2]
    graph = capture(fn, inputs)
    node = next(n for n in graph.nodes if n.op == "aten.permute.default")
    lying = dataclasses.replace(node.metas[0], stride=(64, 1))
    graph = dataclasses.replace(graph, nodes=tuple(dataclasses.replace(n, metas=(lying,)) if n is node else n
                                                   for n in graph.nodes))
    prog = runtime.compile(apply_aliases(segment(graph), "post"))
    (i,) = _matmuls(prog)
    if prog.backend_of[i] == "cpp":
        assert "fuseg_mm_nt(" in prog.kernels[i].body  # torch's transpose, not the recorded rows
    torch.testing.assert_close(prog(*inputs)[0], fn(*inputs), atol=TOL, rtol=TOL)


def test_a_recorded_product_shape_that_contradicts_the_op_is_declined() -> None:
    fn, inputs = MATMULS[1][1], MATMULS[1][2]
    graph, seg = _linear_segment(fn, inputs)
    node = next(n for n in seg.nodes if n.op in gemm.MATMULS)
    lying = dataclasses.replace(node.metas[0], shape=(16, 64), stride=(64, 1))
    seg = dataclasses.replace(seg, nodes=tuple(dataclasses.replace(n, metas=(lying,)) if n is node else n
                                               for n in seg.nodes))
    with pytest.raises(Declined, match="torch computes"):
        gemm.matmul_kernel(graph, seg, {})


def test_an_operand_past_its_inputs_planned_extent_is_declined(monkeypatch) -> None:
    """The operand's layout must lie inside its input's planned extent (which the program checks
    against the storage on every call): a view whose meta reached further is not read."""
    fn, inputs = MATMULS[1][1], MATMULS[1][2]
    graph, seg = _linear_segment(fn, inputs)
    gemm.matmul_kernel(graph, seg, {})  # taken as computed
    real = gemm.check_segment_metas

    def shifted(graph, seg, layouts):
        env = real(graph, seg, layouts)
        t = env["permute"]
        env["permute"] = torch.empty(t.numel() + 1, device="meta").as_strided(t.shape, t.stride(), 1)  # one further
        return env

    monkeypatch.setattr(gemm, "check_segment_metas", shifted)
    with pytest.raises(Declined, match="past the planned extent"):
        gemm.matmul_kernel(graph, seg, {})


def test_an_input_of_another_dtype_viewed_inside_the_segment_is_declined() -> None:
    """Our segmenter leaves a dtype view out of a MATMUL segment; a segment holding one (a graph
    file's, another partitioner's) would hand the kernel an int8 input as a float32 parameter,
    its layout counted in the wrong elements: declined."""
    fn = lambda x, w: x.view(torch.float32) @ w  # noqa: E731
    graph = capture(fn, [_r(4, 6).view(torch.int8), _r(6, 5)])
    view, mm = apply_aliases(segment(graph), "post").segments
    assert view.kind == SegmentKind.METADATA and mm.kind == SegmentKind.MATMUL
    merged = dataclasses.replace(mm, nodes=(*view.nodes, *mm.nodes), inputs=(*view.inputs, "w"))
    with pytest.raises(Declined, match="int8, seen as float32"):
        gemm.matmul_kernel(graph, merged, {})


@st.composite
def _products(draw):
    """A float32 mm, addmm or bmm of small random sizes whose operands are each contiguous, a
    transpose or a slice at an offset: a product eager computes."""
    op = draw(st.sampled_from(["mm", "addmm", "bmm"]))
    m, k, n = (draw(st.integers(0, 40)) for _ in range(3))
    batch = draw(st.integers(1, 3)) if op == "bmm" else None

    def operand(rows, cols):
        how = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
        lead = (batch,) if batch else ()
        if how == "transposed":
            return torch.randn(*lead, cols, rows).transpose(-1, -2)
        if how == "sliced":
            return torch.randn(*lead, rows + 2, cols + 3)[..., 1:rows + 1, 3:]
        return torch.randn(*lead, rows, cols)

    a, b = operand(m, k), operand(k, n)
    if op == "bmm":
        return torch.bmm, [a, b]
    if op == "mm":
        return torch.mm, [a, b]
    bias = draw(st.sampled_from([(n,), (m, n), (m, 1), (1, n)]))
    return (lambda x, y, z: torch.addmm(z, x, y)), [a, b, torch.randn(*bias)]


@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_products())
def test_random_products_match_eager(drawn) -> None:
    """Whatever each product's layouts, it matches eager; it runs as a kernel unless its layouts
    are ones the kernel does not read."""
    fn, inputs = drawn
    prog = _program(fn, inputs)
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=TOL, rtol=TOL)
    (i,) = _matmuls(prog)
    if prog.backend_of[i] != "cpp":  # the one reason a product of these sizes and dtype is left to ATen
        assert "contiguous along" in dict(prog.passed_over[i])["cpp"], prog.passed_over[i]


def _innermost_loops(function: list[str]) -> list[list[str]]:
    """The innermost loops of a disassembled function: the instructions from a backward branch's
    target to the branch, where no other backward branch lies in between."""
    import re

    addr = [int(m.group(1), 16) if (m := re.match(r"\s*([0-9a-f]+):", line)) else None for line in function]
    loops = []
    for i, line in enumerate(function):
        m = re.search(r"\tj\w+\s+([0-9a-f]+) <", line)
        if m and addr[i] is not None and int(m.group(1), 16) <= addr[i]:
            start = next((j for j in range(i + 1) if addr[j] == int(m.group(1), 16)), None)
            if start is not None:
                loops.append((start, i))
    return [function[s:e + 1] for s, e in loops if not any(s < s2 and e2 < e or s <= s2 and e2 < e for s2, e2 in loops)]


def test_the_register_tiles_keep_their_accumulators_in_registers() -> None:
    """Note [register tiles] (runtime/codegen/source/gemm_prelude.py): in the matmul library built for
    this machine (Note [one matmul library]), where sizes are only known at run time, every tile
    routine's inner loop of multiply-adds moves no vector register through stack memory (the old
    16-float tiles, on an AVX2 machine, moved their accumulators through the stack on every step of
    k). A pointer may be reloaded from the stack: a 1 x 16 dot tile reads 17 rows, past the 15
    general registers (g++ 12.2 with -march=native on an Intel Xeon tuned as rocketlake reloads six
    column pointers a step; an L1 load each, no accumulator touched)."""
    import platform
    import shutil
    import subprocess

    from runtime.codegen import gemm_library
    from runtime.machine.compiler import cpu_compiler

    objdump = shutil.which("objdump")
    if objdump is None or cpu_compiler() is None or platform.machine() != "x86_64":
        pytest.skip("needs objdump, a C++ compiler and an x86-64 CPU")
    dis = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", gemm_library.ensure()], capture_output=True,
                         text=True, check=True).stdout
    tiles = {}
    for block in dis.split("\n\n"):
        head = block.strip().splitlines()[0] if block.strip() else ""
        if "fuseg_nn_tile<" in head or "fuseg_nt_tile<" in head:
            tiles[head] = [loop for loop in _innermost_loops(block.splitlines())
                           if sum("vfmadd" in line or "vmulps" in line for line in loop) >= 4]
    assert any("fuseg_nn_tile<" in h for h in tiles) and any("fuseg_nt_tile<" in h for h in tiles), list(tiles)
    for head, loops in tiles.items():
        assert loops, f"no loop of multiply-adds in {head}"
        for loop in loops:
            stack = [line for line in loop if ("(%rsp" in line or "(%rbp" in line) and "mm" in line.split("\t")[-1]]
            assert not stack, f"{head}: stack traffic in the inner loop:\n" + "\n".join(stack)
