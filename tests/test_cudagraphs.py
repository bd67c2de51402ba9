"""CUDA graphs of programs (Note [CUDA graphs of a program] in runtime/cudagraphs.py), the parts
that need no GPU: which plans may be captured and why not, and the calls' paths (warm-up,
capture, replay, an input that moved, a failed capture, outputs the caller keeps, mutated
inputs) through a stand-in for the capture that records and replays on the CPU. The same
behaviour on a real GPU: tests/test_gpu_cudagraphs.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime import cudagraphs
from runtime.cudagraphs import _copier, node_refusal, plan_refusal, use_cuda_graphs
from segmenter import TensorMeta, capture, segment
from segmenter.capturing.reference import clone_inputs
from segmenter.ir.graph import Node, ValueRef


def _plan(fn, inputs):
    return apply_aliases(segment(capture(fn, inputs)), "post")


def _put_mask(x):
    y = x.clone()
    y[x > 0] = 0.0
    return y


def _put_at(x, i):
    y = x.clone()
    y[i] = 0.0
    return y


def _mutates(x, buf):
    buf.add_(x)
    return buf * 2 + x


#: name -> (function, inputs, what the refusal says; None: taken)
PLANS: dict[str, tuple[Any, list[torch.Tensor], str | None]] = {
    "softmax": (lambda x: torch.softmax(x, -1) * 2, [torch.randn(4, 8)], None),
    "gather-at-indices": (lambda x, i: x[i] * 2, [torch.randn(4, 8), torch.tensor([0, 2, 3])], None),
    "put-at-indices": (_put_at, [torch.randn(4, 8), torch.tensor([0, 2])], None),
    "mutates-an-input": (_mutates, [torch.randn(4, 8), torch.randn(4, 8)], None),
    "item": (lambda x: (x * 2, x.sum().item()), [torch.randn(4, 8)], "handed back as a number"),
    "put-under-a-mask": (_put_mask, [torch.randn(4, 8)], "indexes by a mask"),
    "random": (lambda x: x + torch.rand_like(x), [torch.randn(4, 8)], "draws random numbers"),
    "view-of-input": (lambda x: (x.t(), x * 2), [torch.randn(4, 8)], "a view of an input"),
    "metadata-mutation": (lambda x: x.t_(), [torch.randn(4, 8)], "a view of an input"),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_which_plans_are_captured(name: str) -> None:
    fn, inputs, why = PLANS[name]
    found = plan_refusal(_plan(fn, clone_inputs(inputs)), "cpu")
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found, found


def test_a_value_on_another_device_is_refused() -> None:
    plan = _plan(lambda x: x * 2, [torch.randn(3)])
    assert plan_refusal(plan, "cpu") is None
    assert "'x' is on cpu, not cuda" in (plan_refusal(plan, "cuda") or "")


def _node(op: str, args: tuple, kwargs: tuple = ()) -> Node:
    return Node("n", op, args, kwargs, ("out",), (TensorMeta((2, 2), (2, 1), 0, torch.float32),))


def test_attention_without_dropout_is_taken_and_with_dropout_refused() -> None:
    """What SDPA becomes on CUDA is tagged random for its dropout; with dropout_p 0 it draws nothing."""
    graph = _plan(lambda x: x * 2, [torch.randn(3)]).graph
    q = (ValueRef("q"), ValueRef("k"), ValueRef("v"))
    flash = "aten._scaled_dot_product_flash_attention.default"
    efficient = "aten._scaled_dot_product_efficient_attention.default"
    assert node_refusal(_node(flash, q), graph) is None  # dropout_p by default
    assert node_refusal(_node(flash, (*q, 0.0, True)), graph) is None
    assert "random" in (node_refusal(_node(flash, (*q, 0.1, True)), graph) or "")
    assert node_refusal(_node(efficient, (*q, None, False), (("dropout_p", 0.0),)), graph) is None
    assert "random" in (node_refusal(_node(efficient, (*q, None, False, 0.5)), graph) or "")
    assert "random" in (node_refusal(_node("aten.bernoulli.p", (ValueRef("q"), 0.5)), graph) or "")


def test_ops_that_read_values_on_the_host_are_refused() -> None:
    graph = _plan(lambda x: x * 2, [torch.randn(3)]).graph
    x = ValueRef("x")
    assert "read on the host" in (node_refusal(_node("aten._local_scalar_dense.default", (x,)), graph) or "")
    assert "number read from a tensor" in (node_refusal(_node("aten.is_nonzero.default", (x,)), graph) or "")
    assert "size of its output" in (node_refusal(_node("aten.nonzero.default", (x,)), graph) or "")
    assert node_refusal(_node("aten.add.Tensor", (x, x)), graph) is None


# -- the calls' paths, with a stand-in for the capture ------------------------------------------

class RecordingCapture:
    """Records by running on copies of the inputs (the caller sees nothing, as in a capture),
    replays by running on the inputs it recorded and writing into the outputs it recorded."""

    device_type = "cpu"

    def __init__(self) -> None:
        self.fail: str | None = None
        self.nested = False
        self.current = 1
        self.waited: list[int] = []
        self.replays = 0

    def warm(self, fn, args):
        return fn(*args)

    def capture(self, fn, args):
        if self.fail:
            raise RuntimeError(self.fail)
        static = fn(*clone_inputs(args))
        recorded = list(args)

        def replay() -> None:
            self.replays += 1
            for s, o in zip(static, fn(*recorded)):
                s.copy_(o)
        return replay, static

    def capturing(self) -> bool:
        return self.nested

    def stream(self) -> int:
        return self.current

    def wait_for(self, stream: int) -> None:
        self.waited.append(stream)


def _graphed(fn, inputs, backend: str = "torch"):
    program = runtime.compile(_plan(fn, clone_inputs(inputs)), backend=backend)
    rec = RecordingCapture()
    calls = use_cuda_graphs(program, rec)
    assert calls is not None, program.cuda_graph_refused
    return program, calls, rec


def _mlp(x, w, b):
    return torch.nn.functional.gelu(x @ w + b).softmax(-1)


def _mlp_inputs() -> list[torch.Tensor]:
    return [torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)]


def _replaying_mlp() -> tuple[list[torch.Tensor], Any, Any, RecordingCapture]:
    """The mlp's program after its warm-up, its capture and one replay."""
    inputs = _mlp_inputs()
    program, calls, rec = _graphed(_mlp, inputs)
    for _ in range(3):
        program.entry(*inputs)
    assert calls.counts["replayed"] == 1
    return inputs, program, calls, rec


