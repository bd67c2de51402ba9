"""Bytes of tensor constants (``GraphConstant``): a contiguous tensor as its raw bytes, little-endian,
and back, exactly (NaN payloads, -0.0, every bit of a bfloat16 or a complex number).

Little-endian whatever the host: a graph file written on one machine loads bit-identical on any
other. On a big-endian host each element's bytes are reversed on the way out and back in.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from .errors import GraphError

if TYPE_CHECKING:  # annotations only: graph.py imports this module
    from .graph import TensorMeta

__all__ = ["BYTE_DTYPES", "tensor_bytes", "tensor_from_bytes"]

# Dtypes whose elements are plain bytes (no quantizer state, no sub-byte packing).
BYTE_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
})


def _swap(u8: torch.Tensor, itemsize: int) -> torch.Tensor:
    if sys.byteorder == "little" or itemsize == 1:
        return u8
    return u8.view(-1, itemsize).flip(1).reshape(-1)


def tensor_bytes(t: torch.Tensor, where: str) -> bytes | None:
    """The elements of ``t`` in row-major order as little-endian bytes (None for fake/meta tensors,
    whose values are not known)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if t.dtype not in BYTE_DTYPES:
        raise GraphError(f"{where}: dtype {t.dtype} cannot be held as a constant")
    if isinstance(t, FakeTensor) or t.device.type == "meta":
        return None
    # the values as torch shows them (conj/neg bits resolved), in a storage of exactly their elements
    flat = t.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1).clone()
    u8 = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    return bytes(_swap(u8, t.dtype.itemsize).contiguous().untyped_storage())


def tensor_from_bytes(data: bytes, meta: TensorMeta) -> torch.Tensor:
    """A fresh CPU tensor with ``meta``'s sizes, strides and dtype holding ``data``."""
    if meta.dtype not in BYTE_DTYPES:
        raise GraphError(f"dtype {meta.dtype} cannot be held as a constant")
    if len(data) != meta.numel * meta.itemsize:
        raise GraphError(f"{len(data)} bytes of data for {meta} ({meta.numel * meta.itemsize} bytes)")
    if not data:
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype)
    u8 = _swap(torch.frombuffer(bytearray(data), dtype=torch.uint8), meta.itemsize)
    return u8.view(meta.dtype).as_strided(meta.shape, meta.stride, 0)
