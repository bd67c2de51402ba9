"""Check what a graph records about its original program against what its ops do.

A functional graph carries three facts it cannot compute itself (segmenter/ir/graph.py):
``output_aliases`` (an output was a view of an input or of an earlier output), ``mutations``
(input ``k`` ends holding value ``v``) and storage groups (inputs that share a storage). Every
later stage believes them: ``reference.finish`` hands an aliased output back as a view of the
input's storage *instead of* the value the ops computed. So a graph from a file must prove them.

Note [an alias claim must hold]: output ``i`` (value ``o``) claimed a view of input ``k`` at
layout ``L`` (the recorded layout, or ``o``'s meta when none is recorded) holds when ``o`` is
made by a chain of view ops (possibly empty) from a root ``r``, and either

  A. ``r`` is an input in ``k``'s storage group and no input of that group is written back: the
     view of ``k``'s storage at ``L`` then holds ``o``'s elements; or
  B. the chain passes through (or starts at) the final value ``v`` of an input ``j`` in ``k``'s
     group, ``j`` is the only input of the group written back, and the chain from ``v`` on sees
     ``v``'s elements once ``j`` holds ``v``: view ops map logical indices, so they do;
     ``as_strided`` maps storage positions, so it does only where ``v`` and ``j`` have one dense
     layout and the view stays inside it. This is the legit ``y = x[0]; x.add_(1); return y``,
     exported as ``select(add(x, 1), 0)`` (Note [what export loses] in segmenter/capturing/from_torch.py);

and the chain (from ``r``, or from ``v``), replayed on FakeTensors from input ``j`` itself (its real layout, which
``check_inputs`` enforces at every call), gives a view of ``k``'s storage with layout ``L``.
Output ``i`` claimed a view of an earlier output ``k``: if ``k`` is itself claimed a view of an
input, ``i``'s claim is checked as a claim on that input; otherwise ``o`` and ``k``'s value must
share their root, a value made by an op (not an input: ``finish`` copies those), that no earlier
unclaimed output also views (``finish`` would copy ``k``), and the chain replayed from that root's
recorded layout must give ``L``. A claimed view of no elements (of the ops' shape and dtype)
holds whatever made it: it reads nothing. Anything else is refused, naming ``output_aliases[i]``. An
output that is a view but claims nothing is fine: ``finish`` hands back a fresh copy of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..ir.graph import Alias, FusionGraph, GraphError, TensorMeta
from ..ir.ops import OpKind, op_info
from .meta import fake_inputs, fakeable, quiet_fake_errors, run_node, shallow

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


class _Views:
    """Roots of view chains, and the chains replayed on FakeTensors, each value once (a graph
    may hold a million outputs: nothing here is worse than linear in the graph)."""

    def __init__(self, graph: FusionGraph) -> None:
        self.graph = graph
        self.mode = FakeTensorMode()
        self.fakes = fake_inputs(self.mode, graph.inputs)
        self.root: dict[str, str] = {}
        for node in graph.nodes:
            if op_info(node.op).kind != OpKind.VIEW or not node.inputs:
                continue
            base = node.inputs[0]
            for o in node.outputs:
                if o is not None:
                    self.root[o] = self.root.get(base, base)
        self._made: dict[tuple[str, str], torch.Tensor | None] = {}
        self._starts: dict[str, torch.Tensor] = {}

    def root_of(self, value: str) -> str:
        return self.root.get(value, value)

    def replay(self, value: str, start: torch.Tensor, key: str, base: str | None = None) -> torch.Tensor | None:
        """``value`` made by its view chain from ``start`` standing for ``base`` (a value on the
        chain; default its root). None: an op of the chain does not take that layout. ``key``
        names ``start`` for the memo."""
        base = self.root_of(value) if base is None else base
        path: list[str] = []
        v = value
        while v != base and (key, v) not in self._made:
            path.append(v)
            v = self.graph.producers[v].inputs[0]
        cur = start if v == base else self._made[(key, v)]
        for v in reversed(path):
            node = self.graph.producers[v]
            if cur is None:
                self._made[(key, v)] = None
                continue
            try:
                with self.mode, quiet_fake_errors():
                    vals = run_node(node, {node.inputs[0]: cur})
            except Exception:  # noqa: BLE001 - a view op that does not take the layout: no view
                vals = [None] * len(node.outputs)
            for name, val in zip(node.outputs, vals):
                if name is not None:
                    with self.mode:
                        self._made[(key, name)] = shallow(val) if isinstance(val, torch.Tensor) else None
            cur = self._made[(key, v)]
        return cur

    def made_value(self, value: str) -> torch.Tensor:
        """A FakeTensor standing for ``value`` (made by an op) at its recorded layout; one per value,
        so replays from it are memoized under the key ``%value``."""
        if value not in self._starts:
            m = self.graph.metas[value]
            with self.mode:
                self._starts[value] = torch.empty(max(m.storage_extent, 1), dtype=m.dtype,
                                                  device=fakeable(m.device)).as_strided(m.shape, m.stride, m.storage_offset)
        return self._starts[value]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _check_output_aliases(graph: FusionGraph) -> None:
    if all(a is None for a in graph.output_aliases):
        return
    views = _Views(graph)
    index = {inp.name: i for i, inp in enumerate(graph.inputs)}
    written = {m.value: m.input for m in graph.mutations}
    group_written: dict[int, list[int]] = {}
    for m in graph.mutations:
        group_written.setdefault(graph.inputs[m.input].storage, []).append(m.input)
    first_unclaimed: dict[str, int] = {}  # root -> the first output viewing it that claims nothing
    for i, (o, a) in enumerate(zip(graph.outputs, graph.output_aliases)):
        if a is None:
            first_unclaimed.setdefault(views.root_of(o), i)
    on_input: list[int | None] = []  # per output: the input its claim resolves to
    done: dict[tuple[str, Alias], int | None] = {}  # a claim repeated (``return x, x, ...``) is checked once
    for i, (o, a) in enumerate(zip(graph.outputs, graph.output_aliases)):
        if a is None:
            on_input.append(None)
            continue
        key = (o, a if a.source == "input" else Alias("input", on_input[a.index], a.layout)
               if on_input[a.index] is not None else a)
        if key not in done:
            done[key] = _check_claim(graph, views, i, a, on_input, index, written, group_written, first_unclaimed)
        on_input.append(done[key])


def _check_claim(graph: FusionGraph, views: _Views, i: int, a: Alias, on_input: Sequence[int | None],
                 index: dict[str, int], written: dict[str, int], group_written: dict[int, list[int]],
                 first_unclaimed: dict[str, int]) -> int | None:
    """Check output ``i``'s claim ``a``; return the input it is a view of (None: of an output)."""
    where = f"output_aliases[{i}]"
    o = graph.outputs[i]
    layout = a.layout or graph.metas[o]
    if a.source == "output" and on_input[a.index] is None:
        root = views.root_of(o)
        base = graph.outputs[a.index]
        what = f"claims output {i} (%{o}) is a view of output {a.index} (%{base})"
        if root != views.root_of(base):
            raise GraphError(f"{where}: {what}, but they view different values (%{root}, %{views.root_of(base)})")
        if root in index:
            raise GraphError(f"{where}: {what}, but both view input {root!r}, and output {a.index} is handed back "
                             "as a copy (it claims no alias)")
        if first_unclaimed[root] < a.index:
            raise GraphError(f"{where}: {what}, but output {first_unclaimed[root]} views the same value first, so "
                             f"output {a.index} is handed back as a copy")
        start = views.made_value(root)
        got, got_base = views.replay(o, start, f"%{root}"), views.replay(base, start, f"%{root}")
        if got is None or got_base is None or _storage(got) != _storage(got_base):
            raise GraphError(f"{where}: {what}, but its view ops do not give a view of it")
        _same(got, layout, graph.metas[root].device, where, what)
        return None
    k = a.index if a.source == "input" else on_input[a.index]
    assert k is not None
    group = graph.inputs[k].storage
    what = f"claims output {i} (%{o}) is a view of input {k} ({graph.inputs[k].name!r})"
    mine = graph.metas[o]
    if layout.numel == 0 and mine.numel == 0:
        # A view of no elements reads no byte, so the claim cannot hand back a value the ops did not
        # compute; only its shape and dtype are seen. Functionalization may compute such an output
        # through a cast of the written-back value (``expand(x)`` after ``x.add_``, 0 elements).
        if layout.shape != mine.shape or layout.dtype != mine.dtype:
            raise GraphError(f"{where}: {what} with layout {layout}, but the ops make it {mine}")
        if torch.device(layout.device) != torch.device(graph.inputs[k].meta.device):
            raise GraphError(f"{where}: {what} on device {layout.device}, but it is on {graph.inputs[k].meta.device}")
        return k
    # up the view chain to the first written-back value of the group (case B), else to the root
    base, strided = o, False
    while not (base in written and graph.inputs[written[base]].storage == group) and base in views.root:
        node = graph.producers[base]
        strided = strided or node.op == "aten.as_strided.default"
        base = node.inputs[0]
    if base in written and graph.inputs[written[base]].storage == group:
        if group_written[group] != [written[base]]:
            raise GraphError(f"{where}: {what}, but other inputs of that storage are written back too")
        j = written[base]
    elif base in index and graph.inputs[index[base]].storage == group:
        if group_written.get(group):
            raise GraphError(f"{where}: {what}, but that storage is written back while %{o} reads it before")
        j = index[base]
    else:
        made = graph.producers.get(base)
        how = f"made by {made.op}" if made is not None else "another input"
        raise GraphError(f"{where}: {what}, but it is not a view of it: %{base} is {how}")
    got = views.replay(o, views.fakes[j], f"input {j} as %{base}", base)
    if got is None or _storage(got) != _storage(views.fakes[k]):
        raise GraphError(f"{where}: {what}, but its view ops on that input do not give a view of it")
    if base not in index and strided and not _reads_within(graph.inputs[j].meta, graph.metas[base],
                                                           TensorMeta.from_tensor(got)):
        raise GraphError(f"{where}: {what} through as_strided of the written-back value %{base}, which reads "
                         "other elements of the storage than that value's")
    _same(got, layout, graph.inputs[k].meta.device, where, what)
    return k


def _reads_within(inp: TensorMeta, value: TensorMeta, view: TensorMeta) -> bool:
    """Whether ``as_strided`` over ``value`` means the same elements as over ``inp`` once ``inp``
    holds ``value`` (case B of Note [an alias claim must hold]): the two have one layout, dense
    (its elements are one run of the storage), and the view reads only inside that run."""
    if not value.same_layout(inp) or overlaps_itself(inp) or inp.storage_extent - inp.storage_offset != inp.numel:
        return False
    if view.numel == 0:
        return True
    return inp.storage_offset <= view.storage_offset and view.storage_extent <= inp.storage_extent


def _same(got: torch.Tensor, layout: TensorMeta, device: str, where: str, what: str) -> None:
    """The claimed layout is the replayed one (the fakes' device may stand in for ``device``)."""
    have = TensorMeta.from_tensor(got, device=device)
    if torch.device(layout.device) != torch.device(device):
        raise GraphError(f"{where}: {what} on device {layout.device}, but it is on {device}")
    if not have.same_layout(layout):
        raise GraphError(f"{where}: {what} with layout {layout}, but its view ops give {have}")
