"""Consecutive generated kernels run by one native call, their short-lived values in one buffer.

Note [one native call for a chain of kernels]: in llama-tiny's fast program (34 C++ kernels, 65
us a call outside dynamo), the work around each kernel was most of the call: a planned-layout
allocation (``empty_strided``, ~0.4 us with its free), one ``data_ptr()`` per argument (~0.06
us) and a ctypes call (~0.1 us) per launch (scratch micro-timings). As one chain, the program
took 33 us (scratch; through torch.compile: perf/results/x86-cpu-unrecorded/before_after_chains_cpu.json). A run of
consecutive launches that are all generated C++ kernels (with the views, folded segments and
gathers passed as pointers between them, which make nothing) is therefore emitted as a *chain*:

* every value a chained kernel writes that nothing after the chain reads (no later launch, no
  output, no write-back) lives in one ``uint8`` buffer of the chain (the *arena*), at an offset
  planned when compiled: values whose lifetimes (first writer to last reader, in steps) overlap
  get disjoint bytes, others may share them (first fit, 64-byte aligned);
* every value read after the chain gets its own buffer of its planned layout as before (an
  output the caller keeps, a value a later launch on ATen reads), made before the call; so do
  bases of views read after the chain; views are made after the call, from their bases, as
  the launches made them; values written into an input in place are written there;
* the program then calls the runner (runtime/codegen/runner.py) once, with the chain's steps
  (kernel addresses and arguments as slot + bytes, fixed when compiled) and the data pointers of
  this call's tensors (the inputs, the buffers made for the call, the arena).

A kernel joins a chain when it is a C++ launch that says it may (``chainable``), takes at most
``MAX_ARGS`` pointers, has non-negative strides, and every value it reads or writes that the
program makes spans at most ``VALUE_BYTES``: the arena never holds a big value, and a big value
(whose kernel costs far more than its launch) keeps being freed at its last use. A METADATA
segment joins when all its outputs are views made from the plan without bit changes (the views
it would make); anything else (an ATen op, a launch on another backend) ends the chain. A chain
has at least two kernels; a lone one is launched as before.

Kept as before: the order of the kernels, their arguments' layouts and addresses (an arena
value's address is its buffer's plus its offset, so each kernel reads and writes the bytes it was
compiled for), the outputs' buffers and their sharing, and the errors (a counting kernel that
stops the chain raises what it raised alone; the kernels after it do not run, as the lines after
a raise did not). A value an input held before the chain is freed after it rather than inside it
(it lived until its last use, now until the chain's end). The safe program variant and a profiled
program (``profile_launches``, which times launches one by one) launch every kernel on its own.
"""

from __future__ import annotations

import array
import ctypes
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from segmenter import FusionGraph, Segment, SegmentedFusion, SegmentKind
from segmenter.ir.symbolic import is_symbolic, size_hint

from ..backends.kernels import _numel, span_bytes
from ..codegen import Declined
from ..codegen.build import build_cpu
from ..codegen.kernel import beside
from ..codegen.runner import COUNTS, GROUP_MAX, GROUP_SHIFT, MAX_ARGS, MAX_STEPS, runner_kernel, split_result
from ..emit.views import metadata_views
from ..emit.wrapper import Code
from ..machine import threads
from ..storage import layout
from .trial import CALLS, alternating

__all__ = ["ALIGN", "VALUE_BYTES", "Chain", "emit_chain", "plan_chains"]

#: the most bytes a program-made value may span to be read or written in a chain
VALUE_BYTES = 1 << 18
#: arena offsets are multiples of this (a cache line; torch's CPU buffers start at one)
ALIGN = 64


@dataclass
class Chain:
    """Segments ``first`` to ``last`` (in program order), run as one call of the runner."""

    first: int
    last: int
    kernels: int
    #: filled when emitted: bytes of the arena, values in it -> offset (for tests and reports)
    arena_bytes: int = 0
    arena: dict[str, int] = field(default_factory=dict)
    #: filled when emitted: the sizes of its groups of steps run at once, and the trial between
    #: running them so and one by one (Note [kernels side by side]; None: no group)
    groups: list[int] = field(default_factory=list)
    ways: Ways | None = None


