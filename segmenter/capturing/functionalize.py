"""Functionalize a graph given with in-place nodes (a JSON graph from another fuser).

The nodes are rebuilt as an fx graph of the same ATen ops and handed to ``from_fx``, which runs
torch's own functionalization (``make_fx(functionalize(...))``) on FakeTensors laid out like the
inputs: in-place work on intermediates becomes out-of-place and disappears when dead (seeds/000),
in-place work on an input or a view of one becomes a write-back of the input's final value, and
output aliasing is read from what the in-place program does.
"""

from __future__ import annotations

import dataclasses
import keyword
import operator
import re
from collections.abc import Sequence

import torch
import torch.fx as fx

from ..ir.graph import Alias, Arg, FusionGraph, GraphConstant, GraphError, GraphInput, Node, OpRef, TensorMeta, ValueRef
from ..ir.ops import resolve_op
from .fx_import import CaptureError, from_fx
from .meta import fake_inputs, fake_mode, fakeable, quiet_fake_errors, shallow

__all__ = ["functionalize"]


def functionalize(
    name: str, inputs: Sequence[GraphInput], nodes: Sequence[Node], outputs: Sequence[str],
    constants: Sequence[GraphConstant] = (),
) -> FusionGraph:
    """The functional graph of ``nodes``. Errors name the node (``CaptureError``).

    Note [no name reaches generated code]: torch.fx writes a GraphModule's nodes out as Python
    source and runs it; placeholder targets become parameter names and keyword names are written
    as they are. So nothing from the file is used there: placeholders are ``in_0``, ``in_1``, ...,
    call nodes are named by fx after their op, every keyword is an argument name of the op's
    schema, op arguments are the resolved ops, and the input names are put back afterwards.
    """
    values: dict[str, torch.Tensor] = {}
    for c in constants:
        try:
            values[c.name] = c.tensor()
        except GraphError as e:
            raise CaptureError(f"{e}: a graph with in-place ops cannot be functionalized without it") from None
    with quiet_fake_errors():
        returns_tuple = _run_on_fakes(inputs, nodes, values)  # torch's errors named by node, before fx sees anything
    g = fx.Graph()
    root = torch.nn.Module()
    env: dict[str, fx.Node] = {inp.name: g.placeholder(f"in_{i}") for i, inp in enumerate(inputs)}
    for k, c in enumerate(constants):  # read with get_attr, as torch.compile hands them over
        setattr(root, f"_constant{k}", values[c.name])
        env[c.name] = g.get_attr(f"_constant{k}")

    def arg(a: Arg) -> object:
        if isinstance(a, ValueRef):
            return env[a.name]
        if isinstance(a, OpRef):
            return resolve_op(a.name)  # known: _run_on_fakes checked it
        if isinstance(a, tuple):
            return [arg(x) for x in a]
        return a

    for node, tuple_like in zip(nodes, returns_tuple):
        op = resolve_op(node.op)
        call = g.call_function(op, tuple(arg(a) for a in node.args), {k: arg(v) for k, v in node.kwargs})
        if not tuple_like:
            if node.outputs[0] is not None:
                env[node.outputs[0]] = call
        else:
            for i, o in enumerate(node.outputs):
                if o is not None:
                    env[o] = g.call_function(operator.getitem, (call, i))
    unique = list(dict.fromkeys(outputs))  # a name listed a million times is traced once
    g.output(tuple(env[o] for o in unique))
    try:
        gm = fx.GraphModule(root, g)
        with quiet_fake_errors():
            functional = from_fx(gm, fake_inputs(fake_mode(allow_non_fake_inputs=True), inputs), name=name)
    except CaptureError as e:  # named after the placeholders: put the file's input names back
        raise CaptureError(_input_names_back(str(e), inputs)) from None
    except Exception as e:  # noqa: BLE001 - torch's own error from functionalization, named as ours
        raise CaptureError(f"functionalizing the in-place graph failed: {type(e).__name__}: {_first_line(e)}") from None
    functional = _repeat_outputs(functional, _positions(outputs))
    functional = _rename(functional, {new.name: orig.name for orig, new in zip(inputs, functional.inputs)})
    device = inputs[0].meta.device if inputs else "cpu"

    def fix(m: TensorMeta | None) -> TensorMeta | None:
        # Propagated on "meta" where this machine cannot fake the device: put the device back.
        return m if m is None or m.device == device else dataclasses.replace(m, device=device)

    return dataclasses.replace(
        functional,
        inputs=tuple(dataclasses.replace(orig, meta=fix(new.meta), final_layout=fix(new.final_layout))
                     for orig, new in zip(inputs, functional.inputs)),
        nodes=tuple(dataclasses.replace(n, metas=tuple(fix(m) for m in n.metas)) for n in functional.nodes),
    )


def _input_names_back(message: str, inputs: Sequence[GraphInput]) -> str:
    """``message`` with each quoted placeholder name (``'in_3'``) replaced by the input's own."""
    def name(m: re.Match[str]) -> str:
        k = int(m.group(1))
        return repr(inputs[k].name) if k < len(inputs) else m.group(0)
    return re.sub(r"'in_(\d+)'", name, message)


def _positions(outputs: Sequence[str]) -> list[int]:
    """For each listed output, the position of its name among the distinct names."""
    first: dict[str, int] = {}
    return [first.setdefault(o, len(first)) for o in outputs]


