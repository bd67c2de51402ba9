"""Differential fuzzing through ``torch.compile(backend="fuseg")``: the fuzzer's random programs
(tests/programs.py) compiled by dynamo and AOTAutograd, called three times on fresh copies of the
inputs (the first call compiles; later ones take Note [direct inference call] where AOTAutograd's
wrapper has nothing to do), each checked against eager: values, dtypes, shapes, strides, which
outputs share storage with which inputs and outputs, and the inputs' values afterwards.

``FUSEG_FUZZ_DYNAMO_EXAMPLES`` sets how many programs (default 40, what CI runs, the same every
run unless ``FUSEG_FUZZ_RANDOM=1``).
"""

from __future__ import annotations

import os
import warnings
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from torch.utils import _pytree as pytree

from segmenter.capturing.reference import clone_inputs

from .programs import Program, programs
from .test_fuzz import _RANDOM
from .util import alias_pattern, layout

EXAMPLES = int(os.environ.get("FUSEG_FUZZ_DYNAMO_EXAMPLES", "40"))

# Note [torch's own bugs]: where torch.compile(backend="aot_eager"), torch's own AOTAutograd path
# with no compiler of ours, gives exactly our results and both differ from eager, the bug is
# torch's; such examples are discarded (counted here) and the known ones are strict xfails below,
# so a torch that fixes them is noticed.
TORCH_BUGS: Counter = Counter()


