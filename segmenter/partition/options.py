"""Options of the segmenter: a frozen dataclass passed in; passes read no environment."""

from __future__ import annotations

from dataclasses import dataclass

from .segments import SegmentKind

__all__ = ["SegmenterOptions"]

ALL_KERNEL_KINDS = frozenset({SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION, SegmentKind.MATMUL})


@dataclass(frozen=True)
class SegmenterOptions:
    #: Most ops in one segment (None: no limit). ``max_ops_per_segment=1`` forces a cut at every op.
    max_ops_per_segment: int | None = None
    #: Merge independent pointwise work over the same iteration space (q, k, v of a RoPE block).
    allow_horizontal: bool = True
    #: Segment kinds the executing backend can run as one kernel.
    kernel_kinds: frozenset[SegmentKind] = ALL_KERNEL_KINDS
    #: Let a pointwise epilogue join a matmul (only where the backend fuses it).
    matmul_epilogue: bool = False
    #: Stop after this many merges (None: no limit): bisect a bad merge by halving it.
    fuel: int | None = None
    #: Rounds of greedy merging; each round revisits the merges earlier rounds refused.
    max_rounds: int = 8
    #: Nodes (by name) the backend cannot run: each stays alone as OPAQUE, as an unknown op would.
    opaque_nodes: frozenset[str] = frozenset()
    #: Note [a matmul's bias after it] (segmenter/partition/matmul_bias.py): an ``addmm``'s 1-D bias added
    #: after a plain ``mm``, in the pointwise kernel that reads the product. None: float32 on CUDA
    #: (where it was measured faster); False: never; True: every float32 addmm of a 1-D bias.
    bias_after_matmul: bool | None = None
