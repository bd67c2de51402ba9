"""Symbolic sizes in generated kernels: sizes that are arguments, not constants (issue 41).

Note [kernel sizes as arguments]: under a symbolic plan (Note [symbolic plans] in
segmenter/ir/symbolic.py) the shapes, strides and offsets a kernel is lowered for may be SymInts.
The generator does its arithmetic on them as on ints (a SymInt computes symbolically) and
decides with them as with ints (each decision becomes a condition of the plan, or pins the size
where it needs a number). Where it formats one into source (an f-string: index math, a loop
bound, an offset), the text is the size's C expression over the plan's symbols, ``fuseg_s<k>``
for symbol k (``SymbolicSizes.c_expr``). A kernel whose body uses a symbol takes one more
parameter, ``const long long *fuseg_S``, the call's symbol values, and reads the symbols it uses
from it into locals first (``Kernel.function``). The body is then the same text for every size:
the same cache entry, the same binary, no compiler run for a new size.

The text comes from ``SymInt.__format__``, which this module routes to the active plan's printer
while a kernel is lowered (``c_sizes``) and leaves as torch's everywhere else. A SymInt formatted
outside that window prints its bare symbol (``s17``): a build refuses a source holding one
(``raw_symbol``), so a size can never be compiled in as the wrong text.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator

import torch

from segmenter.ir.symbolic import SymbolicSizes, hashing, symbolic_hashing

__all__ = ["active_sizes", "c_sizes", "raw_symbol", "sizes_active", "smax", "smin", "symbolic_hashing"]

_ACTIVE: contextvars.ContextVar[SymbolicSizes | None] = contextvars.ContextVar("fuseg_c_sizes", default=None)
_RAW = re.compile(r"\b[su]\d+\b")
_torch_format = torch.SymInt.__format__


def _format(self: torch.SymInt, spec: str) -> str:
    sizes = _ACTIVE.get()
    if sizes is None or spec:
        return _torch_format(self, spec)
    return f"({sizes.c_expr(self)})"


torch.SymInt.__format__ = _format  # type: ignore[method-assign] - torch's own where no plan is active


@contextlib.contextmanager
def c_sizes(sizes: SymbolicSizes | None) -> Iterator[None]:
    """Within: a SymInt formatted into text is its C expression over ``sizes``' symbols, and
    SymInts hash (Note [hashing symbolic sizes] in segmenter/ir/symbolic.py)."""
    token = _ACTIVE.set(sizes)
    try:
        with symbolic_hashing(sizes is not None or hashing()):
            yield
    finally:
        _ACTIVE.reset(token)


def smax(a: int, b: int) -> int:
    """``max``, symbolic where either is a SymInt: a size no decision needs stays no condition."""
    return torch.sym_max(a, b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else max(a, b)


def smin(a: int, b: int) -> int:
    """``min``, symbolic where either is a SymInt (see ``smax``)."""
    return torch.sym_min(a, b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else min(a, b)


def active_sizes() -> SymbolicSizes | None:
    """The plan whose sizes ``c_sizes`` made active, or None."""
    return _ACTIVE.get()


def sizes_active() -> bool:
    """Whether symbolic sizes may be formatted into a kernel now (a checker lets SymInts through)."""
    return _ACTIVE.get() is not None


def raw_symbol(src: str) -> str | None:
    """A bare symbol name in generated source (a size formatted outside ``c_sizes``), or None."""
    m = _RAW.search(src)
    return m.group(0) if m else None
