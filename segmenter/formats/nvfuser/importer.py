"""``from_nvfuser``: an nvFuser Python-frontend fusion (a repro script, a function, a
``with FusionDefinition() as fd:`` block) as a FusionGraph, read as data.

    script text --ast (segmenter/formats/nvfuser/script.py)--> frontend calls
                --op table (segmenter/formats/nvfuser/ops.py)--> ATen nodes on FakeTensors
                --inputs bound here--> FusionGraph

Note [symbolic or bound sizes]: nvFuser's ``shape=[-1, ...]`` makes a dim symbolic, and so it
is here by default: without the ``inputs`` argument, each -1 dim is a symbol of a symbolic plan,
hinted by the script's own ``inputs = [...]`` (segmenter/formats/nvfuser/inputs.py) where it has one
(Note [symbolic dims of a fusion] in segmenter/formats/nvfuser/sizes.py): the graph, its segmentation
and its compiled program hold for every size where the plan's conditions do. With ``inputs``
(tensors and numbers in the order the fusion defines its inputs) the fusion is bound to their
sizes, strides and dtypes, as a user who hands tensors expects (explicit binding wins), unless
``symbolic=True`` keeps the dims symbolic with the tensors as hints; ``symbolic=False`` without
``inputs`` binds to the script's list (refused, naming the tensor and line, where it has none).
Which dims were -1, and what each became, is kept (``NvFuserFusion.symbolic``). A scalar input (``fd.define_scalar(dtype=...)`` without a
value) is a graph input: a 0-dim tensor, on the CPU (``NvFuserFusion.arguments`` makes one of a
number). ``fd.add_output(value, T)`` with an input ``T`` is nvFuser's in-place update: ``T`` ends
holding ``value`` (a write-back, ``FusionGraph.mutations``), and it is not an output.

Scripts name ``cuda:0``: the graph is built on CUDA where there is one, on the CPU otherwise
(said in ``NvFuserFusion.notes`` and a warning); with ``inputs``, on their device.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...capturing.reference import number_fits, numbers_as_tensors
from ...ir.graph import FusionGraph, Mutation, TensorMeta
from ...ir.limits import MAX_DIM, MAX_RANK
from ...ir.symbolic import SymbolicSizes, sizes_of, symbolic_hashing
from ..serialize import GraphFormatError
from .build import Args, Builder, Const, FrontendOp, TVal, Value, Vec
from .inputs import InputSpec
from .ops import OPS
from .script import Call, DType, InputRef, Ref, Script, read_script
from .shape_ops import stride_order
from .sizes import DEFAULT_HINT, DimSizes

__all__ = ["NvFuserFusion", "SymbolicDims", "from_nvfuser", "read_nvfuser"]


@dataclass(frozen=True)
class SymbolicDims:
    """Input ``input`` (defined at ``line``) had symbolic dims ``dims``, which are ``sizes``: a
    number where bound (or pinned: Note [symbolic dims of a fusion]), else a symbol's name."""

    input: str
    line: int
    dims: tuple[int, ...]
    sizes: tuple[int | str, ...]


@dataclass(frozen=True)
class NvFuserFusion:
    graph: FusionGraph
    symbolic: tuple[SymbolicDims, ...]
    #: where the sizes (bound) or the hints (symbolic) came from: "inputs argument", "the
    #: script's inputs", "the script's sizes" (none were -1) or "default hints"
    bound_from: str
    notes: tuple[str, ...]
    bound: bool = True  # False: -1 dims are symbols (Note [symbolic or bound sizes])
    source: str = field(default="", repr=False, compare=False)  # the script, to bind it again

    @property
    def sizes(self) -> SymbolicSizes | None:
        """The plan's symbols (their names, ranges, hints and conditions); None where every size
        is a number."""
        return sizes_of(self.graph)

    def arguments(self, values: Sequence[object]) -> list[torch.Tensor]:
        """The graph's inputs for nvFuser-style ``values``: numbers become 0-dim tensors."""
        if len(values) != len(self.graph.inputs):
            raise ValueError(f"{len(values)} values for {len(self.graph.inputs)} inputs")
        return numbers_as_tensors(self.graph, values)  # type: ignore[return-value]


