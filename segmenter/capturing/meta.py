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
import logging
from collections.abc import Callable, Iterator, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..ir.graph import Arg, FusionGraph, GraphConstant, GraphError, GraphInput, Node, OpRef, TensorMeta, ValueRef
from ..ir.ops import OpKind, op_info, resolve_op, why_not_runnable
from ..ir.torch_compat import disable_fake_tensor_cache

__all__ = ["fake_constants", "fake_inputs", "fake_mode", "fakeable", "meta_mismatches", "propagate_metas",
           "quiet_fake_errors", "shallow", "uncached"]


def fake_mode(allow_non_fake_inputs: bool = False) -> FakeTensorMode:
    """A FakeTensorMode without torch's fake-kernel cache.

    Note [fake tensor cache]: torch caches fake kernel results process-wide, and a hit can hand
    back the storage offset of an earlier call: ``select_scatter`` of a non-dense input at offset
    9 (eager's result sits at offset 9) came back at offset 0 after the same op had run on an input
    at offset 0, so recorded metas depended on what ran before in the process (JSON graphs were
    refused as contradicting their ops, in one test order only). Metas we record are computed
    without it. ``allow_non_fake_inputs``: real tensors met while running (a module's plain tensor
    attributes, constants) are faked on the fly.
    """
    mode = FakeTensorMode(allow_non_fake_inputs=allow_non_fake_inputs)
    mode.cache_enabled = False
    return mode


@contextlib.contextmanager
def uncached(mode: FakeTensorMode, enter: bool = True) -> Iterator[FakeTensorMode]:
    """A FakeTensorMode we were handed (dynamo's, the caller's) with its dispatch cache off while we
    run in it (Note [fake tensor cache]); ``enter``: also enter the mode."""
    old = mode.cache_enabled
    mode.cache_enabled = False
    try:
        if enter:
            with mode:
                yield mode
        else:
            yield mode
    finally:
        mode.cache_enabled = old


def fakeable(device: str) -> str:
    """The device FakeTensors stand for ``device`` on: itself, or ``meta`` where this machine has none."""
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
                base = torch.empty(max(extent[inp.storage], 1), dtype=m.dtype, device=fakeable(m.device))
                bases.setdefault(inp.storage, base)
            out.append(m.with_bits(base.as_strided(m.shape, m.stride, m.storage_offset)))
    return out


def fake_constants(mode: FakeTensorMode, constants: Sequence[GraphConstant]) -> dict[str, torch.Tensor]:
    """FakeTensors for the graph's constants; where the values are known (and the device can be
    faked) they come along, so ops that read a constant's values (an index) see them."""
    out = {}
    for c in constants:
        device = fakeable(c.meta.device)
        if c.data is not None and device == c.meta.device:
            out[c.name] = mode.from_tensor(c.tensor(), static_shapes=True)
        else:
            with mode:
                out[c.name] = torch.empty_strided(c.meta.shape, c.meta.stride, dtype=c.meta.dtype, device=device)
    return out


@contextlib.contextmanager
def quiet_fake_errors() -> Iterator[None]:
    """FakeTensorMode logs the whole traceback of every op it cannot run, then raises; our callers
    name the node in one line instead (``fuseg`` prints one line for a bad file)."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def shallow(t: torch.Tensor) -> torch.Tensor:
    """``t`` re-made as one view of its base. torch keeps a view's whole chain of view ops, so
    each view of a view costs time in the depth of the chain: propagating a chain of n views is
    quadratic (4000 chained ``alias`` ops: 14 s on FakeTensors) unless each is made shallow."""
    base = t._base
    if base is None or base.dtype != t.dtype:
        return t
    out = base.as_strided(t.shape, t.stride(), t.storage_offset())
    # as_strided keeps the base's conj/neg bits; the view has its own (Note [conjugate and negative bits])
    if out.is_conj() != t.is_conj():
        out = torch._conj(out)
    if out.is_neg() != t.is_neg():
        out = torch._neg_view(out)
    return out


def _materialize(arg: Arg, env: dict[str, torch.Tensor]) -> object:
    if isinstance(arg, ValueRef):
        return env[arg.name]
    if isinstance(arg, tuple):
        return [_materialize(a, env) for a in arg]
    if isinstance(arg, torch.device):
        return torch.device(fakeable(str(arg)))
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
        raise GraphError(f"node {node.name!r}: {why_not_runnable(node.op)}; it cannot be run")
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
    mode = fake_mode()  # Note [fake tensor cache]
    env: dict[str, torch.Tensor] = dict(zip(graph.input_names, fake_inputs(mode, graph.inputs)))
    env.update(fake_constants(mode, graph.constants))
    nodes = []
    with mode, quiet_fake_errors():
        for node in graph.nodes:
            if resolve_op(node.op) is None:
                nodes.append(node)
                _declare(node, env, mode)
                continue
            try:
                if _offset_input(node, env):  # see Note [FakeTensor cache and storage offsets]
                    with disable_fake_tensor_cache(mode):
                        results = run_node(node, env)
                else:
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
                env[name] = shallow(val)
                device = declared.device if declared is not None else str(val.device)
                metas.append(TensorMeta.from_tensor(val, device=device))
            nodes.append(dataclasses.replace(node, metas=tuple(metas)))
    return dataclasses.replace(graph, nodes=tuple(nodes))


# Note [FakeTensor cache and storage offsets]: torch 2.13's FakeTensor dispatch cache rebuilds a
# non-view op's output with storage offset 0, while the op itself (and the real kernel) may give
# another: ``aten.copy(x[..., 1:], y)`` returns a fresh tensor laid out as its ``self``, offset 1
# included (circular pad, instance norm). The first propagation computed 1, a later one hit the
# cache and said 0, and the checker flagged a correct graph. Only an input with a nonzero offset
# can pass one on, so those few calls bypass the cache.


def _offset_input(node: Node, env: dict[str, torch.Tensor]) -> bool:
    """A non-view op (views keep their offsets through the cache) reading a tensor at an offset."""
    if op_info(node.op).kind == OpKind.VIEW:
        return False
    return any(env[v].storage_offset() != 0 for v in node.inputs if v in env)


def _declare(node: Node, env: dict[str, torch.Tensor], mode: FakeTensorMode) -> None:
    with mode:
        for name, m in zip(node.outputs, node.metas):
            if name is not None and m is not None:
                base = torch.empty(max(m.storage_extent, 1), dtype=m.dtype, device=fakeable(m.device))
                env[name] = m.with_bits(base.as_strided(m.shape, m.stride, m.storage_offset))


def meta_mismatches(graph: FusionGraph) -> list[str]:
    """Where the graph's recorded metas differ from FakeTensor propagation (empty: consistent)."""
    fresh = propagate_metas(graph)
    problems = []
    for old, new in zip(graph.nodes, fresh.nodes):
        for name, a, b in zip(old.outputs, old.metas, new.metas):
            if name is not None and a != b:
                problems.append(f"node {old.name!r} output %{name}: recorded {a}, torch computes {b}")
    return problems