def _tensors(x) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _run(fn, backend, inputs: list[torch.Tensor], calls: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Per call: (outputs, inputs afterwards) of ``fn`` compiled for ``backend`` (None: eager)."""
    torch._dynamo.reset()
    f = fn if backend is None else torch.compile(fn, backend=backend)
    runs = []
    for _ in range(calls):
        ins = clone_inputs(inputs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs.append((_tensors(f(*ins)), ins))
    return runs


def _close(g: torch.Tensor, e: torch.Tensor) -> bool:
    """Values as the fuzzers compare them: 1e-4 for floats (NaN equal to NaN), exact otherwise."""
    if e.is_floating_point():
        return torch.allclose(g.cpu(), e.cpu(), atol=1e-4, rtol=1e-4, equal_nan=True)
    return torch.equal(g, e)


def _difference(want, got) -> str | None:
    """What differs between two runs (values, layouts, aliasing, inputs afterwards), or None."""
    for call, ((w_out, w_in), (g_out, g_in)) in enumerate(zip(want, got)):
        if len(w_out) != len(g_out):
            return f"call {call}: {len(g_out)} outputs, eager {len(w_out)}"
        for j, (e, g) in enumerate(zip(w_out, g_out)):
            if layout(e) != layout(g):
                return f"call {call} output {j}: eager {layout(e)} ours {layout(g)}"
            if not _close(g, e):
                return f"call {call} output {j}: values"
        if alias_pattern(w_in, w_out) != alias_pattern(g_in, g_out):
            return f"call {call}: aliasing"
        for i, (e, g) in enumerate(zip(w_in, g_in)):
            if not _close(g, e):
                return f"call {call} input {i} afterwards"
    return None


def _ours_or_torchs(run):
    """``run("fuseg")``; where it raises and ``run("aot_eager")``, torch's own AOTAutograd path,
    raises the same error word for word, the bug is torch's (the view replay of
    test_torch_replays_a_view_of_an_input_passed_twice): the example is discarded."""
    try:
        return run("fuseg")
    except Exception as ours:
        try:
            run("aot_eager")
        except type(ours) as theirs:
            if str(theirs) == str(ours):
                TORCH_BUGS[f"raises {type(ours).__name__}: {str(ours)[:80]}"] += 1
                assume(False)
        raise


def check_compiled(prog: Program, inputs: list[torch.Tensor], calls: int = 3) -> None:
    """Our compiled program against eager; where they differ and torch's own AOTAutograd path
    (``aot_eager``) gives our results, the difference is torch's (Note [torch's own bugs]): the
    example is discarded, not passed."""
    fn = prog.as_function()
    want = _run(fn, None, inputs, calls)
    got = _ours_or_torchs(lambda backend: _run(fn, backend, inputs, calls))
    diff = _difference(want, got)
    if diff is not None and _difference(_run(fn, "aot_eager", inputs, calls), got) is None:
        TORCH_BUGS[diff] += 1
        assume(False)
    assert diff is None, diff


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not _RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(programs())
def test_random_programs_through_torch_compile(drawn: tuple[Program, list[torch.Tensor]]) -> None:
    prog, inputs = drawn
    with torch.no_grad():
        check_compiled(prog, inputs)


@pytest.mark.xfail(strict=True, reason="torch 2.13: an AOTAutograd backend drops an in-place op on a 0-dim "
                   "float64 input (aot_eager and inductor too; backend='eager' keeps it)")
def test_torch_drops_an_in_place_add_on_a_0_dim_float64_input() -> None:
    """Found by this fuzzer. Dynamo's graph has ``x.add_(1)``; AOTAutograd's tensorify pass
    restarts the analysis, and the graph traced again has no op at all, so ``x`` is returned
    unchanged (4.0, eager: 5.0)."""
    def f(x):
        x.add_(1)
        return x

    torch._dynamo.reset()
    x = torch.tensor(4.0, dtype=torch.float64)
    with torch.no_grad():
        out = torch.compile(f, backend="fuseg")(x)
    assert x.item() == 5.0 and out.item() == 5.0


_SYNTHETIC_BASE = {  # found by this fuzzer: one tensor passed twice, a view of it returned, an add_ through the other
    view: Program(2, [("unary", 0, "sin"), ("unary", 0, "sin"), step, ("unary", 0, "sin"), ("unary", 0, "sin"),
                      ("unary", 0, "sin"), ("inplace", 1, "add_", 1)], [4], same_input_twice=True)
    for view, step in (("unsqueeze", ("unsqueeze", 0, 0)), ("permute", ("permute", 0, (0, 1))))}


@pytest.mark.xfail(strict=True, raises=(AssertionError, RuntimeError),
                   reason="torch 2.13: AOTAutograd's replay of an output view over a synthetic base fails "
                   "(aot_eager too): 'incorrect out shape after application of ViewMeta sequence', "
                   "'permute(sparse_coo): number of dimensions ... does not match'")
@pytest.mark.parametrize("view", sorted(_SYNTHETIC_BASE))
def test_torch_replays_a_view_of_an_input_passed_twice(view: str) -> None:
    """Two inputs sharing one storage (AOTAutograd makes them one synthetic base), one written in
    place, a view of the other returned: torch's own ``aot_eager`` raises in its runtime wrapper,
    as ours does (ours raises the same error: check_compiled counts it as torch's)."""
    x = torch.tensor([[5]], dtype=torch.int32)
    with torch.no_grad():
        _run(_SYNTHETIC_BASE[view].as_function(), "aot_eager", [x, x], 3)


def test_an_expanded_view_of_a_mutated_input_is_returned() -> None:
    """Found by this fuzzer: ``x.add_(1); return x.expand(1, 2)`` (sins between, unused).
    AOTAutograd's graph returns the expanded value as an output of its own; it shares the input's
    storage, so it is handed back as a fresh copy in its own layout, and that copy was made with
    ``copy_`` into a stride-0 buffer, which torch refuses ("more than one element of the
    written-to tensor refers to a single memory location")."""
    with torch.no_grad():
        check_compiled(Program(1, [("inplace", 0, "add_", 1), ("unary", 0, "sin"), ("unary", 0, "sin"),
                                   ("expand", 0, (1, 2)), ("unary", 0, "sin")], [3]),
                       [torch.tensor([4.6230])])
    # the same in a captured graph: an output that is a copy in the graph and repeats elements
    from segmenter import capture
    from segmenter.capturing.reference import finish

    x = torch.tensor([4.6230])
    g = capture(lambda t: t.expand(3, 2).clone(), [x])
    (out,) = finish(g, [x], {g.outputs[0]: x.expand(3, 2)})
    assert out.stride() == (0, 0) and torch.equal(out, x.expand(3, 2))
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_a_graph_whose_values_nothing_returns_runs() -> None:
    """Found by this fuzzer: ``x.sin(); return x`` — dynamo returns the input itself and hands
    AOTAutograd a graph whose one op nothing returns; ``from_fx`` refused the empty graph and the
    whole torch.compile call failed. Such a graph now runs as it is."""
    with torch.no_grad():
        check_compiled(Program(1, [("unary", 0, "sin")], [0]), [torch.tensor(4.6230)])
        check_compiled(Program(2, [("binary", 0, 1, "add"), ("unary", 2, "exp")], [1, 0]),
                       [torch.randn(3), torch.randn(3)])


TRAIN_EXAMPLES = int(os.environ.get("FUSEG_FUZZ_TRAIN_EXAMPLES", "20"))


def _train(fn, backend, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Outputs and input gradients of one training call: float inputs require grad, and the loss
    weighs each output that needs grad by its position."""
    torch._dynamo.reset()
    f = fn if backend is None else torch.compile(fn, backend=backend)
    ins = clone_inputs(inputs)
    for t in {id(t): t for t in ins if t.is_floating_point()}.values():
        t.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = _tensors(f(*ins))
        losses = [(o.double() * (k + 1)).sum() for k, o in enumerate(outs) if o.requires_grad]
        if losses:
            torch.stack(losses).sum().backward()
    return [o.detach() for o in outs], [t.grad for t in ins]


def _train_difference(want, got) -> str | None:
    (w_out, w_grad), (g_out, g_grad) = want, got
    if len(w_out) != len(g_out):
        return f"{len(g_out)} outputs, eager {len(w_out)}"
    for j, (e, g) in enumerate([*zip(w_out, g_out), *zip(w_grad, g_grad)]):
        if (e is None) != (g is None):
            return f"value {j}: None on one side only"
        if e is not None and not _close(g, e):
            return f"value {j} (outputs, then input grads): values"
    return None


@settings(max_examples=TRAIN_EXAMPLES, deadline=None, database=None, derandomize=not _RANDOM,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(programs())
def test_random_programs_train_through_torch_compile(drawn: tuple[Program, list[torch.Tensor]]) -> None:
    """The same programs with float inputs that require grad, through AOTAutograd's training
    path (forward and backward graphs, both ours): outputs and input gradients against eager.
    Programs eager refuses to differentiate (an in-place op on a leaf that needs grad) are
    discarded."""
    prog, inputs = drawn
    fn = prog.as_function()
    try:
        want = _train(fn, None, inputs)
    except RuntimeError:
        assume(False)
    got = _ours_or_torchs(lambda backend: _train(fn, backend, inputs))
    diff = _train_difference(want, got)
    if diff is not None and _train_difference(_train(fn, "aot_eager", inputs), got) is None:
        TORCH_BUGS[diff] += 1
        assume(False)
    assert diff is None, diff
