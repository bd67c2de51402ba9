"""The alias pass's report: per segment, what was found and why."""

from __future__ import annotations

from dataclasses import dataclass

from .rewrite import SegmentReport

__all__ = ["AliasReport"]


@dataclass(frozen=True)
class AliasReport:
    mode: str
    segments: tuple[SegmentReport, ...]
    kernels_before: int
    kernels_after: int
    metadata_after: int
    copies_elided: tuple[tuple[str, str], ...] = ()  # (value, why)

    def __str__(self) -> str:
        lines = [f"alias pass ({self.mode}): kernels {self.kernels_before} -> {self.kernels_after}, "
                 f"metadata segments {self.metadata_after}"]
        for r in self.segments:
            if not (r.views_of_inputs or r.views_of_outputs or r.kept_in_kernel):
                continue
            became = " + ".join(k.name for k in r.became) or "nothing"
            lines.append(f"  s{r.segment} {r.kind.name} -> {became}")
            for v, root in r.views_of_inputs:
                lines.append(f"      %{v} is a view of input %{root}: metadata, no launch")
            for v, root in r.views_of_outputs:
                lines.append(f"      %{v} is a view of %{root}, which the kernel writes: metadata after it")
            for v, why in r.kept_in_kernel:
                lines.append(f"      %{v} not a view: {why}")
        for v, why in self.copies_elided:
            lines.append(f"  %{v}: {why}")
        return "\n".join(lines)
