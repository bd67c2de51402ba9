"""``torch.compile(model, backend="fuseg")``: our segmentation stage behind AOTAutograd.

AOTAutograd hands us functional ATen graphs (forward, and backward when training), with input
mutation as a ``copy_`` epilogue (inference) or as extra outputs it writes back itself
(training). Each graph is compiled on its first call with the real inputs, so graphs with
symbolic sizes are specialized to the concrete shapes, and cached by the inputs' signature
(shapes, strides, offsets, dtypes, devices, which inputs share storage): another signature
compiles again, never misreads. A graph with sizes read from data (``.item()`` as a size,
``nonzero``, ``masked_select``...) runs those ops on torch and the rest in parts compiled so
(Note [sizes read from data run on torch] in runtime/unbacked.py).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from alias import apply_aliases
from segmenter import SegmenterOptions, from_fx, segment
from segmenter.capturing.fx_import import has_symbolic_sizes
from segmenter.capturing.storages import storage_ids
from segmenter.capturing.unbacked import has_data_dependent_sizes
from segmenter.ir.symbolic import symbolic_hashing

from . import logs
from .compiled.program import CompiledProgram
from .compiled.segments_run import segments_run
from .cudagraphs import use_cuda_graphs
from .machine import pause
from .options import FIELDS as RUNTIME_FIELDS
from .options import PROCESS_FIELDS, bound
from .options import current as runtime_options_now
from .options import use as use_runtime_options
from .unbacked import DataDependentSplit, split_at_data

__all__ = ["DECOMPOSED", "STATS", "FusegCompiler", "aot_backend", "compile_with_aot", "decompositions", "fuseg_backend",
           "registered_by_name"]

#: programs built in this process: symbolic plans, programs specialized to one signature, and why
#: each graph with symbolic sizes was specialized instead (perf.dynamic_shapes reads them); ops run on
#: torch because their sizes are read from data (Note [sizes read from data run on torch])
STATS: dict[str, Any] = {"symbolic_plans": 0, "specialized_programs": 0, "symbolic_refused": [],
                         "built_in_background": 0, "data_dependent_on_torch": 0}


def _signature(args: Sequence[Any]) -> tuple:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return tuple(
        (tuple(a.shape), a.stride(), a.storage_offset(), a.dtype, a.device) if isinstance(a, torch.Tensor) else repr(a)
        for a in args
    ) + (tuple(storage_ids(tensors)),)


_DYNAMO_HOLDS: list[bool] = []  # (a hold taken by dynamo's start callback, not yet released)
_DYNAMO_LOCK = threading.Lock()


def _hold(_args: Any) -> None:
    with _DYNAMO_LOCK:
        if not _DYNAMO_HOLDS:
            _DYNAMO_HOLDS.append(True)
            pause.hold(compile=True)


def _release(_args: Any) -> None:
    """(only a hold the start callback took: the end of the compile during which the callbacks
    were registered must not end somebody else's)"""
    with _DYNAMO_LOCK:
        if _DYNAMO_HOLDS:
            _DYNAMO_HOLDS.clear()
            pause.release()


def _pause_during_dynamo_compiles() -> None:
    """Note [compilers paused while dynamo traces] (runtime/machine/pause.py): dynamo's
    compile-start and compile-end callbacks hold and release the pause on background compilers;
    registered by each compiler made where they are not (``torch._dynamo.reset()`` clears them;
    a compile under way at the registration is not held: its end finds no hold to release)."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # pragma: no cover - a torch without dynamo's callbacks: nothing paused
        return
    if _hold not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_hold)
        callback_handler.register_end_callback(_release)


class FusegCompiler:
    """The compiler AOTAutograd calls for each graph; the returned callable compiles lazily.
    ``backend``: the kernel backend (``auto``: the registry's order; runtime/backends/)."""

    def __init__(self, mode: str = "post", options: SegmenterOptions | None = None, backend: str = "auto",
                 dynamic: bool = True, cuda_graphs: bool = False, background_builds: bool | str | None = None,
                 runtime_options: Mapping[str, Any] | None = None) -> None:
        self.mode = mode
        #: Note [options in one place] (runtime/options.py): the runtime options given here, over
        #: the environment's; each graph's calls run with them (``options.bound``)
        self.runtime_changes = dict(runtime_options or {})
        process_wide = sorted(set(self.runtime_changes) & PROCESS_FIELDS)
        if process_wide:
            raise ValueError(f"fuseg: options {process_wide} are the process's, not one compile's: set them in "
                             "the environment or with runtime.options.configure(...) (docs/options.md)")
        given = runtime_options_now().replace(**self.runtime_changes)  # (a bad value fails here, named)
        _pause_during_dynamo_compiles()
        #: Note [kernels built in the background] (runtime/compiled/background.py): a program's new
        #: kernels (a symbolic plan's or one of fixed sizes; not one captured into a CUDA graph)
        #: compile off the caller's thread while torch runs their segments: True for
        #: every graph, False for none, "inference" (the default) for inference graphs only (a
        #: training step's backward kernels are what its steps run; measured there). The
        #: ``background_builds`` runtime option (FUSEG_BACKGROUND_BUILDS=1 / 0) sets True / False.
        self.background_builds: bool | str = (
            background_builds if background_builds is not None else given.background_builds)
        self._inference_graph = False  # (set by ``infer`` around the graph it compiles)
        #: capture each program of static shapes into a CUDA graph (Note [CUDA graphs of a program])
        self.cuda_graphs = cuda_graphs
        # the bias_after_matmul runtime option (FUSEG_BIAS_AFTER_MATMUL=0): Note [a matmul's bias
        # after it] off where no options are given (the before of its measurement in perf/gpu_validate.sh)
        self.options = options or SegmenterOptions(bias_after_matmul=given.bias_after_matmul)
        self.backend = backend
        #: plan graphs with symbolic sizes once for every size (Note [symbolic plans]); False:
        #: specialize every graph to each call's sizes, as before
        self.dynamic = dynamic
        #: why each graph that has symbolic sizes was specialized instead
        self.symbolic_refused: list[str] = []
        #: raise what a symbolic plan's making raised, instead of specializing (tests, debugging)
        self.strict = False
        self.compiled: list[CompiledProgram] = []  # every program built, for inspection and tests
        #: graphs AOTAutograd handed us: (the boxed call, and for an inference graph its metadata,
        #: else None); and why the last ``compile_with_aot`` refused a direct call (None: it did not)
        self.graphs: list[tuple[Callable[..., Any], Any]] = []
        self.direct_refused: str | None = None
        #: per graph with sizes read from data, what of it ran on torch and why (Note [sizes read
        #: from data run on torch] in runtime/unbacked.py)
        self.data_dependent: list[DataDependentSplit] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        tokens = strip_effect_tokens(gm)
        if not self.runtime_changes:
            if has_data_dependent_sizes(gm):
                return self._register(*self._split_at_data(gm, tokens), tokens, gm)
            return self._register(*self._compile(gm, tokens), tokens, gm)
        # the options resolved once per graph, over the environment as it is now: a graph's
        # program is made at its first call, and remade at later ones (its kernels, in builds
        # that copy the caller's context), so each call of ``run`` and ``hot`` runs with them
        given = runtime_options_now().replace(**self.runtime_changes)
        with use_runtime_options(given):
            made = self._split_at_data(gm, tokens) if has_data_dependent_sizes(gm) else self._compile(gm, tokens)
        return self._register(*(bound(fn, given) for fn in made), tokens, gm)

    def _split_at_data(self, gm: fx.GraphModule, tokens: frozenset[int]) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """Note [sizes read from data run on torch] (runtime/unbacked.py): the ops whose sizes
        are read from data run on torch, the rest in parts compiled as any graph; the boxed call
        and a ``hot`` that never runs (AOTAutograd's wrapper stays: its checks of dynamo's
        assertions on the data-dependent sizes are the graph's)."""
        name = f"data_graph_{len(self.data_dependent)}"

        def compile_part(sub: fx.GraphModule, k: int) -> Callable[..., Any]:
            sub.meta["fuseg_name"] = f"{name}_part_{k}"  # (the programs' names in ``explain``)
            return self._compile(sub, frozenset())[0]

        outer, report = split_at_data(gm, name, compile_part, effects=bool(tokens))
        self.data_dependent.append(report)
        STATS["data_dependent_on_torch"] += len(report.on_torch)

        def run(boxed: list[Any]) -> tuple[Any, ...]:
            args = [a for i, a in enumerate(boxed) if i not in tokens] if tokens else list(boxed)
            boxed.clear()
            return tuple(outer(*args))

        return run, lambda *args: None

    def _compile(self, gm: fx.GraphModule, tokens: frozenset[int]) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The boxed call of a graph (compiled at its first call) and its ``hot`` entry."""
        trace_id = logs.current_trace_id()  # (Note [fuseg in torch's logs]: the first call comes after)
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        outs = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
        present = [o is not None for o in outs]
        all_present = all(present)
        if not all_present:  # backward graphs return None for inputs that need no gradient
            out_node.args = (tuple(o for o in outs if o is not None),)
            gm.recompile()
        cache: dict[tuple, tuple[CompiledProgram, dict[int, int]]] = {}
        last: list[CompiledProgram] = []  # the program the previous call ran: tried first
        if not any(present):
            return self._as_it_is(gm, tokens, outs)
        # a graph that returns sizes (Note [size outputs]) always takes the keyed path, which adds them
        numbers = any(isinstance(o, fx.Node) and isinstance(o.meta.get("val"), (int, torch.SymInt))
                      for o in outs if o is not None)
        # Note [symbolic plans] (segmenter/ir/symbolic.py): a graph with symbolic sizes gets plans
        # that serve every size where their conditions hold; the keyed, specialized path is what a
        # graph falls back to where a symbolic plan cannot be made (``symbolic_refused`` says why)
        symbolic = [self.dynamic and has_symbolic_sizes(gm)]
        plans: list[tuple[CompiledProgram, Callable[..., list[int]] | None]] = []
        background = self.background_builds is True or (self.background_builds == "inference" and self._inference_graph)

        def run(boxed: list[Any]) -> tuple[Any, ...]:
            # Boxed convention: we own the argument list and clear it, so AOTAutograd's inputs
            # (saved activations, in backward) can be freed as soon as our launches are done with them.
            args = [a for i, a in enumerate(boxed) if i not in tokens] if tokens else list(boxed)
            boxed.clear()
            # Note [one entry] (runtime/compiled/program.py): the program the previous call ran, where the
            # inputs match it exactly; None (nothing run) sends the call on to the checked path
            results = last[0].entry(*args) if last and not numbers and len(args) == last[0].arity else None
            if results is None and symbolic[0]:
                results = self._run_symbolic(gm, plans, args, symbolic, background, trace_id)
            if results is None:
                key = _signature(args)
                program, sizes = cache.get(key) or (None, {})
                if program is None:
                    # (Note [compilers paused while dynamo traces]: the background ones stop meanwhile)
                    with pause.held(compile=True):
                        with _disable_current_modes():  # Note [compiling outside the caller's modes]
                            graph = from_fx(gm, list(args), name=gm.meta.get("fuseg_name") or f"aot_graph_{len(self.compiled)}",
                                            number_outputs=sizes)
                        program = CompiledProgram(apply_aliases(segment(graph, self.options), self.mode),
                                                  self.backend, background=background and not self.cuda_graphs)
                    if self.cuda_graphs:
                        use_cuda_graphs(program)
                    cache[key] = program, sizes
                    self.compiled.append(program)
                    logs.log_program(program, "specialized", trace_id)
                    STATS["specialized_programs"] += 1
                    if program._building is not None:
                        STATS["built_in_background"] += 1
                last[:] = [program]
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                del args
                results = program(*tensors)
                if sizes:  # Note [size outputs] in segmenter/capturing/fx_import.py
                    results = list(results)
                    for pos in sorted(sizes):
                        results.insert(pos, sizes[pos])
            if all_present:
                return tuple(results)
            it = iter(results)
            return tuple(next(it) if p else None for p in present)

        def hot(*args: Any) -> list[torch.Tensor] | None:
            """See Note [direct inference call]: the last program's outputs where its entry takes these
            arguments, else None (nothing run)."""
            return last[0].entry(*args) if last and not numbers and len(args) == last[0].arity else None

        return run, hot

    def _run_symbolic(self, gm: fx.GraphModule, plans: list, args: list[Any], symbolic: list[bool],
                      background: bool = False, trace_id: Any = None) -> list | None:
        """The outputs of the first symbolic plan whose conditions these arguments meet, or of a
        new plan made for them; None where the graph cannot be planned symbolically (then
        ``symbolic[0]`` is False and the caller specializes). Note [symbolic plans]."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for k in range(len(plans) - 1, -1, -1):
            program, sizes_fn = plans[k]
            inputs = _program_inputs(program, tensors, args)
            results = program.entry(*inputs)
            if results is None:
                if not program.accepts(*inputs):
                    continue
                results = program.run_checked(*inputs)  # a call with grad or under a dispatch mode
            if k != len(plans) - 1:
                plans.append(plans.pop(k))  # the last one that ran is tried first next time
            return _with_sizes(results, sizes_fn, inputs)
        sizes: dict[int, Any] = {}
        try:
            # (Note [compilers paused while dynamo traces]: the background ones stop meanwhile)
            with _disable_current_modes(), symbolic_hashing(), pause.held(compile=True):  # Note [compiling outside the caller's modes]
                graph = from_fx(gm, list(args), name=gm.meta.get("fuseg_name") or f"aot_graph_{len(self.compiled)}", number_outputs=sizes,
                                symbolic=True)
                program = CompiledProgram(apply_aliases(segment(graph, self.options), self.mode), self.backend,
                                          background=background)
                sizes_fn = _sizes_function(program, sizes) if sizes else None
        except Exception as e:  # noqa: BLE001 - any failure of a symbolic plan: specialize, and say why
            if self.strict:
                raise
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
            self.symbolic_refused.append(why)
            logs.log_specialized(f"aot_graph_{len(self.compiled)}", why, trace_id)
            STATS["symbolic_refused"].append(why)
            warnings.warn(f"fuseg: graph {len(self.graphs) - 1} is specialized per shape, not planned symbolically: "
                          f"{why}", stacklevel=2)
            symbolic[0] = False
            return None
        self.compiled.append(program)
        logs.log_program(program, "symbolic plan", trace_id)
        STATS["symbolic_plans"] += 1
        if program._building is not None:
            STATS["built_in_background"] += 1
        plans.append((program, sizes_fn))
        inputs = _program_inputs(program, tensors, args)
        if not program.accepts(*inputs):  # pragma: no cover - a plan always takes the call it was made for
            raise AssertionError(f"a symbolic plan refuses the call it was made for: {program.refusal(*inputs)}")
        return _with_sizes(program.run_checked(*inputs), sizes_fn, inputs)

    def explain(self) -> str:
        """What this compiler made of the graphs it was handed, in lines a person reads: per
        program, which way its segments run now (``segments_run``); what of each graph runs on
        torch because its sizes are read from data, and why (Note [sizes read from data run on
        torch]); why a graph was specialized per shape instead of planned symbolically."""
        lines = [f"{p.graph.name}: {len(p.plan.segments)} segments: {segments_run(p).describe()}" for p in self.compiled]
        lines += [r.describe() for r in self.data_dependent]
        lines += [f"specialized per shape, not planned symbolically: {why}" for why in self.symbolic_refused]
        return "\n".join(lines)

    def wait_for_builds(self) -> None:
        """Wait for every kernel build started in the background (Note [kernels built in the
        background]); from then on each program runs its kernels."""
        for program in self.compiled:
            program.wait_for_builds()

    def _as_it_is(self, gm: fx.GraphModule, tokens: frozenset[int], outs: list[Any],
                  ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """A graph that returns no value (``x.sin(); return x``: dynamo returns the input itself
        and hands over the op nothing reads) is no program to segment (``from_fx`` refuses a
        graph with no outputs); it runs as it is, each op on ATen, so whatever it does to its
        inputs or the random state happens as in eager. Found by tests/test_fuzz_dynamo.py."""

        def run(boxed: list[Any]) -> tuple[Any, ...]:
            args = [a for i, a in enumerate(boxed) if i not in tokens] if tokens else list(boxed)
            boxed.clear()
            gm(*args)
            return tuple(None for _ in outs)

        return run, lambda *args: None

    def _register(self, run: Callable[..., Any], hot: Callable[..., Any], tokens: frozenset[int],
                  gm: fx.GraphModule) -> Callable[..., Any]:
        """``run`` (boxed) with what ``compile_with_aot`` reads of it, kept in ``graphs``."""
        run._boxed_call = True  # type: ignore[attr-defined]
        run.hot, run.tokens = hot, tokens  # type: ignore[attr-defined]
        run.placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")  # type: ignore[attr-defined]
        self.graphs.append((run, None))
        return run

    def infer(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        """AOTAutograd's inference compiler: as a call, keeping the graph's metadata (its
        ``ViewAndMutationMeta``, which AOTAutograd's runtime wrapper acts on) for
        Note [direct inference call]."""
        self._inference_graph = True
        try:
            run = self(gm, example_inputs)
        finally:
            self._inference_graph = False
        ctx = torch._guards.TracingContext.try_get()
        self.graphs[-1] = (run, getattr(ctx, "fw_metadata", None) if ctx is not None else None)
        return run


# Note [compiling outside the caller's modes]: a graph is compiled on its first call, so inside
# whatever dispatch modes are on then: AOTAutograd's own (its runtime wrapper runs the first call
# under a mode that checks custom ops for aliasing), or the caller's (a FLOP counter, a memory
# tracker). ``from_fx`` re-runs the graph on FakeTensors of its own (Note [fake tensor cache] in
# segmenter/capturing/meta.py); under those modes every fake op went through them too. A caller's mode then
# counted ops that never ran, and with AOTAutograd's mode bart-tiny's re-run took 0.30-0.39 s,
# against 0.25-0.28 s without it (three alternated first calls each). So the re-run happens with
# the mode stack set aside; the program itself, folded segments included, runs where it did
# before. (A FakeTensor input keeps its own mode: the re-run uses it, on the stack or not.)


def _program_inputs(program: CompiledProgram, tensors: list[Any], args: list[Any]) -> list[Any]:
    """A symbolic program's arguments: the tensors, then the numbers it reads symbols from
    (Note [number inputs] in segmenter/ir/symbolic.py)."""
    if not program.numbers:
        return tensors
    return [*tensors, *(args[i] for i in program.sizes.number_inputs())]


def _with_sizes(results: list[Any], sizes_fn: Callable[..., list[int]] | None, tensors: list[Any]) -> list[Any]:
    """Note [size outputs] (segmenter/capturing/fx_import.py): the sizes the graph returns, at their places."""
    if sizes_fn is None:
        return results
    return sizes_fn(results, *tensors)


def _sizes_function(program: CompiledProgram, sizes: dict[int, Any]) -> Callable[..., list[Any]]:
    """A generated function ``(results, *inputs) -> results`` with the graph's size outputs
    computed from the inputs' sizes and put at their places."""
    from .emit.wrapper import Code

    code = Code(sizes=program.sizes)
    params = [f"v{i}" for i in range(len(program.graph.inputs))] + [f"n{j}" for j in range(program.numbers)]
    body = ["    r = list(r)"]
    if program.sizes is not None:
        body += [f"    {line}" for line in program.sizes.bind_lines(params, program.symbol_sources)]
    for pos in sorted(sizes):
        body.append(f"    r.insert({int(pos)}, {code.value(sizes[pos])})")
    fn, _ = code.function("fuseg_sizes", ["r", *params], body, "r")
    return fn


def strip_effect_tokens(gm: fx.GraphModule) -> frozenset[int]:
    """Note [effect tokens] (segmenter/capturing/from_torch.py), for AOTAutograd's graphs: AOTAutograd passes
    each effect token in as an input (None at run time) and drops the token outputs. Each
    ``with_effects(token, op, *args)`` becomes a plain call of ``op`` in the same place (run for
    its effect; the segmenter keeps ops that return nothing), the token outputs become None and
    the token inputs go. Returns the positions of the token inputs: the call drops those."""
    graph = gm.graph
    with_effects = torch.ops.higher_order.with_effects
    effects = [n for n in graph.nodes if n.op == "call_function" and n.target is with_effects]
    if not effects:
        return frozenset()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    tokens: set[fx.Node] = set()
    token_outs: list[fx.Node] = []
    for n in effects:
        tokens.add(n.args[0])
        op, returns = n.args[1], len(n.args[1]._schema.returns)
        with graph.inserting_before(n):
            call = graph.call_function(op, tuple(n.args[2:]), dict(n.kwargs))
        val = n.meta.get("val")
        call.meta["val"] = None if returns == 0 or val is None else (val[1] if returns == 1 else tuple(val[1:]))
        for user in list(n.users):  # getitem(with_effects, i): i == 0 is the token
            if user.args[1] == 0:
                tokens.add(user)
                token_outs.append(user)
            elif returns == 1:
                user.replace_all_uses_with(call)
                graph.erase_node(user)
            else:
                user.args = (call, user.args[1] - 1)
    out_node = next(n for n in graph.nodes if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else (out_node.args[0],)
    out_node.args = (tuple(None if o in tokens else o for o in outs),)
    for n in reversed(effects):  # later effects read earlier tokens: erase from the last
        for t in [u for u in token_outs if u.args[0] is n]:
            graph.erase_node(t)
        graph.erase_node(n)
    positions = frozenset(i for i, p in enumerate(placeholders) if p in tokens)
    for i in positions:
        graph.erase_node(placeholders[i])
    gm.recompile()
    return positions


def fuseg_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **options: Any) -> Callable[..., Any]:
    """The dynamo backend registered as "fuseg" (setup.py's ``torch_dynamo_backends`` entry point).

    ``torch.compile(model, backend="fuseg", options={"alias_mode": "pre", "backend": "torch"})``
    picks the alias mode and the kernel backend (default: ``post``, and the registry's order:
    generated C++ kernels on the CPU where a compiler exists); ``"cuda_graphs": True`` replays
    each program of static shapes on CUDA as a CUDA graph (Note [CUDA graphs of a program]).
    """
    if options.get("mode") is not None:
        warnings.warn(f"fuseg: torch.compile(mode={options['mode']!r}) is Inductor's setting; fuseg ignores it",
                      stacklevel=2)
    opts = dict(options.get("options") or {}, **{k: v for k, v in options.items() if k not in ("options", "mode")})
    # Note [options in one place] (runtime/options.py): the runtime options of one compile are keys too
    known = ["alias_mode", "backend", "cuda_graphs", *(f for f in RUNTIME_FIELDS if f not in PROCESS_FIELDS)]
    unknown = set(opts) - set(known)
    if unknown:
        process = sorted(unknown & PROCESS_FIELDS)
        raise ValueError(f"fuseg: unknown options {sorted(unknown)} (known: {', '.join(known)})" + (
            f"; {process} are the process's: set them in the environment or with runtime.options.configure(...)"
            if process else ""))
    compiler = FusegCompiler(mode=opts.get("alias_mode", "post"), backend=opts.get("backend", "auto"),
                             cuda_graphs=bool(opts.get("cuda_graphs", False)),
                             runtime_options={k: v for k, v in opts.items() if k in RUNTIME_FIELDS})
    return compile_with_aot(compiler, gm, example_inputs)


def registered_by_name() -> bool:
    """Make ``torch.compile(backend="fuseg")`` work in this process: True where dynamo finds the
    name through setup.py's entry point (an installed project), else registers ``fuseg_backend``
    under it and returns False. On the GPU machine (2026-11-27) a fresh process did not find the
    name after ``pip install --no-deps --no-build-isolation --no-index -e .`` (InvalidBackend; the
    cause was not found there); the benchmarks call this, so they time fuseg, not that lookup."""
    from torch._dynamo.backends.registry import lookup_backend, register_backend
    from torch._dynamo.exc import InvalidBackend

    try:
        lookup_backend("fuseg")
        return True
    except InvalidBackend:
        register_backend(fuseg_backend, name="fuseg")
        return False


def aot_backend(compiler: FusegCompiler) -> Callable[..., Any]:
    """AOTAutograd around ``compiler`` (forward and backward), as the "fuseg" backend runs it:
    input mutations kept in the graph, Note [decompositions before segmenting], and Note
    [training graphs cut by min-cut]."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, inference_compiler=compiler.infer,
                        keep_inference_input_mutations=True, decompositions=decompositions(),
                        partition_fn=min_cut_rematerialization_partition)


# Note [training graphs cut by min-cut]: AOTAutograd splits a training graph into a forward and a
# backward graph; what the forward saves for the backward is the partitioner's choice. Its
# default saves every value the backward reads: many of them views of one another (an attention
# output detached, a reshape of it, an rsqrt and its detach), each an output the forward program
# hands back and autograd keeps. ``min_cut_rematerialization_partition`` (what Inductor uses)
# saves a minimal cut and recomputes cheap pointwise values in the backward, where our
# generated kernels fuse them with the gradient's math. Measured on a tiny Llama's training
# step (hidden 64, batch 2, 32 tokens; scratch, one process, alternated): forward 1.44 ->
# 1.20 ms, whole step 2.86 -> 2.57 ms (Inductor 2.29). ``tests/test_backward_kernels.py`` and
# the training tests check the gradients against eager.


# Note [direct inference call]: AOTAutograd's runtime wrapper runs around every call of the graph
# it compiled: it prepends the module's parameters, applies mutations to inputs that the graph
# returns instead of doing, regenerates outputs that alias inputs or each other, turns grad mode
# off, and more. For an inference graph that has none of these to do, it costs ~1 us a call
# (rms-norm: a backend through it whose graph returns saved outputs took 9.7 us against 8.7 us
# for one without it, scratch), about what generated kernels leave of small programs' time. So
# ``compile_with_aot`` gives dynamo a function that tries the program the previous call ran
# (its entry: Note [one entry] in runtime/compiled/program.py, which refuses anything but a plain call on
# the layouts it was built for, having run nothing) and otherwise calls AOTAutograd's function:
# the first call, a new layout, a dispatch mode, inputs that need grad. It does so only where
# the graph's ViewAndMutationMeta says the wrapper has nothing to do (``_direct_refusal`` lists
# each condition), so an input mutation, an output that aliases an input, another output or an
# intermediate, training, effect tokens, subclasses or autocast keep AOTAutograd's wrapper on
# every call. Grad mode: AOTAutograd only builds an inference graph where no input requires grad
# or grad is off, dynamo guards both, and an inference graph's outputs need no grad (checked),
# so ops that run with grad on record nothing, as with it off.
def compile_with_aot(compiler: FusegCompiler, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """``aot_backend(compiler)`` on ``gm``, called directly where it can be (Note [direct
    inference call]); ``compiler.direct_refused`` says why not."""
    compiled = aot_backend(compiler)(gm, example_inputs)
    compiler.direct_refused = _direct_refusal(compiler, gm, example_inputs)
    if compiler.direct_refused is not None:
        return compiled
    hot = compiler.graphs[0][0].hot  # type: ignore[attr-defined]
    fallbacks = [0]

    def fuseg_direct(*args: Any) -> Any:
        results = hot(*args)
        if results is None:
            fallbacks[0] += 1
            return compiled(*args)
        return results

    fuseg_direct.fuseg_fallbacks = fallbacks  # type: ignore[attr-defined]
    return torch._dynamo.disable(fuseg_direct, reason="fuseg's compiled program")


def _direct_refusal(compiler: FusegCompiler, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Why AOTAutograd's runtime wrapper has work to do on this graph's calls; None: it has none."""
    from torch._functorch._aot_autograd.schemas import OutputType
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if len(compiler.graphs) != 1 or compiler.graphs[0][1] is None:
        return "training (a forward graph for autograd) or no metadata from AOTAutograd"
    run, meta = compiler.graphs[0]
    if any(isinstance(a, (list, tuple, dict)) for a in example_inputs):
        return "inputs that dynamo flattens"
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None:
        return "parameters or buffers that AOTAutograd prepends to the inputs"
    if run.tokens or meta.tokens:  # type: ignore[attr-defined]
        return "effect tokens"
    if run.placeholders != len(example_inputs):  # type: ignore[attr-defined]
        return "AOTAutograd merged or reordered inputs"
    if any(is_traceable_wrapper_subclass(a) for a in example_inputs if isinstance(a, torch.Tensor)):
        return "tensor subclass inputs"
    if torch._C._is_any_autocast_enabled() or torch._functorch.config.functionalize_rng_ops:
        return "autocast or functionalized RNG, which the wrapper sets around the call"
    ctx = torch._guards.TracingContext.try_get()
    if ctx is not None and ctx.fakify_first_call:
        return "a fakified first call"
    if any(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata for i in meta.input_info):
        return "the graph mutates an input"
    if (meta.num_outputs_aliased or meta.num_intermediate_bases or meta.num_mutated_inp_runtime_indices
            or any(o.output_type != OutputType.non_alias for o in meta.output_info)):
        return "an output aliases an input, another output or an intermediate"
    if any(o.requires_grad for o in meta.output_info):
        return "an output requires grad"
    if meta.dynamic_outputs or meta.grad_enabled_mutation is not None:
        return "dynamic outputs or a grad-mode change, which the wrapper applies"
    return None


# Note [decompositions before segmenting]: AOTAutograd leaves some composite ops whole that are
# made of ops our kernels fuse; ``DECOMPOSED`` lists them, and AOTAutograd applies torch's own
# decompositions of them (as ``segmenter.capture`` does through torch.export's default table).
# - ``_safe_softmax`` (SDPA's math path: falcon's attention) is a softmax whose rows that are all
#   -inf give zeros instead of NaN; kept whole it was an OPAQUE segment, four ATen ops on torch
#   (about 57 us each on falcon-tiny's 2x4x32x32 scores, against about 9 us for a plain softmax).
#   Decomposed (softmax, ``x == -inf``, all over the row, where) it is one row kernel with the
#   scale and the mask before it.
# - The backward ops of activations, softmaxes, slices and selects (issue 42, goal 4): the kernel
#   generator takes none of them whole, so each was a segment on torch in every training step
#   (a tiny Llama's backward: its four RoPE ``slice_backward`` segments alone took 320 of its
#   1150 us of launches, its two ``silu_backward`` 45 us). Decomposed, they are pointwise math,
#   zeros with a ``slice_scatter`` (index math), or a row sum: one generated kernel with their
#   neighbours. ``gelu_backward`` is taken whole by the generator instead (its decomposition
#   calls the erf op, libm's scalar erff: runtime/codegen/lowering/pointwise.py).
# - Layer norm's backward: decomposed, the input's gradient is two row sums and pointwise math
#   (a row kernel), the weight's and bias's gradients two sums over the batch
#   (runtime/codegen/lowering/columns.py); whole, it was an ATen op on torch (bert-tiny: 5 of them, about
#   55 us each; its backward's launches 2.16 -> 1.27 ms with gelu_backward's kernel, scratch). Its decomposition divides by the row's length, a SymInt where
#   sizes are symbolic: the generator takes it as an operand (runtime/codegen/lowering/lower.py).
#   Left whole: embedding and loss backwards (scatters), attention's backward.
DECOMPOSED = frozenset(f"aten.{op}.default" for op in (
    "_safe_softmax",
    "silu_backward", "tanh_backward", "sigmoid_backward", "threshold_backward",
    "hardtanh_backward", "leaky_relu_backward", "elu_backward", "softplus_backward", "hardswish_backward",
    "hardsigmoid_backward", "mish_backward",
    "_softmax_backward_data", "_log_softmax_backward_data",
    "slice_backward", "select_backward", "native_layer_norm_backward",
))


def decompositions() -> dict:
    from torch._decomp import get_decompositions

    ops = [getattr(torch.ops.aten, name.split(".")[1]).default for name in sorted(DECOMPOSED)]
    return get_decompositions(ops)


# Note [how the thresholds are measured] (runtime/codegen/calibrate.py): on a machine whose thread
# thresholds are not kept yet, their library starts building when dynamo first looks this backend
# up, so its second of compiling runs while dynamo traces the first graph, not after it.
def _prepare_thresholds() -> None:
    from .codegen import calibrate, gemm_library

    calibrate.prepare()
    gemm_library.prepare()  # built while dynamo traces the first graph (Note [one matmul library])


_prepare_thresholds()
logs.register()  # Note [fuseg in torch's logs] (runtime/logs.py)
