"""A compiled program: a flat list of launches over a plan from the segmenter and alias pass.

    launches:  METADATA  -> views made with as_strided on the storage they view (no kernel)
               kernels   -> the backend's callable for the segment (torch: its ops in order)
               OPAQUE    -> the op on torch
Everything that can be decided at compile time is: which op runs, which values each launch
reads, which values die after it (freed right after their last use; a view keeps its base alive
for as long as it lives), and, in the "pre"/"off" modes, which values cross a launch boundary as
contiguous copies, as today's fusers make them.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from alias.check import PlanError, plan_problems
from segmenter import FusionGraph, GraphError, Node, Segment, SegmentedFusion, SegmentKind, TensorMeta
from segmenter.ir import OpRef, ValueRef
from segmenter.meta import run_node
from segmenter.ops import resolve_op
from segmenter.reference import check_inputs, finish, storage_key

from .backends import backends_for
from .codegen import Declined
from .codegen.index import dense_strides
from .inplace import out_overload, plan_in_place_writes

__all__ = ["CompiledProgram", "Launch", "compile_program"]

Env = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Launch:
    segment: int
    kind: SegmentKind
    backend: str  # "metadata", "torch", ...
    run: Callable[[Env], None]
    frees: tuple[str, ...]  # values dead after this launch


def _arg_getter(a: object) -> Callable[[Env], object]:
    """Reads one argument at call time; everything about it that can be known is known now."""
    if isinstance(a, ValueRef):
        name = a.name
        return lambda env: env[name]
    if isinstance(a, OpRef):
        op = resolve_op(a.name)
        if op is None:  # never hand an op we cannot vouch for to the op that calls it
            raise GraphError(f"op argument {a.name} is not known to torch; it cannot be run")
        return lambda env: op
    if isinstance(a, tuple):
        if not any(isinstance(x, (ValueRef, tuple)) for x in a):
            const = list(a)
            return lambda env: const
        parts = [_arg_getter(x) for x in a]
        return lambda env: [p(env) for p in parts]
    return lambda env: a


def compile_node(node: Node) -> Callable[[Env], list[torch.Tensor | None]]:
    """A callable running ``node``'s ATen op on an environment, with the op resolved and the
    argument reads prepared at compile time."""
    op = resolve_op(node.op)
    if op is None:
        raise GraphError(f"node {node.name!r}: op {node.op} is not known to torch; it cannot be run")
    getters = [_arg_getter(a) for a in node.args]
    kw = [(k, _arg_getter(v)) for k, v in node.kwargs]
    n_out = len(node.outputs)

    def call(env: Env) -> list[torch.Tensor | None]:
        result = op(*[g(env) for g in getters], **{k: g(env) for k, g in kw})
        if n_out == 1 and not isinstance(result, (tuple, list)):
            return [result]
        return list(result)

    return call


def _metadata_launch(graph: FusionGraph, seg: Segment) -> Callable[[Env], None]:
    """Each output as one as_strided over the tensor its view chain starts from, with the output's
    conj/neg bits (as_strided keeps its source's; see Note [conjugate and negative bits])."""
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    plans = []
    for o in seg.outputs:
        src = o
        while src in made:
            src = made[src].inputs[0]
        want, have = graph.metas[o], graph.metas[src]
        if want.dtype != have.dtype:  # view(dtype) somewhere in the chain: replay the ops
            plans.append((o, None, None))
            continue
        plans.append((o, src, (want, want.storage_offset - have.storage_offset)))
    nodes = seg.nodes

    def run(env: Env) -> None:
        replayed = False
        for o, src, layout in plans:
            if src is None:
                if not replayed:
                    for node in nodes:
                        for name, val in zip(node.outputs, run_node(node, env)):
                            if name is not None:
                                env[name] = val
                    replayed = True
                continue
            t = env[src]
            want, delta = layout
            env[o] = want.with_bits(t.as_strided(want.shape, want.stride, t.storage_offset() + delta))

    return run


def _in_place_node(node: Node, target: str) -> Callable[[Env], list[torch.Tensor | None]]:
    """``node`` computed by its ``.out`` overload straight into the input ``target``."""
    op, why_not = out_overload(node)
    if op is None:  # plan_in_place_writes only picks nodes with a usable .out overload
        raise AssertionError(f"node {node.name!r}: {why_not}")
    getters = [_arg_getter(a) for a in node.args]
    kw = [(k, _arg_getter(v)) for k, v in node.kwargs]

    def call(env: Env) -> list[torch.Tensor | None]:
        out = env[target]
        op(*[g(env) for g in getters], **{k: g(env) for k, g in kw}, out=out)
        return [out]

    return call


def _torch_launch(
    graph: FusionGraph, seg: Segment, materialize: frozenset[str], dying: tuple[str, ...] = (),
    in_place: dict[str, int] | None = None,
) -> Callable[[Env], None]:
    nodes = seg.nodes
    outputs = seg.outputs
    metas: dict[str, TensorMeta] = {o: graph.metas[o] for o in outputs}
    inputs = seg.inputs
    # Intermediates die at their last use inside the segment, as they would in eager.
    last: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for v in node.inputs:
            last[v] = k
    # Inputs whose last use in the whole program is here leave the environment at once, so they
    # too die inside the launch, at their last use.
    keep = set(outputs) | (set(inputs) - set(dying))
    dies = [tuple(v for v in node.inputs if last[v] == k and v not in keep) for k, node in enumerate(nodes)]

    in_place = in_place or {}
    targets = {n.name: graph.inputs[in_place[n.name]].name for n in nodes if n.name in in_place}
    written = {o for n in nodes if n.name in targets for o in n.outputs}
    needed = list(dict.fromkeys([*inputs, *targets.values()]))
    steps = [(_in_place_node(node, targets[node.name]) if node.name in targets else compile_node(node),
              node.outputs, dead) for node, dead in zip(nodes, dies)]

    def run(env: Env) -> None:
        local = {v: env[v] for v in needed}
        in_storages = {storage_key(t) for t in local.values()}
        for v in dying:
            del env[v]
        for call, names, dead in steps:
            for name, val in zip(names, call(local)):
                if name is not None:
                    local[name] = val
            for v in dead:
                del local[v]
        for o in outputs:
            t = local[o]
            m = metas[o]
            if o in written:
                pass  # the input itself, holding its final value (see Note [in-place write-back])
            elif o in materialize:
                # a fresh dense buffer, dims in the planned order (a plain .contiguous() would turn
                # a permuted layout, e.g. CUDA attention's output, into one a later view cannot take)
                t = m.with_bits(torch.empty_strided(m.shape, dense_strides(m.shape, m.stride), dtype=m.dtype,
                                                    device=t.device)).copy_(t)
            elif ((storage_key(t) in in_storages and seg.kind != SegmentKind.OPAQUE) or not _same_strides(t, m)
                  or t.is_conj() != m.conj or t.is_neg() != m.neg):
                # A launch writes its outputs, in the layout the plan was compiled for (graph
                # outputs keep eager's strides even where a contiguous copy fed the kernel).
                t = _fresh_in_layout(t, m)
            env[o] = t

    return run


def _fresh_in_layout(t: torch.Tensor, m: TensorMeta) -> torch.Tensor:
    """A fresh tensor with ``t``'s values in layout ``m``. Where ``m`` repeats elements (a stride-0
    dim, as an expanded output has), the values along that dim are equal: one copy of them is
    written and the dim is expanded over it (copy_ refuses to write overlapping elements)."""
    if not any(st == 0 and n > 1 for n, st in zip(m.shape, m.stride)):
        return m.with_bits(torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=t.device)).copy_(t)
    one = tuple(1 if st == 0 else n for n, st in zip(m.shape, m.stride))
    base = m.with_bits(torch.empty_strided(one, m.stride, dtype=m.dtype, device=t.device))
    base.copy_(t[tuple(slice(0, 1) if st == 0 else slice(None) for st in m.stride)])
    return base.expand(m.shape)


