"""CUDA graphs of compiled programs on a real GPU (Note [CUDA graphs of a program] in
runtime/cudagraphs.py) against eager CUDA PyTorch; skipped where there is no GPU. The CPU-side
logic (which plans are captured, every path of a call) is tests/test_cudagraphs.py."""

from __future__ import annotations

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.cudagraphs import WARMUP_CALLS, use_cuda_graphs
from segmenter import capture, segment
from segmenter.capturing.reference import clone_inputs

from .kernel_cases import CASES, TOL
from .test_gpu import _cuda_ready, to_cuda
from .util import assert_matches_eager

pytestmark = pytest.mark.skipif(not _cuda_ready(), reason="needs a CUDA device and CuPy")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _graphed_program(fn, inputs):
    program = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="auto")
    calls = use_cuda_graphs(program)
    assert calls is not None, program.cuda_graph_refused
    return program, calls


def _compiled(fn):
    from runtime.dynamo import FusegCompiler, compile_with_aot

    compiler = FusegCompiler(cuda_graphs=True)
    return compiler, torch.compile(fn, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex), dynamic=False)


def _assert_replayed(compiler, calls: int, at_least: int | None = None) -> None:
    """Every graphed program of ``compiler`` warmed up once, captured once and replayed on every
    plain call after that; ``calls`` calls were made. The first call through ``torch.compile`` may
    not reach the graph: torch 2.11's AOTAutograd runs it under a dispatch mode of its own, so it
    takes the program's checked path (Note [one entry]) and the warm-up is the second call (torch
    2.13 makes it plainly). Exact counts of each path are tests/test_cudagraphs.py's."""
    graphed = [p.cuda_graph for p in compiler.compiled if p.cuda_graph is not None]
    assert graphed, _why_not(compiler)
    for g in graphed:
        c = g.counts
        reached = c["warm-up"] + c["captured"] + c["replayed"]
        assert c["moved"] == 0 and c["released"] == 0 and g.refused is None, (c, g.refused)
        assert c["warm-up"] == WARMUP_CALLS and c["captured"] == 1, c
        assert calls - 1 <= reached <= calls, (c, calls)
    replays = sum(g.counts["replayed"] for g in graphed)
    assert replays >= (at_least if at_least is not None else calls - WARMUP_CALLS - 2), _why_not(compiler)


def _why_not(compiler) -> list:
    return [(p.cuda_graph_refused or (p.cuda_graph and p.cuda_graph.refused)) for p in compiler.compiled]


def _restore(inputs: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    """Every input's storage back to the saved values, at the same address (any layout)."""
    for t, s in zip(inputs, saved):
        t.untyped_storage().copy_(s.untyped_storage())


def _at_captured_addresses(program, inputs: list[torch.Tensor]):
    """``program`` as ``assert_matches_eager`` calls it (on copies of the inputs), run on
    ``inputs`` themselves, where its graph was captured: the copies' values go in first, and the
    inputs' values after the call go back into the copies, which the check compares with eager's."""
    def call(*copies: torch.Tensor) -> list[torch.Tensor]:
        _restore(inputs, list(copies))
        out = program(*inputs)
        _restore(list(copies), inputs)
        return out
    return call


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_cases_replay_like_eager(case: str) -> None:
    """Every kernel case: warm-up, capture, then replays, each call against eager on copies of
    the same inputs: values, layouts, storage sharing, and the inputs afterwards."""
    fn, cpu_inputs = CASES[case]
    inputs = [to_cuda(t) for t in cpu_inputs]
    program = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="auto")
    calls = use_cuda_graphs(program)
    if calls is None:
        pytest.skip(f"not captured: {program.cuda_graph_refused}")
    tol = max(TOL.get(case, 1e-6), 1e-5)
    saved = clone_inputs(inputs)
    for _ in range(4):
        assert_matches_eager(fn, saved, program.graph, program=_at_captured_addresses(program, inputs),
                             atol=tol, rtol=tol)
    assert (calls.counts["warm-up"], calls.counts["captured"], calls.counts["replayed"]) == (1, 1, 2), calls.counts


def _replaying(case: str):
    """A kernel case's graphed program after its warm-up, its capture and one replay."""
    fn, cpu_inputs = CASES[case]
    inputs = [to_cuda(t) for t in cpu_inputs]
    program, calls = _graphed_program(fn, inputs)
    for _ in range(3):
        program(*inputs)
    assert calls.counts["replayed"] == 1, calls.counts
    return fn, inputs, program, calls


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                               torch.nn.LayerNorm(64)).cuda().eval()


