"""nvFuser fusions whose -1 dims are symbolic sizes (Note [symbolic dims of a fusion] in
segmenter/formats/nvfuser/sizes.py): one graph, one segmentation and one compiled program for every size
where the plan's conditions hold, run at three sizes against torch programs written apart from
the fusions (values, dtypes, strides, views, inputs afterwards: tests/util.py)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from alias import apply_aliases
from runtime.compiled.program import CompiledProgram
from segmenter import read_nvfuser, segment
from segmenter.formats.nvfuser import sizes as nvfuser_sizes
from segmenter.formats.serialize import GraphFormatError, from_json, to_json

from .test_nvfuser_import import _bf16, _data, _qkv_rope_1597_torch, fusion
from .util import assert_matches_eager

F32 = "dtype=DataType.Float"


@dataclass(frozen=True)
class SymCase:
    name: str
    body: str
    shapes: list[list[str]]  # each input's sizes as the graph shows them
    inputs: Callable[[int, int], list[torch.Tensor]]  # the inputs at sizes (n, m)
    torch_fn: Callable[..., object]


def _in_place(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor]:
    y = x * s.float()
    x.copy_(y.sin())
    return (y.sum(0),)


def _rotate(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = x.shape[1] // 2
    return torch.cat((-x[:, h:], x[:, :h]), -1) * x, x[:, h:], x[:, h:].sum(0)


CASES = [
    # a [-1] broadcast against a [-1, -1]: the ops force its dim equal to T0's dim 1
    SymCase("broadcast_and_reduce", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        T2 = fd.ops.broadcast_in_dim(T1, shape=T0.shape(), broadcast_dims=[1])
        T3 = fd.ops.mul(fd.ops.exp(T0), T2)
        fd.add_output(T3)
        fd.add_output(fd.ops.sum(T3, dims=[1]))
    """, [["T0_0", "T0_1"], ["T0_1"]], lambda n, m: [torch.randn(n, m), torch.randn(m)],
        lambda x, y: (x.exp() * y, (x.exp() * y).sum(1))),
    # an input laid out by stride_order (dim 1 innermost): strides are products of the sizes
    SymCase("stride_order_and_sizes_read_back", f"""
        T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], {F32}, stride_order=[2, 0, 1])
        S1 = fd.ops.size(T0, 1)
        S2 = fd.ops.size(T0, 2)
        T1 = fd.ops.add(T0, T0)
        T2 = fd.ops.reshape(fd.ops.stride_order(T1, stride_order=[2, 1, 0]), new_shape=[fd.ops.size(T0, 0), fd.ops.mul(S1, S2)])
        fd.add_output(T2)
        fd.add_output(fd.ops.permute(T0, dims=[0, 2, 1]))
        fd.add_output(fd.ops.sum(T1, dims=[1]))
    """, [["T0_0", "T0_1", "T0_2"]], lambda n, m: [torch.randn(3, m, n).permute(0, 2, 1)],
        lambda x: ((x + x).reshape(x.shape[0], -1), x.permute(0, 2, 1), (x + x).sum(1))),
    # rotate-half with bounds read back and halved (fd.ops.div of sizes: integer division)
    SymCase("rotate_half", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        S0 = fd.ops.size(T0, 0)
        S1 = fd.ops.size(T0, 1)
        H = fd.ops.div(S1, 2)
        T1 = fd.ops.slice(T0, start_indices=[0, 0], end_indices=[S0, H])
        T2 = fd.ops.slice(T0, start_indices=[0, H], end_indices=[S0, S1])
        T3 = fd.ops.cat([fd.ops.neg(T2), T1], dim=-1)
        fd.add_output(fd.ops.mul(T3, T0))
        fd.add_output(T2)
        fd.add_output(fd.ops.sum(T2, dims=[0]))
    """, [["T0_0", "T0_1"]], lambda n, m: [torch.randn(n, m)], _rotate),
    # dims 0 are independent (a cat's dim), dims 1 forced equal: three symbols, no relation
    SymCase("independent_dims", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        fd.add_output(fd.ops.cat([fd.ops.exp(T0), T1], dim=0))
    """, [["T0_0", "T0_1"], ["T1_0", "T0_1"]], lambda n, m: [torch.randn(n, m), torch.randn(m + 1, m)],
        lambda x, y: (torch.cat((x.exp(), y)),)),
    # a scalar input and an in-place update of a symbolic input
    SymCase("scalar_and_in_place", f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        S1 = fd.define_scalar(dtype=DataType.Double)
        T2 = fd.ops.mul(T0, S1)
        fd.add_output(fd.ops.sin(T2), T0)
        fd.add_output(fd.ops.sum(T2, dims=[0]))
    """, [["T0_0", "T0_1"], []], lambda n, m: [torch.randn(n, m), torch.tensor(0.5, dtype=torch.float64)],
        _in_place),
]

SIZES = [(2, 4), (5, 8), (9, 7)]  # within the conditions the plans record at the default hints (17, 19, 23)


def _program(graph) -> CompiledProgram:  # noqa: ANN001
    return CompiledProgram(apply_aliases(segment(graph), "post"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_program_runs_every_size(case: SymCase) -> None:
    torch.manual_seed(0)
    fusion_ = read_nvfuser(fusion(case.body), warn=False)
    graph, sizes = fusion_.graph, fusion_.sizes
    assert not fusion_.bound and fusion_.bound_from == "default hints" and sizes is not None
    assert [[sizes.text(n) for n in i.meta.shape] for i in graph.inputs] == case.shapes
    program = _program(graph)
    for n, m in SIZES:
        inputs = case.inputs(n, m)
        assert program.refusal(*inputs) is None
        assert_matches_eager(case.torch_fn, inputs, graph, program=program)


def test_dims_no_op_relates_stay_apart() -> None:
    """Symbols are hinted apart where no sizes are given (17, 19, 23): nothing is made equal that
    the ops do not make equal, and the graph prints its sizes by the symbols' names."""
    case = next(c for c in CASES if c.name == "independent_dims")
    fusion_ = read_nvfuser(fusion(case.body), warn=False)
    sizes = fusion_.sizes
    assert sizes is not None and sorted(sizes.hints.values()) == [17, 19, 23]
    assert sizes.condition_text() == [] and sizes.specializations() == {}
    assert [(s.input, s.dims, s.sizes) for s in fusion_.symbolic] == [("T0", (0, 1), ("T0_0", "T0_1")),
                                                                      ("T1", (0, 1), ("T1_0", "T0_1"))]
    assert "float32[T0_0 + T1_0, T0_1]" in str(fusion_.graph)
    x, y = torch.randn(4, 3), torch.randn(7, 3)
    assert_matches_eager(lambda a, b: (torch.cat((a.exp(), b)),), [x, y], fusion_.graph,
                         program=_program(fusion_.graph))


BROADCAST = next(c for c in CASES if c.name == "broadcast_and_reduce")


def test_hints_come_from_the_scripts_inputs_and_sizes_0_and_1_stay_numbers() -> None:
    script = fusion(BROADCAST.body, inputs="[torch.randn(1, 6, device='cuda:0'), torch.randn(6, device='cuda:0')]")
    fusion_ = read_nvfuser(script, warn=False)
    sizes = fusion_.sizes
    assert fusion_.bound_from == "the script's inputs" and not fusion_.bound and sizes is not None
    assert [s.sizes for s in fusion_.symbolic] == [(1, "T0_1"), ("T0_1",)]  # 1 is specialized, as dynamo does
    assert list(sizes.hints.values()) == [6]
    program = _program(fusion_.graph)
    for m in (3, 6, 10):
        inputs = BROADCAST.inputs(1, m)
        assert_matches_eager(BROADCAST.torch_fn, inputs, fusion_.graph, program=program)


def test_inputs_bind_unless_symbolic_is_asked_for() -> None:
    x, y = torch.randn(4, 6), torch.randn(6)
    bound = read_nvfuser(fusion(BROADCAST.body), [x, y], warn=False)
    assert bound.bound and bound.sizes is None and bound.graph.inputs[0].meta.shape == (4, 6)
    kept = read_nvfuser(fusion(BROADCAST.body), [x, y], warn=False, symbolic=True)
    sizes = kept.sizes
    assert not kept.bound and kept.bound_from == "inputs argument" and sizes is not None
    assert sorted(sizes.hints.values()) == [4, 6]  # the tensors' sizes, as hints
    program = _program(kept.graph)
    for n, m in ((4, 6), (3, 2), (7, 5)):
        inputs = BROADCAST.inputs(n, m)
        assert_matches_eager(BROADCAST.torch_fn, inputs, kept.graph, program=program)


def test_an_input_given_in_no_dense_layout_is_bound_to_its_sizes() -> None:
    body = f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[False, True], {F32})
        T1 = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        fd.add_output(fd.ops.add(fd.ops.sum(T0, dims=[1]), T1))
    """
    x = torch.randn(4, 10)[:, :6]  # rows 10 apart: no product of symbolic sizes
    fusion_ = read_nvfuser(fusion(body), [x, torch.randn(4)], warn=False, symbolic=True)
    assert fusion_.graph.inputs[0].meta.shape == (4, 6) and fusion_.graph.inputs[0].meta.stride == (10, 1)
    assert any("T0 (line 5) is bound to its sizes [4, 6]" in n for n in fusion_.notes)
    assert [s.sizes for s in fusion_.symbolic] == [(4, 6), (4,)]  # T1's dim: forced equal to a number
    y = torch.randn(4)
    assert_matches_eager(lambda a, b: (a.sum(1) + b,), [x, y], fusion_.graph, program=_program(fusion_.graph))


# -- the issue fusions ------------------------------------------------------------------------

@pytest.mark.parametrize("name,segments,kernels", [("nvfuser-1597", 2, 1), ("nvfuser-2577", 4, 3)])
def test_issue_fusions_segment_symbolically_as_bound(name: str, segments: int, kernels: int) -> None:
    symbolic = read_nvfuser(_data(name), warn=False)
    bound = read_nvfuser(_data(name), warn=False, symbolic=False)
    stats = [apply_aliases(segment(f.graph), "post").stats() for f in (symbolic, bound)]
    for st in stats:
        assert (st["segments"], st["kernels"], st["opaque"], st["metadata"]) == (segments, kernels, 0, 1)
    if name == "nvfuser-1597":  # B = 1 in the script's inputs (specialized), T symbolic: cos and sin share it
        assert [s.sizes for s in symbolic.symbolic] == [(1, "T0_1"), ("T0_1",), ("T0_1",)]
        assert symbolic.sizes is not None and list(symbolic.sizes.hints.values()) == [4096]
    else:  # the reshape to [2, 1024, 4, 6, 32] fixes the -1 dim: no symbol is left
        assert [s.sizes for s in symbolic.symbolic] == [(768,)] and symbolic.sizes is None
        assert str(symbolic.graph) == str(bound.graph)


def test_1597_runs_at_every_batch_and_sequence() -> None:
    torch.manual_seed(0)
    first = [_bf16(2, 8, 6144), _bf16(8, 128), _bf16(8, 128)]
    fusion_ = read_nvfuser(_data("nvfuser-1597"), first, warn=False, symbolic=True)
    assert [s.sizes for s in fusion_.symbolic] == [("T0_0", "T0_1"), ("T0_1",), ("T0_1",)]
    program = _program(fusion_.graph)
    for B, T in ((2, 8), (3, 5), (2, 12)):
        inputs = [_bf16(B, T, 6144), _bf16(T, 128), _bf16(T, 128)]
        assert_matches_eager(_qkv_rope_1597_torch, inputs, fusion_.graph, program=program)


# -- names, bounds and refusals -----------------------------------------------------------------

def test_symbol_names_are_keys_and_round_trip_through_a_graph_file() -> None:
    long = "T" * 70
    body = f"""
        {long} = fd.define_tensor(shape=[-1], contiguity=[True], {F32})
        fd.add_output(fd.ops.exp({long}))
    """
    graph = read_nvfuser(fusion(body), warn=False).graph
    assert "float32[size0]" in str(graph)  # T..T_0 is no graph file's symbol name (64 characters at most)
    again = from_json(to_json(graph))
    assert json.loads(to_json(graph))["symbols"] == {"size0": {"hint": 17, "min": 2, "max": 2**31}}
    x = torch.randn(5)
    assert_matches_eager(lambda t: (t.exp(),), [x], again, program=_program(again))


HOSTILE = [
    ("hint beyond the range", "[torch.randn(4294967296)]", "shape=[-1]", "fd.ops.exp(T0)",
     r"line 5: fd.define_tensor: dim 0 of size 4294967296: a symbolic size is in \[2, 2\*\*31\]"),
    ("bytes beyond the bound at the hints", "[torch.randn(8388608, 8388608)]", "shape=[-1, -1]", "fd.ops.exp(T0)",
     r"line 5: fd.define_tensor: an input of \[T0_0, T0_1\] addresses 281474976710656 bytes"),
    ("a reshape the default hints do not take", None, "shape=[-1]", "fd.ops.reshape(T0, new_shape=[2, 12])",
     r"new_shape \[2, 12\] holds 24 elements, the input T0_0 \(the -1 dims were hinted 17: give inputs"),
]


@pytest.mark.parametrize("inputs,shape,out,message", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_sizes_beyond_the_bounds_are_refused(inputs: str | None, shape: str, out: str, message: str) -> None:
    body = f"""
        T0 = fd.define_tensor({shape}, contiguity=True, {F32})
        fd.add_output({out})
    """
    with pytest.raises(GraphFormatError, match=message):
        read_nvfuser(fusion(body, inputs=inputs), warn=False)
    x = torch.randn(4, 6)  # bound to sizes it takes, the same fusion reads
    graph = read_nvfuser(fusion(body, inputs=inputs), [x.reshape(-1) if shape == "shape=[-1]" else x], warn=False).graph
    ref = (lambda t: (t.reshape(2, 12),)) if "reshape" in out else (lambda t: (t.exp(),))
    assert_matches_eager(ref, [x.reshape(-1) if shape == "shape=[-1]" else x], graph, program=_program(graph))


def test_more_symbolic_dims_than_the_bound_are_refused(monkeypatch) -> None:
    monkeypatch.setattr(nvfuser_sizes, "MAX_DIMS", 3)
    body = f"""
        T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], {F32})
        fd.add_output(fd.ops.cat([T0, T1], 0))
    """
    with pytest.raises(GraphFormatError, match="line 6: fd.define_tensor: more than 3 symbolic dims"):
        read_nvfuser(fusion(body), warn=False)
    x, y = torch.randn(2, 3), torch.randn(4, 3)  # bound, it reads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = read_nvfuser(fusion(body), [x, y], warn=False).graph
    assert_matches_eager(lambda a, b: (torch.cat((a, b)),), [x, y], graph, program=_program(graph))


def test_cli_segment_shows_the_symbols_and_their_ranges(capsys, tmp_path) -> None:
    from perf.tools.cli import main

    path = tmp_path / "repro.py"
    path.write_text(fusion(BROADCAST.body))
    assert main(["segment", str(path)]) == 0
    out = capsys.readouterr().out
    assert "symbolic sizes: T0_0 in [2, 2147483648] (hint 17); T0_1 in [2, 2147483648] (hint 19)" in out
    assert "one segmentation for every size in these ranges" in out
    assert "nvFuser script: -1 dims are symbols, hinted by default hints (17, then primes apart)" in out
    assert "%T1 (line 6): dims [0] are [T0_1]" in out
    # the segmentation it shows runs at sizes of either hint's order
    fusion_ = read_nvfuser(fusion(BROADCAST.body), warn=False)
    inputs = BROADCAST.inputs(3, 4)
    assert_matches_eager(BROADCAST.torch_fn, inputs, fusion_.graph, program=_program(fusion_.graph))


def test_cli_run_runs_a_symbolic_script_at_its_hints(capsys, tmp_path) -> None:
    from perf.tools.cli import main

    path = tmp_path / "repro.py"
    path.write_text(fusion(BROADCAST.body))
    assert main(["run", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["max_rel_diff"] < 1e-5 and record["strides_agree"] and record["aliasing_agrees"]
    assert record["kernels"] == 1  # at the hints: T0 of 17 x 19 against the graph's torch ops


def test_a_size_the_ops_fix_that_the_default_hint_lacks_is_refused_by_its_name() -> None:
    from .test_nvfuser_import import WITH_BLOCK  # t1 (symbolic_sizes=[-1]) broadcast to [4, 6]: t1_0 is 6

    with pytest.raises(GraphFormatError, match=r"line 6: fd.ops.broadcast_in_dim: .*length t1_0 -> 6.*hinted 17"):
        read_nvfuser(WITH_BLOCK, warn=False)
    x, y = torch.randn(4, 6), torch.randn(6)  # hinted by tensors that take it: t1_0 pinned to 6
    fusion_ = read_nvfuser(WITH_BLOCK, [x, y], warn=False, symbolic=True)
    assert [s.sizes for s in fusion_.symbolic] == [(6,)] and fusion_.sizes is None  # (t0 is static_sizes)
    assert_matches_eager(lambda a, b: (a + b,), [x, y], fusion_.graph, program=_program(fusion_.graph))
