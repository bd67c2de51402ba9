"""fx GraphModule -> FusionGraph.

Two callers: ``capture`` (a torch.export program, whose signature names parameters, buffers and
input mutations) and ``from_fx`` (a GraphModule whose nodes carry FakeTensor ``meta['val']``, as
AOTAutograd hands one to a torch.compile backend).

Note [input mutation from fx]: AOTAutograd reports input mutation in one of two forms:
  1. a ``copy_(placeholder, new_value)`` epilogue inside the graph (keep_input_mutations=True);
  2. the new value as an extra graph output (the caller says which: ``input_updates``).
Both become ``Mutation(input, value)``. A graph that mutates anything else (an intermediate, or
an input before later reads of it) is first functionalized by retracing it with
``make_fx(functionalize(gm))``, which leaves only form 1.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from ..ir.graph import (
    Alias,
    Arg,
    FusionGraph,
    GraphConstant,
    GraphError,
    GraphInput,
    Mutation,
    Node,
    OpRef,
    TensorMeta,
    ValueRef,
    view_roots,
)
from ..ir.ops import NOT_COMPUTE, op_info, op_name, resolve_op
from .dynamo_values import symbolic_inputs, translated
from .meta import fake_mode, quiet_fake_errors, uncached
from .metadata_mutation import LayoutChange, refusal, watch_layouts
from .storages import storage_ids

__all__ = ["CaptureError", "ScalarRead", "eliminate_dead_nodes", "from_fx", "storage_ids"]


class CaptureError(GraphError):
    """A program that cannot be turned into a FusionGraph; the message says which node and why."""


_LITERALS = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


@dataclass
class _Converted:
    nodes: list[Node]
    env: dict[fx.Node, Arg]
    outputs: list[Arg]
    constants: list[GraphConstant]  # tensors read with get_attr, held by value


@dataclass(frozen=True)
class ScalarRead:
    """``t.item()`` in the program: the Python number read from the one-element tensor ``tensor``.
    Only a returned value may be one (the graph returns ``tensor`` and the run reads the number)."""

    tensor: ValueRef
    node: str


def _data_dependent(values: Sequence[object]) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and free_unbacked_symbols(v)
               for v in values)


def _symbolic(what: str, values: Sequence[object]) -> str:
    """Why a symbolic size is refused: a data-dependent one cannot be made concrete by the caller."""
    if _data_dependent(values):
        return (f"{what} depends on the values of the inputs, not only on their shapes (as the output of "
                "nonzero / masked_select / unique does): a FusionGraph holds static shapes, so this op is not "
                "supported")
    return f"{what} is symbolic; pass concrete example inputs (the graph is specialized to their shapes)"


def _meta_of(val: object, where: str, symbolic: bool = False) -> TensorMeta:
    if isinstance(val, TensorMeta):  # a value of dynamo's, translated: Note [dynamo's values, translated]
        return val
    if not isinstance(val, torch.Tensor):
        raise CaptureError(f"{where}: expected a tensor value, got {type(val).__name__}")
    sizes = (*val.shape, *val.stride(), val.storage_offset())
    if symbolic and not _data_dependent(sizes):
        return TensorMeta.from_tensor(val)  # Note [symbolic plans] in segmenter/ir/symbolic.py
    if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
        raise CaptureError(f"{where}: " + _symbolic(f"the shape {tuple(val.shape)}", (*val.shape, *val.stride())))
    return TensorMeta.from_tensor(val)


#: ops on sizes, not tensors: under symbolic sizes (Note [symbolic plans]) their SymInt values
#: are literals of the graph, read from the node's value
_SIZE_OPS = frozenset({"aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default",
                       "aten.sym_storage_offset.default"})
#: checks on sizes that a graph makes (a runtime assert): under symbolic sizes each is decided
#: once, as a condition of the plan
_SIZE_ASSERTS = frozenset({"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
                           "aten.sym_constrain_range.default"})


def _size_value(n: fx.Node) -> object | None:
    """Under symbolic sizes, the SymInt (or SymBool, number) an op on sizes computes; else None."""
    val = n.meta.get("val")
    if not isinstance(val, (torch.SymInt, torch.SymBool, int, bool)) or _data_dependent((val,)):
        return None
    if n.target in (operator.getitem,):
        return None
    if isinstance(n.target, torch._ops.OpOverload):
        return val if op_name(n.target) in _SIZE_OPS else None
    return val  # a Python operator or torch.sym_* on sizes (operator.mul, torch.sym_max, ...)


def convert_graph(gm: fx.GraphModule, placeholders: Mapping[fx.Node, Arg], symbolic: bool = False) -> _Converted:
    """Turn the call_function nodes of ``gm`` into IR nodes.

    ``placeholders`` maps each placeholder to what it stands for: a ValueRef to a graph input,
    or a literal (a specialized int argument, or a SymInt under ``symbolic``). ``copy_`` onto a
    placeholder is left in the node list as ``aten.copy_.default`` for the caller to turn into a
    Mutation. Under ``symbolic`` (Note [symbolic plans] in segmenter/ir/symbolic.py) sizes may be
    SymInts of our ShapeEnv: in metas, and as literal arguments where the graph computes them.
    """
    env: dict[fx.Node, Arg] = dict(placeholders)
    nodes: list[Node] = []
    outputs: list[Arg] = []
    constants: list[GraphConstant] = []

    def arg(a: object, where: str, scalars: bool = False) -> Arg:
        if isinstance(a, fx.Node):
            if a not in env:
                raise CaptureError(f"{where}: uses {a.name!r}, which is not a value of the graph")
            value = env[a]
            if isinstance(value, ScalarRead) and not scalars:
                raise CaptureError(f"{where}: uses the number that {value.node!r} reads back from a tensor (.item()); "
                                   "a number read back to Python is supported only as a returned value")
            return value  # type: ignore[return-value]
        if isinstance(a, (list, tuple)):
            return tuple(arg(x, f"{where}[{i}]", scalars) for i, x in enumerate(a))
        if isinstance(a, _LITERALS):
            return a
        if isinstance(a, torch._ops.OpOverload):
            return OpRef(op_name(a))
        if isinstance(a, (torch.SymInt, torch.SymBool)) and symbolic and not _data_dependent((a,)):
            return a  # type: ignore[return-value]
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise CaptureError(f"{where}: " + _symbolic(f"the value {a}", (a,)))
        raise CaptureError(f"{where}: unsupported argument of type {type(a).__name__}")

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            outputs = list(pytree.tree_leaves(arg(n.args[0], "output", scalars=True)))
            continue
        if n.op == "get_attr":
            value = fetch_attr(gm, n.target)
            if not isinstance(value, torch.Tensor):
                raise CaptureError(f"node {n.name!r}: get_attr {n.target!r} is a {type(value).__name__}, not a tensor")
            try:
                constants.append(GraphConstant.from_tensor(n.name, value))
            except GraphError as e:
                raise CaptureError(f"node {n.name!r}: get_attr {n.target!r}: {e}") from None
            env[n] = ValueRef(n.name)
            continue
        if n.op == "call_function" and n.target is torch.ops.higher_order.with_effects:
            raise CaptureError(f"node {n.name!r}: with_effects (an effect token) in the graph; "
                               "runtime.dynamo.strip_effect_tokens removes them from AOTAutograd graphs")
        if n.op != "call_function":
            raise CaptureError(
                f"node {n.name!r}: {n.op} {n.target!r} is not ATen-level; capture with "
                "segmenter.capture or hand over an AOTAutograd graph"
            )
        if symbolic and (size := _size_value(n)) is not None:
            env[n] = size  # type: ignore[assignment]
            continue
        name = op_name(n.target)
        if symbolic and name in _SIZE_ASSERTS:
            if not bool(arg(n.args[0], f"node {n.name!r} args[0]")):  # a condition of the plan
                raise CaptureError(f"node {n.name!r}: the graph's assertion {n.args[1:]!r} fails for these sizes")
            continue
        if n.target is operator.getitem:
            parent, index = n.args
            produced = env.get(parent)
            if not isinstance(produced, tuple):
                raise CaptureError(f"node {n.name!r}: getitem of {parent.name!r}, which is not a tuple")
            env[n] = produced[index]
            continue
        if name in NOT_COMPUTE:
            continue
        if name == "aten._local_scalar_dense.default":  # t.item(): see ScalarRead
            src = arg(n.args[0], f"node {n.name!r} args[0]")
            if not isinstance(src, ValueRef):
                raise CaptureError(f"node {n.name!r}: .item() of {src!r}, which is not a tensor value")
            env[n] = ScalarRead(src, n.name)  # type: ignore[assignment]
            continue
        info = op_info(name)
        if not info.known:
            warnings.warn(f"op {name} (node {n.name!r}) is not in the op table: it will run as OPAQUE", stacklevel=2)
        val = n.meta.get("val")
        args = tuple(arg(a, f"node {n.name!r} args[{i}]") for i, a in enumerate(n.args))
        kwargs = tuple((k, arg(v, f"node {n.name!r} kwargs[{k!r}]")) for k, v in n.kwargs.items())
        if isinstance(val, (list, tuple)):
            outs = _tuple_outputs(n, val)
            metas = tuple(None if o is None else _meta_of(v, f"node {n.name!r}[{i}] ({name})", symbolic)
                          for i, (o, v) in enumerate(zip(outs, val)))
            env[n] = tuple(None if o is None else ValueRef(o) for o in outs)
        elif val is None and (info.mutates or _returns_nothing(n.target)):
            # an in-place op whose result is not used, or an op run for its effect (Note [effect tokens])
            outs, metas = (None,), (None,)
        else:
            outs, metas = (n.name,), (_meta_of(val, f"node {n.name!r} ({name})", symbolic),)
            env[n] = ValueRef(n.name)
        nodes.append(Node(n.name, name, args, kwargs, outs, metas))
    return _Converted(nodes, env, outputs, constants)


def fetch_attr(gm: fx.GraphModule, target: str) -> object:
    """The attribute a get_attr node reads (``a.b.c``)."""
    value: object = gm
    for part in target.split("."):
        if not hasattr(value, part):
            raise CaptureError(f"get_attr {target!r}: the module has no attribute {part!r}")
        value = getattr(value, part)
    return value


class _FakeConstants(fx.Interpreter):
    """Runs a graph on FakeTensors, its get_attr tensors made fake in the same mode."""

    def __init__(self, gm: fx.GraphModule, mode: object) -> None:
        super().__init__(gm)
        self.mode = mode

    def get_attr(self, target, args, kwargs):  # noqa: ANN001, ANN201 - fx's signature
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            return self.mode.from_tensor(value)
        return value


def _returns_nothing(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload) and not target._schema.returns


def runs_for_effect(op: str) -> bool:
    """An op that returns nothing and writes nothing: run only for its effect (a check that raises)."""
    target = resolve_op(op)
    return _returns_nothing(target) and not op_info(op).mutates


def _tuple_outputs(n: fx.Node, val: Sequence[object]) -> tuple[str | None, ...]:
    """Names for a multi-output node: each used element is named after its getitem user."""
    names: list[str | None] = [None] * len(val)
    for user in n.users:
        if user.target is operator.getitem and names[user.args[1]] is None:
            names[user.args[1]] = user.name
    return tuple(
        None if name is None or not isinstance(v, (torch.Tensor, TensorMeta)) else name for name, v in zip(names, val)
    )


def split_epilogue(conv: _Converted, input_index: Mapping[str, int]) -> tuple[list[Node], list[Mutation], dict[str, str]]:
    """Turn ``copy_(input, value)`` nodes into Mutations.

    Returns the remaining nodes, the mutations, and a renaming of copy_ results to the value
    written (the result of ``copy_`` is the input itself, holding the new value).
    """
    kept: list[Node] = []
    mutations: dict[int, Mutation] = {}
    renamed: dict[str, str] = {}
    for node in conv.nodes:
        if node.op != "aten.copy_.default":
            if op_info(node.op).mutates:
                raise CaptureError(f"node {node.name!r}: in-place {node.op} left after functionalization")
            kept.append(node)
            continue
        dst, src = node.args[0], node.args[1]
        if not (isinstance(dst, ValueRef) and dst.name in input_index and isinstance(src, ValueRef)):
            raise CaptureError(f"node {node.name!r}: copy_ into {dst} is not an input write-back")
        mutations[input_index[dst.name]] = Mutation(input_index[dst.name], src.name)
        renamed[node.name] = src.name
    return kept, sorted(mutations.values(), key=lambda m: m.input), renamed


def needs_functionalization(gm: fx.GraphModule) -> bool:
    """True unless the only mutation is a copy_ epilogue onto placeholders after their last read,
    and no size is symbolic (a retrace specializes the sizes)."""
    return mutates_beyond_epilogue(gm) or has_symbolic_sizes(gm)


def has_symbolic_sizes(gm: fx.GraphModule) -> bool:
    for n in gm.graph.nodes:
        for v in pytree.tree_leaves(n.meta.get("val")):
            if isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape):
                return True
    return False


def mutates_beyond_epilogue(gm: fx.GraphModule) -> bool:
    """True unless the only mutation is a copy_ epilogue onto placeholders after their last read."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    written: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        name = op_name(n.target)
        if name == "aten.copy_.default":
            dst = n.args[0]
            if dst.op != "placeholder" or dst in written:
                return True
            if any(order[u] > order[n] and u.op != "output" for u in dst.users):
                return True
            written.add(dst)
        elif op_info(name).mutates:
            return True
    return False


