"""Launching a generated kernel (runtime.codegen) for a segment: CuPy on CUDA, C++ on the CPU.

The kernel is lowered and compiled when the program is compiled, for the layouts the values
will have at run time (see ``layouts``); at run time each input is checked against that layout
(a cheap tuple comparison) and a mismatch runs the segment on torch instead of misreading it.
Outputs are written into buffers allocated here, in their planned layout, or, for a mutated
input whose final value the kernel computes (Note [in-place write-back]), into the input itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from segmenter import FusionGraph, GraphError, OpKind, Segment, op_info

from .codegen import Kernel, lower_segment
from .codegen.build import build_cpu, build_cuda
from .codegen.index import dense_strides

__all__ = ["generated_launch", "layouts"]

Env = dict[str, torch.Tensor]


def layouts(graph: FusionGraph, seg: Segment, materialize: frozenset[str], written: dict[str, str]) -> dict:
    """value -> (shape, strides) the kernel reads (inputs) or writes (outputs)."""
    out = {}
    for v in (*seg.inputs, *seg.outputs):
        m = graph.metas[v]
        if v in written:
            t = graph.metas[written[v]]
            out[v] = (t.shape, t.stride)
        elif v in materialize:
            out[v] = (m.shape, dense_strides(m.shape, m.stride))
        else:
            out[v] = (m.shape, m.stride)
    return out


def _views_of_outputs(graph: FusionGraph, seg: Segment) -> dict[str, str]:
    """Outputs of ``seg`` that are views (a chain of view ops, same dtype) of a value the kernel
    computes: as in the program, they are made with as_strided on that value after the launch
    (which the kernel then writes whole), so they share its storage and keep their offsets."""
    made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
    views = {}
    for o in seg.outputs:
        v = o
        while v in made and op_info(made[v].op).kind == OpKind.VIEW and len(made[v].inputs) == 1:
            v = made[v].inputs[0]
        if v != o and v in made and graph.metas[v].dtype == graph.metas[o].dtype:
            views[o] = v
    return views


def _same(t: torch.Tensor, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> bool:
    return (t.dtype == dtype and tuple(t.shape) == shape
            and all(a == b for n, a, b in zip(shape, t.stride(), stride) if n != 1))


def _span(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes from a tensor's first element to the end of its last one, in this layout."""
    if 0 in shape:
        return 0
    return (sum((n - 1) * st for n, st in zip(shape, stride)) + 1) * dtype.itemsize


def _check_storage(t: torch.Tensor, span: int, value: str) -> None:
    """Note [kernel reads stay in storage]: the kernel indexes a tensor from its data pointer
    (its storage offset included) by the planned shape and strides, which ``_same`` compared
    with the tensor's; what is left is that the storage really holds that span past the offset.
    torch's own views always do, but a storage resized (or set_) behind a tensor's back does not,
    and eager itself would read out of bounds there: refused."""
    if t.storage_offset() * t.itemsize + span > t.untyped_storage().nbytes():
        raise GraphError(f"value %{value}: its storage holds {t.untyped_storage().nbytes()} bytes, fewer than "
                         f"its layout reaches ({t.storage_offset() * t.itemsize + span}): not read")


