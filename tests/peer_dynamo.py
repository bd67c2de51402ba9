"""Small programs of the ordinary kind dynamo's own tests run (PyTorch's test/dynamo/:
test_functions.py's one-line functions, test_repros.py's and test_misc.py's views, in-place
updates, reductions and uses of sizes and of ``.item()``), in our words, for the peer suite
(Note [the peer suite] in tests/peer_suite.py). Each returns what it computes; inputs are made
fresh per program (float32 unless the program says).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812

from .opdb_sweep import Case

PROGRAMS: dict[str, tuple[Callable[..., object], Callable[[], list[torch.Tensor]]]] = {}


def _r(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def program(name: str, *shapes: tuple[int, ...], dtype: torch.dtype = torch.float32,
            make: Callable[[], list[torch.Tensor]] | None = None):
    def add(fn: Callable[..., object]) -> Callable[..., object]:
        PROGRAMS[name] = (fn, make or (lambda: [_r(*s, seed=k, dtype=dtype) for k, s in enumerate(shapes)]))
        return fn

    return add


# --- arithmetic and constants (test_functions' one-liners)
@program("add-sub-constant", (4, 5), (4, 5))
def _(a, b):
    return a + b - 1, a * 2.5 - b / 3


@program("python-loop-of-adds", (6,))
def _(x):
    for i in range(3):
        x = x + i
    return x


@program("addcmul-addcdiv", (3, 4), (3, 4), (3, 4))
def _(a, b, c):
    return torch.addcmul(a, b, c, value=0.5), torch.addcdiv(a, b, c.abs() + 1, value=-2)


@program("where-with-scalar", (5, 6))
def _(x):
    return torch.where(x > 0, x, 0.0), torch.where(x < 0, -1.0, x * 2)


@program("clamp-pow-sum-sqrt", (4, 8))
def _(x):
    return x.clamp(min=0).pow(2).sum(dim=-1, keepdim=True).sqrt()


@program("integer-math", make=lambda: [torch.arange(-7, 17, dtype=torch.int64).reshape(4, 6)])
def _(x):
    return (x % 3).sum(), x // 2, (x * x).sum(1), x.abs().max(), (x > 0).sum(0)


@program("bool-any-all", (5, 7))
def _(x):
    return (x > 0).any(-1), (x > -3).all(), (x > 0).sum(dtype=torch.int32)


@program("dtype-round-trips", (4, 16))
def _(x):
    return x.to(torch.float16).float(), x.to(torch.bfloat16).sum(-1).float(), x.double().mean()


# --- sizes used as numbers
@program("size-arithmetic", (3, 4))
def _(x):
    return x.new_zeros(x.size(0) * 2) + x.shape[-1], x * x.dim(), x * len(x), x.sum() / x.numel()


@program("reshape-from-shape", (2, 3, 4))
def _(x):
    b, s, h = x.shape
    return x.reshape(b * s, h).sum(0), x.view(b, -1).mean(-1), x.flatten(1).view(x.shape[0], s, h) * 2


@program("scaled-softmax-by-shape", (2, 5, 8))
def _(x):
    return F.softmax(x / math.sqrt(x.shape[-1]), dim=-1)


# --- views and what they alias
@program("returns-its-input-and-a-view", (3, 4))
def _(x):
    return x, x[..., None], x.detach(), x + 1


@program("chained-views", (4, 6))
def _(x):
    return x.t().contiguous().view(-1)[::2], x.transpose(0, 1).reshape(3, 8), x.unsqueeze(0).expand(3, -1, -1).sum(0)


@program("chunk-and-split", (4, 6))
def _(x):
    a, b = x.chunk(2, dim=1)
    c, d = x.split([1, 3])
    return a, b * 2, c, d.sum(0)


@program("narrow-select-diagonal", (5, 5))
def _(x):
    return x.narrow(0, 1, 3), x.select(1, 2), x.diagonal(), x.diagonal(1).sum()


@program("flip-cumsum-flip", (5, 4))
def _(x):
    return x.flip(0).cumsum(0).flip(0)


@program("cat-stack-mean", (3, 4))
def _(x):
    return torch.cat([x, x * 2], 1).mean(-1), torch.stack([x.sum(0), x.amax(0)])


# --- in-place updates
@program("in-place-then-reduce", (3, 4))
def _(x):
    x.mul_(2)
    return x.sum()


@program("in-place-view-of-input", (3, 4))
def _(x):
    x.view(-1)[::2].add_(1)
    return x.mean(0)


@program("index-put-into-input", (4, 5))
def _(x):
    x[0] = 1.0
    x[:, 1].fill_(0)
    return x.sum(1)


@program("clone-then-slice-add", (4, 5))
def _(x):
    y = x.clone()
    y[1:] += 1
    return y, y.var(0)


@program("add-returns-view", (3, 4), (3, 4))
def _(x, y):
    return x.add_(y).view(-1), y


@program("mutate-two-inputs", (6,), (6,))
def _(a, b):
    a.add_(1)
    b.mul_(a)
    return a + b


@program("masked-fill-in-place", (4, 6))
def _(x):
    x.masked_fill_(x < 0, 0.0)
    return x.sum(-1), x.count_nonzero()


# --- reductions as models write them
@program("layer-norm-by-hand", (4, 32))
def _(x):
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)


@program("rms-norm-by-hand", (4, 32), (32,))
def _(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@program("masked-logsumexp", (4, 6))
def _(x):
    return x.masked_fill(x < -1, float("-inf")).logsumexp(-1)


@program("var-plus-mean", (7, 9))
def _(x):
    return x.var(unbiased=False) + x.mean(), x.std(0), torch.var_mean(x, 1)


@program("mean-over-dims", (3, 4, 5))
def _(x):
    return x.mean(dim=(0, 2)), x.sum((0, 1), keepdim=True), x.amax(-1) - x.amin(-1)


@program("max-with-indices-then-gather", (4, 7))
def _(x):
    v, i = x.abs().max(dim=1)
    return v, i, x.gather(1, i[:, None]), x.argmax(-1)


@program("einsum-rowdot", (4, 6), (4, 6))
def _(a, b):
    return torch.einsum("ij,ij->i", a, b), (a * b).sum(-1)


@program("log-softmax-nll", (6, 5), make=lambda: [_r(6, 5), torch.tensor([0, 4, 2, 1, 3, 0])])
def _(x, t):
    return F.nll_loss(F.log_softmax(x, -1), t), F.cross_entropy(x, t, reduction="none")


@program("normalize-and-cosine", (4, 8), (4, 8))
def _(a, b):
    return F.normalize(a, dim=-1), F.cosine_similarity(a, b, dim=-1)


@program("ones-like-cumsum", (5, 3))
def _(x):
    return torch.ones_like(x).cumsum(0), torch.zeros_like(x).add_(x).sum()


# --- Python numbers out of tensors (a graph break each, without capture_scalar_outputs)
@program("item-as-a-scale", (4, 4))
def _(x):
    return x * x.sum().item()


@program("branch-on-a-tensor", (3, 3))
def _(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


@program("tolist-then-math", (3,))
def _(x):
    a, b, c = x.tolist()
    return x * (a + b * c)


# --- low precision through dynamo
@program("half-softmax-and-sum", (4, 40), dtype=torch.float16)
def _(x):
    return x.softmax(-1), x.sum(-1), x.float().mean(-1).half()


@program("bf16-layer-norm", (3, 64), dtype=torch.bfloat16)
def _(x):
    return F.layer_norm(x, (64,)), x.var(-1)


# --- more of test_repros' and test_misc's kinds: metadata updates of inputs, views written
# through, strided and expanded outputs, advanced indexing
@program("unsqueeze-in-place-of-input", (3, 4))
def _(x):
    x.unsqueeze_(0)
    return x, x.sum(-1)


@program("transpose-in-place-of-input", (3, 4))
def _(x):
    x.t_()
    return x * 2


@program("copy-a-broadcast-into-input", (3, 4), (4,))
def _(x, y):
    x.copy_(y.expand_as(x))
    return x.mean()


@program("write-a-view-read-the-base", (5, 4))
def _(x):
    y = x[1:]
    y.mul_(2)
    return x.sum(0)


@program("as-strided-view", (4, 4))
def _(x):
    return x.as_strided((2, 2), (1, 2)), x.as_strided((3,), (5,), 1) * 2


@program("zero-in-place-returns-input", (3, 3))
def _(x):
    return x.zero_()


@program("add-out-to-an-intermediate", (3, 4))
def _(x):
    out = torch.empty_like(x)
    torch.add(x, 1, out=out)
    return out.sum(1)


@program("expanded-output", (3, 4))
def _(x):
    return x.sum(0, keepdim=True).expand_as(x), x.mean(1, keepdim=True).expand(3, 4)


@program("transposed-intermediate-output", (3, 4))
def _(x):
    return (x * 2).t(), x.softmax(0).t()


@program("channels-last-copy", (2, 3, 4, 5))
def _(x):
    y = x.contiguous(memory_format=torch.channels_last)
    return y, y.sum((2, 3))


@program("bool-mask-assign", (4, 5))
def _(x):
    x[x > 0] = 0.0
    return x.sum()


@program("index-add-in-place", (5, 3), make=lambda: [_r(5, 3), torch.tensor([0, 2, 2]), _r(3, 3, seed=1)])
def _(x, i, v):
    x.index_add_(0, i, v)
    return x.sum(1)


@program("fancy-index-increment", (5, 3))
def _(x):
    x[[0, 2]] += 1
    return x.amax(0)


@program("zeros-of-input-size", (4, 2))
def _(x):
    return torch.zeros(x.size(0), 3) + x.sum(1, keepdim=True), x.new_full((2,), x.shape[1])


@program("type-as-and-repeat-interleave", (3, 2), make=lambda: [_r(3, 2), torch.arange(3)])
def _(x, i):
    return x.type_as(i), x.repeat_interleave(2, dim=0).sum(0)


def cases(names: list[str] | None = None) -> list[Case]:
    out = []
    for name, (fn, make) in PROGRAMS.items():
        if names is None or name in names:
            ts = make()
            dtype = next((t.dtype for t in ts if t.is_floating_point()), torch.float32)
            out.append(Case(name, dtype, ts, fn))
    return out


# --- Python numbers and sizes read from data, captured into the graph (dynamo's
# ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops``, as its tests of unbacked
# sizes set them). name -> (function, inputs at a size n)
SCALAR_PROGRAMS: dict[str, tuple[Callable[..., object], Callable[[int], list[torch.Tensor]]]] = {
    "item-as-a-float-scale": (lambda x: x * x.sum().item(), lambda n: [_r(n, 4)]),
    "tolist-as-floats": (lambda x: x * sum(x.tolist()), lambda n: [_r(n)]),
    "int-item-in-arithmetic": (lambda x, k: x * (k.item() + 1), lambda n: [_r(n), torch.tensor(n)]),
    "item-as-a-size": (lambda x, k: torch.cat([x, x.new_ones(k.item(), x.shape[1])]),
                       lambda n: [_r(3, 2), torch.tensor(n - 2)]),
    "nonzero": (lambda x: x.nonzero(), lambda n: [(_r(n) > 0).float()]),
    "masked-select-then-sum": (lambda x: x.masked_select(x > 0).sum(), lambda n: [_r(n)]),
    "branch-on-a-bool-item": (lambda x: x * 2 if bool((x > 0).all()) else x - 1, lambda n: [_r(n).abs()]),
}