def _symbolic_dispatch(mode: object) -> Any:
    """Under our symbolic sizes (Note [symbolic plans]), ops run through the Python dispatcher, as
    AOTAutograd traces them: a C++ composite (``constant_pad_nd``) reading ``sizes()`` would
    otherwise make every size a number (a guard pinning the symbol to the first call's value)."""
    import contextlib

    from torch._dispatch.python import enable_python_dispatcher

    env = getattr(mode, "shape_env", None)
    return enable_python_dispatcher() if getattr(env, "fuseg_sizes", None) is not None else contextlib.nullcontext()


def _retrace(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    fn = functionalize(gm, remove="mutations")
    fakes = [t for t in example_inputs if isinstance(t, FakeTensor)]
    if fakes:
        with uncached(fakes[0].fake_mode), _symbolic_dispatch(fakes[0].fake_mode):  # Note [fake tensor cache] in meta.py
            return make_fx(fn, tracing_mode="real")(*example_inputs)
    mode = fake_mode()  # Note [fake tensor cache] in segmenter/capturing/meta.py
    fake_args = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    with mode:
        return make_fx(fn, tracing_mode="real")(*fake_args)


# Note [symbolic graphs propagated, not retraced]: a graph with symbolic sizes gets its values
# again on FakeTensors of our own ShapeEnv (Note [symbolic plans] in segmenter/ir/symbolic.py), so that
# every size question torch's meta functions ask becomes a condition of our plan. Where the graph
# writes nothing (AOTAutograd's inference and forward graphs, which are functional already),
# there is nothing for ``functionalize`` to do, and re-tracing it with ``make_fx`` (a proxy per
# value, a new graph) reproduced the same ops (plus ``detach`` nodes) at 1.6-1.7x the cost of
# running the graph node by node on the same FakeTensors (qwen2's two graphs at a second prompt
# length, captured from perf.dynamic_shapes' protocol and timed both ways in one process, twice:
# 0.24 + 0.45 s against 0.14 + 0.28 s on this machine kind; the committed before/after of the
# change is perf/results/amd-epyc-zen3/second_length_parts_cpu.json, ``from_fx``). So such a graph is run by an
# fx Interpreter on a copy of itself and each node keeps the value it computed in ``meta['val']``:
# the same dispatch, under the same modes, so the same questions and conditions. A graph that
# writes is retraced (functionalized) as before. Since 2026-11-27 the propagation is the fallback:
# a graph whose values dynamo computed takes them translated (Note [dynamo's values, translated]).
def _propagated(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """A copy of ``gm`` (its graph; modules and attributes shared) whose nodes carry, in
    ``meta['val']``, the values they compute on ``example_inputs`` (FakeTensors of one mode)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = fx.GraphModule(gm, graph)
    fakes = [t for t in example_inputs if isinstance(t, FakeTensor)]
    mode = fakes[0].fake_mode if fakes else fake_mode()
    with uncached(mode), _symbolic_dispatch(mode):  # Note [fake tensor cache] in meta.py
        _Recording(copy, mode).run(*example_inputs)
    return copy


class _Recording(_FakeConstants):
    """Runs a graph on FakeTensors and keeps each node's value in its ``meta['val']``."""

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op != "output":
            n.meta["val"] = value
        return value


def from_fx(
    gm: fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    *,
    input_updates: Mapping[int, int] | None = None,
    name: str = "graph",
    number_outputs: dict[int, int] | None = None,
    symbolic: bool = False,
    translate: bool = True,
) -> FusionGraph:
    """A FusionGraph from an ATen-level GraphModule (e.g. what AOTAutograd gives a backend).

    ``example_inputs`` are the placeholders' tensors (real or fake) in order; their layouts and
    which of them share a storage are recorded. ``input_updates`` maps graph-output positions to
    the input each one is the new value of (AOTAutograd's "mutated inputs as extra outputs").
    Outputs that are views of inputs or of earlier outputs are read from the FakeTensors'
    storages. A graph may return sizes (Note [size outputs]) where the caller passes a dict as
    ``number_outputs``: each is left out of the graph's outputs and put there, by its position.

    ``symbolic``: where the placeholders' values have symbolic sizes (dynamo's), the graph keeps
    them symbolic, as SymInts of a ShapeEnv of our own hinted by ``example_inputs`` (real
    arguments); Note [symbolic plans] in segmenter/ir/symbolic.py. Raises NotSymbolic where that
    cannot be done (the caller specializes instead). ``translate``: a graph that writes nothing
    takes its values from dynamo's, translated to our symbols (Note [dynamo's values, translated]
    in segmenter/capturing/dynamo_values.py); False runs it on FakeTensors of ours instead.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise CaptureError(f"graph has {len(placeholders)} placeholders but {len(example_inputs)} example inputs")
    sizes = None
    if symbolic:
        dynamo_values = [ph.meta.get("val") for ph in placeholders]
        sizes, example_inputs = symbolic_inputs(dynamo_values, example_inputs)
    for i, t in enumerate(example_inputs):
        if not isinstance(t, (torch.Tensor, int, float, bool, torch.SymInt)):
            raise CaptureError(f"example_inputs[{i}]: expected a tensor or a number, got {type(t).__name__}")
        if isinstance(t, torch.Tensor) and t.layout != torch.strided:
            raise CaptureError(f"example_inputs[{i}]: a {t.layout} tensor: only strided tensors are supported")
    # Numbers (the sizes dynamo passes for symbolic shapes) are bound: the graph is specialized.
    tensor_pos = [i for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor)]
    tensors = [example_inputs[i] for i in tensor_pos]
    shared = len(set(storage_ids(tensors))) != len(tensors)
    # aliasing and layout changes are observed on the program as given, before functionalization;
    # a symbolic graph that writes nothing is run once only: its retrace shows the aliasing too
    writes = any(n.op == "call_function" and op_info(op_name(n.target)).mutates for n in gm.graph.nodes)
    once = symbolic and not writes
    done, meta_of = None, TensorMeta.from_tensor
    try:
        with quiet_fake_errors():
            fake_in, fake_out, changes = (list(example_inputs), [], []) if once else _run_on_fakes(gm, example_inputs)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - torch's error from running the graph on FakeTensors, as ours
        raise CaptureError(f"running the graph on FakeTensors failed: {type(e).__name__}: {_first_line(e)}") from e
    given_names = [ph.name for ph in placeholders]  # retracing renames the placeholders
    for c in changes:
        why = refusal(c, placeholders[c.index].name)
        if why is None and shared:
            why = f"{c.op} on input {placeholders[c.index].name!r}, which shares a storage with another input: not supported"
        if why is not None:
            raise CaptureError(f"{name}: {why}")
    if symbolic or needs_functionalization(gm) or len(tensors) != len(example_inputs) or changes:
        # (as before symbolic sizes: an epilogue alone on shared inputs is retraced; with symbolic
        # sizes too it is not, while a graph that only has symbolic sizes is: the training graphs)
        if shared and (mutates_beyond_epilogue(gm) or (writes and has_symbolic_sizes(gm))):
            raise CaptureError("inputs share a storage and the graph mutates: not supported yet")
        try:
            if once:  # nothing to functionalize: Note [dynamo's values, translated] where they
                # all translate, else Note [symbolic graphs propagated, not retraced]
                done = (translated(gm, sizes, dynamo_values, storage_ids(tensors))
                        if sizes is not None and translate else None)
                gm = done.gm if done is not None else _propagated(gm, example_inputs)
            else:
                gm = _retrace(_aliased(gm, {c.index for c in changes}) if changes else gm, example_inputs)
        except Exception as e:  # noqa: BLE001 - torch's error from make_fx/functionalize, as ours
            raise CaptureError(f"functionalizing the graph failed: {type(e).__name__}: {_first_line(e)}") from e
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if once and done is not None:  # dynamo's own FakeTensors: their storages are the graph's
            fake_in, fake_out, meta_of = done.inputs, done.outputs, done.meta
        elif once:  # the values computed on the inputs' FakeTensors (views share their storages)
            out_node = next(n for n in gm.graph.nodes if n.op == "output")
            fake_out = [x.meta.get("val") if isinstance(x, fx.Node) else x for x in pytree.tree_leaves(out_node.args)]
    storage = storage_ids(tensors)
    finals = {c.index: c.after for c in changes}
    tensor_phs = [placeholders[i] for i in tensor_pos]
    inputs = tuple(
        GraphInput(ph.name, _meta_of(t, f"input {ph.name!r}", symbolic), storage=storage[k],
                   final_layout=finals.get(tensor_pos[k]))
        for k, (ph, t) in enumerate(zip(tensor_phs, tensors))
    )
    bound: dict[fx.Node, Arg] = {ph: ValueRef(ph.name) for ph in tensor_phs}
    bound.update({placeholders[i]: example_inputs[i] for i in range(len(placeholders)) if i not in tensor_pos})
    conv = convert_graph(gm, bound, symbolic)
    try:
        nodes, mutations, renamed = split_epilogue(conv, {ph.name: k for k, ph in enumerate(tensor_phs)})
    except CaptureError as e:
        if not changes:
            raise
        c = changes[0]  # torch's functionalization could not express the layout change as a write
        raise CaptureError(f"{name}: {c.op} on input {given_names[c.index]!r} changes its layout in a way "
                           f"functionalization cannot express ({e}): not supported") from None
    numbers = {i: a for i, a in enumerate(conv.outputs) if _is_size(a)} if number_outputs is not None else {}
    if numbers:  # Note [size outputs]
        number_outputs.update(numbers)
        if any(pos in numbers for pos in (input_updates or {})):
            raise CaptureError("input_updates: an output that is a number is no input's new value")
        fake_out = [t for i, t in enumerate(fake_out) if i not in numbers]
        position = [i for i in range(len(conv.outputs)) if i not in numbers]
        input_updates = {position.index(pos): idx for pos, idx in (input_updates or {}).items()}
    outputs = [_value_name(a, renamed, f"output {i}") for i, a in enumerate(conv.outputs) if i not in numbers]
    updates = dict(input_updates or {})
    for pos, idx in updates.items():
        if not 0 <= pos < len(outputs) or not 0 <= idx < len(inputs):
            raise CaptureError(f"input_updates: output {pos} -> input {idx} is out of range")
        mutations.append(Mutation(idx, outputs[pos]))
    keep = [i for i in range(len(outputs)) if i not in updates]
    aliases = observed_aliases([fake_in[i] for i in tensor_pos], [fake_out[i] for i in keep], meta_of)
    live = set(outputs) | {m.value for m in mutations}
    kept = eliminate_dead_nodes(nodes, live)
    used = {v for n in kept for v in n.inputs} | live
    graph = FusionGraph(
        inputs=inputs,
        nodes=tuple(kept),
        outputs=tuple(outputs[i] for i in keep),
        output_aliases=tuple(aliases),
        mutations=tuple(sorted(mutations, key=lambda m: m.input)),
        name=name,
        constants=tuple(c for c in conv.constants if c.name in used),
    )
    return _output_views_in_graph_layout(graph)


def _output_views_in_graph_layout(graph: FusionGraph) -> FusionGraph:
    """An output that is a view of an earlier output is handed out in the layout the graph gives
    it (its meta), not the one seen on the observation run: the two runs can place the base
    differently (a ``select_scatter`` of a strided input keeps its offset on FakeTensors and not
    in the functional graph), and the view is made in the base the program computed."""
    roots = view_roots(graph)
    aliases = list(graph.output_aliases)
    for j, a in enumerate(aliases):
        if a is None or a.source != "output":
            continue
        mine, base = graph.outputs[j], graph.outputs[a.index]
        if roots.get(mine, mine) == roots.get(base, base) and a.layout != graph.metas[mine]:
            aliases[j] = dataclasses.replace(a, layout=graph.metas[mine])
    return graph if aliases == list(graph.output_aliases) else dataclasses.replace(graph, output_aliases=tuple(aliases))


def _aliased(gm: fx.GraphModule, which: set[int]) -> Callable[..., Any]:
    """``gm`` called on ``aten.alias`` of the arguments whose metadata it changes (Note [metadata
    mutation] in segmenter/capturing/metadata_mutation.py)."""

    def run(*args: Any) -> Any:
        return gm(*[torch.ops.aten.alias.default(a) if i in which else a for i, a in enumerate(args)])

    return run


def eliminate_dead_nodes(nodes: Sequence[Node], live: set[str]) -> list[Node]:
    """Drop nodes none of whose outputs is used (a functional graph has no other effects, but
    for ops that return nothing, run for their effect: Note [effect tokens])."""
    needed = set(live)
    kept: list[Node] = []
    for node in reversed(nodes):
        if any(o is not None and o in needed for o in node.outputs) or runs_for_effect(node.op):
            kept.append(node)
            needed.update(node.inputs)
    return kept[::-1]


def _run_on_fakes(
    gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor],
) -> tuple[list[object], list[object], list[LayoutChange]]:
    """Run the fx program itself on FakeTensor copies of the inputs (storages shared as in the
    caller's), so output aliasing is read from what the program does, not from ``meta['val']``
    snapshots (which need not share storages); and which inputs it leaves with another layout."""

    mode = next((t.fake_mode for t in example_inputs if isinstance(t, FakeTensor)), None) or fake_mode()
    fakes = [t if isinstance(t, FakeTensor) or not isinstance(t, torch.Tensor) else mode.from_tensor(t)
             for t in example_inputs]
    with uncached(mode, enter=False), _symbolic_dispatch(mode), watch_layouts(fakes, mode) as watch:  # Note [fake tensor cache]
        try:
            out = pytree.tree_leaves(_FakeConstants(gm, mode).run(*fakes))
        except Exception as e:  # noqa: BLE001 - torch's error, with the op and the input named
            op, index = watch.recorder.failed or ("the graph", None)
            on = f" on input {gm_placeholder_name(gm, index)!r}" if index is not None else ""
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CaptureError(f"{op}{on} failed when run on FakeTensors: {type(e).__name__}: {first}") from e
        changes = watch.changes()
        # an output that is an input object itself keeps its final layout after the restore
        watched = {id(t) for t in fakes if isinstance(t, torch.Tensor)}  # an int input may be returned (a size)
        out = [t.as_strided(t.shape, t.stride(), t.storage_offset()) if id(t) in watched else t for t in out]
    return list(fakes), out, changes


def gm_placeholder_name(gm: fx.GraphModule, index: int) -> str:
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"][index]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


# Note [size outputs]: under dynamic shapes a graph may return sizes: dynamo returns
# ``x.size(0) * 2`` from the graph when the function does (Mistral's generate), and AOTAutograd's
# forward graph returns the SymInts its backward graph reads. A FusionGraph's outputs are tensors;
# ``from_fx`` computes each size output from the example inputs' sizes (the graph is specialized
# to them, so it is a constant of this graph) and hands it back beside the graph, by position.
def _is_size(a: object) -> bool:
    return isinstance(a, (int, torch.SymInt)) and not isinstance(a, bool)


def _value_name(a: Arg, renamed: Mapping[str, str], where: str) -> str:
    if not isinstance(a, ValueRef):
        raise CaptureError(f"{where}: graph outputs must be tensors, got {a!r}")
    return renamed.get(a.name, a.name)


def observed_aliases(inputs: Sequence[object], outputs: Sequence[object],
                     meta_of: Callable[[torch.Tensor], TensorMeta] = TensorMeta.from_tensor) -> list[Alias | None]:
    """Which outputs share a storage with an input (first such input) or an earlier output;
    ``meta_of`` gives an aliasing output's layout (Note [dynamo's values, translated])."""
    by_storage: dict[StorageWeakRef, Alias] = {}
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor):
            by_storage.setdefault(StorageWeakRef(t.untyped_storage()), Alias("input", i))
    result: list[Alias | None] = []
    for j, t in enumerate(outputs):
        if not isinstance(t, torch.Tensor):
            result.append(None)
            continue
        if t.layout != torch.strided:  # a sparse/nested output has no one storage (it crashed here)
            raise CaptureError(f"output {j}: a {t.layout} tensor; only strided (dense) tensors are supported")
        key = StorageWeakRef(t.untyped_storage())
        alias = by_storage.get(key)
        result.append(None if alias is None else Alias(alias.source, alias.index, meta_of(t)))
        by_storage.setdefault(key, Alias("output", j))
    return result
