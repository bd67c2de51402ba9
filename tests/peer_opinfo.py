"""The OpInfo reductions of PyTorch's op_db for the peer suite (Note [the peer suite] in
tests/peer_suite.py): every sample and reference input of each op below, and the same programs at
large sizes.

Large cases: each distinct sample program (its input's rank, its arguments) again on an input of
2^k elements, the sample's dims scaled up together (a size-1 dim stays 1, so which dims are reduced
and which are kept is the sample's), values uniform in [0, 1) as a loss or a statistic of
activations has them (the worst case of a float accumulator: Note [sums in chunks] in
runtime/codegen/lowering/cascade.py). Only samples whose other arguments do not name sizes are scaled (a layer
norm's ``normalized_shape`` does): the norms of rows at large sizes are written out below.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree

from .opdb_sweep import Case, case_of_sample

# op_db names (with variant) of the reductions issue 63 names, and their kin
OPS = ("sum", "mean", "nanmean", "var", "var.unbiased", "std", "std.unbiased", "var_mean", "var_mean.unbiased",
       "std_mean", "std_mean.unbiased", "nansum", "norm", "norm.fro", "norm.inf", "linalg.vector_norm", "amax",
       "amin", "aminmax", "logsumexp", "softmax", "softmax.with_dtype", "log_softmax", "log_softmax.with_dtype",
       "nn.functional.softmin", "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.group_norm",
       "nn.functional.normalize", "prod", "cumsum", "cumprod", "logcumsumexp", "count_nonzero", "all", "any",
       "argmax", "argmin", "max.reduction_with_dim", "max.reduction_no_dim", "min.reduction_with_dim",
       "min.reduction_no_dim", "nn.functional.mse_loss")
# ops whose large-size values mean nothing (a product of a million values is 0 or inf either way)
NOT_LARGE = ("prod", "cumprod", "all", "any", "count_nonzero", "argmax", "argmin")


def name_of(op) -> str:  # noqa: ANN001 - an OpInfo
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def ops(names: Sequence[str] = OPS) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return [op for op in op_db if name_of(op) in names]


def samples(op, dtype: torch.dtype) -> list:  # noqa: ANN001 - an OpInfo
    """The op's reference inputs (which hold its sample inputs, and more where the op has its
    own), and its sample inputs where they are not among them. Made by the op's own generators,
    without ``OpInfo.sample_inputs``' tracking wrapper: that one takes ``inspect.stack()`` per
    call, 1-8 s per op list under pytest, and reseeds per sample (here: once per op and dtype)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        plain = list(op.sample_inputs_func(op, "cpu", dtype, False))
        if op.reference_inputs_func is None:
            return plain
        torch.manual_seed(0)
        ref = list(op.reference_inputs_func(op, "cpu", dtype, False))
    seen = {_signature(s) for s in ref}
    return ref + [s for s in plain if _signature(s) not in seen]


def _signature(s) -> str:  # noqa: ANN001 - a SampleInput
    def show(x: object) -> object:
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), tuple(x.stride()), x.dtype)
        return x

    return repr(pytree.tree_map(show, (s.input, s.args, s.kwargs)))


def sample_cases(dtypes: Sequence[torch.dtype], every: int = 1, names: Sequence[str] = OPS,
                 noncontiguous: bool = False) -> list[Case]:
    """One case per sample (every ``every``-th of each op's list, from an offset that turns with
    the dtype so two dtypes cover different samples); ``noncontiguous``: each sample's tensors
    strided (``SampleInput.noncontiguous``: the same values, as test_ops' noncontiguous tests
    take them)."""
    cases = []
    for op in ops(names):
        for d, dtype in enumerate(dtypes):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            for k, s in enumerate(samples(op, dtype)):
                if (k + d) % every:
                    continue
                case = case_of_sample(op, dtype, s.noncontiguous() if noncontiguous else s)
                if isinstance(case, Case):
                    case.op = f"{case.op}[{k}{'nc' if noncontiguous else ''}]"
                    cases.append(case)
    return cases