def _signature(params: tuple[str, ...], **defaults: object) -> FrontendOp:
    """The argument names of a ``fd.*`` method (read here, not built by the op table)."""
    return FrontendOp(params, lambda a: None, defaults)


def _spec_of(v: object, k: int) -> InputSpec:
    if isinstance(v, torch.Tensor):
        m = TensorMeta.from_tensor(v)
        return InputSpec(0, m.shape, m.stride, m.storage_offset, m.dtype, m.device)
    if isinstance(v, bool | int | float):
        return InputSpec(0, None, None, 0, {bool: torch.bool, int: torch.int64, float: torch.float64}[type(v)],
                         "cpu", v)
    raise GraphFormatError(f"inputs[{k}]: a tensor or a number, got {type(v).__name__}")


def _device(specs: Sequence[InputSpec] | None, from_user: bool) -> tuple[str, list[str]]:
    tensors = [s for s in specs or () if s.shape]  # 0-dim and scalar inputs may stay on the CPU
    if from_user and tensors:
        devices = {torch.device(s.device) for s in tensors}
        if len(devices) > 1:
            raise GraphFormatError(f"inputs on several devices: {sorted(map(str, devices))}")
        return str(tensors[0].device), []
    if torch.cuda.is_available():
        return "cuda:0", []
    return "cpu", ["the fusion is written for CUDA; this machine has none, so the graph is built on the CPU"]


def _layout(b: Builder, shape: tuple[int, ...], order: tuple[int, ...],
            expanded: tuple[bool, ...] = ()) -> tuple[int, ...]:
    """Dense strides in ``order`` (innermost rank 0; default row-major), products of the sizes
    where they are symbolic; stride 0 for an ``expanded`` dim (Note [contiguity in allocation
    order]). A dim declared non-contiguous (``False``) has a stride nvFuser does not know; dense
    is one such stride."""
    ndim = len(shape)
    order = order or tuple(range(ndim - 1, -1, -1))
    if sorted(order) != list(range(ndim)):
        b.fail(f"stride_order {list(order)} is not a permutation of the {ndim} dims")
    strides, acc = [0] * ndim, 1
    for d in sorted(range(ndim), key=lambda d: order[d]):
        if expanded and expanded[d]:
            continue
        strides[d] = acc
        acc = acc * (shape[d] if isinstance(shape[d], torch.SymInt) else max(shape[d], 1))  # a symbol is >= 2
    return tuple(strides)


def _expanded(declared: tuple[int, ...], contiguity: tuple) -> tuple[bool, ...]:
    """Which dims are expanded broadcasts: None in ``contiguity`` (per dim), a size other than 1."""
    return tuple(c is None and n != 1 for n, c in zip(declared, contiguity)) if contiguity else ()


def _order_of(stride: tuple[int, ...]) -> tuple[int, ...]:
    """The ``stride_order`` of strides at hand: ranks by stride, a later dim inner among equals."""
    ranked = sorted(range(len(stride)), key=lambda d: (stride[d], -d))
    return tuple(ranked.index(d) for d in range(len(stride)))


# Note [contiguity in allocation order]: nvFuser's ``define_tensor(shape, contiguity,
# stride_order)`` gives ``contiguity`` in the order of the allocation (outermost first): entry k
# is the dim ``d`` with ``stride_order[d] == ndim - 1 - k`` (entry d for dim d where stride_order
# is empty). ``None`` marks a broadcast dim: of size 1 where the shape says 1, else an expanded
# dim (nvFuser's ``getExpanded``), whose stride is 0 wherever its size is not 1. An input
# matches where, from the innermost dim outwards, each True dim of size > 1 has the stride the
# dims inside it make (the last stride times that dim's size, broadcast and size-1 dims
# skipped), as nvFuser's ``validateAllocationSizesAndStrides`` checks at its execute. The
# importer keeps contiguity per dim (``_per_dim``) once read.
def _per_dim(b: Builder, contiguity: tuple, order: tuple[int, ...], ndim: int) -> tuple:
    """``contiguity`` as written (allocation order) made per dim (Note [contiguity in allocation order])."""
    if len(contiguity) != ndim:
        b.fail(f"contiguity has {len(contiguity)} entries for {ndim} dims")
    if not order:
        return contiguity
    if sorted(order) != list(range(ndim)):
        b.fail(f"stride_order {list(order)} is not a permutation of the {ndim} dims")
    return tuple(contiguity[ndim - 1 - order[d]] for d in range(ndim))


