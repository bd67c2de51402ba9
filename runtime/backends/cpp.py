"""The C++ backend: generated kernels compiled by the machine's C++ compiler (the CPU default
where a compiler exists; torch takes the segments it declines, with the reason recorded)."""

from __future__ import annotations

from collections.abc import Sequence

from segmenter import Segment

from ..codegen import Declined
from ..codegen.build import build_cpu_many, cpu_compiler
from ..wrapper import Code
from .base import Backend, BuildContext, SegmentLaunch
from .kernels import KernelLaunch

__all__ = ["CppBackend"]


class CppLaunch(KernelLaunch):
    def emit_call(self, code: Code, tensors: list[str]) -> None:
        if self.fn is None:  # pragma: no cover - build_all runs before any emission
            raise RuntimeError("kernel not built")
        code.line(f"{code.const(self.fn)}({', '.join(f'{t}.data_ptr()' for t in tensors)})")


class CppBackend(Backend):
    name = "cpp"
    device = "cpu"

    def unavailable(self, device_type: str) -> str | None:
        why = super().unavailable(device_type)
        if why is None and cpu_compiler() is None:
            why = "no C++ compiler found (set CXX)"
        return why

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        return CppLaunch(self.name, ctx, seg)

    def build_all(self, launches: Sequence[SegmentLaunch]) -> dict[SegmentLaunch, str]:
        kernels = [launch.kernel for launch in launches]  # type: ignore[attr-defined]
        declined = {}
        for launch, fn in zip(launches, build_cpu_many(kernels)):
            if isinstance(fn, Declined):
                declined[launch] = str(fn)
            else:
                launch.fn = fn  # type: ignore[attr-defined]
        return declined