@dataclass
class LargeCase(Case):
    large: bool = True


def _scaled(shape: Sequence[int], numel: int) -> tuple[int, ...]:
    grow = [i for i, n in enumerate(shape) if n > 1]
    if not grow:
        return tuple(shape)
    total = math.prod(shape)
    f = (numel / total) ** (1 / len(grow))
    out = [n if i not in grow else max(2, round(n * f)) for i, n in enumerate(shape)]
    out[grow[-1]] = max(2, round(numel / math.prod(out[:grow[-1]] + out[grow[-1] + 1:])))
    return tuple(out)


def large_programs(op) -> Iterator[tuple[int, object]]:  # noqa: ANN001 - an OpInfo
    """(position, sample) for the op's distinct sample programs that scale: one tensor input of
    rank >= 1 with two or more elements, no argument that names a size."""
    seen = set()
    for k, s in enumerate(samples(op, torch.float32)):
        t = s.input
        leaves = pytree.tree_leaves((s.args, s.kwargs))
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.numel() < 2:
            continue
        if any(isinstance(x, torch.Tensor) for x in leaves):
            continue
        if any(isinstance(x, int) and not isinstance(x, bool) and abs(x) > t.dim() for x in leaves):
            continue  # a size, not a dim (or a norm's order: not scaled either way)
        sig = (t.dim(), tuple(n == 1 for n in t.shape), repr((s.args, s.kwargs)))
        if sig in seen:
            continue
        seen.add(sig)
        yield k, s


def large_case(op, k: int, s, dtype: torch.dtype, numel: int, seed: int = 0) -> Case | None:  # noqa: ANN001
    shape = _scaled(s.input.shape, numel)
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(shape, generator=g, dtype=torch.float32).to(dtype)
    f = op.op
    args, kwargs = s.args, s.kwargs

    def fn(x, _f=f, _a=args, _kw=kwargs):
        return _f(x, *_a, **_kw)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(t[tuple(slice(0, 2) for _ in shape)])  # eager takes the program (dtype, arguments)
    except Exception:  # noqa: BLE001 - not this dtype's program
        return None
    return LargeCase(f"{name_of(op)}[{k}]@{'x'.join(map(str, shape))}", dtype, [t], fn, True, batchable=False)


def _rows(kind: str):
    def layer(x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:])

    def rms(x):
        return torch.nn.functional.rms_norm(x, x.shape[-1:], eps=1e-6)

    def group(x):
        return torch.nn.functional.group_norm(x, 4)

    return {"layer_norm": layer, "rms_norm": rms, "group_norm": group}[kind]


def large_norm_case(kind: str, rows: int, cols: int, dtype: torch.dtype, seed: int = 0) -> Case:
    """A norm over rows of ``cols`` elements (group norm: 4 groups over ``cols`` channels x 8)."""
    g = torch.Generator().manual_seed(seed)
    shape = (rows, cols) if kind != "group_norm" else (rows, cols, 8)
    t = torch.rand(shape, generator=g).to(dtype)
    return LargeCase(f"{kind}@{'x'.join(map(str, shape))}", dtype, [t], _rows(kind), True, batchable=False)


def large_cases(dtypes: Sequence[torch.dtype], sizes: Sequence[int], every: int = 1,
                names: Sequence[str] = OPS) -> list[Case]:
    """Large cases of each op (not NOT_LARGE), each program at the ``sizes`` in turn (every
    ``every``-th program, the size and dtype turning with the program's position)."""
    cases, n = [], 0
    for op in ops(names):
        if op.name in NOT_LARGE or op.name.startswith("nn.functional."):
            continue
        for k, s in large_programs(op):
            n += 1
            if n % every:
                continue
            dtype = dtypes[(n // every) % len(dtypes)]
            size = sizes[(n // every // len(dtypes)) % len(sizes)]
            case = large_case(op, k, s, dtype, size, seed=n)
            if case is not None:
                cases.append(case)
    return cases
