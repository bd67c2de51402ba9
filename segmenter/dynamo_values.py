"""The values dynamo and AOTAutograd computed for a graph's nodes, in our symbols (issue 41).

Note [dynamo's values, translated]: a graph that AOTAutograd hands a backend already carries, in
every node's ``meta['val']``, the FakeTensor (or SymInt) it computes, with sizes over dynamo's
symbols. A symbolic plan (Note [symbolic plans] in segmenter/symbolic.py) needs those values over
its own symbols. It used to get them by running the graph again, node by node, on FakeTensors of
its own ShapeEnv (Note [symbolic graphs propagated, not retraced] in segmenter/fx_import.py):
torch's meta kernels asked every size question again, ~3900 SymNode operations and 0.34-0.50 s
for a tiny causal LM's two graphs at its second prompt length, a third of what a new length cost
beyond ``aot_eager``. The answers are dynamo's already: ``symbolic_inputs`` maps each of dynamo's
symbols to one of ours, so each value is translated instead (``xreplace`` of its expressions,
memoized per expression), with no meta kernel run.

Why no condition is lost: every size question torch's meta kernels asked while AOTAutograd traced
the graph was answered in dynamo's ShapeEnv and became one of dynamo's guards (or a replacement
that is folded into the expressions). Dynamo checks its guards before it calls the compiled graph,
so every call that reaches a plan meets them; the plan's own conditions cover what our passes ask
after (segmentation, aliases, kernel choices), as before.

A node value is a TensorMeta (its layout and dtype: what ``convert_graph`` reads), a SymInt of
ours, a plain number, or a tuple of those. Which outputs share a storage with an input or an
earlier output is read from dynamo's own FakeTensors (their storages are the graph's).

Where anything is not plain (a node without a value, a data-dependent or float size, a symbol no
input gives, a call whose tensors share storages otherwise than dynamo's placeholders do, a SymInt
literal in a node's arguments), ``translated`` returns None and the caller runs the graph on
FakeTensors as before: never a guess. tests/test_dynamo_values.py checks every graph it makes
against the propagated one (the dynamic-shape programs, a Llama's training graphs, a Qwen2's
generation graphs).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils import _pytree as pytree

from .ir import TensorMeta
from .meta import fakeable
from .symbolic import SymbolicSizes

__all__ = ["Translated", "translated"]


class _Untranslatable(Exception):
    """A value the translation does not take (the caller propagates instead)."""


class Translated:
    """A copy of the graph whose nodes carry translated values, with what ``from_fx`` reads
    aliases from: dynamo's FakeTensors of the inputs and the outputs (their storages are the
    graph's), and ``meta``, a FakeTensor of dynamo's as a TensorMeta of ours."""

    def __init__(self, gm: fx.GraphModule, inputs: list[object], outputs: list[object], sizes: _Sizes) -> None:
        self.gm = gm
        self.inputs = inputs
        self.outputs = outputs
        self.meta = sizes.meta


class _Sizes:
    """Dynamo's sizes as ours, memoized per expression."""

    def __init__(self, sizes: SymbolicSizes) -> None:
        self.sizes = sizes
        self.table: dict[sympy.Symbol, sympy.Expr] = sizes.from_dynamo
        self.hints = {s: sympy.Integer(v) for s, v in sizes.hints.items()}
        self.memo: dict[sympy.Expr, int | torch.SymInt] = {}

    def size(self, s: object) -> int | torch.SymInt:
        if isinstance(s, bool):
            raise _Untranslatable("a bool where a size is")
        if isinstance(s, int):
            return int(s)
        if not isinstance(s, torch.SymInt):
            raise _Untranslatable(f"a {type(s).__name__} where a size is")
        maybe = s.node.maybe_as_int()
        if maybe is not None:
            return int(maybe)
        e = s.node.expr  # with dynamo's replacements applied
        got = self.memo.get(e)
        if got is None:
            if free_unbacked_symbols(s):
                raise _Untranslatable(f"a data-dependent size {e}")
            if not e.free_symbols <= self.table.keys():
                raise _Untranslatable(f"{e} has a symbol that no input gives")
            ours = e.xreplace(self.table)
            hint = sympy.sympify(ours.xreplace(self.hints))
            if not hint.is_number:  # pragma: no cover - every symbol of ours has a hint
                raise _Untranslatable(f"{e}: no hint")
            got = self.sizes.symint(ours, int(hint))
            self.memo[e] = got
        return got

    def meta(self, t: torch.Tensor) -> TensorMeta:
        return TensorMeta(tuple(self.size(n) for n in t.shape), tuple(self.size(n) for n in t.stride()),
                          self.size(t.storage_offset()), t.dtype, fakeable(str(t.device)),
                          bool(t.is_conj()), bool(t.is_neg()))

    def value(self, v: object) -> object:
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided:
                raise _Untranslatable(f"a {v.layout} tensor")
            return self.meta(v)
        if isinstance(v, torch.SymInt):
            return self.size(v)
        if isinstance(v, (torch.SymFloat, torch.SymBool)):
            raise _Untranslatable(f"a {type(v).__name__}")
        if isinstance(v, (list, tuple)):
            return type(v)(self.value(x) for x in v) if isinstance(v, tuple) else [self.value(x) for x in v]
        if v is None or isinstance(v, (bool, int, float)):
            return v
        raise _Untranslatable(f"a value of type {type(v).__name__}")


def _literal_symbols(a: object) -> bool:
    """Whether a node argument holds a SymInt literal (not a node): dynamo's, untranslated."""
    return any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in pytree.tree_leaves(a))


def translated(gm: fx.GraphModule, sizes: SymbolicSizes, placeholders: Sequence[object],
               storages: Sequence[int]) -> Translated | None:
    """See Note [dynamo's values, translated]: a copy of ``gm`` whose nodes' ``meta['val']`` are
    their values in ``sizes``' symbols, or None where the graph's values are not all plain.
    ``placeholders`` are the graph's placeholder values as dynamo gave them (its FakeTensors);
    ``storages``, which of the call's tensor arguments share a storage (``storage_ids``)."""
    from .fx_import import storage_ids

    if not sizes.from_dynamo:
        return None
    tensors = [t for t in placeholders if isinstance(t, torch.Tensor)]
    if storage_ids(tensors) != list(storages):
        return None  # the call's tensors share storages otherwise than dynamo's: aliases would differ
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = fx.GraphModule(gm, graph)
    ours = _Sizes(sizes)
    try:
        for n in copy.graph.nodes:
            if n.op in ("output", "get_attr", "placeholder"):
                if n.op == "output" and _literal_symbols(n.args):
                    raise _Untranslatable("a SymInt literal among the outputs")
                continue
            if "val" not in n.meta:
                raise _Untranslatable(f"node {n.name!r} has no value")
            if _literal_symbols((n.args, n.kwargs)):
                raise _Untranslatable(f"node {n.name!r}: a SymInt literal in its arguments")
            n.meta["val"] = ours.value(n.meta["val"])
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        outputs = [x.meta.get("val") if isinstance(x, fx.Node) else x for x in pytree.tree_leaves(out_node.args)]
        for v in (*placeholders, *outputs):  # every layout ``meta`` will be asked for is translated now
            ours.value(v)
    except _Untranslatable:
        return None
    return Translated(copy, list(placeholders), outputs, ours)