def test_cublas_and_generated_kernels_in_one_graph_through_torch_compile() -> None:
    model = _mlp()
    compiler, compiled = _compiled(model)
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        for _ in range(5):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    _assert_replayed(compiler, 5)


def test_the_backend_option_by_name() -> None:
    model = _mlp()
    compiled = torch.compile(model, backend="fuseg", options={"cuda_graphs": True})
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny", "bert-tiny"])
def test_zoo_transformers_replay_and_match_eager(name: str) -> None:
    pytest.importorskip("transformers")
    from perf import zoo

    model, (ids,) = zoo.get(name).factory()
    model, ids = model.cuda(), ids.cuda()
    compiler, compiled = _compiled(model)
    with torch.no_grad():
        want = model(ids).last_hidden_state
        for _ in range(5):
            torch.testing.assert_close(compiled(ids).last_hidden_state, want, atol=1e-4, rtol=1e-4)
    _assert_replayed(compiler, 5)


def _mutates(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    buf.add_(x)
    return buf * 2 + x


def test_mutated_inputs_are_updated_on_every_replay() -> None:
    compiler, compiled = _compiled(_mutates)
    x = torch.randn(16, 32, device="cuda")
    buf, want_buf = torch.zeros(16, 32, device="cuda"), torch.zeros(16, 32, device="cuda")
    for _ in range(5):
        want = _mutates(x, want_buf)
        got = compiled(x, buf)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(buf, want_buf)
    _assert_replayed(compiler, 5)


def test_an_input_that_moved_runs_uncaptured() -> None:
    fn, inputs, program, calls = _replaying("rms-norm")
    moved = [inputs[0] * 3, *inputs[1:]]
    torch.testing.assert_close(program(*moved)[0], fn(*moved), atol=1e-5, rtol=1e-5)
    assert calls.counts["moved"] == 1
    torch.testing.assert_close(program(*inputs)[0], fn(*inputs), atol=1e-5, rtol=1e-5)
    assert calls.counts["replayed"] == 2


def test_another_shape_gets_a_program_and_a_graph_of_its_own() -> None:
    def fn(x):
        return torch.softmax(x * 2, -1) + 1

    compiler, compiled = _compiled(fn)
    a, b = torch.randn(32, 128, device="cuda"), torch.randn(16, 256, device="cuda")
    for x in (a, a, a, b, b, b, b, a, a):
        torch.testing.assert_close(compiled(x), fn(x))
    graphed = [p.cuda_graph for p in compiler.compiled if p.cuda_graph is not None]
    assert len(graphed) == 2, _why_not(compiler)
    # a: 5 calls, b: 4 (each program's first call may take the checked path: _assert_replayed)
    assert [g.counts["replayed"] for g in graphed] in ([3, 2], [2, 1]), [g.counts for g in graphed]
    assert all(g.counts["moved"] == 0 and g.counts["captured"] == 1 for g in graphed)


def test_outputs_kept_across_calls_are_not_overwritten() -> None:
    fn, inputs, program, calls = _replaying("softmax")
    kept = program(*inputs)[0]  # (the case returns softmax and log_softmax)
    want = fn(*inputs)[0]
    inputs[0].mul_(-2)  # in place: the same address, so the next call replays
    new = program(*inputs)[0]
    assert calls.counts["replayed"] == 3
    torch.testing.assert_close(new, fn(*inputs)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kept, want, atol=1e-5, rtol=1e-5)


def test_replays_run_on_torchs_current_stream() -> None:
    fn, (x, w), program, calls = _replaying("rms-norm")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):  # a busy stream: a replay on another would read x before the mul_
            big = big @ big * 1e-3
        x.mul_(1.5)  # in place: the call replays
        got = program(x, w)[0]
    torch.cuda.synchronize()
    assert calls.counts["replayed"] == 2
    torch.testing.assert_close(got, fn(x, w), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fn, why", [
    (lambda x: (x * 2, x.sum().item()), "handed back as a number"),
    (lambda x: x + torch.rand_like(x), "random"),
    (lambda x, s: x * s, "is on cpu"),
])
def test_programs_that_cannot_be_captured_run_as_before(fn, why: str) -> None:
    inputs = [torch.randn(8, 16, device="cuda")]
    if fn.__code__.co_argcount == 2:
        inputs.append(torch.tensor(3.0))  # a CPU scalar beside a CUDA tensor
    program = runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="auto")
    assert use_cuda_graphs(program) is None
    assert why in program.cuda_graph_refused
    for _ in range(3):
        got = program(*inputs)
    if why != "random":
        want = fn(*inputs)
        want = list(want) if isinstance(want, tuple) else [want]
        for g, w in zip(got, want):  # (a sum in another order than ATen's: float32 rounding)
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
