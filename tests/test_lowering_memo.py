"""See Note [lowering memo]: segments of one structure are lowered once per program, and only
segments whose kernels are the same share one."""

from __future__ import annotations

import torch

import runtime
from alias import apply_aliases
from runtime.backends.base import BuildContext
from runtime.codegen.memo import lower_memo, segment_key
from segmenter import SegmentKind, capture, segment

from .util import assert_matches_eager


def _plan(fn, inputs):
    return apply_aliases(segment(capture(fn, inputs)), "post")


def _kernel_segments(plan):
    return [s for s in plan.segments if s.kind == SegmentKind.POINTWISE]


def _layers(x, y, z):  # three pointwise layers over three inputs: three segments, no common input
    return (torch.relu(x * 2 + 1), torch.relu(y * 2 + 1), torch.relu(z * 2 + 1))


def test_repeated_segments_share_one_lowered_kernel() -> None:
    inputs = [torch.randn(8, 16) for _ in range(3)]
    plan = _plan(_layers, inputs)
    assert len(_kernel_segments(plan)) == 3
    prog = runtime.compile(plan, backend="cpp")
    kernels = prog.kernels
    assert len(kernels) == 3
    assert len({k.name for k in kernels.values()}) == 1
    assert len(prog.ctx.kernel_memo) == 1
    # each launch reads and writes its own values
    reads = [tuple(p.value for p in k.params) for k in kernels.values()]
    assert len(set(reads)) == 3
    assert_matches_eager(_layers, inputs, plan.graph, program=prog)


def test_literals_of_equal_value_but_other_type_or_sign_are_other_kernels() -> None:
    def f(x, y, z, w):
        return x * 0.0, y * -0.0, z + 1, w + True

    inputs = [torch.rand(4, 8) + 1 for _ in range(4)]
    inputs[3] = torch.randint(0, 5, (4, 8))
    inputs[2] = torch.randint(0, 5, (4, 8))
    plan = _plan(f, inputs)
    prog = runtime.compile(plan, backend="cpp")
    names = [k.name for k in prog.kernels.values()]
    assert len(names) == 4
    assert names[0] != names[1]  # 0.0 and -0.0
    out = prog(*inputs)
    assert not torch.signbit(out[0]).any() and torch.signbit(out[1]).all()
    assert_matches_eager(f, inputs, plan.graph, program=prog)


def test_inputs_in_other_layouts_are_other_kernels() -> None:
    def f(x, y):
        return torch.relu(x * 2 + 1), torch.relu(y * 2 + 1)

    x = torch.randn(8, 16)
    y = torch.randn(16, 8).t()  # same shape, transposed strides
    plan = _plan(f, [x, y])
    prog = runtime.compile(plan, backend="cpp")
    segs = _kernel_segments(plan)
    keys = [segment_key(plan.graph, s, {v: (plan.graph.metas[v].shape, plan.graph.metas[v].stride)
                                        for v in (*s.inputs, *s.outputs)}) for s in segs]
    assert keys[0] is not None and keys[0] != keys[1]
    assert len(prog.ctx.kernel_memo) == 2
    assert_matches_eager(f, [x, y], plan.graph, program=prog)


def test_segments_writing_an_input_in_place_are_never_memoized() -> None:
    inputs = [torch.randn(8, 16) for _ in range(3)]
    plan = _plan(_layers, inputs)
    seg = _kernel_segments(plan)[0]
    memo: dict = {}
    g = plan.graph
    lay = {v: (g.metas[v].shape, g.metas[v].stride) for v in (*seg.inputs, *seg.outputs)}
    lower_memo(memo, g, seg, lay)
    assert len(memo) == 1
    memo.clear()
    # an in-place target (whatever it is) keeps the segment out of the memo: its lowering reads
    # which values are views of the target, a fact of the whole graph
    try:
        lower_memo(memo, g, seg, lay, in_place={seg.nodes[-1].name: g.input_names[0]})
    except Exception:  # noqa: BLE001 - declining is fine here: only the memo is looked at
        pass
    assert memo == {}
    assert isinstance(BuildContext(g, {}, frozenset(), torch.device("cpu")).kernel_memo, dict)


def test_a_matmul_segment_never_reaches_the_lowering_memo(monkeypatch) -> None:
    """MATMUL (and OPAQUE) segments never reach the lowering memo (keying them cost ~0.7 s at 100k
    nodes, only to decline them); the cpp backend's matmul kernels are built apart from it."""
    import torch

    import runtime
    import runtime.backends.kernels as kernels
    from alias import apply_aliases
    from segmenter import SegmentKind, capture, segment

    keyed = []
    real = kernels.lower_memo
    monkeypatch.setattr(kernels, "lower_memo", lambda memo, graph, seg, *a: keyed.append(seg.kind) or real(memo, graph, seg, *a))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    prog = runtime.compile(apply_aliases(segment(capture(lambda x, w: (x @ w).relu() + 1, [x, w])), "post"), backend="cpp")
    matmuls = [s.index for s in prog.plan.segments if s.kind == SegmentKind.MATMUL]
    # (the cpp backend builds its matmul kernel apart from the lowering: Note [matmul kernels])
    assert matmuls and all(prog.kernels[i].name.startswith("fuseg_matmul_") for i in matmuls)
    assert SegmentKind.MATMUL not in keyed and keyed  # the pointwise segment was still lowered
    torch.testing.assert_close(prog(x, w)[0], (x @ w).relu() + 1)
