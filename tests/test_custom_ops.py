"""Custom ops (torch.library.custom_op), including ones that mutate their arguments: they run
as OPAQUE segments, the mutation lands, and their other buffers are freed as early as any."""

from __future__ import annotations

import copy

import pytest
import torch

import runtime
from alias import MODES, apply_aliases, check
from runtime.memory import PeakTracker
from segmenter import OpKind, capture, op_info, segment
from segmenter.formats.serialize import from_json, to_json

from .util import assert_matches_eager


@torch.library.custom_op("fuseg_test::scale_into", mutates_args=("out",))
def scale_into(x: torch.Tensor, out: torch.Tensor, s: float) -> None:
    out.copy_(x * s)


@scale_into.register_fake
def _(x, out, s) -> None:
    return None


def moe_like(x: torch.Tensor, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.sin()
    torch.ops.fuseg_test.scale_into(y, buf, 2.0)
    return buf + 1, y.cos()


def test_mutating_custom_op_is_one_opaque_segment_and_its_mutation_lands() -> None:
    x, buf = torch.randn(64), torch.zeros(64)
    graph = capture(moe_like, [x, buf])
    opaque = [n for n in graph.nodes if op_info(n.op).kind == OpKind.OPAQUE]
    assert [n.op for n in opaque] == ["higher_order.auto_functionalized_v2"]
    assert [graph.inputs[m.input].name for m in graph.mutations] == ["buf"]
    assert from_json(to_json(graph)) == graph
    sf = segment(graph)
    for mode in MODES:
        plan = apply_aliases(sf, mode)
        assert check(sf, plan) == []
        assert_matches_eager(moe_like, [x, buf], graph, program=runtime.compile(plan))


def test_buffers_around_a_custom_op_are_freed_early() -> None:
    def chain(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        a = x.exp()  # dead once the custom op has read it
        torch.ops.fuseg_test.scale_into(a, buf, 3.0)
        return buf.sin()

    x, buf = torch.randn(1024), torch.zeros(1024)
    program = runtime.compile(apply_aliases(segment(capture(chain, [x, buf])), "post"))
    x2, buf2 = x.clone(), buf.clone()
    with PeakTracker() as t:
        program(x2, buf2)
    # exp's buffer, the op's private copy of buf, and sin's result: never more than two at once
    assert t.peak <= 2 * 1024 * 4


@pytest.mark.parametrize("mode", MODES)
def test_custom_op_under_torch_compile(mode: str) -> None:
    torch._dynamo.reset()
    x, buf = torch.randn(16), torch.zeros(16)
    ex, ebuf = x.clone(), buf.clone()
    expected = moe_like(ex, ebuf)
    got = torch.compile(moe_like, backend="fuseg", options={"alias_mode": mode})(x, buf)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(buf, ebuf)
    torch._dynamo.reset()


@torch.library.custom_op("fuseg_test::tagged", mutates_args=())
def tagged(x: torch.Tensor, tag: str) -> torch.Tensor:
    return x * 2


@tagged.register_fake
def _(x, tag) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_custom_op_with_a_free_string_argument_is_refused_by_name() -> None:
    """A string argument other than a known mode may name a file or a process (``aten.from_file``),
    so such ops are refused, from files and under torch.compile alike. The error said the op was
    "not known to torch" (found by an op_db sweep through torch.compile); it names the argument
    now."""
    torch._dynamo.reset()
    with pytest.raises(Exception, match="string argument 'tag' reaches outside"):
        torch.compile(lambda x: torch.ops.fuseg_test.tagged(x, "a") + 1, backend="fuseg")(torch.randn(4))
    torch._dynamo.reset()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_linear_cross_entropy_modes_are_mode_strings(reduction: str, train: bool) -> None:
    """torch 2.13's ``nn.LinearCrossEntropyLoss`` runs a custom op of torch's own,
    ``torch_nn::_linear_cross_entropy_batch_chunked``, whose ``reduction`` and ``acc_policy``
    arguments are strings that pick a mode ("mean", "auto"). They were refused as free strings, so
    the module did not compile at all: 340 of PyTorch's module_db samples through torch.compile
    (a scratch sweep). Now both are mode strings; the op runs on torch, values and grads as eager."""
    torch.manual_seed(0)
    from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

    # options: the chunked path (``options=None`` is the reference path, plain ATen ops)
    m = torch.nn.LinearCrossEntropyLoss(6, 5, reduction=reduction,
                                        options=LinearCrossEntropyOptions(allow_retain_graph=True))
    x, t = torch.randn(8, 6, requires_grad=train), torch.randint(0, 5, (8,))
    torch._dynamo.reset()
    cm = torch.compile(copy.deepcopy(m), backend="fuseg")
    with torch.set_grad_enabled(train):
        expected, got = m(x, t), cm(x, t)
    torch.testing.assert_close(got, expected)
    if train:
        w = torch.randn_like(expected)
        ge = torch.autograd.grad((expected * w).sum(), [x, next(m.parameters())])
        xg = x.detach().requires_grad_(True)
        got = cm(xg, t)
        gg = torch.autograd.grad((got * w).sum(), [xg, next(cm.parameters())])
        for a, b in zip(gg, ge):
            torch.testing.assert_close(a, b)
    torch._dynamo.reset()
