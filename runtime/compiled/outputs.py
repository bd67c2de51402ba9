"""How a program hands its outputs back: as they are where nothing can alias (``plain_outputs``),
or, where outputs were views of other outputs, with a generated test instead of ``finish``.

Note [outputs that are views of outputs]: AOTAutograd's training forward graphs return the values
the backward saves, and many of them are views of one another (an attention output detached
and a reshape of it, a matmul's result and its view, an rsqrt and its detach): the graph records
them as views of an earlier output. ``finish`` (segmenter/capturing/reference.py) hands such outputs back
right whatever the plan did (it rebuilds a pair's storage where the plan copied one of them),
but it is generic: storage keys of every input, a check of every group, an ``as_strided`` per
view, about 250 us a call of a tiny Llama's training forward with its 41 views (1.3 ms of its
entry's time under cProfile). Where the graph has nothing else for ``finish`` to do (no
mutation, no layout change of an input, no number output, no view of an input, every output
that is no view its own buffer as in ``plain_outputs``), the fast program tests at the call
that each view output lies in its base output's storage at the recorded layout (the plan made
it a view there: post mode does) and hands the outputs back as they are; otherwise it calls
``finish``, as before. The test is what ``finish`` tests before it leaves a group alone
(``_rebase_output_views``); where it holds, ``finish``'s result is ``base.as_strided`` of the
same layout in the same storage: the same elements, the same sharing.

Note [outputs that are inputs]: the same forward graphs return inputs the backward reads (the
weights, the token ids: 21 of a tiny Qwen2's 64 forward outputs) and the same value twice (a KV
cache's tensor and the saved one): with those, every call went through ``finish`` (about 0.3 ms
of a 3.6 ms training step there). A repeat is recorded as a view of its first place and tested as
one; an output that was a view of an input is tested to lie in that input's storage at its
recorded layout, and one that is the input itself (its variable, at the input's own layout,
which the entry checked) needs no test. Handed back as they are, as the graph itself returns
them (the input object, not ``finish``'s ``as_strided`` of it: the same storage and layout).
"""

from __future__ import annotations

from segmenter import FusionGraph, TensorMeta
from segmenter.ir.graph import view_roots
from segmenter.ir.symbolic import size_key

from ..emit.wrapper import Code

__all__ = ["plain_outputs", "views_of_outputs", "views_test"]


def _own_buffers(graph: FusionGraph, constants: set[str], outputs: list[str]) -> bool:
    """No two of ``outputs`` share a root, and none is a view of an input or a constant."""
    roots = view_roots(graph)
    inputs = set(graph.input_names) | constants  # a constant's storage is the program's: copied
    seen: set[str] = set()
    for o in outputs:
        r = roots.get(o, o)
        if r in inputs or r in seen:
            return False
        seen.add(r)
    return True


def _nothing_else(graph: FusionGraph, repeats: bool = False) -> bool:
    """No mutation, no number output, no input's layout changed, and (unless ``repeats``: each
    repeat is recorded as a view of its first place, which the views test covers) no output
    named twice."""
    return not (graph.mutations or graph.scalar_outputs or (not repeats and len(set(graph.outputs)) < len(graph.outputs))
                or any(i.final_layout is not None for i in graph.inputs))


def plain_outputs(graph: FusionGraph, constants: set[str]) -> bool:
    """Whether the outputs can be handed back as they are (no ``finish``): no input is mutated,
    no input changes its layout, no output is handed back as a number, no output was a view in
    the original program, and no output may share a storage with an input or with another
    output (every one is a buffer the program made for it alone)."""
    if not _nothing_else(graph) or any(a is not None for a in graph.output_aliases):
        return False
    return _own_buffers(graph, constants, list(graph.outputs))


def _layout_key(m: TensorMeta) -> object:
    """A layout as a key that symbolic sizes compare by expression, adding no condition."""
    return size_key((m.shape, m.stride, m.storage_offset)), m.dtype


#: one output that was a view: (its position, "output" or "input", its base's position among the
#: outputs or the inputs, its layout, the base's layout)
View = tuple[int, str, int, TensorMeta, TensorMeta]


def views_of_outputs(graph: FusionGraph, constants: set[str]) -> list[View] | None:
    """See Note [outputs that are views of outputs]: per output that was a view, where every view is
    one of an output that is no view or of an input (Note [outputs that are inputs]), and nothing
    else needs ``finish``; else None."""
    if not _nothing_else(graph, repeats=True) or all(a is None for a in graph.output_aliases):
        return None
    metas = graph.metas
    views: list[View] = []
    for k, (o, a) in enumerate(zip(graph.outputs, graph.output_aliases)):
        if a is None:
            continue
        if a.source == "output":
            if graph.output_aliases[a.index] is not None:
                return None
            base = metas[graph.outputs[a.index]]
        elif a.source == "input":
            base = graph.inputs[a.index].meta
        else:
            return None
        layout = a.layout or metas[o]
        if layout.dtype != base.dtype or layout.conj or layout.neg or base.conj or base.neg:
            return None  # (finish makes those with ``set_`` and the bits: left to it)
        views.append((k, a.source, a.index, layout, base))
    own = [o for o, a in zip(graph.outputs, graph.output_aliases) if a is None]
    return views if _own_buffers(graph, constants, own) else None


def views_test(code: Code, outs: list[str], ins: list[str], views: list[View]) -> str:
    """A Python expression: every view output lies in its base's storage at its recorded layout,
    and each base output at its own (``outs``, ``ins``: the outputs' and the inputs' variables).
    An output that is the very variable of its base input, at the input's own layout, needs no
    test: the entry checked that input's layout (Note [outputs that are inputs])."""
    tests: list[str] = []
    bases: set[int] = set()
    for k, source, j, layout, base in views:
        if source == "input":
            if outs[k] == ins[j] and _layout_key(layout) == _layout_key(base):
                continue
            tests.append(f"{outs[k]}.untyped_storage()._cdata == {ins[j]}.untyped_storage()._cdata and "
                         f"{outs[k]}.storage_offset() == {code.value(layout.storage_offset)} and "
                         f"{outs[k]}.stride() == {code.value(layout.stride)}")
            continue
        if j not in bases:
            bases.add(j)
            tests.append(f"{outs[j]}.storage_offset() == {code.value(base.storage_offset)} and "
                         f"{outs[j]}.stride() == {code.value(base.stride)}")
        tests.append(f"{outs[k]}.untyped_storage()._cdata == {outs[j]}.untyped_storage()._cdata and "
                     f"{outs[k]}.storage_offset() == {code.value(layout.storage_offset)} and "
                     f"{outs[k]}.stride() == {code.value(layout.stride)}")
    return " and ".join(tests) or "True"
