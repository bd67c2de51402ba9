"""nvFuser's shape, reduction, factory, gather and matmul ops as ATen ops (the elementwise ones
and the module's Note are in segmenter/formats/nvfuser/ops.py)."""

from __future__ import annotations

import math

import torch

from ...ir.limits import MAX_DIM, MAX_RANK
from ...ir.symbolic import is_symbolic
from .build import Args, Builder, Const, FrontendOp, TVal, Value, Vec

__all__ = ["SHAPE_OPS", "reshape", "stride_order"]

MAX_CAT = 4096  # tensors in one cat


def reshape(b: Builder, x: TVal, shape: tuple[int, ...]) -> TVal:
    """torch's reshape: a view where the layout allows one, else a contiguous copy viewed."""
    if shape == b.meta(x).shape:
        return x
    try:
        with b.running():
            b.fakes[x.name].view(shape)
    except (RuntimeError, ValueError):
        x = b.emit("aten.clone.default", x, memory_format=torch.contiguous_format)
    return b.emit("aten.view.default", x, list(shape))


def stride_order(b: Builder, x: TVal, order: tuple[int, ...]) -> TVal:
    """``x`` copied into the layout ``order`` names: ``order[d]`` ranks dim d's stride, the
    highest the outermost (``[1, 0]`` is row-major for 2 dims)."""
    ndim = b.meta(x).ndim
    if sorted(order) != list(range(ndim)):
        b.fail(f"stride_order {list(order)} is not a permutation of the {ndim} dims")
    perm = sorted(range(ndim), key=lambda d: -order[d])  # outermost first
    if perm == list(range(ndim)):
        return b.emit("aten.clone.default", x, memory_format=torch.contiguous_format)
    y = b.emit("aten.clone.default", b.emit("aten.permute.default", x, perm), memory_format=torch.contiguous_format)
    return b.emit("aten.permute.default", y, [perm.index(d) for d in range(ndim)])


def _shape(a: Args, key: str, x: TVal | None = None) -> tuple[int, ...]:
    """An output shape: sizes >= 0 (symbolic ones too), or -1 (the input's size, where ``x`` is
    given)."""
    shape = a.ints(key, -1 if x is not None else 0, MAX_DIM, sizes=True)
    if x is not None and len(shape) == a.b.meta(x).ndim:
        shape = tuple(a.b.meta(x).shape[d] if s == -1 else s for d, s in enumerate(shape))
    if any(s < 0 for s in shape):
        a.b.fail(f"{key} {a.b.text(shape)}: -1 stands only for an input size that is kept")
    if not is_symbolic(shape) and math.prod(shape) >= MAX_DIM:  # (a symbolic one: its result's bytes are)
        a.b.fail(f"{key} {a.b.text(shape)} has {a.b.size_text(math.prod(shape))} elements (fewer than {MAX_DIM})")
    return shape


# -- views ---------------------------------------------------------------------------------------