def _repeat_outputs(graph: FusionGraph, positions: Sequence[int]) -> FusionGraph:
    """The graph with its distinct outputs listed as the file lists them. A repeat is the same
    tensor as its first listing: the same view of an input, or else a view of that output."""
    if len(positions) == len(graph.outputs):
        return graph
    first: dict[int, int] = {}
    outputs, aliases = [], []
    for i, p in enumerate(positions):
        outputs.append(graph.outputs[p])
        if p in first:
            earlier = aliases[first[p]]
            aliases.append(earlier if earlier is not None else Alias("output", first[p], graph.metas[graph.outputs[p]]))
        else:
            first[p] = i
            aliases.append(graph.output_aliases[p])
    return dataclasses.replace(graph, outputs=tuple(outputs), output_aliases=tuple(aliases))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def _check_call(node: Node, op: object) -> None:
    """Keywords must be argument names of the op's schema (they are written into fx's source)."""
    if isinstance(op, torch._ops.OpOverload):
        names = {a.name for a in op._schema.arguments}
        for k, _ in node.kwargs:
            if k not in names:
                raise CaptureError(f"node {node.name!r}: {node.op} has no argument {k!r}")
    elif any(not k.isidentifier() or keyword.iskeyword(k) for k, _ in node.kwargs):
        raise CaptureError(f"node {node.name!r}: keyword names must be identifiers")


def _written_input(op: object, node: Node, env: dict[str, object], inputs: Sequence[GraphInput]) -> str:
    """`` on input 'a'`` where ``op`` writes (in place) a tensor sharing a graph input's storage."""
    if not isinstance(op, torch._ops.OpOverload) or not node.args:
        return ""
    first = op._schema.arguments[0]
    if first.alias_info is None or not first.alias_info.is_write or not isinstance(node.args[0], ValueRef):
        return ""
    written = env.get(node.args[0].name)
    if not isinstance(written, torch.Tensor):
        return ""
    for inp in inputs:
        t = env.get(inp.name)
        if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata == written.untyped_storage()._cdata:
            return f" on input {inp.name!r}"
    return ""


def _run_on_fakes(inputs: Sequence[GraphInput], nodes: Sequence[Node], constants: dict[str, torch.Tensor]) -> list[bool]:
    """Run the in-place program once on FakeTensors laid out like the inputs: every op must
    exist and accept its arguments; a failure names its node. Returns, per node, whether its op
    returns a tuple (its outputs are then picked out one by one)."""
    mode = fake_mode()
    returns_tuple: list[bool] = []
    env: dict[str, object] = dict(zip((i.name for i in inputs), fake_inputs(mode, inputs)))
    env.update({name: mode.from_tensor(t) for name, t in constants.items()})

    def arg(a: Arg, node: Node) -> object:
        if isinstance(a, ValueRef):
            return env[a.name]
        if isinstance(a, OpRef):
            op = resolve_op(a.name)
            if op is None:
                raise CaptureError(f"node {node.name!r}: op argument {a.name} is unknown to torch")
            return op
        if isinstance(a, tuple):
            return [arg(x, node) for x in a]
        if isinstance(a, torch.device):
            return torch.device(fakeable(str(a)))
        return a

    with mode:
        for node in nodes:
            op = resolve_op(node.op)
            if op is None:
                raise CaptureError(f"node {node.name!r}: {node.op} is unknown to torch, so a graph with in-place "
                                   "ops around it cannot be functionalized")
            _check_call(node, op)
            try:
                args = [arg(a, node) for a in node.args]
                result = op(*args, **{k: arg(v, node) for k, v in node.kwargs})
            except CaptureError:
                raise
            except Exception as e:  # noqa: BLE001 - torch's own error, with the node named
                on = _written_input(op, node, env, inputs)
                raise CaptureError(f"node {node.name!r} ({node.op}){on}: {type(e).__name__}: {_first_line(e)}") from None
            if isinstance(result, (tuple, list)) or result is None:
                results, tuple_like = list(result or ()), True
            else:
                results, tuple_like = [result], False
            if len(results) != len(node.outputs) and (results or any(o is not None for o in node.outputs)):
                raise CaptureError(f"node {node.name!r}: {node.op} returned {len(results)} values, "
                                   f"the graph names {len(node.outputs)}")
            for o, val in zip(node.outputs, results):
                if o is not None:
                    if not isinstance(val, torch.Tensor):
                        raise CaptureError(f"node {node.name!r}: output {o!r} is a {type(val).__name__}, not a tensor")
                    env[o] = shallow(val)
            returns_tuple.append(tuple_like)
    return returns_tuple


def _rename(graph: FusionGraph, names: dict[str, str]) -> FusionGraph:
    """The same graph with values renamed (retracing renamed the inputs)."""
    taken = {o for n in graph.nodes for o in n.outputs if o is not None}
    clash = taken & (set(names.values()) - set(names))
    if clash:
        raise CaptureError(f"cannot restore input names {sorted(clash)}: nodes of the functional graph use them")

    def ren(a: Arg) -> Arg:
        if isinstance(a, ValueRef):
            return ValueRef(names.get(a.name, a.name))
        if isinstance(a, tuple):
            return tuple(ren(x) for x in a)
        return a

    nodes = tuple(dataclasses.replace(n, args=tuple(ren(a) for a in n.args),
                                      kwargs=tuple((k, ren(v)) for k, v in n.kwargs)) for n in graph.nodes)
    return dataclasses.replace(
        graph,
        inputs=tuple(dataclasses.replace(i, name=names.get(i.name, i.name)) for i in graph.inputs),
        nodes=nodes,
        outputs=tuple(names.get(o, o) for o in graph.outputs),
        mutations=tuple(dataclasses.replace(m, value=names.get(m.value, m.value)) for m in graph.mutations),
    )
