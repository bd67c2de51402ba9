"""A graph file is data: nothing in it reaches generated source unchecked (issue 14, item 3).

Every argument value and every shape, stride and dtype that the kernel generator formats into
C++/CUDA source is checked by type and range where it is formatted, and the values a kernel
reads are recomputed from its parameters' layouts (recorded metas are not believed), whatever
flags the loader got: ``from_json(..., check_metas=False)`` skips the loader's own check, not
the generator's. A segment that fails a check is declined (the reason recorded) and runs on
torch, which then behaves as eager does with the same ops: it raises torch's own error.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.backends.kernels import layouts
from runtime.codegen import Declined, lower_segment
from segmenter import (
    FusionGraph,
    GraphError,
    GraphInput,
    Node,
    Segment,
    SegmentKind,
    TensorMeta,
    ValueRef,
    capture,
    segment,
)
from segmenter.formats.serialize import from_json, to_json

F32 = torch.float32


def _strided_slice_json() -> dict:
    """``x[0:8:2] * 2`` as a graph file: one POINTWISE segment whose kernel indexes ``x`` by the
    slice's start and step."""
    return json.loads(to_json(capture(lambda x: x[0:8:2] * 2, [torch.randn(8)])))


def _compile_hostile(d: dict, mode: str) -> runtime.CompiledProgram:
    graph = from_json(json.dumps(d), check_metas=False)
    return runtime.compile(apply_aliases(segment(graph), mode), backend="cpp")


def _declined(prog, fragment: str) -> None:
    """No kernel was built for the one kernel segment; the generator's reason names ``fragment``."""
    assert prog.kernels == {}
    (seg, passed), = prog.passed_over.items()
    assert prog.backend_of[seg] == "torch"
    reasons = " | ".join(why for name, why in passed if name == "cpp")
    assert fragment in reasons, reasons


