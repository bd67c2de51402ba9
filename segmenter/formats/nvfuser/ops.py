"""nvFuser's Python-frontend ops (``fd.ops.*``) as ATen ops with the same semantics.

One table per family, read by the importer (segmenter/formats/nvfuser/importer.py) and, reversed, by the
lowering of segments to nvFuser (runtime/backends/nvfuser.py): the names on both sides are these.
Each frontend op has its frontend signature (argument names and defaults, as nvFuser's bindings
declare them) and a builder that emits ATen nodes through segmenter/formats/nvfuser/build.py. An op that
is not here is refused by name. The semantics were read from nvFuser's own sources
(csrc/ops/alias.cpp, arith.cpp, type_promotion.cpp, python_frontend/python_bindings.cpp):

* binary ops promote as nvFuser does (Note [scalars promote as nvFuser's]); ``div`` of integers
  truncates (C's ``/``), ``truediv`` promotes them to float; ``mod`` is C's ``%`` (``fmod``);
* ``broadcast_in_dim(x, shape, broadcast_dims)``: input dim i is output dim broadcast_dims[i]
  (increasing), size-1 dims expand to ``shape``;
* ``slice`` normalizes like Python (negative from the end, clamped) unless
  ``manual_normalization``; steps other than 1 (nvFuser refuses them) are read as torch's;
* ``pad`` widths run from the last dim outwards, as ``F.pad``'s; the value defaults to 0;
* ``sum`` of integers or bools is int64; ``var``/``var_mean`` take ``correction``;
* a cast to the value's own dtype, ``set`` and ``segment_set`` are copies (no node; see
  Note [outputs that are views of inputs] in segmenter/formats/nvfuser/build.py).
"""

from __future__ import annotations

import dataclasses

import torch

from ...ir.ops import resolve_op
from .build import Args, Builder, Const, FrontendOp, TVal, Value, nv_promote
from .shape_ops import SHAPE_OPS

__all__ = ["BINARY", "DTYPES", "OPS", "UNARY"]

# DataType names of the frontend and the torch dtype each stands for
DTYPES: dict[str, torch.dtype] = {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
    "Int": torch.int64, "Int32": torch.int32, "Bool": torch.bool, "ComplexFloat": torch.complex64,
    "ComplexDouble": torch.complex128, "Float8_e4m3fn": torch.float8_e4m3fn, "Float8_e5m2": torch.float8_e5m2,
}

UNARY: dict[str, str] = {n: f"aten.{n}.default" for n in (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "exp", "exp2", "expm1", "erf",
    "erfc", "erfinv", "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "logical_not",
    "bitwise_not", "relu", "reciprocal", "round", "rsqrt", "sign", "sigmoid", "signbit", "silu", "sin", "sinh",
    "sqrt", "tan", "tanh", "trunc", "isfinite", "isinf", "isnan", "isneginf", "isposinf", "real", "imag")}

# frontend name -> (ATen op on two tensors, ATen op on a tensor and a scalar, or None: a 0-dim tensor)
BINARY: dict[str, tuple[str, str | None]] = {
    "add": ("aten.add.Tensor", "aten.add.Tensor"), "sub": ("aten.sub.Tensor", "aten.sub.Tensor"),
    "mul": ("aten.mul.Tensor", "aten.mul.Tensor"), "truediv": ("aten.div.Tensor", "aten.div.Tensor"),
    "atan2": ("aten.atan2.default", None), "fmod": ("aten.fmod.Tensor", "aten.fmod.Scalar"),
    "remainder": ("aten.remainder.Tensor", "aten.remainder.Scalar"),
    "pow": ("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar"),
    "maximum": ("aten.maximum.default", None), "minimum": ("aten.minimum.default", None),
    "nextafter": ("aten.nextafter.default", None), "gcd": ("aten.gcd.default", None),
    "logical_and": ("aten.logical_and.default", None), "logical_or": ("aten.logical_or.default", None),
    "bitwise_left_shift": ("aten.bitwise_left_shift.Tensor", "aten.bitwise_left_shift.Tensor_Scalar"),
    "bitwise_right_shift": ("aten.bitwise_right_shift.Tensor", "aten.bitwise_right_shift.Tensor_Scalar"),
    **{n: (f"aten.{n}.Tensor", f"aten.{n}.Scalar") for n in ("eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
                                                            "bitwise_or", "bitwise_xor")},
}
# frontend names that read as another name's ops: ``mod`` is C's % (torch's fmod); ``div`` is
# truediv on floats and truncating division on integers (segmenter/formats/nvfuser/ops.py:_elementwise)
_SAME_AS = {"mod": "fmod", "div": "truediv"}


