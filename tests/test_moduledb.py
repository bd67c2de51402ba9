"""PyTorch's module_db (``torch.testing._internal.common_modules``: every ``torch.nn`` module with
the sample inputs PyTorch tests it on) through ``torch.compile(backend="fuseg")``, float32 on the
CPU, against eager: in eval mode (no grad) and in train mode (forward, then the gradients of
parameters and inputs), outputs (values, dtypes, shapes, strides), inputs and buffers after the
call (running statistics), gradients.

A difference is ours unless ``aot_eager`` (AOTAutograd with no compiler of ours) gives what we
give: then torch's own compile path differs from eager and no backend behind it can do better
(nn.Transformer's eval fast path with padding masks, which dynamo does not take;
MultiLabelMarginLoss's 1-D ``reduction='none'``, whose meta gives shape (1,) for eager's ()).
Those are tallied, printed at the end of the run (tests/conftest.py), not failed.

What CI runs: up to ``SAMPLES`` samples per module and mode, evenly spread over its list (so a
module with hundreds, LinearCrossEntropyLoss, reaches its chunked ones). Every sample of every
module (about 6 minutes here): ``FUSEG_MODULEDB_SAMPLES=0``. The first whole sweep (a scratch
run) found 340 samples of LinearCrossEntropyLoss refused (tests/test_custom_ops.py) and no wrong
result of ours in 3582 samples.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

from runtime.dynamo import fuseg_backend

pytest.importorskip("expecttest")  # torch.testing._internal needs it (the [test] extra installs it)
from torch.testing._internal.common_modules import module_db  # noqa: E402

SAMPLES = int(os.environ.get("FUSEG_MODULEDB_SAMPLES", "4"))  # 0: all
TALLY: Counter = Counter()
TORCH_DIFFERS: list[str] = []
_TOL = {"out": (1e-4, 1e-4), "grads": (1e-3, 1e-3)}


def _modules() -> list[Any]:
    return [i for i in module_db if torch.float32 in i.dtypes and not i.module_cls.__name__.startswith("Lazy")]


def _spread(samples: list[Any]) -> list[Any]:
    if SAMPLES <= 0 or len(samples) <= SAMPLES:
        return samples
    return [samples[round(k * (len(samples) - 1) / (SAMPLES - 1))] for k in range(SAMPLES)]


def _tensors(o: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(o) if isinstance(t, torch.Tensor)]


def _fresh(o: Any) -> Any:
    return pytree.tree_map(
        lambda t: t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t, o)


def _run(info: Any, sample: Any, training: bool, backend: Any) -> dict[str, list[torch.Tensor]]:
    """One call of the sample's module, eager (``backend`` None) or compiled; what it gave."""
    torch.manual_seed(0)
    ctor = sample.constructor_input
    m = info.module_cls(*ctor.args, **ctor.kwargs).to(torch.float32).train(training)
    if not training:
        m.requires_grad_(False)
    args, kwargs = _fresh((sample.forward_input.args, sample.forward_input.kwargs))
    f = m
    if backend is not None:
        torch._dynamo.reset()
        f = torch.compile(m, backend=backend)
    with torch.set_grad_enabled(training):
        torch.manual_seed(1)
        out = f(*args, **kwargs)
    got = {"out": _tensors(out), "inputs after": _tensors((args, kwargs)), "buffers after": list(m.buffers())}
    if training:
        outs = [t for t in got["out"] if t.requires_grad and t.dtype.is_floating_point]
        wrt = [p for p in [*m.parameters(), *_tensors((args, kwargs))] if p.requires_grad]
        if outs and wrt:
            torch.manual_seed(2)
            loss = sum((t * torch.randn_like(t)).sum() for t in outs)
            grads = torch.autograd.grad(loss, wrt, allow_unused=True)
            got["grads"] = [torch.zeros(()) if g is None else g for g in grads]
    return got


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(st for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1)