def _view_bits(graph: FusionGraph, seg: Segment) -> str | None:
    """Why generated kernels cannot run ``seg``: a value it touches carries a conj/neg bit, which
    a kernel reading raw storage would not see (Note [conjugate and negative bits]); else None."""
    values = (*seg.inputs, *(o for n in seg.nodes for o in n.outputs if o is not None))
    for v in values:
        m = graph.metas[v]
        if m.conj or m.neg:
            return f"%{v} carries the {'conjugate' if m.conj else 'negative'} bit: left to torch"
    return None


def _same_strides(t: torch.Tensor, m: TensorMeta) -> bool:
    return tuple(t.shape) == m.shape and all(a == b for n, a, b in zip(m.shape, t.stride(), m.stride) if n > 1)


def _without_cyclic_gc(fn: Callable) -> Callable:
    """Compiling makes a few closures per segment and frees none until it returns: the cyclic
    collector rescanned the whole plan again and again (4.6 of 6.2 s on 100k nodes)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return wrapped


class CompiledProgram:
    """Call it like the graph: ``program(*inputs) -> list of outputs``."""

    @_without_cyclic_gc
    def __init__(self, plan: SegmentedFusion, backend: str = "auto") -> None:
        problems = plan_problems(plan)  # linear time; the full alias.check runs in the tests
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise PlanError(f"graph {plan.graph.name!r}: the plan breaks the alias invariants, so it is not run: "
                            + "; ".join(problems[:5]) + more)
        self.plan = plan
        self.graph = graph = plan.graph
        #: per kernel segment, the backends passed over and why (segment index -> [(backend, reason)])
        self.passed_over: dict[int, tuple[tuple[str, str], ...]] = {}
        self.backend_of: dict[int, str] = {}
        #: per segment run by a generated kernel, that kernel (runtime.codegen.Kernel)
        self.kernels: dict[int, object] = {}
        #: per segment run by nvFuser, how many kernels nvFuser ran for it (read from its profile)
        self.nvfuser_kernels: dict[int, int] = {}
        keep = set(graph.outputs) | {m.value for m in graph.mutations} | set(graph.input_names)
        # the graph's constants, bound now on the device the program used (never passed in; kept
        # for the whole call, so outputs that are constants are handed out as copies)
        self.constants: dict[str, torch.Tensor] = {c.name: c.tensor() for c in graph.constants}
        keep |= set(self.constants)
        last_use: dict[str, int] = {}
        for seg in plan.segments:
            for v in seg.inputs:
                last_use[v] = seg.index
        materialize = frozenset()
        if plan.alias_mode in ("pre", "off"):
            made = {o: s.index for s in plan.segments for o in s.outputs}
            materialize = frozenset(
                v for s in plan.segments for v in s.inputs
                if v in made and plan.segments[made[v]].kind != SegmentKind.METADATA and v not in keep
            )
        #: node -> the input it writes in place; input -> why its write-back stays a copy
        self.in_place, self.copy_write_backs = plan_in_place_writes(plan)
        self.written_in_place = frozenset(self.in_place.values())
        device_type = graph.inputs[0].meta.device_type if graph.inputs else "cpu"
        choices = backends_for(device_type, backend)
        launches = []
        # values dead after each segment, in one pass (a scan of every value per segment was
        # quadratic: 52 s of a 100k-node compile)
        dies_after: dict[int, list[str]] = {}
        for v, k in last_use.items():
            if v not in keep:
                dies_after.setdefault(k, []).append(v)
        for seg in plan.segments:
            frees = tuple(dies_after.get(seg.index, ()))
            if seg.kind == SegmentKind.METADATA:
                launches.append(Launch(seg.index, seg.kind, "metadata", _metadata_launch(graph, seg), frees))
                continue
            torch_run = _torch_launch(graph, seg, materialize, frees, self.in_place)
            if seg.kind == SegmentKind.OPAQUE:  # always on torch
                launches.append(Launch(seg.index, seg.kind, "torch", torch_run, frees))
                continue
            passed: list[tuple[str, str]] = []
            bits = _view_bits(graph, seg)
            for b, why in choices:
                run = torch_run if b.name == "torch" else None
                if why is None and run is None and bits is not None:
                    why = bits
                if why is None and run is None:
                    try:
                        run = self._build(b.name, seg, materialize, frees, torch_run)
                    except Declined as e:
                        why = str(e)
                if run is not None:
                    break
                passed.append((b.name, why))
            self.backend_of[seg.index] = b.name
            if passed:
                self.passed_over[seg.index] = tuple(passed)
            launches.append(Launch(seg.index, seg.kind, b.name, run, frees))
        self.launches = tuple(launches)

    def _build(self, name: str, seg: Segment, materialize: frozenset[str], frees: tuple[str, ...],
               torch_run: Callable[[Env], None]) -> Callable[[Env], None]:
        if name == "nvfuser":
            from .nvfuser_backend import nvfuser_launch

            return nvfuser_launch(self.graph, seg, self.in_place, frees, self.nvfuser_kernels)
        from .generated import generated_launch

        run, kernel = generated_launch(self.graph, seg, "cuda" if name == "cupy" else "cpu", materialize, frees,
                                       self.in_place, torch_run)
        self.kernels[seg.index] = kernel
        return run

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
        graph = self.graph
        check_inputs(graph, inputs)
        env: Env = dict(zip(graph.input_names, inputs))
        env.update(self.constants)
        for launch in self.launches:
            launch.run(env)
            for v in launch.frees:
                env.pop(v, None)  # torch launches drop theirs at the last use inside them
        return finish(graph, list(inputs), env, self.written_in_place)


def compile_program(plan: SegmentedFusion, backend: str = "auto") -> CompiledProgram:
    return CompiledProgram(plan, backend)


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
        from segmenter.from_torch import bind_inputs

        return self.program(*bind_inputs(self.program.graph, self.module, inputs))


def compile_module(
    module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], mode: str = "post", backend: str = "auto",
) -> ModuleProgram:
    """capture -> segment -> alias -> compile, for a module."""
    from alias import apply_aliases
    from segmenter import capture, segment

    plan = apply_aliases(segment(capture(module, list(example_inputs))), mode)
    return ModuleProgram(module, CompiledProgram(plan, backend))
