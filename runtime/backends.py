"""Which backend runs each kernel segment: nvFuser, then CuPy, then torch (and, when asked for
by name, ``cpp``: the CuPy kernel generator's C++ target, compiled by the machine's compiler).

Each backend says whether it can run at all here (installed? the right device?); the program
then asks it to build the segment, and a backend that declines (``Declined``: an op the
generator does not take, a layout it cannot index...) is passed over with its reason recorded.
The torch backend takes every segment.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

__all__ = ["BACKENDS", "Backend", "backends_for"]


@dataclass(frozen=True)
class Backend:
    name: str
    module: str | None  # the package it needs
    device: str | None  # the device type it runs on (None: any)
    auto: bool  # tried without being asked for by name

    def unavailable(self, device_type: str) -> str | None:
        if self.module is not None and importlib.util.find_spec(self.module) is None:
            return f"{self.module} is not installed"
        if self.device is not None and device_type != self.device:
            return f"needs a {self.device.upper()} device (the graph is on {device_type})"
        if self.name == "cpp":
            from .codegen.build import cpu_compiler

            if cpu_compiler() is None:
                return "no C++ compiler found (set CXX)"
        if self.name == "nvfuser":
            why = _nvfuser_import_error()
            if why:
                return why
        if self.name == "cupy":
            import cupy

            if not cupy.cuda.is_available():
                return "CuPy finds no CUDA device"
        if self.name in os.environ.get("FUSEG_DISABLE", "").split(","):
            return "disabled by FUSEG_DISABLE"
        return None


@functools.cache
def _nvfuser_import_error() -> str | None:
    try:
        import nvfuser  # noqa: F401
    except Exception as e:  # noqa: BLE001 - an ABI mismatch raises ImportError, others OSError
        return f"nvfuser does not import: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


BACKENDS = (
    Backend("nvfuser", "nvfuser", "cuda", auto=True),
    Backend("cupy", "cupy", "cuda", auto=True),
    Backend("torch", None, None, auto=True),
    Backend("cpp", None, "cpu", auto=False),
)


def backends_for(device_type: str, forced: str = "auto") -> list[tuple[Backend, str | None]]:
    """The backends to try in order, each with why it cannot run here (None: it can)."""
    names = [b.name for b in BACKENDS]
    if forced != "auto" and forced not in names:
        raise ValueError(f"unknown backend {forced!r} (known: auto, {', '.join(names)})")
    out = []
    for b in BACKENDS:
        if forced == "auto" and not b.auto:
            continue
        if forced != "auto" and b.name not in (forced, "torch"):
            continue
        why = b.unavailable(device_type)
        if forced == b.name and why is not None:
            raise ValueError(f"backend {forced!r} is not available: {why}")
        out.append((b, why))
    if forced not in ("auto", "torch"):  # the named backend first, torch where it declines
        out.sort(key=lambda e: e[0].name == "torch")
    return out
