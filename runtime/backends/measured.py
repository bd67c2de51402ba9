"""The cpp backend's launches chosen by measurement against ATen (Note [choices by measurement] in
runtime/autotune.py): which they are, the key of their shape class, and the timing of a built
kernel's launch against the same segment on ATen, on made-up inputs of its planned layouts.

The program asks backends in order (``Program._choose``): under ``backend="auto"``, a backend's
``not_chosen_for(seg)`` and then, where it returned None, its ``prepare(ctx, seg)``. The cpp
backend notes in ``not_chosen_for`` that it is choosing by itself, and ``prepare``, called next
for the same segment, then asks ``choose``: a verdict for ATen declines the segment (with the
times in the reason), one for the kernel takes it, and none leaves it pending, to be measured
by ``measure_pending`` once ``build_all`` has built it. A launch whose kernel lost is declined
there, and runs on torch. ``backend="cpp"`` never asks: the kernel runs, as asked.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

import torch

from segmenter import OpKind, op_info
from segmenter.ir.symbolic import SymbolicSizes, size_hint, sizes_of

from .. import autotune
from ..codegen import Declined
from ..emit.wrapper import Code
from .at_call import at_call_eligible
from .base import BuildContext, SegmentLaunch
from .kernels import KernelLaunch, layouts
from .torch_backend import TorchLaunch

__all__ = ["MEASURED_KINDS", "MEASURED_ALONE", "choose", "made_up", "measure_pending"]

#: kernels whose segment is one op ATen has a kernel of its own for: matmuls, attention, convolutions,
#: cumulative sums (of floats: an integer one, a mask's, is not measured), embedding lookups and
#: their backward, the nll loss and its backward (these two on made-up indices: ``made_up``)
MEASURED_KINDS = frozenset({"matmul", "attention", "conv", "scan", "embedding", "nll_loss"})
#: kinds whose integer inputs are indices (rows of a weight, classes of a loss)
_INDEXED_KINDS = frozenset({"embedding", "nll_loss"})
#: kinds measured once per symbolic plan, at its first sizes, the winner running at every size
#: (Note [a lookup measured at the plan's first sizes]), not chosen at each call
_MEASURED_AT_FIRST_SIZES = frozenset({"scan", "embedding", "nll_loss"})

# Note [a lookup measured at the plan's first sizes]: a choice at the call (Note [choices at the
# call]) wraps the launch for good (out of its chain, a table lookup a call) and trials each new
# size class on its first calls, where a generate's decode steps run a lookup, a mask's cumsum
# and, in training, the loss at every step. So these kernels ran unmeasured in symbolic plans
# (2026-11-28, first session): a choice no measurement on the machine made. Now a symbolic plan
# measures them as a program of fixed sizes does, once, on made-up inputs of the plan's first
# sizes (the verdict keyed by the class of each size there, read from the hints: no condition of
# the plan), and keeps the winner at every size. What it gives up: a size in another class runs
# the way measured at the first one. On the machine it was written on the kernels won every class
# of the index ops by 2-10x (Note [nll loss kernels], the embedding kernels' Notes), and a float
# cumsum went to ATen only at [64, 4096].
#: ops measured where a segment is that op alone (a fused one is ours: nothing to compare with)
MEASURED_ALONE = frozenset({"aten._softmax.default", "aten._log_softmax.default"})
#: the dtypes whose kernels convert every value they read or write in software on the CPU (Note
#: [kernels of 16-bit floats measured])
HALVES = frozenset({torch.float16, torch.bfloat16})

# Note [kernels of 16-bit floats measured]: a fused kernel of float32 values beat its segment's
# ATen ops alone wherever it was measured (every fused kernel of the five realistic models, on an
# Intel Xeon with AMX: 0.11-0.55x ATen's time), so fused kernels run unmeasured. Not so with fp16
# and bf16 values: the CPU's kernels convert each value in software (Note [fp16 on the CPU] in
# runtime/codegen/source/ctypes_.py: GCC 12 vectorizes no hardware conversion) and round after
# each op as eager does, while ATen's kernels convert with the CPU's vector instructions. On that
# Xeon (avx512_fp16, F16C) a fp16 relu of 128 x 2048 took 241 us against ATen's 37-46 us, a
# residual add of 256 x 768 174 us against 27-35 us, a bf16 erf gelu 239 us against 109 us;
# and such kernels ran unmeasured, so only the whole program's check (Note [a program against
# its ATen path] in runtime/compiled/trial.py) could save the program, by giving up every kernel:
# t5-encoder-512 in fp16 ran its ATen path at 9.0 ms a call, and with its kernels 9.9 ms. So a CPU
# kernel that reads or writes 16-bit floats is measured against its segment's ATen ops, as a
# matmul is (the same made-up inputs, key and verdict file), and runs only where it wins on the
# machine at hand: a fused fp16 erf or norm may win on one CPU and lose on another. Under
# ``torch.use_deterministic_algorithms(True)`` such a kernel runs, as before, unmeasured: its bits
# do not depend on a timing either way (unlike a matmul's, which ATen runs there).


def _halves(launch: SegmentLaunch) -> bool:
    """Whether the launch's segment reads or writes fp16 or bf16 values (Note [kernels of 16-bit
    floats measured])."""
    metas = launch.ctx.graph.metas
    seg = launch.segment
    return any(metas[v].dtype in HALVES for v in (*seg.inputs, *seg.outputs) if v in metas)


def _measured(launch: SegmentLaunch) -> bool:
    kernel = getattr(launch, "kernel", None)
    if kernel is None:
        return False
    if kernel.kind in MEASURED_KINDS:
        return True
    compute = [n for n in launch.segment.nodes if op_info(n.op).kind != OpKind.VIEW]
    return (len(compute) == 1 and compute[0].op in MEASURED_ALONE) or _halves(launch)


def _key(ctx: BuildContext, launch: KernelLaunch, first_sizes: bool = False) -> str:
    """The launch's shape class: its kernel (whose name hashes its source and layouts), torch's
    threads and, for a kernel of symbolic sizes not chosen at the call, the class of each size it
    reads: a condition of the plan (a kernel that writes an input in place), or with
    ``first_sizes`` the class at the plan's first sizes and no condition (Note [a lookup measured
    at the plan's first sizes])."""
    classes = {}
    sizes = sizes_of(ctx.graph)
    if sizes is not None and launch.kernel.symbols:
        symbols = list(sizes.sources)
        hints = sizes.hints
        for k in launch.kernel.symbols:
            hint = hints[symbols[k]]
            classes[k] = autotune.size_class(hint if first_sizes else sizes.symint(symbols[k], hint))
    return autotune.class_key(launch.kernel.name, classes)


