"""Run a FusionGraph node by node with torch: the semantics every later stage must keep.

This is the meaning of a FusionGraph, written once: compute the functional values, write each
mutated input's final value into it, give inputs whose layout the program changed their final
layout (``GraphInput.final_layout``), and hand back (numbers where the program returned ``t.item()``) each output either as a fresh tensor or, where
the original program returned a view (``output_aliases``), as a view of the same storage with
the original layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..ir.graph import Alias, FusionGraph, GraphConstant, GraphError, Mutation, TensorMeta
from .meta import run_node

__all__ = ["FinishView", "InputView", "check_inputs", "clone_inputs", "evaluate", "finish", "fresh_in_layout",
           "number_fits", "numbers_as_tensors", "run_graph", "storage_key"]


def storage_key(t: torch.Tensor) -> int:
    """Identity of the storage behind ``t`` (the storage object itself: unlike its data pointer,
    distinct for every empty storage, and defined on the meta device)."""
    return t.untyped_storage()._cdata


class InputView(NamedTuple):
    name: str
    final_layout: TensorMeta | None


@dataclass(frozen=True)
class FinishView:
    """What ``finish`` reads of a graph, with concrete layouts: a symbolic plan's graph at one
    call's sizes (Note [symbolic plans] in segmenter/ir/symbolic.py), made by the program at the call."""

    inputs: tuple[InputView, ...]
    outputs: tuple[str, ...]
    output_aliases: tuple[Alias | None, ...]
    mutations: tuple[Mutation, ...]
    constants: tuple[GraphConstant, ...]
    scalar_outputs: tuple[int, ...]
    metas: dict[str, TensorMeta]


def number_fits(value: object, dtype: torch.dtype) -> bool:
    """Whether a Python number is a value of ``dtype``'s kind: a bool for bool, an int for an
    integer dtype, an int or float for a floating one (nvFuser's scalar inputs take them so)."""
    if isinstance(value, torch.Tensor):
        return False
    if dtype == torch.bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if dtype.is_complex:
        return isinstance(value, int | float | complex)
    if dtype.is_floating_point:
        return isinstance(value, int | float)
    return isinstance(value, int)


# Note [numbers for 0-dim inputs]: nvFuser's scalar inputs (``fd.define_scalar(dtype=...)``) are
# graph inputs of 0-dim CPU tensors (segmenter/formats/nvfuser/importer.py), and nvFuser's execute takes a
# Python number for them (``fd.execute([t0, 2.5])``). So does a graph's call: a number given for a
# 0-dim CPU input becomes a tensor of that input's dtype, where it is a value of that dtype's
# kind (``number_fits``) and in its range. Not for an input the graph writes (the caller could
# never see the write) nor for one an output is a view of (that view would be of a tensor the
# caller never had).
def numbers_as_tensors(graph: FusionGraph, inputs: Sequence[object]) -> list[object]:
    """``inputs`` with every number given for a 0-dim CPU input made that input's tensor (Note
    [numbers for 0-dim inputs]); anything else as given (``check_inputs`` judges it)."""
    out = list(inputs)
    for k, (spec, v) in enumerate(zip(graph.inputs, inputs)):
        if isinstance(v, torch.Tensor) or not isinstance(v, bool | int | float | complex):
            continue
        m = spec.meta
        if m.shape != () or m.device_type != "cpu":
            continue
        if any(mu.input == k for mu in graph.mutations) or any(
                a is not None and a.source == "input" and a.index == k for a in graph.output_aliases):
            raise GraphError(f"input {spec.name!r}: the graph writes it or returns a view of it, so it takes a "
                             f"tensor, not the number {v!r}")
        if not number_fits(v, m.dtype):
            raise GraphError(f"input {spec.name!r}: {type(v).__name__} {v!r} is not a {m.dtype} value")
        try:
            out[k] = torch.tensor(v, dtype=m.dtype)
        except (RuntimeError, OverflowError, ValueError) as e:  # out of the dtype's range
            raise GraphError(f"input {spec.name!r}: {v!r} is not a {m.dtype} value ({e})") from None
    return out