# -- scalars ---------------------------------------------------------------------------------

def fold(b: Builder, op: str, consts: list[Const], dtype: torch.dtype, **kwargs: object) -> Const:
    """``op`` on scalars known now: computed on real 0-dim tensors of nvFuser's common ``dtype``.
    Integer arithmetic on symbolic sizes read back (``fd.ops.size``) stays symbolic
    (``_size_arithmetic``); any other op on one makes it a number (``Const.number``)."""
    if any(isinstance(c.value, torch.SymInt) for c in consts):
        size = _size_arithmetic(op, [c.value for c in consts], dtype, kwargs)
        if size is not None:
            return Const(size, dtype)
        consts = [c.number() for c in consts]
    args = [torch.tensor(c.value, dtype=dtype) for c in consts]
    overload = resolve_op(op)
    assert overload is not None
    try:
        r = overload(*args, **kwargs)
    except (RuntimeError, ValueError, ZeroDivisionError, OverflowError) as e:
        b.fail(f"{type(e).__name__}: {str(e)[:200]}")
    return Const(r.item(), r.dtype)


def _size_arithmetic(op: str, values: list, dtype: torch.dtype, kwargs: dict) -> int | torch.SymInt | None:
    """Integer ``op`` on sizes where one is symbolic: SymInt arithmetic (nvFuser's ``div`` and
    ``mod`` of integers truncate, which is Python's floor only where both are known to be
    non-negative); None where the op is no size arithmetic."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if dtype != torch.int64 or not all(isinstance(v, int | torch.SymInt) and not isinstance(v, bool) for v in values):
        return None
    if op in ("aten.add.Tensor", "aten.sub.Tensor"):
        alpha = kwargs.get("alpha", 1)
        if not isinstance(alpha, int) or isinstance(alpha, bool):
            return None
        a, c = values
        return a + alpha * c if op == "aten.add.Tensor" else a - alpha * c
    if op == "aten.mul.Tensor":
        return values[0] * values[1]
    if op == "aten.neg.default":
        return -values[0]
    if op in ("aten.maximum.default", "aten.minimum.default"):
        return (torch.sym_max if op == "aten.maximum.default" else torch.sym_min)(*values)
    truncating = op == "aten.fmod.Tensor" or (op == "aten.div.Tensor_mode" and kwargs.get("rounding_mode") == "trunc")
    if truncating and statically_known_true(values[0] >= 0) and statically_known_true(values[1] > 0):
        return values[0] // values[1] if op == "aten.div.Tensor_mode" else values[0] % values[1]
    return None


def _scalar_tensor(b: Builder, c: Const, dtype: torch.dtype) -> TVal:
    return b.emit("aten.scalar_tensor.default", c.value, dtype=dtype, device=torch.device(b.device))


# -- elementwise -----------------------------------------------------------------------------

def unary(name: str) -> FrontendOp:
    def build(a: Args) -> Value:
        x = a.operand("arg", sizes=True)
        if isinstance(x, Const):
            return fold(a.b, UNARY[name], [x], x.dtype)
        return a.b.emit(UNARY[name], x)
    return FrontendOp(("arg",), build)


def _common(b: Builder, operands: list[TVal | Const], float_op: bool = False) -> torch.dtype:
    dtype = nv_promote([b.kind(v) for v in operands])
    if float_op and not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.float32
    return dtype


def _elementwise(b: Builder, name: str, x: TVal | Const, y: TVal | Const, **kwargs: object) -> Value:
    tensor_op, scalar_op = BINARY[_SAME_AS.get(name, name)]
    common = nv_promote([b.kind(x), b.kind(y)])
    if name == "div":  # nvFuser's div: C's / on integers, true division on floats
        is_int = not (common.is_floating_point or common.is_complex)
        tensor_op = scalar_op = "aten.div.Tensor_mode" if is_int else "aten.div.Tensor"
        if is_int:
            kwargs["rounding_mode"] = "trunc"
    if isinstance(x, Const) and isinstance(y, Const):
        return fold(b, tensor_op, [x, y], common, **kwargs)
    x, y = (v.number() if isinstance(v, Const) else v for v in (x, y))  # a tensor's operand: a number
    # Note [scalars promote as nvFuser's]: operands torch would promote otherwise are cast first
    torch_common = torch.result_type(*(b.fakes[v.name] if isinstance(v, TVal) else v.value for v in (x, y)))
    if torch_common != common:
        x, y = (b.cast(v, common) if isinstance(v, TVal) else v for v in (x, y))
    if isinstance(x, Const):
        x = _scalar_tensor(b, x, common)
    if isinstance(y, Const):
        if scalar_op is None:
            y = _scalar_tensor(b, y, common)
        else:
            return b.emit(scalar_op, x, y, **kwargs)
    return b.emit(tensor_op, x, y, **kwargs)


def binary(name: str) -> FrontendOp:
    return FrontendOp(("arg1", "arg2"), lambda a: _elementwise(a.b, name, a.operand("arg1", sizes=True),
                                                              a.operand("arg2", sizes=True)))


def _with_alpha(name: str) -> FrontendOp:
    def build(a: Args) -> Value:
        alpha = a.operand("arg3")
        if not isinstance(alpha, Const):
            a.b.fail("alpha must be a scalar known when the graph is built")
        return _elementwise(a.b, name, a.operand("arg1"), a.operand("arg2"), alpha=alpha.value)
    return FrontendOp(("arg1", "arg2", "arg3"), build)


def _where(a: Args) -> Value:
    b, cond, x, y = a.b, a.operand("arg1"), a.operand("arg2"), a.operand("arg3")
    if isinstance(cond, Const):
        return x if cond.value else y
    if b.meta(cond).dtype != torch.bool:
        b.fail(f"the condition is {b.meta(cond).dtype}, not Bool")
    common = _common(b, [x, y])
    x, y = ((b.cast(v, common) if isinstance(v, TVal) else _scalar_tensor(b, v, common)) for v in (x, y))
    return b.emit("aten.where.self", cond, x, y)


def _lerp(a: Args) -> Value:
    b, start, end, weight = a.b, a.tensor("arg1"), a.tensor("arg2"), a.operand("arg3")
    common = _common(b, [start, end, weight])
    start, end = b.cast(start, common), b.cast(end, common)
    if isinstance(weight, Const):
        return b.emit("aten.lerp.Scalar", start, end, weight.value)
    return b.emit("aten.lerp.Tensor", start, end, b.cast(weight, common))


def _clamp(a: Args) -> Value:
    b, x, lo, hi = a.b, a.tensor("arg1"), a.operand("arg2"), a.operand("arg3")
    if isinstance(lo, Const) and isinstance(hi, Const):
        return b.emit("aten.clamp.default", b.cast(x, _common(b, [x, lo, hi])), lo.value, hi.value)
    common = _common(b, [x, lo, hi])
    lo_t, hi_t = ((b.cast(v, common) if isinstance(v, TVal) else _scalar_tensor(b, v, common)) for v in (lo, hi))
    return b.emit("aten.clamp.Tensor", b.cast(x, common), lo_t, hi_t)


def _cast(a: Args) -> Value:
    x, dtype = a.operand("arg"), a.dtype("dtype")
    assert dtype is not None
    if isinstance(x, Const):
        return fold(a.b, "aten.clone.default", [x], dtype)
    if a.b.meta(x).dtype == dtype:
        return dataclasses.replace(x, copy=True)
    return a.b.cast(x, dtype)


def _copy(a: Args) -> Value:
    return dataclasses.replace(a.tensor("arg"), copy=True)


OPS: dict[str, FrontendOp] = {
    **{n: unary(n) for n in UNARY},
    **{n: binary(n) for n in (*BINARY, "div", "mod")},
    "add_alpha": _with_alpha("add"), "sub_alpha": _with_alpha("sub"),
    "where": FrontendOp(("arg1", "arg2", "arg3"), _where),
    "lerp": FrontendOp(("arg1", "arg2", "arg3"), _lerp),
    "clamp": FrontendOp(("arg1", "arg2", "arg3"), _clamp),
    "cast": FrontendOp(("arg", "dtype"), _cast),
    "set": FrontendOp(("arg",), _copy), "segment_set": FrontendOp(("arg",), _copy),
    **SHAPE_OPS,
}
