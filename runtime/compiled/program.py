"""A compiled program: a plan from the segmenter and alias pass, as one generated function.

    launches:  METADATA  -> views of the storage they view (no kernel; runtime/compiled/metadata.py)
               kernels   -> the first backend that takes the segment (runtime/backends/)
               OPAQUE    -> the op on torch (or a backend that lists it: runtime/backends/im2col.py)
Everything that can be decided at compile time is: which backend runs each segment (with the
reason every other one was passed over), which values each launch reads, which values die after
it (deleted right after their last use; a view keeps its base alive for as long as it lives),
and, in the "pre"/"off" modes, which values cross a launch boundary as contiguous copies, as
today's fusers make them. The launches are then emitted as the straight-line source of one
function (Note [generated wrapper] in runtime/emit/wrapper.py): ``program.source`` shows it.
"""

from __future__ import annotations

import array
import concurrent.futures
import contextlib
import functools
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from alias.check import PlanError, plan_problems
from segmenter import Segment, SegmentedFusion, SegmentKind, TensorMeta
from segmenter.capturing.reference import FinishView, InputView, check_inputs, finish, numbers_as_tensors
from segmenter.ir.graph import Alias, view_roots
from segmenter.ir.symbolic import NotSymbolic, is_symbolic, sizes_of

from ..backends import BuildContext, SegmentLaunch, backends_for
from ..backends.at_call import ChosenAtCall, wrap_at_call
from ..backends.kernels import check_storage, span_bytes
from ..backends.torch_backend import TorchLaunch
from ..codegen import Declined
from ..codegen.source.symsizes import c_sizes
from ..emit.inplace import plan_in_place_writes
from ..emit.views import metadata_views, planned_views
from ..emit.wrapper import Code
from ..machine import pause, threads
from . import trial
from .background import interim_launches, rebuild
from .chains import Chain, emit_chain, plan_chains
from .class_check import ClassCheck
from .gather import affine_gather
from .guards import LearnedGuard
from .metadata import emit_metadata
from .outputs import plain_outputs, views_of_outputs, views_test
from .pointers import last_uses, pointer_views

__all__ = ["FOLD_BYTES", "CompiledProgram", "Launch", "compile_program"]

#: most bytes of values a program computes once when compiled (Note [folded segments])
FOLD_BYTES = 16 << 20
#: OPAQUE ops folded like kernel segments where every input is folded (Note [folded segments])
PURE_OPAQUE = frozenset({"aten.index.Tensor", "aten.cumsum.default"})
#: seconds after which a program whose kernels are still being built in the background waits for
#: them at its next call (Note [kernels built in the background] in runtime/compiled/background.py)
WAIT_AFTER_S = 10.0
#: seconds between two looks at the compilers' share (runtime/machine/progress.py reads /proc)
_SHARE_EVERY_S = 0.05

Env = dict[str, torch.Tensor]


class Launch:
    """One launch of the program: which segment, which backend, which values die after it.
    ``run(env)`` runs it alone on a dict of values (for tests and debugging; the program itself
    runs the generated function), checking the layouts of its inputs first."""

    def __init__(self, program: CompiledProgram, segment: int, kind: SegmentKind, backend: str,
                 frees: tuple[str, ...], launch: SegmentLaunch | None) -> None:
        self.segment, self.kind, self.backend, self.frees = segment, kind, backend, frees
        self._program, self._launch = program, launch

    @functools.cached_property
    def run(self) -> Callable[[Env], None]:
        return self._program._launch_function(self)

    def __repr__(self) -> str:
        return f"Launch(segment={self.segment}, kind={self.kind.value}, backend={self.backend!r})"


def _interim_call() -> contextlib.AbstractContextManager:
    """What a call of a program whose kernels are being built runs under: the compilers stopped
    for the call where calls come first (Note [calls first while kernels build] in
    runtime/machine/threads.py; its entry's wrapping holds them too: holds nest); else nothing."""
    return pause.held() if threads.way_now() == "calls-first" else contextlib.nullcontext()


def _without_cyclic_gc(fn: Callable) -> Callable:
    """Compiling makes objects per segment and frees none until it returns: the cyclic collector
    rescanned the whole plan again and again (4.6 of 6.2 s on 100k nodes)."""
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return wrapped


