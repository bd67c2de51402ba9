"""The graph an nvFuser fusion script becomes: values, ATen nodes run on FakeTensors, and the
frontend's type promotion. segmenter/formats/nvfuser/ops.py says which nodes each frontend op emits;
segmenter/formats/nvfuser/importer.py reads the script and binds its inputs.

Every node is built from an op name of the fixed tables in segmenter/formats/nvfuser/ops.py, never from
a name in the file, and run on FakeTensors as it is added: its metas are torch's own, and an op
torch refuses (a shape that does not broadcast, a squeeze of a dim that is not 1) is refused with
the script's line and call named. Where the fusion's sizes are symbolic (Note [symbolic dims of
a fusion] in segmenter/formats/nvfuser/sizes.py) the FakeTensors are those of the plan's ShapeEnv and
run through the Python dispatcher: every size a node computes is a SymInt, and every question
torch asks of one is a condition of the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, Union

import torch

from ...capturing.meta import fake_mode, fakeable, quiet_fake_errors, shallow
from ...capturing.recorded import check_recorded_effects
from ...ir.graph import Alias, FusionGraph, GraphInput, Mutation, Node, TensorMeta, ValueRef, view_roots
from ...ir.limits import MAX_BYTES, MAX_DIM, MAX_RANK, view_depth_problem
from ...ir.ops import OpKind, op_info, resolve_op
from ...ir.symbolic import SymbolicSizes, is_symbolic, size_hint
from ..serialize import GraphFormatError

__all__ = ["MAX_NODES", "NULL", "Args", "Builder", "Const", "FrontendOp", "TVal", "Value", "Vec", "nv_promote"]

MAX_NODES = 200_000  # a Thunder fusion has hundreds of ops; a million is a broken or hostile file
NULL = "Null"  # DataType.Null: "no dtype given"


@dataclass(frozen=True)
class TVal:
    """A tensor value of the graph. ``scalar``: an nvFuser scalar input, carried as a 0-dim tensor
    (it promotes as a scalar does). ``copy``: made by ``set``, ``segment_set`` or a cast to its own
    dtype, which nvFuser runs as copies: an output made from it is never a view of an input."""

    name: str
    scalar: bool = False
    copy: bool = False


@dataclass(frozen=True)
class Const:
    """A scalar the script defines with a value: folded, never a graph input. A size read back
    (``fd.ops.size``, ``T.shape()``) of a symbolic dim is a SymInt: kept as one where it is a
    size again (a shape, a slice bound), made a number where it is a tensor's value (``number``)."""

    value: bool | int | float | complex | torch.SymInt
    dtype: torch.dtype

    def number(self) -> Const:
        """This scalar where a number is needed: a symbolic size is pinned to its hint, which the
        plan records as a condition (Note [symbolic plans] in segmenter/ir/symbolic.py)."""
        return Const(int(self.value), self.dtype) if isinstance(self.value, torch.SymInt) else self


@dataclass(frozen=True)
class Vec:
    """``fd.define_vector``, ``T.shape()``: a list of scalars."""

    items: tuple[Const | TVal, ...]


Value = Union[TVal, Const, Vec]  # noqa: UP007 - a runtime alias

_LOW_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2})


