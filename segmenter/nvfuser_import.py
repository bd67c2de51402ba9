"""``from_nvfuser``: an nvFuser Python-frontend fusion (a repro script, a function, a
``with FusionDefinition() as fd:`` block) as a FusionGraph, read as data.

    script text --ast (segmenter/nvfuser_script.py)--> frontend calls
                --op table (segmenter/nvfuser_ops.py)--> ATen nodes on FakeTensors
                --inputs bound here--> FusionGraph

Note [sizes are bound, not yet symbolic]: nvFuser's ``shape=[-1, ...]`` makes a dim symbolic.
The IR holds concrete sizes for now, so each -1 is bound to a size, taken in this order: from the
``inputs`` argument (tensors and numbers in the order the fusion defines its inputs), else from
the script's own ``inputs = [...]`` (segmenter/nvfuser_inputs.py), else the script is refused
naming the tensor and line. Which dims were -1 is kept (``NvFuserFusion.symbolic``) so that they
become symbols when the IR has them. A scalar input (``fd.define_scalar(dtype=...)`` without a
value) is a graph input: a 0-dim tensor, on the CPU (``NvFuserFusion.arguments`` makes one of a
number). ``fd.add_output(value, T)`` with an input ``T`` is nvFuser's in-place update: ``T`` ends
holding ``value`` (a write-back, ``FusionGraph.mutations``), and it is not an output.

Scripts name ``cuda:0``: the graph is built on CUDA where there is one, on the CPU otherwise
(said in ``NvFuserFusion.notes`` and a warning); with ``inputs``, on their device.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .ir import FusionGraph, Mutation, TensorMeta
from .limits import MAX_DIM, MAX_RANK
from .nvfuser_build import Args, Builder, Const, FrontendOp, TVal, Value, Vec
from .nvfuser_inputs import InputSpec
from .nvfuser_ops import OPS
from .nvfuser_script import Call, DType, InputRef, Ref, Script, read_script
from .nvfuser_shape_ops import stride_order
from .serialize import GraphFormatError

__all__ = ["NvFuserFusion", "SymbolicDims", "from_nvfuser", "read_nvfuser"]


@dataclass(frozen=True)
class SymbolicDims:
    """Input ``input`` (defined at ``line``) had symbolic dims ``dims``, bound to ``sizes``."""

    input: str
    line: int
    dims: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class NvFuserFusion:
    graph: FusionGraph
    symbolic: tuple[SymbolicDims, ...]
    bound_from: str  # "inputs argument", "the script's inputs", or "the script's sizes"
    notes: tuple[str, ...]

    def arguments(self, values: Sequence[object]) -> list[torch.Tensor]:
        """The graph's inputs for nvFuser-style ``values``: numbers become 0-dim tensors."""
        if len(values) != len(self.graph.inputs):
            raise ValueError(f"{len(values)} values for {len(self.graph.inputs)} inputs")
        return [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=inp.meta.dtype)
                for v, inp in zip(values, self.graph.inputs)]


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


