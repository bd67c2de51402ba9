"""Symbolic sizes in graph files (issue 41): named symbols with ranges, sizes as expressions.

Note [symbols in graph files]: a graph file may declare symbols and use them wherever a size,
stride or storage offset stands, and wherever an argument is a size::

    "symbols": {"S": {"hint": 128, "min": 2, "max": 4096}, "B": {"hint": 2}},
    "inputs": [{"name": "x", "meta": {"shape": ["B", "S", 64], "stride": ["64*S", 64, 1], ...}}],
    "nodes": [{"op": "aten.view.default", "args": [{"value": "x"}, [{"size": "B*S"}, 64]], ...}]

A symbol's name is a key: an identifier of at most ``MAX_SYMBOL_NAME`` ASCII characters, which
reaches nothing but this module's own parser and the messages (a plan's generated code names its
symbols itself: Note [sizes in generated source] in runtime/emit/wrapper.py). A size expression is
read by a parser of its own (``parse_size``), never evaluated: integers, declared names, ``+``,
``*`` and parentheses, at most ``MAX_EXPRESSION`` characters and ``MAX_DEPTH`` parentheses deep.
Each symbol has a range (``min`` at least 2: sizes 0 and 1 are specialized, as dynamo
specializes them; ``max`` at most ``MAX_SYMBOL``) and a ``hint`` in it, the value a plan is made
at (Note [symbolic plans] in segmenter/ir/symbolic.py). Sizes stay bounded: every size is checked at
the symbols' maxima (expressions of non-negative integers by ``+`` and ``*`` grow with each
symbol), against the same limits as numbers. The graph is then segmented once for all sizes in
the ranges; where a decision depends on a size, the plan records it as a condition.
"""

from __future__ import annotations

import contextlib
import contextvars
import keyword
import re
from collections.abc import Iterator
from typing import Any

import sympy
import torch

from ..ir.graph import GraphError
from ..ir.limits import MAX_DIM
from ..ir.symbolic import SymbolicSizes, sizes_of

__all__ = ["MAX_SYMBOL", "MAX_SYMBOLS", "at_maxima", "declared", "parse_size", "size_in", "size_out", "symbols_in", "symbols_out"]

MAX_SYMBOLS = 64
MAX_SYMBOL = 1 << 31
MAX_SYMBOL_NAME = 64
MAX_EXPRESSION = 256
MAX_DEPTH = 16

_ACTIVE: contextvars.ContextVar[tuple[SymbolicSizes, dict[str, torch.SymInt]] | None] = contextvars.ContextVar(
    "fuseg_graph_symbols", default=None)
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|([+*()]))")


class SymbolError(GraphError):
    """A symbol or a size expression a graph file gets wrong (the caller names the field)."""