def _stride_order(b: Builder, order: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """``stride_order`` checked, negative entries counted from the end (nvFuser's
    ``normalizeStrideOrder``): a permutation of the dims, or empty."""
    if order and (len(order) != ndim or sorted(o % ndim if -ndim <= o < ndim else -1 for o in order) != list(range(ndim))):
        b.fail(f"stride_order {list(order)} is not a permutation of the {ndim} dims")
    return tuple(o % ndim for o in order)


def _layout_problem(shape: tuple[int, ...], stride: tuple[int, ...], contiguity: tuple, order: tuple[int, ...],
                    declared: tuple[int, ...]) -> str | None:
    """Where a bound input's strides break what ``contiguity`` (per dim) and ``stride_order``
    declare, which dim and how; None where they hold (Note [contiguity in allocation order])."""
    ndim = len(shape)
    rank = order or tuple(range(ndim - 1, -1, -1))
    expected = 1
    for d in sorted(range(ndim), key=lambda d: rank[d]):  # innermost first
        n, st = shape[d], stride[d]
        if contiguity[d] is None:  # a broadcast dim: size 1 (any stride) or expanded (stride 0)
            if declared[d] != 1 and n > 1 and st != 0:
                return f"dim {d} is a broadcast dim (contiguity None) of size {n} with stride {st}, not 0"
            continue
        if n <= 1:  # addresses nothing: skipped, as nvFuser does
            continue
        if contiguity[d] and st != expected:
            return f"dim {d} is declared contiguous (stride {expected}), its stride is {st}"
        expected = st * n
    return None


class _Importer:
    """One read of the script into a graph: bound (``dims`` None) or with symbolic dims."""

    def __init__(self, script: Script, specs: Sequence[InputSpec] | None, device: str, from_user: bool,
                 dims: DimSizes | None = None) -> None:
        self.script, self.specs, self.from_user, self.dims = script, specs, from_user, dims
        self.b = Builder(script.name, device, dims.sizes if dims is not None else None)
        self.env: dict[str, Value] = {}
        self.outputs: list[TVal] = []
        self.mutations: list[Mutation] = []
        self.symbolic: list[SymbolicDims] = []
        self.notes: list[str] = []
        self.n_inputs = 0
        self.graph: FusionGraph  # made by run()

    def run(self) -> FusionGraph:
        for call in self.script.calls:
            b = self.b
            b.line, b.label = call.line, (call.targets[0] if call.targets else call.func.removeprefix("ops."))
            b.call = "assignment" if call.func == "=" else f"fd.{call.func}"
            result = self.call(call)
            self.bind(call, result)
        if self.specs is not None and len(self.specs) != self.n_inputs:
            raise GraphFormatError(f"{len(self.specs)} inputs given for the {self.n_inputs} the fusion defines")
        self.b.line, self.b.call, self.b.label = self.script.line, "fd.add_output", "out"
        self.graph = self.b.graph(self.outputs, self.mutations)
        return self.graph

    def bind(self, call: Call, result: object) -> None:
        if not call.targets:
            return
        if isinstance(result, Vec) and len(call.targets) > 1:  # B, T = T0.shape()
            result = result.items
        if isinstance(result, tuple):
            if len(result) != len(call.targets):
                self.b.fail(f"returns {len(result)} values, assigned to {len(call.targets)} names")
            self.env.update(zip(call.targets, result))
        elif len(call.targets) == 1 and result is not None:
            self.env[call.targets[0]] = result  # type: ignore[assignment]
        else:
            self.b.fail(f"returns {'nothing' if result is None else 'one value'}, assigned to {len(call.targets)} names")

    def value(self, v: object) -> object:
        if isinstance(v, Ref):
            return self.env[v.name]
        if isinstance(v, DType):
            return v.dtype
        if isinstance(v, tuple):
            return tuple(self.value(x) for x in v)
        return v

    def args(self, op: FrontendOp, call: Call) -> Args:
        b, values = self.b, {}
        if len(call.args) > len(op.params):
            b.fail(f"takes at most {len(op.params)} arguments ({', '.join(op.params)}), got {len(call.args)}")
        values.update(zip(op.params, (self.value(a) for a in call.args)))
        for k, v in call.kwargs:
            k = op.aliases.get(k, k)
            if k not in op.params:
                b.fail(f"no argument {k[:60]!r} (it takes {', '.join(op.params)})")
            if k in values:
                b.fail(f"argument {k!r} given twice")
            values[k] = self.value(v)
        for p in op.params:
            if p not in values:
                if p not in op.defaults:
                    b.fail(f"argument {p!r} missing")
                values[p] = op.defaults[p]
        if any(isinstance(v, InputRef) for v in values.values()):
            b.fail("inputs[i] is read only as the argument of fd.from_pytorch")
        return Args(b, values)

    def call(self, call: Call) -> object:
        if call.func == "=":
            return self.value(call.args[0])
        if call.func.startswith("ops."):
            op = OPS[call.func.removeprefix("ops.")]
            return op.build(self.args(op, call))
        methods = {"define_tensor": self.define_tensor, "define_scalar": self.define_scalar,
                   "define_constant": self.define_scalar, "define_vector": self.define_vector,
                   "from_pytorch": self.from_pytorch, "add_output": self.add_output}
        return methods[call.func](call)  # the reader admits only these (nvfuser_script.FD_METHODS)

    # -- inputs ------------------------------------------------------------------------------

    def next_spec(self, k: int | None = None) -> InputSpec | None:
        index = self.n_inputs
        self.n_inputs += 1
        if k is not None and k != index:
            self.b.fail(f"inputs[{k}] defines input {index}: nvFuser binds inputs in the order they are defined")
        if self.specs is None:
            return None
        if index >= len(self.specs):
            self.b.fail(f"input {index} is defined, {len(self.specs)} inputs are given")
        return self.specs[index]

    def tensor_input(self, declared: tuple[int, ...], strides: tuple[int, ...] | None, contiguity: tuple,
                     order: tuple[int, ...], dtype: torch.dtype, is_cpu: bool, symbolic: tuple[int, ...],
                     spec: InputSpec | None) -> TVal:
        """An input defined with sizes ``declared`` (-1 in ``symbolic`` dims), bound to ``spec``
        where given, or with its ``symbolic`` dims as symbols (Note [symbolic or bound sizes])."""
        b = self.b
        if spec is not None:
            if spec.shape is None or len(spec.shape) != len(declared) or spec.dtype != dtype:
                got = "a number" if spec.shape is None else f"{spec.dtype} {list(spec.shape)}"
                b.fail(f"input {self.n_inputs - 1} is {got}; the fusion defines {dtype} of {len(declared)} dims")
            fixed = [d for d, (n, s) in enumerate(zip(declared, spec.shape)) if d not in symbolic and n != s]
            if fixed:
                b.fail(f"input {self.n_inputs - 1} has sizes {list(spec.shape)} where the fusion fixes {list(declared)}")
            assert spec.stride is not None
            problem = _layout_problem(spec.shape, spec.stride, contiguity, order, declared) if contiguity else None
            if problem is not None:
                b.fail(f"input {self.n_inputs - 1} has sizes {list(spec.shape)} and strides {list(spec.stride)}, not "
                       f"the layout contiguity and stride_order={list(order)} declare: {problem}")
        name = b.fresh()
        layout = None
        if self.dims is not None and symbolic:
            layout = self.symbolic_layout(name, declared, strides, contiguity, order, symbolic, spec)
        if layout is not None:
            shape, strides, offset = layout
        elif spec is not None:
            shape, strides, offset = spec.shape, spec.stride, spec.offset
        elif any(declared[d] == -1 for d in symbolic):
            b.fail(f"shape={list(declared)}: give inputs to bind its size (the dims nvFuser leaves symbolic)")
        else:
            shape, offset = declared, 0
            if strides is None:
                strides = _layout(b, shape, order, _expanded(declared, contiguity))
        device = spec.device if spec is not None and self.from_user else ("cpu" if is_cpu else b.device)
        meta = TensorMeta(tuple(shape), tuple(strides), offset, dtype, device)
        v = b.add_input(meta, name=name)
        if symbolic:
            self.symbolic.append(SymbolicDims(v.name, b.line, symbolic, tuple(meta.shape[d] for d in symbolic)))
        return v

    def symbolic_layout(self, name: str, declared: tuple[int, ...], strides: tuple[int, ...] | None,
                        contiguity: tuple, order: tuple[int, ...], symbolic: tuple[int, ...],
                        spec: InputSpec | None) -> tuple[tuple, tuple, int] | None:
        """Shape, strides and offset of an input whose ``symbolic`` dims are symbols, dense in its
        stride order (Note [symbolic dims of a fusion]); None where the sizes given bind it
        instead: strides that are no dense layout, or an offset."""
        assert self.dims is not None
        b = self.b
        given = spec.shape if spec is not None else declared
        given_strides = spec.stride if spec is not None else strides
        if given_strides is not None:
            order = order or _order_of(given_strides)
            dense = _layout(b, given, order, _expanded(declared, contiguity))
            if (spec is not None and spec.offset) or any(n > 1 and st != want for n, st, want in
                                                         zip(given, given_strides, dense)):
                self.notes.append(f"{name} (line {b.line}) is bound to its sizes {list(given)}: its strides "
                                  f"{list(given_strides)}{' at an offset' if spec is not None and spec.offset else ''}"
                                  " are no dense layout, which symbolic sizes would give")
                return None
        shape = tuple(self.dims.dim((self.n_inputs - 1, d), name, None if n == -1 else n, b.fail) if d in symbolic
                      else n for d, n in enumerate(given))
        return shape, _layout(b, shape, order, _expanded(declared, contiguity)), 0

    def define_tensor(self, call: Call) -> TVal:
        kw = dict(call.kwargs)
        if "sizes" in kw or "strides" in kw:
            op = _signature(("sizes", "strides", "dtype", "static_sizes", "is_cpu"), dtype=torch.float32,
                            static_sizes=False, is_cpu=False)
        elif "symbolic_sizes" in kw:
            op = _signature(("symbolic_sizes", "contiguous", "dtype", "is_cpu"), contiguous=(), dtype=torch.float32,
                            is_cpu=False)
        else:
            op = _signature(("shape", "contiguity", "dtype", "is_cpu", "stride_order"), contiguity=(),
                            dtype=torch.float32, is_cpu=False, stride_order=())
        a = self.args(op, call)
        dtype = a.dtype("dtype")
        assert dtype is not None
        is_cpu = a.flag("is_cpu")
        spec = self.next_spec()
        if "sizes" in a.values:
            sizes, strides = a.ints("sizes", 0), a.ints("strides", 0)
            if len(sizes) != len(strides):
                self.b.fail(f"sizes {list(sizes)} and strides {list(strides)} differ in rank")
            symbolic = () if a.flag("static_sizes") else tuple(d for d, n in enumerate(sizes) if n != 1)
            return self.tensor_input(sizes, None if spec else strides, (), (), dtype, is_cpu, symbolic, spec)
        key = "shape" if "shape" in a.values else "symbolic_sizes"
        declared = a.ints(key, -1)
        contiguity = a.get("contiguity" if key == "shape" else "contiguous")
        if isinstance(contiguity, bool):
            contiguity = tuple(None if n == 1 else contiguity for n in declared)
        if not isinstance(contiguity, tuple) or not all(c is None or isinstance(c, bool) for c in contiguity):
            self.b.fail("contiguity must be a list of True/False/None, or one bool")
        order = _stride_order(self.b, a.ints("stride_order", -MAX_RANK, MAX_RANK), len(declared)) if key == "shape" else ()
        if is_cpu and declared:  # nvFuser: "CPU non-scalar tensor is not supported"
            self.b.fail(f"is_cpu=True is for 0-dim tensors (a CPU scalar), not shape={list(declared)}")
        if not contiguity:  # nvFuser's default: nothing known about the strides
            contiguity = tuple(None if n == 1 else False for n in declared)
        elif not isinstance(a.get("contiguity" if key == "shape" else "contiguous"), bool):
            contiguity = _per_dim(self.b, contiguity, order, len(declared))
        symbolic = tuple(d for d, n in enumerate(declared) if n == -1)
        return self.tensor_input(declared, None, contiguity, order, dtype, is_cpu, symbolic, spec)

    def from_pytorch(self, call: Call) -> TVal:
        kw = dict(call.kwargs)
        ref = kw.pop("tensor", call.args[0] if call.args else None)
        if not isinstance(ref, InputRef):
            self.b.fail("reads only fd.from_pytorch(inputs[i])")
        rest = Call(call.line, call.func, call.args[1:], tuple(kw.items()), call.targets)
        static = self.args(_signature(("static_sizes",), static_sizes=False), rest).flag("static_sizes")
        spec = self.next_spec(ref.index)
        if spec is None:
            self.b.fail(f"fd.from_pytorch(inputs[{ref.index}]): give inputs (or an inputs = [...] list) to bind it")
        if spec.shape is None:
            self.b.fail(f"inputs[{ref.index}] is a number, not a tensor")
        symbolic = () if static else tuple(d for d, n in enumerate(spec.shape) if n != 1)
        is_cpu = spec.device == "cpu" and not spec.shape  # a 0-dim CPU tensor stays there, as nvFuser takes it
        return self.tensor_input(spec.shape, None, (), (), spec.dtype, is_cpu, symbolic, spec)

    def define_scalar(self, call: Call) -> Value:
        a = self.args(_signature(("value", "dtype"), value=None, dtype=None), call)
        value, dtype = a.get("value"), a.dtype("dtype", null_ok=True)
        if value is None:  # an input
            dtype = dtype or torch.float64
            spec = self.next_spec()
            fits = spec is None or (spec.dtype == dtype if spec.shape == () else
                                    spec.shape is None and number_fits(spec.value, dtype))  # a 0-dim tensor, or a number
            if not fits:
                self.b.fail(f"input {self.n_inputs - 1} is not a {dtype} number")
            return self.b.add_input(TensorMeta((), (), 0, dtype, "cpu"), scalar=True)
        if not isinstance(value, bool | int | float | complex):
            self.b.fail(f"value must be a number, got {type(value).__name__}")
        dtype = dtype or {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}[type(value)]
        if not number_fits(value, dtype):
            self.b.fail(f"{value!r} is not a {dtype} value")
        return Const(torch.tensor(value).to(dtype).item(), dtype)  # rounded as the dtype holds it

    def define_vector(self, call: Call) -> Value:
        a = self.args(_signature(("values", "dtype"), dtype=torch.int64), call)
        items = a.get("values")
        if not isinstance(items, tuple) or len(items) > MAX_RANK:
            self.b.fail(f"values must be a list of at most {MAX_RANK} scalars (an input vector is not read)")
        out = []
        for k, x in enumerate(items):
            if isinstance(x, int) and not isinstance(x, bool):
                x = Const(x, torch.int64)
            if not (isinstance(x, Const) and x.dtype in (torch.int64, torch.int32)) and not (
                    isinstance(x, TVal) and x.scalar):
                self.b.fail(f"values[{k}] is not an integer scalar")
            if isinstance(x, Const) and not -1 <= x.value < MAX_DIM:
                self.b.fail(f"values[{k}] = {x.value} is not a size")
            out.append(x)
        return Vec(tuple(out))

    # -- outputs -----------------------------------------------------------------------------

    def add_output(self, call: Call) -> None:
        a = self.args(_signature(("output", "alias_input", "stride_order"), alias_input=None, stride_order=None), call)
        if isinstance(a.get("alias_input"), tuple):  # add_output(T, [1, 0]): the stride_order overload
            a.values["stride_order"], a.values["alias_input"] = a.get("alias_input"), None
        out = a.operand("output")
        if isinstance(out, Const):
            out = self.b.emit("aten.scalar_tensor.default", out.value, dtype=out.dtype, device=torch.device("cpu"))
        if a.get("stride_order") is not None:
            out = stride_order(self.b, a.tensor("output"), a.ints("stride_order", 0, MAX_RANK))
        if a.get("alias_input") is None:
            self.outputs.append(out)
            return
        target = a.tensor("alias_input")
        k = self.b.input_index(target)
        if k is None:
            self.b.fail("alias_input must be an input of the fusion")
        if any(m.input == k for m in self.mutations):
            self.b.fail(f"input {target.name} is written twice")
        src, dst = self.b.meta(out), self.b.meta(target)
        if (src.shape, src.dtype) != (dst.shape, dst.dtype):
            self.b.fail(f"a {src.dtype} {self.b.text(src.shape)} value cannot be written into input {target.name} "
                        f"({dst.dtype} {self.b.text(dst.shape)})")
        self.mutations.append(Mutation(k, out.name))


def read_nvfuser(source: str, inputs: Sequence[object] | None = None, name: str | None = None,
                 warn: bool = True, symbolic: bool | None = None) -> NvFuserFusion:
    """The fusion of ``source`` (see the module's docstring) and what its -1 dims became;
    ``symbolic``: keep them symbols (default: where no ``inputs`` are given; Note [symbolic or
    bound sizes]); ``warn``: the notes (the graph built on the CPU) also as warnings."""
    script = read_script(source, name)
    if inputs is not None:
        if len(inputs) > 4096:
            raise GraphFormatError(f"{len(inputs)} inputs (at most 4096)")
        specs: Sequence[InputSpec] | None = [_spec_of(v, k) for k, v in enumerate(inputs)]
        bound_from = "inputs argument"
    elif script.inputs is not None:
        specs, bound_from = script.inputs, "the script's inputs"
    else:
        specs, bound_from = None, "the script's sizes"
    symbolic = inputs is None if symbolic is None else symbolic
    device, notes = _device(specs, inputs is not None)
    if symbolic:
        importer = _symbolic_import(script, specs, device, inputs is not None)
        if specs is None and importer.dims is not None and importer.dims.made:
            bound_from = "default hints"
    else:
        importer = _Importer(script, specs, device, inputs is not None)
        importer.run()
    notes += importer.notes
    for note in notes if warn else ():
        warnings.warn(f"{script.name}: {note}", stacklevel=2)
    sizes = sizes_of(importer.graph)
    dims = tuple(SymbolicDims(s.input, s.line, s.dims, tuple(_shown(n, sizes) for n in s.sizes))
                 for s in importer.symbolic)
    return NvFuserFusion(importer.graph, dims, bound_from, tuple(notes), bound=not symbolic, source=source)


def _shown(n: int | torch.SymInt, sizes: SymbolicSizes | None) -> int | str:
    """A dim as ``NvFuserFusion.symbolic`` keeps it: a number, or its symbol's name."""
    text = str(int(n)) if sizes is None or not isinstance(n, torch.SymInt) else sizes.text(n)
    return int(text) if text.isdigit() else text


def _symbolic_import(script: Script, specs: Sequence[InputSpec] | None, device: str, from_user: bool) -> _Importer:
    """The fusion with its -1 dims as symbols, in one run or two (Note [symbolic dims of a fusion]
    in segmenter/formats/nvfuser/sizes.py)."""
    with symbolic_hashing():  # Note [hashing symbolic sizes]
        first = _Importer(script, specs, device, from_user, DimSizes())
        try:
            first.run()
        except GraphFormatError as e:
            if specs is None and first.dims is not None and first.dims.made:
                raise GraphFormatError(f"{e} (the -1 dims were hinted {DEFAULT_HINT}: give inputs, or an "
                                       "inputs = [...] list, of sizes the fusion takes)") from None
            raise
        assert first.dims is not None
        plan = first.dims.learned(distinct=specs is None)
        if plan is None:
            return first
        second = _Importer(script, specs, device, from_user, DimSizes(plan))
        try:
            second.run()
        except GraphFormatError:  # hints apart break a relation of the ops: the first plan holds
            return first
        return second


def from_nvfuser(source: str, inputs: Sequence[object] | None = None, name: str | None = None,
                 symbolic: bool | None = None) -> FusionGraph:
    """An nvFuser Python-frontend fusion as a FusionGraph, never executed (Note [a fusion script
    is data] in segmenter/formats/nvfuser/script.py; sizes as in Note [symbolic or bound sizes])."""
    fusion = read_nvfuser(source, inputs, name, warn=False, symbolic=symbolic)
    for note in fusion.notes:
        warnings.warn(f"{fusion.graph.name}: {note}", stacklevel=2)
    return fusion.graph
