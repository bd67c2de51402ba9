"""A node's arguments against its op's schema: by count, name and type, without running anything.

Every later stage (the segmenter's rules, the kernel generator, the runtime) reads a node's
arguments as the schema says they are: a tensor where it takes a Tensor, a list of ints where it
takes ``int[]``. The meta check (FakeTensor propagation) would find a mismatch by running the op,
but it is optional (``from_json(check_metas=False)``), so this cheap check always runs at load.
It accepts what torch's own argument parser accepts (a bool for an int, a bare int for ``int[1]``,
an int for a dtype), so no graph torch could run is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from .graph import Arg, OpRef, ValueRef

__all__ = ["args_problem"]

_NUMBER = (bool, int, float)
_SCALAR = (*_NUMBER, complex)  # what a Scalar (``number``) or a wrapped Tensor argument takes


def _fits(t: str, v: Arg, n: int | None) -> bool:
    """Whether ``v`` may be passed for an argument of declared type ``t`` (``n``: int[N]'s N)."""
    if t.startswith("Optional["):
        return v is None or _fits(t[len("Optional["):-1], v, n)
    if t.startswith("List["):
        inner = t[len("List["):-1]
        if isinstance(v, tuple):
            return all(_fits(inner, x, None) and not (inner == "Tensor" and not isinstance(x, ValueRef)) for x in v)
        return n is not None and inner in ("int", "float", "bool") and _fits(inner, v, None)  # int[1] takes 1
    if t == "Tensor":  # a number too: torch wraps it (capture gives ``aten.add.Tensor(%x, 1)``)
        return isinstance(v, (ValueRef, *_SCALAR))
    if t == "Any":
        return True
    if isinstance(v, (ValueRef, OpRef, tuple)) or v is None:
        return False
    if t in ("int", "SymInt"):  # a symbolic size too (Note [symbols in graph files] in symbolic_json.py)
        return isinstance(v, (bool, int, torch.SymInt))
    if t == "bool":
        return isinstance(v, (bool, int))
    if t == "number":
        return isinstance(v, _SCALAR)
    if t == "float":
        return isinstance(v, _NUMBER)
    if t == "str":
        return isinstance(v, str)
    if t == "ScalarType":
        return isinstance(v, (torch.dtype, int)) and not isinstance(v, bool)
    if t == "Layout":
        return isinstance(v, (torch.layout, int)) and not isinstance(v, bool)
    if t == "MemoryFormat":
        return isinstance(v, (torch.memory_format, int)) and not isinstance(v, bool)
    if t == "Device":
        return isinstance(v, (torch.device, str))
    return False  # Generator, Storage, Stream, script classes: nothing a file can hold


@lru_cache(maxsize=4096)
def _signature(op: torch._ops.OpOverload) -> tuple[tuple[str, str, int | None, bool, bool], ...]:
    """Per argument: (name, declared type, N of int[N], keyword-only, required)."""
    # torch's stub (torch/_C/__init__.pyi) leaves out Argument.N, which its binding defines
    return tuple((a.name, str(a.real_type), a.N, a.kwarg_only, not a.has_default_value())  # type: ignore[attr-defined]
                 for a in op._schema.arguments)


def args_problem(op: torch._ops.OpOverload, name: str, args: Sequence[Arg],
                 kwargs: Sequence[tuple[str, Arg]]) -> tuple[str, str] | None:
    """Why ``args``/``kwargs`` cannot be passed to ``op`` (named ``name``): (the field, what is
    wrong), the field ``args[i]``, ``kwargs.k`` or "" for the call as a whole. None: they can."""
    sig = _signature(op)
    positional = [s for s in sig if not s[3]]
    if len(args) > len(positional):
        return "", f"{name} takes {len(positional)} positional arguments, got {len(args)}"
    given: dict[str, tuple[str, Arg]] = {}
    for i, (s, v) in enumerate(zip(positional, args)):
        given[s[0]] = (f"args[{i}]", v)
    by_name = {s[0]: s for s in sig}
    for k, v in kwargs:
        if k not in by_name:
            return f"kwargs.{k}", f"{name} has no argument {k!r}"
        if k in given:
            return f"kwargs.{k}", f"{name}: argument {k!r} given twice"
        given[k] = (f"kwargs.{k}", v)
    for arg_name, t, n, _kw, required in sig:
        if arg_name not in given:
            if required:
                return "", f"{name}: argument {arg_name!r} is missing"
            continue
        where, v = given[arg_name]
        if not _fits(t, v, n):
            return where, f"{name} takes {t} for {arg_name!r}, got {_describe(v)}"
    return None


def _describe(v: Arg) -> str:
    if isinstance(v, ValueRef):
        return f"tensor %{v.name}"
    if isinstance(v, OpRef):
        return f"op {v.name}"
    if isinstance(v, tuple):
        return f"a list of {len(v)}"
    return f"{type(v).__name__} {v!r}"[:80]
