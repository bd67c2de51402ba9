"""The alias pass: tables of programs with the kernels, metadata ops and aliasing each mode gives,
run through the runtime against eager in every mode."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import runtime
from alias import MODES, apply_aliases, check
from perf import zoo
from segmenter import SegmentedFusion, SegmenterOptions, SegmentKind, capture, segment
from segmenter.capturing.from_torch import bind_inputs

from .util import assert_matches_eager

ONE_OP = SegmenterOptions(max_ops_per_segment=1)


def _plan(fn, inputs, mode: str, options: SegmenterOptions | None = None) -> tuple[SegmentedFusion, SegmentedFusion]:
    sf = segment(capture(fn, inputs), options)
    plan = apply_aliases(sf, mode)
    assert check(sf, plan) == []
    return sf, plan


def _expanded_view_output(a):
    return (a + 1).expand(4, a.shape[0])


def _strided_read(x):
    return x[1:].t() * 2


def _mutate_through_view(a):
    b = a * 2
    c = b[:]
    c.tanh_()
    return a * b


def _mutate_input_and_view(x):
    x.add_(1).sin_().mul_(5)
    return x.sum()


def _attention_output_and_its_view(q, k, v):  # AOTAutograd's training forward: the output, detached for backward
    o = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]
    return o.detach(), o.transpose(1, 2).reshape(8, 32)


def _attention_inputs() -> list[torch.Tensor]:
    return [torch.randn(1, 8, 4, 8).transpose(1, 2), torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)]


# name, program, inputs, options, {mode: (kernels, metadata)}
TABLE = [
    # two outputs that are views of one intermediate, the second recorded as a view of the first:
    # post makes both views (eager's sharing), where it copied the first and then rebuilt the
    # pair's storage at every call (segmenter/capturing/reference.py, _rebase_output_views)
    ("views-of-an-opaque-result-share-it", _attention_output_and_its_view, _attention_inputs, None,
     {"off": (2, 0), "pre": (2, 0), "post": (0, 2)}),
    ("clone-stays-a-copy", lambda x: x.clone(), lambda: [torch.randn(4, 6)], None,
     {"off": (1, 0), "pre": (1, 0), "post": (1, 0)}),
    ("view-of-input-is-metadata", lambda x: x.view(-1), lambda: [torch.randn(4, 6)], None,
     {"off": (1, 0), "pre": (0, 1), "post": (0, 1)}),
    ("slice-t-read-strided", _strided_read, lambda: [torch.randn(5, 6)], ONE_OP,
     {"off": (3, 0), "pre": (3, 0), "post": (1, 2)}),
    ("reshape-of-expand-is-a-copy", lambda x: x.unsqueeze(0).expand(3, 2, 4).reshape(-1) + 1,
     lambda: [torch.randn(2, 4)], ONE_OP, {"off": (5, 0), "pre": (5, 0), "post": (2, 3)}),
    ("expanded-output-stays-stride-0", _expanded_view_output, lambda: [torch.randn(6)], None,
     {"off": (1, 0), "pre": (1, 0), "post": (1, 1)}),
    ("mutation-through-a-view-of-an-intermediate", _mutate_through_view, lambda: [torch.randn(3, 4)], None,
     {"off": (1, 0), "pre": (1, 0), "post": (1, 0)}),
    ("inplace-chain-on-input", _mutate_input_and_view, lambda: [torch.randn(8)], None,
     {"off": (1, 0), "pre": (1, 0), "post": (1, 0)}),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,fn,make_inputs,options,expected", TABLE, ids=[t[0] for t in TABLE])
def test_alias_table(name, fn, make_inputs, options, expected, mode) -> None:
    torch.manual_seed(0)
    inputs = make_inputs()
    sf, plan = _plan(fn, inputs, mode, options)
    stats = plan.stats()
    assert (stats["kernels"], stats["metadata"]) == expected[mode], str(plan.alias_report)
    assert all(s.bytes_moved == 0 for s in plan.segments if s.kind == SegmentKind.METADATA)
    assert_matches_eager(fn, inputs, plan.graph, program=runtime.compile(plan))


def test_expanded_output_is_a_view_of_the_kernel_buffer() -> None:
    _, plan = _plan(_expanded_view_output, [torch.randn(6)], "post")
    out = runtime.compile(plan)(torch.randn(6))[0]
    assert out.stride() == (0, 1)
    kernel = next(s for s in plan.segments if s.kind == SegmentKind.POINTWISE)
    assert kernel.bytes_written == 6 * 4  # a + 1, not the 4 x 6 expansion


def test_strided_kernel_input_is_not_materialized() -> None:
    _, plan = _plan(_strided_read, [torch.randn(5, 6)], "post", ONE_OP)
    kernel = next(s for s in plan.segments if s.kind == SegmentKind.POINTWISE)
    (v,) = kernel.inputs
    meta = plan.graph.metas[v]
    assert meta.stride == (1, 6) and meta.storage_offset == 6  # x[1:].t(), read in place
    assert kernel.bytes_read == 4 * 4 * 6


def test_seed_rope_with_a_cut_at_every_op() -> None:
    """NVIDIA/Fuser#2577: no kernel for a segment that only slices or views."""
    fn, inputs = zoo.get("rope-seed").factory()
    graph = capture(fn, inputs)
    sf = segment(graph, ONE_OP)
    plans = {mode: apply_aliases(sf, mode) for mode in MODES}
    for plan in plans.values():
        assert check(sf, plan) == []
    post = plans["post"]
    view_only = [s for s in sf.segments if all(n.op.split(".")[1] in {
        "view", "permute", "split_with_sizes", "expand", "slice", "_unsafe_view"} for n in s.nodes)]
    assert view_only, "the forced cut must leave view-only segments"
    kinds = {s.nodes[0].name: s.kind for s in post.segments}
    assert all(kinds[s.nodes[0].name] == SegmentKind.METADATA for s in view_only)
    assert post.stats()["kernels"] == sf.stats()["kernels"] - len(view_only)
    assert plans["pre"].stats()["kernels"] == sf.stats()["kernels"]  # what today's fusers pay
    assert post.stats()["bytes_moved"] < plans["pre"].stats()["bytes_moved"]
    for mode in MODES:
        assert_matches_eager(fn, inputs, graph, program=runtime.compile(plans[mode]))


