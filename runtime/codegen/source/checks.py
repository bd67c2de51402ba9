"""Checks on every value that becomes generated source text (issue 14).

Note [checked source values]: a graph file is data, and it may come from ``from_json(...,
check_metas=False)`` or a fuser that records wrong metadata. Two rules keep it from running code
or making a kernel read memory it should not, whatever the loader checked:

1. Nothing is formatted into source unchecked. An argument reaches the source only through a
   checker here that enforces its Python type (an ``int`` and not a bool, str or float where an
   integer is meant; a real number for a scalar) and its range (an index within the dim it
   indexes, a step >= 1, a pad or size below ``MAX_EXTENT``) and returns the plain value that is
   then formatted (never the object the graph held). A value that fails raises ``Declined``,
   naming the node and the argument.
2. Recorded metas are not believed. The loops and index math of a kernel are sized by the shapes
   of the values inside it; ``check_segment_metas`` recomputes every node's output shape and
   dtype with torch's meta kernels from the layouts of the kernel's parameters (which the launch
   compares with the actual tensors at run time, storage size included: runtime/backends/kernels.py) and
   declines the segment where a recorded meta differs. Then every index the kernel computes is
   within its dim, so every read is within its parameter's elements.

A declined segment runs on torch, which raises its own error for a bad argument, as eager would.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

import torch

from segmenter import FusionGraph, Node, Segment, SegmentKind
from segmenter.ir.graph import OpRef, ValueRef
from segmenter.ir.ops import resolve_op
from segmenter.ir.symbolic import is_symbolic, size_key
from segmenter.ir.torch_compat import ShapeEnvGuardError

from .ctypes_ import Declined
from .symsizes import active_sizes, sizes_active

__all__ = ["MAX_EXTENT", "check_layout", "check_segment_metas", "dim_arg", "float_arg", "index_arg", "int_arg", "lone",
           "scalar_arg", "shape_ints", "slice_bounds"]

#: sizes, strides, offsets and pad widths above this are refused: an index expression and a
#: product of two of them stay within a 64-bit integer
MAX_EXTENT = 2**62


def _what(v: object) -> str:
    return f"{type(v).__name__} {v!r}"[:80]


def int_arg(v: object, what: str, lo: int = -MAX_EXTENT, hi: int = MAX_EXTENT) -> int:
    """``v`` as a plain int in [lo, hi], or Declined. Under a symbolic plan, a SymInt of the
    plan is taken as it is (Note [kernel sizes as arguments] in symsizes.py): its range is a
    condition of the plan, and it formats as its C expression."""
    if isinstance(v, torch.SymInt) and sizes_active():
        if not (lo <= v) or not (v <= hi):  # (each a condition of the plan)
            raise Declined(f"{what} = {v} is outside [{lo}, {hi}]")
        return v  # type: ignore[return-value]
    if not isinstance(v, int) or isinstance(v, bool):
        raise Declined(f"{what} must be an integer, got {_what(v)}")
    v = int(v)  # a plain int: an int subclass formats as it likes
    if not lo <= v <= hi:
        raise Declined(f"{what} = {v} is outside [{lo}, {hi}]")
    return v


def dim_arg(d: object, rank: int, what: str = "dim") -> int:
    """A dim of a rank-``rank`` tensor (negative counts from the end), normalized."""
    r = max(rank, 1)
    return int_arg(d, what, -r, r - 1) % r


def dims_arg(v: object, rank: int, what: str) -> list[int]:
    """A list of dims (permute's, flip's, squeeze's), each checked and normalized as ``dim_arg``."""
    if not isinstance(v, tuple):
        raise Declined(f"{what} must be a list of dims, got {type(v).__name__} {v!r:.60}")
    return [dim_arg(d, rank, what) for d in v]


def permutation_arg(v: object, rank: int) -> list[int]:
    """permute's dims: a checked list of dims, each of the ``rank`` dims once."""
    dims = dims_arg(v, rank, "permute dims")
    if sorted(dims) != list(range(rank)):
        raise Declined(f"permute dims {dims} are not a permutation of {rank} dims")
    return dims


def index_arg(i: object, n: int, what: str = "index") -> int:
    """An index into a dim of size ``n`` (negative counts from the end), normalized."""
    if n == 0:
        raise Declined(f"{what}: index into an empty dim")
    return int_arg(i, what, -n, n - 1) % n


def float_arg(v: object, what: str, finite: bool = True) -> float:
    """A real number (int or float, not bool or str) as a float; finite unless ``finite=False``."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise Declined(f"{what} must be a number, got {_what(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise Declined(f"{what} = {v} does not fit a double") from None
    if finite and not math.isfinite(f):
        raise Declined(f"{what} must be finite, got {f}")
    return f


def scalar_arg(v: object, what: str) -> bool | int | float:
    """A Scalar argument (bool, int or float; NaN and infinities are formatted as such)."""
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int_arg(v, what, -(2**63), 2**63 - 1)
    if isinstance(v, float):
        return float(v)
    raise Declined(f"{what} must be a bool, int or float, got {_what(v)}")


def slice_bounds(a: dict, n: int) -> tuple[int, int, int]:
    """start, end (clamped into [0, n], as torch clamps them) and step (>= 1) of a slice's
    bound arguments ``a`` over a dim of size ``n``."""
    start, end, step = a.get("start"), a.get("end"), a.get("step", 1)
    start = 0 if start is None else int_arg(start, "slice start", -(2**63), 2**63 - 1)
    end = n if end is None else int_arg(end, "slice end", -(2**63), 2**63 - 1)
    step = 1 if step is None else int_arg(step, "slice step", 1, MAX_EXTENT)
    start = min(max(start + n if start < 0 else start, 0), n)
    end = min(max(end + n if end < 0 else end, start), n)
    return start, end, step


def shape_ints(values: Iterable[object], what: str, lo: int = 0) -> tuple[int, ...]:
    """A list of plain ints, each in [lo, MAX_EXTENT]."""
    if not isinstance(values, (tuple, list)):
        raise Declined(f"{what} must be a list of integers, got {_what(values)}")
    if all(type(v) is int for v in values) and (not values or (min(values) >= lo and max(values) <= MAX_EXTENT)):
        return tuple(values)  # the common case, checked at once (a layout per value of every kernel)
    symbolic = sizes_active()  # (a symbolic size of a layout: read from a real tensor, as check_layout says)
    return tuple(v if symbolic and isinstance(v, torch.SymInt) else int_arg(v, f"{what}[{k}]", lo)
                 for k, v in enumerate(values))


def check_layout(shape: object, stride: object, what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A layout the kernel indexes: non-negative int sizes and strides of one rank, whose
    element count and furthest element stay below MAX_EXTENT."""
    shape_t, stride_t = shape_ints(shape, f"{what} shape"), shape_ints(stride, f"{what} stride")
    if len(shape_t) != len(stride_t):
        raise Declined(f"{what}: shape {list(shape_t)} and stride {list(stride_t)} differ in rank")
    if any(isinstance(x, torch.SymInt) for x in (*shape_t, *stride_t)):
        # a symbolic plan's sizes are read from real tensors at each call (Note [symbolic plans]):
        # a tensor that exists is within these bounds, so they are no condition to record (and
        # their arithmetic over symbols was most of what a symbolic kernel's lowering cost)
        return shape_t, stride_t
    if math.prod(shape_t) > MAX_EXTENT or sum((n - 1) * st for n, st in zip(shape_t, stride_t) if n) > MAX_EXTENT:
        raise Declined(f"{what}: layout {list(shape_t)} / {list(stride_t)} is too large to index")
    return shape_t, stride_t


# --- recorded metas against torch's meta kernels -------------------------------------------

_Spec = tuple[tuple[int, ...], tuple[int, ...], int, torch.dtype]  # shape, stride, offset, dtype
#: (op, arguments) -> the specs of its tensor outputs (None: not a tensor). Torch's meta kernels
#: of elementwise ops run in Python (150-300 us a call); a graph repeats a few (op, layouts)
#: thousands of times. The key is everything the meta kernel sees: the op, the default dtype,
#: every argument with its type (1, 1.0 and True are different keys) and each tensor's full
#: layout and dtype; a hit rebuilds each output with its offset (the lesson of Note [FakeTensor
#: cache and storage offsets] in segmenter/capturing/meta.py).
_META_CACHE: dict[tuple, tuple[_Spec | None, ...]] = {}
_META_CACHE_MAX = 1 << 16


def _meta_tensor(spec: _Spec) -> torch.Tensor:
    shape, stride, offset, dtype = spec
    extent = offset + (sum((n - 1) * st for n, st in zip(shape, stride)) + 1 if 0 not in shape else 0)
    return torch.empty(max(extent, 1), dtype=dtype, device="meta").as_strided(shape, stride, offset)


def _spec(t: torch.Tensor) -> _Spec:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype


def _key(a: object, env: dict[str, torch.Tensor]) -> object:
    if isinstance(a, ValueRef):
        return ("T", _spec(env[a.name]))
    if isinstance(a, tuple):
        return ("L", tuple(_key(x, env) for x in a))
    return (type(a), a)


def _meta_arg(a: object, env: dict[str, torch.Tensor], node: Node) -> object:
    if isinstance(a, ValueRef):
        return env[a.name]
    if isinstance(a, tuple):
        return [_meta_arg(x, env, node) for x in a]
    if isinstance(a, OpRef):
        raise Declined(f"node {node.name!r}: an op argument")
    return a


def lone(node: Node, inputs: tuple[str, ...]) -> Segment:
    """A segment of ``node`` alone reading ``inputs``: what ``check_segment_metas`` checks for a
    kernel of one op built outside the lowering (embedding, cumsum)."""
    return Segment(-1, SegmentKind.OPAQUE, (node,), inputs, tuple(o for o in node.outputs if o is not None), 0, 0)


def _symbolic_dispatch() -> contextlib.AbstractContextManager:
    """Symbolic sizes (a symbolic plan's kernel) run through the Python dispatcher, where torch's
    meta kernels take SymInts (a C++ composite would want numbers)."""
    if not sizes_active():
        return contextlib.nullcontext()
    from torch._dispatch.python import enable_python_dispatcher

    return enable_python_dispatcher()


# Note [checking a plan's metas once]: ``check_segment_metas`` runs each node of a kernel's
# segment on meta tensors of the layouts its inputs are planned to have. Where sizes are symbolic
# that is SymInt arithmetic in sympy for every size and stride, and a model's layers repeat the
# same nodes on the same symbolic layouts (under cProfile, qwen2's plan at its second prompt
# length spent 0.39 of the 0.62 s of choosing and lowering its launches there; what keeping them
# saves was not measured apart from the change it landed with, perf/results/amd-epyc-zen3/second_length_parts_cpu.json). Results of nodes with symbolic sizes are kept per plan (``SymbolicSizes.
# meta_checks``: one ShapeEnv, so a hit hands back SymInts of the same symbols, and the conditions
# the first run recorded are the plan's already), keyed by the op and its arguments with every
# size as its expression (``size_key``: sizes equal only at the hints key apart). The
# process-wide cache keeps plain sizes only, as before.


def _cache_slot(node: Node, env: dict[str, torch.Tensor]) -> tuple[dict | None, object]:
    """Where torch's results for ``node`` on ``env``'s values are kept, and their key: the
    process-wide cache where every size is a number; the plan's own where one is symbolic (never
    the process-wide one: a hit would hand another plan's SymInts, of another ShapeEnv, sealed,
    to this one: Note [hashing symbolic sizes]; Note [checking a plan's metas once]); nowhere for
    an unhashable argument or symbolic sizes outside a plan."""
    try:
        key = (node.op, torch.get_default_dtype(), _key(node.args, env),
               tuple((k, _key(v, env)) for k, v in node.kwargs))
        if not is_symbolic(key):
            hash(key)
            return _META_CACHE, key
        sizes = active_sizes()
        if sizes is None:
            return None, None
        key = size_key(key)
        hash(key)
        return sizes.meta_checks, key
    except TypeError:  # an unhashable argument
        return None, None


def check_segment_metas(graph: FusionGraph, seg: Segment, layouts: dict) -> dict[str, torch.Tensor]:
    """Declined unless every output of every node of ``seg`` has the shape and dtype torch's meta
    kernels compute from the layouts the kernel's inputs are planned to have (Note [checked
    source values], rule 2). Runs on the meta device: nothing is allocated or computed. Returns
    every value of ``seg`` as torch computes it there: a view's strides and storage offset are
    torch's own (each input starts at offset 0), never the recorded ones."""
    env: dict[str, torch.Tensor] = {}
    meta = torch.device("meta")
    for v in seg.inputs:
        shape, stride = layouts[v] if v in layouts else (graph.metas[v].shape, graph.metas[v].stride)
        shape, stride = check_layout(shape, stride, f"input %{v}")
        dtype = graph.metas[v].dtype
        if not isinstance(dtype, torch.dtype):
            raise Declined(f"input %{v}: dtype {_what(dtype)}")
        try:
            env[v] = torch.empty_strided(shape, stride, dtype=dtype, device=meta)
        except RuntimeError as e:  # e.g. a byte size beyond 64 bits
            raise Declined(f"input %{v}: {str(e).splitlines()[0][:200]}") from None
    for node in seg.nodes:
        op = resolve_op(node.op)
        if not isinstance(op, torch._ops.OpOverload):
            raise Declined(f"node {node.name!r}: {node.op} is not an ATen op")
        schema = op._schema.arguments
        args = [_meta_arg(a, env, node) for a in node.args]
        kwargs = {k: _meta_arg(v, env, node) for k, v in node.kwargs}
        # the device argument of a factory op (full, arange, _to_copy...) is the meta device here,
        # given or not (absent, it would be the default device): never a real allocation
        for k, a in enumerate(schema):
            if "Device" in str(a.type):
                if k < len(args):
                    args[k] = meta
                else:
                    kwargs[a.name] = meta
        store, key = _cache_slot(node, env)
        cached = store.get(key) if store is not None else None
        if cached is not None:
            results = (list(cached) if store is not _META_CACHE
                       else [None if s is None else _meta_tensor(s) for s in cached])
        else:
            try:
                with _symbolic_dispatch():
                    result = op(*args, **kwargs)
            except ShapeEnvGuardError:  # a size question after a plan was sealed: a bug, never a decline
                raise
            except Exception as e:  # noqa: BLE001 - torch refuses the arguments: the generator does too
                raise Declined(f"node {node.name!r} ({node.op}): torch refuses its arguments: "
                               f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            if store is _META_CACHE:
                if len(_META_CACHE) >= _META_CACHE_MAX:
                    _META_CACHE.clear()
                _META_CACHE[key] = tuple(_spec(r) if isinstance(r, torch.Tensor) else None for r in results)
            elif store is not None:
                store[key] = list(results)
        if len(results) != len(node.outputs):
            raise Declined(f"node {node.name!r}: {node.op} makes {len(results)} values, the graph says {len(node.outputs)}")
        for name, recorded, got in zip(node.outputs, node.metas, results):
            if name is None:
                continue
            if not isinstance(got, torch.Tensor) or recorded is None:
                raise Declined(f"node {node.name!r} output %{name}: not a tensor with a recorded meta")
            if tuple(recorded.shape) != tuple(got.shape) or recorded.dtype != got.dtype:
                raise Declined(f"node {node.name!r} output %{name}: recorded {list(recorded.shape)} {recorded.dtype}, "
                               f"torch computes {list(got.shape)} {got.dtype}")
            env[name] = got
    return env
