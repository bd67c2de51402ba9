"""Random tensor programs for differential fuzzing (hypothesis draws them, eager checks them).

A program is a list of steps over a pool of values (the inputs first). Each step reads pool
entries by index and appends its result; in-place steps change a pool entry in place (an input,
an intermediate, or a view of either). ``run`` replays a program on any inputs, so the same
program is run by eager PyTorch and captured by ``segmenter.capture``.

While drawing, every step is tried on probe copies of the inputs: a step torch refuses is not
kept, so every drawn program is valid eager PyTorch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from segmenter.capturing.reference import clone_inputs

Step = tuple  # (kind, *args)


def _apply(pool: list[torch.Tensor], step: Step) -> None:
    kind, *a = step
    if kind == "slice":
        i, dim, start, end, step_ = a
        pool.append(torch.ops.aten.slice.Tensor(pool[i], dim, start, end, step_))
    elif kind == "select":
        i, dim, idx = a
        pool.append(pool[i].select(dim, idx))
    elif kind == "permute":
        i, dims = a
        pool.append(pool[i].permute(dims))
    elif kind == "expand":
        i, sizes = a
        pool.append(pool[i].expand(sizes))
    elif kind == "reshape":
        i, shape = a
        pool.append(pool[i].reshape(shape))
    elif kind == "unsqueeze":
        i, dim = a
        pool.append(pool[i].unsqueeze(dim))
    elif kind == "view_dtype":
        i, dtype = a
        pool.append(pool[i].view(dtype))
    elif kind == "unary":
        i, name = a
        pool.append(getattr(torch, name)(pool[i]))
    elif kind == "binary":
        i, j, name = a
        pool.append(getattr(torch, name)(pool[i], pool[j]))
    elif kind == "scalar":
        i, name, c = a
        pool.append(getattr(torch, name)(pool[i], c))
    elif kind == "to":
        i, dtype = a
        pool.append(pool[i].to(dtype))
    elif kind == "reduce":
        i, name, dim, keep = a
        pool.append(getattr(torch, name)(pool[i], dim, keepdim=keep))
    elif kind == "cat":
        i, j, dim = a
        pool.append(torch.cat((pool[i], pool[j]), dim))
    elif kind == "pad":
        i, lo, hi = a
        pool.append(F.pad(pool[i], (lo, hi)))
    elif kind == "matmul":
        i, j = a
        pool.append(pool[i] @ (pool[i].t() if j is None else pool[j]))
    elif kind == "softmax":
        i, dim = a
        pool.append(torch.softmax(pool[i], dim))
    elif kind == "attention":  # self-attention over x's last two dims (bounded, NaN-free scores)
        i, causal = a
        y = torch.tanh(pool[i]).nan_to_num(0.0)
        # and no subnormal values (an int tensor viewed as float gives them): attention's sums
        # round them differently in every implementation (ATen's flash kernel and ours differ by a
        # subnormal ulp), and an int view of the output makes that 1.4e-45 an integer 1 apart,
        # which the comparison's tolerances (relative to ints of that size) cannot take
        y = torch.where(y.abs() < 1e-30, 0.0, y)
        y = y if y.dim() == 4 else y.unsqueeze(0)
        pool.append(F.scaled_dot_product_attention(y, y, y, is_causal=causal))
    elif kind == "where":
        i, j = a
        pool.append(torch.where(pool[i] > 0, pool[i], pool[j]))
    elif kind == "masked_fill":
        i, j, c = a
        pool.append(pool[i].masked_fill(pool[j], c))
    elif kind == "inplace":
        i, name, c = a
        getattr(pool[i], name)(c)
    else:  # pragma: no cover
        raise ValueError(kind)


@dataclass
class Program:
    n_inputs: int
    steps: list[Step]
    outputs: list[int]
    same_input_twice: bool = False
    tags: Counter = field(default_factory=Counter)

    def run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pool = list(inputs)
        for s in self.steps:
            _apply(pool, s)
        return tuple(pool[i] for i in self.outputs)

    def as_function(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        def program(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.run(*inputs)
        return program


FLOATS = [torch.float32, torch.float64]


@st.composite
def input_tensor(draw: st.DrawFn, tags: Counter) -> torch.Tensor:
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    dtype = draw(st.sampled_from(FLOATS + [torch.int32, torch.bool]))
    layout = draw(st.sampled_from(["contiguous", "transposed", "offset", "expanded"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    n = math.prod(shape)

    def fill(k: int) -> torch.Tensor:
        t = torch.randn(k, generator=g) * 3
        if dtype == torch.bool:  # a mask: kernels read bool inputs as bytes (Note [bool loads as bytes])
            return t > 0
        return t.to(dtype) if dtype.is_floating_point else t.round().to(dtype)

    if layout == "transposed" and len(shape) >= 2:
        x = fill(n).view(shape[::-1][:1] + shape[1:-1] + shape[:1]).transpose(0, -1)
    elif layout == "offset":
        x = fill(n + 5)[3:3 + n].view(shape)
    elif layout == "expanded" and shape and shape[0] > 1:
        x = fill(math.prod(shape[1:])).view((1, *shape[1:])).expand(shape)
    else:
        layout = "contiguous"
        x = fill(n).view(shape)
    tags[f"input:{layout}"] += 1
    tags[f"input:rank{len(shape)}"] += 1
    if 0 in shape:
        tags["input:size0"] += 1
    return x


def _draw_step(draw: st.DrawFn, pool: list[torch.Tensor], n_inputs: int) -> Step:
    i = draw(st.integers(0, len(pool) - 1))
    x = pool[i]
    nd = x.dim()
    kinds = ["unary", "scalar", "binary", "to", "reshape", "unsqueeze", "inplace", "view_dtype", "where"]
    masks = [j for j, t in enumerate(pool) if t.dtype == torch.bool]
    if masks:
        kinds.append("masked_fill")
    if nd:
        kinds += ["slice", "permute", "reduce", "cat", "pad", "expand"]
        if x.dtype.is_floating_point:
            kinds.append("softmax")
            if nd in (3, 4):
                kinds.append("attention")
        if x.shape[0]:
            kinds.append("select")
    if nd == 2:
        kinds.append("matmul")
    kind = draw(st.sampled_from(kinds))
    dim = draw(st.integers(-nd, nd - 1)) if nd else 0
    if kind == "slice":
        s = x.shape[dim]
        return ("slice", i, dim, draw(st.integers(-s - 1, s)), draw(st.sampled_from([None, -1, s, 2**63 - 1])),
                draw(st.integers(1, 3)))
    if kind == "select":
        return ("select", i, 0, draw(st.integers(-x.shape[0], x.shape[0] - 1)))
    if kind == "permute":
        return ("permute", i, tuple(draw(st.permutations(range(nd)))))
    if kind == "expand":
        return ("expand", i, tuple([draw(st.integers(1, 3))] + [draw(st.integers(1, 3)) if n == 1 else n for n in x.shape]))
    if kind == "reshape":
        options = [(-1,), tuple(x.shape)[::-1], (1, *x.shape)]
        return ("reshape", i, draw(st.sampled_from(options)))
    if kind == "unsqueeze":
        return ("unsqueeze", i, draw(st.integers(-nd - 1, nd)))
    if kind == "view_dtype":
        return ("view_dtype", i, {torch.float32: torch.int32, torch.int32: torch.float32}.get(x.dtype, torch.float64))
    if kind == "unary":
        return ("unary", i, draw(st.sampled_from(["sin", "exp", "neg", "abs"])))
    if kind == "scalar":
        return ("scalar", i, draw(st.sampled_from(["add", "mul", "sub"])), draw(st.sampled_from([2, 0.5, -1])))
    if kind == "binary":
        return ("binary", i, draw(st.integers(0, len(pool) - 1)), draw(st.sampled_from(["add", "mul", "maximum"])))
    if kind == "to":  # to bool: a mask made in a kernel, read back as a number by later steps
        return ("to", i, draw(st.sampled_from(FLOATS + [torch.bool])))
    if kind == "masked_fill":
        return ("masked_fill", i, draw(st.sampled_from(masks)), draw(st.sampled_from([-3.0, 0.5, 2])))
    if kind == "reduce":
        return ("reduce", i, draw(st.sampled_from(["sum", "amax", "mean"])), dim, draw(st.booleans()))
    if kind == "softmax":
        return ("softmax", i, dim)
    if kind == "attention":
        return ("attention", i, draw(st.booleans()))
    if kind == "where":
        return ("where", i, draw(st.integers(0, len(pool) - 1)))
    if kind == "cat":
        return ("cat", i, draw(st.integers(0, len(pool) - 1)), dim)
    if kind == "pad":
        return ("pad", i, draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    if kind == "matmul":  # same dtype: eager accepts mixed dtypes on empty matrices, torch.export never
        # a matrix whose rows match x's columns, or x's own transpose (None): a product eager
        # computes (the generated matmul kernels take float32 ones)
        fits = [j for j, t in enumerate(pool) if t.dtype == x.dtype and t.dim() == 2 and t.shape[0] == x.shape[1]]
        return ("matmul", i, draw(st.sampled_from([*fits, None])))
    target = draw(st.sampled_from(["input", "any"]))
    if target == "input":
        i = draw(st.integers(0, n_inputs - 1))
    return ("inplace", i, draw(st.sampled_from(["add_", "mul_", "sin_"])) if pool[i].dtype.is_floating_point
            else "add_", 1)


@st.composite
def programs(draw: st.DrawFn) -> tuple[Program, list[torch.Tensor]]:
    tags: Counter = Counter()
    n = draw(st.integers(1, 3))
    inputs = [draw(input_tensor(tags)) for _ in range(n)]
    twice = n >= 2 and draw(st.integers(0, 4)) == 0
    if twice:
        inputs[1] = inputs[0]
        tags["inputs:passed-twice"] += 1
    prog = Program(n, [], [], twice, tags)
    probe = clone_inputs(inputs)
    pool = list(probe)
    for _ in range(draw(st.integers(1, 8))):
        step = _draw_step(draw, pool, n)
        trial = list(pool)
        try:
            _apply(trial, step)
        except (RuntimeError, IndexError, ValueError, TypeError):
            continue  # torch refuses it: not part of the program
        if step[0] == "inplace":
            # the probe pool's tensors were changed in place; keep using them
            tags["inplace:input" if step[1] < n else "inplace:intermediate"] += 1
            if step[1] >= n and pool[step[1]]._base is not None:
                tags["inplace:view"] += 1
        pool = trial
        prog.steps.append(step)
        tags[f"op:{step[0]}"] += 1
    k = len(pool)
    outs = draw(st.lists(st.integers(0, k - 1), min_size=1, max_size=3))
    prog.outputs = outs
    if any(o < n for o in outs) or any(pool[o]._base is not None for o in outs):
        tags["output:view-or-input"] += 1
    return prog, inputs