@pytest.mark.parametrize("name", ["llama-tiny", "bert-tiny"])
def test_transformers_in_every_mode(name: str) -> None:
    model, inputs = zoo.get(name).factory()
    graph = capture(model, inputs)
    sf = segment(graph)
    for mode in MODES:
        plan = apply_aliases(sf, mode)
        assert check(sf, plan) == []
        with torch.no_grad():
            assert_matches_eager(model, inputs, graph, module=model, program=runtime.compile(plan), atol=1e-4, rtol=1e-4)


def test_batch_norm_running_stats_through_the_runtime() -> None:
    bn = torch.nn.BatchNorm1d(4).train()
    x = torch.randn(8, 4)
    graph = capture(copy.deepcopy(bn), [x])
    eager_bn, ours = copy.deepcopy(bn), copy.deepcopy(bn)
    expected = eager_bn(x)
    plan = apply_aliases(segment(graph), "post")
    (got,) = runtime.compile(plan)(*bind_inputs(graph, ours, [x]))
    torch.testing.assert_close(got, expected)
    for name, buf in eager_bn.named_buffers():
        torch.testing.assert_close(ours.get_buffer(name), buf, msg=name)


def test_idempotent() -> None:
    fn, inputs = zoo.get("rope-seed").factory()
    sf = segment(capture(fn, inputs), ONE_OP)
    for mode in MODES:
        once = apply_aliases(sf, mode)
        assert apply_aliases(once, mode) == once


