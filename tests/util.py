"""Checks against eager PyTorch: values, layouts, aliasing, and mutated inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from segmenter import FusionGraph, TensorMeta
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs, run_graph, storage_key


def storage_of(t: torch.Tensor) -> int:
    return storage_key(t)


def alias_pattern(inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[tuple]:
    """For each output: which inputs and which earlier outputs share its storage."""
    pattern = []
    for j, o in enumerate(outputs):
        if not isinstance(o, torch.Tensor):  # a Python number (``x.item()``) has no storage
            pattern.append(type(o).__name__)
            continue
        ins = tuple(i for i, t in enumerate(inputs) if storage_of(t) == storage_of(o))
        outs = tuple(k for k in range(j) if isinstance(outputs[k], torch.Tensor)
                     and storage_of(outputs[k]) == storage_of(o))
        pattern.append((ins, outs))
    return pattern


def layout(t: torch.Tensor) -> tuple:
    m = TensorMeta.from_tensor(t)
    bits = ("conj",) * m.conj + ("neg",) * m.neg  # the lazy view bits change what the values read as
    if m.numel == 0:  # no element to address: strides and offset are not observable (and eager's vary)
        return m.shape, m.dtype, bits
    # a size-1 dim's stride addresses nothing either (torch's own layout checks skip it)
    return m.shape, tuple(st if n != 1 else None for n, st in zip(m.shape, m.stride)), m.storage_offset, m.dtype, bits


def assert_matches_eager(
    fn: Callable[..., Any], user_inputs: Sequence[torch.Tensor], graph: FusionGraph,
    module: torch.nn.Module | None = None, atol: float = 1e-5, rtol: float = 1e-5,
    program: Callable[..., list[torch.Tensor]] | None = None,
) -> None:
    """Run eager and the graph (or a compiled ``program`` of it) on identical copies; compare
    everything observable: values, dtypes, shapes, strides, offsets, which outputs share storage
    with which inputs and outputs, and the inputs' values afterwards."""
    eager_in = clone_inputs(user_inputs)
    graph_user = clone_inputs(user_inputs)
    eager_out = [t for t in pytree.tree_leaves(fn(*eager_in)) if isinstance(t, torch.Tensor)]
    full = bind_inputs(graph, module, graph_user)
    graph_out = program(*full) if program is not None else run_graph(graph, full)
    assert len(eager_out) == len(graph_out)
    for j, (e, g) in enumerate(zip(eager_out, graph_out)):
        assert layout(e) == layout(g), f"output {j}: eager {layout(e)} graph {layout(g)}"
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True, msg=f"output {j} values")
    assert alias_pattern(eager_in, eager_out) == alias_pattern(graph_user, graph_out)
    for i, (e, g) in enumerate(zip(eager_in, graph_user)):
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True, msg=f"input {i} after the call")


def compiled_post(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], backend: str = "auto"):
    """``fn`` captured, segmented, aliased in "post" mode and compiled (a CompiledProgram)."""
    import runtime
    from alias import apply_aliases
    from segmenter import capture, segment

    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend=backend)


def convolution_segment(prog: Any) -> int:
    """The index of the one OPAQUE segment of ``prog`` that runs a convolution."""
    from segmenter import SegmentKind

    (i,) = [s.index for s in prog.plan.segments
            if s.kind == SegmentKind.OPAQUE and any(n.op == "aten.convolution.default" for n in s.nodes)]
    return i
