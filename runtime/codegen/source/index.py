"""Index math: how an element index of a view/injective op's output maps to its input.

Indices are lists of C expressions (strings), one per dim; "0" for a size-1 dim. Every function
here returns the input's index for an output index, or raises Declined.
"""

from __future__ import annotations

import math
import re

import torch

from .ctypes_ import Declined
from .symsizes import sizes_active

__all__ = ["broadcast", "contiguous_strides", "dense_strides", "linear", "reshape", "reshape_groups", "unravel_terms"]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def dense_strides(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a fresh dense buffer whose dims are ordered as ``stride`` orders them (what
    ``torch.empty_like(memory_format=torch.preserve_format)`` keeps): a permuted layout stays
    permuted, gaps are closed; a layout with repeated (stride-0) elements becomes contiguous."""
    if any(st == 0 and n > 1 for n, st in zip(shape, stride)):
        return contiguous_strides(shape)
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    out = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        out[d] = acc
        acc *= max(shape[d], 1)
    return tuple(out)


def _plain_ints(*groups: tuple[int, ...]) -> None:
    """Sizes and strides become source text here: plain ints only (lower_segment checks their
    ranges first, Note [checked source values] in checks.py)."""
    symbolic = sizes_active()  # Note [kernel sizes as arguments] in symsizes.py
    for g in groups:
        if not all(type(x) is int or (symbolic and isinstance(x, torch.SymInt)) for x in g):
            raise Declined(f"layout {list(g)!r:.80} is not made of integers")


def linear(idx: list[str], shape: tuple[int, ...], stride: tuple[int, ...]) -> str:
    _plain_ints(shape, stride)
    pairs = _merged([(i, s) for i, n, s in zip(idx, shape, stride) if n != 1 and s != 0])
    terms = [f"{i} * {s}" if s != 1 else i for i, s in pairs]
    return " + ".join(terms) if terms else "0"


# Note [split indices merged]: a reshape read through splits one index into a quotient and a
# remainder (``unravel_terms``: a (2, 32, 64) output read from heads of (2, 32, 4, 16) gives
# ``((i) / 16)`` and ``((i) % 16)``); where the input's strides put the two back together
# (stride of the quotient = divisor x stride of the remainder: the heads are contiguous in
# memory), their terms are one: ``i * s``. g++ vectorizes a loop over ``i`` that reads
# ``in[... + i]``, not one that computes a quotient and a remainder per element (gpt2-tiny's
# backward: the kernel that gathers q, k and v's gradients from the attention's layout into
# the qkv projection's, and sums them over the rows). The rules are C's own identities for
# truncating division by a positive divisor, exact for any sign of ``L``:
#   (L / c) * c + L % c                     == L
#   ((L / c) % n) * c + L % c              == L % (n * c)
#   (L / (c * n)) * n + (L / c) % n        == L / c
# applied to pairs of terms whose strides stand in that ratio, until none applies. Only integer
# divisors and strides (a symbolic size is left as it is).
_D = re.compile(r"^\(\((?P<L>.+)\) / (?P<c>\d+)\)$")
_M = re.compile(r"^\(\((?P<L>.+)\) % (?P<c>\d+)\)$")
_DM = re.compile(r"^\(\(\((?P<L>.+)\) / (?P<c>\d+)\) % (?P<n>\d+)\)$")


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


def _split(term: str) -> tuple[str, str, int, int] | None:
    """("D", L, c, 0) for ``((L) / c)``, ("M", L, c, 0) for ``((L) % c)``, ("DM", L, c, n) for
    ``(((L) / c) % n)``; None for anything else."""
    for kind, pat in (("DM", _DM), ("D", _D), ("M", _M)):
        m = pat.match(term)
        if m and _balanced(m["L"]):
            return kind, m["L"], int(m["c"]), int(m["n"]) if kind == "DM" else 0
    return None


def _joined(a: tuple[str, str, int, int], sa: int, b: tuple[str, str, int, int], sb: int) -> str | None:
    """The one term of ``a * sa + b * sb`` (split terms of one index, ``b`` the inner), or None."""
    (kind_a, index, ca, na), (kind_b, _, cb, nb) = a, b
    if kind_b == "M" and ca == cb and sa == ca * sb:
        if kind_a == "D":
            return f"({index})"
        if kind_a == "DM":
            return f"(({index}) % {na * ca})"
    if kind_a == "D" and kind_b == "DM" and ca == cb * nb and sa == nb * sb:
        return f"(({index}) / {cb})"
    return None


def _merged(pairs: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """See Note [split indices merged]: (index, stride) terms with each quotient and remainder of one
    index that the strides put back together replaced by one term."""
    pairs = list(pairs)
    while (join := _first_join(pairs)) is not None:
        a, b, term = join
        pairs[min(a, b)] = (term, pairs[b][1])
        del pairs[max(a, b)]
    return pairs


def _first_join(pairs: list[tuple[str, object]]) -> tuple[int, int, str] | None:
    splits = [_split(t) if type(s) is int else None for t, s in pairs]
    for a, ta in enumerate(splits):
        for b, tb in enumerate(splits):
            if ta is None or tb is None or a == b or ta[1] != tb[1]:
                continue
            term = _joined(ta, pairs[a][1], tb, pairs[b][1])  # type: ignore[arg-type]
            if term is not None:
                return a, b, term
    return None


def unravel_terms(lin: str, shape: tuple[int, ...]) -> list[str]:
    """The index of linear position ``lin`` in a row-major ``shape``, as expressions."""
    _plain_ints(shape)
    cs = contiguous_strides(shape)
    first = next((d for d, n in enumerate(shape) if n != 1), None)
    out = []
    for d, (n, s) in enumerate(zip(shape, cs)):
        if n == 1:
            out.append("0")
            continue
        q = lin if s == 1 else f"({lin}) / {s}"
        out.append(f"({q})" if d == first else f"(({q}) % {n})")
    return out


def broadcast(idx: list[str], in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[str]:
    off = len(out_shape) - len(in_shape)
    if off < 0:
        raise Declined(f"cannot broadcast {list(in_shape)} to {list(out_shape)}")
    return ["0" if n == 1 else idx[off + d] for d, n in enumerate(in_shape)]


def reshape_groups(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """The dims of a row-major reshape in groups of equal product: (dims of ``in_shape``, dims of
    ``out_shape``), size-1 dims left out. Both shapes hold the same number (> 0) of elements."""
    ins = [d for d, n in enumerate(in_shape) if n != 1]
    outs = [d for d, n in enumerate(out_shape) if n != 1]
    groups = []
    a = b = 0
    while a < len(ins) or b < len(outs):
        ga, gb = [ins[a]], [outs[b]]
        pa, pb = in_shape[ins[a]], out_shape[outs[b]]
        a, b = a + 1, b + 1
        while pa != pb:
            if pa < pb:
                ga.append(ins[a])
                pa *= in_shape[ins[a]]
                a += 1
            else:
                gb.append(outs[b])
                pb *= out_shape[outs[b]]
                b += 1
        groups.append((ga, gb))
    return groups


def reshape(idx: list[str], in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[str]:
    """Row-major reshape, dim groups of equal product mapped separately (so leading and trailing
    dims that a reshape leaves alone keep their index as it is)."""
    if in_shape == out_shape:
        return list(idx)
    if math.prod(in_shape) == 0:
        return ["0"] * len(in_shape)
    result = ["0"] * len(in_shape)
    for ga, gb in reshape_groups(in_shape, out_shape):
        if len(ga) == 1 and len(gb) == 1:
            result[ga[0]] = idx[gb[0]]
            continue
        sub_out = tuple(out_shape[d] for d in gb)
        lin = linear([idx[d] for d in gb], sub_out, contiguous_strides(sub_out))
        for d, term in zip(ga, unravel_terms(lin, tuple(in_shape[d] for d in ga))):
            result[d] = term
    return result