def test_modes_do_not_mix() -> None:
    sf = segment(capture(lambda x: x.view(-1), [torch.randn(3, 2)]))
    with pytest.raises(ValueError, match="already went through"):
        apply_aliases(apply_aliases(sf, "post"), "pre")
    with pytest.raises(ValueError, match="must be one of"):
        apply_aliases(sf, "sideways")  # type: ignore[arg-type]


# -- the checker rejects planted violations ---------------------------------------------------------

def _retag(plan: SegmentedFusion, index: int, kind: SegmentKind) -> SegmentedFusion:
    segs = list(plan.segments)
    segs[index] = dataclasses.replace(segs[index], kind=kind)
    return dataclasses.replace(plan, segments=tuple(segs))


def test_checker_rejects_a_clone_output_aliasing_its_input() -> None:
    sf, plan = _plan(lambda x: x.clone(), [torch.randn(3)], "post")
    bad = _retag(plan, 0, SegmentKind.METADATA)
    problems = check(sf, bad)
    assert any("not a view" in p for p in problems)


def test_checker_rejects_a_view_output_that_would_alias_an_input() -> None:
    sf, plan = _plan(lambda x: x.t().contiguous().view(-1), [torch.randn(3, 2)], "post", ONE_OP)
    bad_graph = dataclasses.replace(plan.graph, nodes=plan.graph.nodes)
    bad = dataclasses.replace(plan, graph=bad_graph)
    bad = _retag(bad, [s.kind for s in bad.segments].index(SegmentKind.POINTWISE), SegmentKind.METADATA)
    assert any("alias an input" in p or "not a view" in p for p in check(sf, bad))


def test_checker_rejects_a_missing_write_back() -> None:
    sf, plan = _plan(_mutate_input_and_view, [torch.randn(4)], "post")
    bad = dataclasses.replace(plan, graph=dataclasses.replace(plan.graph, mutations=()))
    assert any("write-backs differ" in p for p in check(sf, bad))


def test_checker_rejects_a_materialized_view_output() -> None:
    sf, plan = _plan(lambda x: x.view(-1), [torch.randn(3, 2)], "post")
    bad = dataclasses.replace(plan, graph=dataclasses.replace(plan.graph, output_aliases=(None,)))
    assert any("output aliasing differs" in p for p in check(sf, bad))


# -- copy elision -------------------------------------------------------------------------------------

def _copy_then_matmul(x, w):
    return x.t().contiguous() @ w


def _copy_then_view(x):
    return x.t().contiguous().view(-1) * 2


def _copy_then_pointwise(x):
    return (x.t().contiguous() + 1).sum(0)


@pytest.mark.parametrize("options", [None, ONE_OP], ids=["default", "every-op"])
def test_copy_feeding_a_matmul_is_elided(options) -> None:
    inputs = [torch.randn(8, 4), torch.randn(8, 8)]
    sf, plan = _plan(_copy_then_matmul, inputs, "post", options)
    assert [v for v, _ in plan.alias_report.copies_elided] == ["clone"]
    assert plan.stats()["kernels"] == 1 < apply_aliases(sf, "pre").stats()["kernels"]
    assert apply_aliases(plan, "post") == plan
    assert_matches_eager(_copy_then_matmul, inputs, plan.graph, program=runtime.compile(plan))


@pytest.mark.parametrize(
    "fn,why", [(_copy_then_view, "a view after it needs the contiguous layout"),
               (_copy_then_pointwise, "the add's output would change layout")],
)
def test_copies_that_matter_are_kept(fn, why) -> None:
    inputs = [torch.randn(5, 6)]
    _, plan = _plan(fn, inputs, "post", ONE_OP)
    assert plan.alias_report.copies_elided == (), why
    assert_matches_eager(fn, inputs, plan.graph, program=runtime.compile(plan))


# -- write-back straight into the input ------------------------------------------------------------

class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _chain_inplace(x):
    x.add_(1).sin_().mul_(5)


def _clone_copy_back(x):
    y = x.clone()
    x.copy_(y)
    return y