def generated_launch(graph: FusionGraph, seg: Segment, target: str, materialize: frozenset[str],
                     dying: tuple[str, ...], in_place: dict[str, int], fallback: Callable[[Env], None],
                     ) -> tuple[Callable[[Env], None], Kernel]:
    """The launch callable and its kernel; raises Declined where the generator does not take ``seg``."""
    targets = {n.name: graph.inputs[i].name for n, i in ((n, in_place.get(n.name)) for n in seg.nodes) if i is not None}
    written = {n.outputs[0]: targets[n.name] for n in seg.nodes if n.name in targets}
    # (a value that crosses launches as a dense copy, in pre/off, is written by the kernel itself)
    views = {o: b for o, b in _views_of_outputs(graph, seg).items() if o not in materialize and b not in materialize}
    written_outputs = [o for o in seg.outputs if o not in views]
    seg = dataclasses.replace(seg, outputs=tuple(dict.fromkeys([*written_outputs, *views.values()])))
    kernel = lower_segment(graph, seg, layouts(graph, seg, materialize, written), targets, materialize)
    hidden = {b for b in views.values() if b not in written_outputs}  # written for their views only
    view_plans = [(o, b, graph.metas[o], graph.metas[o].storage_offset - graph.metas[b].storage_offset)
                  for o, b in views.items()]
    fn = build_cuda(kernel) if target == "cuda" else build_cpu(kernel)
    ins = [(p, _span(p.shape, p.stride, p.dtype)) for p in kernel.params if not p.output]
    outs = [p for p in kernel.params if p.output]
    # an output written into an input (in place) is read and written through it: checked as the inputs
    targets_in = [(p, _span(p.shape, p.stride, p.dtype)) for p in outs if p.target]
    device = torch.device(graph.inputs[0].meta.device) if graph.inputs else torch.device("cpu")
    if target == "cuda":
        call = _cuda_caller(fn, kernel)
    else:
        def call(tensors: list[torch.Tensor]) -> None:
            fn(*[t.data_ptr() for t in tensors])
    #: how often a run found an input in another layout than planned (and ran on torch)
    stats = {"layout_fallbacks": 0}

    def run(env: Env) -> None:
        args = []
        for p, span in ins:
            t = env[p.value]
            if not _same(t, p.shape, p.stride, p.dtype):
                stats["layout_fallbacks"] += 1
                fallback(env)
                return
            _check_storage(t, span, p.value)
            args.append(t)
        for p, span in targets_in:
            t = env[p.target]
            if not _same(t, p.shape, p.stride, p.dtype):
                stats["layout_fallbacks"] += 1
                fallback(env)
                return
            _check_storage(t, span, p.target)
        results = []
        for p in outs:
            t = env[p.target] if p.target else torch.empty_strided(p.shape, p.stride, dtype=p.dtype, device=device)
            args.append(t)
            results.append(t)
        if any(t.numel() for t in results):
            call(args)
        for v in dying:
            del env[v]
        made = dict(zip((p.value for p in outs), results))
        for o, b, m, delta in view_plans:  # views stay views of what they view, as in the program
            base = made[b]
            env[o] = base.as_strided(m.shape, m.stride, base.storage_offset() + delta)
        for name, t in made.items():
            if name not in hidden:
                env[name] = t

    run.stats = stats  # type: ignore[attr-defined]
    return run, kernel


def _cuda_caller(fn, kernel: Kernel) -> Callable[[list[torch.Tensor]], None]:
    """Launch on torch's current stream. Tensors cross as their raw device pointers (no copy):
    measured cheaper per launch than DLPack capsules (which also refuse tensors that require
    grad, and bfloat16, which CuPy has no dtype for)."""
    import warnings

    import cupy
    import numpy

    launch = fn.kernel  # cupy.cuda.function.Function: takes the stream per call
    grid, block = (kernel.grid,), (kernel.block,)
    streams: dict[int, object] = {}
    uint64 = numpy.uint64
    raw_stream = torch._C._cuda_getCurrentRawStream
    get_device = cupy.cuda.runtime.getDevice

    def call(tensors: list[torch.Tensor]) -> None:
        index = tensors[0].device.index or 0
        s = raw_stream(index)  # torch's current stream on that device, as a raw pointer
        stream = streams.get(s)
        if stream is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = streams[s] = cupy.cuda.ExternalStream(s, index)
        args = tuple(uint64(t.data_ptr()) for t in tensors)
        if index != get_device():
            with cupy.cuda.Device(index):
                launch(grid, block, args, stream=stream)
        else:
            launch(grid, block, args, stream=stream)

    return call
