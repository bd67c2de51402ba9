"""Every failure the differential fuzzer found, kept as a permanent test (tests/test_fuzz.py runs
each program through capture -> segment -> alias (off, pre, post) -> runtime (torch and the
generated C++ kernels) and checks it against eager)."""

from __future__ import annotations

import pytest
import torch

from segmenter import capture

from .programs import Program
from .test_fuzz import check_program


def _offset(values: list, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    base = torch.zeros(len(values) + 3, dtype=dtype)
    base[3:] = torch.tensor(values, dtype=dtype)
    return base[3:].view(shape)


def _transposed_int() -> torch.Tensor:
    return torch.tensor([[-1, 2, 5, -1], [0, 5, -3, 0]], dtype=torch.int32).t().unsqueeze(0)


def _cases() -> dict[str, tuple[Program, list[torch.Tensor]]]:
    x = torch.tensor([2.4574], dtype=torch.float64)
    three = torch.tensor([3], dtype=torch.int32)
    return {
        # the torch launch copied a stride-0 output with copy_, which refuses overlapping writes
        "expanded-output-of-an-input": (
            Program(3, [("inplace", 1, "mul_", 1), ("expand", 2, (2, 2, 2)), ("slice", 2, -1, 1, None, 2)], [3, 3, 3]),
            [torch.tensor(1.7579), torch.randn(2, 3, 1), torch.tensor([[0, 1], [0, -5]], dtype=torch.int32)]),
        # view(dtype) of ints makes NaNs: eager's NaNs are ours (the check compared NaN != NaN)
        "view-dtype-nan": (
            Program(1, [("scalar", 0, "mul", 2), ("view_dtype", 1, torch.float32), ("unsqueeze", 0, 3),
                        ("binary", 2, 2, "maximum"), ("unary", 0, "sin"), ("scalar", 0, "sub", 0.5)], [2, 1, 2]),
            [_offset([0, -8, 2, -3, -3, -1], torch.int32, (1, 2, 3))]),
        # write-back into an empty input with a stride-0 dim: eager writes nothing and does not raise
        "mutated-empty-expanded-input": (
            Program(2, [("view_dtype", 0, torch.int32), ("unary", 2, "abs"), ("unsqueeze", 3, 1),
                        ("inplace", 1, "add_", 1)], [1]),
            [torch.randn(2, 4, 2), torch.empty(1, 1, 0, dtype=torch.int32).expand(2, 1, 0)]),
        # capture copied an input with repeated elements (stride 0) with copy_, which refuses it
        "passed-twice-with-expanded-input": (
            Program(3, [("unary", 0, "sin"), ("unary", 1, "neg"), ("unary", 4, "abs"), ("unary", 4, "exp"),
                        ("scalar", 0, "mul", -1), ("scalar", 2, "mul", -1)], [2, 4, 1], same_input_twice=True),
            [x, x, torch.zeros(1, dtype=torch.int32).expand(2)]),
        # a generated kernel wrote views of its own values into fresh buffers: outputs that view
        # one another (here an empty slice at offset 2 of a cat) lost their shared storage
        "views-of-a-kernel-value": (
            Program(2, [("cat", 1, 0, -1), ("slice", 2, 0, 2, None, 2)], [0, 3, 3], same_input_twice=True),
            [three, three]),
        # mean over an empty dim is NaN in eager and here
        "mean-over-empty-dim": (Program(1, [("reduce", 0, "mean", 1, False)], [1]), [torch.randn(3, 0)]),
        # an output that views an input the program later mutates
        "view-of-an-input-mutated-later": (
            Program(3, [("expand", 1, (2, 2)), ("inplace", 1, "add_", 1)], [3]),
            [torch.tensor([]), torch.tensor([4.62, -0.88]), torch.tensor(4.62)]),
        # a reshape of a transposed input, the input mutated afterwards (size-1 dims' strides differ)
        "reshape-of-transposed-input-then-mutated": (
            Program(2, [("unsqueeze", 1, -1), ("select", 1, 0, -3), ("reshape", 0, (1, 1, 4, 2)),
                        ("to", 0, torch.float32), ("view_dtype", 3, torch.float64), ("scalar", 6, "add", 0.5),
                        ("inplace", 0, "add_", 1), ("unsqueeze", 1, 1)], [3, 4]),
            [_transposed_int(), torch.tensor([-1.4813, 0.6044, 0.8091], dtype=torch.float64)]),
        # the in-place write-back called _to_copy.out with the dtype keyword it does not take
        "write-back-through-a-cast": (
            Program(1, [("expand", 0, (2, 0)), ("inplace", 1, "add_", 1), ("to", 0, torch.float32),
                        ("to", 0, torch.float32), ("where", 2, 0)], [1]),
            [torch.empty(0, dtype=torch.int32)]),
        # the plan check found a segment reading a reshape of an empty input before it was made
        "in-place-add-through-a-reshape-of-an-empty-input": (
            Program(1, [("inplace", 0, "add_", 1), ("reshape", 0, (-1,)), ("inplace", 1, "add_", 1),
                        ("to", 1, torch.float32)], [0]),
            [torch.empty(0, dtype=torch.int32)]),
        # an empty slice of an expanded input: its size-0 dim has stride 0, and the copy into a
        # fresh layout made that dim 1 long (a broadcast error instead of an empty output)
        "empty-slice-of-an-expanded-input": (
            Program(3, [("expand", 0, (1, 2, 1)), ("unary", 0, "sin"), ("slice", 3, 0, 0, -1, 1)], [5],
                    same_input_twice=True),
            [torch.tensor([[4.6230]]), torch.tensor([[4.6230]]), torch.tensor(4.6230)]),
        # the plan check: "s0 reads %alias before it is made" (a dead reshape of a dtype view of
        # an empty input, beside a kernel reading that view)
        "dead-reshape-of-a-dtype-view-of-an-empty-input": (
            Program(1, [("view_dtype", 0, torch.int32), ("unary", 1, "sin"), ("reshape", 1, (-1,)),
                        ("to", 3, torch.float32)], [2]),
            [torch.empty(0)]),
        # refused at capture (a write into an input whose elements share memory), not by the
        # loader after capture made the graph and the program raised at run time
        "write-through-a-slice-of-an-expanded-input": (
            Program(1, [("slice", 0, 0, 0, None, 2), ("unary", 0, "sin"), ("unary", 0, "sin"),
                        ("inplace", 1, "add_", 1)], [0]),
            [torch.tensor([4.6230]).expand(2)]),
        # SDPA on the CPU: capture took torch.export's decomposition of the flash op, whose output
        # is laid out [L, N, H, E] in memory; eager's op (and its meta) gives it contiguous, so the
        # sin after it, and every output of a pointwise op after attention, had other strides
        "attention-output-layout": (
            Program(3, [("unary", 0, "sin")] * 4 + [("attention", 1, False)] + [("unary", 0, "sin")] * 3, [7]),
            [torch.tensor([]), torch.tensor([[[4.6230], [-0.8803]], [[-6.5364], [1.7053]]]), torch.tensor(4.6230)]),
        # an int tensor viewed as float (subnormals) through attention and viewed back as int:
        # our attention kernel and ATen's differ by a subnormal ulp there (0.67 against 0.33 ulp
        # from the float64 result): the program generator now gives attention no subnormals
        "attention-of-subnormals-viewed-as-int": (
            Program(3, [("view_dtype", 1, torch.float32), ("attention", 3, False), ("unary", 0, "sin"),
                        ("unary", 0, "sin"), ("view_dtype", 4, torch.int32)], [7]),
            [torch.empty(0, 0, 0), torch.tensor([[[-3, -3], [2, 2], [2, -5]], [[-1, 6], [1, 0], [-1, 1]],
                                                 [[4, 5], [3, -3], [3, 4]]], dtype=torch.int32), torch.tensor(4.6230)]),
        "attention-output-layout-wide": (
            Program(1, [("attention", 0, True), ("unary", 1, "sin")], [2]),
            [torch.randn(2, 3, 4)]),
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_fuzzer_finding_stays_fixed(name: str) -> None:
    prog, inputs = _cases()[name]
    if prog.same_input_twice:
        inputs[1] = inputs[0]
    check_program(prog, inputs)


def test_programs_in_one_process_do_not_leak_metas_into_each_other() -> None:
    """The flaky finding: FakeTensor's dispatch cache (one per process, shared by every
    FakeTensorMode) rebuilt a cached non-view output without its storage offset. A slice_scatter
    of an offset input (the functional form of an in-place op on a view of it) has eager's offset
    (3) when first computed and 0 on every later hit: the first program to meet it recorded 3 at
    capture and alias.check then computed 0; run again, both said 0 (and eager says 3)."""
    def offset_input(n: int, seed: int) -> torch.Tensor:
        return torch.randn(n + 5, generator=torch.Generator().manual_seed(seed))[3:3 + n]

    a = Program(1, [("slice", 0, 0, 1, 7, 2), ("inplace", 1, "add_", 1), ("unary", 0, "sin")], [2])
    b = Program(1, [("slice", 0, 0, 1, 7, 2), ("inplace", 1, "add_", 1), ("scalar", 0, "mul", 2.0)], [2])
    for prog, seed in ((a, 0), (a, 1), (b, 2)):  # the sequence that leaked: a, a again, then b
        check_program(prog, [offset_input(11, seed)])
    graph = capture(a.as_function(), [offset_input(11, 3)])
    scatter, = (n for n in graph.nodes if n.op == "aten.slice_scatter.default")
    x = offset_input(11, 3)
    eager = torch.ops.aten.slice_scatter.default(x, x[1:7:2] + 1, 0, 1, 7, 2)
    assert scatter.metas[0].storage_offset == eager.storage_offset() == 3