def _differences(expected: dict, got: dict) -> list[str]:
    diffs = []
    for what, exp in expected.items():
        have = got.get(what, [])
        if len(have) != len(exp):
            diffs.append(f"{what}: {len(have)} tensors for eager's {len(exp)}")
            continue
        atol, rtol = _TOL.get(what, (1e-4, 1e-4))
        for k, (e, g) in enumerate(zip(exp, have, strict=True)):
            if (e.dtype, e.shape) != (g.dtype, g.shape):
                diffs.append(f"{what}[{k}]: {g.dtype}{tuple(g.shape)} for eager's {e.dtype}{tuple(e.shape)}")
                continue
            try:
                torch.testing.assert_close(g.detach(), e.detach(), atol=atol, rtol=rtol, equal_nan=True)
            except AssertionError as err:
                diffs.append(f"{what}[{k}]: {str(err).splitlines()[-1] if str(err) else err!r}")
            if what == "out" and _strides(g) != _strides(e):
                diffs.append(f"{what}[{k}]: strides {g.stride()} for eager's {e.stride()}")
    return diffs


def _outcome(info: Any, sample: Any, training: bool, graphs: list[int]) -> str | None:
    """None where we match eager or differ as ``aot_eager`` does; else what differs."""

    def fuseg(gm: Any, example_inputs: Any) -> Any:
        graphs.append(len(gm.graph.nodes))
        return fuseg_backend(gm, example_inputs)

    try:
        expected = _run(info, sample, training, None)
    except Exception:  # noqa: BLE001 - a sample eager refuses (an error input) is no case
        TALLY["eager refuses"] += 1
        return None
    try:
        got = _run(info, sample, training, fuseg)
        diffs = _differences(expected, got)
    except Exception as err:  # noqa: BLE001 - judged against aot_eager below
        got, diffs = None, [f"{type(err).__name__}: {str(err)[:400]}"]
    if not diffs:
        TALLY["pass"] += 1
        return None
    try:
        reference = _run(info, sample, training, "aot_eager")
    except Exception:  # noqa: BLE001 - torch's compile path refuses it too
        reference = None
    if (got is None and reference is None) or (got is not None and reference is not None
                                               and not _differences(reference, got)):
        TALLY["as aot_eager, which differs from eager"] += 1
        TORCH_DIFFERS.append(f"{info.module_cls.__name__}[{sample.desc}]{' train' if training else ''}: {diffs[0]}")
        return None
    return "; ".join(diffs[:3])


@pytest.mark.parametrize("info", _modules(), ids=lambda i: i.module_cls.__name__)
def test_module_db_matches_eager(info: Any) -> None:
    failures, graphs = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for training in (False, True):
            try:
                samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32,
                                                  requires_grad=training, training=training)
            except Exception:  # noqa: BLE001 - no samples for this mode
                continue
            for sample in _spread([s for s in samples if s.forward_input is not None]):
                why = _outcome(info, sample, training, graphs)
                if why is not None:
                    failures.append(f"[{sample.desc}]{' train' if training else ''}: {why}")
    torch._dynamo.reset()
    assert not failures, "\n".join(failures)
    if not graphs:  # dynamo runs these as they are (RNN, GRU, LSTM: skipped files; CTCLoss, GaussianNLLLoss)
        TALLY["modules with no graph for fuseg"] += 1
        pytest.skip("dynamo handed the backend no graph: nothing of ours ran")


def test_the_comparison_catches_what_it_must() -> None:
    """A wrong value, a wrong shape, other strides, a missing gradient: each is a difference."""
    t = torch.arange(6.0).view(2, 3)
    assert not _differences({"out": [t]}, {"out": [t.clone()]})
    assert _differences({"out": [t]}, {"out": [t + 1e-2]})
    assert _differences({"out": [t]}, {"out": [t.view(3, 2)]})
    assert _differences({"out": [t]}, {"out": [t.t().contiguous().t()]})
    assert _differences({"grads": [t]}, {"grads": []})
