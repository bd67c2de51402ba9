"""A symbolic plan's kernel chosen against ATen at the call, per size class (issue 41).

Note [choices at the call]: a measured kernel (Note [choices by measurement] in
runtime/autotune.py: a matmul, an attention, a convolution, a lone softmax) of a symbolic plan is
one source for every size, and whether it beats ATen depends on the sizes. Its verdict was one
per power-of-two class of the sizes it reads, and that class a condition of the plan: a call in
another class made a whole new plan (the import, segmentation, alias pass and lowering again:
0.88-1.27 s for a tiny causal LM's generate on this machine kind, every time a prompt or a KV
cache crossed a power of two; perf/results/amd-epyc-zen3/class_crossing_cpu.json times it before and after),
although it compiled nothing. Now the plan keeps both ways and
chooses at the call:

    _pick = <table>.get((s0.bit_length(),))           # the class of each size the kernel reads
    if _pick is None: _pick = <choose>((s0.bit_length(),), v3, v7, s0, _zp)
    v9, = _pick(v3, v7, s0, _zp)

``table`` maps a class to the function that won there; the first call in a class looks the verdict
up in the machine's cache (``autotune.lookup``, the key written as before: the kernel's name,
torch's threads, each size's class). Where there is none, the class is measured on its own calls
(Note [a class measured on its calls], below) and recorded. Both functions take the segment's
inputs and the symbols and return its outputs, so the rest of the program is the same whichever
runs; the launch reads no pointer views and joins no chain (each takes made tensors). Only
launches that write no input in place are chosen here (each way runs on the real inputs); the
others keep the class as a condition.
Under ``autotune.fixed`` or deterministic algorithms at the call, the fixed way runs (nothing
measured, nothing kept in the table); under a dispatch mode of the caller's (a FLOP counter, a
tracer) an unmeasured class runs the kernel, untimed.

Note [a class measured on its calls]: the first call in a class used to measure both ways there
and then, on its own inputs (``autotune.measure``: about a millisecond a kernel, after each had
run once untimed, and 0.8 ms for the verdict file): a prompt of a length never seen, after every
kernel was built, cost 1.85-3.2x the same length seen (phi3-tiny, five kernels measured at its
first call, issue 41's notes), where it compiled nothing. Now the class's calls are the
measurement: each runs one way, the kernel and ATen in turn, the first of each untimed (first
calls allocate and set up), the next ``SAMPLES`` of each timed; then the medians decide
(``autotune.verdict_of``), the verdict is recorded and every program's table holding the trial
(launches of one kernel source share it: a model's layers) takes the winner. No call runs twice,
so a class's first calls cost what the slower way costs, at most, and nothing more. The calls are
timed where they run, between the program's other launches, which is what the verdict is for.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from segmenter.ir.symbolic import SymbolicSizes, sizes_of

from .. import autotune
from ..emit.wrapper import Code
from ..machine import threads
from .base import BuildContext, SegmentLaunch
from .torch_backend import TorchLaunch

__all__ = ["SAMPLES", "ChosenAtCall", "at_call_eligible", "wrap_at_call"]

#: timed calls of each way before a class's verdict (Note [a class measured on its calls])
SAMPLES = 3


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

    def settled(self, plan_bits: tuple[int, ...]) -> bool:
        """Whether the way of the class of a call whose symbols have ``plan_bits`` (every symbol's
        bit length, in the plan's order) is chosen: in the table, not a trial (Note [a program's
        ATen path per size class] in runtime/compiled/class_check.py)."""
        way = self.table.get(tuple(plan_bits[k] for k in self.kernel.symbols))
        return way is not None and not isinstance(way, functools.partial)  # (a trial's way is its ``run``, bound)

    def _choose(self, kernel: Callable, aten: Callable, bits: tuple[int, ...], *args: Any) -> Callable:
        """The way for this class: the cached verdict, else the trial that measures it on the
        class's calls (Note [a class measured on its calls])."""
        fixed = _fixed_way(kernel, aten)
        if fixed is not None:
            return fixed
        key = autotune.class_key(self.kernel.name, {k: autotune.class_of_bits(b) for k, b in zip(self.kernel.symbols, bits)})
        verdict = autotune.lookup(key)
        if verdict is None:
            trial = _TRIALS.get(key)
            if trial is None:
                trial = _TRIALS[key] = _Trial(key)
            way = functools.partial(trial.run, self, kernel, aten, bits)
        else:
            way = kernel if verdict.kernel else aten
        self.table[bits] = way
        return way


def _fixed_way(kernel: Callable, aten: Callable) -> Callable | None:
    """The way ``autotune.fixed`` or deterministic algorithms impose now (Note [no choice by
    timing]: ATen's op), or None: measured."""
    policy = autotune.policy()
    if policy != "measure" or torch.are_deterministic_algorithms_enabled():
        return kernel if policy == "kernel" else aten
    return None


#: key -> the trial under way for it, in this process (shared by every launch of the key)
_TRIALS: dict[str, _Trial] = {}


class _Trial:
    """One class of one kernel measured on its calls (Note [a class measured on its calls])."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.times: dict[bool, list[float]] = {True: [], False: []}  # kernel? -> microseconds a call
        self.warm: set[bool] = set()
        self.turn = True  # the kernel first
        self.verdict: autotune.Verdict | None = None

    def run(self, owner: ChosenAtCall, kernel: Callable, aten: Callable, bits: tuple[int, ...], *args: Any) -> Any:
        if self.verdict is not None:  # (decided at another launch's call)
            way = owner.table[bits] = kernel if self.verdict.kernel else aten
            return way(*args)
        fixed = _fixed_way(kernel, aten)
        if fixed is not None:
            return fixed(*args)  # (as ``_choose``: untimed, not kept)
        if _get_current_dispatch_mode() is not None:
            return kernel(*args)  # a mode of the caller's sees one run, as without a choice; untimed
        side, self.turn = self.turn, not self.turn
        way = kernel if side else aten
        if side not in self.warm:
            self.warm.add(side)
            return way(*args)
        t = time.perf_counter()
        out = way(*args)
        self.times[side].append((time.perf_counter() - t) * 1e6)
        if len(self.times[True]) >= SAMPLES and len(self.times[False]) >= SAMPLES:
            self.verdict = autotune.verdict_of(self.times[True], self.times[False])
            autotune.record(self.key, self.verdict)
            _TRIALS.pop(self.key, None)
            owner.measured.append(bits)
            owner.table[bits] = kernel if self.verdict.kernel else aten
        return out


def _choose_again(program: Any) -> None:
    """Note [torch's threads beside background compilers] in runtime/machine/threads.py: the ways a
    program's launches chose at the call while builds held cores were chosen for the threads
    left; their tables are emptied, and the next call in each class chooses again."""
    for launch in getattr(program, "_chosen", {}).values():
        if isinstance(launch, ChosenAtCall):
            launch.table.clear()


threads.on_builds_ended(_choose_again)