def _promote(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None or b is None:
        return a if b is None else b
    return torch.promote_types(a, b)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    """nvFuser's ``combineCategories``: the higher-priority class wins unless the lower one is of a
    higher category (bool < integer < floating < complex)."""
    if higher is not None and higher.is_complex:
        return higher
    if lower is not None and lower.is_complex:
        if higher is not None and higher.is_floating_point:
            return torch.complex128 if higher == torch.float64 else torch.complex64
        return lower
    if higher is not None and higher.is_floating_point:
        return higher
    if higher == torch.bool or (lower is not None and lower.is_floating_point):
        return _promote(higher, lower)
    return higher if higher is not None else lower


def nv_promote(operands: Sequence[tuple[torch.dtype, str]]) -> torch.dtype:
    """The common dtype nvFuser computes (``computeTypes`` in csrc/type_promotion.cpp) for
    operands given as (dtype, "dim" | "zero" | "scalar"). Note [scalars promote as nvFuser's]:
    torch reads a Python float as its default dtype (float32), nvFuser reads a scalar with its own
    dtype (a Double scalar times an int tensor is Double in nvFuser, float32 in torch), so the
    builder computes nvFuser's dtype and casts where torch would compute another."""
    dtypes = {d for d, _ in operands}
    if len(dtypes) == 1:
        return next(iter(dtypes))
    slots: dict[str, torch.dtype | None] = {"dim": None, "zero": None, "scalar": None}
    for dtype, kind in operands:
        if kind == "scalar" and dtype in _LOW_FLOATS:
            dtype = torch.float32
        slots[kind] = _promote(slots[kind], dtype)
    out = _combine(slots["dim"], _combine(slots["zero"], slots["scalar"]))
    assert out is not None
    return out


class Builder:
    """Values and nodes of the graph being read; ``line`` and ``call`` name the script's call
    in every message."""

    def __init__(self, name: str, device: str, sizes: SymbolicSizes | None = None) -> None:
        self.name, self.device, self.sizes = name, device, sizes
        self.mode = fake_mode() if sizes is None else sizes.mode
        self.inputs: list[GraphInput] = []
        self.nodes: list[Node] = []
        self.fakes: dict[str, torch.Tensor] = {}
        self.metas: dict[str, TensorMeta] = {}
        self.line, self.call, self.label = 0, "", "v"
        self._taken: set[str] = set()

    # -- messages and names -----------------------------------------------------------------

    def fail(self, message: str) -> NoReturn:
        raise GraphFormatError(f"line {self.line}: {self.call}: {message}")

    def text(self, shape: Sequence[int | torch.SymInt]) -> str:
        """A shape for a message: symbolic sizes by their names (``[T0_0, 8]``)."""
        return "[" + ", ".join(self.size_text(n) for n in shape) + "]"

    def size_text(self, n: int | torch.SymInt) -> str:
        return str(n) if self.sizes is None else self.sizes.text(n)

    def named(self, text: str) -> str:
        """torch's message with the ShapeEnv's symbols (``s92``) by their names (``T1_0``)."""
        if self.sizes is None:
            return text
        names = {str(s): n for s, n in self.sizes.display.items()}
        return re.sub(r"\b[su]\d+\b", lambda m: names.get(m.group(0), m.group(0)), text)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Within: ops run on this graph's FakeTensors (through the Python dispatcher where sizes
        are symbolic, as AOTAutograd traces: a C++ composite would make each size a number)."""
        with self.mode, quiet_fake_errors():
            if self.sizes is None:
                yield
                return
            from torch._dispatch.python import enable_python_dispatcher

            with enable_python_dispatcher():
                yield

    def fresh(self) -> str:
        """A value name from the script's own name for the call's result (``T5``, ``T5_1``)."""
        name, k = self.label, 0
        while name in self._taken:
            k += 1
            name = f"{self.label}_{k}"
        self._taken.add(name)
        return name

    # -- values ------------------------------------------------------------------------------

    def add_input(self, meta: TensorMeta, scalar: bool = False, name: str | None = None) -> TVal:
        """A graph input of layout ``meta`` (named ``name``, from ``fresh``, else fresh now). Its
        bytes are bounded, at the hints where sizes are symbolic (Note [symbolic dims of a fusion])."""
        extent = meta.numel if is_symbolic(meta) else meta.storage_extent  # a symbolic layout is dense
        if size_hint(extent) * meta.itemsize >= MAX_BYTES:
            self.fail(f"an input of {self.text(meta.shape)} addresses {size_hint(extent) * meta.itemsize} bytes "
                      f"(at most {MAX_BYTES})")
        name = name or self.fresh()
        self.inputs.append(GraphInput(name, meta))
        with self.running():  # a FakeTensor: no memory, whatever the size
            base = torch.empty(torch.sym_max(extent, 1), dtype=meta.dtype, device=fakeable(meta.device))
            self.fakes[name] = base.as_strided(meta.shape, meta.stride, meta.storage_offset)
        self.metas[name] = meta
        return TVal(name, scalar=scalar)

    def meta(self, v: TVal) -> TensorMeta:
        return self.metas[v.name]

    def kind(self, v: TVal | Const) -> tuple[torch.dtype, str]:
        """(dtype, promotion class) of an operand (Note [scalars promote as nvFuser's])."""
        if isinstance(v, Const) or v.scalar:
            return (v.dtype if isinstance(v, Const) else self.meta(v).dtype), "scalar"
        return self.meta(v).dtype, ("dim" if self.meta(v).ndim else "zero")

    def input_index(self, v: TVal) -> int | None:
        return next((i for i, inp in enumerate(self.inputs) if inp.name == v.name), None)

    # -- nodes -------------------------------------------------------------------------------

    def _node_arg(self, a: object) -> object:
        if isinstance(a, TVal):
            return ValueRef(a.name)
        if isinstance(a, Const):
            return a.value
        if isinstance(a, (list, tuple)):
            return tuple(self._node_arg(x) for x in a)
        return a

    def _fake(self, a: object) -> object:
        if isinstance(a, ValueRef):
            return self.fakes[a.name]
        if isinstance(a, tuple):
            return [self._fake(x) for x in a]
        return a

    def emit(self, op: str, *args: object, n: int = 1, **kwargs: object) -> TVal:
        """Add one node of ``op`` (a name from segmenter/formats/nvfuser/ops.py's tables) and run it on
        FakeTensors; its first output (``emit_all`` for every output)."""
        return self.emit_all(op, *args, n=n, **kwargs)[0]

    def emit_all(self, op: str, *args: object, n: int = 1, **kwargs: object) -> list[TVal]:
        if len(self.nodes) >= MAX_NODES:
            self.fail(f"more than {MAX_NODES} nodes")
        overload = resolve_op(op)
        assert overload is not None, op  # the tables name real ops only
        node_args = tuple(self._node_arg(a) for a in args)
        node_kwargs = tuple((k, self._node_arg(v)) for k, v in kwargs.items())
        with self.running():
            try:
                result = overload(*[self._fake(a) for a in node_args], **{k: self._fake(v) for k, v in node_kwargs})
            except Exception as e:  # noqa: BLE001 - torch's own refusal, said with the script's line
                self.fail(f"{type(e).__name__}: {self.named((str(e).splitlines() or [''])[0][:300])}")
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        assert len(results) == n, (op, len(results))
        for r in results:  # sizes are bounded as a graph file's are (segmenter/ir/limits.py), at the hints
            if size_hint(r.numel()) * r.element_size() >= MAX_BYTES:
                self.fail(f"a {r.dtype} result of {self.text(r.shape)}: {size_hint(r.numel()) * r.element_size()} bytes "
                          f"(at most {MAX_BYTES})")
        names = [self.fresh() for _ in results]
        metas = []
        for name, r in zip(names, results):
            self.fakes[name] = shallow(r)
            self.metas[name] = TensorMeta.from_tensor(r)
            metas.append(self.metas[name])
        self.nodes.append(Node(names[0], op, node_args, node_kwargs, tuple(names), tuple(metas)))
        tensors = [a for a in args if isinstance(a, TVal)]
        scalar = bool(tensors) and all(a.scalar for a in tensors)
        copy = op_info(op).kind == OpKind.VIEW and any(a.copy for a in tensors)  # a view of a copy is one
        return [TVal(name, scalar=scalar, copy=copy) for name in names]

    def cast(self, v: TVal, dtype: torch.dtype) -> TVal:
        if self.meta(v).dtype == dtype:
            return v
        return dataclasses.replace(self.emit("aten._to_copy.default", v, dtype=dtype), scalar=v.scalar)

    # -- the graph ---------------------------------------------------------------------------

    def _drop_dead(self, live: set[str]) -> None:
        """Nodes no output or write-back reads (nvFuser computes only what its outputs need)."""
        kept = []
        for node in reversed(self.nodes):
            if any(o in live for o in node.outputs if o is not None):
                kept.append(node)
                live.update(node.inputs)
        self.nodes = kept[::-1]

    def graph(self, outputs: Sequence[TVal], mutations: Sequence[Mutation]) -> FusionGraph:
        """The finished graph.

        Note [outputs that are views of inputs]: an output made from an input by view ops only is
        handed back as a view of it, as nvFuser's own alias analysis does (its "no_op" segments);
        not where the input is written in place (the view would see the write) and not where a
        copy (``set``, a cast to the same dtype) is on the way."""
        problem = view_depth_problem(self.nodes)
        if problem is not None:
            raise GraphFormatError(problem)
        if not outputs and not mutations:
            raise GraphFormatError("the fusion adds no output (fd.add_output)")
        self._drop_dead({o.name for o in outputs} | {m.value for m in mutations})
        draft = FusionGraph(tuple(self.inputs), tuple(self.nodes), tuple(o.name for o in outputs),
                            mutations=tuple(mutations), name=self.name)
        roots = view_roots(draft, include_maybe_copies=False)
        written = {m.input for m in mutations}
        names, aliases = [], []
        for o in outputs:
            k = self.input_index(TVal(roots.get(o.name, o.name)))
            if k is not None and k not in written and not o.copy:
                names.append(o.name)
                aliases.append(Alias("input", k, self.metas[o.name]))
                continue
            if self.input_index(o) is not None:  # the input itself, returned as a copy
                o = self.emit("aten.clone.default", o)
            names.append(o.name)
            aliases.append(None)
        graph = FusionGraph(tuple(self.inputs), tuple(self.nodes), tuple(names), tuple(aliases), tuple(mutations),
                            name=self.name)
        check_recorded_effects(graph)  # defense in depth: each claim proved against the ops
        return graph


class Args:
    """A call's arguments by name, with checked getters that fail naming the call."""

    def __init__(self, b: Builder, values: dict[str, object]) -> None:
        self.b, self.values = b, values

    def get(self, key: str) -> object:
        return self.values.get(key)

    def tensor(self, key: str) -> TVal:
        v = self.values.get(key)
        if not isinstance(v, TVal) or v.scalar:
            self.b.fail(f"{key} must be a tensor, got {_what(v)}")
        return v

    def operand(self, key: str, sizes: bool = False) -> TVal | Const:
        """A tensor or a scalar; a symbolic size read back made a number (``Const.number``)
        unless ``sizes``: the caller folds it as a size (segmenter/formats/nvfuser/ops.py: ``fold``)."""
        v = self.values.get(key)
        if isinstance(v, bool | int | float | complex):  # a bare number: the scalar nvFuser would make of it
            v = Const(v, _py_dtype(v))
        if not isinstance(v, TVal | Const):
            self.b.fail(f"{key} must be a tensor or a scalar, got {_what(v)}")
        return v if sizes or isinstance(v, TVal) else v.number()

    def int(self, key: str, lo: int = -MAX_DIM, hi: int = MAX_DIM, sizes: bool = False) -> int:
        """An integer in [lo, hi]. ``sizes``: a symbolic size is taken as it is (a shape, a slice
        bound: the range checks are conditions of the plan); elsewhere it is made a number."""
        v = self.values.get(key)
        if isinstance(v, Const) and v.dtype in (torch.int64, torch.int32):
            v = v.value
        if isinstance(v, torch.SymInt) and not sizes:
            v = int(v)  # a number is needed here: pinned, a condition of the plan
        if isinstance(v, torch.SymInt):  # bounded at its hint (torch's ops decide on it as a size)
            if not lo <= size_hint(v) <= hi:
                self.b.fail(f"{key} must be an integer in [{lo}, {hi}], got {self.b.size_text(v)} = {size_hint(v)}")
            return v  # type: ignore[return-value]
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            self.b.fail(f"{key} must be an integer in [{lo}, {hi}], got {_what(v)}")
        return v

    def ints(self, key: str, lo: int = -MAX_DIM, hi: int = MAX_DIM, most: int = MAX_RANK,
             sizes: bool = False) -> tuple[int, ...]:
        v = self.values.get(key)
        items = v.items if isinstance(v, Vec) else v
        if not isinstance(items, tuple) or len(items) > most:
            self.b.fail(f"{key} must be a list of at most {most} integers, got {_what(v)}")
        out = []
        for k, x in enumerate(items):
            if isinstance(x, TVal):
                self.b.fail(f"{key}[{k}] comes from a scalar input: sizes must be known when the graph is built")
            out.append(Args(self.b, {f"{key}[{k}]": x}).int(f"{key}[{k}]", lo, hi, sizes))
        return tuple(out)

    def flag(self, key: str) -> bool:
        v = self.values.get(key)
        if v in (0, 1) and not isinstance(v, float):  # Thunder writes manual_normalization=0
            return bool(v)
        self.b.fail(f"{key} must be True or False, got {_what(v)}")

    def dtype(self, key: str, null_ok: bool = False) -> torch.dtype | None:
        v = self.values.get(key)
        if null_ok and v in (None, NULL):
            return None
        if not isinstance(v, torch.dtype):
            self.b.fail(f"{key} must be a DataType, got {_what(v)}")
        return v

    def dim(self, key: str, ndim: int) -> int:
        """One dim of a rank-``ndim`` tensor, negative from the end; normalized."""
        return self.int(key, -max(ndim, 1), max(ndim, 1) - 1) % max(ndim, 1)

    def dims(self, key: str, ndim: int) -> tuple[int, ...]:
        v = self.values.get(key)
        if isinstance(v, int | Const) and not isinstance(v, bool):  # one dim, as the int overloads take it
            self.values[key] = (v,)
        dims = self.ints(key, -max(ndim, 1), max(ndim, 1) - 1)
        norm = tuple(d % ndim if ndim else 0 for d in dims)
        if len(set(norm)) != len(norm):
            self.b.fail(f"{key} {list(dims)} names a dim twice")
        return norm


def _what(v: object) -> str:
    if isinstance(v, TVal):
        return "a scalar input" if v.scalar else "a tensor"
    if isinstance(v, Const):
        return f"the scalar {v.value!r}"
    if isinstance(v, Vec):
        return f"a vector of {len(v.items)}"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _py_dtype(v: object) -> torch.dtype:
    return {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}[type(v)]


@dataclass(frozen=True)
class FrontendOp:
    """A frontend op: its argument names in order, defaults of the optional ones, names it also
    answers to (``dim`` for ``dims``), and the builder."""

    params: tuple[str, ...]
    build: Callable[[Args], Value | tuple[Value, ...] | None]
    defaults: dict[str, object] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