def _layout(b: Builder, shape: tuple[int, ...], contiguity: tuple, order: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides in ``order`` (innermost rank 0; default row-major). A dim declared
    non-contiguous (``False``) has a stride nvFuser does not know; dense is one such stride."""
    ndim = len(shape)
    order = order or tuple(range(ndim - 1, -1, -1))
    if sorted(order) != list(range(ndim)):
        b.fail(f"stride_order {list(order)} is not a permutation of the {ndim} dims")
    if len(contiguity) != ndim:
        b.fail(f"contiguity has {len(contiguity)} entries for {ndim} dims")
    strides, acc = [0] * ndim, 1
    for d in sorted(range(ndim), key=lambda d: order[d]):
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def _claims_hold(shape: tuple[int, ...], stride: tuple[int, ...], contiguity: tuple, order: tuple[int, ...]) -> bool:
    """Whether a bound input's strides are what ``contiguity`` (True entries) and ``stride_order`` say."""
    ndim = len(shape)
    dims = [d for d in sorted(range(ndim), key=lambda d: (order or tuple(range(ndim - 1, -1, -1)))[d])
            if shape[d] != 1]
    inner_stride, inner_size = 1, 1
    for d in dims:
        if contiguity[d] is True and stride[d] != inner_stride * inner_size:
            return False
        inner_stride, inner_size = stride[d], shape[d]
    return True


class _Importer:
    def __init__(self, script: Script, specs: Sequence[InputSpec] | None, device: str, from_user: bool) -> None:
        self.script, self.specs, self.from_user = script, specs, from_user
        self.b = Builder(script.name, device)
        self.env: dict[str, Value] = {}
        self.outputs: list[TVal] = []
        self.mutations: list[Mutation] = []
        self.symbolic: list[SymbolicDims] = []
        self.n_inputs = 0

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
        return self.b.graph(self.outputs, self.mutations)

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

    def tensor_input(self, shape: tuple[int, ...], declared: tuple[int, ...], strides: tuple[int, ...] | None,
                     contiguity: tuple, order: tuple[int, ...], dtype: torch.dtype, is_cpu: bool,
                     symbolic: tuple[int, ...], spec: InputSpec | None) -> TVal:
        b = self.b
        if spec is not None:
            if spec.shape is None or len(spec.shape) != len(declared) or spec.dtype != dtype:
                got = "a number" if spec.shape is None else f"{spec.dtype} {list(spec.shape)}"
                b.fail(f"input {self.n_inputs - 1} is {got}; the fusion defines {dtype} of {len(declared)} dims")
            fixed = [d for d, (n, s) in enumerate(zip(declared, spec.shape)) if d not in symbolic and n != s]
            if fixed:
                b.fail(f"input {self.n_inputs - 1} has sizes {list(spec.shape)} where the fusion fixes {list(declared)}")
            shape, strides = spec.shape, spec.stride
            assert strides is not None
            if contiguity and not _claims_hold(shape, strides, contiguity, order):
                b.fail(f"input {self.n_inputs - 1} has strides {list(strides)}, not the layout contiguity="
                       f"{list(contiguity)} stride_order={list(order)} declares")
        elif symbolic and any(declared[d] == -1 for d in symbolic):
            b.fail(f"shape={list(declared)}: give inputs to bind its size (the dims nvFuser leaves symbolic)")
        if strides is None:
            strides = _layout(b, shape, contiguity or (None,) * len(shape), order)
        device = spec.device if spec is not None and self.from_user else ("cpu" if is_cpu else b.device)
        offset = spec.offset if spec is not None else 0
        meta = TensorMeta(tuple(shape), tuple(strides), offset, dtype, device)
        v = b.add_input(meta)
        if symbolic:
            self.symbolic.append(SymbolicDims(v.name, b.line, symbolic, tuple(meta.shape[d] for d in symbolic)))
        return v

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
            return self.tensor_input(sizes, sizes, None if spec else strides, (), (), dtype, is_cpu, symbolic, spec)
        key = "shape" if "shape" in a.values else "symbolic_sizes"
        declared = a.ints(key, -1)
        contiguity = a.get("contiguity" if key == "shape" else "contiguous")
        if isinstance(contiguity, bool):
            contiguity = tuple(None if n == 1 else contiguity for n in declared)
        if not isinstance(contiguity, tuple) or not all(c is None or isinstance(c, bool) for c in contiguity):
            self.b.fail("contiguity must be a list of True/False/None, or one bool")
        if not contiguity:  # nvFuser's default: nothing known about the strides
            contiguity = tuple(None if n == 1 else False for n in declared)
        order = a.ints("stride_order", 0, MAX_RANK) if key == "shape" else ()
        symbolic = tuple(d for d, n in enumerate(declared) if n == -1)
        shape = tuple(max(n, 0) for n in declared)
        return self.tensor_input(shape, declared, None, contiguity, order, dtype, is_cpu, symbolic, spec)

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
        return self.tensor_input(spec.shape, spec.shape, None, (), (), spec.dtype, is_cpu, symbolic, spec)

    def define_scalar(self, call: Call) -> Value:
        a = self.args(_signature(("value", "dtype"), value=None, dtype=None), call)
        value, dtype = a.get("value"), a.dtype("dtype", null_ok=True)
        if value is None:  # an input
            dtype = dtype or torch.float64
            spec = self.next_spec()
            fits = spec is None or (spec.dtype == dtype if spec.shape == () else
                                    spec.shape is None and _fits(spec.value, dtype))  # a 0-dim tensor, or a number
            if not fits:
                self.b.fail(f"input {self.n_inputs - 1} is not a {dtype} number")
            return self.b.add_input(TensorMeta((), (), 0, dtype, "cpu"), scalar=True)
        if not isinstance(value, bool | int | float | complex):
            self.b.fail(f"value must be a number, got {type(value).__name__}")
        dtype = dtype or {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}[type(value)]
        if not _fits(value, dtype):
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
            self.b.fail(f"a {src.dtype} {list(src.shape)} value cannot be written into input {target.name} "
                        f"({dst.dtype} {list(dst.shape)})")
        self.mutations.append(Mutation(k, out.name))


def _fits(value: object, dtype: torch.dtype) -> bool:
    if dtype == torch.bool:
        return isinstance(value, bool)
    if dtype.is_complex:
        return isinstance(value, bool | int | float | complex) and not isinstance(value, bool)
    if dtype.is_floating_point:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)


def read_nvfuser(source: str, inputs: Sequence[object] | None = None, name: str | None = None,
                 warn: bool = True) -> NvFuserFusion:
    """The fusion of ``source`` (see the module's docstring) with what it was bound to; ``warn``:
    the notes (the graph built on the CPU) also as warnings."""
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
    device, notes = _device(specs, inputs is not None)
    importer = _Importer(script, specs, device, inputs is not None)
    graph = importer.run()
    for note in notes if warn else ():
        warnings.warn(f"{script.name}: {note}", stacklevel=2)
    return NvFuserFusion(graph, tuple(importer.symbolic), bound_from, tuple(notes))


def from_nvfuser(source: str, inputs: Sequence[object] | None = None, name: str | None = None) -> FusionGraph:
    """An nvFuser Python-frontend fusion as a FusionGraph, never executed (Note [a fusion script
    is data] in segmenter/nvfuser_script.py; sizes as in Note [sizes are bound, not yet symbolic])."""
    fusion = read_nvfuser(source, inputs, name, warn=False)
    for note in fusion.notes:
        warnings.warn(f"{fusion.graph.name}: {note}", stacklevel=2)
    return fusion.graph
