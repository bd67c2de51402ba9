"""A symbolic plan's kernel chosen against ATen at the call, per size class (issue 41).

Note [choices at the call]: a measured kernel (Note [choices by measurement] in
runtime/autotune.py: a matmul, an attention, a convolution, a lone softmax) of a symbolic plan is
one source for every size, and whether it beats ATen depends on the sizes. Its verdict was one
per power-of-two class of the sizes it reads, and that class a condition of the plan: a call in
another class made a whole new plan (the import, segmentation, alias pass and lowering again:
0.88-1.27 s for a tiny causal LM's generate on this machine kind, every time a prompt or a KV
cache crossed a power of two; perf/results/class_crossing_cpu.json times it before and after),
although it compiled nothing. Now the plan keeps both ways and
chooses at the call:

    _pick = <table>.get((s0.bit_length(),))           # the class of each size the kernel reads
    if _pick is None: _pick = <choose>((s0.bit_length(),), v3, v7, s0, _zp)
    v9, = _pick(v3, v7, s0, _zp)

``table`` maps a class to the function that won there; the first call in a class looks the verdict
up in the machine's cache (``autotune.lookup``, the key written as before: the kernel's name,
torch's threads, each size's class), and where there is none measures both on the call's own
inputs (``autotune.measure``: about a millisecond; a slow op a few calls) and records it. Both
functions take the segment's inputs and the symbols and return its outputs, so the rest of the
program is the same whichever runs; the launch reads no pointer views and joins no chain (each
takes made tensors). Only launches that write no input in place are chosen here (a measurement
runs each way several times on the real inputs); the others keep the class as a condition.
Under ``autotune.fixed`` or deterministic algorithms at the call, the fixed way runs (nothing
measured, nothing kept in the table); under a dispatch mode of the caller's (a FLOP counter, a
tracer), which would see every run of a measurement, an unmeasured class runs the kernel and is
measured at a later call without one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from segmenter.symbolic import SymbolicSizes, sizes_of

from .. import autotune
from ..wrapper import Code
from .base import BuildContext, SegmentLaunch
from .torch_backend import TorchLaunch

__all__ = ["ChosenAtCall", "at_call_eligible", "wrap_at_call"]


def at_call_eligible(ctx: BuildContext, launch: Any) -> bool:
    """Whether ``launch`` (a measured kernel) is chosen at the call: its kernel reads symbolic
    sizes and it writes no input in place."""
    return (sizes_of(ctx.graph) is not None and bool(launch.kernel.symbols)
            and not ctx.targets(launch.segment))


def wrap_at_call(chosen: dict[int, SegmentLaunch]) -> None:
    """Each built launch marked by ``choose`` as chosen at the call, wrapped (in place)."""
    for i, launch in list(chosen.items()):
        if getattr(launch, "at_call", False) and getattr(launch, "fn", None) is not None:
            chosen[i] = ChosenAtCall(launch)


def _alone(ctx: BuildContext, launch: SegmentLaunch, sizes: SymbolicSizes, fast: bool, guard: bool,
           ) -> Callable[..., list[torch.Tensor]]:
    """``launch`` as a function of the segment's inputs and the symbols (their locals, then
    ``_zp``), returning the segment's outputs."""
    seg = launch.segment
    code = Code(fast=fast, sizes=sizes)
    params = [code.var(v) for v in seg.inputs]
    launch.emit(code, frozenset(), guard=guard)
    fn, _ = code.function("fuseg_at_call", [*params, *sizes.names.values(), "_zp"], code.lines,
                          f"[{', '.join(code.var(o) for o in seg.outputs)}]")
    return fn


class ChosenAtCall(SegmentLaunch):
    """A measured kernel launch and the segment on ATen, one of the two run at each call by the
    class of the sizes (Note [choices at the call])."""

    backend = "cpp"
    reads_pointers = False  # its inputs are made tensors: either way may run
    chainable = False

    def __init__(self, launch: Any) -> None:
        self.inner, self.ctx, self.segment = launch, launch.ctx, launch.segment
        self.kernel, self.fn = launch.kernel, launch.fn
        #: class (the bit lengths of the sizes the kernel reads) -> the way that won there
        self.table: dict[tuple[int, ...], Callable[..., list[torch.Tensor]]] = {}
        #: classes measured in this process (a cached verdict is not counted)
        self.measured: list[tuple[int, ...]] = []

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        sizes, seg = code.sizes, self.segment
        assert sizes is not None  # (eligible only in a symbolic plan)
        kernel = _alone(self.ctx, self.inner, sizes, code.fast, guard)
        aten = _alone(self.ctx, TorchLaunch(self.ctx, seg), sizes, code.fast, False)
        symbols = list(sizes.sources)
        bits = "(" + "".join(f"{sizes.names[symbols[k]]}.bit_length(), " for k in self.kernel.symbols) + ")"
        args = ", ".join([code.var(v) for v in seg.inputs] + list(sizes.names.values()) + ["_zp"])
        choose = code.const(functools.partial(self._choose, kernel, aten))
        code.line(f"_pick = {code.const(self.table)}.get({bits})")
        code.line(f"if _pick is None: _pick = {choose}({bits}, {args})")
        code.line(f"{''.join(code.var(o) + ', ' for o in seg.outputs)}= _pick({args})")
        dead = code.dying(seg.inputs, dying)
        if dead:
            code.dels(dead)

    def _choose(self, kernel: Callable, aten: Callable, bits: tuple[int, ...], *args: Any) -> Callable:
        """The way for this class: the cached verdict, else measured on these arguments."""
        policy = autotune.policy()
        if policy != "measure" or torch.are_deterministic_algorithms_enabled():
            return kernel if policy == "kernel" else aten  # (Note [no choice by timing]: ATen's op)
        key = autotune.class_key(self.kernel.name, {k: autotune.class_of_bits(b) for k, b in zip(self.kernel.symbols, bits)})
        verdict = autotune.lookup(key)
        if verdict is None and _get_current_dispatch_mode() is not None:
            return kernel  # a mode of the caller's would see (and count) the runs: measured later
        if verdict is None:
            try:
                with torch.no_grad():
                    verdict = autotune.measure(lambda: kernel(*args), lambda: aten(*args))
            except Exception:  # noqa: BLE001 - nothing learned: the kernel runs, as where unmeasured
                return kernel
            autotune.record(key, verdict)
            self.measured.append(bits)
        way = kernel if verdict.kernel else aten
        self.table[bits] = way
        return way
