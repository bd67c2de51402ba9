"""Functionalize a graph given with in-place nodes (a JSON graph from another fuser).

The nodes are rebuilt as an fx graph of the same ATen ops and handed to ``from_fx``, which runs
torch's own functionalization (``make_fx(functionalize(...))``) on FakeTensors laid out like the
inputs: in-place work on intermediates becomes out-of-place and disappears when dead (seeds/000),
in-place work on an input or a view of one becomes a write-back of the input's final value, and
output aliasing is read from what the in-place program does.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

from .fx_import import CaptureError, from_fx
from .ir import Arg, FusionGraph, GraphInput, Node, TensorMeta, ValueRef
from .meta import fake_inputs, fake_mode
from .ops import resolve_op

__all__ = ["functionalize"]


def functionalize(name: str, inputs: Sequence[GraphInput], nodes: Sequence[Node], outputs: Sequence[str]) -> FusionGraph:
    g = fx.Graph()
    env: dict[str, fx.Node] = {inp.name: g.placeholder(inp.name) for inp in inputs}

    def arg(a: Arg) -> object:
        if isinstance(a, ValueRef):
            return env[a.name]
        if isinstance(a, tuple):
            return [arg(x) for x in a]
        return a

    for node in nodes:
        op = resolve_op(node.op)
        if op is None:
            raise CaptureError(f"node {node.name!r}: {node.op} is unknown to torch, so a graph with in-place "
                               "ops around it cannot be functionalized")
        call = g.call_function(op, tuple(arg(a) for a in node.args), {k: arg(v) for k, v in node.kwargs})
        if len(node.outputs) == 1:
            if node.outputs[0] is not None:
                env[node.outputs[0]] = call
        else:
            for i, o in enumerate(node.outputs):
                if o is not None:
                    env[o] = g.call_function(operator.getitem, (call, i))
    g.output(tuple(env[o] for o in outputs))
    gm = fx.GraphModule(torch.nn.Module(), g)
    functional = from_fx(gm, fake_inputs(fake_mode(), inputs), name=name)
    functional = _rename(functional, {new.name: orig.name for orig, new in zip(inputs, functional.inputs)})
    device = inputs[0].meta.device if inputs else "cpu"

    def fix(m: TensorMeta | None) -> TensorMeta | None:
        # Propagated on "meta" where this machine cannot fake the device: put the device back.
        return m if m is None or m.device == device else dataclasses.replace(m, device=device)

    return dataclasses.replace(
        functional,
        inputs=tuple(dataclasses.replace(orig, meta=fix(new.meta)) for orig, new in zip(inputs, functional.inputs)),
        nodes=tuple(dataclasses.replace(n, metas=tuple(fix(m) for m in n.metas)) for n in functional.nodes),
    )


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
