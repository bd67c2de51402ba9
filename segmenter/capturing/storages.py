"""Which tensors share a storage: graph inputs, call arguments and outputs are grouped by it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["storage_ids"]


def storage_ids(tensors: Sequence[torch.Tensor]) -> list[int]:
    """For each tensor, the index of the first tensor sharing its storage (real or fake)."""
    first: dict[StorageWeakRef, int] = {}
    return [first.setdefault(StorageWeakRef(t.untyped_storage()), i) for i, t in enumerate(tensors)]