def plan_chains(plan: SegmentedFusion, chosen: Mapping[int, Any], folded: frozenset[int],
                pointers: Mapping[str, tuple[str, int]], made_by_program: Callable[[str], bool]) -> list[Chain]:
    """The chains of the fast program: maximal runs of joinable segments, trimmed to their first
    and last kernel, with at least two kernels. None where the runner cannot be built."""
    try:
        runner()
    except Declined:
        return []
    graph = plan.graph
    chains: list[Chain] = []
    run: list[int] = []  # the current run's kernel segments

    def close() -> None:
        if len(run) >= 2:
            chains.append(Chain(run[0], run[-1], len(run)))
        run.clear()

    for seg in plan.segments:
        kind = _joins(graph, seg, chosen.get(seg.index), folded, pointers, made_by_program)
        if kind is None or (kind == "kernel" and len(run) >= MAX_STEPS):
            close()
            if kind != "kernel":
                continue
        if kind == "kernel":
            run.append(seg.index)
    close()
    return chains


def _joins(graph: FusionGraph, seg: Segment, launch: Any, folded: frozenset[int],
           pointers: Mapping[str, tuple[str, int]], made_by_program: Callable[[str], bool]) -> str | None:
    """How ``seg`` sits in a chain: "kernel", "quiet" (it makes nothing: a folded segment, a
    gather passed as a pointer, views from the plan) or None (it ends the chain)."""
    if seg.index in folded:
        return "quiet"
    if seg.kind == SegmentKind.METADATA:
        views, replay = metadata_views(graph, seg)
        if replay:
            return None
        for src, want, delta in views.values():
            have = graph.metas[src]
            if want.conj or want.neg or have.conj or have.neg or delta < 0:
                return None
        return "quiet"
    if getattr(launch, "in_place_of_copy", None) is not None:
        return "quiet" if seg.outputs[0] in pointers else None  # no copy where passed as a pointer
    if not getattr(launch, "chainable", False) or launch.fn is None:
        return None
    if any(delta < 0 for *_, delta in launch.views):  # a view before its base's first element
        return None
    k = launch.kernel
    if len(k.params) + bool(k.symbols) > MAX_ARGS or k.returns not in ("void", "long long"):
        return None
    for p in k.params:
        if any(s < 0 for s in p.stride):
            return None
        # (a symbolic span is judged at the first call's sizes: where a value goes is no
        # condition of the plan; at other sizes it may be bigger, and still right)
        if made_by_program(p.value) and size_hint(span_bytes(p.shape, p.stride, p.dtype)) > VALUE_BYTES:
            return None
    return "kernel"


def runner() -> Callable[..., int]:
    return build_cpu(runner_kernel())


