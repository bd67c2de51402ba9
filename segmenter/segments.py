"""The result of segmentation: segments in execution order, each one kernel (or none).

Note [bytes model]: a launching segment moves the distinct storage elements it reads and writes,
each once (a stride-0 dim counts once); a METADATA segment moves nothing. The floor is what any
schedule must move: graph inputs read by some launching segment, plus graph outputs that are not
views of inputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .ir import FusionGraph, Node, TensorMeta

__all__ = ["Boundary", "Segment", "SegmentKind", "SegmentedFusion"]


class SegmentKind(enum.Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"
    MATMUL = "matmul"
    OPAQUE = "opaque"
    METADATA = "metadata"


KERNEL_KINDS = frozenset({SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION, SegmentKind.MATMUL})


@dataclass(frozen=True)
class Segment:
    index: int
    kind: SegmentKind
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    bytes_read: int
    bytes_written: int

    @property
    def launches_kernel(self) -> bool:
        return self.kind != SegmentKind.METADATA

    @property
    def is_kernel(self) -> bool:
        """A generated kernel (POINTWISE, REDUCTION, NORMALIZATION or MATMUL), not OPAQUE."""
        return self.kind in KERNEL_KINDS

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written if self.launches_kernel else 0

    @property
    def name(self) -> str:
        return f"s{self.index}"


@dataclass(frozen=True)
class Boundary:
    """A value crossing from one segment to another, and why the two were not merged."""

    value: str
    producer: int
    consumer: int
    reason: str


@dataclass(frozen=True)
class SegmentedFusion:
    graph: FusionGraph
    segments: tuple[Segment, ...]
    boundaries: tuple[Boundary, ...] = ()
    merges: int = 0
    #: Filled in by the alias pass (alias.apply_aliases); None straight out of the segmenter.
    alias_report: object | None = field(default=None, compare=False)

    def segment_of(self) -> dict[str, int]:
        """Node name -> index of the segment holding it."""
        return {n.name: s.index for s in self.segments for n in s.nodes}

    def stats(self) -> dict[str, int]:
        kernels = sum(s.is_kernel for s in self.segments)
        opaque = sum(s.kind == SegmentKind.OPAQUE for s in self.segments)
        metadata = sum(s.kind == SegmentKind.METADATA for s in self.segments)
        return {
            "segments": len(self.segments),
            "kernels": kernels,
            "opaque": opaque,
            "launches": kernels + opaque,
            "metadata": metadata,
            "bytes_moved": sum(s.bytes_moved for s in self.segments),
            "bytes_floor": bytes_floor(self),
        }


def bytes_floor(sf: SegmentedFusion) -> int:
    g = sf.graph
    read_by_launch = {v for s in sf.segments if s.launches_kernel for v in s.inputs}
    floor = sum(inp.meta.nbytes for inp in g.inputs if inp.name in read_by_launch)
    seen: set[str] = set()
    for name, alias in zip(g.outputs, g.output_aliases):
        if (alias is None or alias.source != "input") and name not in seen and name not in g.input_names:
            seen.add(name)
            floor += g.metas[name].nbytes
    return floor


def footprint(metas: list[TensorMeta], whole: TensorMeta) -> int:
    """Bytes a segment reads of one input: what its view chains touch, at most the whole value."""
    return min(whole.nbytes, sum(m.nbytes for m in metas)) if metas else whole.nbytes
