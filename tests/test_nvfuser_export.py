"""Segments written back as nvFuser FusionDefinition scripts (runtime/nvfuser_export.py).

nvFuser does not run here, so the scripts are checked the two ways that need none: each kernel
segment's script, read back by segmenter.from_nvfuser, is the segment (the same ops once
layout-only copies and views are set aside, the same values on random inputs as the segment run
on the torch backend); and the file's run(inputs), with each fusion executed by reading its script
back, gives the program's values, views and write-backs.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections import Counter

import pytest
import torch

import runtime
from alias import apply_aliases
from perf.tools.run import random_inputs
from runtime.nvfuser_export import defined_strides, export_nvfuser, packed_strides, segment_graph
from segmenter import OpKind, SegmentedFusion, TensorMeta, capture, from_nvfuser, op_info, read_nvfuser, segment
from segmenter.capturing.meta import propagate_metas
from segmenter.capturing.reference import run_graph
from segmenter.ir.symbolic import size_hint

from .test_nvfuser_import import fusion
from .util import assert_matches_eager

# Ops whose lowering is a decomposition: what the read-back graph holds in their place.
_EXPANDS = {"aten.mean.dim": ("aten.sum.dim_IntList", "aten.div.Tensor"),
            "aten._softmax.default": ("aten.amax.default", "aten.sub.Tensor", "aten.exp.default",
                                      "aten.sum.dim_IntList", "aten.exp.default", "aten.div.Tensor")}


def normalized_ops(graph, nodes) -> Counter:
    """The compute a segment does: views and layout-only copies (clone, a cast to the value's own
    dtype, a 0-dim scalar tensor) set aside, decomposed ops expanded."""
    out: Counter = Counter()
    for n in nodes:
        if op_info(n.op).kind == OpKind.VIEW or n.op in ("aten.clone.default", "aten.scalar_tensor.default"):
            continue
        if n.op == "aten._to_copy.default" and graph.metas[n.args[0].name].dtype == n.metas[0].dtype:
            continue
        if n.op == "aten.native_layer_norm.default":  # var_mean, then (x - mean) * rsqrt(var + eps) * w + b
            out.update(["aten.var_mean.correction", "aten.add.Tensor", "aten.rsqrt.default", "aten.sub.Tensor",
                        "aten.mul.Tensor"])
            out.update(["aten.mul.Tensor"] * (len(n.args) > 2 and n.args[2] is not None))
            out.update(["aten.add.Tensor"] * (len(n.args) > 3 and n.args[3] is not None))
            continue
        out.update(_EXPANDS.get(n.op, (n.op,)))
    return out


def _plan_of_2577() -> SegmentedFusion:
    from perf.fusions import path_of

    with open(path_of("nvfuser-2577"), encoding="utf-8") as f:
        source = f.read()
    inputs = [torch.randn(1024, 8).bfloat16(), torch.randn(1024, 8).bfloat16(), torch.randn(2, 1024, 768).bfloat16()]
    return apply_aliases(segment(from_nvfuser(source, inputs)), "post")


def _plan_of(fn, inputs) -> SegmentedFusion:
    return apply_aliases(segment(capture(fn, inputs)), "post")


ROUND_TRIP = [
    ("nvfuser-2577", _plan_of_2577),
    ("layer_norm_and_mean", lambda: _plan_of(
        lambda x, w: (torch.nn.functional.layer_norm(x, (8,), w) * 2, x.mean(1).exp()), [torch.randn(4, 8), torch.randn(8)])),
    ("softmax_of_a_cast", lambda: _plan_of(lambda x: torch.softmax(x.float(), -1).half(), [torch.randn(6, 5).half()])),
    ("broadcast_where_pad", lambda: _plan_of(
        lambda x, y: torch.nn.functional.pad(torch.where(x > y, x, y[:, None] * 0.5), (1, 2)), [torch.randn(3, 4),
                                                                                                torch.randn(3, 1)])),
]


@pytest.mark.parametrize("make", [r[1] for r in ROUND_TRIP], ids=[r[0] for r in ROUND_TRIP])
def test_each_exported_fusion_reads_back_as_its_segment(make) -> None:
    plan = make()
    exported = export_nvfuser(plan)
    assert exported.fusions, "no kernel segment was exported"
    for ex in exported.fusions:
        seg = plan.segments[ex.index]
        back = read_nvfuser(ex.script(), warn=False).graph  # sizes and strides as the script defines them
        strides = dict(zip(ex.inputs, ex.strides))
        assert [i.meta.stride for i in back.inputs] == list(ex.strides)
        assert [i.meta.shape for i in back.inputs] == [plan.graph.metas[v].shape for v in ex.inputs]
        assert normalized_ops(back, back.nodes) == normalized_ops(plan.graph, seg.nodes), f"segment {seg.index}"
        # the same values: the segment alone on the torch backend, the read-back graph by its semantics
        alone = propagate_metas(segment_graph(plan, seg, strides))
        args = random_inputs(back)
        want = runtime.compile(apply_aliases(segment(alone), "post"), backend="torch")(*args)
        got = run_graph(back, args)
        assert len(got) == len(want) == len(ex.returned)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, atol=1e-2 if w.dtype in (torch.half, torch.bfloat16) else 1e-5, rtol=1e-2)


def test_fusions_take_planned_layouts_unless_they_overlap() -> None:
    m = TensorMeta((2, 3, 4), (12, 0, 1), 5, torch.float32)
    assert defined_strides(m) == (12, 0, 1)  # a broadcast and an offset slice: read where they lie
    assert defined_strides(TensorMeta((3, 4), (1, 1), 0, torch.float32)) == (4, 1)  # overlapping: dense
    assert packed_strides((2, 3, 4), (4, 0, 1)) == (4, 0, 1) and packed_strides((2, 1, 4), (7, 99, 1)) == (4, 4, 1)


# -- run(inputs): the whole segmentation with (a stand-in for) nvFuser --------------------------

def _run_exported(exported, inputs: list[torch.Tensor], monkeypatch) -> list[torch.Tensor]:
    """Execute the exported file's run(inputs), each fusion run by reading its script back."""
    fake = types.ModuleType("nvfuser")
    fake.FusionDefinition = object  # type: ignore[attr-defined]  # never built: _run is replaced below
    fake.DataType = types.SimpleNamespace()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvfuser", fake)
    ns: dict = {}
    exec(compile(exported.script, "<exported>", "exec"), ns)  # our own output, in a test
    sources = {ex.function: ex.script() for ex in exported.fusions}
    ran: list[str] = []

    def run_fusion(define, args):  # noqa: ANN001, ANN202 - the file's _run(define, args)
        ran.append(define.__name__)
        tensors = [ns["_conform"](t, strides) for t, strides in args]
        for t, (_, strides) in zip(tensors, args):  # handed over in the layout the fusion defines
            assert all(n <= 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides))
        # nvFuser takes views of one storage (a tensor and its slice); a graph's inputs share none
        first = {}
        tensors = [t if first.setdefault(t.untyped_storage().data_ptr(), k) == k else
                   torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t) for k, t in enumerate(tensors)]
        return run_graph(read_nvfuser(sources[define.__name__], tensors, warn=False).graph, tensors)

    ns["_run"] = run_fusion
    out = ns["run"](inputs)
    assert sorted(ran) == sorted(sources)
    return out