def emit_chain(code: Code, chain: Chain, plan: SegmentedFusion, chosen: Mapping[int, Any],
               folded: frozenset[int], dying: Mapping[int, frozenset[str]], read_after: Callable[[str, int], bool],
               device: torch.device) -> None:
    """The lines that run ``chain`` (Note [one native call for a chain of kernels]).
    ``read_after(v, i)``: whether value ``v`` is read after segment ``i`` (or kept after the program)."""
    graph = plan.graph
    segs = [plan.segments[i] for i in range(chain.first, chain.last + 1)]
    alias: dict[str, tuple[str, int]] = {}  # value -> (base, bytes past the base's first element)
    views: dict[str, tuple[str, tuple, tuple, int]] = {}  # a view made after the chain, if read: base, layout, offset
    targets: dict[str, str] = {}  # value written into an input in place -> that input
    written: dict[str, tuple[int, Any, Any]] = {}  # value a kernel writes -> (its step, its parameter, the launch)
    order: list[str] = []  # values the chain makes, in order
    steps: list[Any] = []  # the launches run (a kernel whose outputs are all empty is not)
    for seg in segs:
        if seg.index in folded:
            continue
        launch = chosen.get(seg.index)
        if seg.kind == SegmentKind.METADATA:
            for o, (src, want, delta) in metadata_views(graph, seg)[0].items():
                if o not in code.pointers:
                    alias[o] = (src, delta * want.dtype.itemsize)
                    views[o] = (src, want.shape, want.stride, delta)
                    order.append(o)
            continue
        if getattr(launch, "in_place_of_copy", None) is not None:
            if seg.outputs[0] not in code.pointers:  # pragma: no cover - plan_chains ends chains there
                raise RuntimeError("internal: a gather copied inside a chain")
            continue
        k = launch.kernel
        for p in k.params:
            if p.output and p.target:
                alias[p.value] = (p.target, 0)
                targets[p.value] = p.target
                order.append(p.value)
            elif p.output:
                written[p.value] = (len(steps), p, launch)
                order.append(p.value)
        for o, b, m, delta in launch.views:
            alias[o] = (b, delta * m.dtype.itemsize)
            views[o] = (b, m.shape, m.stride, delta)
            order.append(o)
        if any(_numel(p.shape) for p in k.params if p.output):
            steps.append(launch)

    def root(v: str) -> tuple[str, int]:
        total = 0
        while True:
            if v in alias:
                v, d = alias[v]
            elif v in code.pointers:
                v, d = code.pointers[v]
            else:
                return v, total
            total += d

    # what must exist as a tensor after the chain: values read after it, and their bases
    last = chain.last
    need: set[str] = set()

    def want(v: str) -> None:
        if v in need:
            return
        need.add(v)
        if v in views:
            want(views[v][0])

    for v in order:
        if read_after(v, last):
            want(v)
    for launch in steps:  # a read outside the bytes its value was written in: a buffer of its own,
        for p in launch.kernel.params:  # as when launched alone (never another value's bytes)
            r, delta = root(p.value)
            if not p.output and r in written and (delta < 0 or delta + _span(p) > _span(written[r][1])):
                want(r)
    made = set(order)
    own = [v for v in order if v in written and v in need]  # buffers of their own, made before the call

    # See Note [kernels side by side]: the steps of a group share one time
    groups = _groups(steps, root)
    chain.groups = list(groups.values())
    when, t, left = [], -1, 0
    for s in range(len(steps) + 1):  # (and past the last step: a kernel of empty outputs runs none)
        if left == 0:
            t, left = t + 1, groups.get(s, 1)
        when.append(t)
        left -= 1
    # the arena: the other values kernels write, placed by their lifetimes in steps
    ends = {v: w[0] for v, w in written.items()}
    for s, launch in enumerate(steps):
        for p in launch.kernel.params:
            if not p.output:
                r, _ = root(p.value)
                if r in ends:
                    ends[r] = max(ends[r], s)
    offsets, arena_bytes = _place([(v, when[written[v][0]], when[ends[v]], _span(written[v][1]))
                                   for v in order if v in written and v not in need])
    chain.arena, chain.arena_bytes = offsets, arena_bytes

    # the steps: kernel address, count of arguments, whether it counts, then slot and bytes each
    for v in own:
        _, p, writer = written[v]
        code.line(f"{code.var(v)} = {writer.alloc(code, p.shape, p.stride, p.dtype)}")
    slots: list[str] = []
    slot_of: dict[str | None, int] = {}  # graph value -> slot; None: the arena (no graph value's name)

    def slot(r: str) -> int:
        if r not in slot_of:
            if not code.has_var(r):  # a generator bug: fail here, never pass a stale pointer
                raise RuntimeError(f"internal: the chain reads %{r}, which no local holds")
            slot_of[r] = len(slots)
            slots.append(f"{code.var(r)}.data_ptr()")
        return slot_of[r]

    def extra(expr: str) -> int:  # a slot of its own: an address computed at the call
        slots.append(expr)
        return len(slots) - 1

    words, flags = [len(steps)], []  # (flags: where each step's flags are in words)
    for s, launch in enumerate(steps):
        k = launch.kernel
        words += [ctypes.cast(launch.fn, ctypes.c_void_p).value, len(k.params) + bool(k.symbols),
                  (COUNTS if k.returns != "void" else 0) | groups.get(s, 0) << GROUP_SHIFT]
        flags.append(len(words) - 1)
        for p in k.params:
            r, delta = root(p.value)
            if r in offsets and is_symbolic(offsets[r] + delta):  # Note [chains of symbolic sizes]
                words += [extra(f"_arena.data_ptr() + {code.value(offsets[r] + delta)}"), 0]
            elif r in offsets:
                if None not in slot_of:
                    slot_of[None] = len(slots)
                    slots.append("_arena.data_ptr()")
                words += [slot_of[None], offsets[r] + delta]
            elif is_symbolic(delta):
                words += [extra(f"{code.var(r)}.data_ptr() + {code.value(delta)}"), 0]
            else:
                words += [slot(r), delta]
        if k.symbols:  # the call's symbol values, last (Note [kernel sizes as arguments])
            if "_zp" not in slot_of:
                slot_of["_zp"] = extra("_zp")
            words += [slot_of["_zp"], 0]
    program = array.array("q", words)
    if groups:
        plain = array.array("q", words)
        for at in flags:
            plain[at] &= COUNTS
        chain.ways = Ways(runner(), program, plain)
        run = code.const(chain.ways.call)
    else:
        run = code.const(runner())
    fail = code.const(_failure([launch.raise_count if launch.kernel.returns != "void" else None for launch in steps]))
    if arena_bytes:
        code.line(f"_arena = {code.const(layout.empty_fn(code.fast, device))}(({code.value(arena_bytes)},), (1,), "
                  f"{code.const(torch.uint8)})")
    code.line(f"_slots = {code.const(array.array)}('q', ({''.join(s + ', ' for s in slots)}))")
    if groups:
        code.line(f"_bad = {run}(_slots.buffer_info()[0])")
    else:
        code.line(f"_bad = {run}({code.const(program.buffer_info()[0])}, _slots.buffer_info()[0])")
    code.const(program)  # the steps live as long as the program
    if arena_bytes:
        code.line("del _arena")
    code.line("if _bad:")
    with code.block():
        code.line(f"{fail}(_bad)")
    rt = code.const(layout.reinterpret_fn(code.fast))
    for v in order:  # after the call, what is read after it, in the order the launches made it
        if v not in need or v in written:
            continue
        if v in targets:
            code.line(f"{code.var(v)} = {code.var(targets[v])}")
        else:
            base, shape, stride, delta = views[v]
            code.line(f"{code.var(v)} = {rt}({code.var(base)}, {code.const(shape)}, {code.const(stride)}, {code.value(delta)})")
    dead = [v for seg in segs for v in sorted(dying.get(seg.index, ())) if v not in made and code.has_var(v)]
    dead += [v for v in order if v in need and not read_after(v, last)]  # made only as a base of a view
    if dead:
        code.dels(dict.fromkeys(dead))