@pytest.mark.parametrize("mode", ["post", "off"])
def test_a_string_slice_step_is_never_compiled(mode: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    d = _strided_slice_json()
    d["nodes"][0]["args"][4] = f'2 + system("touch {marker}")'
    for check_metas in (True, False):  # the loader refuses it, whatever its flags (the op's schema)...
        with pytest.raises(GraphError, match="step"):
            from_json(json.dumps(d), check_metas=check_metas)
    # ...and a graph built in memory, past every loader, is refused by the generator
    graph = capture(lambda x: x[0:8:2] * 2, [torch.randn(8)])
    sl = graph.nodes[0]
    assert sl.op == "aten.slice.Tensor"
    evil = dataclasses.replace(sl, args=(*sl.args[:4], d["nodes"][0]["args"][4]))
    prog = runtime.compile(apply_aliases(segment(dataclasses.replace(graph, nodes=(evil, *graph.nodes[1:]))), mode),
                           backend="cpp")
    _declined(prog, "step")
    with pytest.raises(RuntimeError, match="step"):  # torch's own error for a slice with that step
        prog(torch.randn(8))
    assert not marker.exists()


@pytest.mark.parametrize("mode", ["post", "off"])
def test_a_select_index_out_of_range_is_never_compiled(mode: str) -> None:
    d = _strided_slice_json()
    d["nodes"][0] = {"name": "slice_1", "op": "aten.select.int", "args": [{"value": "x"}, 0, 10**8], "kwargs": {},
                     "outputs": ["slice_1"], "metas": [{"shape": [], "stride": [], "storage_offset": 10**8,
                                                        "dtype": "float32", "device": "cpu"}]}
    d["nodes"][1]["metas"][0].update(shape=[], stride=[])
    prog = _compile_hostile(d, mode)
    _declined(prog, "index")
    with pytest.raises(IndexError):  # as eager: x.select(0, 10**8) on 8 elements
        prog(torch.randn(8))


# Recorded metas that lie (loaded with check_metas=False): the kernel would loop over the recorded
# shape and index its inputs by it. Each is declined; torch then runs the ops as they are.
_LIES = {
    # the slice says 100 elements where it has 4: a loop of 100 reading x[2 * i]
    "slice output longer than it is": lambda d: d["nodes"][0]["metas"][0].update(shape=[100]),
    "mul output longer than it is": lambda d: d["nodes"][1]["metas"][0].update(shape=[100]),
    "slice output of another rank": lambda d: d["nodes"][0]["metas"][0].update(shape=[4, 100], stride=[2, 1]),
    "mul output of another dtype": lambda d: d["nodes"][1]["metas"][0].update(dtype="float64"),
}


@pytest.mark.parametrize("lie", sorted(_LIES))
def test_metas_that_lie_never_size_a_kernel(lie: str) -> None:
    d = _strided_slice_json()
    _LIES[lie](d)
    prog = _compile_hostile(d, "off")
    _declined(prog, "torch computes")
    x = torch.randn(8)
    try:
        out, = prog(x)
    except (RuntimeError, GraphError):
        return  # the recorded output layout cannot hold torch's value: refused at run time
    torch.testing.assert_close(out, x[0:8:2] * 2, check_dtype=False)


# --- every formatting site, with the recomputation of metas switched off ---------------------

def _one_op(op: str, args: tuple, out_shape: tuple[int, ...], kwargs: tuple = (), in_shape: tuple[int, ...] = (8,),
            kind: SegmentKind = SegmentKind.POINTWISE, out_dtype: torch.dtype = F32,
            in_meta: TensorMeta | None = None) -> tuple[FusionGraph, Segment]:
    from runtime.codegen.source.index import contiguous_strides

    x = in_meta or TensorMeta(in_shape, contiguous_strides(in_shape), 0, F32)
    out = TensorMeta(out_shape, contiguous_strides(out_shape), 0, out_dtype)
    node = Node("y", op, args, kwargs, ("y",), (out,))
    graph = FusionGraph(inputs=(GraphInput("x", x),), nodes=(node,), outputs=("y",))
    return graph, Segment(0, kind, (node,), ("x",), ("y",), 0, 0)


X = ValueRef("x")
_BAD = {
    "slice step is a string": ("aten.slice.Tensor", (X, 0, 0, 8, '2 + system("touch p")'), (4,)),
    "slice step is zero": ("aten.slice.Tensor", (X, 0, 0, 8, 0), (4,)),
    "slice step is a bool": ("aten.slice.Tensor", (X, 0, 0, 8, True), (8,)),
    "slice step is a float": ("aten.slice.Tensor", (X, 0, 0, 8, 2.0), (4,)),
    "slice start is a string": ("aten.slice.Tensor", (X, 0, "0); system(\"x\"", 8, 1), (8,)),
    "slice dim is a string": ("aten.slice.Tensor", (X, "0", 0, 8, 1), (8,)),
    "select index out of range": ("aten.select.int", (X, 0, 10**8), ()),
    "select index below range": ("aten.select.int", (X, 0, -9), ()),
    "select index is a float": ("aten.select.int", (X, 0, 1.0), ()),
    "permute dims are strings": ("aten.permute.default", (X, ("0",)), (8,)),
    "pad width is huge": ("aten.constant_pad_nd.default", (X, (10**20, 0)), (8,)),
    "pad width is a string": ("aten.constant_pad_nd.default", (X, ("1", 0)), (9,)),
    "pad value is a string": ("aten.constant_pad_nd.default", (X, (1, 0), "0; system(\"x\")"), (9,)),
    "triu diagonal is a string": ("aten.triu.default", (X, "1 ? 1 : system(\"x\")"), (2, 4)),
    "full value is a string": ("aten.full.default", ((8,), "1.0f; system(\"x\")"), (8,)),
    "mul scalar is a string": ("aten.mul.Tensor", (X, "2"), (8,)),
    "add alpha is a string": ("aten.add.Tensor", (X, X), (8,), {"kwargs": (("alpha", "1 + system(\"x\")"),)}),
    "clamp bound is a string": ("aten.clamp.default", (X, "0"), (8,)),
    "integer scalar beyond 64 bits": ("aten.mul.Tensor", (X, 10**30), (8,),
                                      {"in_meta": TensorMeta((8,), (1,), 0, torch.int64), "out_dtype": torch.int64}),
    "arange step is a string": ("aten.arange.start_step", (0, 8, "1"), (8,)),
    "repeat count is a string": ("aten.repeat.default", (X, ("2",)), (16,)),
    "split size is a string": ("aten.split.Tensor", (X, "4"), (4,)),
    "flip dims are strings": ("aten.flip.default", (X, ("0",)), (8,)),
    "cat dim is a string": ("aten.cat.default", ((X, X), "0"), (16,)),
    "unsqueeze dim is a bool": ("aten.unsqueeze.default", (X, True), (8, 1)),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_every_formatted_argument_is_checked(case: str, monkeypatch) -> None:
    """The second line of defence: even with the metas believed, no bad value is formatted."""
    import runtime.codegen.lowering.lower as lower

    monkeypatch.setattr(lower, "check_segment_metas", lambda *a: None)
    op, args, out_shape, *extra = _BAD[case]
    graph, seg = _one_op(op, args, out_shape, **(extra[0] if extra else {}))
    with pytest.raises(Declined):
        lower_segment(graph, seg, layouts(graph, seg, frozenset(), {}))


def test_layer_norm_eps_must_be_a_number(monkeypatch) -> None:
    import runtime.codegen.lowering.lower as lower

    monkeypatch.setattr(lower, "check_segment_metas", lambda *a: None)
    for eps in ("1e-5f + system(\"x\")", None, float("nan"), True):
        graph, seg = _one_op("aten.native_layer_norm.default", (X, (8,), None, None, eps), (2, 8),
                             in_shape=(2, 8), kind=SegmentKind.NORMALIZATION)
        with pytest.raises(Declined, match="eps"):
            lower_segment(graph, seg, layouts(graph, seg, frozenset(), {}))


_BAD_LAYOUTS = {
    "a negative stride": TensorMeta((8,), (-1,), 7, F32),
    "a string stride": TensorMeta((8,), ("1",), 0, F32),
    "a bool size": TensorMeta((True,), (1,), 0, F32),
    "a size beyond 2**62": TensorMeta((2**63,), (1,), 0, F32),
}


@pytest.mark.parametrize("case", sorted(_BAD_LAYOUTS))
def test_every_formatted_layout_is_checked(case: str, monkeypatch) -> None:
    import runtime.codegen.lowering.lower as lower

    monkeypatch.setattr(lower, "check_segment_metas", lambda *a: None)
    m = _BAD_LAYOUTS[case]
    graph, seg = _one_op("aten.neg.default", (X,), m.shape, in_meta=m)
    with pytest.raises(Declined):
        lower_segment(graph, seg, layouts(graph, seg, frozenset(), {}))


def test_recomputing_metas_never_allocates() -> None:
    """A factory op's size is the graph's to choose: the recomputation runs on the meta device,
    with or without a device argument (the default device would allocate 4 TiB here)."""
    from runtime.codegen.source.checks import check_segment_metas

    for kwargs in ((), (("device", torch.device("cpu")),)):
        graph, seg = _one_op("aten.full.default", ((2**40,), 1.0), (2**40,), kwargs=kwargs)
        check_segment_metas(graph, seg, {})  # consistent metas: nothing to decline, nothing allocated


def test_good_values_still_compile_and_match_eager() -> None:
    """The checks refuse nothing a real program makes (the kernel cases cover the rest)."""
    from .util import assert_matches_eager

    def fn(x):
        y = torch.nn.functional.pad(x[1:7:3].unsqueeze(0), (1, 2), value=-1.5)
        return torch.triu(y.expand(3, 5), diagonal=-1) * 2 + x.select(0, -1), x.flip(0).clamp(-0.5, 0.5)

    x = torch.randn(8)
    prog = runtime.compile(apply_aliases(segment(capture(fn, [x])), "off"), backend="cpp")
    assert prog.passed_over == {}
    assert_matches_eager(fn, [x], prog.graph, program=prog)


def test_a_kernel_input_whose_storage_is_too_small_is_refused() -> None:
    """A kernel reads its inputs through their data pointers: it first checks that each input's
    storage holds every element of its layout (a storage resized behind the tensor's back would
    otherwise be read out of bounds; eager itself crashes there)."""
    x = torch.randn(8)
    prog = runtime.compile(apply_aliases(segment(capture(lambda x: x * 2, [x])), "post"), backend="cpp")
    assert prog.kernels
    y = torch.randn(8)
    y.untyped_storage().resize_(4 * 4)
    with pytest.raises(GraphError, match="storage"):
        prog(y)


# the nvFuser lowering formats nothing, but nvFuser compiles the values it is handed into its
# kernels: the same checks apply (against the recording stand-in of tests/test_nvfuser_lowering.py)
_NVFUSER_BAD = ["slice step is a string", "slice step is zero", "slice start is a string", "select index out of range",
                "select index is a float", "pad width is huge", "pad width is a string", "pad value is a string",
                "full value is a string", "mul scalar is a string", "add alpha is a string", "cat dim is a string",
                "unsqueeze dim is a bool", "permute dims are strings"]


@pytest.mark.parametrize("case", _NVFUSER_BAD)
def test_nvfuser_lowering_checks_every_argument(case: str, monkeypatch) -> None:
    import runtime.backends.nvfuser as nvb

    from .test_nvfuser_lowering import _nvf

    monkeypatch.setattr(nvb, "check_segment_metas", lambda *a: None)
    op, args, out_shape, *extra = _BAD[case]
    graph, seg = _one_op(op, args, out_shape, **(extra[0] if extra else {}))
    with pytest.raises(Declined):
        nvb.lower_to_nvfuser(_nvf, graph, seg, {})


def test_nvfuser_lowering_does_not_believe_recorded_metas() -> None:
    from runtime.backends.nvfuser import lower_to_nvfuser

    from .test_nvfuser_lowering import _nvf

    d = _strided_slice_json()
    d["nodes"][0]["metas"][0].update(shape=[100])
    graph = from_json(json.dumps(d), check_metas=False)
    seg = next(s for s in segment(graph).segments if s.is_kernel)
    with pytest.raises(Declined, match="torch computes"):
        lower_to_nvfuser(_nvf, graph, seg, {})