def test_run_gives_the_values_of_the_2577_fusion(monkeypatch) -> None:
    from .test_nvfuser_import import _rope_2577_torch

    plan = _plan_of_2577()
    exported = export_nvfuser(plan)
    inputs = [torch.randn(1024, 8).bfloat16(), torch.randn(1024, 8).bfloat16(), torch.randn(2, 1024, 768).bfloat16()]
    got = _run_exported(exported, [t.clone() for t in inputs], monkeypatch)
    for g, w in zip(got, _rope_2577_torch(*inputs)):
        torch.testing.assert_close(g, w)
    assert "def fusion_0(fd: FusionDefinition) -> None:" in exported.script and "def run(" in exported.script


MIXED = textwrap.dedent("""
    from nvfuser import FusionDefinition, DataType

    def f(fd: FusionDefinition) -> None:
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)
        T2 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        T3 = fd.ops.index_select(T0, T1, dim=0)
        T4 = fd.ops.sum(fd.ops.exp(T3), dims=[1])
        fd.add_output(T4)
        fd.add_output(fd.ops.permute(T0, dims=[1, 0]))
        fd.add_output(fd.ops.full(shape=[2], fill_value=3.0, dtype=DataType.Float))
        fd.add_output(fd.ops.mul(T2, 2.0), T2)
""")