def _read_before_write(x):
    a = x * 3
    x.add_(1)
    return a


@pytest.mark.parametrize(
    "fn,in_place,why",
    [
        (_chain_inplace, True, None),
        (_read_before_write, True, None),
        (_clone_copy_back, True, None),  # y stays its own buffer; only x's write is in place
    ],
    ids=["add-sin-mul-chain", "read-before-write", "clone-copied-back"],
)
def test_final_value_written_straight_into_the_input(fn, in_place, why) -> None:
    x = torch.randn(4, 4)
    _, plan = _plan(fn, [x], "post")
    program = runtime.compile(plan)
    assert bool(program.written_in_place) == in_place, program.copy_write_backs
    if why is not None:
        assert why in program.copy_write_backs[0]
    assert_matches_eager(fn, [x], plan.graph, program=program)
    if fn is _chain_inplace:
        assert plan.stats()["kernels"] == 1
        log = _OpLog()
        with log:
            program(x.clone())
        assert not any("copy" in op for op in log.ops), log.ops  # one kernel and no copy


def test_old_value_read_after_the_write_keeps_the_copy() -> None:
    from segmenter import FusionGraph, GraphInput, Mutation, Node, TensorMeta, ValueRef
    from segmenter.capturing.reference import run_graph

    m = TensorMeta((6,), (1,), 0, torch.float32)
    graph = FusionGraph(  # the new value is made first, the old one read after it
        inputs=(GraphInput("x", m),),
        nodes=(Node("new", "aten.add.Tensor", (ValueRef("x"), 1), (), ("new",), (m,)),
               Node("old2", "aten.mul.Tensor", (ValueRef("x"), 2), (), ("old2",), (m,))),
        outputs=("old2",), mutations=(Mutation(0, "new"),),
    )
    program = runtime.compile(apply_aliases(segment(graph, ONE_OP), "post"))
    assert program.written_in_place == frozenset() and "read after" in program.copy_write_backs[0]
    x = torch.randn(6)
    a, b = x.clone(), x.clone()
    torch.testing.assert_close(program(a)[0], run_graph(graph, [b])[0])
    torch.testing.assert_close(a, b)


def test_compile_refuses_a_plan_the_checker_rejects() -> None:
    """A plan that alias.check rejects must never run (issue 15): runtime.compile checks the
    structure (linear time) and refuses, naming what is wrong."""
    from alias import PlanError

    sf, plan = _plan(lambda x: x.clone(), [torch.randn(3)], "post")
    bad = _retag(plan, 0, SegmentKind.METADATA)  # the clone "becomes" a view of its input
    assert check(sf, bad)
    with pytest.raises(PlanError, match="not a view"):
        runtime.compile(bad)
    sf, plan = _plan(_mutate_input_and_view, [torch.randn(4)], "post")
    segs = plan.segments
    dropped = dataclasses.replace(plan, segments=segs[:-1]) if len(segs) > 1 else dataclasses.replace(
        plan, segments=(dataclasses.replace(segs[0], nodes=segs[0].nodes[:-1]),))
    with pytest.raises(PlanError, match="no segment|never produced"):
        runtime.compile(dropped)


def _view_chain_output(x):
    return x[1:, ::2].t()


def test_pre_mode_view_chain_cut_at_every_op() -> None:
    """pre hands values between launches over as contiguous copies: a view output whose chain
    starts at such a copy cannot be made with the recorded strides (it crashed in as_strided)."""
    inputs = [torch.randn(3, 4)]
    for mode in MODES:
        _, plan = _plan(_view_chain_output, inputs, mode, ONE_OP)
        assert_matches_eager(_view_chain_output, inputs, plan.graph, program=runtime.compile(plan))