def choose(ctx: BuildContext, launch: SegmentLaunch) -> None:
    """Declined where ATen is this machine's choice for the launch's segment; else the launch is
    taken, marked for measuring where no verdict is known (``measure_pending``)."""
    if not _measured(launch):
        return
    chosen = autotune.policy()
    if chosen == "kernel":
        return
    if chosen == "aten":
        raise Declined("ATen's op chosen (autotune.fixed('aten'))")
    if torch.are_deterministic_algorithms_enabled():  # Note [no choice by timing] (runtime/backends/im2col.py)
        if _halves(launch) and launch.kernel.kind not in MEASURED_KINDS:
            return  # Note [kernels of 16-bit floats measured]: runs, unmeasured
        raise Declined("deterministic algorithms are on (torch.use_deterministic_algorithms): no choice by "
                       "timing, ATen's op as in eager")
    assert isinstance(launch, KernelLaunch)
    first_sizes = False
    if at_call_eligible(ctx, launch):  # Note [choices at the call] (runtime/backends/at_call.py)
        if launch.kernel.kind not in _MEASURED_AT_FIRST_SIZES:
            launch.at_call = True  # type: ignore[attr-defined]
            return
        first_sizes = True  # Note [a lookup measured at the plan's first sizes]
    key = _key(ctx, launch, first_sizes)
    verdict = autotune.lookup(key)
    if verdict is None:
        launch.measure = (ctx, key)  # type: ignore[attr-defined]
    elif not verdict.kernel:
        raise Declined(verdict.reason())