def test_warm_up_then_capture_then_replays_through_the_entry() -> None:
    inputs = _mlp_inputs()
    program, calls, rec = _graphed(_mlp, inputs)
    for k in range(4):
        (got,) = program.entry(*inputs)
        torch.testing.assert_close(got, _mlp(*inputs))
        assert calls.counts["warm-up"] == 1 and calls.counts["captured"] == (k >= 1)
        assert calls.counts["replayed"] == max(0, k - 1)
    assert rec.replays == 3  # the capture call's own work is a replay
    (got,) = program(*inputs)  # the checked call goes the same way
    assert calls.counts["replayed"] == 3


def test_outputs_the_caller_keeps_are_not_overwritten() -> None:
    """An input changed in place stays where it was captured: the next call replays; what the
    previous call returned is the caller's own copy, not the graph's buffer."""
    inputs, program, calls, _ = _replaying_mlp()
    (kept,) = program.entry(*inputs)
    want = kept.clone()
    inputs[0].mul_(-3)
    (new,) = program.entry(*inputs)
    assert calls.counts["replayed"] == 3
    torch.testing.assert_close(new, _mlp(*inputs))
    assert torch.equal(kept, want)
    assert kept.untyped_storage().data_ptr() != calls._static[0].untyped_storage().data_ptr()


def test_an_input_that_moved_runs_uncaptured_and_the_graph_is_given_up_after_a_run_of_them() -> None:
    inputs, program, calls, _ = _replaying_mlp()
    moved = [inputs[0].clone(), *inputs[1:]]
    (got,) = program.entry(*moved)
    torch.testing.assert_close(got, _mlp(*moved))
    assert calls.counts["moved"] == 1 and "[0]" in (calls.last_fallback or "")
    program.entry(*inputs)  # back where it was captured: replayed
    assert calls.counts["replayed"] == 2 and calls.refused is None
    for _ in range(cudagraphs.GIVE_UP_AFTER):
        program.entry(*[t.clone() for t in inputs])
    assert calls.refused is not None and "moved" in calls.refused
    (got,) = program.entry(*inputs)
    torch.testing.assert_close(got, _mlp(*inputs))
    assert calls.counts["replayed"] == 2 and calls.counts["released"] == 1


