"""nvFuser fusions kept as data: Python-frontend scripts that ``segmenter.from_nvfuser`` reads
(never imports or runs: the scripts import ``nvfuser``, which is not installed here), and the
segmentation nvFuser made of each, as its issue quotes it (not measured here: no nvFuser ran).

``fuseg segment nvfuser-1597`` and ``fuseg profile nvfuser-2577 nvfuser-1597`` name them; a path
to any other script works the same way (``fuseg segment my_repro.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["FUSIONS", "NvFuserFusionEntry", "path_of"]


@dataclass(frozen=True)
class NvFuserFusionEntry:
    name: str
    file: str  # in this folder
    issue: str
    description: str
    nvfuser_segments: int | None  # as the issue quotes them; None where it gives no count
    nvfuser_kernels: int | None
    quote: str  # what the issue says, for the profile's note column


FUSIONS: dict[str, NvFuserFusionEntry] = {e.name: e for e in [
    NvFuserFusionEntry(
        "nvfuser-2577", "rope_2577.py", "NVIDIA/Fuser#2577",
        "LitGPT QKV split + RoPE of #2577 (seeds/002): 16 heads, 4 groups, head 32, rope 8, bf16",
        None, None,
        "nvFuser segments on slice and makes a kernel that only copies a slice (T15 -> T16); no count given"),
    NvFuserFusionEntry(
        "nvfuser-1597", "qkv_rope_1597.py", "NVIDIA/Fuser#1597",
        "LitGPT QKV split + RoPE of #1597 at Mistral-7B's config: 32 heads, 8 groups, head 128, bf16",
        8, 5, "eight segments: three no-op, five kernels (cast, neg, mul, add)"),
]}


def path_of(name: str) -> str:
    return os.path.join(os.path.dirname(__file__), FUSIONS[name].file)