def made_up(shape: tuple, stride: tuple, dtype: torch.dtype, index: bool = False) -> torch.Tensor:
    """Made-up values of a planned layout: random floats, or for the indices of an embedding or
    an nll loss zeros, the one index every table of rows and every loss of classes holds (the
    same work per index either way, on one row), and for a mask all False (``index``)."""
    extent = sum((n - 1) * st for n, st in zip(shape, stride)) + 1 if 0 not in shape else 1
    values = torch.zeros(extent, dtype=dtype) if index else torch.randn(extent, dtype=dtype)
    return values.as_strided(shape, stride)


def _timed(ctx: BuildContext, launch: SegmentLaunch, sizes: SymbolicSizes | None,
           inputs: list[torch.Tensor], symbols: list) -> object:
    """A function running ``launch`` alone on ``inputs`` (and the symbols' values)."""
    code = Code(fast=True, sizes=sizes)
    params = [code.var(v) for v in launch.segment.inputs]
    extra = [*sizes.names.values(), "_zp"] if sizes is not None else []
    launch.emit(code, frozenset(), guard=False)
    fn, _ = code.function("fuseg_timed", params + extra, code.lines,
                          f"[{', '.join(code.var(o) for o in launch.segment.outputs)}]")
    args = [*inputs, *symbols]
    return lambda: fn(*args)


def _verdict(ctx: BuildContext, launch: KernelLaunch) -> autotune.Verdict | None:
    """The kernel's launch against the segment on ATen, or None where it cannot be measured (an
    input that is not floating point, except the indices of an embedding or a loss, and the
    masks of a kernel of 16-bit floats, made up as zeros: other made-up values would be no
    mask)."""
    graph, seg = ctx.graph, launch.segment
    sizes = sizes_of(graph)
    planned = layouts(graph, seg, ctx.materialize, {})
    inputs = []
    for v in seg.inputs:
        dtype = graph.metas[v].dtype
        index = (launch.kernel.kind in _INDEXED_KINDS and dtype in (torch.int64, torch.int32)) or (
            dtype == torch.bool and launch.kernel.kind not in MEASURED_KINDS)  # (a mask: all False)
        if not dtype.is_floating_point and not index:
            return None
        shape, stride = planned[v]
        inputs.append(made_up(tuple(size_hint(n) for n in shape), tuple(size_hint(n) for n in stride), dtype, index))
    symbols: list = []
    if sizes is not None:  # the made-up inputs have the first call's sizes: so do the symbols
        values = [sizes.hints[s] for s in sizes.sources]
        held = array.array("q", values)
        symbols = [*values, held.buffer_info()[0]]
    with torch.no_grad():
        kernel = _timed(ctx, launch, sizes, inputs, symbols)
        aten = _timed(ctx, TorchLaunch(ctx, seg), sizes, inputs, symbols)
        return autotune.measure(kernel, aten)  # type: ignore[arg-type]


def measure_pending(launches: Sequence[SegmentLaunch]) -> dict[SegmentLaunch, str]:
    """Each built launch left pending by ``choose`` measured and its verdict recorded; returns the
    launches ATen beat, with the reason (the program runs them on torch)."""
    declined = {}
    for launch in launches:
        pending = getattr(launch, "measure", None)
        if pending is None or getattr(launch, "fn", None) is None:
            continue
        ctx, key = pending
        launch.measure = None  # type: ignore[attr-defined]
        try:
            verdict = _verdict(ctx, launch)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - an op that fails on made-up values: nothing learned, the kernel stays
            verdict = None
        if verdict is None:
            continue
        autotune.record(key, verdict)
        if not verdict.kernel:
            # (kept for Note [a kernel tried in its program] in runtime/compiled/trial.py)
            launch.verdict_key, launch.verdict = key, verdict  # type: ignore[attr-defined]
            declined[launch] = verdict.reason()
    return declined