def test_view_kind_ops_the_algebra_does_not_model_stay_kernels() -> None:
    """``contiguous`` has a view schema but copies when its input is not contiguous: from a JSON
    graph it became a metadata op reading the transposed storage as contiguous (wrong values)."""
    from segmenter import FusionGraph, GraphInput, Node, TensorMeta, ValueRef
    from segmenter.capturing.reference import run_graph

    xt = TensorMeta((3, 4), (1, 3), 0, torch.float32)
    out = TensorMeta((3, 4), (4, 1), 0, torch.float32)
    graph = FusionGraph(inputs=(GraphInput("x", xt),),
                        nodes=(Node("c", "aten.contiguous.default", (ValueRef("x"),), (), ("c",), (out,)),
                               Node("y", "aten.add.Tensor", (ValueRef("c"), 1), (), ("y",), (out,))),
                        outputs=("y",))
    for options in (None, ONE_OP):
        sf = segment(graph, options)
        for mode in MODES:
            plan = apply_aliases(sf, mode)
            assert check(sf, plan) == []
            assert plan.stats()["metadata"] == 0
            x = torch.randn(4, 3).t()
            torch.testing.assert_close(runtime.compile(plan)(x)[0], run_graph(graph, [x.clone()])[0])
            torch.testing.assert_close(runtime.compile(plan)(x)[0], x + 1)


def _circular_pad(x):
    return torch.nn.functional.pad(x, (1, 2), mode="circular")


def test_checker_agrees_with_itself_on_copy_offsets() -> None:
    """aten.copy of a slice returns a fresh tensor at its self's offset; torch's FakeTensor cache
    said offset 0 on a second propagation, and the checker flagged correct plans (issue 15)."""
    inputs = [torch.randn(2, 3, 5)]
    for _ in range(2):  # the second capture and check run with the cache warm
        sf, plan = _plan(_circular_pad, inputs, "post")
        assert check(sf, plan) == []
    assert_matches_eager(_circular_pad, inputs, plan.graph, program=runtime.compile(plan))
    inorm = torch.nn.InstanceNorm1d(3)
    sf, plan = _plan(inorm, [torch.randn(2, 3, 5)], "post")
    assert check(sf, plan) == []


def test_unread_views_of_views_made_after_the_kernel_come_after_it() -> None:
    """Found by the fuzzer (tests/test_fuzz_regressions.py): post put an unread view of a view
    of the kernel's value into the kernel, which runs before that view is made ("s0 reads %v
    before it is made"): the plan was refused. An unread true view goes with the metadata after
    the kernel; an unread op of view kind that is not a true view (``contiguous``) runs on its
    own after them."""
    from segmenter import FusionGraph, GraphInput, Node, TensorMeta, ValueRef

    row = TensorMeta((3, 4), (4, 1), 0, torch.float32)
    flat = TensorMeta((12,), (1,), 0, torch.float32)
    col = TensorMeta((4, 3), (1, 4), 0, torch.float32)
    graph = FusionGraph(
        inputs=(GraphInput("x", row),),
        nodes=(Node("y", "aten.add.Tensor", (ValueRef("x"), 1), (), ("y",), (row,)),
               Node("v", "aten.view.default", (ValueRef("y"), (12,)), (), ("v",), (flat,)),
               Node("d2", "aten.view.default", (ValueRef("v"), (3, 4)), (), ("d2",), (row,)),
               Node("d4", "aten.t.default", (ValueRef("d2"),), (), ("d4",), (col,)),
               Node("d5", "aten.contiguous.default", (ValueRef("d4"),), (), ("d5",),
                    (TensorMeta((4, 3), (3, 1), 0, torch.float32),))),
        outputs=("v",))
    sf = segment(graph)
    plan = apply_aliases(sf, "post")
    assert check(sf, plan) == []
    where = {n.name: seg.kind for seg in plan.segments for n in seg.nodes}
    assert where["v"] == where["d2"] == where["d4"] == SegmentKind.METADATA
    assert where["y"] == SegmentKind.POINTWISE and where["d5"] == SegmentKind.OPAQUE
    x = torch.randn(3, 4)
    (got,) = runtime.compile(plan)(x)
    torch.testing.assert_close(got, (x + 1).view(12))
