"""The ``-1`` dims of an nvFuser fusion as symbolic sizes (issue 43).

Note [symbolic dims of a fusion]: nvFuser's ``define_tensor(shape=[-1, ...])`` leaves a dim's size
to the call: one fusion for every size. Read without ``inputs`` (or with ``symbolic=True``), each
such dim is a symbol of a symbolic plan (Note [symbolic plans] in segmenter/ir/symbolic.py), made by
``SymbolicSizes.declare``:

* named after its tensor and dim, ``T0_1`` for dim 1 of ``T0``, where that is a graph file's
  symbol name (Note [symbols in graph files]); else ``size<k>``;
* ranged ``[MIN_SIZE, MAX_SIZE]`` = [2, 2**31], hinted by the script's ``inputs = [...]`` (or the
  ``inputs`` given), else by ``DEFAULT_HINT``. A dim they give as 0 or 1 stays that number (sizes
  0 and 1 are specialized, as dynamo specializes them); one beyond the range is refused;
* laid out as ``contiguity`` and ``stride_order`` say: dense in that order, each stride a product
  of sizes (an input given with strides that are no dense layout, or at an offset, is bound to its
  sizes instead, and a note says so).

The ops then run on FakeTensors of the plan's ShapeEnv: every size they compute is a SymInt, and
every question torch asks of one (does this broadcast? can this be a view?) is answered at the
hints and recorded as a condition of the plan. Dims an op forces equal (``[-1] + [-1]``) are equal
by a condition; a dim an op fixes (#2577's reshape to ``[2, 1024, 4, 6, 32]``) is pinned to that
number; a size read back (``fd.ops.size``) and used as a tensor's value is pinned to its hint.

The import runs twice where that tells more. The first run gives each dim its own symbol, to learn
which dims the ops make equal or fix (the ShapeEnv's replacements). The second gives each class of
equal dims one symbol (named after its first dim) and the fixed dims their numbers; where no sizes
were given, it also hints the classes apart (``distinct_hint``: primes from ``DEFAULT_HINT``), so
that no later pass finds two sizes equal only because their hints are (an ``a == b`` the segmenter
asks of two symbols hinted alike would pin them equal). Where the second run fails (hints apart
break a relation that is no equality, ``a * b == c``), the first run's plan is kept: its conditions
hold, it is only less general.

Sizes are bounded as a graph file's are (segmenter/ir/limits.py: 2**48 bytes a tensor) at the hints,
when the graph is built: a hostile ``inputs`` list is refused there, and no size the import computes
can overflow. They are no condition of the plan: at a call the tensors exist, torch refuses what
would overflow, and the kernels record the bounds their index math needs as conditions of their own
(MAX_EXTENT in runtime/codegen/source/checks.py).
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import sympy
import torch

from ...ir.symbolic import SymbolicSizes
from ..symbolic_json import MAX_SYMBOL_NAME

__all__ = ["DEFAULT_HINT", "MAX_DIMS", "MAX_SIZE", "MIN_SIZE", "DimPlan", "DimSizes", "distinct_hint"]

DEFAULT_HINT = 17  # a prime: no power of two, no product of the sizes scripts write
MIN_SIZE, MAX_SIZE = 2, 2**31
MAX_DIMS = 1024  # -1 dims in one fusion (Thunder's have tens)

Key = tuple[int, int]  # (input, dim)


def distinct_hint(k: int) -> int:
    """The hint of class ``k`` where no sizes are given: the k-th prime from DEFAULT_HINT (no class
    is hinted a product or a multiple of another's)."""
    return int(sympy.prime(sympy.primepi(DEFAULT_HINT) + k))


@dataclass(frozen=True)
class DimPlan:
    """The second run's dims (Note [symbolic dims of a fusion]): each dim's class (its first dim),
    the dims the ops fix, and each class's hint."""

    first: dict[Key, Key]
    fixed: dict[Key, int]
    hints: dict[Key, int]


class DimSizes:
    """The symbols of one run of the import."""

    def __init__(self, plan: DimPlan | None = None) -> None:
        self.sizes = SymbolicSizes()
        self.plan = plan
        self.made: dict[Key, torch.SymInt] = {}  # dim -> its symbol (its class's in the second run)
        self.hints: dict[Key, int] = {}
        self.taken: set[str] = set()

    def dim(self, key: Key, tensor: str, hint: int | None, fail: Callable[[str], NoReturn]) -> int | torch.SymInt:
        """Dim ``key[1]`` of input ``key[0]`` (named ``tensor``), hinted ``hint`` (None: the default)."""
        if hint is None:
            hint = DEFAULT_HINT
        if hint in (0, 1):
            return hint  # specialized, as dynamo specializes sizes 0 and 1
        if not MIN_SIZE <= hint <= MAX_SIZE:
            fail(f"dim {key[1]} of size {hint}: a symbolic size is in [{MIN_SIZE}, 2**31] (bind this fusion "
                 "to its inputs: symbolic=False)")
        first = key
        if self.plan is not None:
            if key in self.plan.fixed:
                return self.plan.fixed[key]
            first = self.plan.first.get(key, key)
            if first in self.made:
                return self.made[first]
            hint = self.plan.hints.get(first, hint)
        if len(self.made) >= MAX_DIMS:
            fail(f"more than {MAX_DIMS} symbolic dims (bind this fusion to its inputs: symbolic=False)")
        sym = self.sizes.declare(self._name(tensor, key[1]), hint, MIN_SIZE, MAX_SIZE)
        self.made[first], self.hints[first] = sym, hint
        return sym

    def _name(self, tensor: str, dim: int) -> str:
        """``T0_1``, where that is a graph file's symbol name (an ASCII identifier, no keyword, at
        most MAX_SYMBOL_NAME characters: names are keys, never code) not taken; else ``size<k>``."""
        name = f"{tensor}_{dim}"
        ok = name.isidentifier() and name.isascii() and not keyword.iskeyword(name) and len(name) <= MAX_SYMBOL_NAME
        k = len(self.taken)
        while not ok or name in self.taken:
            name, ok, k = f"size{k}", True, k + 1
        self.taken.add(name)
        return name

    def learned(self, distinct: bool) -> DimPlan | None:
        """The second run's plan from this (first) run's ShapeEnv; None where it would change
        nothing (no dims made equal or fixed, and no hints to set apart)."""
        env = self.sizes.env
        classes: dict[sympy.Expr, list[Key]] = {}
        fixed: dict[Key, int] = {}
        for key, sym in self.made.items():
            e = env.replace(sym.node.expr)
            if e.is_number:
                fixed[key] = int(e)
            else:  # a symbol (its class), or a relation that is no equality: a class of its own
                classes.setdefault(e if isinstance(e, sympy.Symbol) else sym.node.expr, []).append(key)
        firsts = [min(keys) for keys in classes.values()]
        if not fixed and all(len(keys) == 1 for keys in classes.values()) and not (distinct and len(firsts) > 1):
            return None
        hints = {f: distinct_hint(k) if distinct else self.hints[f] for k, f in enumerate(sorted(firsts))}
        return DimPlan({key: min(keys) for keys in classes.values() for key in keys}, fixed, hints)