def check_inputs(graph: FusionGraph, inputs: Sequence[torch.Tensor]) -> None:
    """Refuse inputs that do not match the graph's signature (never misread them)."""
    if len(inputs) != len(graph.inputs):
        raise GraphError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs, got {len(inputs)}")
    for spec, t in zip(graph.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise GraphError(f"input {spec.name!r}: expected a tensor, got {type(t).__name__}")
        want = spec.meta
        if (t.shape != want.shape or t.stride() != want.stride or t.storage_offset() != want.storage_offset
                or t.dtype != want.dtype or t.device.type != want.device_type
                or t.is_conj() != want.conj or t.is_neg() != want.neg):
            got = TensorMeta.from_tensor(t)
            raise GraphError(f"input {spec.name!r}: expected {want} on {want.device}, got {got} on {got.device}")
    seen: dict[object, int] = {}
    declared: dict[int, tuple[object, int]] = {}
    for i, t in enumerate(inputs):
        key = storage_key(t)
        first = seen.setdefault(key, graph.inputs[i].storage)
        if first != graph.inputs[i].storage and t.numel():
            raise GraphError(f"input {graph.inputs[i].name!r} shares a storage the graph does not expect it to")
        # and the converse: the graph's recorded aliasing was proved for inputs that share one
        other = declared.setdefault(graph.inputs[i].storage, (key, i)) if t.numel() else (key, i)
        if other[0] != key:
            raise GraphError(f"input {graph.inputs[i].name!r} should share a storage with input "
                             f"{graph.inputs[other[1]].name!r} (the graph says they do), but does not")


def evaluate(graph: FusionGraph, inputs: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every value of the graph, computed functionally (no write-back, no aliasing restored)."""
    env: dict[str, torch.Tensor] = dict(zip(graph.input_names, inputs))
    env.update((c.name, c.tensor()) for c in graph.constants)
    for node in graph.nodes:
        for name, val in zip(node.outputs, run_node(node, env)):
            if name is not None:
                env[name] = val
    return env


def clone_inputs(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies with the same sizes, strides and offsets, sharing storage exactly where the
    originals do (so ``f(x, x)`` stays ``f(y, y)``)."""
    copies: dict[int, torch.Tensor] = {}
    out = []
    for t in tensors:
        key = storage_key(t)
        store = copies.get(key)
        if store is None:
            store = torch.empty(0, dtype=torch.uint8, device=t.device)
            store.set_(t.untyped_storage().clone() if t.device.type != "meta" else t.untyped_storage())
            copies[key] = store
        out.append(torch.empty(0, dtype=t.dtype, device=t.device).set_(
            store.untyped_storage(), t.storage_offset(), t.shape, t.stride()))
    return out


def _one_of_each(m: TensorMeta) -> tuple[slice, ...]:
    """An index that picks one element along each dim ``m`` repeats (size > 1, stride 0) and
    every element along the others: what copy_ may write of a layout that repeats elements."""
    return tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for n, st in zip(m.shape, m.stride))


def fresh_in_layout(t: torch.Tensor, m: TensorMeta) -> torch.Tensor:
    """A fresh tensor with ``t``'s values in layout ``m``, with ``m``'s conj/neg bits (copy_ into a
    view with the bits stores the values so that the view reads as ``t`` does). Where ``m``
    repeats elements (a stride-0 dim, as an expanded output has), the values along that dim are
    equal: one copy of them is written and the dim is expanded over it (copy_ refuses to write
    overlapping elements)."""
    if not any(st == 0 and n > 1 for n, st in zip(m.shape, m.stride)):
        return m.with_bits(torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=t.device)).copy_(t)
    # only repeating dims shrink to one: a size-0 dim with stride 0 stays empty (fuzzer finding)
    one = tuple(1 if st == 0 and n > 1 else n for n, st in zip(m.shape, m.stride))
    base = m.with_bits(torch.empty_strided(one, m.stride, dtype=m.dtype, device=t.device))
    base.copy_(t[_one_of_each(m)])
    return base.expand(m.shape)


