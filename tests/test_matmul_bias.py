"""Note [a matmul's bias after it] (segmenter/partition/matmul_bias.py): which addmm's bias moves after a
plain mm, where it lands in the segments, and that the rewritten program matches eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from segmenter import SegmenterOptions, SegmentKind, capture, segment
from segmenter.partition.matmul_bias import split_matmul_bias

from .util import assert_matches_eager

FORCE = SegmenterOptions(bias_after_matmul=True)


def _ops(graph) -> list[str]:
    return [n.op for n in graph.nodes]


# (name, fn, inputs at a number of rows, split with force=True)
CASES = [
    ("linear", lambda x, w, b: F.linear(x, w, b), lambda r: [torch.randn(r, 8), torch.randn(5, 8), torch.randn(5)], True),
    ("beta 2", lambda b, x, w: torch.addmm(b, x, w, beta=2), lambda r: [torch.randn(5), torch.randn(r, 8), torch.randn(8, 5)],
     False),
    ("alpha 0.5", lambda b, x, w: torch.addmm(b, x, w, alpha=0.5),
     lambda r: [torch.randn(5), torch.randn(r, 8), torch.randn(8, 5)], False),
    ("2-D bias", lambda b, x, w: torch.addmm(b, x, w), lambda r: [torch.randn(r, 5), torch.randn(r, 8), torch.randn(8, 5)],
     False),
    ("row of 1", lambda b, x, w: torch.addmm(b, x, w), lambda r: [torch.randn(1, 5), torch.randn(r, 8), torch.randn(8, 5)],
     False),
    ("float64", lambda x, w, b: F.linear(x, w, b),
     lambda r: [torch.randn(r, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64),
                torch.randn(5, dtype=torch.float64)], False),
    ("no bias", lambda x, w: F.linear(x, w), lambda r: [torch.randn(r, 8), torch.randn(5, 8)], False),
]


@pytest.mark.parametrize("rows", [6, 11])
@pytest.mark.parametrize("name,fn,make,split", CASES, ids=[c[0] for c in CASES])
def test_which_addmm_is_split(name, fn, make, split, rows) -> None:
    inputs = make(rows)
    graph = capture(fn, inputs)
    after = split_matmul_bias(graph, force=True)
    if split:
        assert "aten.addmm.default" in _ops(graph)
        assert _ops(after).count("aten.mm.default") == 1 and "aten.addmm.default" not in _ops(after)
        add = next(n for n in after.nodes if n.op == "aten.add.Tensor")
        assert add.outputs == next(n for n in graph.nodes if n.op == "aten.addmm.default").outputs
    else:
        assert after is graph, name
    assert_matches_eager(fn, inputs, after, atol=1e-5, rtol=1e-5)
    prog = runtime.compile(apply_aliases(segment(capture(fn, inputs), FORCE), "post"), backend="auto")
    assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-5, rtol=1e-5)


def test_the_default_leaves_a_cpu_graph_alone() -> None:
    """None (the default) splits only float32 on CUDA: the CPU's generated GEMM adds its bias itself."""
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    inputs = [torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)]
    plan = segment(capture(fn, inputs))
    assert "aten.addmm.default" in _ops(plan.graph)
    assert split_matmul_bias(capture(fn, inputs)) is not None
    off = segment(capture(fn, inputs), SegmenterOptions(bias_after_matmul=False))
    assert "aten.addmm.default" in _ops(off.graph)


def test_a_name_taken_gets_another() -> None:
    fn = lambda x, w, b: F.linear(x, w, b)  # noqa: E731
    graph = capture(fn, [torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)])
    addmm = next(n for n in graph.nodes if n.op == "aten.addmm.default")
    once = split_matmul_bias(graph, force=True)
    assert f"{addmm.outputs[0]}_mm" in {n.name for n in once.nodes}
    # a graph that already has that name (the rewrite run on its own output changes nothing more)
    assert split_matmul_bias(once, force=True) is once


def _mlp(x, w1, b1, w2, b2, g, beta):
    h = F.gelu(F.linear(x, w1, b1))
    return F.layer_norm(F.linear(h, w2, b2) + x, (x.shape[-1],), g, beta)


def _mlp_inputs(rows: int) -> list[torch.Tensor]:
    return [torch.randn(rows, 16), torch.randn(32, 16), torch.randn(32), torch.randn(16, 32), torch.randn(16),
            torch.randn(16), torch.randn(16)]


@pytest.mark.parametrize("rows", [6, 9])
def test_the_bias_joins_the_kernel_after_the_product_and_matches_eager(rows: int) -> None:
    """Linear -> GELU -> Linear -> residual + layer norm: each bias is added in the kernel that
    reads its product (the GELU's pointwise kernel, the layer norm's), two shapes."""
    inputs = _mlp_inputs(rows)
    plan = apply_aliases(segment(capture(_mlp, inputs), FORCE), "post")
    kinds = [s.kind for s in plan.segments]
    assert kinds.count(SegmentKind.MATMUL) == 2
    matmuls = [s for s in plan.segments if s.kind == SegmentKind.MATMUL]
    assert all("aten.addmm.default" not in {n.op for n in s.nodes} for s in matmuls)
    adds = [s for s in plan.segments if "aten.add.Tensor" in {n.op for n in s.nodes}]
    assert {s.kind for s in adds} <= {SegmentKind.POINTWISE, SegmentKind.NORMALIZATION}
    assert len(plan.segments) == 4, [str(s.kind) for s in plan.segments]
    prog = runtime.compile(plan, backend="auto")
    assert_matches_eager(_mlp, inputs, prog.graph, program=prog, atol=1e-5, rtol=1e-5)


def test_a_compiler_told_so_by_the_environment_keeps_the_bias(monkeypatch) -> None:
    """FUSEG_BIAS_AFTER_MATMUL=0: the before of the measurement (perf/gpu_validate.sh)."""
    from runtime.dynamo import FusegCompiler

    monkeypatch.setenv("FUSEG_BIAS_AFTER_MATMUL", "0")
    assert FusegCompiler().options.bias_after_matmul is False
    monkeypatch.delenv("FUSEG_BIAS_AFTER_MATMUL")
    assert FusegCompiler().options.bias_after_matmul is None
