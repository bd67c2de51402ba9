"""Segments as nvFuser FusionDefinition scripts (``fuseg export TARGET --format nvfuser``).

Each kernel segment the nvFuser lowering takes (runtime/backends/nvfuser.py) becomes a
``def fusion_<k>(fd: FusionDefinition)`` written by the lowering itself: it is driven here with a
recording stand-in for the ``nvfuser`` module, so the script is exactly what the backend would
build. ``run(inputs)`` at the end of the file runs the segmentation with the reader's nvFuser:
each such segment as one fusion, the metadata segments as torch views, the rest (OPAQUE segments,
kernels the lowering declines) as their ATen ops, and the write-backs into mutated inputs.

Note [exported fusions take planned layouts]: a fusion's inputs are defined with the strides the
plan gives them, so that a fusion reads a slice or a broadcast where it lies, as the plan's
kernel would (a layout that overlaps itself, past its broadcast dims, is defined dense instead).
nvFuser lays its own outputs out as it likes, so ``run`` relies on no planned stride: views are
made with view ops (a ``view`` as ``reshape``), never with ``as_strided``, and each fusion's inputs
are handed over in the layout it defines (a copy only where a value has another).

Importing a segment's script (``segmenter.from_nvfuser``) gives back the segment: the same ops
once casts to a value's own dtype are dropped, and the same values (tests/test_nvfuser_export.py).

Note [exported symbolic sizes]: a plan whose sizes are symbolic (Note [symbolic plans] in
segmenter/ir/symbolic.py) is written as nvFuser writes its own fusions: an input with a symbolic dim
is ``define_tensor(shape=[-1, ...], contiguity=[...], stride_order=[...])`` (contiguity True
where a stride is the product its inner dim makes, for every size), and a size an op takes (a
reshape's shape, a slice's end) is a scalar computed in the fusion from its inputs' sizes
(``fd.ops.size(T0, 1)``, ``fd.ops.mul``, ``fd.ops.div``), so one fusion takes every size. The
lowering runs on the SymInts (``c_sizes``); a segment where it needs a number (a mean's count)
pins a symbol, and such a segment is written to run on torch instead. ``run(inputs)`` reads the
symbols from its inputs' sizes, refuses inputs where the plan's conditions do not hold, and makes
views and strides as expressions of them (the tests read the fusions back with their symbols).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch

from segmenter import FusionGraph, GraphInput, Segment, SegmentedFusion, SegmentKind, TensorMeta
from segmenter.capturing.recorded import overlaps_itself
from segmenter.formats.nvfuser.ops import DTYPES, OPS
from segmenter.formats.nvfuser.script import DType, Ref
from segmenter.ir.graph import OpRef, ValueRef
from segmenter.ir.ops import op_name_problem, resolve_op
from segmenter.ir.symbolic import NotSymbolic, SymbolicSizes, size_hint, size_key, sizes_of
from segmenter.partition.explain import describe_sizes

from .backends.nvfuser import lower_to_nvfuser
from .codegen import Declined
from .codegen.source.symsizes import c_sizes

__all__ = ["ExportedSegment", "NvFuserExport", "defined_strides", "export_nvfuser", "packed_strides", "segment_graph"]

_HEADER = "import torch\nfrom nvfuser import FusionDefinition, DataType\n"
_MULTI = {"var_mean": 2}  # frontend ops returning several tensors
# planned views, made layout-agnostic: nvFuser's outputs need not have the planned strides
_VIEW_AS = {"aten.view.default": "aten.reshape.default", "aten._unsafe_view.default": "aten.reshape.default"}
_TORCH_NAMES = {v: k for k, v in vars(torch).items()
                if isinstance(v, torch.dtype | torch.layout | torch.memory_format) and not k.startswith("_")}


# -- the recording stand-in for ``nvfuser`` (its values and dtypes are the reader's Ref and DType) --

class _DataTypes:
    def __getattr__(self, name: str) -> DType:
        if name not in DTYPES:
            raise Declined(f"nvFuser export: DataType.{name}")
        return DType(name)


def _fmt(v: object) -> str:
    """Source text of a lowering argument: checked values only (Note [checked source values])."""
    if isinstance(v, Ref):
        return v.name
    if isinstance(v, DType):
        return f"DataType.{v.name}"
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        if not -(2**63) <= v < 2**63:
            raise Declined(f"nvFuser export: integer {v} beyond 64 bits")
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f'float("{v}")'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    raise Declined(f"nvFuser export: an argument of type {type(v).__name__}")


class _Recorder:
    """``nvfuser`` as the lowering uses it; every call becomes one line of the script. Symbolic
    sizes (Note [exported symbolic sizes]) become scalars the fusion computes from its inputs."""

    def __init__(self, sizes: SymbolicSizes | None = None) -> None:
        self.DataType = _DataTypes()
        self.lines: list[str] = []
        self.count = 0
        self.sizes = sizes
        self.dims: dict[sympy.Symbol, tuple[Ref, int]] = {}  # symbol -> an input dim of that size
        self.scalars: dict[sympy.Expr, Ref | int] = {}

    def FusionDefinition(self) -> _FusionDefinition:  # noqa: N802 - nvFuser's name
        return _FusionDefinition(self)

    def scalar(self, x: object) -> object:
        """``x`` with each symbolic size as the scalar the fusion computes (lists too)."""
        if isinstance(x, list | tuple):
            return type(x)(self.scalar(a) for a in x)
        if not isinstance(x, torch.SymInt):
            return x
        if self.sizes is None:
            raise Declined("nvFuser export: a symbolic size outside a symbolic plan")
        return self._expr(self.sizes.env.replace(x.node.expr))

    def _expr(self, e: sympy.Expr) -> Ref | int:
        if e.is_number:
            return int(e)
        if e in self.scalars:
            return self.scalars[e]
        from torch.utils._sympy.functions import FloorDiv

        if isinstance(e, sympy.Symbol):
            if e not in self.dims:
                raise Declined(f"nvFuser export: size {self.sizes.text(self.sizes.symint(e, 0))} is no input's "  # type: ignore[union-attr]
                               "dim in this fusion")
            tensor, dim = self.dims[e]
            out = self.call("ops.size", (tensor, dim), {}, prefix="S")
        elif isinstance(e, sympy.Add | sympy.Mul):
            op = "ops.add" if isinstance(e, sympy.Add) else "ops.mul"
            terms = [self._expr(a) for a in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = self.call(op, (out, t), {}, prefix="S")
        elif isinstance(e, FloorDiv) and all(a.is_nonnegative for a in e.args):  # (sizes are positive symbols)
            out = self.call("ops.div", tuple(self._expr(a) for a in e.args), {}, prefix="S")  # C's /: floor here
        else:
            raise Declined(f"nvFuser export: a size {e} ({type(e).__name__}) is not written as nvFuser scalars")
        self.scalars[e] = out  # type: ignore[assignment]
        return out  # type: ignore[return-value]

    def call(self, func: str, args: tuple, kwargs: dict, n: int = 1, prefix: str = "T") -> Ref | tuple[Ref, ...]:
        args, kwargs = self.scalar(args), {k: self.scalar(v) for k, v in kwargs.items()}
        text = ", ".join([*(_fmt(a) for a in args), *(f"{k}={_fmt(v)}" for k, v in kwargs.items())])
        outs = []
        for _ in range(n):
            outs.append(Ref(f"{prefix}{self.count}"))
            self.count += 1
        self.lines.append(f"{', '.join(o.name for o in outs)} = fd.{func}({text})")
        return outs[0] if n == 1 else tuple(outs)


class _Ops:
    def __init__(self, rec: _Recorder) -> None:
        self._rec = rec

    def __getattr__(self, name: str):  # noqa: ANN204 - returns the recording call
        if name not in OPS:  # only frontend ops the importer reads back
            raise Declined(f"nvFuser export: fd.ops.{name}")
        return lambda *args, **kwargs: self._rec.call(f"ops.{name}", args, kwargs, _MULTI.get(name, 1))


class _FusionDefinition:
    def __init__(self, rec: _Recorder) -> None:
        self.rec, self.ops = rec, _Ops(rec)

    def __enter__(self) -> _FusionDefinition:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def define_tensor(self, **kwargs: object) -> Ref:
        sizes, strides = kwargs["sizes"], kwargs["strides"]
        if self.rec.sizes is None or not any(isinstance(n, torch.SymInt) for n in (*sizes, *strides)):  # type: ignore[misc]
            return self.rec.call("define_tensor", (), kwargs)  # type: ignore[return-value]
        shape, contiguity, order = _symbolic_layout(self.rec.sizes, sizes, strides)  # type: ignore[arg-type]
        t = self.rec.call("define_tensor", (), {"shape": shape, "contiguity": contiguity, "dtype": kwargs["dtype"],
                                                "is_cpu": kwargs["is_cpu"], "stride_order": order})
        for d, n in enumerate(sizes):  # type: ignore[arg-type]
            e = self.rec.sizes.env.replace(n.node.expr) if isinstance(n, torch.SymInt) else None
            if isinstance(e, sympy.Symbol):
                self.rec.dims.setdefault(e, (t, d))  # type: ignore[arg-type]
        return t  # type: ignore[return-value]

    def define_scalar(self, value: object, dtype: object = None) -> Ref:
        return self.rec.call("define_scalar", (value,), {"dtype": dtype}, prefix="S")  # type: ignore[return-value]

    def add_output(self, value: Ref, alias_input: Ref | None = None) -> None:
        if alias_input is not None:
            raise Declined("nvFuser export: in-place outputs are written back by run()")
        self.rec.lines.append(f"fd.add_output({_fmt(value)})")


def _symbolic_layout(sizes: SymbolicSizes, shape: list, stride: list) -> tuple[list, list, list]:
    """``shape=``, ``contiguity=`` and ``stride_order=`` of an input with symbolic sizes (Note
    [exported symbolic sizes]): -1 for a symbolic dim; a dim contiguous where its stride is its
    inner dim's stride times that dim's size for every size (expressions compared, no condition),
    None for a dim of size 1; strides ranked at the hints."""
    ndim = len(shape)
    if any(size_key(st) == 0 and (isinstance(n, torch.SymInt) or n > 1) for n, st in zip(shape, stride)):
        raise Declined("nvFuser export: an input broadcast over a dim (stride 0) of symbolic sizes")
    ranked = sorted(range(ndim), key=lambda d: (size_hint(stride[d]), -d))  # innermost first
    order = [ranked.index(d) for d in range(ndim)]
    contiguity: list[bool | None] = [None] * ndim
    inner: sympy.Expr = sympy.Integer(1)
    for d in ranked:
        if not isinstance(shape[d], torch.SymInt) and shape[d] == 1:
            continue
        st = stride[d].node.expr if isinstance(stride[d], torch.SymInt) else sympy.Integer(stride[d])
        contiguity[d] = sympy.expand(sizes.env.replace(st) - inner) == 0
        n = shape[d].node.expr if isinstance(shape[d], torch.SymInt) else sympy.Integer(shape[d])
        inner = sympy.expand(sizes.env.replace(st * n))
    # nvFuser reads contiguity in allocation order, outermost first (Note [contiguity in allocation
    # order] in segmenter/formats/nvfuser/importer.py)
    in_allocation_order = [contiguity[d] for d in sorted(range(ndim), key=lambda d: -order[d])]
    return [-1 if isinstance(n, torch.SymInt) else n for n in shape], in_allocation_order, order


# -- segments -------------------------------------------------------------------------------------

def packed_strides(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """Dense row-major, but 0 where the planned stride is 0 on a dim of more than one element (a
    broadcast)."""
    out, acc = [0] * len(shape), 1
    for d in reversed(range(len(shape))):
        if shape[d] > 1 and stride[d] == 0:
            continue
        out[d] = acc
        acc *= max(shape[d], 1)
    return tuple(out)


def defined_strides(m: TensorMeta) -> tuple[int, ...]:
    """The strides an exported fusion defines an input with: Note [exported fusions take planned layouts]."""
    unbroadcast = TensorMeta(tuple(1 if st == 0 else n for n, st in zip(m.shape, m.stride)),
                             tuple(st or 1 for st in m.stride), 0, m.dtype)  # its broadcast dims left out
    if not overlaps_itself(unbroadcast):
        return m.stride
    return packed_strides(m.shape, m.stride)


@dataclass(frozen=True)
class ExportedSegment:
    index: int
    kind: SegmentKind
    function: str | None  # the fusion's function name; None where it runs on torch
    body: tuple[str, ...]  # its lines
    inputs: tuple[str, ...]  # segment values it takes, in define_tensor order
    returned: tuple[str, ...]  # segment values it outputs, in add_output order
    strides: tuple[tuple[int, ...], ...]  # each input's strides, as the fusion defines it
    reason: str  # why it runs on torch ("" for a fusion)

    def script(self) -> str:
        """A file of its own: the fusion alone, as a repro script is written."""
        assert self.function is not None
        return _HEADER + "\n\n" + self.source() + "\n"

    def source(self) -> str:
        return f"def {self.function}(fd: FusionDefinition) -> None:\n" + "".join(f"    {ln}\n" for ln in self.body)


def _export_segment(plan: SegmentedFusion, seg: Segment, sizes: SymbolicSizes | None) -> ExportedSegment:
    graph = plan.graph
    strides = {v: defined_strides(graph.metas[v]) for v in seg.inputs}
    if seg.kind == SegmentKind.METADATA:
        return ExportedSegment(seg.index, seg.kind, None, (), seg.inputs, seg.outputs, (), "views: no kernel")
    rec = _Recorder(sizes)
    pinned = dict(sizes.specializations()) if sizes is not None else {}
    try:
        if sizes is not None and any(_symbolic_mean(graph, n) for n in seg.nodes):
            raise Declined("nvFuser export: the lowering needs a number for a symbolic size (a mean's count)")
        with c_sizes(sizes):  # Note [exported symbolic sizes]
            _, returned = lower_to_nvfuser(rec, graph, seg, {}, strides)
        if sizes is not None and sizes.specializations() != pinned:  # (now a condition run() checks)
            raise Declined(f"nvFuser export: the lowering pinned a symbolic size: {sizes.specializations()}")
    except Declined as e:
        return ExportedSegment(seg.index, seg.kind, None, (), seg.inputs, seg.outputs, (), str(e))
    return ExportedSegment(seg.index, seg.kind, f"fusion_{seg.index}", tuple(rec.lines), seg.inputs, tuple(returned),
                           tuple(strides[v] for v in seg.inputs), "")


def _symbolic_mean(graph: FusionGraph, node: object) -> bool:
    """A mean over a dim of symbolic size: the lowering divides by its count as a number, which
    would pin the symbol (Note [exported symbolic sizes])."""
    if node.op != "aten.mean.dim" or not isinstance(node.args[0], ValueRef):  # type: ignore[attr-defined]
        return False
    shape = graph.metas[node.args[0].name].shape  # type: ignore[attr-defined]
    dims = node.args[1] if len(node.args) > 1 and node.args[1] else range(len(shape))  # type: ignore[attr-defined]
    return any(isinstance(shape[d], torch.SymInt) for d in dims if isinstance(d, int) and -len(shape) <= d < len(shape))


def segment_graph(plan: SegmentedFusion, seg: Segment, strides: dict[str, tuple[int, ...]] | None = None) -> FusionGraph:
    """``seg`` as a graph of its own: its inputs (at ``strides`` where given), nodes and outputs."""
    metas = plan.graph.metas
    inputs = []
    for v in seg.inputs:
        m = metas[v]
        st = (strides or {}).get(v, m.stride)
        inputs.append(GraphInput(v, type(m)(m.shape, st, 0, m.dtype, m.device)))
    return FusionGraph(tuple(inputs), seg.nodes, seg.outputs, name=f"s{seg.index}")


# -- the driver -----------------------------------------------------------------------------------

class _Driver:
    """``run(inputs)``: straight-line code with its own local names (Note [no name reaches
    generated code]: value names are graph data; they never reach the file)."""

    def __init__(self, graph: FusionGraph, sizes: SymbolicSizes | None) -> None:
        self.graph, self.sizes = graph, sizes
        self.local: dict[str, str] = {}
        self.lines: list[str] = []
        self.uses_device = False

    def var(self, v: str) -> str:
        if v not in self.local:
            self.local[v] = f"v{len(self.local)}"
        return self.local[v]

    def size(self, n: object) -> str:
        """A size as run() computes it: a number, or its expression over the symbols run() reads
        from its inputs (Note [exported symbolic sizes])."""
        if not isinstance(n, torch.SymInt):
            return _fmt(n)
        if self.sizes is None:
            raise ValueError("nvFuser export: a symbolic size outside a symbolic plan")
        try:
            return self.sizes.python_expr(n)
        except NotSymbolic as e:
            raise ValueError(f"nvFuser export: {e}") from None

    def arg(self, a: object) -> str:
        if isinstance(a, ValueRef):
            return self.local[a.name]
        if isinstance(a, tuple | list):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        if isinstance(a, torch.SymInt):
            return self.size(a)
        if isinstance(a, torch.device):
            self.uses_device = True
            return "_device"  # the device run() is called on (the graph may have been built on the CPU)
        if isinstance(a, torch.dtype | torch.layout | torch.memory_format):
            if a not in _TORCH_NAMES:
                raise ValueError(f"nvFuser export: {a}")
            return f"torch.{_TORCH_NAMES[a]}"
        if isinstance(a, complex):
            return f"complex({_fmt(a.real)}, {_fmt(a.imag)})"
        if isinstance(a, str):
            return repr(a)  # a mode string (op_refusal admits no other): a literal, escaped
        if isinstance(a, OpRef):
            raise ValueError(f"nvFuser export: op argument {a.name}")
        return _fmt(a)

    def torch_node(self, node: object) -> None:
        op = _VIEW_AS.get(node.op, node.op)  # type: ignore[attr-defined]
        if op_name_problem(op) is not None or not isinstance(resolve_op(op), torch._ops.OpOverload):
            raise ValueError(f"nvFuser export: {op} is not an ATen op run() can call")
        args = [self.arg(a) for a in node.args] + [f"{k}={self.arg(v)}" for k, v in node.kwargs]  # type: ignore[attr-defined]
        outs = [self.var(o) if o is not None else "_" for o in node.outputs]  # type: ignore[attr-defined]
        target = outs[0] if len(outs) == 1 else ", ".join(outs)
        self.lines.append(f"{target} = torch.ops.{op}({', '.join(args)})")


@dataclass(frozen=True)
class NvFuserExport:
    segments: tuple[ExportedSegment, ...]
    script: str  # the whole file: every fusion and run(inputs)

    @property
    def fusions(self) -> tuple[ExportedSegment, ...]:
        return tuple(s for s in self.segments if s.function is not None)


def export_nvfuser(plan: SegmentedFusion) -> NvFuserExport:
    """The segments of ``plan`` (after the alias pass) as FusionDefinition scripts and a driver."""
    graph = plan.graph
    if graph.constants:
        raise ValueError("nvFuser export: a graph holding constants is not exported")
    sizes = sizes_of(graph)
    if sizes is not None and sizes.sealed:
        raise ValueError("nvFuser export: the graph's symbolic plan is sealed (a program was compiled from it): "
                         "export a graph read afresh")
    segments = tuple(_export_segment(plan, s, sizes) for s in plan.segments)
    d = _Driver(graph, sizes)
    params = [d.var(i.name) for i in graph.inputs]
    for seg, ex in zip(plan.segments, segments):
        d.lines.append(f"# segment {seg.index}: {seg.kind.value}" + (f" on torch ({ex.reason[:120]})" if
                                                                       ex.function is None else ""))
        if ex.function is None:
            for node in seg.nodes:
                d.torch_node(node)
            continue
        args = ", ".join(f"({d.local[v]}, {d.arg(st)})" for v, st in zip(ex.inputs, ex.strides))
        outs = [d.var(o) for o in ex.returned]
        target = f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = " if outs else ""
        d.lines.append(f"{target}_run({ex.function}, [{args}])")
    for m in graph.mutations:
        d.lines.append(f"{params[m.input]}.copy_({d.local[m.value]})")
    d.lines.append(f"return [{', '.join(d.local[o] for o in graph.outputs)}]")
    first = _bind_symbols(d, params) if sizes is not None else []
    text = [f"# {len(plan.segments)} segments of a fusion, written by fusion-segmenter (fuseg export --format nvfuser):\n"
            f"# {sum(s.function is not None for s in segments)} nvFuser fusions; views and the rest run on torch in "
            f"run(inputs).\n" + (f"# {describe_sizes(sizes)[0]}; run(inputs) checks the plan's conditions\n"
                                 if sizes is not None else "") + _HEADER]
    text += [ex.source() for ex in segments if ex.function is not None]
    text.append(_RUNTIME)
    device = "    _device = next((t.device for t in inputs if t.dim()), torch.device('cuda'))\n" if d.uses_device else ""
    unpack = f"    {', '.join(params)}{',' if len(params) == 1 else ''} = inputs\n" if params else ""
    text.append(f"def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:\n{unpack}{device}"
                + "".join(f"    {ln}\n" for ln in [*first, *d.lines]))
    return NvFuserExport(segments, "\n\n".join(text))


def _bind_symbols(d: _Driver, params: list[str]) -> list[str]:
    """run()'s first lines under symbolic sizes: each symbol read from an input's size, then the
    plan's conditions checked (those the lowering added included: it ran first)."""
    sizes = d.sizes
    assert sizes is not None
    try:
        sources = sizes.read_from([i.meta for i in d.graph.inputs])
        condition = sizes.condition_source()
    except NotSymbolic as e:
        raise ValueError(f"nvFuser export: {e}") from None
    return [*sizes.bind_lines(params, sources), f"if not ({condition}):",
            "    raise ValueError('the inputs\\' sizes break a condition of the plan these fusions were written for')"]


_RUNTIME = '''_FUSIONS: dict = {}


def _conform(t: torch.Tensor, strides: list[int]) -> torch.Tensor:
    """t in the layout its fusion defines (a broadcast dim has stride 0): a copy only if it has another."""
    if all(n <= 1 or s == p for n, s, p in zip(t.shape, t.stride(), strides)):
        return t
    u = t
    for d, (n, p) in enumerate(zip(t.shape, strides)):
        if n > 1 and p == 0:
            u = u.narrow(d, 0, 1)
    fresh = torch.empty_strided(u.shape, [p or 1 for p in strides], dtype=t.dtype, device=t.device)
    return fresh.copy_(u).expand(t.shape)


def _run(define, args: list) -> list[torch.Tensor]:
    fd = _FUSIONS.get(define)
    if fd is None:
        with FusionDefinition() as fd:
            define(fd)
        _FUSIONS[define] = fd
    return fd.execute([_conform(t, strides) for t, strides in args])
'''
