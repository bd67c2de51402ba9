"""A layout guard learned from the inputs of a call that passed a program's own input check.

Note [learned layout guard]: a program's entry (Note [one entry] in runtime/compiled/program.py) checks
every input in Python on every call: dtype, sizes, strides, storage offset, device, the negative
and conjugate bits, storage sizes, and that no two inputs share a storage. That cost ~0.8 us an
input (74 us a call on bart-tiny's 92 inputs, 2.2 us on rms-norm's 2). Dynamo's ``TensorGuards``
checks a list of tensors in one C++ call against the ones it was built from: Python type,
dispatch keys (device, the negative and conjugate bits, inference mode), dtype, device index,
requires_grad, sizes and strides (0.3 us for two tensors). So the entry learns one from the first
inputs that pass the whole check in a call it runs, and from then on a call whose inputs pass
that guard is checked in Python only for what it leaves out: storage offsets, storage sizes and
shared storages. Inputs the guard refuses (another type, another mode) take the whole check, as
before, and may be learned in its place: at most ``RELEARN`` times, so inputs that alternate
cost one whole check each and never a rebuild on every call. The guard only ever narrows what
the entry runs fast: each input it passes matches, in everything it checks, inputs that passed
the whole check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["RELEARN", "LearnedGuard"]

#: most times one guard is built (the first learning included)
RELEARN = 8


def _never(*inputs: Any) -> bool:
    return False


class LearnedGuard:
    """``check(*inputs)``: True only for tensors like, in all ``TensorGuards`` checks, the ones
    last learned; False until something is learned (or where this torch has no ``TensorGuards``)."""

    __slots__ = ("builds", "check")

    def __init__(self) -> None:
        self.check: Callable[..., bool] = _never
        self.builds = 0

    def learn(self, *inputs: torch.Tensor, free: tuple[list[list[bool]], list[list[bool]]] | None = None) -> None:
        """Guard on these inputs' layouts (they passed the whole check, in a call the entry runs).
        ``free``: per input, the sizes and the strides the guard leaves unchecked (a symbolic
        plan's, which its entry checks against the symbols: Note [symbolic plans])."""
        if self.builds >= RELEARN:
            return
        self.builds += 1
        try:
            from torch._C._dynamo.guards import TensorGuards

            sizes = [list(t.shape) for t in inputs]
            strides = [list(t.stride()) for t in inputs]
            if free is not None:
                sizes = [[None if f else n for n, f in zip(ns, fs)] for ns, fs in zip(sizes, free[0])]
                strides = [[None if f else n for n, f in zip(ns, fs)] for ns, fs in zip(strides, free[1])]
            guard = TensorGuards(*inputs, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
            if not guard.check(*inputs):  # pragma: no cover - a torch whose guards mean otherwise
                raise RuntimeError("a guard refused the inputs it was built from")
        except Exception:  # noqa: BLE001 - no guard on this torch: the whole check stays, always
            self.builds = RELEARN
            self.check = _never
            return
        self.check = guard.check
