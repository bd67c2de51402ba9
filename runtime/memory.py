"""Peak memory: measured with a storage-tracking dispatch mode, or modeled from a launch plan.

On CUDA, ``torch.cuda.max_memory_allocated`` answers directly. On CPU there is no allocator
counter, so ``PeakTracker`` watches every storage an op creates while it is active (inputs and
weights, which exist before, are not counted) and notices each one's death through a weak
reference: the peak of the bytes alive at once, for eager and for our programs alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from segmenter import SegmentKind

from .compiled.program import CompiledProgram

__all__ = ["PeakTracker", "modeled_peak"]


class PeakTracker(TorchDispatchMode):
    """``with PeakTracker() as t: ...``; then ``t.peak`` is the most bytes of storages created
    inside the block that were alive at the same time."""

    supports_higher_order_operators = True  # custom ops arrive as auto_functionalized: count them too

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.seen: set[int] = set()
        self.current = 0
        self.peak = 0

    def __enter__(self) -> PeakTracker:
        super().__enter__()
        return self

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._sweep()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr and ptr not in self.live and ptr not in self._existing(args, kwargs):
                    self.live[ptr] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out

    @staticmethod
    def _existing(args: Any, kwargs: Any) -> set[int]:
        return {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}

    def _sweep(self) -> None:
        dead = [ptr for ptr, (ref, _) in self.live.items() if ref.expired()]
        for ptr in dead:
            self.current -= self.live.pop(ptr)[1]


def modeled_peak(program: CompiledProgram) -> int:
    """Most bytes of intermediate buffers alive at once if launches run in order, each kernel
    allocating its outputs and every value freed after its last use (a view keeps the buffer
    it views alive)."""
    graph, plan = program.graph, program.plan
    metas = graph.metas
    keep = set(graph.external_values)
    storage_of: dict[str, str] = {}
    holders: dict[str, int] = {}
    size: dict[str, int] = {}
    current = peak = 0
    last_use: dict[str, int] = {}
    for seg in plan.segments:
        for v in seg.inputs:
            last_use[v] = seg.index
    for seg in plan.segments:
        for v in seg.outputs:
            if seg.kind == SegmentKind.METADATA:
                made = {o: n for n in seg.nodes for o in n.outputs if o is not None}
                src = v
                while src in made:
                    src = made[src].inputs[0]
                root = storage_of.get(src)
            else:
                root = v
                size[v] = metas[v].numel * metas[v].itemsize
                current += size[v]
            if root is not None:
                storage_of[v] = root
                holders[root] = holders.get(root, 0) + 1
        peak = max(peak, current)
        for v in (v for v, k in last_use.items() if k == seg.index):
            root = storage_of.get(v)
            if root is None or v in keep:
                continue
            holders[root] -= 1
            if holders[root] == 0:
                current -= size[root]
    return peak