def _fresh(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in its own storage, same layout and same conj/neg bits (an expanded ``t``
    too: a torch.compile fuzzer finding)."""
    return fresh_in_layout(t, TensorMeta.from_tensor(t))


def _extent_bytes(m: TensorMeta) -> int:
    """Bytes of storage a layout reaches (from the storage's start); 0 for an empty one."""
    if m.numel == 0:
        return 0
    return (m.storage_offset + sum((n - 1) * abs(st) for n, st in zip(m.shape, m.stride)) + 1) * m.itemsize


def _write_in_layout(storage: torch.UntypedStorage, m: TensorMeta, value: torch.Tensor) -> torch.Tensor:
    """``value`` written into ``storage`` at layout ``m`` (its bits applied), and that view."""
    view = torch.empty(0, dtype=m.dtype, device=value.device).set_(storage, m.storage_offset, m.shape, m.stride)
    view = m.with_bits(view)
    if m.numel:
        pick = _one_of_each(m)  # copy_ refuses overlapping writes
        view[pick].copy_(value[pick])
    return view


def _lies_at(v: torch.Tensor, storage: int, m: TensorMeta) -> bool:
    """Whether ``v`` is the view of ``storage`` at layout ``m``."""
    return (storage_key(v) == storage and v.storage_offset() == m.storage_offset and v.stride() == m.stride
            and v.dtype == m.dtype)


def _rebase_output_views(graph: FusionGraph, env: dict[str, torch.Tensor], fresh: list[torch.Tensor | None]) -> None:
    """Note [views of an output]: an output recorded as a view of an earlier output (both views of
    one buffer the program made, the earlier one not the whole of it: ``y[0::2], y[1:2]`` of an
    intermediate ``y``) is made by ``finish`` as a view of that output's storage, in the recorded
    layout. That is only right where the earlier output's storage is the one the later one's value
    lies in, at the recorded offsets. A plan may hand the earlier one back as a buffer of its own
    (a copy: "pre"/"off", or the post pass keeping it one), whose storage holds only its own
    elements: the view then fell outside it (torch refuses) or, where the copy's strides leave
    holes, read elements nobody wrote. Where the later outputs' own values do not lie in the
    earlier one's storage at their recorded layouts, the group gets a fresh zeroed storage that
    every member's values are written into at their recorded layouts, and the earlier output
    becomes its view there: values and storage sharing as eager's."""
    members: dict[int, list[int]] = {}
    for k, a in enumerate(graph.output_aliases):
        if a is not None and a.source == "output" and fresh[a.index] is not None:
            members.setdefault(a.index, []).append(k)
    metas = graph.metas
    for j, ks in members.items():
        base = fresh[j]
        assert base is not None
        mj = metas[graph.outputs[j]]
        layouts = [graph.output_aliases[k].layout or metas[graph.outputs[k]] for k in ks]  # type: ignore[union-attr]
        if (base.storage_offset() == mj.storage_offset and base.stride() == mj.stride
                and all(_lies_at(env[graph.outputs[k]], storage_key(base), m) for k, m in zip(ks, layouts))):
            continue
        nbytes = max(_extent_bytes(m) for m in [mj, *layouts])
        storage = torch.zeros(nbytes, dtype=torch.uint8, device=base.device).untyped_storage()
        for k, m in zip(ks, layouts):
            _write_in_layout(storage, m, env[graph.outputs[k]])
        fresh[j] = _write_in_layout(storage, mj, base)


def run_graph(graph: FusionGraph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run the graph as the original program would: mutations land, views stay views (numbers
    for 0-dim inputs as Note [numbers for 0-dim inputs] says)."""
    inputs = numbers_as_tensors(graph, inputs)  # type: ignore[assignment]
    check_inputs(graph, inputs)
    return finish(graph, inputs, evaluate(graph, inputs))


def finish(
    graph: FusionGraph | FinishView, inputs: Sequence[torch.Tensor], env: dict[str, torch.Tensor],
    written: frozenset[int] = frozenset(),
) -> list[torch.Tensor]:
    """Write mutated inputs' final values into them and hand back the outputs: a view of the
    same storage, with the original layout, where the original program returned a view; a
    tensor sharing no storage with an input or another output everywhere else."""
    input_storages = {storage_key(t) for t in inputs}
    # the graph's constants are its own: the caller gets copies (what it does to them must not
    # reach the next call)
    input_storages.update(storage_key(env[c.name]) for c in graph.constants if c.name in env)

    def detached(t: torch.Tensor) -> torch.Tensor:
        # Functional values may still be views of inputs or constants; copy them before any write-back.
        return _fresh(t) if storage_key(t) in input_storages else t

    for m in graph.mutations:
        t = inputs[m.input]
        if t.numel() and any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
            # what eager raises for x.add_(1) on an expanded x (with elements), before anything is written
            raise RuntimeError(
                f"input {graph.inputs[m.input].name!r}: unsupported operation: more than one element of the "
                "written-to tensor refers to a single memory location. Please clone() the tensor before "
                "performing the operation.")
    # ``written``: inputs a launch already wrote in place (runtime/emit/inplace.py); no copy for those.
    finals = {m.input: detached(env[m.value]) for m in graph.mutations if m.input not in written}
    fresh: list[torch.Tensor | None] = []
    taken: set[int] = set()
    for o, a in zip(graph.outputs, graph.output_aliases):
        if a is not None:
            fresh.append(None)
            continue
        t = detached(env[o])
        if storage_key(t) in taken and t.numel():
            t = _fresh(t)  # a plan may have made two outputs views of one buffer; the original did not
        taken.add(storage_key(t))
        fresh.append(t)
    _rebase_output_views(graph, env, fresh)
    for i, val in finals.items():
        inputs[i].copy_(val)
    for i, inp in enumerate(graph.inputs):
        if inp.final_layout is not None:  # Note [metadata mutation]: after the write-back, in the old layout
            m = inp.final_layout
            with torch.no_grad():
                inputs[i].as_strided_(m.shape, m.stride, m.storage_offset)
    result: list[torch.Tensor] = []
    for name, alias, val in zip(graph.outputs, graph.output_aliases, fresh):
        if alias is None:
            result.append(val)
            continue
        # A view in the original program: the same storage, with the original's layout.
        base = inputs[alias.index] if alias.source == "input" else result[alias.index]
        layout = alias.layout or graph.metas[name]
        if layout.dtype != base.dtype:  # a view(dtype) of the input: same storage, read as another dtype
            view = torch.empty(0, dtype=layout.dtype, device=base.device)
            view = view.set_(base.untyped_storage(), layout.storage_offset, layout.shape, layout.stride)
        else:
            view = base.as_strided(layout.shape, layout.stride, layout.storage_offset)
        # as_strided keeps the base's conj/neg bits; the view has its own (x.conj(), x.mH)
        result.append(layout.with_bits(view))
    for i in graph.scalar_outputs:  # ``t.item()`` in the program: a Python number, as eager returns
        result[i] = result[i].item()  # type: ignore[call-overload]
    return result
