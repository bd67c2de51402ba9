"""A repro script's ``inputs = [...]``, read as data for the sizes, strides and dtypes it gives.

nvFuser's repro scripts end with the inputs they ran on::

    inputs = [
        torch.testing.make_tensor((2, 1024), dtype=torch.bfloat16, device='cuda:0'),
        torch.randn(98304, dtype=torch.float32, device='cuda:0').as_strided((2, 3, 4096), (12288, 4096, 1)),
        2.5,
    ]

Only the known constructors below, with literal arguments, are read (Note [a fusion script is
data] in segmenter/formats/nvfuser/script.py); nothing is called. Each entry becomes an InputSpec: a
tensor's shape, strides, offset, dtype and device, or a Python number (a scalar input).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

import torch

from ...ir.graph import _contiguous_strides
from ...ir.limits import MAX_DIM, MAX_RANK
from ..serialize import GraphFormatError

__all__ = ["MAX_INPUTS", "InputSpec", "read_inputs"]

MAX_INPUTS = 4096
_TORCH_DTYPES = {name: d for name, d in vars(torch).items() if isinstance(d, torch.dtype)}
_DEVICE = re.compile(r"(cpu|cuda|meta)(:[0-9]{1,4})?")
# constructor -> (positional parameters before the sizes, default dtype); sizes then follow as
# ints or one tuple
_MAKERS = {
    "torch.randn": ((), torch.float32), "torch.rand": ((), torch.float32), "torch.zeros": ((), torch.float32),
    "torch.ones": ((), torch.float32), "torch.empty": ((), torch.float32),
    "torch.testing.make_tensor": ((), None), "torch.full": ((), torch.float32),
    "torch.randint": (("high",), torch.int64), "torch.empty_strided": ((), torch.float32),
    "torch.tensor": ((), None), "torch.arange": ((), torch.int64),
}
_METHOD_DTYPES = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
                  "long": torch.int64, "int": torch.int32, "bool": torch.bool}


@dataclass(frozen=True)
class InputSpec:
    """One input as the script gives it: a tensor (shape, strides, offset, dtype, device) or a
    Python number (``shape`` None, ``value`` the number)."""

    line: int
    shape: tuple[int, ...] | None
    stride: tuple[int, ...] | None
    offset: int
    dtype: torch.dtype
    device: str
    value: bool | int | float | None = None


def _fail(node: ast.AST, message: str) -> GraphFormatError:
    return GraphFormatError(f"line {getattr(node, 'lineno', 0)}: inputs: {message}")


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute) and len(parts) < 8:
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else "(an expression)"


def _literal(node: ast.AST) -> object:
    """A number, a string, a dtype (``torch.bfloat16``) or a tuple of those; refused otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float | str):
        if isinstance(node.value, int) and abs(node.value) >= 2**63:
            raise _fail(node, "an integer beyond 64 bits")
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _literal(node.operand)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return -v
    if isinstance(node, ast.Tuple | ast.List) and len(node.elts) <= MAX_RANK:
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.Attribute) and _dotted(node).startswith("torch.") and node.attr in _TORCH_DTYPES \
            and _dotted(node) == f"torch.{node.attr}":
        return _TORCH_DTYPES[node.attr]
    raise _fail(node, f"a {type(node).__name__} is not a literal argument")


def _ints(v: object, what: str, node: ast.AST) -> tuple[int, ...]:
    if not isinstance(v, tuple) or len(v) > MAX_RANK or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < MAX_DIM for x in v):
        raise _fail(node, f"{what} must be at most {MAX_RANK} integers in [0, {MAX_DIM})")
    return v


