"""SymbolicSizes (Note [symbolic plans] in segmenter/ir/symbolic.py): the conditions a plan checks
at every call, and sizes printed as Python and C source."""

from __future__ import annotations

import sympy
import torch

from segmenter.ir.symbolic import NotSymbolic, SymbolicSizes, SymbolSource


def _sizes(*hints: int) -> tuple[SymbolicSizes, list[torch.SymInt]]:
    sizes = SymbolicSizes()
    syms = []
    for k, h in enumerate(hints):
        s = sizes.symbol(h, SymbolSource(0, k))
        syms.append(sizes.env.create_symintnode(s, hint=h))
    return sizes, syms


def _holds(sizes: SymbolicSizes, **values: int) -> bool:
    scope = {sizes.names[s]: values[str(s)] if str(s) in values else values[sizes.names[s]] for s in sizes.sources}
    return bool(eval(sizes.condition_source(), {"max": max, "min": min, "abs": abs}, scope))  # noqa: S307 - our own text


def test_a_pinned_size_is_a_condition() -> None:
    sizes, (n,) = _sizes(7)
    assert int(n) == 7  # a pass that needs the number pins the symbol
    name = sizes.names[n.node._expr]
    assert _holds(sizes, **{name: 7})
    assert not _holds(sizes, **{name: 8})


def test_two_sizes_found_equal_are_checked_equal() -> None:
    sizes, (a, b) = _sizes(5, 5)
    assert a == b  # a decision that found them equal: the plan uses one for the other
    na, nb = (sizes.names[x.node._expr] for x in (a, b))
    assert _holds(sizes, **{na: 9, nb: 9})
    assert not _holds(sizes, **{na: 9, nb: 12})


def test_a_decision_is_a_condition_and_the_range_too() -> None:
    sizes, (n,) = _sizes(40)
    assert n * 4 < 1000  # recorded: n < 250
    name = sizes.names[n.node._expr]
    assert _holds(sizes, **{name: 249}) and not _holds(sizes, **{name: 250})
    assert not _holds(sizes, **{name: 1})  # sizes are at least 2 (0 and 1 are specialized)


def test_sizes_print_as_python_and_c() -> None:
    from torch.utils._sympy.functions import FloorDiv, Mod

    sizes, (n, m) = _sizes(6, 10)
    pn, pm = (sizes.names[x.node._expr] for x in (n, m))
    assert sizes.python_expr(n * 8 + m) in (f"(({pn} * 8) + {pm})", f"({pm} + (8 * {pn}))", f"((8 * {pn}) + {pm})")
    assert eval(sizes.python_expr((n * 8 + m, 3)), {}, {pn: 2, pm: 5}) == (21, 3)  # noqa: S307
    c = sizes.c_expr(n * m + 1)
    assert "fuseg_s0" in c and "fuseg_s1" in c and "LL" in c
    q = sizes.env.create_symintnode(FloorDiv(n.node._expr - 13, 4), hint=-2)
    r = sizes.env.create_symintnode(Mod(n.node._expr - 13, 4), hint=1)
    assert "fuseg_fdiv" in sizes.c_expr(q) and "fuseg_fmod" in sizes.c_expr(r)  # floor, as Python's
    assert eval(sizes.python_expr(q), {}, {pn: 6}) == (6 - 13) // 4  # noqa: S307


def test_what_the_printers_do_not_know_is_refused() -> None:
    sizes, (n,) = _sizes(6)
    odd = sizes.env.create_symintnode(sympy.Function("weird")(n.node._expr), hint=1)
    for printer in (sizes.python_expr, sizes.c_expr):
        try:
            printer(odd)
        except NotSymbolic:
            continue
        raise AssertionError(f"{printer.__name__} printed an unknown function")
    try:
        sizes.python_expr("n")
    except NotSymbolic:
        pass
    else:
        raise AssertionError("a string was printed as a size")


def test_a_number_input_may_be_negative_or_one() -> None:
    """See Note [number inputs]: a number dynamo lifts (a slice bound) is no size."""
    sizes = SymbolicSizes()
    for v in (-3, 1, 0):
        s = sizes.symbol(v, SymbolSource(len(sizes.sources), None), number=True)
        assert isinstance(s, sympy.Symbol)
    assert sorted(sizes.number_inputs()) == [0, 1, 2]


def test_a_rounded_division_prints_as_integer_arithmetic() -> None:
    """``math.ceil(n / 32)`` of a size (CUDA's efficient attention pads its logsumexp so:
    CeilToInt(IntTrueDiv(s, 32))) and ``math.floor`` of one print as floor divisions, exact for
    every integer (a number input may be negative); C's form is checked against Python's by g++.
    Both were refused as 'a float size' (the H100's training on varying lengths, 2026-11-27)."""
    import math
    import re
    import shutil
    import subprocess
    import tempfile

    import pytest

    from runtime.codegen.source.ctypes_ import _COMMON

    fdiv = re.search(r"^FUSEG_FN long long fuseg_fdiv.*$", _COMMON, re.M).group(0)  # the kernels' own helper

    sizes = SymbolicSizes()
    s = sizes.symbol(40, SymbolSource(0, None), number=True)
    n = sizes.env.create_symintnode(s, hint=40)
    name = sizes.names[s]
    exprs = [math.ceil(n / 32) * 32, math.floor(n / 7), math.ceil(n / 5) + math.floor(n / 3)]
    values = list(range(-70, 71))
    want = [[math.ceil(v / 32) * 32, math.floor(v / 7), math.ceil(v / 5) + math.floor(v / 3)] for v in values]
    py = [sizes.python_expr(e) for e in exprs]
    assert [[eval(p, {}, {name: v}) for p in py] for v in values] == want  # noqa: S307 - our own text
    c = [sizes.c_expr(e) for e in exprs]
    assert all("/" not in x.replace("fuseg_fdiv", "") for x in c), c  # no float, no truncating division
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    body = "\n".join(f'  printf("%lld ", (long long)({x}));' for x in c)
    src = (f"#include <cstdio>\n#include <cstdlib>\n#define FUSEG_FN static\n{fdiv}\n"
           f"int main(int argc, char** argv) {{ for (int i = 1; i < argc; ++i) {{ long long fuseg_s0 = atoll(argv[i]);\n"
           f"{body}\n  printf(\"\\n\"); }} return 0; }}\n")
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/t.cpp", "w") as f:
            f.write(src)
        built = subprocess.run([cxx, "-O1", "-o", f"{tmp}/t", f"{tmp}/t.cpp"], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
        out = subprocess.run([f"{tmp}/t", *map(str, values)], check=True, capture_output=True, text=True).stdout
    assert [[int(x) for x in line.split()] for line in out.splitlines()] == want