def symbols_in(raw: Any) -> tuple[SymbolicSizes, dict[str, torch.SymInt]] | None:
    """The file's ``symbols`` object read, checked and declared; None where it has none."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SymbolError(f"expected an object of symbols, got {type(raw).__name__}")
    if len(raw) > MAX_SYMBOLS:
        raise SymbolError(f"{len(raw)} symbols (at most {MAX_SYMBOLS})")
    sizes, table = SymbolicSizes(), {}
    for name, spec in raw.items():
        if not (isinstance(name, str) and name.isidentifier() and name.isascii() and len(name) <= MAX_SYMBOL_NAME
                and not keyword.iskeyword(name)):
            raise SymbolError(f"{str(name)[:40]!r}: a symbol's name is an identifier of at most {MAX_SYMBOL_NAME} "
                              "ASCII characters")
        if not isinstance(spec, dict) or set(spec) - {"hint", "min", "max"}:
            raise SymbolError(f"{name}: expected {{'hint': int, 'min': int, 'max': int}} (min and max optional)")
        lo, hi = _int(spec.get("min", 2), name, "min"), _int(spec.get("max", MAX_SYMBOL), name, "max")
        hint = _int(spec.get("hint", lo), name, "hint")
        if not 2 <= lo <= hint <= hi <= MAX_SYMBOL:
            raise SymbolError(f"{name}: needs 2 <= min <= hint <= max <= {MAX_SYMBOL} (sizes 0 and 1 are "
                              f"specialized), got min {lo}, hint {hint}, max {hi}")
        table[name] = sizes.declare(name, hint, lo, hi)
    return sizes, table


def _int(v: Any, name: str, field: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise SymbolError(f"{name}.{field}: expected an integer, got {type(v).__name__}")
    return v


@contextlib.contextmanager
def declared(symbols: tuple[SymbolicSizes, dict[str, torch.SymInt]] | None) -> Iterator[None]:
    """Within: ``size_in`` reads names of these symbols (a file's, while it loads)."""
    token = _ACTIVE.set(symbols)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def size_in(v: Any) -> int | torch.SymInt:
    """A size of a graph file: an integer, or an expression of the declared symbols."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise SymbolError(f"expected an integer or a size expression, got {type(v).__name__}")
    active = _ACTIVE.get()
    if active is None:
        raise SymbolError(f"size {v[:40]!r}: the file declares no symbols")
    sizes, table = active
    expr = parse_size(v, {n: s.node._expr for n, s in table.items()})
    top = expr.xreplace({s.node._expr: int(sizes.env.var_to_range[s.node._expr].upper) for s in table.values()})
    if int(top) > MAX_DIM:
        raise SymbolError(f"size {v!r} reaches {int(top)} at the symbols' maxima (at most 2**48)")
    hint = int(expr.xreplace({s.node._expr: sizes.hints[s.node._expr] for s in table.values()}))
    return sizes.symint(expr, hint)


def parse_size(text: str, names: dict[str, sympy.Expr]) -> sympy.Expr:
    """``text`` (integers, ``names``, ``+``, ``*``, parentheses) as an expression, by a parser of
    its own: nothing in the text is evaluated or looked up outside ``names``."""
    if len(text) > MAX_EXPRESSION:
        raise SymbolError(f"size expression of {len(text)} characters (at most {MAX_EXPRESSION})")
    tokens, at = [], 0
    while at < len(text.rstrip()):
        m = _TOKEN.match(text, at)
        if m is None or m.end() == at:
            raise SymbolError(f"size {text[:40]!r}: unexpected {text[at:at + 10].strip()[:10]!r} (only integers, "
                              "declared symbols, + and * and parentheses)")
        tokens.append(m.group(1) or m.group(2) or m.group(3))
        at = m.end()
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise SymbolError(f"size {text[:40]!r}: ends too early")
        pos += 1
        return tokens[pos - 1]

    def atom(depth: int) -> sympy.Expr:
        t = take()
        if t == "(":
            if depth >= MAX_DEPTH:
                raise SymbolError(f"size {text[:40]!r}: parentheses nested more than {MAX_DEPTH} deep")
            e = total(depth + 1)
            if take() != ")":
                raise SymbolError(f"size {text[:40]!r}: a parenthesis is not closed")
            return e
        if t.isdigit():
            if len(t) > 15:
                raise SymbolError(f"size {text[:40]!r}: integer {t[:20]}... is too large")
            return sympy.Integer(int(t))
        if t in names:
            return names[t]
        if t[0].isalpha() or t[0] == "_":
            raise SymbolError(f"size {text[:40]!r}: {t[:40]!r} is not a declared symbol")
        raise SymbolError(f"size {text[:40]!r}: unexpected {t!r}")

    def product(depth: int) -> sympy.Expr:
        e = atom(depth)
        while peek() == "*":
            take()
            e = e * atom(depth)
        return e

    def total(depth: int) -> sympy.Expr:
        e = product(depth)
        while peek() == "+":
            take()
            e = e + product(depth)
        return e

    result = total(0)
    if pos != len(tokens):
        raise SymbolError(f"size {text[:40]!r}: unexpected {tokens[pos]!r}")
    return result


def at_maxima(x: int | torch.SymInt) -> int:
    """A size at its symbols' maxima (its largest value: sizes grow with each symbol)."""
    if not isinstance(x, torch.SymInt):
        return int(x)
    sizes = sizes_of(x)
    expr = x.node.expr if sizes is None else sizes.env.replace(x.node.expr)
    top = {s: sizes.env.var_to_range[s].upper for s in expr.free_symbols} if sizes is not None else {}
    value = sympy.sympify(expr).xreplace({s: sympy.Integer(MAX_SYMBOL if not isinstance(v, sympy.Integer) else int(v))
                                          for s, v in top.items()})
    return int(value) if value.is_number else MAX_DIM + 1


def size_out(x: int | torch.SymInt) -> int | str:
    """A size as a graph file writes it: the number, or its expression with the file's names."""
    if not isinstance(x, torch.SymInt):
        return int(x)
    sizes = sizes_of(x)
    if sizes is None:
        return int(x)
    text = sizes.text(x)
    return int(text) if text.lstrip("-").isdigit() else text.replace(" ", "")


def symbols_out(graph: Any) -> dict[str, Any]:
    """The ``symbols`` object of a graph whose sizes are symbolic (its names, ranges, hints)."""
    sizes = sizes_of(graph)
    if sizes is None:
        return {}
    out = {}
    for sym in sizes.sources:
        vr = sizes.env.var_to_range[sym]
        name = sizes.display.get(sym, str(sym))
        spec = {"hint": sizes.hints[sym], "min": int(vr.lower)}
        if isinstance(vr.upper, sympy.Integer) and int(vr.upper) <= MAX_SYMBOL:
            spec["max"] = int(vr.upper)
        out[name] = spec
    return {"symbols": out}