def _tensor(node: ast.Call) -> InputSpec:
    methods: list[ast.Call] = []
    while isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Call):
        methods.append(node)
        node = node.func.value
    name = _dotted(node.func)
    if name not in _MAKERS or any(isinstance(a, ast.Starred) for a in node.args):
        raise _fail(node, f"{name}(...) is not a tensor constructor this reader knows ({', '.join(_MAKERS)})")
    skip, dtype = _MAKERS[name]
    args = [_literal(a) for a in node.args]
    kwargs = {k.arg: _literal(k.value) for k in node.keywords if k.arg is not None}
    if len(kwargs) != len(node.keywords):
        raise _fail(node, "**kwargs are not read")
    device = kwargs.pop("device", "cpu")
    dtype = kwargs.pop("dtype", dtype)
    if name == "torch.tensor":  # a 0-dim tensor of a number
        value = args[0] if len(args) == 1 else None
        if not isinstance(value, bool | int | float):
            raise _fail(node, "torch.tensor(...) is read only of one number")
        dtype = dtype or {bool: torch.bool, int: torch.int64, float: torch.float32}[type(value)]
        shape: tuple[int, ...] = ()
    elif name == "torch.randint":
        sizes = kwargs.pop("size", args[-1] if args else None)
        shape = _ints(sizes, "size", node)
    elif name == "torch.full":
        shape = _ints(args[0] if args else kwargs.pop("size", None), "size", node)
        if len(args) > 1 and isinstance(args[1], float) and "dtype" not in kwargs:
            dtype = torch.float32
    else:
        sizes = args[len(skip):]
        shape = _ints(sizes[0] if len(sizes) == 1 and isinstance(sizes[0], tuple) else tuple(sizes), "size", node)
    stride, offset = _contiguous_strides(shape), 0
    if name == "torch.empty_strided":
        shape, stride = _ints(args[0] if args else None, "size", node), _ints(args[1] if len(args) > 1 else None,
                                                                             "stride", node)
    for m in reversed(methods):  # innermost first
        meth = m.func.attr  # type: ignore[union-attr]
        margs = [_literal(a) for a in m.args]
        mkw = {k.arg: _literal(k.value) for k in m.keywords if k.arg is not None}
        if meth == "as_strided":
            shape = _ints(margs[0] if margs else mkw.get("size"), "as_strided size", m)
            stride = _ints(margs[1] if len(margs) > 1 else mkw.get("stride"), "as_strided stride", m)
            offset = margs[2] if len(margs) > 2 else mkw.get("storage_offset", 0)
            if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < MAX_DIM:
                raise _fail(m, "as_strided offset must be an integer in [0, 2^48)")
        elif meth == "expand":
            shape, stride = _expand(shape, stride, margs[0] if len(margs) == 1 and isinstance(margs[0], tuple)
                                    else tuple(margs), m)
        elif meth == "to":
            for v in (*margs, *mkw.values()):
                if isinstance(v, torch.dtype):
                    dtype = v
                elif isinstance(v, str):
                    device = v
                else:
                    raise _fail(m, f"to({v!r}) is not read")
        elif meth in ("cuda", "cpu") and not margs:
            device = meth
        elif meth in _METHOD_DTYPES and not margs:
            dtype = _METHOD_DTYPES[meth]
        elif meth == "contiguous" and not margs:
            stride, offset = _contiguous_strides(shape), 0
        else:
            raise _fail(m, f".{meth[:60]}(...) is not read on an input")
    if not isinstance(dtype, torch.dtype):
        raise _fail(node, f"dtype must be a torch dtype (torch.float32, ...), got {dtype!r}")
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise _fail(node, f"device must be 'cpu', 'cuda' or 'cuda:N', got {str(device)[:40]!r}")
    if len(shape) != len(stride) or math.prod(shape) >= MAX_DIM:
        raise _fail(node, f"size {list(shape)} with stride {list(stride)}")
    return InputSpec(node.lineno, shape, stride, offset, dtype, device)


def _expand(shape: tuple[int, ...], stride: tuple[int, ...], sizes: object,
            node: ast.AST) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``t.expand(*sizes)`` as torch does it: new leading dims and size-1 dims repeat (stride 0),
    -1 keeps a dim; any other size change is refused."""
    if not isinstance(sizes, tuple) or not len(shape) <= len(sizes) <= MAX_RANK or not all(
            isinstance(n, int) and not isinstance(n, bool) and -1 <= n < MAX_DIM for n in sizes):
        raise _fail(node, f"expand sizes must be at most {MAX_RANK} integers in [-1, {MAX_DIM}), "
                          f"at least the tensor's {len(shape)} dims")
    lead = len(sizes) - len(shape)
    out_shape, out_stride = [], []
    for k, n in enumerate(sizes):
        if k < lead:  # a new dim
            if n < 0:
                raise _fail(node, f"expand: a new dim of size {n}")
            out_shape.append(n)
            out_stride.append(0)
            continue
        old, st = shape[k - lead], stride[k - lead]
        n = old if n == -1 else n
        if n != old and old != 1:
            raise _fail(node, f"expand: dim {k - lead} of size {old} cannot become {n}")
        out_shape.append(n)
        out_stride.append(st if n == old else 0)
    return tuple(out_shape), tuple(out_stride)


def read_inputs(node: ast.expr) -> tuple[InputSpec, ...]:
    if not isinstance(node, ast.List | ast.Tuple) or len(node.elts) > MAX_INPUTS:
        raise _fail(node, f"inputs must be a list of at most {MAX_INPUTS} entries")
    out = []
    for e in node.elts:
        if isinstance(e, ast.Call):
            out.append(_tensor(e))
            continue
        v = _literal(e)
        if not isinstance(v, bool | int | float):
            raise _fail(e, "an entry is a tensor constructor or a number")
        dtype = {bool: torch.bool, int: torch.int64, float: torch.float64}[type(v)]
        out.append(InputSpec(e.lineno, None, None, 0, dtype, "cpu", v))
    return tuple(out)