def _broadcast_in_dim(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    shape, dims = _shape(a, "shape"), a.ints("broadcast_dims", 0, MAX_RANK)
    if len(dims) != b.meta(x).ndim or any(p >= q for p, q in zip(dims, dims[1:])) or (dims and dims[-1] >= len(shape)):
        b.fail(f"broadcast_dims {list(dims)} must name each of the {b.meta(x).ndim} input dims, in increasing order, "
               f"among the {len(shape)} output dims")
    for d in range(len(shape)):
        if d not in dims:
            x = b.emit("aten.unsqueeze.default", x, d)
    if b.meta(x).shape != shape:
        x = b.emit("aten.expand.default", x, list(shape))
    return x


def _broadcast(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    flags = a.get("is_broadcast_dim")
    if not isinstance(flags, tuple) or not all(isinstance(f, bool) for f in flags) or len(flags) > MAX_RANK:
        b.fail("is_broadcast_dim must be a list of True/False")
    if sum(not f for f in flags) != b.meta(x).ndim:
        b.fail(f"is_broadcast_dim {list(flags)} keeps {sum(not f for f in flags)} dims of a rank-{b.meta(x).ndim} tensor")
    for d, f in enumerate(flags):
        if f:
            x = b.emit("aten.unsqueeze.default", x, d)
    return x


def _expand(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    shape = _shape(a, "shape", x)
    if len(shape) != b.meta(x).ndim:
        b.fail(f"shape {b.text(shape)} has another rank than the rank-{b.meta(x).ndim} input")
    return x if shape == b.meta(x).shape else b.emit("aten.expand.default", x, list(shape))


def _reshape(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    if a.get("new_shape") is None:  # reshape(x, new_shape) written positionally
        a.values["new_shape"], a.values["original_shape"] = a.get("original_shape"), None
    if a.get("new_shape") is None:
        b.fail("new_shape missing")
    if a.get("original_shape") is not None and a.ints("original_shape", 0, sizes=True) != b.meta(x).shape:
        b.fail(f"original_shape {b.text(a.ints('original_shape', 0, sizes=True))} is not the input's "
               f"{b.text(b.meta(x).shape)}")
    shape = a.ints("new_shape", -1, sizes=True)
    if shape.count(-1) > 1 or any(s < -1 for s in shape):
        b.fail(f"new_shape {b.text(shape)}: at most one size may be inferred (-1)")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        numel = b.meta(x).numel
        if known == 0 or numel % known:
            b.fail(f"new_shape {b.text(shape)} does not divide the {b.size_text(numel)} elements")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    if math.prod(shape) != b.meta(x).numel:
        b.fail(f"new_shape {b.text(shape)} holds {b.size_text(math.prod(shape))} elements, the input "
               f"{b.size_text(b.meta(x).numel)}")
    return reshape(b, x, shape)


def _permute(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    dims = a.dims("dims", b.meta(x).ndim)
    if len(dims) != b.meta(x).ndim:
        b.fail(f"dims {list(dims)} is not a permutation of the {b.meta(x).ndim} dims")
    return b.emit("aten.permute.default", x, list(dims))


def _squeeze(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    dims = a.dims("dims", b.meta(x).ndim)
    a.flag("squeeze_expanded")  # checked; an expanded dim has its expanded size here and is refused below
    wide = [d for d in dims if b.meta(x).shape[d] != 1]
    if wide:
        b.fail(f"dims {wide} of {b.text(b.meta(x).shape)} are not of size 1")
    return b.emit("aten.squeeze.dims", x, list(dims)) if dims else x


def _slice(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    m = b.meta(x)
    starts, ends = a.ints("start_indices", sizes=True), a.ints("end_indices", sizes=True)
    steps = a.ints("strides", 1) if a.get("strides") is not None else (1,) * m.ndim
    if not len(starts) == len(ends) == len(steps) == m.ndim:
        b.fail(f"start_indices, end_indices and strides need one entry per dim of the rank-{m.ndim} input")
    manual = a.flag("manual_normalization")
    for d, (start, end, step, n) in enumerate(zip(starts, ends, steps, m.shape)):
        if manual and not 0 <= start <= end <= n:
            b.fail(f"dim {d}: [{b.size_text(start)}, {b.size_text(end)}) is not within [0, {b.size_text(n)}] (manual_normalization)")
        if start == 0 and end >= n and step == 1:
            continue  # torch's slice.Tensor normalizes as nvFuser does: negative from the end, clamped
        x = b.emit("aten.slice.Tensor", x, d, start, end, step)
    return x


def _pad(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    widths = a.ints("pad_widths", most=2 * MAX_RANK)
    if len(widths) % 2 or len(widths) > 2 * b.meta(x).ndim:
        b.fail(f"pad_widths {list(widths)}: two widths a dim, for at most the {b.meta(x).ndim} dims")
    if a.get("value") is None:
        value: object = Const(False if b.meta(x).dtype == torch.bool else 0, b.meta(x).dtype)
    else:
        value = a.operand("value")
    if not isinstance(value, Const):
        b.fail(f"value must be a scalar known when the graph is built, got {type(value).__name__}")
    is_float = b.meta(x).dtype.is_floating_point or b.meta(x).dtype.is_complex
    if not is_float and isinstance(value.value, float) and not value.value.is_integer():
        b.fail(f"pad value {value.value} for a {b.meta(x).dtype} tensor")
    return b.emit("aten.constant_pad_nd.default", x, list(widths), value.value)


def _cat(a: Args) -> Value:
    b = a.b
    ts = a.get("tensors")
    if not isinstance(ts, tuple) or not ts or len(ts) > MAX_CAT or not all(isinstance(t, TVal) for t in ts):
        b.fail(f"tensors must be a list of 1 to {MAX_CAT} tensors")
    if a.flag("manual_padding"):
        b.fail("manual_padding=True (inputs padded by hand) is not read")
    dtypes = {b.meta(t).dtype for t in ts}
    if len(dtypes) > 1:
        b.fail(f"tensors of different dtypes {sorted(str(d) for d in dtypes)}")
    ndim = b.meta(ts[0]).ndim
    return b.emit("aten.cat.default", list(ts), a.dim("dim", ndim))


def _select(a: Args) -> Value:
    b, x = a.b, a.tensor("arg")
    dim = a.dim("dim", b.meta(x).ndim)
    return b.emit("aten.select.int", x, dim, a.int("index", -b.meta(x).shape[dim], b.meta(x).shape[dim] - 1))


def _size(a: Args) -> Value:
    x = a.tensor("arg")
    return Const(a.b.meta(x).shape[a.dim("dim", a.b.meta(x).ndim)], torch.int64)


def _at(a: Args) -> Value:
    v = a.get("arg")
    if not isinstance(v, Vec):
        a.b.fail("at reads an element of a vector")
    return v.items[a.int("index", -len(v.items), len(v.items) - 1)]


# -- reductions ----------------------------------------------------------------------------------

def _reduction(op: str) -> FrontendOp:
    def build(a: Args) -> Value:
        b, x = a.b, a.tensor("arg")
        ndim = b.meta(x).ndim
        dims = tuple(range(ndim)) if a.get("dims") is None else a.dims("dims", ndim)  # no dims: all
        if not dims and ndim:
            b.fail("no dim to reduce")
        dtype = a.dtype("dtype", null_ok=True)
        keep = a.flag("keepdim")
        if op == "sum":
            return b.emit("aten.sum.dim_IntList", x, list(dims), keep, dtype=dtype)
        if dtype is not None:
            b.fail(f"{op} takes no dtype")
        return b.emit(f"aten.a{op}.default", x, list(dims), keep)
    return FrontendOp(("arg", "dims", "keepdim", "dtype"), build, {"dims": None, "keepdim": False, "dtype": None},
                      {"dim": "dims"})


def _variance(with_mean: bool) -> FrontendOp:
    def build(a: Args) -> Value | tuple[Value, ...]:
        b, x = a.b, a.tensor("arg")
        dims, correction, keep = a.dims("dims", b.meta(x).ndim), a.int("correction", 0), a.flag("keepdim")
        if with_mean:
            return tuple(b.emit_all("aten.var_mean.correction", x, list(dims), correction=correction, keepdim=keep, n=2))
        return b.emit("aten.var.correction", x, list(dims), correction=correction, keepdim=keep)
    defaults: dict[str, object] = {"keepdim": False, **({"correction": 1} if with_mean else {})}
    return FrontendOp(("arg", "dims", "correction", "keepdim"), build, defaults)


# -- factories -----------------------------------------------------------------------------------

def _full(a: Args) -> Value:
    b, shape, dtype = a.b, _shape(a, "shape"), a.dtype("dtype")
    fill = a.operand("fill_value")
    device = torch.device(b.device)
    if isinstance(fill, Const):
        return b.emit("aten.full.default", list(shape), fill.value, dtype=dtype, device=device)
    value = b.emit("aten._to_copy.default", fill, dtype=dtype, device=device)  # a scalar input, as nvFuser casts it
    return b.emit("aten.clone.default", b.emit("aten.expand.default", value, list(shape)))


def _iota(a: Args) -> Value:
    b, dtype, length = a.b, a.dtype("dtype"), a.int("length", 0)
    assert dtype is not None
    is_float = dtype.is_floating_point
    kind = float if is_float else int
    start_v, step_v = kind(0), kind(1)
    for key in ("start", "step"):
        v = a.get(key)
        if v is None:
            continue
        v = v.value if isinstance(v, Const) else v
        if type(v) is not kind:  # nvFuser: start and step of the iota's own category
            b.fail(f"{key} must be a {kind.__name__} scalar known when the graph is built, for a {dtype} iota")
        start_v, step_v = (v, step_v) if key == "start" else (start_v, v)
    if step_v == 0:
        b.fail("step must not be 0")
    device = torch.device(b.device)
    if not is_float:  # exact: start + i * step for i < length
        return b.emit("aten.arange.start_step", start_v, start_v + length * step_v, step_v, dtype=dtype, device=device)
    out = b.emit("aten.arange.default", length, dtype=dtype, device=device)
    if step_v != 1:
        out = b.emit("aten.mul.Tensor", out, step_v)
    return b.emit("aten.add.Tensor", out, start_v) if start_v != 0 else out


# -- gathers and matmuls -------------------------------------------------------------------------

def _index_select(a: Args) -> Value:
    x = a.tensor("arg")
    return a.b.emit("aten.index_select.default", x, a.dim("dim", a.b.meta(x).ndim), a.tensor("index"))


def _gather(equal_extents: bool) -> FrontendOp:
    def build(a: Args) -> Value:
        b, x, index = a.b, a.tensor("arg1"), a.tensor("index")
        mx, mi = b.meta(x), b.meta(index)
        dim = a.dim("dim", mx.ndim)
        if mi.ndim != mx.ndim:
            b.fail(f"index of rank {mi.ndim} for a rank-{mx.ndim} input")
        bad = [d for d in range(mx.ndim) if d != dim and (mi.shape[d] != mx.shape[d] if equal_extents
                                                           else mi.shape[d] > mx.shape[d])]
        if bad:
            b.fail(f"index {b.text(mi.shape)} and input {b.text(mx.shape)} differ in dims {bad}")
        return b.emit("aten.gather.default", x, dim, index)
    return FrontendOp(("arg1", "index", "dim"), build)


def _linear(a: Args) -> Value:
    bias = a.get("bias")
    if bias is None:
        return a.b.emit("aten.linear.default", a.tensor("arg1"), a.tensor("arg2"))
    return a.b.emit("aten.linear.default", a.tensor("arg1"), a.tensor("arg2"), a.tensor("bias"))


SHAPE_OPS: dict[str, FrontendOp] = {
    "broadcast_in_dim": FrontendOp(("arg", "shape", "broadcast_dims"), _broadcast_in_dim),
    "broadcast": FrontendOp(("arg", "is_broadcast_dim"), _broadcast),
    "expand": FrontendOp(("arg", "shape"), _expand),
    "reshape": FrontendOp(("arg", "original_shape", "new_shape"), _reshape, {"original_shape": None, "new_shape": None}),
    "permute": FrontendOp(("arg", "dims"), _permute),
    "squeeze": FrontendOp(("arg", "dims", "squeeze_expanded"), _squeeze, {"squeeze_expanded": False}),
    "slice": FrontendOp(("arg", "start_indices", "end_indices", "strides", "manual_normalization"), _slice,
                        {"strides": None, "manual_normalization": False}),
    "pad": FrontendOp(("arg", "pad_widths", "value"), _pad, {"value": None}),
    "cat": FrontendOp(("tensors", "dim", "manual_padding"), _cat, {"dim": 0, "manual_padding": False}),
    "select": FrontendOp(("arg", "index", "dim"), _select),
    "stride_order": FrontendOp(("arg", "stride_order"),
                               lambda a: stride_order(a.b, a.tensor("arg"), a.ints("stride_order", 0, MAX_RANK))),
    "size": FrontendOp(("arg", "dim"), _size),
    "shape": FrontendOp(("arg",), lambda a: Vec(tuple(Const(s, torch.int64) for s in a.b.meta(a.tensor("arg")).shape))),
    "at": FrontendOp(("arg", "index"), _at),
    "sum": _reduction("sum"), "max": _reduction("max"), "min": _reduction("min"),
    "var": _variance(False), "var_mean": _variance(True),
    "full": FrontendOp(("shape", "fill_value", "dtype"), _full),
    "iota": FrontendOp(("length", "start", "step", "dtype"), _iota, {"start": None, "step": None, "dtype": torch.int64}),
    "index_select": FrontendOp(("arg", "index", "dim"), _index_select),
    "gather": _gather(False), "take_along_axis": _gather(True),
    "linear": FrontendOp(("arg1", "arg2", "bias"), _linear, {"bias": None}),
    "matmul": FrontendOp(("arg1", "arg2"), lambda a: a.b.emit("aten.matmul.default", a.tensor("arg1"), a.tensor("arg2"))),
}