# Note [kernels side by side]: a chain runs its kernels one after another, and a kernel shares
# its own loops among torch's threads only where its work passes a threshold (of multiply-adds
# for a matmul: Note [thread thresholds measured here] in codegen/thresholds.py). Below that the
# other threads wait, though a training step's small kernels come in independent runs: the
# backward of a linear layer computes the input's gradient and the weight's from the same output
# gradient, neither reading the other. On the AMD EPYC family 25 model 17 (2 threads), a tiny
# BERT's backward program held 12 such pairs of matmuls of 8-24 us each, one thread each; run at
# once, one per thread, the program took 398 against 507 us a call (scratch, one process). So
# consecutive steps of a chain that
#
# * each may run beside others (``beside`` in codegen/kernel.py: their loops' work and their
#   products under the beside thresholds, from which a kernel's own threads beat a pair of
#   kernels side by side), return no count (a count stops the chain at its step: what ran after
#   it must not have), and take sizes as constants (a symbolic chain's calls differ in size, so
#   its trial below would compare unlike calls), and
# * neither write a value (by its root: the buffer, input or arena value it lies in) that
#   another of them reads or writes,
#
# form a group of up to GROUP_MAX steps, and the runner calls a group's kernels at once, shared
# among torch's threads (each kernel on one thread, in any order: each writes only its own
# values, so the bits are those of one by one; a kernel whose loops take threads when it runs
# alone gets a team of one inside the group, ``omp_set_num_threads(1)`` in the runner). In the arena, a group's steps share one time:
# what any of them writes gets bytes apart from what any of them reads.
#
# Whether a group is faster than its kernels one by one depends on the machine (waking a thread
# costs microseconds, more where it sleeps) and on the kernels, so it is measured where it runs,
# as Note [a kernel tried in its program] (runtime/compiled/trial.py) measures kernels: a chain with
# groups is made both ways (the same steps and arena; only the flags differ) and its first calls
# alternate between them, pair by pair in either order; the first call each way is not timed,
# then ``trial.CALLS`` each are, and the lower median keeps the chain. Calls while background
# builds hold cores are not timed, nor calls a counting kernel stopped. The choice holds while
# the conditions hold: a group waits for every thread it wakes, and on a machine whose cores
# another process takes (a test run beside a training step, scratch), llama-tiny's forward chain
# took 100 ms with groups against 38 one by one. So the chosen way's calls stay timed (two clock
# reads a call), and ``CALLS`` calls in a row more than ``DRIFT`` times slower or faster than its
# trial's median start the trial again. A chain with no group runs as before. An output written
# into an input in place has that input as its root, and such an input shares its storage with
# no other input (Note [in-place write-back] in runtime/emit/inplace.py), so no other root names its
# bytes.
def _groups(steps: list[Any], root: Callable[[str], tuple[str, int]]) -> dict[int, int]:
    """See Note [kernels side by side]: first step -> steps in its group, for each group of two or more."""
    def joins(launch: Any) -> bool:
        k = launch.kernel
        return k.returns == "void" and not k.symbols and beside(k)

    def values(launch: Any) -> tuple[set[str], set[str]]:
        reads, writes = set(), set()
        for p in launch.kernel.params:
            (writes if p.output else reads).add(root(p.value)[0])
        return reads, writes

    groups: dict[int, int] = {}
    s = 0
    while s < len(steps):
        size = 1
        if joins(steps[s]):
            reads, writes = values(steps[s])
            while s + size < len(steps) and size < GROUP_MAX and joins(steps[s + size]):
                r, w = values(steps[s + size])
                if w & (reads | writes) or r & writes:
                    break
                reads |= r
                writes |= w
                size += 1
        if size > 1:
            groups[s] = size
        s += size
    return groups