def test_another_shape_never_reaches_the_graph() -> None:
    inputs, program, calls, _ = _replaying_mlp()
    assert program.entry(torch.randn(5, 8), *inputs[1:]) is None  # the entry refuses: nothing ran
    assert sum(calls.counts.values()) == 3


def test_mutated_inputs_are_updated_once_a_call() -> None:
    x, buf = torch.randn(4, 8), torch.randn(4, 8)
    program, calls, _ = _graphed(_mutates, [x, buf])
    want_buf = buf.clone()
    for _ in range(5):
        want = _mutates(x, want_buf)
        (got,) = program.entry(x, buf)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(buf, want_buf)
    assert calls.counts["replayed"] == 3


def test_a_failed_capture_runs_the_call_uncaptured_and_says_why() -> None:
    inputs = _mlp_inputs()
    program, calls, rec = _graphed(_mlp, inputs)
    rec.fail = "operation not permitted when stream is capturing"
    for _ in range(3):
        (got,) = program.entry(*inputs)
        torch.testing.assert_close(got, _mlp(*inputs))
    assert calls.refused is not None and "not permitted" in calls.refused
    assert calls.counts["captured"] == 0 and calls.counts["released"] == 1


def test_a_call_inside_the_callers_capture_runs_uncaptured() -> None:
    inputs, program, calls, rec = _replaying_mlp()
    rec.nested = True
    replays = rec.replays
    (got,) = program.entry(*inputs)
    torch.testing.assert_close(got, _mlp(*inputs))
    assert calls.counts["nested"] == 1 and rec.replays == replays


def test_a_replay_on_another_stream_waits_for_the_last_one() -> None:
    inputs, program, calls, rec = _replaying_mlp()
    assert rec.waited == []
    rec.current = 2
    program.entry(*inputs)
    program.entry(*inputs)
    assert rec.waited == [1]


def test_a_refused_program_is_left_as_it_was() -> None:
    program = runtime.compile(_plan(lambda x: (x.t(), x * 2), [torch.randn(4, 8)]), backend="torch")
    entry = program.entry
    assert use_cuda_graphs(program, RecordingCapture()) is None
    assert "view of an input" in program.cuda_graph_refused
    assert program.entry is entry and program.cuda_graph is None


def test_without_a_stand_in_a_cpu_program_is_refused() -> None:
    program = runtime.compile(_plan(lambda x: x * 2, [torch.randn(3)]), backend="torch")
    assert use_cuda_graphs(program) is None
    assert program.cuda_graph_refused == "the program runs on cpu, not cuda"


@pytest.mark.parametrize("make", [
    lambda: torch.randn(4, 6),
    lambda: torch.randn(4, 6)[:, 1:],  # an offset and a gap
    lambda: torch.randn(6, 4).t(),  # dense, transposed
    lambda: torch.randn(1, 6).expand(4, 6),  # stride 0
])
def test_outputs_are_copied_in_their_own_layout(make) -> None:
    t = make()
    c = _copier(t)(t)
    assert (c.shape, c.stride(), c.storage_offset()) == (t.shape, t.stride(), t.storage_offset())
    assert torch.equal(c, t) and c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_the_backend_option_turns_graphs_on_and_says_why_a_program_is_not_captured() -> None:
    from runtime.dynamo import FusegCompiler, compile_with_aot

    torch._dynamo.reset()
    compiler = FusegCompiler(cuda_graphs=True)
    fn = torch.compile(_mlp, backend=lambda gm, ex: compile_with_aot(compiler, gm, ex))
    inputs = _mlp_inputs()
    torch.testing.assert_close(fn(*inputs), _mlp(*inputs))
    assert [p.cuda_graph_refused for p in compiler.compiled] == ["the program runs on cpu, not cuda"]
    torch._dynamo.reset()
    by_name = torch.compile(_mlp, backend="fuseg", options={"cuda_graphs": True})
    torch.testing.assert_close(by_name(*inputs), _mlp(*inputs))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown options"):
        torch.compile(_mlp, backend="fuseg", options={"cuda_graph": True})(*inputs)
    torch._dynamo.reset()

