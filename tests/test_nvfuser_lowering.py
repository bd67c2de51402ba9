"""The nvFuser lowering against a recording stand-in for nvFuser's classic frontend.

nvFuser does not run here (no GPU, no wheel for this Python) and its 0.2.35 wheel does not import
beside torch 2.11 on the GPU machine (perf/results/nvidia-h100/nvfuser_probe_h100.json), so the lowering
is UNVERIFIED on a real nvFuser; these tests check what can be checked without one: which
frontend calls each segment becomes, that a mutated input becomes an ``alias_input`` output, and
that what the lowering does not take is declined with the reason (the runtime then uses torch).
"""

from __future__ import annotations

import types

import pytest
import torch

from alias import apply_aliases
from runtime.backends.nvfuser import lower_to_nvfuser
from runtime.codegen import Declined
from segmenter import capture, segment


class _T:
    def __init__(self, name: str) -> None:
        self.name = name


class _Ops:
    def __init__(self, log: list) -> None:
        self._log = log

    def __getattr__(self, op: str):
        def call(*args, **kwargs):
            out = _T(f"{op}{len(self._log)}")
            self._log.append((op, args, kwargs))
            return (out, _T(out.name + "b")) if op == "var_mean" else out
        return call


class _FD:
    def __init__(self) -> None:
        self.log: list = []
        self.ops = _Ops(self.log)
        self.outputs: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def define_tensor(self, **kw):
        self.log.append(("define_tensor", (), kw))
        return _T(f"in{len(self.log)}")

    def define_scalar(self, value, dtype=None):
        return _T(f"s{value}")

    def add_output(self, t, alias_input=None):
        self.outputs.append((t, alias_input))


_nvf = types.SimpleNamespace(FusionDefinition=_FD, DataType=types.SimpleNamespace(
    Float="Float", Double="Double", Half="Half", BFloat16="BFloat16", Int="Int", Int32="Int32", Bool="Bool"))


def _lower(fn, inputs, in_place=None):
    plan = apply_aliases(segment(capture(fn, inputs)), "post")
    seg = next(s for s in plan.segments if s.is_kernel)
    names = {n: plan.graph.inputs[i].name for n, i in (in_place or {}).items()}
    return lower_to_nvfuser(_nvf, plan.graph, seg, names), plan, seg


def test_softmax_becomes_one_fusion_with_its_reductions() -> None:
    (fd, returned), plan, seg = _lower(lambda x: torch.softmax(x, -1), [torch.randn(4, 8)])
    ops = [op for op, _, _ in fd.log]
    assert ops[0] == "define_tensor" and fd.log[0][2]["sizes"] == [4, 8] and fd.log[0][2]["strides"] == [8, 1]
    assert {"max", "sub", "exp", "sum", "div"} <= set(ops)
    assert returned == list(seg.outputs) and len(fd.outputs) == 1


def test_rope_block_lowers_views_cat_and_broadcasts() -> None:
    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    (fd, _), _, _ = _lower(rope, [torch.randn(2, 4, 8, 16), torch.randn(8, 16), torch.randn(8, 16)])
    ops = [op for op, _, _ in fd.log]
    assert {"slice", "cat", "neg", "mul", "add", "broadcast_in_dim"} <= set(ops)
    bcast = next(kw for op, _, kw in fd.log if op == "broadcast_in_dim")
    assert bcast["shape"] == [2, 4, 8, 16] and bcast["broadcast_dims"] == [2, 3]


def test_mutated_input_is_an_alias_input_output() -> None:
    def fn(x):
        x.mul_(2)

    x = torch.randn(3, 4)
    plan = apply_aliases(segment(capture(fn, [x])), "post")
    from runtime.emit.inplace import plan_in_place_writes

    in_place, _ = plan_in_place_writes(plan)
    (fd, returned), _, _ = _lower(fn, [x], in_place)
    assert returned == [] and len(fd.outputs) == 1 and fd.outputs[0][1] is not None


def test_unsupported_op_is_declined() -> None:
    with pytest.raises(Declined, match="not supported"):
        _lower(lambda x: torch.hypot(x, x + 1), [torch.randn(4)])
