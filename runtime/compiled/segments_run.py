"""Which way a program's segments run now: on generated kernels, on torch while their kernels are
built in the background, on torch for good (an OPAQUE op, a kernel a backend declined), or as
metadata (issue 63, goal 4: ``fuseg run`` and ``FusegCompiler.explain`` say which way it ran)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from segmenter import SegmentKind

if TYPE_CHECKING:
    from .program import CompiledProgram

__all__ = ["SegmentsRun", "segments_run"]


@dataclass(frozen=True)
class SegmentsRun:
    """Counts of a program's segments by the way its next call runs them."""

    kernels: dict[str, int] = field(default_factory=dict)  # backend -> segments run by its kernels
    waiting_for_builds: int = 0  # on torch until their kernels are built (Note [kernels built in the background])
    on_torch: int = 0  # on torch for good: OPAQUE ops, kernels declined (the program's ``fallbacks`` say why)
    metadata: int = 0

    @property
    def on_kernels(self) -> int:
        return sum(self.kernels.values())

    def describe(self) -> str:
        backends = ", ".join(f"{b}: {n}" for b, n in sorted(self.kernels.items()))
        n = self.on_kernels
        text = f"{n} segment{'' if n == 1 else 's'} on generated kernels" + (f" ({backends})" if backends else "")
        text += f", {self.waiting_for_builds} on torch while their kernels build in the background"
        text += f", {self.on_torch} on torch (OPAQUE ops, or kernels passed over: the fallbacks say why), {self.metadata} metadata"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"on_kernels": self.on_kernels, "kernels_by_backend": dict(self.kernels),
                "waiting_for_builds": self.waiting_for_builds, "on_torch": self.on_torch, "metadata": self.metadata}


def segments_run(program: CompiledProgram) -> SegmentsRun:
    """How ``program``'s next call runs its segments (after a call: how that call ran them, since a
    program is made again with its kernels only at the start of a call that finds them built)."""
    after = program._after_build[1] if program._building is not None and program._after_build else {}
    kernels: Counter[str] = Counter()
    waiting = on_torch = metadata = 0
    for launch in program.launches:
        if launch.kind == SegmentKind.METADATA:
            metadata += 1
        elif launch.backend != "torch":
            kernels[launch.backend] += 1
        elif after.get(launch.segment, "torch") != "torch":
            waiting += 1
        else:
            on_torch += 1
    return SegmentsRun(dict(kernels), waiting, on_torch, metadata)
