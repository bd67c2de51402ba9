"""Names this project takes from torch's private modules, with what stands in for each where an
older torch lacks it (the GPU machine runs torch 2.11; CI runs 2.13).

Each stand-in keeps the behaviour that matters to us:

- ``ShapeEnvGuardError``: raised by a sealed ``ShapeEnv`` (``error_on_new_guards``) when a guard
  is attempted. A torch without it never raises it, so the stand-in is a class nothing raises: an
  ``except`` naming it catches nothing, and a plan sealed there only loses that self-check.
- ``disable_fake_tensor_cache``: switches a FakeTensorMode's cache off for a block.
- ``backed_hints(env)``: each backed symbol's value at the first call (``backed_var_to_val`` in
  torch 2.13, ``var_to_val`` before it).
- ``optimization_hint(x)``: a SymInt's value for heuristics (``size_hint`` before it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses import fake_tensor as _ft
from torch.fx.experimental import symbolic_shapes as _ss

__all__ = ["ShapeEnvGuardError", "backed_hints", "disable_fake_tensor_cache", "optimization_hint"]

if hasattr(_ss, "_ShapeEnvGuardError"):
    ShapeEnvGuardError: type[Exception] = _ss._ShapeEnvGuardError
else:  # pragma: no cover - torch 2.11 on the GPU machine

    class ShapeEnvGuardError(RuntimeError):  # type: ignore[no-redef]
        """Never raised: this torch's ShapeEnv cannot refuse a guard."""


if hasattr(_ft, "disable_fake_tensor_cache"):
    disable_fake_tensor_cache = _ft.disable_fake_tensor_cache
else:  # pragma: no cover

    @contextlib.contextmanager
    def disable_fake_tensor_cache(mode: Any) -> Iterator[None]:  # type: ignore[misc]
        old = getattr(mode, "cache_enabled", None)
        try:
            if old is not None:
                mode.cache_enabled = False
            yield
        finally:
            if old is not None:
                mode.cache_enabled = old


def backed_hints(env: Any) -> dict:
    """The ShapeEnv's symbol -> value-at-first-call mapping, whichever name this torch gives it."""
    table = getattr(env, "backed_var_to_val", None)
    return table if table is not None else env.var_to_val


def optimization_hint(x: torch.SymInt) -> int:
    """A SymInt's value at the first call, for heuristics."""
    fn = getattr(_ss, "optimization_hint", None)
    if fn is not None:
        return int(fn(x))
    return int(x.node.shape_env.size_hint(x.node.expr))  # pragma: no cover
