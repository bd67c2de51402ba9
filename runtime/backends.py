"""Which backend runs each kernel segment: nvFuser, then CuPy, then torch.

Each backend says whether it can run at all here (installed? the right device?) and whether it
takes a given segment; the first that does runs it, and every step down the list is recorded
with its reason. Only the torch backend exists yet: the nvFuser lowering and the CuPy kernel
generator are not built, and say so.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from segmenter import FusionGraph, Segment

__all__ = ["BACKENDS", "Choice", "choose_backend"]


@dataclass(frozen=True)
class _Backend:
    name: str
    module: str | None  # the package it needs
    needs_cuda: bool
    built: bool

    def unavailable(self, device_type: str) -> str | None:
        if self.module is not None and importlib.util.find_spec(self.module) is None:
            return f"{self.module} is not installed"
        if self.needs_cuda and device_type != "cuda":
            return f"needs a CUDA device (the graph is on {device_type})"
        if not self.built:
            return "not built yet"
        return None

    def declines(self, graph: FusionGraph, seg: Segment) -> str | None:
        return None


BACKENDS = (
    _Backend("nvfuser", "nvfuser", needs_cuda=True, built=False),
    _Backend("cupy", "cupy", needs_cuda=True, built=False),
    _Backend("torch", None, needs_cuda=False, built=True),
)


@dataclass(frozen=True)
class Choice:
    backend: str
    passed_over: tuple[tuple[str, str], ...]  # (backend, why not), in order


def choose_backend(graph: FusionGraph, seg: Segment, forced: str = "auto") -> Choice:
    device_type = graph.inputs[0].meta.device_type if graph.inputs else "cpu"
    names = [b.name for b in BACKENDS]
    if forced != "auto" and forced not in names:
        raise ValueError(f"unknown backend {forced!r} (known: auto, {', '.join(names)})")
    passed: list[tuple[str, str]] = []
    for b in BACKENDS:
        if forced != "auto" and b.name != forced:
            continue
        why = b.unavailable(device_type) or b.declines(graph, seg)
        if why is None:
            return Choice(b.name, tuple(passed))
        if forced != "auto":
            raise ValueError(f"backend {forced!r} is not available: {why}")
        passed.append((b.name, why))
    raise AssertionError("the torch backend always runs")  # pragma: no cover
