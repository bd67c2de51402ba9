"""Per-element expressions of the elementwise ATen ops the generator takes.

Each entry maps the op's bound arguments (C expressions already converted to the compute type
``ct``, or Python scalars) to one C expression. ``how`` says which compute type the arguments are
converted to: the output's ("out"), the promoted type of the inputs for comparisons ("cmp", the
output is bool), or bool for logical ops ("bool").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..source.ctypes_ import Declined, literal

__all__ = ["ELEMENTWISE", "Rule", "pow_as_eager"]

Fn = Callable[[dict, str], str]


@dataclass(frozen=True)
class Rule:
    tensors: tuple[str, ...]  # the arguments that may be tensors (or scalars), in schema names
    how: str  # "out" | "cmp" | "bool"
    fn: Fn


def _unary(fmt: str, floating_only: bool = False) -> Rule:
    def fn(a: dict, ct: str) -> str:
        if floating_only and ct not in ("float", "double"):
            raise Declined(f"{fmt.split('(')[0]} on {ct}")
        return fmt.format(x=a["self"], ct=ct)
    return Rule(("self",), "out", fn)


def _binary(fmt: str, names: tuple[str, str] = ("self", "other"), how: str = "out") -> Rule:
    return Rule(names, how, lambda a, ct: fmt.format(a=a[names[0]], b=a[names[1]], ct=ct))


def _alpha(a: dict, ct: str) -> str:
    alpha = a.get("alpha", 1)
    return "" if alpha == 1 else f"{literal(alpha, ct)} * "


def _pow(a: dict, ct: str) -> str:
    e = a["exponent"]  # a scalar (Tensor_Scalar) or the C expression of a tensor (Tensor_Tensor)
    if isinstance(e, bool):
        e = int(e)
    if isinstance(e, (int, float)):
        if e == 2:
            return f"({a['self']} * {a['self']})"
        if e == 1:
            return a["self"]
        if e == 3:
            return f"({a['self']} * {a['self']} * {a['self']})"
        if e == 0.5 and ct in ("float", "double"):
            return f"sqrt({a['self']})"
        if ct not in ("float", "double"):
            raise Declined("integer pow")
        return f"pow({a['self']}, {literal(e, ct)})"
    if ct not in ("float", "double"):
        raise Declined("integer pow")
    return f"pow({a['self']}, {e})"


# Note [pow as eager rounds it]: ATen's CPU kernel for ``pow(x, scalar)`` (PowKernel.cpp) special-
# cases some exponents, and for bfloat16 its special cases compute in ``Vectorized<BFloat16>``,
# whose every multiply rounds to bf16: ``x ** 3`` is ``round(round(x * x) * x)`` and ``x ** -2`` is
# ``round(1 / round(x * x))``, where a kernel computing in float and rounding once differed from
# eager at about a fifth of the values (GPT-2's tanh GELU cubes its input). float16 (computed in
# float, rounded once) and float32 agree with one rounding. ``x ** -0.5`` is ATen's rsqrt, a
# division by a square root (two roundings), not libm's ``pow`` (one). Checked against eager over
# 2^16 values per dtype and exponent in tests/test_low_precision.py. One quirk is left as it is:
# for bf16 ``x ** -0.5`` ATen's scalar loop, which takes the last (n mod 64) values of a contiguous
# run after its vector loop, rounds the square root before dividing, so eager's own bits there
# depend on the position (4 of 4773 values); ours are its vector loop's everywhere. float32's
# other exponents are libm's ``pow`` against ATen's Sleef one: a last-bit difference at places,
# within OpInfo's tolerances, and no half-precision rounding to magnify it.
def pow_as_eager(x: str, e: object, ct: str, dtype: object, rounded: Callable[[str], str]) -> str | None:
    """``pow(x, e)`` for a scalar ``e`` where eager's kernel rounds between its steps (``rounded``:
    the value rounded to ``dtype``), or None where one rounding of the float result is eager's."""
    if isinstance(e, bool) or not isinstance(e, (int, float)) or ct not in ("float", "double"):
        return None
    if e == -0.5:
        return f"(({ct})1 / sqrt({x}))"
    if dtype == torch.bfloat16 and e == 3:
        return f"({rounded(f'({x} * {x})')} * {x})"
    if dtype == torch.bfloat16 and e == -2:
        return f"(({ct})1 / {rounded(f'({x} * {x})')})"
    return None


def _clamp(a: dict, ct: str) -> str:
    x = a["self"]
    if a.get("min") is not None:
        x = f"fuseg_max<{ct}>({x}, {literal(a['min'], ct)})"
    if a.get("max") is not None:
        x = f"fuseg_min<{ct}>({x}, {literal(a['max'], ct)})"
    return x


