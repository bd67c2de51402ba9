"""``fuseg run TARGET``: run a target end to end and check it against eager.

For a program (an example or module:factory) the reference is eager PyTorch on the same inputs;
for a JSON graph, which has no program, it is the graph's reference semantics
(``segmenter.capturing.reference.run_graph``) on random inputs laid out as the graph says.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

import runtime
from alias import apply_aliases
from runtime.compiled.segments_run import segments_run
from runtime.memory import PeakTracker, modeled_peak
from segmenter import FusionGraph, GraphError, SegmenterOptions, segment
from segmenter.capturing.from_torch import bind_inputs
from segmenter.capturing.reference import clone_inputs, run_graph, storage_key

from ..targets import Target, TargetError

__all__ = ["random_inputs", "run_target"]


def random_inputs(graph: FusionGraph) -> list[torch.Tensor]:
    """Inputs with the graph's exact layouts (storage offsets, strides, shared storages)."""
    g = torch.Generator().manual_seed(0)
    extent: dict[int, tuple[int, torch.dtype, str]] = {}
    for inp in graph.inputs:
        n, _, _ = extent.get(inp.storage, (0, inp.meta.dtype, inp.meta.device))
        extent[inp.storage] = (max(n, inp.meta.storage_extent), inp.meta.dtype, inp.meta.device)
    bases = {}
    for sid, (n, dtype, device) in extent.items():
        try:  # the sizes come from a file: too large a storage is the file's error, said in a line
            if dtype.is_floating_point:
                base = torch.randn(max(n, 1), generator=g).to(dtype)
            else:
                base = torch.randint(0, 2 if dtype == torch.bool else 8, (max(n, 1),), generator=g).to(dtype)
            bases[sid] = base.to(device if torch.device(device).type == "cpu" or torch.cuda.is_available() else "cpu")
        except (RuntimeError, MemoryError) as e:
            raise TargetError(f"{graph.name}: cannot make random inputs of {n} elements of {dtype}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return [bases[i.storage].as_strided(i.meta.shape, i.meta.stride, i.meta.storage_offset) for i in graph.inputs]


def _storage(t: torch.Tensor) -> int:
    return storage_key(t)


def run_target(target: Target, mode: str = "post", options: SegmenterOptions | None = None,
               background_builds: bool = False) -> dict[str, Any]:
    """Run ``target`` once and check it against eager (or the graph's semantics). The kernels are
    built before that call, unless ``background_builds`` (what ``torch.compile(backend="fuseg")``
    does for inference graphs: Note [kernels built in the background]); ``segments_run`` says
    which way the call ran each segment."""
    graph = target.graph
    if any(i.meta.device_type == "meta" for i in graph.inputs):
        raise TargetError(f"{graph.name}: its inputs are meta tensors (shapes only); it can be segmented and "
                          "profiled, not run")
    plan = apply_aliases(segment(graph, options), mode)
    program = runtime.CompiledProgram(plan, background=background_builds)
    if target.fn is not None:
        ref_in = clone_inputs(target.inputs)
        our_user = clone_inputs(target.inputs)
        with torch.no_grad(), PeakTracker() as eager_peak:
            expected = [t for t in pytree.tree_leaves(target.fn(*ref_in)) if isinstance(t, torch.Tensor)]
        ours_in = bind_inputs(graph, target.module, our_user)
        ref_user, ours_user = ref_in, our_user
    else:
        inputs = random_inputs(graph)
        ref_in, ours_in = clone_inputs(inputs), clone_inputs(inputs)
        with PeakTracker() as eager_peak:
            try:
                expected = run_graph(graph, ref_in)
            except GraphError:
                raise
            except (RuntimeError, IndexError, ValueError) as e:  # the graph's own ops refuse random data
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise TargetError(f"{graph.name}: the graph's ops raise on random inputs: {type(e).__name__}: "
                                  f"{first}") from None
        ref_user, ours_user = ref_in, ours_in
    on_cuda = any(t.is_cuda for t in ours_in)
    if on_cuda:  # the allocator knows: its own counter, not the dispatch-mode model
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    with torch.no_grad(), PeakTracker() as our_peak:
        got = program(*ours_in)
    ran = segments_run(program)  # (a program is made again with its kernels at the start of a call only)
    if on_cuda:
        torch.cuda.synchronize()
        our_peak.peak = torch.cuda.max_memory_allocated() - base
    abs_err = rel_err = 0.0
    for e, o in zip(expected, got):
        if e.numel():
            d = (e.double() - o.double()).abs()
            abs_err = max(abs_err, d.max().item())
            rel_err = max(rel_err, (d / e.double().abs().clamp_min(1e-12)).max().item())
    def pattern(ins: list[torch.Tensor], outs: list[torch.Tensor]) -> list[tuple]:
        return [(tuple(i for i, t in enumerate(ins) if _storage(t) == _storage(o)),
                 tuple(k for k in range(j) if _storage(outs[k]) == _storage(o))) for j, o in enumerate(outs)]
    inputs_agree = all(torch.equal(a, b) or torch.allclose(a.double(), b.double(), atol=1e-5, rtol=1e-5)
                       for a, b in zip(ref_user, ours_user))
    stats = plan.stats()
    return {
        "graph": graph.name, "alias_mode": mode, "reference": "eager" if target.fn is not None else "graph semantics",
        "outputs": len(got), "max_abs_diff": abs_err, "max_rel_diff": rel_err,
        "strides_agree": all(e.stride() == o.stride() and e.shape == o.shape for e, o in zip(expected, got)),
        "aliasing_agrees": pattern(list(ref_user), expected) == pattern(list(ours_user), got),
        "mutated_inputs_agree": inputs_agree,
        "peak_bytes_eager": eager_peak.peak, "peak_bytes_ours": our_peak.peak,
        "peak_bytes_modeled": modeled_peak(program),
        "kernels": stats["kernels"], "launches": stats["launches"], "metadata": stats["metadata"],
        "fallbacks": program.fallbacks,
        "builds": "in the background" if background_builds else "before the first call",
        "segments_run": ran.as_dict(), "ran": ran.describe(),
    }
