"""Random re-indexings of normalized values (Note [permuted full values] in runtime/codegen/lowering/rows.py).

A row kernel may take a reduced value through transposes, permutes, reshapes, expands and
slices/cats/pads/flips along the reduced dims, and must decline anything that reads another
row's registers. Each program here normalizes a small tensor whose dims often share an extent (so
a transposed value can have F's very shape), then applies random re-indexings and combinations,
and is checked against eager (values, strides, aliasing). The test also counts how many row
segments the C++ backend took and how many it declined as re-indexed, and fails if either is
none: a generator that stops reaching the rule is noticed.

``FUSEG_REINDEX_PROGRAMS`` sets how many programs (default 60, what CI runs; the same ones every
run unless ``FUSEG_FUZZ_RANDOM=1``, which draws a new seed and prints it).
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import runtime
from alias import apply_aliases
from runtime.codegen.build import cpu_compiler
from segmenter import SegmentKind, capture, segment

from .util import assert_matches_eager

PROGRAMS = int(os.environ.get("FUSEG_REINDEX_PROGRAMS", "40"))
RANDOM = os.environ.get("FUSEG_FUZZ_RANDOM", "0") == "1"
MOVES = {"aten.transpose.int", "aten.permute.default", "aten.slice.Tensor", "aten.cat.default",
         "aten.constant_pad_nd.default", "aten.flip.default", "aten.expand.default", "aten.view.default"}


def _normalize(kind: str, x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A full-size normalized value and a per-row value (keepdim) of the same reduction."""
    if kind == "softmax":
        return torch.softmax(x, dim), x.amax(dim, keepdim=True)
    if kind == "layer_norm":
        return F.layer_norm(x, x.shape[-1:]), x.mean(-1, keepdim=True)
    m = x.pow(2).mean(dim, keepdim=True)
    return x * torch.rsqrt(m + 1e-6), m


def _step(rng: random.Random, pool: list[torch.Tensor], rows: list[torch.Tensor]) -> tuple:
    i = rng.randrange(len(pool))
    nd = pool[i].dim()
    kind = rng.choice(["transpose", "permute", "slice", "cat", "cat-halves", "pad", "flip", "expand", "reshape",
                       "mul", "add-row", "neg"])
    dim = rng.randrange(nd) if nd else 0
    if kind == "transpose":
        return kind, i, rng.randrange(nd), rng.randrange(nd)
    if kind == "permute":
        p = list(range(nd))
        rng.shuffle(p)
        return kind, i, tuple(p)
    if kind == "slice":
        n = pool[i].shape[dim] if nd else 1
        return kind, i, dim, rng.randint(0, max(n - 1, 0)), rng.choice([None, n, n - 1])
    if kind in ("cat", "mul"):
        return kind, i, rng.randrange(len(pool)), dim
    if kind == "pad":
        return kind, i, rng.randint(-1, 2), rng.randint(0, 2)
    if kind == "flip":
        return kind, i, dim
    if kind == "expand":
        return kind, i, rng.randint(1, 3)
    if kind == "reshape":
        return kind, i, rng.choice(["flat-last2", "reversed", "unsqueeze"])
    if kind == "add-row":
        return kind, i, rng.randrange(len(rows))
    return kind, i, dim  # cat-halves (rotate_half along dim), neg


def _apply(step: tuple, pool: list[torch.Tensor], rows: list[torch.Tensor]) -> torch.Tensor:
    kind, i, *a = step
    x = pool[i]
    if kind == "transpose":
        return x.transpose(a[0], a[1])
    if kind == "permute":
        return x.permute(a[0])
    if kind == "slice":
        return x[(slice(None),) * a[0] + (slice(a[1], a[2]),)]
    if kind == "cat":
        return torch.cat((x, pool[a[0]]), a[1])
    if kind == "cat-halves":
        h = x.shape[a[0]] // 2
        return torch.cat((-x.narrow(a[0], h, x.shape[a[0]] - h), x.narrow(a[0], 0, h)), a[0])
    if kind == "pad":
        return F.pad(x, (a[0], a[1]))
    if kind == "flip":
        return x.flip(a[0])
    if kind == "expand":
        return x.unsqueeze(0).expand(a[0], *x.shape).clone()
    if kind == "reshape":
        if a[0] == "flat-last2":
            return x.reshape(*x.shape[:-2], -1)
        return x.reshape(tuple(x.shape)[::-1]) if a[0] == "reversed" else x.unsqueeze(1)
    if kind == "mul":
        return x * pool[a[0]]
    if kind == "add-row":
        return x + rows[a[0]]
    return -x


def _program(rng: random.Random):
    rank = rng.choice([2, 3, 4])
    shape = tuple(rng.choice([1, 2, 3, 4, 4, 5]) for _ in range(rank))
    kind = rng.choice(["softmax", "layer_norm", "rms"])
    dim = rng.randrange(rank) if kind != "layer_norm" else rank - 1
    x = torch.randn(shape)
    steps: list[tuple] = []
    y, r = _normalize(kind, x, dim)
    pool, rows = [y], [r]
    for _ in range(rng.randint(1, 5)):
        step = _step(rng, pool, rows)
        try:
            v = _apply(step, pool, rows)
        except (RuntimeError, IndexError, ValueError):
            continue  # torch refuses it: not part of the program
        steps.append(step)
        pool.append(v)
    outs = sorted({len(pool) - 1, rng.randrange(len(pool))})

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, r = _normalize(kind, t, dim)
        p, rs = [y], [r]
        for s in steps:
            p.append(_apply(s, p, rs))
        return tuple(p[o] * 2 for o in outs)  # computed outputs, so the row kernel writes them
    return fn, [x], (kind, dim, steps, outs)


@pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")
def test_random_reindexed_normalizations_match_eager() -> None:
    seed = random.randrange(2**32) if RANDOM else 1234
    print(f"FUSEG_REINDEX seed {seed}")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    seen: Counter = Counter()
    for k in range(PROGRAMS):
        fn, inputs, what = _program(rng)
        plan = apply_aliases(segment(capture(fn, inputs)), "post")
        prog = runtime.compile(plan, backend="cpp")
        try:
            assert_matches_eager(fn, inputs, prog.graph, program=prog, atol=1e-5, rtol=1e-5)
        except AssertionError as e:
            raise AssertionError(f"program {k} (seed {seed}): {what}") from e
        for s in plan.segments:
            if s.kind not in (SegmentKind.REDUCTION, SegmentKind.NORMALIZATION):
                continue
            moved = any(n.op in MOVES for n in s.nodes)
            why = " ".join(r for name, r in prog.passed_over.get(s.index, ()) if name == "cpp")
            if prog.backend_of[s.index] == "cpp":
                seen["taken, re-indexed" if moved else "taken"] += 1
            elif "re-indexed" in why or "part of a row" in why:
                seen["declined as re-indexed"] += 1
    print(f"FUSEG_REINDEX {dict(seen)}")
    assert seen["taken, re-indexed"] and seen["declined as re-indexed"], dict(seen)