class Ways:
    """See Note [kernels side by side]: a chain with groups (``grouped``) and the same one by one
    (``plain``), alternated on its first calls until one is chosen (``chosen``), and tried again
    when the chosen way's calls drift from what the trial measured."""

    def __init__(self, run: Callable[[int, int], int], grouped: array.array, plain: array.array) -> None:
        self.run = run
        self.code = {"groups": grouped, "plain": plain}
        self.address = {way: c.buffer_info()[0] for way, c in self.code.items()}
        self.times: dict[str, list[float]] = {}
        self.chosen: str | None = None
        self.calls = 0  # calls of the trial under way
        self.drifted = 0  # consecutive calls since off the baseline by more than DRIFT
        self.baseline = 0.0  # the chosen way's median in its trial, seconds
        self.trials = 0  # trials decided (a drift starts another)
        self._restart()

    def call(self, slots: int) -> int:
        way = self.chosen or alternating(self.calls, ("groups", "plain"))
        if threads.busy():  # (torch on fewer threads beside background builds: not a fair timing)
            return self.run(self.address[way], slots)
        t0 = time.perf_counter()
        bad = self.run(self.address[way], slots)
        elapsed = time.perf_counter() - t0
        if bad:  # stopped by a count: not a whole call
            return bad
        if self.chosen is not None:
            self._watch(elapsed)
            return bad
        if self.calls >= 2:
            self.times[way].append(elapsed)
        self.calls += 1
        if min(len(t) for t in self.times.values()) >= CALLS:
            medians = {w: statistics.median(t) for w, t in self.times.items()}
            self.chosen = min(medians, key=medians.__getitem__)
            self.baseline, self.drifted = medians[self.chosen], 0
            self.trials += 1
        return bad

    def _watch(self, elapsed: float) -> None:
        """A call of the chosen way: ``CALLS`` in a row off its trial's median by more than
        ``DRIFT`` times, either way, start the trial again (the machine's load changed: a group
        waits for every thread it wakes, one by one does not)."""
        off = elapsed > DRIFT * self.baseline or elapsed * DRIFT < self.baseline
        self.drifted = self.drifted + 1 if off else 0
        if self.drifted >= CALLS:
            self._restart()

    def _restart(self) -> None:
        """The trial from its first call: nothing chosen, nothing timed."""
        self.chosen, self.calls, self.drifted = None, 0, 0
        self.times = {"groups": [], "plain": []}


