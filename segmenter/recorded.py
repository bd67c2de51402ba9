"""Check what a graph records about its original program against what its ops do.

A functional graph carries three facts it cannot compute itself (segmenter/ir.py):
``output_aliases`` (an output was a view of an input or of an earlier output), ``mutations``
(input ``k`` ends holding value ``v``) and storage groups (inputs that share a storage). Every
later stage believes them: ``reference.finish`` hands an aliased output back as a view of the
input's storage *instead of* the value the ops computed. So a graph from a file must prove them.

Note [an alias claim must hold]: output ``i`` (value ``o``) claimed a view of input ``k`` at
layout ``L`` (the recorded layout, or ``o``'s meta when none is recorded) holds when ``o`` is
made by a chain of view ops (possibly empty) from a root ``r``, and either

  A. ``r`` is an input in ``k``'s storage group and no input of that group is written back: the
     view of ``k``'s storage at ``L`` then holds ``o``'s elements; or
  B. ``r`` is the final value ``v`` of an input ``j`` in ``k``'s group, ``j`` is the only input of
     the group written back, and no op of the chain is ``as_strided`` (the others map logical
     indices, so the chain sees ``v``'s elements once ``j`` holds ``v``). This is the legit
     ``y = x[0]; x.add_(1); return y``, exported as ``select(add(x, 1), 0)`` (Note [what export
     loses] in segmenter/from_torch.py);

and the chain, replayed on FakeTensors from input ``j`` itself (its real layout, which
``check_inputs`` enforces at every call), gives a view of ``k``'s storage with layout ``L``.
Output ``i`` claimed a view of an earlier output ``k``: if ``k`` is itself claimed a view of an
input, ``i``'s claim is checked as a claim on that input; otherwise ``o`` and ``k``'s value must
share their root, a value made by an op (not an input: ``finish`` copies those), that no earlier
unclaimed output also views (``finish`` would copy ``k``), and the chain replayed from that root's
recorded layout must give ``L``. Anything else is refused, naming ``output_aliases[i]``. An
output that is a view but claims nothing is fine: ``finish`` hands back a fresh copy of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .ir import Alias, FusionGraph, GraphError, Node, TensorMeta
from .meta import fake_inputs, fakeable, run_node
from .ops import OpKind, op_info

__all__ = ["check_recorded_effects"]


def check_recorded_effects(graph: FusionGraph) -> None:
    """Raise GraphError naming the first recorded fact the ops contradict."""
    _check_storage_groups(graph)
    _check_mutations(graph)
    _check_output_aliases(graph)


def _check_storage_groups(graph: FusionGraph) -> None:
    device: dict[int, tuple[int, str]] = {}
    for i, inp in enumerate(graph.inputs):
        first = device.setdefault(inp.storage, (i, inp.meta.device))
        if torch.device(first[1]) != torch.device(inp.meta.device):
            raise GraphError(f"inputs[{i}].storage: shares storage {inp.storage} with inputs[{first[0]}] on "
                             f"{first[1]}, but is on {inp.meta.device}")


def overlaps_itself(m: TensorMeta) -> bool:
    """Whether two elements of a layout share a storage element (writing it is order-dependent)."""
    dims = sorted((abs(st), n) for n, st in zip(m.shape, m.stride) if n > 1)
    if m.numel == 0:
        return False
    reach = 0  # the farthest element the smaller dims reach
    for st, n in dims:
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def _check_mutations(graph: FusionGraph) -> None:
    written: dict[int, int] = {}
    for i, m in enumerate(graph.mutations):
        inp = graph.inputs[m.input]
        if overlaps_itself(inp.meta):
            raise GraphError(f"mutations[{i}]: input {inp.name!r} ({inp.meta}) has elements that share memory; "
                             "it cannot be written")
        other = written.setdefault(inp.storage, m.input)
        if other != m.input:
            raise GraphError(f"mutations[{i}]: input {inp.name!r} shares its storage with input "
                             f"{graph.inputs[other].name!r}, also written back: the order of the writes is lost")


def _chain(graph: FusionGraph, value: str) -> tuple[str, list[Node]]:
    """The root ``value`` is viewed from, and the view nodes from the root to it (in order)."""
    chain: list[Node] = []
    producers = graph.producers
    while value in producers and op_info(producers[value].op).kind == OpKind.VIEW and producers[value].inputs:
        node = producers[value]
        if len(chain) > len(graph.nodes):  # cannot happen in a checked graph; never loop on a broken one
            break
        chain.append(node)
        value = node.inputs[0]
    return value, chain[::-1]


def _replay(chain: list[Node], root: str, start: torch.Tensor, want: str, mode: FakeTensorMode) -> torch.Tensor | None:
    """The view ``want`` made by ``chain`` from ``start`` standing for ``root`` (None: it fails)."""
    env: dict[str, torch.Tensor] = {root: start}
    try:
        with mode:
            for node in chain:
                for name, val in zip(node.outputs, run_node(node, env)):
                    if name is not None:
                        env[name] = val
    except Exception:  # noqa: BLE001 - an op that does not take the layout: the claim does not hold
        return None
    out = env.get(want)
    return out if isinstance(out, torch.Tensor) else None


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _check_output_aliases(graph: FusionGraph) -> None:
    if all(a is None for a in graph.output_aliases):
        return
    mode = FakeTensorMode()
    fakes = fake_inputs(mode, graph.inputs)
    index = {inp.name: i for i, inp in enumerate(graph.inputs)}
    written = {m.value: m.input for m in graph.mutations}
    group_written: dict[int, list[int]] = {}
    for m in graph.mutations:
        group_written.setdefault(graph.inputs[m.input].storage, []).append(m.input)
    # per output: the input its claim resolves to (None: not a view of an input)
    on_input: list[int | None] = []
    for i, (o, a) in enumerate(zip(graph.outputs, graph.output_aliases)):
        if a is None:
            on_input.append(None)
            continue
        where = f"output_aliases[{i}]"
        layout = a.layout or graph.metas[o]
        if a.source == "output" and on_input[a.index] is None:
            _check_on_output(graph, i, a, layout, on_input, fakes, mode)
            on_input.append(None)
            continue
        k = a.index if a.source == "input" else on_input[a.index]
        group = graph.inputs[k].storage
        root, chain = _chain(graph, o)
        what = f"claims output {i} (%{o}) is a view of input {k} ({graph.inputs[k].name!r})"
        if root in index and graph.inputs[index[root]].storage == group:
            if group_written.get(group):
                raise GraphError(f"{where}: {what}, but that storage is written back while %{o} reads it before")
            j = index[root]
        elif root in written and graph.inputs[written[root]].storage == group and group_written[group] == [written[root]]:
            if any(n.op == "aten.as_strided.default" for n in chain):
                raise GraphError(f"{where}: {what} through as_strided of the written-back value %{root}: "
                                 "its elements cannot be followed")
            j = written[root]
        else:
            made = graph.producers.get(root)
            how = f"made by {made.op}" if made is not None else "another input"
            raise GraphError(f"{where}: {what}, but it is not a view of it: %{root} is {how}")
        got = _replay(chain, root, fakes[j], o, mode)
        if got is None or _storage(got) != _storage(fakes[k]):
            raise GraphError(f"{where}: {what}, but its view ops on that input do not give a view of it")
        have = TensorMeta.from_tensor(got, device=layout.device)
        if not have.same_layout(layout):
            raise GraphError(f"{where}: {what} with layout {layout}, but its view ops give {have}")
        on_input.append(k)


def _check_on_output(graph: FusionGraph, i: int, a: Alias, layout: TensorMeta, on_input: Sequence[int | None],
                     fakes: Sequence[torch.Tensor], mode: FakeTensorMode) -> None:
    where = f"output_aliases[{i}]"
    o, base = graph.outputs[i], graph.outputs[a.index]
    what = f"claims output {i} (%{o}) is a view of output {a.index} (%{base})"
    root, chain = _chain(graph, o)
    base_root, base_chain = _chain(graph, base)
    if root != base_root:
        raise GraphError(f"{where}: {what}, but they view different values (%{root}, %{base_root})")
    if root in graph.input_names:
        raise GraphError(f"{where}: {what}, but both view input {root!r}, and output {a.index} is handed back "
                         "as a copy (it claims no alias)")
    for j in range(a.index):
        if graph.output_aliases[j] is None and _chain(graph, graph.outputs[j])[0] == root:
            raise GraphError(f"{where}: {what}, but output {j} views the same value first, so output "
                             f"{a.index} is handed back as a copy")
    m = graph.metas[root]
    with mode:
        start = torch.empty(max(m.storage_extent, 1), dtype=m.dtype, device=fakeable(m.device)).as_strided(
            m.shape, m.stride, m.storage_offset)
    got = _replay(chain, root, start, o, mode)
    got_base = _replay(base_chain, root, start, base, mode)
    if got is None or got_base is None or _storage(got) != _storage(got_base):
        raise GraphError(f"{where}: {what}, but its view ops do not give a view of it")
    have = TensorMeta.from_tensor(got, device=layout.device)
    if not have.same_layout(layout):
        raise GraphError(f"{where}: {what} with layout {layout}, but its view ops give {have}")
