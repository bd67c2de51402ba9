"""Differential fuzzing at two shapes (issue 41): each random program of tests/programs.py is
compiled with ``torch.compile(backend="fuseg", dynamic=True)`` and called on its inputs, then on
inputs of a second shape (every size of 2 or more grown by the same amount, so sizes that were
equal stay equal and 0s and 1s, which dynamo specializes, stay), then on the first again; each
call is checked against eager as test_fuzz_dynamo checks it (values, strides, aliasing, inputs
afterwards). A program eager refuses at the second shape (a step whose constants fit only the
first) is discarded. Dynamo hands over graphs with symbolic sizes: one plan serves both shapes
(Note [symbolic plans]) or, where one cannot be made, each shape is specialized (counted).

``FUSEG_FUZZ_DYNAMIC_EXAMPLES`` sets how many programs (default 30, what CI runs)."""

from __future__ import annotations

import os
import warnings
from collections import Counter

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from segmenter.capturing.reference import clone_inputs

from .programs import Program, programs
from .test_fuzz import _RANDOM
from .test_fuzz_dynamo import TORCH_BUGS, _difference, _tensors

EXAMPLES = int(os.environ.get("FUSEG_FUZZ_DYNAMIC_EXAMPLES", "30"))
#: what the runs met: plans made symbolically, graphs specialized instead, programs discarded
SEEN: Counter = Counter()


def grown(inputs: list[torch.Tensor], by: int) -> list[torch.Tensor]:
    """The inputs at the second shape: every size >= 2 plus ``by``, same dtype, the same kind of
    layout (a transposed input stays transposed, an expanded one expanded, an offset one offset);
    inputs that were one tensor passed twice stay one."""
    made: dict[int, torch.Tensor] = {}
    out = []
    for t in inputs:
        if id(t) in made:
            out.append(made[id(t)])
            continue
        shape = tuple(n + by if n >= 2 else n for n in t.shape)
        g = torch.Generator().manual_seed(sum(shape) + 7)
        base = torch.randn(max(1, torch.Size(shape).numel() + 5), generator=g) * 3
        if t.dtype == torch.bool:
            base = base > 0
        elif t.dtype.is_floating_point:
            base = base.to(t.dtype)
        else:
            base = base.round().to(t.dtype)
        n = torch.Size(shape).numel()
        if t.storage_offset():
            new = base[3:3 + n].view(shape)
        elif t.dim() >= 2 and t.stride()[0] == 1 and t.stride()[-1] != 1 and shape[0] > 1 and shape[-1] > 1:
            new = base[:n].view(shape[::-1][:1] + shape[1:-1] + shape[:1]).transpose(0, -1)
        elif t.dim() and t.stride()[0] == 0 and shape[0] > 1:
            new = base[:torch.Size(shape[1:]).numel()].view((1, *shape[1:])).expand(shape)
        else:
            new = base[:n].view(shape)
        made[id(t)] = new
        out.append(new)
    return out


def _calls(fn, backend, shapes: list[list[torch.Tensor]]):
    torch._dynamo.reset()
    f = fn if backend is None else torch.compile(fn, backend=backend, dynamic=True)
    runs = []
    for inputs in shapes:
        ins = clone_inputs(inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs.append((_tensors(f(*ins)), ins))
    return runs


def check_two_shapes(prog: Program, inputs: list[torch.Tensor], by: int) -> None:
    fn = prog.as_function()
    second = grown(inputs, by)
    try:
        want = _calls(fn, None, [inputs, second, inputs])
    except (RuntimeError, IndexError, ValueError, TypeError):
        SEEN["discarded: eager refuses the second shape"] += 1
        assume(False)
    from runtime.dynamo import STATS

    before = (STATS["symbolic_plans"], STATS["specialized_programs"])
    try:
        got = _calls(fn, "fuseg", [inputs, second, inputs])
    except Exception as ours:
        try:
            _calls(fn, "aot_eager", [inputs, second, inputs])
        except type(ours) as theirs:
            if str(theirs) == str(ours):
                TORCH_BUGS[f"raises {type(ours).__name__}: {str(ours)[:80]}"] += 1
                assume(False)
        raise
    SEEN["symbolic plans"] += STATS["symbolic_plans"] - before[0]
    SEEN["specialized programs"] += STATS["specialized_programs"] - before[1]
    diff = _difference(want, got)
    if diff is not None and _difference(_calls(fn, "aot_eager", [inputs, second, inputs]), got) is None:
        TORCH_BUGS[diff] += 1
        assume(False)
    assert diff is None, diff


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not _RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(programs(), st.integers(1, 4))
def test_random_programs_at_two_shapes(drawn: tuple[Program, list[torch.Tensor]], by: int) -> None:
    prog, inputs = drawn
    with torch.no_grad():
        check_two_shapes(prog, inputs, by)


def test_the_fuzzers_programs_do_get_symbolic_plans() -> None:
    """The property above passes as well where every graph is specialized: a fixed program of
    the fuzzer's kinds must be planned symbolically (one plan, two shapes)."""
    prog = Program(2, [("binary", 0, 1, "add"), ("softmax", 2, -1), ("reduce", 3, "sum", 0, False),
                       ("permute", 2, (1, 0)), ("unary", 5, "exp")], [3, 4, 6])
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    from runtime.dynamo import STATS

    before = STATS["symbolic_plans"], STATS["specialized_programs"], len(STATS["symbolic_refused"])
    with torch.no_grad():
        check_two_shapes(prog, [x, y], 2)
    assert STATS["symbolic_plans"] - before[0] == 1
    assert STATS["specialized_programs"] - before[1] == 0 and len(STATS["symbolic_refused"]) == before[2]


def test_a_size_read_from_a_number_beside_shared_tensors() -> None:
    """Found by this fuzzer: a program whose symbol is read from a number input (Note [number
    inputs]) and whose tensor inputs may share storage: the storage test reached for the
    number's storage (its plan refused the call it was made for)."""
    prog = Program(3, [("unary", 0, "sin"), ("unary", 1, "sin"), ("scalar", 0, "add", 2)], [3])
    with torch.no_grad():
        check_two_shapes(prog, [torch.tensor([4.6230, -0.8803]), torch.tensor(4.6230), torch.tensor(4.6230)], 1)


def test_one_empty_tensor_passed_twice_and_written() -> None:
    """Found by this fuzzer: one tensor passed as two inputs, written in place through the first
    (an epilogue only) under dynamic=True: refused as "inputs share a storage and the graph
    mutates" by a check made broader for the training graphs; eager's result again."""
    prog = Program(2, [("inplace", 0, "add_", 1), ("unary", 0, "sin"), ("unary", 0, "sin"), ("unary", 1, "sin")],
                   [2], same_input_twice=True)
    x = torch.tensor([])
    with torch.no_grad():
        check_two_shapes(prog, [x, x], 1)