def _mixed_torch(x: torch.Tensor, i: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out = x.index_select(0, i).exp().sum(1), x.t(), torch.full((2,), 3.0)
    w.mul_(2.0)
    return out


def test_run_runs_torch_segments_views_and_write_backs(monkeypatch) -> None:
    inputs = [torch.randn(4, 6), torch.tensor([3, 1, 1]), torch.randn(4, 6)]
    graph = from_nvfuser(MIXED, inputs)
    exported = export_nvfuser(apply_aliases(segment(graph), "post"))
    kinds = {s.kind.value for s in exported.segments if s.function is None}
    assert "opaque" in kinds and "metadata" in kinds  # index_select on torch, the permute a view
    assert_matches_eager(_mixed_torch, inputs, graph,
                         program=lambda *args: _run_exported(exported, list(args), monkeypatch))


def test_run_hands_each_fusion_its_inputs_in_the_defined_layout(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "nvfuser", types.ModuleType("nvfuser"))
    sys.modules["nvfuser"].FusionDefinition, sys.modules["nvfuser"].DataType = object, object  # type: ignore[attr-defined]
    ns: dict = {}
    exec(compile(export_nvfuser(_plan_of(lambda x: x * 2, [torch.randn(3)])).script, "<exported>", "exec"), ns)
    conform = ns["_conform"]
    x = torch.randn(4, 3)
    same = x[:, 1:]
    assert conform(same, [3, 1]) is same  # already laid out as defined: no copy
    moved = conform(x.t(), [4, 1])  # permuted: copied into the defined layout
    assert moved.stride() == (4, 1) and torch.equal(moved, x.t())
    wide = conform(torch.randn(3, 1).expand(3, 5).contiguous(), [1, 0])  # a broadcast, materialized by nvFuser
    assert wide.stride() == (1, 0) and wide.shape == (3, 5)


def test_cli_exports_a_script_and_says_what_runs_on_torch(capsys, tmp_path) -> None:
    from perf.tools.cli import main

    src, out = tmp_path / "mixed.py", tmp_path / "exported.py"
    src.write_text(MIXED.replace("shape=[-1, -1]", "shape=[4, 6]").replace("shape=[-1]", "shape=[3]"))
    assert main(["export", str(src), "--format", "nvfuser", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"wrote {out}" in err and "as nvFuser fusions" in err and "runs on torch: opaque segments run on torch" in err
    text = out.read_text()
    compile(text, str(out), "exec")  # a Python file
    assert "torch.ops.aten.index_select.default(" in text and ".copy_(" in text


# -- symbolic plans (Note [exported symbolic sizes]) --------------------------------------------

def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).bfloat16()


def _symbolic_case(name: str):  # noqa: ANN202 - a SymCase of tests/test_nvfuser_symbolic.py
    from .test_nvfuser_symbolic import CASES

    return next(c for c in CASES if c.name == name)


def _1597_torch(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
    from .test_nvfuser_import import _qkv_rope_1597_torch

    return _qkv_rope_1597_torch(*args)


SIZE_ONE_OUTERMOST = """
    T0 = fd.define_tensor(shape=[-1, -1, 1], contiguity=[None, True, True], dtype=DataType.Float, stride_order=[1, 0, 2])
    fd.add_output(fd.ops.mul(T0, 2.0))
"""

SYMBOLIC_EXPORTS = [  # (script, inputs at a size, torch program, sizes)
    ("rotate_half", lambda: fusion(_symbolic_case("rotate_half").body), lambda n: [torch.randn(3 + n, 2 * n + 1)],
     lambda x: _symbolic_case("rotate_half").torch_fn(x), (2, 5, 8)),
    # a size-1 dim outermost in the allocation: contiguity is written in allocation order
    # ([None, True, True]), as nvFuser reads it, not per dim ([True, True, None])
    ("size_one_outermost", lambda: fusion(SIZE_ONE_OUTERMOST), lambda n: [torch.randn(1, n, n + 2).permute(1, 2, 0)],
     lambda x: (x * 2.0,), (2, 5, 8)),
    ("nvfuser-1597", lambda: open(__import__("perf.fusions").fusions.path_of("nvfuser-1597"), encoding="utf-8").read(),
     lambda t: [_bf16(1, t, 6144), _bf16(t, 128), _bf16(t, 128)], _1597_torch, (4, 9, 16)),
]


@pytest.mark.parametrize("source,make,torch_fn,sizes", [c[1:] for c in SYMBOLIC_EXPORTS],
                         ids=[c[0] for c in SYMBOLIC_EXPORTS])
def test_a_symbolic_plan_exports_fusions_for_every_size(source, make, torch_fn, sizes, monkeypatch) -> None:
    torch.manual_seed(0)
    plan = apply_aliases(segment(read_nvfuser(source(), warn=False).graph), "post")
    exported = export_nvfuser(plan)
    assert exported.fusions and "run(inputs) checks the plan's conditions" in exported.script
    for ex in exported.fusions:  # -1 dims, and sizes the fusion computes from its inputs
        assert "shape=[" in ex.script() and "-1" in ex.script() and "sizes=" not in ex.script()
        # read back with symbols hinted by tensors of the segment's layouts: the segment's ops
        layouts = [plan.graph.metas[v] for v in ex.inputs]
        hints = [torch.empty_strided([size_hint(n) for n in m.shape], [size_hint(s) for s in st], dtype=m.dtype)
                 for m, st in zip(layouts, ex.strides)]
        back = read_nvfuser(ex.script(), hints, warn=False, symbolic=True)  # (an input sliced: bound)
        assert normalized_ops(back.graph, back.graph.nodes) == normalized_ops(plan.graph, plan.segments[ex.index].nodes)
    for n in sizes:  # run() at several sizes, each fusion read back bound to what it is handed
        inputs = make(n)
        got = _run_exported(exported, [t.clone() for t in inputs], monkeypatch)
        want = torch_fn(*inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            torch.testing.assert_close(g, w)
    bad = make(1)  # a size outside the plan's ranges (1 is no symbolic size): refused, nothing runs
    with pytest.raises(ValueError, match="break a condition of the plan"):
        _run_exported(exported, bad, monkeypatch)


def test_a_lowering_that_needs_a_number_runs_that_segment_on_torch(monkeypatch) -> None:
    """A mean over a symbolic dim: the lowering's count would pin the symbol, so that segment is
    written to run on torch (its reason said), and run() still takes every size."""
    import json

    from segmenter.formats.serialize import from_json

    meta = lambda shape, stride: {"shape": shape, "stride": stride, "storage_offset": 0, "dtype": "float32",  # noqa: E731
                                  "device": "cpu"}
    raw = {"schema": "fusion-segmenter/graph", "version": 1, "name": "centered", "symbols": {"S": {"hint": 6}},
           "inputs": [{"name": "x", "meta": meta([3, "S"], ["S", 1]), "role": "user", "target": None, "storage": 0}],
           "nodes": [{"name": "m", "op": "aten.mean.dim", "args": [{"value": "x"}, [1], True], "kwargs": {},
                      "outputs": ["m"], "metas": [meta([3, 1], [1, 1])]},
                     {"name": "y", "op": "aten.sub.Tensor", "args": [{"value": "x"}, {"value": "m"}], "kwargs": {},
                      "outputs": ["y"], "metas": [meta([3, "S"], ["S", 1])]}],
           "outputs": ["y"]}
    plan = apply_aliases(segment(from_json(json.dumps(raw))), "post")
    exported = export_nvfuser(plan)
    declined = [s for s in exported.segments if s.function is None and s.kind.value != "metadata"]
    assert declined and "needs a number for a symbolic size" in declined[0].reason
    for n in (2, 6, 11):
        x = torch.randn(3, n)
        (got,) = _run_exported(exported, [x.clone()], monkeypatch)
        torch.testing.assert_close(got, x - x.mean(1, keepdim=True))
