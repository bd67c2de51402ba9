"""Metadata propagation: recompute every value's TensorMeta with FakeTensors.

A pass that rewrites a graph must leave metadata that torch itself would compute (the
FakeTensorUpdater lesson of Inductor): ``propagate_metas`` reruns every node on FakeTensors built
from the graph inputs' layouts (inputs that share a storage are views of one fake storage), and
``meta_mismatches`` lists where a graph's recorded metas disagree with that.

Devices that this machine cannot fake (CUDA on a CPU-only build) are propagated on ``meta``: the
layout rules are the same; the recorded device string is kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .ir import Arg, FusionGraph, GraphError, GraphInput, Node, OpRef, TensorMeta, ValueRef
from .ops import resolve_op

__all__ = ["fake_inputs", "fake_mode", "meta_mismatches", "propagate_metas", "uncached"]


# Note [FakeTensor dispatch cache]: FakeTensorMode caches each op's output metadata in one dict
# per process, shared by every mode, and on a hit rebuilds a non-view output with empty_strided:
# its storage offset is lost. A scatter op (slice_scatter...) of an offset input keeps the input's
# offset in eager (clone_preserve_strides), so the first graph to meet it in a process recorded
# offset 3 and every later one 0 (issue 14: the fuzzer's flaky finding, "recorded offset 3, torch
# computes 0"). Every FakeTensor run of ours is therefore uncached: the same answer, eager's,
# whatever ran before it in the process.
def fake_mode(**kwargs: object) -> FakeTensorMode:
    """A FakeTensorMode whose dispatch cache is off (Note [FakeTensor dispatch cache])."""
    mode = FakeTensorMode(**kwargs)  # type: ignore[arg-type]
    mode.cache_enabled = False
    return mode


@contextlib.contextmanager
def uncached(mode: FakeTensorMode) -> Iterator[FakeTensorMode]:
    """``mode`` (one we were handed) with its dispatch cache off while we run in it."""
    old = mode.cache_enabled
    mode.cache_enabled = False
    try:
        with mode:
            yield mode
    finally:
        mode.cache_enabled = old


def _fakeable(device: str) -> str:
    kind = torch.device(device).type
    if kind in ("cpu", "meta"):
        return device
    if kind == "cuda" and torch.cuda.is_available():
        return device
    return "meta"


def fake_inputs(mode: FakeTensorMode, inputs: Sequence[GraphInput]) -> list[torch.Tensor]:
    """FakeTensors with each input's exact layout; inputs sharing a storage share one here."""
    extent: dict[int, int] = {}
    for inp in inputs:
        extent[inp.storage] = max(extent.get(inp.storage, 0), inp.meta.storage_extent)
    bases: dict[int, torch.Tensor] = {}
    out = []
    with mode:
        for inp in inputs:
            m = inp.meta
            base = bases.get(inp.storage)
            if base is None or base.dtype != m.dtype:
                base = torch.empty(max(extent[inp.storage], 1), dtype=m.dtype, device=_fakeable(m.device))
                bases.setdefault(inp.storage, base)
            out.append(base.as_strided(m.shape, m.stride, m.storage_offset))
    return out


def _materialize(arg: Arg, env: dict[str, torch.Tensor]) -> object:
    if isinstance(arg, ValueRef):
        return env[arg.name]
    if isinstance(arg, tuple):
        return [_materialize(a, env) for a in arg]
    if isinstance(arg, torch.device):
        return torch.device(_fakeable(str(arg)))
    if isinstance(arg, OpRef):
        op = resolve_op(arg.name)
        if op is None:
            raise GraphError(f"op argument {arg.name} is not known to torch")
        return op
    return arg


def run_node(
    node: Node, env: dict[str, torch.Tensor], materialize: Callable[[Arg, dict], object] = _materialize
) -> list[torch.Tensor | None]:
    """Run one node's ATen op on the tensors in ``env``; returns its outputs as a list."""
    op = resolve_op(node.op)
    if op is None:
        raise GraphError(f"node {node.name!r}: op {node.op} is not known to torch; it cannot be run")
    args = [materialize(a, env) for a in node.args]
    kwargs = {k: materialize(v, env) for k, v in node.kwargs}
    result = op(*args, **kwargs)
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(node.outputs):
        raise GraphError(f"node {node.name!r}: {node.op} returned {len(results)} values, graph says {len(node.outputs)}")
    return results


def propagate_metas(graph: FusionGraph) -> FusionGraph:
    """The same graph with every node's metas recomputed from its inputs' layouts.

    Nodes whose op torch does not know (OPAQUE, unknown) keep the metas they declare.
    """
    mode = fake_mode(allow_non_fake_inputs=False)
    env: dict[str, torch.Tensor] = dict(zip(graph.input_names, fake_inputs(mode, graph.inputs)))
    nodes = []
    with mode:
        for node in graph.nodes:
            if resolve_op(node.op) is None:
                nodes.append(node)
                _declare(node, env, mode)
                continue
            try:
                results = run_node(node, env)
            except GraphError:
                raise
            except Exception as e:  # noqa: BLE001  # torch's own error, with the node named
                raise GraphError(f"node {node.name!r} ({node.op}): {type(e).__name__}: {e}") from None
            metas = []
            for name, declared, val in zip(node.outputs, node.metas, results):
                if name is None or not isinstance(val, torch.Tensor):
                    metas.append(None if name is None else declared)
                    continue
                env[name] = val
                device = declared.device if declared is not None else str(val.device)
                metas.append(TensorMeta.from_tensor(val, device=device))
            nodes.append(dataclasses.replace(node, metas=tuple(metas)))
    return dataclasses.replace(graph, nodes=tuple(nodes))


def _declare(node: Node, env: dict[str, torch.Tensor], mode: FakeTensorMode) -> None:
    with mode:
        for name, m in zip(node.outputs, node.metas):
            if name is not None and m is not None:
                base = torch.empty(max(m.storage_extent, 1), dtype=m.dtype, device=_fakeable(m.device))
                env[name] = base.as_strided(m.shape, m.stride, m.storage_offset)


def meta_mismatches(graph: FusionGraph) -> list[str]:
    """Where the graph's recorded metas differ from FakeTensor propagation (empty: consistent)."""
    fresh = propagate_metas(graph)
    problems = []
    for old, new in zip(graph.nodes, fresh.nodes):
        for name, a, b in zip(old.outputs, old.metas, new.metas):
            if name is not None and a != b:
                problems.append(f"node {old.name!r} output %{name}: recorded {a}, torch computes {b}")
    return problems