def _clamp_tensor(a: dict, ct: str) -> str:
    """``clamp.Tensor``: bounds that are tensors (or absent), NaN where the value or a bound is NaN
    (ATen's vectorized clamp: maximum, then minimum, each passing a NaN on), the upper bound where
    the bounds cross."""
    x = a["self"]
    for name, fn in (("min", "fuseg_max"), ("max", "fuseg_min")):
        bound = a.get(name)
        if bound is not None:
            x = f"{fn}<{ct}>({x}, {bound if isinstance(bound, str) else literal(bound, ct)})"
    return x


def _isinf(a: dict, ct: str) -> str:
    """Infinite: finite values give x - x == 0, and a NaN fails x == x (no constant for infinity,
    so one form holds on either target); never for integers."""
    x = a["self"]
    if ct not in ("float", "double"):
        return "false"
    return f"({x} == {x} && {x} - {x} != {x} - {x})"


def _gelu(a: dict, ct: str) -> str:
    x = a["self"]
    if ct not in ("float", "double"):
        raise Declined("gelu on integers")
    if a.get("approximate", "none") == "tanh":
        return f"(({ct})0.5 * {x} * (({ct})1 + fuseg_tanh(({ct})0.7978845608028654 * ({x} + ({ct})0.044715 * {x} * {x} * {x}))))"
    return f"(({ct})0.5 * {x} * (({ct})1 + fuseg_erf({x} * ({ct})0.7071067811865476)))"


def _gelu_backward(a: dict, ct: str) -> str:
    """GELU's derivative times the gradient, with the erf and tanh GELU itself uses (Note
    [vectorizable tanh and erf]; eager's vectorized CPU kernel uses the same erf). Taken whole,
    not decomposed (runtime/dynamo.py's DECOMPOSED): torch's decomposition calls the erf op,
    which is libm's scalar erff here: 189 us for a 64x256 bias-gradient segment of bert-tiny's
    backward, scratch."""
    g, x = a["grad_output"], a["self"]
    if ct not in ("float", "double"):
        raise Declined("gelu_backward on integers")
    if a.get("approximate", "none") == "tanh":
        beta, kappa = "0.7978845608028654", "0.044715"
        t = f"fuseg_tanh(({ct}){beta} * ({x} + ({ct}){kappa} * {x} * {x} * {x}))"
        return (f"({g} * (({ct})0.5 * (({ct})1 + {t}) + ({ct})0.5 * {x} * (({ct})1 - {t} * {t}) * ({ct}){beta}"
                f" * (({ct})1 + ({ct})3 * ({ct}){kappa} * {x} * {x})))")
    return (f"({g} * (({ct})0.5 * (({ct})1 + fuseg_erf({x} * ({ct})0.7071067811865476))"
            f" + {x} * fuseg_exp(({ct})-0.5 * {x} * {x}) * ({ct})0.3989422804014327))")


def _bitwise(op: str) -> Rule:
    def fn(a: dict, ct: str) -> str:
        if ct in ("float", "double"):
            raise Declined("bitwise op on floating point")
        return f"({a['self']} {op} {a['other']})"
    return Rule(("self", "other"), "out", fn)


def _div(a: dict, ct: str) -> str:
    mode = a.get("rounding_mode")
    if mode is not None:
        raise Declined(f"division with rounding_mode={mode!r}")
    if ct not in ("float", "double"):
        raise Declined("integer division")
    return f"({a['self']} / {a['other']})"


_U = {
    "neg": "(-{x})", "abs": "({x} < ({ct})0 ? -{x} : {x})", "reciprocal": "(({ct})1 / {x})",
    "relu": "({x} < ({ct})0 ? ({ct})0 : {x})", "sign": "(({ct})(({x} > ({ct})0) - ({x} < ({ct})0)))",
}
_UF = {  # floating point only
    "exp": "fuseg_exp({x})", "exp2": "exp2({x})", "expm1": "expm1({x})", "log": "log({x})", "log2": "log2({x})",
    "log10": "log10({x})", "log1p": "log1p({x})", "sqrt": "sqrt({x})", "rsqrt": "rsqrt({x})",
    "sin": "sin({x})", "cos": "cos({x})", "tan": "tan({x})", "tanh": "fuseg_tanh({x})", "sinh": "sinh({x})",
    "cosh": "cosh({x})", "asin": "asin({x})", "acos": "acos({x})", "atan": "atan({x})", "erf": "erf({x})",
    "erfc": "erfc({x})", "floor": "floor({x})", "ceil": "ceil({x})", "trunc": "trunc({x})",
    "round": "rint({x})", "sigmoid": "(({ct})1 / (({ct})1 + fuseg_exp(-{x})))",
    "silu": "({x} / (({ct})1 + fuseg_exp(-{x})))",
}

ELEMENTWISE: dict[str, Rule] = {}
for _n, _f in _U.items():
    ELEMENTWISE[f"aten.{_n}.default"] = _unary(_f)
for _n, _f in _UF.items():
    ELEMENTWISE[f"aten.{_n}.default"] = _unary(_f, floating_only=True)
