"""The values dynamo and AOTAutograd computed for a graph's nodes, in our symbols (issue 41).

Note [dynamo's values, translated]: a graph that AOTAutograd hands a backend already carries, in
every node's ``meta['val']``, the FakeTensor (or SymInt) it computes, with sizes over dynamo's
symbols. A symbolic plan (Note [symbolic plans] in segmenter/ir/symbolic.py) needs those values over
its own symbols. It used to get them by running the graph again, node by node, on FakeTensors of
its own ShapeEnv (Note [symbolic graphs propagated, not retraced] in segmenter/capturing/fx_import.py):
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
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils import _pytree as pytree

from ..ir.graph import TensorMeta
from ..ir.symbolic import NotSymbolic, SymbolicSizes, SymbolSource
from .meta import fakeable
from .storages import storage_ids

__all__ = ["Translated", "symbolic_inputs", "translated"]


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


# -- inputs ---------------------------------------------------------------------------------

# Note [number inputs]: dynamo lifts the ints a function takes (``dynamic=True``: a slice bound,
# a step) into graph inputs with symbolic values, as it does sizes. Such a number is no tensor's
# size: it may be negative, and 0 or 1 is no special case, so its symbol is made without the
# assumptions of a size. A FusionGraph's inputs are tensors; a symbolic program takes the numbers
# its sizes need after its tensors (``number_inputs``, in placeholder order), and the
# torch.compile backend passes them there.

def symbolic_inputs(placeholders: Sequence[Any], args: Sequence[Any]) -> tuple[SymbolicSizes, list[Any]]:
    """Our symbols for the symbols of ``placeholders`` (the graph's placeholder values: dynamo's
    FakeTensors and SymInts), hinted by the first call's ``args``, and FakeTensors (SymInts for
    number inputs) of our ShapeEnv with each placeholder's symbolic layout. Raises NotSymbolic
    where the arguments do not have the layouts the placeholders say (then the graph is
    specialized)."""
    sizes = SymbolicSizes()
    ours: dict[sympy.Symbol, sympy.Expr] = {}

    def expr_of(v: object) -> sympy.Expr:
        if isinstance(v, torch.SymInt):
            if free_unbacked_symbols(v):
                raise NotSymbolic(f"a data-dependent size {v}")
            return v.node.expr
        return sympy.Integer(int(v))

    # symbols first, from every place a placeholder's size is one bare symbol of dynamo's: a
    # symbol some tensor has as a size is a size (from its first such place); one only numbers
    # are is a number (a slice bound may be negative: Note [number inputs])
    found: dict[sympy.Symbol, tuple[int, SymbolSource]] = {}
    for i, (v, a) in enumerate(zip(placeholders, args)):
        pairs: list[tuple[object, object, int | None]] = []
        if isinstance(v, torch.SymInt):
            pairs.append((v, a, None))
        elif isinstance(v, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.dim() != v.dim():
                raise NotSymbolic(f"argument {i} is not a tensor of rank {v.dim()}")
            pairs.extend((s, n, d) for d, (s, n) in enumerate(zip(v.shape, a.shape)))
        for s, actual, dim in pairs:
            e = expr_of(s)
            if isinstance(e, sympy.Symbol) and (e not in found or (dim is not None and found[e][1].dim is None)):
                if not isinstance(actual, int) or isinstance(actual, bool):
                    raise NotSymbolic(f"argument {i} is a {type(actual).__name__} where the graph takes a size")
                found[e] = (int(actual), SymbolSource(i, dim))
    for e, (actual, src) in found.items():
        ours[e] = sizes.symbol(actual, src, number=src.dim is None)
    sizes.from_dynamo = ours

    def value(s: object, hint: int, what: str) -> int | torch.SymInt:
        e = expr_of(s)
        if not e.free_symbols <= set(ours):
            raise NotSymbolic(f"{what}: {e} has a symbol that no input size gives")
        sub = e.xreplace(ours)
        got = sympy.sympify(sub.xreplace({k: sympy.Integer(v) for k, v in sizes.hints.items()}))
        if not got.is_number or int(got) != hint:
            raise NotSymbolic(f"{what}: the argument has {hint} where the graph says {e}")
        return sizes.symint(sub, hint)

    fakes: list[Any] = []
    bases: dict[int, torch.Tensor] = {}
    tensor_args = [a for a in args if isinstance(a, torch.Tensor)]
    storage_of = dict(zip(map(id, tensor_args), storage_ids(tensor_args)))
    extents: dict[int, Any] = {}
    layouts: list[tuple | None] = []
    for i, (v, a) in enumerate(zip(placeholders, args)):
        if isinstance(v, torch.SymInt):
            layouts.append(None)
            continue
        if not isinstance(v, torch.Tensor):
            layouts.append(None)
            continue
        if a.layout != torch.strided:
            raise NotSymbolic(f"argument {i} is a {a.layout} tensor")
        shape = tuple(value(s, n, f"argument {i} size {d}") for d, (s, n) in enumerate(zip(v.shape, a.shape)))
        stride = tuple(value(s, n, f"argument {i} stride {d}") for d, (s, n) in enumerate(zip(v.stride(), a.stride())))
        offset = value(v.storage_offset(), a.storage_offset(), f"argument {i} storage offset")
        layouts.append((shape, stride, offset))
        extent = offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))
        key = storage_of[id(a)]
        extents[key] = extent if key not in extents else torch.sym_max(extents[key], extent)
    with sizes.mode:
        for i, (v, a) in enumerate(zip(placeholders, args)):
            if isinstance(v, torch.SymInt):
                fakes.append(value(v, a, f"argument {i}"))
                continue
            if not isinstance(v, torch.Tensor):
                fakes.append(a)
                continue
            shape, stride, offset = layouts[i]
            key = storage_of[id(a)]
            if key not in bases:
                bases[key] = torch.empty(extents[key], dtype=a.dtype, device=fakeable(str(a.device)))
            t = bases[key].as_strided(shape, stride, offset)
            if a.requires_grad:
                t.requires_grad_(True)
            fakes.append(t)
    return sizes, fakes
