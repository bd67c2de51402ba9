"""How a program hands its outputs back: as they are where nothing can alias (``plain_outputs``),
or, where outputs were views of other outputs, with a generated test instead of ``finish``.

Note [outputs that are views of outputs]: AOTAutograd's training forward graphs return the values
the backward saves, and many of them are views of one another (an attention output detached
and a reshape of it, a matmul's result and its view, an rsqrt and its detach): the graph records
them as views of an earlier output. ``finish`` (segmenter/reference.py) hands such outputs back
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
"""

from __future__ import annotations

from segmenter import FusionGraph, TensorMeta
from segmenter.ir import view_roots

from .wrapper import Code

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


def _nothing_else(graph: FusionGraph) -> bool:
    return not (graph.mutations or graph.scalar_outputs or len(set(graph.outputs)) < len(graph.outputs)
                or any(i.final_layout is not None for i in graph.inputs))


def plain_outputs(graph: FusionGraph, constants: set[str]) -> bool:
    """Whether the outputs can be handed back as they are (no ``finish``): no input is mutated,
    no input changes its layout, no output is handed back as a number, no output was a view in
    the original program, and no output may share a storage with an input or with another
    output (every one is a buffer the program made for it alone)."""
    if not _nothing_else(graph) or any(a is not None for a in graph.output_aliases):
        return False
    return _own_buffers(graph, constants, list(graph.outputs))


def views_of_outputs(graph: FusionGraph, constants: set[str]) -> list[tuple[int, int, TensorMeta, TensorMeta]] | None:
    """Note [outputs that are views of outputs]: per output that was a view, (its position, its
    base output's position, its layout, the base's layout), where every view is one of an output
    that is no view and nothing else needs ``finish``; else None."""
    if not _nothing_else(graph) or all(a is None for a in graph.output_aliases):
        return None
    metas = graph.metas
    views = []
    for k, (o, a) in enumerate(zip(graph.outputs, graph.output_aliases)):
        if a is None:
            continue
        if a.source != "output" or graph.output_aliases[a.index] is not None:
            return None
        layout, base = a.layout or metas[o], metas[graph.outputs[a.index]]
        if layout.dtype != base.dtype or layout.conj or layout.neg or base.conj or base.neg:
            return None  # (finish makes those with ``set_`` and the bits: left to it)
        views.append((k, a.index, layout, base))
    own = [o for o, a in zip(graph.outputs, graph.output_aliases) if a is None]
    return views if _own_buffers(graph, constants, own) else None


def views_test(code: Code, outs: list[str], views: list[tuple[int, int, TensorMeta, TensorMeta]]) -> str:
    """A Python expression: every view output lies in its base's storage at its recorded layout,
    and each base at its own (``outs``: the outputs' variables)."""
    tests: list[str] = []
    bases: set[int] = set()
    for k, j, layout, base in views:
        if j not in bases:
            bases.add(j)
            tests.append(f"{outs[j]}.storage_offset() == {code.value(base.storage_offset)} and "
                         f"{outs[j]}.stride() == {code.value(base.stride)}")
        tests.append(f"{outs[k]}.untyped_storage()._cdata == {outs[j]}.untyped_storage()._cdata and "
                     f"{outs[k]}.storage_offset() == {code.value(layout.storage_offset)} and "
                     f"{outs[k]}.stride() == {code.value(layout.stride)}")
    return " and ".join(tests)