for _ov in ("Tensor", "Scalar"):
    ELEMENTWISE[f"aten.add.{_ov}"] = Rule(("self", "other"), "out",
                                         lambda a, ct: f"({a['self']} + {_alpha(a, ct)}{a['other']})")
    ELEMENTWISE[f"aten.sub.{_ov}"] = Rule(("self", "other"), "out",
                                         lambda a, ct: f"({a['self']} - {_alpha(a, ct)}{a['other']})")
    ELEMENTWISE[f"aten.mul.{_ov}"] = _binary("({a} * {b})")
    ELEMENTWISE[f"aten.div.{_ov}"] = Rule(("self", "other"), "out", _div)
    ELEMENTWISE[f"aten.div.{_ov}_mode"] = Rule(("self", "other"), "out", _div)
    for _cmp, _op in (("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">=")):
        ELEMENTWISE[f"aten.{_cmp}.{_ov}"] = _binary(f"({{a}} {_op} {{b}})", how="cmp")
    for _lop, _op in (("and", "&"), ("or", "|"), ("xor", "^")):
        ELEMENTWISE[f"aten.bitwise_{_lop}.{_ov}"] = _bitwise(_op)
ELEMENTWISE["aten.rsub.Scalar"] = Rule(("self", "other"), "out",
                                       lambda a, ct: f"({a['other']} - {_alpha(a, ct)}{a['self']})")
ELEMENTWISE["aten.rsub.Tensor"] = ELEMENTWISE["aten.rsub.Scalar"]
for _lop, _op in (("and", "&&"), ("or", "||"), ("xor", "!=")):
    ELEMENTWISE[f"aten.logical_{_lop}.default"] = _binary(f"({{a}} {_op} {{b}})", how="bool")
ELEMENTWISE["aten.logical_not.default"] = Rule(("self",), "bool", lambda a, ct: f"(!{a['self']})")
ELEMENTWISE["aten.bitwise_not.default"] = Rule(
    ("self",), "out", lambda a, ct: f"(!{a['self']})" if ct == "bool" else f"(~{a['self']})")
ELEMENTWISE["aten.maximum.default"] = _binary("fuseg_max<{ct}>({a}, {b})")
ELEMENTWISE["aten.minimum.default"] = _binary("fuseg_min<{ct}>({a}, {b})")
ELEMENTWISE["aten.clamp.default"] = Rule(("self",), "out", _clamp)
ELEMENTWISE["aten.clamp.Tensor"] = Rule(("self", "min", "max"), "out", _clamp_tensor)
ELEMENTWISE["aten.clamp_min.default"] = Rule(("self",), "out", lambda a, ct: f"fuseg_max<{ct}>({a['self']}, {literal(a['min'], ct)})")
ELEMENTWISE["aten.clamp_max.default"] = Rule(("self",), "out", lambda a, ct: f"fuseg_min<{ct}>({a['self']}, {literal(a['max'], ct)})")
# hardtanh (ReLU6 is hardtanh(x, 0, 6)): a clamp whose bounds default to -1 and 1
ELEMENTWISE["aten.hardtanh.default"] = Rule(("self",), "out", lambda a, ct: _clamp(
    {"self": a["self"], "min": a.get("min_val", -1), "max": a.get("max_val", 1)}, ct))
ELEMENTWISE["aten.pow.Tensor_Scalar"] = Rule(("self",), "out", _pow)
ELEMENTWISE["aten.pow.Tensor_Tensor"] = Rule(("self", "exponent"), "out", _pow)
ELEMENTWISE["aten.pow.Scalar"] = Rule(("self", "exponent"), "out", _pow)  # a scalar base: ALiBi's slopes
ELEMENTWISE["aten.gelu.default"] = Rule(("self",), "out", _gelu)
ELEMENTWISE["aten.gelu_backward.default"] = Rule(("grad_output", "self"), "out", _gelu_backward)
ELEMENTWISE["aten.where.self"] = Rule(("condition", "self", "other"), "out",
                                      lambda a, ct: f"({a['condition']} ? {a['self']} : {a['other']})")
ELEMENTWISE["aten.masked_fill.Scalar"] = Rule(("self", "mask"), "out",
                                              lambda a, ct: f"({a['mask']} ? {literal(a['value'], ct)} : {a['self']})")
ELEMENTWISE["aten.isnan.default"] = Rule(("self",), "cmp", lambda a, ct: f"({a['self']} != {a['self']})")
ELEMENTWISE["aten.isinf.default"] = Rule(("self",), "cmp", _isinf)
# copies and casts: the value itself, converted to the output's type
for _n in ("aten._to_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default",
           "aten.alias.default", "aten.detach.default", "aten.lift_fresh.default"):
    ELEMENTWISE[_n] = Rule(("self",), "out", lambda a, ct: a["self"])
ELEMENTWISE["aten.copy.default"] = Rule(("src",), "out", lambda a, ct: a["src"])
