"""Capture a torch function or module as a FusionGraph, through torch.export.

    fn / module --torch.export (non-strict)--> ExportedProgram --core ATen decompositions-->
    fx graph --fx_import.convert_graph--> FusionGraph (metas recomputed from the real inputs)

Note [what export loses]: an exported program is functional, so it cannot say that an output
was a view of an input in the original program (``y = x[0]; x.add_(1); return y`` exports as
``select(add(x, 1), 0)``, while eager returns a view of ``x``). So capture also runs the original
program once on FakeTensor copies of the inputs (no compute, no memory) and records which outputs
share a storage with an input or an earlier output, and the layout eager gives them
(segmenter/capturing/observe.py).

Note [inputs that share a storage]: export misreads ``f(x, x)`` and ``f(base, base[:2])``. Capture
detects the overlap, exports on distinct copies (same layouts, fresh storages) and records the
shared storage in ``GraphInput.storage``. If the program mutates such an input, distinct copies
would lose the order of the writes (``f(x, x)`` with ``a.add_(1); b.mul_(2)``), so it is captured
again with one input per shared storage (role "storage", target "args:i,j": a flat view of the
storage) and the arguments made as views of it inside the program: functionalization then sees
the real aliasing and orders the writes. ``bind_inputs`` makes that flat view from the arguments.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
from torch.utils import _pytree as pytree

from ..ir.graph import FusionGraph, GraphConstant, GraphError, GraphInput, Mutation, TensorMeta, ValueRef
from .fx_import import CaptureError, convert_graph, observed_aliases, storage_ids
from .meta import propagate_metas
from .observe import check_write_back, module_state, observe, user_outputs
from .outputs import output_tensors

__all__ = ["bind_inputs", "capture"]

_ROLE = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.USER_INPUT: "user",
}
_MUTATION = {OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION, OutputKind.PARAMETER_MUTATION}


class _Program(torch.nn.Module):
    """Wraps a function, with its non-tensor arguments bound, as a module taking only tensors."""

    def __init__(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        super().__init__()
        self.fn = fn
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def forward(self, *tensors: torch.Tensor) -> Any:
        args = list(self.args)
        for i, t in zip(self.tensor_pos, tensors):
            args[i] = t
        return self.fn(*args, **self.kwargs)


# Note [ops kept whole in low precision]: eager computes these in fp32 and rounds once; their
# core-ATen decompositions round to fp16/bf16 after every step (logit's clamp/div/log, addr's
# outer product, cross's index arithmetic, linear/bicubic/trilinear interpolation weights), which
# lands beyond OpInfo's tolerances. With a half-precision tensor argument they stay one ATen op
# (run by torch, as eager runs it); in other dtypes they decompose and fuse as before.
_KEEP_IN_LOW_PRECISION = (
    "logit.default", "addr.default", "linalg_cross.default", "cross.default", "upsample_bicubic2d.vec",
    "upsample_linear1d.vec", "upsample_linear1d.default", "upsample_trilinear3d.vec",
)
_LOW = (torch.float16, torch.bfloat16)


def _low_precision_guard(decomp: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        leaves = pytree.tree_leaves((args, kwargs))
        if any(isinstance(t, torch.Tensor) and t.dtype in _LOW for t in leaves):
            return NotImplemented  # the op stays whole
        return decomp(*args, **kwargs)

    return run


# Note [attention kept whole]: torch.export's table decomposes SDPA's CPU flash op into its math
# ops and lays the output out as [L, N, H, E] in memory (permute, contiguous, permute back: what
# export's own two stages need to agree). Eager's op, and its meta kernel, give the output
# contiguous as [N, H, L, E]: after the decomposition every value computed from the attention
# output had other strides than eager's (found by tests/test_fuzz.py). Kept whole, the op is an
# attention segment as in the torch.compile path (AOTAutograd does not decompose it either): a
# generated attention kernel where one fits, else ATen's own op, with eager's layout either way.
_KEEP_WHOLE = ("_scaled_dot_product_flash_attention_for_cpu.default",)


def _aten(name: str) -> Any:
    """``torch.ops.aten.<packet>.<overload>`` for a name of ours (``"packet.overload"``)."""
    packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


# Note [the decomposition table, once]: torch.export's default table is built and materialized
# (every CompositeImplicitAutograd op of every namespace looked up) at each run_decompositions,
# about 60 ms a capture here, a fifth of a small program's capture. It is built once per process
# and copied: a plain dict of the same entries is what run_decompositions makes of it anyway. It is
# built again when the dispatcher has more ops (a custom op registered since: its CIA
# decomposition is picked up, as the lazy table would) or torch's registry of Python
# decompositions has grown.
_TABLE: tuple[tuple[int, int], dict[Any, Any]] | None = None


def _default_decompositions() -> dict[Any, Any]:
    global _TABLE
    key = (len(torch._C._dispatch_get_all_op_names()), len(torch._decomp.decomposition_table))
    if _TABLE is None or _TABLE[0] != key:
        table = torch.export.default_decompositions()
        for name in _KEEP_WHOLE:
            table.pop(_aten(name), None)
        for name in _KEEP_IN_LOW_PRECISION:
            op = _aten(name)
            if op in table:
                table[op] = _low_precision_guard(table[op])
        _TABLE = (key, dict(table.materialize()))
    return dict(_TABLE[1])


def _fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """Same sizes, strides and offset as ``t``, in a storage of its own."""
    extent = TensorMeta.from_tensor(t).storage_extent
    base = torch.empty(max(extent, 1), dtype=t.dtype, device=t.device)
    out = base.as_strided(t.shape, t.stride(), t.storage_offset())
    if t.device.type != "meta" and not isinstance(t, FakeTensor) and extent:
        # the storage region, element by element (t itself may repeat elements: copy_ into an
        # expanded layout is refused)
        base[:extent].copy_(t.as_strided((extent,), (1,), 0))
    return out


def _param_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[str | None]:
    """The parameter name of each tensor argument (None where the signature does not say)."""
    try:
        params = list(inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn).parameters.values())
    except (TypeError, ValueError):
        return [None] * len(args)
    names: list[str | None] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            p = params[i] if i < len(params) and params[i].kind != inspect.Parameter.VAR_POSITIONAL else None
            names.append(p.name if p is not None and p.name.isidentifier() else None)
    return names


def capture(
    fn_or_module: Callable[..., Any] | torch.nn.Module,
    example_inputs: Sequence[Any],
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> FusionGraph:
    """Capture ``fn_or_module(*example_inputs, **example_kwargs)`` as a FusionGraph.

    Tensor arguments become graph inputs (then parameters, buffers and lifted constants, in
    torch.export's order, with their names as ``target``); non-tensor arguments are bound as
    constants. Inputs may be real, meta or FakeTensors (with meta or fake parameters), so full
    size configs can be captured without their memory.
    """
    kwargs = dict(example_kwargs or {})
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            raise CaptureError(f"example_kwargs[{k!r}]: pass tensor arguments positionally")
    if isinstance(fn_or_module, torch.nn.Module) and all(isinstance(a, torch.Tensor) for a in example_inputs):
        program: torch.nn.Module = fn_or_module
        call_kwargs = kwargs
    else:
        program = _Program(fn_or_module, example_inputs, kwargs)
        call_kwargs = {}
    user = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    graph_name = name or getattr(fn_or_module, "__name__", type(fn_or_module).__name__)
    for where, t in [*((f"argument {i}", t) for i, t in enumerate(user)), *module_state(program).items()]:
        if t.layout != torch.strided:
            raise CaptureError(f"{graph_name}: {where} is a {t.layout} tensor: only strided tensors are supported")
    names = _param_names(fn_or_module, example_inputs)
    # Capture draws no random numbers of the caller's (the run on real copies in segmenter/capturing/observe.py
    # would: dropout before an .item()).
    devices = sorted({t.device.index or 0 for t in (*user, *module_state(program).values()) if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            return _capture(program, user, [("user", None)] * len(user), names, call_kwargs, graph_name,
                            decompositions)
        except _SharedMutation:
            # See Note [inputs that share a storage]: one input per shared storage, the arguments views of it.
            bases, roles, wrapped = _storage_bases(program, user)
            return _strip_prefix(_capture(wrapped, bases, roles, [None] * len(bases), {}, graph_name, decompositions))


class _SharedMutation(CaptureError):
    pass


class _Bases(torch.nn.Module):
    """Takes one tensor per shared storage and hands the program its arguments as views of it."""

    def __init__(self, program: torch.nn.Module, plan: list[tuple[int, tuple, tuple, int]]) -> None:
        super().__init__()
        self.program = program
        self.plan = plan  # per argument: (base index, sizes, strides, offset relative to the base)

    def forward(self, *bases: torch.Tensor) -> Any:
        args = [bases[b].as_strided(size, stride, bases[b].storage_offset() + rel) for b, size, stride, rel in self.plan]
        return self.program(*args)


def _storage_bases(program: torch.nn.Module, user: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list, _Bases]:
    sids = storage_ids(user)
    groups: dict[int, list[int]] = {}
    for i, sid in enumerate(sids):
        groups.setdefault(sid, []).append(i)
    bases, roles, index = [], [], {}
    for sid, members in groups.items():
        metas = [TensorMeta.from_tensor(user[i]) for i in members]
        # from element 0 of the storage: the program's as_strided offsets are then the real ones
        lo = 0
        hi = max(m.storage_extent for m in metas)
        index[sid] = (len(bases), lo)
        bases.append(user[members[0]].as_strided((hi,), (1,), 0))
        roles.append(("storage", "args:" + ",".join(map(str, members))))
    plan = []
    for i, t in enumerate(user):
        b, lo = index[sids[i]]
        plan.append((b, tuple(t.shape), tuple(t.stride()), t.storage_offset() - lo))
    return bases, roles, _Bases(program, plan)


def _capture(
    program: torch.nn.Module, user: list[torch.Tensor], user_roles: list[tuple[str, str | None]],
    names: list[str | None], call_kwargs: dict[str, Any], graph_name: str,
    decompositions: Mapping[Any, Callable[..., Any]] | None,
) -> FusionGraph:
    shared = len(set(storage_ids(user))) != len(user)
    seen = observe(program, user, call_kwargs, names, graph_name, shared)
    export_args = tuple(_fresh_copy(t) for t in user) if shared else tuple(user)
    export_program = program
    if seen.changes or seen.flat.needs_flattening:
        # See Note [metadata mutation]: trace the program on aliases of those arguments;
        # See Note [model outputs]: and with its outputs flattened to tensors (a cache object)
        export_program = _Prepared(program, {c.index for c in seen.changes}, seen.flat.needs_flattening)
        export_args = tuple(_unbased(t) for t in export_args) if seen.changes else export_args
    try:
        ep = torch.export.export(export_program, export_args, kwargs=call_kwargs, strict=False)
        ep = ep.run_decompositions(decompositions if decompositions is not None else _default_decompositions())
        ep = _without_effect_tokens(ep)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - export's errors are long; keep the first line, chain it
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, DataDependentOutputException):
            first += (" computes a value from the data of its inputs (not their shapes), which the program "
                      "then uses as a Python value: torch.export cannot trace that")
        elif isinstance(e, DynamicOutputShapeException):
            first += " has an output shape that depends on the values of its inputs: torch.export cannot trace it"
        elif "data-dependent" in first:
            first += " (the program branches on a value computed from tensor data)"
        raise CaptureError(f"torch.export failed on {graph_name}: {first}") from e

    state = module_state(export_program)
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    graph_tensors: list[torch.Tensor] = []
    inputs_spec: list[tuple[str, str, str | None]] = []  # (value name, role, target)
    bound: dict[Any, Any] = {}
    constants: list[GraphConstant] = []
    user_iter = iter(zip(user, user_roles))
    for spec, ph in zip(sig.input_specs, placeholders):
        if spec.kind == InputKind.CONSTANT_TENSOR:  # a tensor the program builds or holds: the graph's own
            value = ep.constants.get(spec.target)
            if value is None:
                value = _attr(export_program, spec.target)
            if not isinstance(value, torch.Tensor):
                raise CaptureError(f"input {ph.name!r}: constant {spec.target!r} is not a tensor")
            try:
                constants.append(GraphConstant.from_tensor(ph.name, value))
            except GraphError as e:
                raise CaptureError(f"input {ph.name!r}: {e}") from None
            bound[ph] = ValueRef(ph.name)
        elif spec.kind == InputKind.USER_INPUT:
            if not isinstance(spec.arg, TensorArgument):
                bound[ph] = getattr(spec.arg, "value", None)
                continue
            t, (role, target) = next(user_iter)
            graph_tensors.append(t)
            inputs_spec.append((ph.name, role, target))
        elif spec.kind in _ROLE:
            t = state.get(spec.target)
            if t is None:
                t = ep.constants.get(spec.target) if spec.kind != InputKind.PARAMETER else None
            if t is None:
                t = ep.state_dict[spec.target]
            graph_tensors.append(t)
            inputs_spec.append((ph.name, _ROLE[spec.kind], spec.target))
        else:
            raise CaptureError(f"input {ph.name!r}: unsupported export input kind {spec.kind.name}")
    storage = storage_ids(graph_tensors)
    finals = {c.index: c.after for c in seen.changes}
    user_positions = [i for i, (_, role, _) in enumerate(inputs_spec) if role in ("user", "storage")]
    final_of = {user_positions[k]: m for k, m in finals.items()}
    inputs = tuple(
        GraphInput(vname, TensorMeta.from_tensor(t), role, target, storage[i], final_of.get(i))  # type: ignore[arg-type]
        for i, ((vname, role, target), t) in enumerate(zip(inputs_spec, graph_tensors))
    )
    target_index = {inp.target: i for i, inp in enumerate(inputs) if inp.target is not None}

    # User inputs are named after the function's parameters where that clashes with nothing.
    taken = {n.name for n in ep.graph.nodes}
    renamed: dict[str, str] = {}
    for (vname, _role, _), pname in zip((s for s in inputs_spec if s[1] in ("user", "storage")), names):
        if pname and pname not in taken:
            renamed[vname] = pname
            taken.add(pname)
    inputs = tuple(dataclasses.replace(inp, name=renamed.get(inp.name, inp.name)) for inp in inputs)
    index_of = {inp.name: i for i, inp in enumerate(inputs)}
    index_of.update({old: index_of[new] for old, new in renamed.items()})
    placeholder_args = {ph: ValueRef(renamed.get(ph.name, ph.name)) for ph in placeholders if ph not in bound}
    placeholder_args.update(bound)
    conv = convert_graph(ep.graph_module, placeholder_args)
    mutations: list[Mutation] = []
    returned: list[Any] = []
    for i, (spec, out) in enumerate(zip(sig.output_specs, conv.outputs)):
        if spec.kind in _MUTATION:
            idx = target_index.get(spec.target, index_of.get(spec.target))
            if idx is None or not isinstance(out, ValueRef):
                raise CaptureError(f"output {i}: mutation of {spec.target!r}, which is not an input")
            if shared and any(inputs[j].storage == inputs[idx].storage for j in range(len(inputs)) if j != idx):
                raise _SharedMutation(f"input {inputs[idx].name!r} shares a storage with another input and is mutated")
            check_write_back(inputs[idx], out.name, conv, seen,
                              user_positions.index(idx) if idx in user_positions else None, graph_name)
            mutations.append(Mutation(idx, out.name))
        elif spec.kind == OutputKind.USER_OUTPUT:
            if out is not None:  # a program returning None: export lists it, eager returned nothing
                returned.append(out)
        else:
            raise CaptureError(f"output {i}: unsupported export output kind {spec.kind.name}")
    outputs, scalar_outputs, eager_outputs = user_outputs(returned, seen.flat, graph_name)
    user_fakes = iter(seen.user)
    eager_inputs = [next(user_fakes) if role in ("user", "storage") else seen.fake(t)
                    for (_, role, _), t in zip(inputs_spec, graph_tensors)]
    graph = FusionGraph(
        inputs=inputs,
        nodes=tuple(conv.nodes),
        outputs=tuple(outputs),
        output_aliases=tuple(observed_aliases(eager_inputs, eager_outputs)),
        mutations=tuple(sorted(mutations, key=lambda m: m.input)),
        name=graph_name,
        constants=tuple(constants),
        scalar_outputs=tuple(scalar_outputs),
    )
    graph = propagate_metas(graph)
    return _strip_prefix(graph) if export_program is not program else graph


def _without_effect_tokens(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Note [effect tokens]: export orders ops with side effects (``_linalg_check_errors``, which
    raises for a singular matrix in ``linalg.inv``) by threading a token input through
    ``with_effects`` calls. The graph keeps such an op as a node whose result nothing uses, in
    program order (it runs on torch, and raises as eager does); the token goes."""
    if not any(s.kind == InputKind.TOKEN for s in ep.graph_signature.input_specs):
        return ep
    try:
        from torch.export._remove_effect_tokens_pass import _remove_effect_tokens
    except ImportError:  # a private pass of torch.export: name what is missing rather than misread
        raise CaptureError("the program has ops with side effects (effect tokens), and this torch has no pass "
                           "to remove them") from None
    return _remove_effect_tokens(ep)


class _Prepared(torch.nn.Module):
    """Hands the program ``aten.alias`` of the arguments whose metadata it changes (Note
    [metadata mutation]: the change stays on the alias, the data writes reach the input), and
    returns its outputs as a flat tuple of tensors where export could not flatten them (Note
    [model outputs])."""

    def __init__(self, program: torch.nn.Module, aliased: set[int], flatten: bool) -> None:
        super().__init__()
        self.program = program
        self.aliased = aliased
        self.flatten = flatten

    def forward(self, *tensors: torch.Tensor, **kwargs: Any) -> Any:
        args = [torch.ops.aten.alias.default(t) if i in self.aliased else t for i, t in enumerate(tensors)]
        out = self.program(*args, **kwargs)
        return tuple(v for _, v in output_tensors(out).leaves) if self.flatten else out


def _attr(module: torch.nn.Module, target: str) -> object:
    value: object = module
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _strip_prefix(graph: FusionGraph) -> FusionGraph:
    """A wrapper holds the module as "program": its weights keep their own names."""
    return dataclasses.replace(graph, inputs=tuple(
        dataclasses.replace(i, target=i.target.removeprefix("program.")) if i.role not in ("user", "storage")
        and i.target else i for i in graph.inputs))


def _unbased(t: torch.Tensor) -> torch.Tensor:
    """``t`` (same storage and layout) without a ``_base``: export guards on a view input's base
    when the program changes the input's metadata, and then fails retracing without one."""
    if t._base is None or isinstance(t, FakeTensor) or t.device.type == "meta":
        return t
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    with torch.no_grad():
        return out.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def bind_inputs(graph: FusionGraph, module: torch.nn.Module | None, user_inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The full input list of a captured graph: the user's tensors (or, for arguments that share
    a storage and are mutated, one flat view of that storage), then the module's parameters and
    buffers looked up by ``target``."""
    user_iter = iter(user_inputs)
    state = module_state(module) if module is not None else {}
    out = []
    for inp in graph.inputs:
        if inp.role == "storage":  # the storage that arguments i, j, ... share ("args:i,j")
            first = int((inp.target or "args:0").removeprefix("args:").split(",")[0])
            m = inp.meta
            t = user_inputs[first].as_strided(m.shape, m.stride, m.storage_offset)
        elif inp.role == "user":
            t = next(user_iter, None)
            if t is None:
                raise CaptureError(f"graph {graph.name!r} needs more user inputs than the {len(user_inputs)} given")
        else:
            t = state.get(inp.target or "")
            if t is None:
                raise CaptureError(f"input {inp.name!r}: no {inp.role} {inp.target!r} in the module")
        out.append(t)
    return out
