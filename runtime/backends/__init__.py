"""Backends are plug-ins: a name and a small interface (runtime/backends/base.py), found in this
registry. The program asks them in order for every kernel segment and never names one:

    CUDA:  nvfuser -> cupy -> torch        CPU:  cpp -> (im2col, half-matmul) -> torch

OPAQUE segments run on torch, except those a backend lists in ``opaque_ops``: a lone
convolution on the CPU is asked of cpp (depthwise ones: Note [depthwise convolutions] in
runtime/codegen/opaque/conv.py), then of im2col (groups 1: Note [small convolutions] in im2col.py); a
lone embedding or cumsum is asked of cpp (Note [embedding kernels] in runtime/codegen/opaque/embedding.py,
Note [cumsum kernels] in runtime/codegen/opaque/scan.py). An fp16/bf16 matmul the cpp backend declines
is asked of half-matmul (Note [half matmuls in float] in half_matmul.py).
A backend that cannot run here (not installed, another device, no compiler) or declines a
segment (an op the generator does not take...) is passed over, with the reason recorded in
``program.passed_over``; torch takes every segment. ``backend="name"`` asks for one backend
(torch still takes what it declines); the ``disable`` runtime option (``FUSEG_DISABLE=cpp,cupy``)
passes over backends by name.
"""

from __future__ import annotations

from runtime.options import current

from .base import Backend, BuildContext, SegmentLaunch
from .cpp import CppBackend
from .cupy import CupyBackend
from .half_matmul import HalfMatmulBackend
from .im2col import Im2colBackend
from .nvfuser import NvFuserBackend
from .torch_backend import TorchBackend

__all__ = ["BACKENDS", "Backend", "BuildContext", "SegmentLaunch", "backends_for"]

BACKENDS: tuple[Backend, ...] = (NvFuserBackend(), CupyBackend(), CppBackend(), Im2colBackend(), HalfMatmulBackend(),
                                 TorchBackend())


def backends_for(device_type: str, forced: str = "auto") -> list[tuple[Backend, str | None]]:
    """The backends to try in order, each with why it cannot run here (None: it can); torch last."""
    names = [b.name for b in BACKENDS]
    if forced != "auto" and forced not in names:
        raise ValueError(f"unknown backend {forced!r} (known: auto, {', '.join(names)})")
    disabled = current().disable
    out = []
    for b in BACKENDS:
        if forced != "auto" and b.name not in (forced, "torch"):
            continue
        if forced == "auto" and not b.auto:
            continue
        why = b.unavailable(device_type)
        if why is None and b.name in disabled and b.name != "torch":
            why = "disabled (the disable option, FUSEG_DISABLE)"
        if forced == b.name and why is not None:
            raise ValueError(f"backend {forced!r} is not available: {why}")
        out.append((b, why))
    return out
