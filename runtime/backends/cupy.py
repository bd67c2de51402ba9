"""The CuPy backend: generated CUDA kernels compiled by NVRTC through ``cupy.RawModule``,
launched on torch's current stream with the tensors' raw device pointers."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Sequence

import torch

from segmenter import Segment

from ..codegen import Kernel
from ..codegen.build import build_cuda
from ..emit.wrapper import Code
from .base import Backend, BuildContext, SegmentLaunch
from .kernels import KernelLaunch

__all__ = ["CupyBackend"]


def cuda_caller(fn, kernel: Kernel) -> Callable[..., None]:
    """Launch on torch's current stream. Tensors cross as their raw device pointers (no copy):
    measured cheaper per launch than DLPack capsules (which also refuse tensors that require
    grad, and bfloat16, which CuPy has no dtype for). A kernel of symbolic sizes (Note [kernel
    sizes as arguments]) is called with the call's grid and its symbols' values too, and with its
    block where that follows a size (Note [a row's block] in runtime/codegen/lowering/lower.py)."""
    import cupy
    import numpy

    launch = fn.kernel  # cupy.cuda.function.Function: takes the stream per call
    fixed_grid, fixed_block = (kernel.grid,), (kernel.block,)
    streams: dict[int, object] = {}
    uint64, int64 = numpy.uint64, numpy.int64
    raw_stream = torch._C._cuda_getCurrentRawStream
    get_device = cupy.cuda.runtime.getDevice

    def call(tensors: list[torch.Tensor], grid: int | None = None, symbols: tuple[int, ...] = (),
             block: int | None = None) -> None:
        index = tensors[0].device.index or 0
        s = raw_stream(index)  # torch's current stream on that device, as a raw pointer
        stream = streams.get(s)
        if stream is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = streams[s] = cupy.cuda.ExternalStream(s, index)
        args = tuple(uint64(t.data_ptr()) for t in tensors) + tuple(int64(v) for v in symbols)
        grid_ = fixed_grid if grid is None else (grid,)
        block_ = fixed_block if block is None else (block,)
        if index != get_device():
            with cupy.cuda.Device(index):
                launch(grid_, block_, args, stream=stream)
        else:
            launch(grid_, block_, args, stream=stream)

    return call


class CupyLaunch(KernelLaunch):
    def emit_call(self, code: Code, values: list[str]) -> None:
        k = self.kernel
        extra = ""
        if k.symbols:  # the grid and the symbols at this call (Note [kernel sizes as arguments])
            names = list(code.sizes.names.values()) if code.sizes is not None else []
            extra = f", {code.value(k.grid)}, ({''.join(names[i] + ', ' for i in k.symbols)})"
            if not isinstance(k.block, int):  # Note [a row's block]: it follows a size, computed here
                extra += f", {code.value(k.block)}"
        code.line(f"{self.built(code)}([{', '.join(code.var(v) for v in values)}]{extra})")


class CupyBackend(Backend):
    name = "cupy"
    device = "cuda"

    def unavailable(self, device_type: str) -> str | None:
        if importlib.util.find_spec("cupy") is None:
            return "cupy is not installed"
        why = super().unavailable(device_type)
        if why is None:
            import cupy

            if not cupy.cuda.is_available():
                why = "CuPy finds no CUDA device"
        return why

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        return CupyLaunch(self.name, ctx, seg)

    def build_all(self, launches: Sequence[SegmentLaunch]) -> None:
        for launch in launches:
            launch.fn = cuda_caller(build_cuda(launch.kernel), launch.kernel)  # type: ignore[attr-defined]