class CompiledProgram:
    """Call it like the graph: ``program(*inputs) -> list of outputs``. ``background``: start the
    kernel builds and run their segments on torch until they are done (Note [kernels built in
    the background])."""

    #: Note [a kernel tried in its program] (runtime/compiled/trial.py): the trial under way, and what it found
    trial: Any = None
    trial_result: dict[str, Any] | None = None
    #: Note [a program's ATen path per size class] (runtime/compiled/class_check.py): a symbolic plan's
    class_check: Any = None

    @_without_cyclic_gc
    def __init__(self, plan: SegmentedFusion, backend: str = "auto", chains: bool = True,
                 background: bool = False) -> None:
        problems = plan_problems(plan)  # linear time; the full alias.check runs in the tests
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise PlanError(f"graph {plan.graph.name!r}: the plan breaks the alias invariants, so it is not run: "
                            + "; ".join(problems[:5]) + more)
        self.plan = plan
        self.graph = graph = plan.graph
        #: Note [symbolic plans] (segmenter/ir/symbolic.py): the plan's symbols, where sizes are
        #: symbolic, and which input size each is read from at a call
        self.sizes = sizes_of(graph)
        self.symbol_sources = self.sizes.read_from([i.meta for i in graph.inputs]) if self.sizes else {}
        #: numbers the program takes after its tensors (Note [number inputs] in segmenter/ir/symbolic.py)
        self.numbers = len(self.sizes.number_inputs()) if self.sizes else 0
        # the graph's constants, bound now on the device the program used: never passed in, read
        # like values computed when compiled (Note [folded segments])
        self.constants: dict[str, torch.Tensor] = {c.name: c.tensor() for c in graph.constants}
        #: per kernel segment, the backends passed over and why (segment index -> [(backend, reason)])
        self.passed_over: dict[int, tuple[tuple[str, str], ...]] = {}
        self.backend_of: dict[int, str] = {}
        #: node -> the input it writes in place; input -> why its write-back stays a copy
        self.in_place, self.copy_write_backs = plan_in_place_writes(plan)
        self.written_in_place = frozenset(self.in_place.values())
        keep = graph.external_values | set(graph.input_names) | set(self.constants)
        materialize: frozenset[str] = frozenset()
        if plan.alias_mode in ("pre", "off"):
            made = {o: s.index for s in plan.segments for o in s.outputs}
            materialize = frozenset(
                v for s in plan.segments for v in s.inputs
                if v in made and plan.segments[made[v]].kind != SegmentKind.METADATA and v not in keep
            )
        device = torch.device(graph.inputs[0].meta.device) if graph.inputs else torch.device("cpu")
        self.ctx = ctx = BuildContext(graph, self.in_place, materialize, device, last_uses(plan, keep))
        choices = backends_for(device.type, backend)
        kernel_choices = [(b, why) for b, why in choices if b.kernel_segments]
        chosen: dict[int, SegmentLaunch] = {}
        for seg in plan.segments:
            if seg.kind == SegmentKind.METADATA:
                continue
            if seg.kind == SegmentKind.OPAQUE:  # on torch, unless a backend lists its op
                takers = [(b, why) for b, why in choices
                          if b.name == "torch" or (why is None and len(seg.nodes) == 1 and seg.nodes[0].op in b.opaque_ops)]
                chosen[seg.index] = (self._choose(takers, ctx, seg, backend == "auto") if len(takers) > 1
                                     else TorchLaunch(ctx, seg))
                continue
            chosen[seg.index] = self._choose(kernel_choices, ctx, seg, backend == "auto")
        self._backends = [b for b, _ in choices]
        self._keep, self._materialize, self._use_chains = keep, materialize, chains
        #: See Note [kernels built in the background]: the build under way, and what the program is
        #: once it is done (its launches, and what ``backend_of``/``passed_over`` then say)
        self._building: Any = None
        self._building_since = 0.0  # (time.monotonic() when ``interim_launches`` started the builds)
        #: the look at the compilers' share since the builds started, the calls that ran torch's
        #: ops since, and when the share was last looked at (Note [the wait follows the builds'
        #: share] in runtime/machine/threads.py)
        self._starvation: threads.Starvation | None = None
        self._interim_calls, self._share_looked = 0, 0.0
        self._after_build: tuple[dict[int, SegmentLaunch], dict[int, str], dict[int, tuple]] | None = None
        if background:
            chosen = interim_launches(self, chosen)
        self._finish(chosen)

    def _finish(self, chosen: dict[int, SegmentLaunch], build: bool = True) -> None:
        """The program from its chosen launches: builds (``build``: not where every kernel is
        built already), folding, the generated functions."""
        ctx, keep, materialize, plan = self.ctx, self._keep, self._materialize, self.plan
        lost: dict[int, SegmentLaunch] = {}  # kernels ATen beat alone, measured now (Note [a kernel tried in its program])
        for b in self._backends if build else ():  # every backend compiles its kernels together
            declined = b.build_all([launch for launch in chosen.values() if launch.backend == b.name])
            for launch, why in (declined or {}).items():  # a build that failed (a killed compiler): torch
                i = launch.segment.index
                self.passed_over[i] = (*self.passed_over.get(i, ()), (b.name, why))
                self.backend_of[i] = "torch"
                chosen[i] = TorchLaunch(ctx, launch.segment)
                if getattr(launch, "verdict", None) is not None:
                    lost[i] = launch
        wrap_at_call(chosen)  # Note [choices at the call] (runtime/backends/at_call.py)
        #: segments whose kernel or ATen op is chosen at each call by the class of its sizes
        self.chosen_at_call = frozenset(i for i, launch in chosen.items() if isinstance(launch, ChosenAtCall))
        self._chosen = chosen
        for cached in ("_storage_needs", "_safe"):  # (made again from these launches)
            self.__dict__.pop(cached, None)
        self.folded, self._fixed = self._fold()
        for i, launch in chosen.items():  # Note [gathers at constant affine indices] (runtime/compiled/gather.py)
            if i not in self.folded and isinstance(launch, TorchLaunch) and (gather := affine_gather(ctx, launch.segment, self._fixed)):
                chosen[i] = gather
        #: Note [views passed as pointers] (runtime/compiled/pointers.py): the fast program's, and what dies where there
        self.pointers = pointer_views(plan, chosen, self.folded, keep, materialize)
        self._fast_dying = last_uses(plan, keep, self.pointers) if self.pointers else ctx.dying
        #: Note [one native call for a chain of kernels] (runtime/compiled/chains.py): the fast program's
        #: (none while kernels are built in the background: the chain runner may be one of them)
        self.chains = self._plan_chains(keep) if self._use_chains and self._building is None else []
        self.launches = tuple(
            Launch(self, seg.index, seg.kind, chosen[seg.index].backend if seg.index in chosen else "metadata",
                   tuple(sorted(ctx.dying.get(seg.index, ()))), chosen.get(seg.index))
            for seg in plan.segments)
        self._fast, self.source = self._program_function(fast=True)
        if self.sizes is not None:
            # everything that may ask a size question is built now: then no condition can be
            # added (Note [symbolic plans]); the safe variant is not left to its first need
            self._safe_program = self._program_function(fast=False)[0]
            self.sizes.seal()
        #: Note [one entry], Note [learned layout guard]
        self.guard = LearnedGuard()
        self._check, self.entry = self._check_and_entry()
        self.arity = len(self.graph.inputs) + self.numbers
        if self._building is not None:
            self._entry_now = self.entry
            self.entry = self._entry_while_building
        threads.register(self)  # Note [torch's threads beside background compilers] (runtime/machine/threads.py)
        if lost and self.sizes is None and self._building is None:
            trial.start(self, chosen, lost, functools.partial(self._finish, build=False))
        elif build and self._building is None:  # Note [a program against its ATen path]
            trial.against_aten(self, chosen, functools.partial(self._finish, build=False), ClassCheck)

    # --- Note [kernels built in the background] ---------------------------------------------

    def _entry_while_building(self, *inputs: Any) -> list[torch.Tensor] | None:
        if self._built():
            return self.entry(*inputs)
        with _interim_call():
            results = self._entry_now(*inputs)
        self._interim_calls += results is not None
        return results

    def _built(self) -> bool:
        """Whether the builds started are done; the first call that sees them done makes the
        program again with its kernels (then True, and ``entry`` is the new program's). A build
        still under way ``WAIT_AFTER_S`` after it started, or starved sooner (``_wait_now``), is
        waited for here (its compilers run only on idle cores: a caller busy on every core would
        otherwise never give them time)."""
        if self._building is None:
            return False
        if not all(f.done() for f in self._building):
            if not self._wait_now():
                return False
            pause.release_all()  # (Note [compilers paused while dynamo traces])
            concurrent.futures.wait(self._building)
        self._rebuild()
        return True

    def _wait_now(self) -> bool:
        """Whether a call still finding builds under way waits for them: ``WAIT_AFTER_S`` after
        they started, or sooner where they are starved (Note [the wait follows the builds' share]
        in runtime/machine/threads.py: ``Starvation``), looked at once every ``_SHARE_EVERY_S`` at
        most, at a call after the first since they started."""
        now = time.monotonic()
        if now - self._building_since >= WAIT_AFTER_S:
            return True
        if self._interim_calls == 0 or now - self._share_looked < _SHARE_EVERY_S:
            return False
        self._share_looked = now
        return self._starvation is not None and self._starvation.look()

    def wait_for_builds(self) -> None:
        """Wait for the builds started in the background, then run the kernels from now on."""
        if self._building is not None:
            pause.release_all()
            concurrent.futures.wait(self._building)
            self._rebuild()

    @_without_cyclic_gc
    def _rebuild(self) -> None:
        rebuild(self)

    def _plan_chains(self, keep: set[str]) -> list[Chain]:
        inputs = set(self.graph.input_names)
        chains = plan_chains(self.plan, self._chosen, self.folded, self.pointers,
                             lambda v: v not in inputs and v not in self._fixed)
        if chains:
            last_read: dict[str, int] = {}  # a view passed as a pointer is read with its source
            for seg in self.plan.segments:
                if seg.index not in self.folded:
                    for v in seg.inputs:
                        last_read[v] = seg.index
                        if v in self.pointers:
                            last_read[self.pointers[v][0]] = seg.index
            self._read_after = lambda v, i: v in keep or last_read.get(v, -1) > i
        return chains

    def _fold(self) -> tuple[frozenset[int], dict[str, torch.Tensor]]:
        """Note [folded segments]: a segment that reads no graph input (position ids, a causal
        mask, ``arange``...) computes the same values on every call: it runs once, here, and the
        program reads what it made (as Inductor's constants). Not folded: OPAQUE segments (random
        ops, ops with effects) other than a lone op of ``PURE_OPAQUE`` (a gather or a cumsum of
        folded values: transformers' masks and position ids), segments whose values a graph
        output or a write-back may see (a caller could write into them), and values past
        ``FOLD_BYTES`` in all (memory held for the program's life). Returns the folded segments
        and the values later launches read. Where a pure op raises when folded (an index out of
        range), folding is done again without those: the op then raises on every call, as in
        eager."""
        try:
            return self._fold_segments(PURE_OPAQUE)
        except Exception:  # noqa: BLE001 - again without them: an error of the others raises there
            return self._fold_segments(frozenset())

    def _fold_segments(self, pure: frozenset[str]) -> tuple[frozenset[int], dict[str, torch.Tensor]]:
        graph, plan = self.graph, self.plan
        roots = view_roots(graph)
        exposed = {roots.get(v, v) for v in (*graph.outputs, *(m.value for m in graph.mutations))}
        made: set[str] = set(self.constants)
        folded: list[Segment] = []
        budget = FOLD_BYTES
        for seg in plan.segments:
            if seg.kind == SegmentKind.OPAQUE and not (len(seg.nodes) == 1 and seg.nodes[0].op in pure):
                continue
            if not all(v in made for v in seg.inputs):
                continue
            outs = [o for n in seg.nodes for o in n.outputs if o is not None]
            if any(o in exposed or roots.get(o, o) in exposed for o in outs):
                continue
            if self.sizes is not None and any(is_symbolic(graph.metas[o]) for o in outs):
                continue  # its values differ from call to call (Note [symbolic plans])
            size = sum(graph.metas[o].nbytes for o in seg.outputs if seg.kind != SegmentKind.METADATA)
            if size > budget:
                continue
            budget -= size
            made.update(seg.outputs)
            folded.append(seg)
        fixed = dict(self.constants)
        if not folded:
            return frozenset(), fixed
        done = {s.index for s in folded}
        later = [v for s in plan.segments if s.index not in done for v in s.inputs if v in made and v not in fixed]
        wanted = list(dict.fromkeys(later))
        code = Code(fast=False)
        for v, t in fixed.items():
            code.fixed(v, t)
        for seg in folded:
            self._emit_launch(code, seg, guard=False, dying=frozenset())
        fn, _ = code.function("fuseg_fold", [], code.lines, f"[{', '.join(code.var(v) for v in wanted)}]")
        with torch.no_grad():
            values = fn()
        return frozenset(done), {**fixed, **dict(zip(wanted, values))}

    def _choose(self, choices: list, ctx: BuildContext, seg: Segment, auto: bool) -> SegmentLaunch:
        passed: list[tuple[str, str]] = []
        for b, why in choices:
            if why is None and auto:
                why = b.not_chosen_for(seg)
            if why is None:
                try:
                    with c_sizes(self.sizes):  # Note [kernel sizes as arguments] (runtime/codegen/source/symsizes.py)
                        launch = b.prepare(ctx, seg)
                except Declined as e:
                    why = str(e)
                else:
                    self.backend_of[seg.index] = b.name
                    if passed:
                        self.passed_over[seg.index] = tuple(passed)
                    return launch
            passed.append((b.name, why))
        raise AssertionError("the torch backend takes every segment")  # pragma: no cover

    # --- the generated function -------------------------------------------------------------

    def _emit_launch(self, code: Code, seg: Segment, guard: bool, dying: frozenset[str] | None = None) -> None:
        if dying is None:
            dying = self.ctx.dying.get(seg.index, frozenset())
        if seg.kind == SegmentKind.METADATA:
            emit_metadata(code, self.graph, seg, dying)
        else:
            self._chosen[seg.index].emit(code, dying, guard)

    def _program_function(self, fast: bool, timed: list[float] | None = None,
                          ) -> tuple[Callable[..., list[torch.Tensor]], str]:
        """The program as one function (Note [generated wrapper]). ``timed``: a list that gets the
        seconds spent in each launch added up (``profile_launches``)."""
        graph = self.graph
        code = Code(fast, reuse=True, sizes=self.sizes)  # straight-line: Note [reused local names]
        if fast:
            code.pointers = self.pointers
        params = [code.var(v) for v in graph.input_names]
        tensors = list(params)
        params += [f"n{j}" for j in range(self.numbers)]  # (Note [number inputs])
        if self.sizes is not None:  # the symbols' values at this call (Note [sizes in generated source])
            for line in self.sizes.bind_lines(params, self.symbol_sources):
                code.line(line)
            if any(getattr(k, "symbols", ()) for k in self.kernels.values()):
                # kernels read them from one array (Note [kernel sizes as arguments]); it lives to the end
                names = ", ".join(self.sizes.names[s] for s in self.sizes.sources)
                code.line(f"_zs = {code.const(array.array)}('q', ({names},))")
                code.line("_zp = _zs.buffer_info()[0]")
                code.symbol_names = [*code.symbol_names, "_zs", "_zp"]
        for v, t in self._fixed.items():
            code.fixed(v, t)
        if timed is not None:
            clock = code.const(time.perf_counter)
            acc = code.const(timed)
        # launches timed one by one run on their own; so does the safe variant
        chains = {c.first: c for c in self.chains} if fast and timed is None else {}
        skip_to = -1
        for seg in self.plan.segments:
            if seg.index <= skip_to:
                continue
            chain = chains.get(seg.index)
            if chain is not None:
                code.mark()
                code.line(f"# segments {chain.first}-{chain.last}: {chain.kernels} kernels in one call (a chain)")
                emit_chain(code, chain, self.plan, self._chosen, self.folded, self._fast_dying, self._read_after,
                           self.ctx.device)
                skip_to = chain.last
                continue
            if seg.index in self.folded:
                code.line(f"# segment {seg.index}: {seg.kind.value}, folded (computed when compiled)")
                continue
            code.mark()
            code.line(f"# segment {seg.index}: {seg.kind.value} on {self.launches[seg.index].backend}")
            if timed is not None:
                code.line(f"_t0 = {clock}()")
            self._emit_launch(code, seg, guard=False, dying=self._fast_dying.get(seg.index, frozenset()) if fast else None)
            if timed is not None:
                code.line(f"{acc}[{seg.index}] += {clock}() - _t0")
        needed = list(dict.fromkeys([*graph.outputs, *(m.value for m in graph.mutations), *self.constants]))
        outs = [code.var(v) for v in graph.outputs]
        if plain_outputs(graph, set(self.constants)):
            returns = f"[{', '.join(outs)}]"
        else:
            # a symbolic plan's graph at this call's sizes (Note [sizes in generated source])
            view = code.const(graph) if self.sizes is None else self._finish_view(code)
            returns = (f"{code.const(finish)}({view}, [{', '.join(tensors)}], "
                       f"dict(zip({code.const(tuple(needed))}, ({''.join(code.var(v) + ', ' for v in needed)}))), "
                       f"{code.const(self.written_in_place)})")
            views = views_of_outputs(graph, set(self.constants)) if fast else None
            if views:  # Note [outputs that are views of outputs] in runtime/compiled/outputs.py
                returns = f"[{', '.join(outs)}] if {views_test(code, outs, tensors, views)} else {returns}"
        return code.program("fuseg_program", params, returns)

    def _finish_view(self, code: Code) -> str:
        """An expression making ``FinishView`` of the graph at the call: the layouts ``finish``
        reads (outputs that were views, their bases, final layouts), computed from the symbols."""
        g = self.graph
        inputs = [f"{code.const(InputView)}({code.const(i.name)}, {code.value(i.final_layout)})"
                  if i.final_layout is not None and is_symbolic(i.final_layout) else code.const(InputView(i.name, i.final_layout))
                  for i in g.inputs]
        aliases, wanted = [], set()
        for k, a in enumerate(g.output_aliases):
            if a is None:
                aliases.append("None")
                continue
            wanted.add(g.outputs[k])
            if a.source == "output":
                wanted.add(g.outputs[a.index])
            layout = "None" if a.layout is None else code.value(a.layout)
            aliases.append(f"{code.const(Alias)}({code.const(a.source)}, {a.index}, {layout})")
        metas = ", ".join(f"{code.const(v)}: {code.value(g.metas[v])}" for v in sorted(wanted))
        return (f"{code.const(FinishView)}(({''.join(x + ', ' for x in inputs)}), {code.const(g.outputs)}, "
                f"({''.join(x + ', ' for x in aliases)}), {code.const(g.mutations)}, {code.const(g.constants)}, "
                f"{code.const(g.scalar_outputs)}, {{{metas}}})")

    def _layout_tests(self, code: Code, params: list[str]) -> list[str]:
        """Per input: dtype, sizes, strides, device and the conjugate and negative bits (all of
        which a ``LearnedGuard`` checks too: Note [learned layout guard])."""
        tests = []
        for v, inp in zip(params, self.graph.inputs):
            m = inp.meta
            dev = {"cpu": f"{v}.is_cpu", "cuda": f"{v}.is_cuda"}.get(m.device_type,
                                                                     f"{v}.device.type == {code.const(m.device_type)}")
            tests.append(f"{v}.dtype == {code.const(m.dtype)} and {v}.shape == {code.const(m.shape)} and "
                         f"{v}.stride() == {code.const(m.stride)} and {dev}")
            # the conjugate and negative bits (a real tensor may carry the negative one: x.conj().imag)
            if m.dtype.is_complex:
                tests.append(f"{v}.is_conj() is {m.conj}")
            tests.append(f"{v}.is_neg() is {m.neg}")
        return tests

    def _storage_tests(self, code: Code, params: list[str]) -> list[str]:
        """Per input: the storage offset, the storage's size where a kernel reads it (Note [kernel
        reads stay in storage]), and that no two inputs share a storage (what no guard checks)."""
        g = self.graph
        params = params[:len(g.inputs)]  # the tensors (numbers follow them: Note [number inputs])
        needs = self._storage_needs
        distinct = len({i.storage for i in g.inputs}) == len(g.inputs) > 1
        tests = [f"{v}.storage_offset() == {code.value(inp.meta.storage_offset)}" for v, inp in zip(params, g.inputs)]
        storages = [f"{v}.untyped_storage()" for v in params]
        for i, need in needs.items():  # (each storage fetched once: the tests below read it again)
            tests.append(f"(_s{i} := {storages[i]}).nbytes() >= {code.value(need)}")
            storages[i] = f"_s{i}"
        if distinct:
            tests.append(f"len({{{', '.join(f'{s}._cdata' for s in storages)}}}) == {len(params)}")
        elif g.storage_groups() and (self.sizes is not None or all(inp.meta.numel for inp in g.inputs)):
            # inputs that share a storage as the graph says, and no others (what check_inputs tests;
            # it leaves empty tensors free, so a fixed plan with one leaves the test to it)
            keys = [f"{st}._cdata" for st in storages]
            first: dict[int, int] = {}
            for i, inp in enumerate(g.inputs):
                j = first.setdefault(inp.storage, i)
                if j != i:
                    tests.append(f"{keys[i]} == {keys[j]}")
            tests.append(f"len({{{', '.join(keys[i] for i in first.values())}}}) == {len(first)}")
        elif g.storage_groups():
            tests.append("False")  # inputs that share a storage: check_inputs decides
        return tests

    def _check_and_entry(self) -> tuple[Callable[..., bool], Callable[..., list[torch.Tensor] | None]]:
        """``check(*inputs) -> bool``: True where every input has exactly the planned layout and
        no two share a storage (a False is explained by ``check_inputs``, which raises); and
        ``entry``.

        Note [one entry]: ``entry(*inputs)``: the fast program's outputs where the inputs pass
        the check and the call is plain (``_plain_call``), else None, having run nothing.
        A call through the torch.compile backend went through ``accepts`` and ``run_checked``:
        five Python calls to check the inputs and pick the variant, where this is one generated
        function. Measured (perf/results/x86-cpu-unrecorded/before_after_entry_cpu.json, one alternated run):
        fuseg/eager after/before 0.95 (mlp) to 0.99 (rms-norm, softmax). Inputs that pass the
        guard learned from an earlier call are checked in Python only for what it leaves out
        (Note [learned layout guard] in runtime/compiled/guards.py). None sends the caller to the checked
        call, which explains a refusal or takes the safe variant."""
        code = Code(sizes=self.sizes)
        params = [f"v{i}" for i in range(len(self.graph.inputs))]
        if self.sizes is not None:
            return self._symbolic_check_and_entry(code, params + [f"n{j}" for j in range(self.numbers)])
        layout, storage = self._layout_tests(code, params), self._storage_tests(code, params)
        full = " and ".join(layout + storage) or "True"
        check, _ = code.function("fuseg_check", params, [f"    return {full}"], None)
        args = ", ".join(params)
        needs_grad = " or ".join(f"{v}.requires_grad" for v in params) or "False"
        plain = (f"not {code.const(_dispatch_modes)}() and "
                 f"not ({code.const(torch.is_grad_enabled)}() and ({needs_grad}))")
        fast = code.const(self._fast)
        if not params:
            body = [f"    return {fast}() if {plain} else None"]
        else:
            guard = code.const(self.guard)
            body = [
                f"    if not {guard}.check({args}):",
                "        try:",
                f"            if not ({full}):",
                "                return None",
                "        except (AttributeError, TypeError):  # not a tensor",
                "            return None",
                f"        if {plain}:",
                f"            {guard}.learn({args})",
                f"            return {fast}({args})",
                "        return None",
                f"    if {' and '.join(storage) or 'True'} and {plain}:",
                f"        return {fast}({args})",
                "    return None",
            ]
        entry, _ = code.function("fuseg_entry", params, body, None)
        return check, entry

    def _symbolic_check_and_entry(self, code: Code, params: list[str],
                                  ) -> tuple[Callable[..., bool], Callable[..., list[torch.Tensor] | None]]:
        """``check`` and ``entry`` of a symbolic plan (Note [symbolic plans]): the symbols are read
        from the inputs' sizes, then the plan's conditions, every input's layout (expressions of
        the symbols) and storage are tested. No learned guard: it would learn one size."""
        assert self.sizes is not None
        binds = self.sizes.bind_lines(params, self.symbol_sources)
        # what the learned guard leaves to Python: the symbols' relations, conditions and storages
        quick = [f"({self.sizes.condition_source()})", *self._symbolic_layout_tests(code, params),
                 *self._storage_tests(code, params)]
        tests = [quick[0], *self._layout_tests(code, params), *quick[1:]]
        catch = "    except (AttributeError, TypeError, IndexError, RuntimeError):  # not a tensor of that rank"
        body = ["    try:", *(f"        {b}" for b in binds), f"        return {' and '.join(tests)}", catch,
                "        return False"]
        check, self.check_source = code.function("fuseg_check", params, body, None)
        self._symbolic_tests = (code, binds, tests)
        args = ", ".join(params)
        tensors = ", ".join(params[:len(self.graph.inputs)])  # (then the numbers: Note [number inputs])
        needs_grad = " or ".join(f"{v}.requires_grad" for v in params[:len(self.graph.inputs)]) or "False"
        plain = (f"not {code.const(_dispatch_modes)}() and "
                 f"not ({code.const(torch.is_grad_enabled)}() and ({needs_grad}))")
        guard, fast = code.const(self.guard), code.const(self._fast)
        metas = [i.meta for i in self.graph.inputs]
        free = ([[is_symbolic(n) for n in m.shape] for m in metas], [[is_symbolic(s) for s in m.stride] for m in metas])
        body = [f"    if not {guard}.check({tensors}):",  # Note [learned layout guard], the symbolic sizes left out
                f"        if not {code.const(check)}({args}) or not ({plain}):",
                "            return None",
                f"        {guard}.learn({tensors}, free={code.const(free)})",
                f"        return {fast}({args})",
                "    try:", *(f"        {b}" for b in binds), f"        ok = {' and '.join(quick)}", catch,
                "        return None",
                f"    return {fast}({args}) if ok and {plain} else None"]
        entry, _ = code.function("fuseg_entry", params, body, None)
        return check, entry

    def _symbolic_layout_tests(self, code: Code, params: list[str]) -> list[str]:
        """The sizes and strides of the inputs that are symbolic, against their expressions (a
        symbol's own source is what binds it: no test)."""
        sources = {(src.input, src.dim) for src in self.symbol_sources.values()}
        tests = []
        for i, (v, inp) in enumerate(zip(params, self.graph.inputs)):
            m = inp.meta
            for d, n in enumerate(m.shape):
                if is_symbolic(n) and (i, d) not in sources:
                    tests.append(f"{v}.size({d}) == {code.value(n)}")
            for d, st in enumerate(m.stride):
                if is_symbolic(st):
                    tests.append(f"{v}.stride({d}) == {code.value(st)}")
        return tests

    def refusal(self, *inputs: Any) -> str | None:
        """Why a symbolic plan's check refuses ``inputs`` (the first test that fails), or None."""
        if self.sizes is None:
            return None if self.accepts(*inputs) else "the inputs differ from the compiled signature"
        code, binds, tests = self._symbolic_tests
        params = [f"v{i}" for i in range(len(self.graph.inputs))] + [f"n{j}" for j in range(self.numbers)]
        # the tests in order in one function (a test may use a name an earlier one bound)
        body = [f"    {b}" for b in binds] + [f"    if not ({t}):\n        return {k}" for k, t in enumerate(tests)]
        fn, _ = code.function("fuseg_refusal", params, body, "None")
        try:
            k = fn(*inputs)
        except Exception as e:  # noqa: BLE001 - a refusal, explained
            return f"{type(e).__name__}: {e}"
        return None if k is None else tests[k]

    @functools.cached_property
    def _storage_needs(self) -> dict[int, int]:
        """Graph input index -> bytes its storage must hold, for the inputs generated kernels read
        or write (Note [kernel reads stay in storage] in runtime/backends/kernels.py), and those
        read through a view made without the dispatcher: a gather's (runtime/compiled/gather.py), a
        METADATA segment's or one made from the plan inside a segment on ATen (Note [views from
        the plan] in runtime/emit/views.py), which ATen's view ops would have checked."""
        index = {v: i for i, v in enumerate(self.graph.input_names)}
        needs: dict[int, int] = {}

        def reads(v: str | None, m: TensorMeta, shape: tuple[int, ...], stride: tuple[int, ...],
                  dtype: torch.dtype) -> None:
            """``v`` read from ``m``'s storage offset, at this layout."""
            span = span_bytes(shape, stride, dtype)
            if isinstance(span, int) and span == 0:
                return  # no element read: an empty tensor's offset may lie past its storage's end, as torch allows
            if v in index:
                need = m.storage_offset * m.itemsize + span
                # (sym_max: a symbolic size is compared at the call, never decided here)
                needs[index[v]] = torch.sym_max(needs[index[v]], need) if index[v] in needs else need

        inputs = {v: i.meta for v, i in zip(self.graph.input_names, self.graph.inputs)}
        for launch in self._chosen.values():
            for p in getattr(getattr(launch, "kernel", None), "params", ()):
                for v in (p.value, p.target):
                    if v in inputs:
                        reads(v, inputs[v], p.shape, p.stride, p.dtype)
            src = getattr(launch, "raw_source", None)  # Note [gathers at constant affine indices]
            if src in inputs:
                m = inputs[src]
                reads(src, m, m.shape, m.stride, m.dtype)
        for seg in self.plan.segments:
            if seg.index in self.folded or not any(v in inputs for v in seg.inputs):
                continue  # (a view made from the plan starts at a segment input)
            views = (metadata_views(self.graph, seg)[0] if seg.kind == SegmentKind.METADATA
                     else planned_views(self.graph, seg, self.ctx.targets(seg)))
            for src, want, _ in views.values():
                reads(src, want, want.shape, want.stride, want.dtype)
        return needs

    def _check_storages(self, inputs: Sequence[torch.Tensor]) -> None:
        for i, need in self._storage_needs.items():
            t = inputs[i]
            check_storage(t, need - t.storage_offset() * t.itemsize, self.graph.inputs[i].name)

    @functools.cached_property
    def _safe(self) -> Callable[..., list[torch.Tensor]]:
        if self.sizes is not None:
            return self._safe_program
        return self._program_function(fast=False)[0]

    def profile_launches(self, *inputs: torch.Tensor, calls: int = 100) -> list[dict[str, Any]]:
        """Mean microseconds per call spent in each launch (a timed variant of the program, run
        ``calls`` times on ``inputs``): where a call's time goes, launch by launch."""
        if self.sizes is None:
            check_inputs(self.graph, inputs)
        elif not self._check(*inputs):
            raise ValueError(f"graph {self.graph.name!r}: the inputs break a condition of this symbolic plan")
        timed = [0.0] * len(self.plan.segments)
        fn, _ = self._program_function(fast=_plain_call(inputs), timed=timed)
        fn(*inputs)
        timed[:] = [0.0] * len(timed)
        for _ in range(calls):
            fn(*inputs)
        return [{"segment": la.segment, "kind": la.kind.value, "backend": la.backend,
                 "ops": [n.op for n in self.plan.segments[la.segment].nodes], "us": t / calls * 1e6}
                for la, t in zip(self.launches, timed)]

    def _launch_function(self, launch: Launch) -> Callable[[Env], None]:
        if self.sizes is not None:
            raise NotSymbolic("a launch of a symbolic plan runs inside its program, which reads the sizes")
        seg = self.plan.segments[launch.segment]
        code = Code()
        for v, t in self._fixed.items():
            code.fixed(v, t)
        env = "env"
        reads = [v for v in dict.fromkeys([*seg.inputs, *self.ctx.targets(seg).values()]) if v not in self._fixed]
        # (a launch run alone computes its values even where the program folded it)
        for v in reads:
            code.line(f"{code.var(v)} = {env}[{code.const(v)}]")
        self._emit_launch(code, seg, guard=True)
        for o in seg.outputs:
            code.line(f"{env}[{code.const(o)}] = {code.var(o)}")
        for v in launch.frees:
            code.line(f"{env}.pop({code.const(v)}, None)")
        fn, _ = code.function("fuseg_launch", [env], code.lines, None)
        stats = getattr(launch._launch, "stats", None)
        if stats is not None:
            fn.stats = stats  # type: ignore[attr-defined]
        return fn

    # --- inspection ---------------------------------------------------------------------------

    @property
    def kernels(self) -> dict[int, Any]:
        """Per segment run by a generated kernel, that kernel (runtime.codegen.Kernel)."""
        return {i: launch.kernel for i, launch in self._chosen.items() if hasattr(launch, "kernel")}

    @property
    def nvfuser_kernels(self) -> dict[int, int]:
        """Per segment run by nvFuser, how many kernels nvFuser ran for it (read from its profile)."""
        return {i: launch.kernels_run for i, launch in self._chosen.items()
                if getattr(launch, "kernels_run", None) is not None}

    @property
    def fallbacks(self) -> list[str]:
        """Every distinct fallback, with how many segments it concerned."""
        counts: dict[str, int] = {}
        for passed in self.passed_over.values():
            for name, why in passed:
                key = f"{name}: {why}"
                counts[key] = counts.get(key, 0) + 1
        return [f"{k} ({n} kernel segments fell back)" for k, n in counts.items()]

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        if len(inputs) == self.arity:
            out = self.entry(*inputs)
            if out is not None:
                return out
        if any(not isinstance(t, torch.Tensor) for t in inputs[:len(self.graph.inputs)]):
            # Note [numbers for 0-dim inputs] (segmenter/capturing/reference.py): fd.execute([t0, 2.5])
            inputs = tuple(numbers_as_tensors(self.graph, inputs[:len(self.graph.inputs)])) + inputs[len(self.graph.inputs):]
            if len(inputs) == self.arity:
                out = self.entry(*inputs)
                if out is not None:
                    return out
        try:
            ok = self._check(*inputs)
        except (AttributeError, TypeError):  # not a tensor: check_inputs says which
            ok = False
        if not ok:
            if self.sizes is not None:  # check_inputs compares with symbolic metas: it cannot say more
                raise ValueError(f"graph {self.graph.name!r}: the inputs' sizes or layouts break a condition of "
                                 f"this symbolic plan ({self.sizes.condition_source()}) or its input layouts")
            check_inputs(self.graph, inputs)
            self._check_storages(inputs)
        return self.run_checked(*inputs)

    def run_checked(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """The program on inputs already known to match its signature (``accepts``)."""
        run = self._fast if _plain_call(inputs) else self._safe
        # (Note [torch's threads beside background compilers] in runtime/machine/threads.py)
        if self._building is None or all(f.done() for f in self._building):
            return threads.beside_builds(run, inputs)
        with _interim_call():
            results = threads.beside_builds(run, inputs)
        self._interim_calls += 1
        return results

    def accepts(self, *inputs: Any) -> bool:
        """Whether ``inputs`` match the signature exactly (cheap: one generated comparison)."""
        try:
            return bool(self._check(*inputs))
        except (AttributeError, TypeError):
            return False


# Note [fast and safe programs]: a program is generated in two variants. The fast one makes its
# views and buffers without a dispatcher round trip (``_reinterpret_tensor`` and
# ``_empty_strided_cpu``, as Inductor's CPU wrapper does); it runs when nothing could observe the
# difference: no dispatch mode is active (runtime.memory.PeakTracker, FakeTensorMode) and autograd
# records nothing (grad mode off, or no input requires grad). Otherwise the safe one runs, with
# ``as_strided`` and ``torch.empty_strided`` (made on first need).
def _plain_call(inputs: Sequence[torch.Tensor]) -> bool:
    if _dispatch_modes():
        return False
    return not torch.is_grad_enabled() or not any(t.requires_grad for t in inputs)


_dispatch_modes = torch._C._len_torch_dispatch_stack


def compile_program(plan: SegmentedFusion, backend: str = "auto", chains: bool = True) -> CompiledProgram:
    return CompiledProgram(plan, backend, chains)


def run(plan: SegmentedFusion, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return CompiledProgram(plan)(*inputs)


class ModuleProgram:
    """A captured module's program, called like the module with its own inputs: parameters and
    buffers are looked up in the module at each call (so training updates are seen), and buffers
    the module mutates (batch-norm running statistics) are updated in it, as eager would."""

    def __init__(self, module: torch.nn.Module, program: CompiledProgram) -> None:
        self.module = module
        self.program = program

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        from segmenter.capturing.from_torch import bind_inputs

        return self.program(*bind_inputs(self.program.graph, self.module, inputs))


def compile_module(
    module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], mode: str = "post", backend: str = "auto",
) -> ModuleProgram:
    """capture -> segment -> alias -> compile, for a module."""
    from alias import apply_aliases
    from segmenter import capture, segment

    plan = apply_aliases(segment(capture(module, list(example_inputs))), mode)
    return ModuleProgram(module, CompiledProgram(plan, backend))

