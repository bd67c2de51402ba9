"""Differential fuzzing: random programs through capture -> segment -> alias (off, pre, post) ->
runtime, each checked against eager PyTorch (values, dtypes, shapes, strides, aliasing among
outputs and inputs, final values of mutated inputs) and by ``alias.check``.

``FUSEG_FUZZ_EXAMPLES`` sets how many programs to draw (default 200, what CI runs; the same 200
every run unless ``FUSEG_FUZZ_RANDOM=1``); the
coverage counters are printed at the end of the pytest run (tests/conftest.py), so a generator
that stops producing a case is noticed.
"""

from __future__ import annotations

import os
from collections import Counter

import torch
from hypothesis import HealthCheck, Phase, given, settings

import runtime
from alias import MODES, apply_aliases, check
from runtime.codegen.build import cpu_compiler
from segmenter import CaptureError, SegmenterOptions, TensorMeta, capture, segment
from segmenter.capturing.recorded import overlaps_itself
from segmenter.capturing.reference import clone_inputs
from segmenter.formats.serialize import from_json, to_json

from .programs import Program, programs
from .util import assert_matches_eager

COVERAGE: Counter = Counter()
EXAMPLES = int(os.environ.get("FUSEG_FUZZ_EXAMPLES", "200"))
# the torch backend, and the kernel generator's C++ target where a compiler is found
BACKENDS = ("torch", "cpp") if cpu_compiler() else ("torch",)


def _writes_an_overlapping_input(fn, inputs: list[torch.Tensor]) -> bool:
    """Whether eager changes an input whose elements share memory (a stride-0 dim)."""
    ins = clone_inputs(inputs)
    fn(*ins)
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))

    return any(overlaps_itself(TensorMeta.from_tensor(a)) and not same(a, b) for a, b in zip(ins, inputs))


def check_program(prog: Program, inputs: list[torch.Tensor]) -> None:
    fn = prog.as_function()
    try:
        graph = capture(fn, clone_inputs(inputs), name="fuzzed")
    except CaptureError as e:
        # the one refusal a fuzzed program may meet (tests/test_capture_effects.py), and only
        # where eager did write into such an input
        if "elements that share memory" not in str(e) or not _writes_an_overlapping_input(fn, inputs):
            raise
        COVERAGE["refused:write into overlapping input"] += 1
        return
    assert from_json(to_json(graph)) == graph  # a captured graph's recorded aliasing passes the loader's checks
    sf = segment(graph)
    for mode in MODES:
        plan = apply_aliases(sf, mode)
        problems = check(sf, plan)
        assert problems == [], problems
        for backend in BACKENDS:
            program = runtime.compile(plan, backend=backend)
            assert_matches_eager(fn, inputs, graph, program=program, atol=1e-4, rtol=1e-4)
            COVERAGE[f"mode:{mode}/{backend}"] += 1
            COVERAGE[f"generated kernels:{backend}"] += sum(b == backend for b in program.backend_of.values())
            COVERAGE[f"views passed as pointers:{backend}"] += len(program.pointers)
            COVERAGE[f"matmul kernels:{backend}"] += sum(k.kind == "matmul" for k in program.kernels.values())
    if "cpp" in BACKENDS:  # one op a segment: many kernels a program, run as chains (runtime/compiled/chains.py)
        program = runtime.compile(apply_aliases(segment(graph, SegmenterOptions(max_ops_per_segment=1)), "post"),
                                  backend="cpp")
        assert_matches_eager(fn, inputs, graph, program=program, atol=1e-4, rtol=1e-4)
        # (a chain with groups runs them on its first call and one by one on its second: Note
        # [kernels side by side])
        assert_matches_eager(fn, inputs, graph, program=program, atol=1e-4, rtol=1e-4)
        COVERAGE["chains:cpp"] += len(program.chains)
        COVERAGE["chained kernels:cpp"] += sum(c.kernels for c in program.chains)
        COVERAGE["chain groups:cpp"] += sum(len(c.groups) for c in program.chains)


# shrinking a failure can take many minutes; FUSEG_FUZZ_SHRINK=0 reports the first failure as found
_PHASES = tuple(Phase) if os.environ.get("FUSEG_FUZZ_SHRINK", "1") != "0" else (Phase.explicit, Phase.generate)


# CI draws the same programs every run (derandomize); FUSEG_FUZZ_RANDOM=1 draws new ones (by hand)
_RANDOM = os.environ.get("FUSEG_FUZZ_RANDOM", "0") == "1"


@settings(max_examples=EXAMPLES, deadline=None, database=None, phases=_PHASES, derandomize=not _RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(programs())
def test_random_programs_match_eager(drawn: tuple[Program, list[torch.Tensor]]) -> None:
    prog, inputs = drawn
    check_program(prog, inputs)
    COVERAGE.update(prog.tags)
    COVERAGE["programs"] += 1
