"""The one small interface every backend implements, and what a backend is given to work with.

A backend says whether it can run at all here (``unavailable``: installed? the right device? a
compiler?), then, per kernel segment, ``prepare`` returns a ``SegmentLaunch`` or raises
``Declined`` with the reason (recorded in ``program.passed_over``). Once every segment has its
backend, ``build_all`` compiles what the chosen launches need (all together, so a cold cache
costs one parallel build, not one compile per segment), and each launch emits its lines of the
program (Note [generated wrapper] in runtime/emit/wrapper.py). The program never names a backend: it
asks them in the registry's order (runtime/backends/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from segmenter import FusionGraph, Segment

from ..emit.wrapper import Code

__all__ = ["Backend", "BuildContext", "SegmentLaunch"]


@dataclass
class BuildContext:
    """What every backend may read about the program being compiled."""

    graph: FusionGraph
    #: node name -> index of the graph input its output is written into (Note [in-place write-back])
    in_place: dict[str, int]
    #: values that cross launches as fresh dense copies ("pre"/"off" modes, as today's fusers do)
    materialize: frozenset[str]
    device: torch.device
    #: per segment index: values whose last use in the program is that segment
    dying: dict[int, frozenset[str]] = field(default_factory=dict)
    #: segment structure -> its kernel, for this program (Note [lowering memo] in runtime/codegen/memo.py)
    kernel_memo: dict = field(default_factory=dict)

    def targets(self, seg: Segment) -> dict[str, str]:
        """Node name -> the graph input (by name) the node writes in place, for ``seg``'s nodes."""
        return {n.name: self.graph.inputs[self.in_place[n.name]].name for n in seg.nodes if n.name in self.in_place}


class SegmentLaunch:
    """One segment's launch: emits the program lines that read the segment's inputs (locals of
    ``code``) and define its outputs. ``dying``: inputs that are dead after it (deleted as soon as
    the launch is done with them). ``guard``: check the layouts of the inputs first (only where
    the inputs were not made by the program itself; Note [planned layouts] in runtime/storage/layout.py)."""

    backend: str = ""
    segment: Segment

    def emit(self, code: Code, dying: frozenset[str], guard: bool) -> None:
        raise NotImplementedError


class Backend:
    """A backend: a name and the small interface above. ``auto``: tried without being asked for."""

    name: str = ""
    device: str | None = None  # the device type it runs on (None: any)
    auto: bool = True
    #: OPAQUE segments it is asked about: those whose one node is one of these ops (the others
    #: run on torch without asking anyone)
    opaque_ops: frozenset[str] = frozenset()
    #: whether it is asked about kernel segments (pointwise, reductions, normalizations, matmuls)
    kernel_segments: bool = True

    def unavailable(self, device_type: str) -> str | None:
        """Why this backend cannot run here, or None."""
        if self.device is not None and device_type != self.device:
            return f"needs a {self.device.upper()} device (the graph is on {device_type})"
        return None

    def prepare(self, ctx: BuildContext, seg: Segment) -> SegmentLaunch:
        """The launch for ``seg``, or ``Declined`` with the reason."""
        raise NotImplementedError

    def not_chosen_for(self, seg: Segment) -> str | None:
        """Why, when choosing by itself (``backend="auto"``), this backend leaves ``seg`` to the
        next one although it could run it (a measured cost rule), or None."""
        return None

    def build_later(self, launches: Sequence[SegmentLaunch]) -> tuple[Any, list[SegmentLaunch]] | None:
        """Note [kernels built in the background] (runtime/compiled/background.py): where this backend can
        compile off the caller's thread and ``launches`` need a compiler run, start it; returns
        its future and the launches that wait for it (the others ``build_all`` builds at once).
        None: nothing to compile, or no such build (then ``build_all`` builds everything)."""
        return None

    def build_all(self, launches: Sequence[SegmentLaunch]) -> dict[SegmentLaunch, str] | None:
        """Compile what ``launches`` (this backend's, for one program) need, together; returns the
        launches whose build declined, with the reason (they run on torch)."""