#: a chosen way's calls this many times slower or faster than in its trial, ``CALLS`` in a row,
#: try both ways again (not a choice: a sign the conditions the trial measured have changed)
DRIFT = 2.0


def _span(p: Any) -> int:
    return span_bytes(p.shape, p.stride, p.dtype)


# Note [chains of symbolic sizes]: under a symbolic plan (Note [symbolic plans] in
# segmenter/ir/symbolic.py) a value's bytes, its offset in the arena and a view's distance from its
# base may be symbolic. The runner's steps are fixed when compiled, so such an address is a slot
# of its own, computed at the call (``_arena.data_ptr() + <expression>``) with 0 bytes past it;
# and the arena is no longer shared by lifetimes (first fit compares sizes, which would make every
# comparison a condition of the plan): each value gets bytes of its own, one after the other.
def _place(values: list[tuple[str, int, int, int]]) -> tuple[dict[str, int], int]:
    """First fit: value -> offset, so that values whose step ranges overlap get disjoint bytes;
    and the bytes in all. ``values``: (name, first step, last step, bytes), by first step. With a
    symbolic size among them, every value one after the other (Note [chains of symbolic sizes])."""
    if any(is_symbolic(v[3]) for v in values):
        at, sequential = 0, {}
        for name, _, _, size in values:
            sequential[name] = at
            at = at + ((max(size, 1) if isinstance(size, int) else size) + ALIGN - 1) // ALIGN * ALIGN
        return sequential, at
    offsets: dict[str, int] = {}
    live: list[tuple[int, int, int]] = []  # (last step, offset, end) of values placed
    top = 0
    for name, first, last, size in values:
        live = [b for b in live if b[0] >= first]
        size = -(-max(size, 1) // ALIGN) * ALIGN
        at = 0
        for _, start, end in sorted(live, key=lambda b: b[1]):
            if at + size <= start:
                break
            at = max(at, end)
        offsets[name] = at
        live.append((last, at, at + size))
        top = max(top, at + size)
    return offsets, top


def _failure(counters: list[Callable[[int], None] | None]) -> Callable[[int], None]:
    def fail(result: int) -> None:
        step, count = split_result(result)
        raise_count = counters[step] if 0 <= step < len(counters) else None
        if raise_count is None:  # pragma: no cover - only counting kernels stop a chain
            raise RuntimeError(f"internal: the chain runner stopped at step {step} ({result})")
        raise_count(count)

    return fail

