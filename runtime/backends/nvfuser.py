"""The nvFuser backend: each kernel segment lowered to one nvFuser FusionDefinition (the classic
Python frontend of ``nvfuser`` 0.2.35: ``define_tensor``, ``fd.ops.*``, ``add_output`` with
``alias_input`` for a mutated input).

UNVERIFIED: this lowering has never run. The one nvFuser wheel that carries this API for CUDA 13
(``nvfuser-cu130-torch210`` 0.2.35, built against torch 2.10) fails to import beside torch 2.11 on
the GPU machine we had (``undefined symbol: c10::MessageLogger``; perf/results/nvidia-h100/nvfuser_probe_h100.json),
and there is no nvFuser for this CPU machine. The API was read from nvFuser's own Python sources.
Where ``nvfuser`` does not import, the backend says so and the chooser passes over it.

After the first execution of each fusion the backend reads nvFuser's profile: a segment that
nvFuser itself split into more than one kernel is reported (``NvFuserLaunch.kernels_run``).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch

from segmenter import FusionGraph, Node, Segment, SegmentKind
from segmenter.formats.nvfuser.ops import BINARY, DTYPES, UNARY
from segmenter.ir.graph import ValueRef

from ..codegen import Declined
from ..codegen.kernel import bind
from ..codegen.kernel import norm_dim as _norm_dim
from ..codegen.source.checks import (
    MAX_EXTENT,
    check_layout,
    check_segment_metas,
    float_arg,
    index_arg,
    scalar_arg,
    shape_ints,
    slice_bounds,
)
from ..emit.wrapper import Code
from ..storage import layout
from .base import Backend, BuildContext, SegmentLaunch
from .kernels import bits_problem

__all__ = ["NvFuserBackend", "lower_to_nvfuser"]

# the importer's tables reversed (segmenter/formats/nvfuser/ops.py): ATen op -> frontend op of the same semantics
_UNARY = {aten: name for name, aten in UNARY.items()}
_BINARY = {op: name for name, ops in BINARY.items() for op in ops if op is not None}
_BINARY.update({"aten.add.Scalar": "add", "aten.sub.Scalar": "sub", "aten.mul.Scalar": "mul",
                "aten.div.Scalar": "truediv"})  # ``div`` truncates integers in nvFuser: aten's div is truediv
_DATATYPE = {dtype: name for name, dtype in DTYPES.items()}
_COPIES = {"aten._to_copy.default", "aten.clone.default", "aten.alias.default", "aten.detach.default",
           "aten.lift_fresh_copy.default", "aten.lift_fresh.default"}


def _dtype(nvf: Any, dtype: torch.dtype) -> Any:
    if dtype not in _DATATYPE:
        raise Declined(f"nvFuser lowering: dtype {dtype}")
    return getattr(nvf.DataType, _DATATYPE[dtype])


class _Lowering:
    def __init__(self, nvf: Any, fd: Any, graph: FusionGraph) -> None:
        self.nvf, self.fd, self.g = nvf, fd, graph
        self.vals: dict[str, Any] = {}

    def scalar(self, v: object, dtype: torch.dtype | None = None) -> Any:
        v = scalar_arg(v, "scalar argument")  # Note [checked source values]: nvFuser compiles it into its kernel
        if isinstance(v, bool):
            return self.fd.define_scalar(v, dtype=self.nvf.DataType.Bool)
        if isinstance(v, int) and (dtype is None or not dtype.is_floating_point):
            return self.fd.define_scalar(v, dtype=self.nvf.DataType.Int)
        return self.fd.define_scalar(float(v), dtype=self.nvf.DataType.Double)

    def arg(self, a: object, out_shape: tuple[int, ...], dtype: torch.dtype | None = None) -> Any:
        """A tensor argument broadcast to ``out_shape`` (nvFuser needs ranks to agree), or a scalar."""
        if not isinstance(a, ValueRef):
            return self.scalar(a, dtype)
        t, shape = self.vals[a.name], self.g.metas[a.name].shape
        if len(shape) < len(out_shape):
            off = len(out_shape) - len(shape)
            t = self.fd.ops.broadcast_in_dim(t, shape=list(out_shape), broadcast_dims=list(range(off, len(out_shape))))
        return t

    def node(self, node: Node) -> list[Any]:
        ops, op = self.fd.ops, node.op
        out = self.g.metas[node.outputs[0]] if node.outputs[0] else None
        a = bind(node)
        x = a.get("self", a.get("input"))
        xv = self.vals[x.name] if isinstance(x, ValueRef) else None
        xm = self.g.metas[x.name] if isinstance(x, ValueRef) else None
        cast = (lambda t: ops.cast(t, dtype=_dtype(self.nvf, out.dtype)))  # noqa: E731
        if op in _UNARY:
            return [cast(getattr(ops, _UNARY[op])(xv))]
        if op in _BINARY:
            other = a.get("other", a.get("exponent"))
            lhs, rhs = self.arg(x, out.shape, out.dtype), self.arg(other, out.shape, out.dtype)
            if a.get("alpha", 1) != 1:
                rhs = ops.mul(rhs, self.scalar(a["alpha"], out.dtype))
            return [cast(getattr(ops, _BINARY[op])(lhs, rhs))]
        if op == "aten.where.self":
            return [cast(ops.where(self.arg(a["condition"], out.shape), self.arg(x, out.shape, out.dtype),
                                   self.arg(a["other"], out.shape, out.dtype)))]
        if op in _COPIES:
            return [cast(xv)]
        if op in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"):
            return [ops.reshape(xv, new_shape=list(out.shape))]
        if op == "aten.permute.default":
            return [ops.permute(xv, dims=[_norm_dim(d, xm.ndim) for d in a["dims"]])]
        if op == "aten.expand.default":
            return [ops.expand(self.arg(x, out.shape), shape=list(out.shape))]
        if op == "aten.unsqueeze.default":
            d = _norm_dim(a["dim"], out.ndim)
            return [ops.broadcast_in_dim(xv, shape=list(out.shape), broadcast_dims=[k for k in range(out.ndim) if k != d])]
        if op in ("aten.squeeze.dim", "aten.squeeze.dims"):
            dims = [a["dim"]] if op == "aten.squeeze.dim" else list(shape_ints(a["dim"], "squeeze dims", -MAX_EXTENT))
            dims = [d for d in (_norm_dim(d, xm.ndim) for d in dims) if xm.shape[d] == 1]
            return [ops.squeeze(xv, dims=dims)] if dims else [xv]
        if op in ("aten.slice.Tensor", "aten.select.int"):
            dim = _norm_dim(a["dim"], xm.ndim)
            n = xm.shape[dim]
            starts, ends, steps = [0] * xm.ndim, list(xm.shape), [1] * xm.ndim
            if op == "aten.select.int":
                i = index_arg(a["index"], n, "select index")
                starts[dim], ends[dim] = i, i + 1
                return [ops.squeeze(ops.slice(xv, start_indices=starts, end_indices=ends, strides=steps), dims=[dim])]
            start, end, step = slice_bounds(a, n)
            starts[dim], ends[dim], steps[dim] = start, end, step
            return [ops.slice(xv, start_indices=starts, end_indices=ends, strides=steps)]
        if op == "aten.cat.default":
            if not isinstance(a["tensors"], tuple) or not all(isinstance(t, ValueRef) for t in a["tensors"]):
                raise Declined("nvFuser lowering: cat of something else than a list of values")
            ts = [self.vals[t.name] for t in a["tensors"] if self.g.metas[t.name].numel]
            return [ops.cat(ts, _norm_dim(a.get("dim", 0), out.ndim))]
        if op == "aten.constant_pad_nd.default":
            pads = list(shape_ints(a["pad"], "pad", -MAX_EXTENT))
            if len(pads) % 2 or len(pads) > 2 * xm.ndim:
                raise Declined(f"nvFuser lowering: pad {pads} for a rank-{xm.ndim} tensor")
            return [ops.pad(xv, pads, self.scalar(a.get("value", 0), out.dtype))]
        if op in ("aten.full.default", "aten.full_like.default", "aten.scalar_tensor.default"):
            value = a.get("fill_value", a.get("s"))
            return [ops.full(shape=list(out.shape), fill_value=self.scalar(value, out.dtype),
                             dtype=_dtype(self.nvf, out.dtype))]
        return self.reduction(node, a, xv, xm, out)

    def reduction(self, node: Node, a: dict, xv: Any, xm: Any, out: Any) -> list[Any]:
        ops, op = self.fd.ops, node.op
        if xv is None:
            raise Declined(f"nvFuser lowering: {op} is not supported")
        f32 = _dtype(self.nvf, torch.float64 if xm.dtype == torch.float64 else torch.float32)
        if op in ("aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.amin.default"):
            dims = a.get("dim") or range(xm.ndim)
            if not isinstance(dims, (tuple, list, range)):
                raise Declined(f"nvFuser lowering: {op} dims {type(dims).__name__}")
            dims = [_norm_dim(d, xm.ndim) for d in dims]
            keep = bool(a.get("keepdim", False))
            if op == "aten.amax.default":
                r = ops.max(xv, dims, keep)
            elif op == "aten.amin.default":
                r = ops.min(xv, dims, keep)
            else:
                r = ops.sum(ops.cast(xv, dtype=f32), dims, keep)
                if op == "aten.mean.dim":
                    count = 1
                    for d in dims:
                        count *= xm.shape[d]
                    r = ops.div(r, self.scalar(float(count)))
            return [ops.cast(r, dtype=_dtype(self.nvf, out.dtype))]
        if op in ("aten._softmax.default", "aten._log_softmax.default"):
            d = _norm_dim(a["dim"], xm.ndim)
            xf = ops.cast(xv, dtype=f32)
            shifted = ops.sub(xf, ops.max(xf, [d], True))
            s = ops.sum(ops.exp(shifted), [d], True)
            r = ops.div(ops.exp(shifted), s) if op == "aten._softmax.default" else ops.sub(shifted, ops.log(s))
            return [ops.cast(r, dtype=_dtype(self.nvf, out.dtype))]
        if op == "aten.native_layer_norm.default":
            k = len(shape_ints(a["normalized_shape"], "normalized_shape"))
            if k > xm.ndim:
                raise Declined(f"nvFuser lowering: layer norm over {k} dims of a rank-{xm.ndim} tensor")
            dims = list(range(xm.ndim - k, xm.ndim))
            xf = ops.cast(xv, dtype=f32)
            var, mean = ops.var_mean(xf, dims, 0, True)
            rstd = ops.rsqrt(ops.add(var, self.scalar(float_arg(a["eps"], "layer norm eps"))))
            y = ops.mul(ops.sub(xf, mean), rstd)
            for name, fn in (("weight", ops.mul), ("bias", ops.add)):
                if isinstance(a.get(name), ValueRef):
                    y = fn(y, self.arg(a[name], xm.shape))
            outs = [self.g.metas[o] if o else None for o in node.outputs]
            return [ops.cast(t, dtype=_dtype(self.nvf, m.dtype)) if m is not None else None
                    for t, m in zip((y, mean, rstd), outs)]
        raise Declined(f"nvFuser lowering: {op} is not supported")


def lower_to_nvfuser(nvf: Any, graph: FusionGraph, seg: Segment, in_place: dict[str, str],
                     strides: dict[str, tuple[int, ...]] | None = None) -> tuple[Any, list[str]]:
    """The FusionDefinition of ``seg`` and the segment outputs it returns, in order (an output
    written into a mutated input is an ``alias_input`` output and is not returned). ``strides``:
    the strides to define inputs with where not the planned ones (runtime/nvfuser_export.py)."""
    if seg.kind not in (SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION):
        raise Declined(f"{seg.kind.value} segments run on torch")
    # See Note [checked source values]: sizes and strides checked, recorded metas recomputed first
    layouts = {v: check_layout(graph.metas[v].shape, (strides or {}).get(v, graph.metas[v].stride), f"%{v}")
               for v in dict.fromkeys([*seg.inputs, *in_place.values()])}
    check_segment_metas(graph, seg, layouts)
    fd = nvf.FusionDefinition()
    returned: list[str] = []
    with fd:
        lw = _Lowering(nvf, fd, graph)
        targets: dict[str, Any] = {}
        for v in dict.fromkeys([*seg.inputs, *in_place.values()]):
            shape, stride = layouts[v]
            lw.vals[v] = fd.define_tensor(sizes=list(shape), strides=list(stride), dtype=_dtype(nvf, graph.metas[v].dtype),
                                          static_sizes=True, is_cpu=False)
            targets[v] = lw.vals[v]
        for node in seg.nodes:
            for name, val in zip(node.outputs, lw.node(node)):
                if name is not None:
                    lw.vals[name] = val
        written = {n.outputs[0]: in_place[n.name] for n in seg.nodes if n.name in in_place}
        for o in seg.outputs:
            if o in written:
                fd.add_output(lw.vals[o], alias_input=targets[written[o]])
            else:
                fd.add_output(lw.vals[o])
                returned.append(o)
    return fd, returned


class NvFuserLaunch(SegmentLaunch):
    """Runs the segment's FusionDefinition. ``kernels_run``: how many kernels nvFuser ran for it
    (read once, from its profile after the first execution; more than one means nvFuser split
    the segment)."""

    backend = "nvfuser"

    def __init__(self, ctx: BuildContext, seg: Segment) -> None:
        import nvfuser

        self.ctx, self.segment = ctx, seg
        graph = ctx.graph
        why = bits_problem(graph, seg)
        if why is not None:
            raise Declined(why)
        names = ctx.targets(seg)
        self.fd, self.returned = lower_to_nvfuser(nvfuser, graph, seg, names)
        self.args = list(dict.fromkeys([*seg.inputs, *names.values()]))
        self.written = {n.outputs[0]: names[n.name] for n in seg.nodes if n.name in names}
        self.kernels_run: int | None = None

    def __call__(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        first = self.kernels_run is None
        outs = self.fd.execute(args, profile=first)
        if first:
            self.kernels_run = self.fd.profile().segments
        return outs

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        graph = self.ctx.graph
        code.line(f"_r = {code.const(self)}([{', '.join(code.var(v) for v in self.args)}])")
        dead = [v for v in self.segment.inputs if v in dying]
        if dead:
            code.dels(dead)
        conform = code.const(layout.conform)
        for i, o in enumerate(self.returned):  # the planned layout, as torch's launch hands it on
            code.line(f"{code.var(o)} = {conform}(_r[{i}], {code.const(graph.metas[o])}, {code.const(o)})")
        code.line("del _r")
        for o, target in self.written.items():
            code.line(f"{code.var(o)} = {code.var(target)}")


class NvFuserBackend(Backend):
    name = "nvfuser"
    device = "cuda"

    def unavailable(self, device_type: str) -> str | None:
        if importlib.util.find_spec("nvfuser") is None:
            return "nvfuser is not installed"
        return super().unavailable(device_type) or _nvfuser_import_error()

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        return NvFuserLaunch(ctx, seg)


@functools.cache
def _nvfuser_import_error() -> str | None:
    try:
        import nvfuser  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an ABI mismatch raises ImportError, others OSError
        return f"nvfuser does not import: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None
