"""Big CPU buffers on transparent huge pages.

Note [huge pages for big buffers]: a buffer of 64 MiB that glibc hands out is a fresh ``mmap``
(anything above 32 MiB always is), so its first write takes one page fault per 4 KiB page, 16384
of them, each zeroing its page: on this machine kind a softmax over [4096, 4096] floats spent 16
of its 19 ms faulting its output in (the same softmax into a buffer already written took 3.5 ms;
eager pays the faults too, as does Inductor). Where Linux offers transparent huge pages on request
(``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise``, the common default), a buffer of
at least ``HUGE_MIN`` bytes the program allocates is advised ``MADV_HUGEPAGE`` before anything
touches it: its 2 MiB-aligned interior then faults in 2 MiB at a time (2.5 ms instead of 16 to
write it all, measured here). The tensor is an ordinary torch tensor (torch's allocator made it,
torch's deleter frees it; resizable, picklable): only the pages under it differ. The advice is a
hint: where the kernel has no huge page free it falls back to small pages (with ``defrag`` set to
``madvise`` it first tries to compact memory, which can stall a fault on a fragmented host). Only
the fast variant advises (Note [fast and safe programs]), only on the CPU, and only for buffers
whose size is known when the program is compiled; the ``huge_pages`` runtime option
(``FUSEG_HUGE_PAGES=0``) turns it off. Under
``always`` the kernel already backs aligned regions with huge pages (nothing to advise); under
``never``, or off Linux, nothing is done.
"""

from __future__ import annotations

import ctypes
import sys

import torch

from ..options import current
from . import layout

__all__ = ["HUGE_MIN", "empty_huge", "empty_sized", "thp_mode", "wants_huge"]

#: the smallest buffer advised (bytes): its faults cost about a millisecond, the advice ~4 us
HUGE_MIN = 4 << 20
_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _madvise_fn():  # noqa: ANN202 - a ctypes function or None
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - a libc without madvise
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise_fn()
#: whether this machine advises on request (the kernel's mode read once, at import)
OFFERED = _MADVISE is not None and thp_mode() == "madvise"


def enabled() -> bool:
    """Whether big CPU buffers are advised now: offered here, and the ``huge_pages`` option on."""
    return OFFERED and current().huge_pages


def wants_huge(nbytes: int, device: torch.device, fast: bool) -> bool | None:
    """Whether a program variant allocates a buffer of ``nbytes`` with ``empty_huge``; None where
    ``nbytes`` is a symbolic size: ``empty_sized`` decides at the call (no condition of the plan)."""
    if not (enabled() and fast and device.type == "cpu"):
        return False
    if isinstance(nbytes, torch.SymInt):
        return None
    return nbytes >= HUGE_MIN


_empty = layout.empty_fn(True, torch.device("cpu"))


def empty_sized(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
    """``empty_huge`` from ``HUGE_MIN`` bytes, else a plain buffer: the choice at the call, for a
    symbolic plan's buffers (Note [symbolic plans] in segmenter/ir/symbolic.py)."""
    return (empty_huge if nbytes >= HUGE_MIN else _empty)(shape, stride, dtype)


def empty_huge(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``empty_strided`` on the CPU, its storage's 2 MiB-aligned interior advised ``MADV_HUGEPAGE``
    (Note [huge pages for big buffers]); the advice failing leaves an ordinary buffer."""
    t = _empty(shape, stride, dtype)
    storage = t.untyped_storage()
    p = storage.data_ptr()
    start = (p + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
    end = (p + storage.nbytes()) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        _MADVISE(start, end - start, _MADV_HUGEPAGE)
    return t
