"""Graphs with sizes read from data, under ``torch.compile(backend="fuseg")`` (issue 63, goal 3).

Note [sizes read from data run on torch]: with ``capture_scalar_outputs`` (``.item()``) and
``capture_dynamic_output_shape_ops`` (``nonzero``, ``masked_select``, ``repeat_interleave``
with tensor repeats) dynamo hands over one graph whose sizes include *unbacked* symbols: the
data at each call says what they are, no input's size does. A plan's sizes are numbers or
symbols read from its inputs' sizes (Note [symbolic plans] in segmenter/ir/symbolic.py), and
capture re-runs a graph on FakeTensors, where ``.item()`` has no value
(``DataDependentOutputException``). So such a graph is cut in two kinds of parts:
  * the nodes that make a data-dependent size, have one, or read an operand that has one
    (``segmenter.capturing.unbacked.data_dependent_nodes``, each with its reason), and the number ops and
    assertions around them, stay in the outer graph and run on torch, op by op, as eager runs them;
  * every other node goes into parts chosen by torch.fx's ``CapabilityBasedPartitioner``
    (maximal, never a cycle), each a graph of ordinary sizes compiled by fuseg as any graph is
    (specialized per signature, or a symbolic plan where dynamo's sizes are symbolic: the
    ``mark_dynamic`` dims), so they get our kernels.
The outer graph calls the parts in order. A part's inputs are values the outer graph computed
(on torch or in another part): a value whose size is read from data is never one of them, by
the rule above, so every part's sizes are those of ordinary inputs. What ran on torch and why
is recorded (``DataDependentSplit``, ``FusegCompiler.data_dependent``, ``STATS``). Writes into
inputs stay on torch, last (Note [writes after the parts], below).

Planning the data-dependent parts too (binding each unbacked symbol after the op that makes it
at each call) is left: their ops run on ATen, as eager's do, never a wrong size.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils import _pytree as pytree

from segmenter.capturing.fx_import import mutates_beyond_epilogue
from segmenter.capturing.unbacked import data_dependent_nodes, describe_node

__all__ = ["DataDependentSplit", "split_at_data"]

log = logging.getLogger("fuseg")


@dataclass(frozen=True)
class DataDependentSplit:
    """What of one graph runs on torch because its sizes are read from data, and why."""

    graph: str
    on_torch: tuple[tuple[str, str], ...]  # (node, why), in graph order
    parts: int  # the parts compiled by fuseg

    def describe(self) -> str:
        lines = [f"{self.graph}: sizes read from data: {len(self.on_torch)} ops run on torch, {self.parts} "
                 f"part{'' if self.parts == 1 else 's'} compiled by fuseg (Note [sizes read from data run on torch])"]
        lines += [f"  {node}: {why}" for node, why in self.on_torch]
        return "\n".join(lines)


def _plain_value(v: object) -> bool:
    """A value a part can compute and hand back: tensors (strided) and sizes, or tuples of them."""
    leaves = pytree.tree_leaves(v)
    return bool(leaves) and all((isinstance(x, torch.Tensor) and x.layout == torch.strided)
                                or isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool) for x in leaves)


class _Plannable(OperatorSupportBase):
    """ATen ops whose values are plain and whose sizes are not read from data."""

    def __init__(self, on_torch: dict[fx.Node, str]) -> None:
        self.on_torch = on_torch

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:  # noqa: ARG002 - torch.fx's hook
        if node.op != "call_function" or node in self.on_torch:
            return False
        if node.target is operator.getitem:
            return True  # (the partitioner puts it with its producer)
        return isinstance(node.target, torch._ops.OpOverload) and _plain_value(node.meta.get("val"))


def _writers(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and n.target._schema.is_mutable]


class _Part(torch.nn.Module):
    """A part compiled by fuseg, called by the outer graph with its operands."""

    def __init__(self, run: Callable[[list[Any]], Any], single: bool) -> None:
        super().__init__()
        self.run = run
        self.single = single

    def forward(self, *args: Any) -> Any:
        out = self.run(list(args))
        return out[0] if self.single else out


def split_at_data(gm: fx.GraphModule, name: str,
                  compile_part: Callable[[fx.GraphModule, int], Callable[[list[Any]], Any]],
                  effects: bool = False) -> tuple[fx.GraphModule, DataDependentSplit]:
    """See Note [sizes read from data run on torch]: a copy of ``gm`` whose plannable ops are cut into
    parts, each compiled by ``compile_part(part, k)`` (a boxed callable taking its operands), and
    the report of what runs on torch. ``effects``: the graph had effect tokens (its ops with
    effects must keep their order: it runs whole on torch)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    outer = fx.GraphModule(gm, graph)
    on_torch = data_dependent_nodes(outer)
    writers = _writers(outer)
    # Note [writes after the parts]: the parts run where their last op was, and what reads their
    # values moves after them; a write into an input in a part could then land before a read of
    # the input's old value on torch (``y = x[x > 0]; x.add_(1)``: the mask's part holds the
    # write). So writes stay on torch and go last, after every read; a graph whose writes are
    # not the epilogue AOTAutograd puts last (or that has effects to keep in order) runs whole.
    whole = (bool(effects) or mutates_beyond_epilogue(outer)
             or any(u.op != "output" for n in writers for u in n.users))
    for n in writers:
        on_torch.setdefault(n, "it writes an input: it runs last, after every read of the input's old value")
    partitions = [] if whole else [
        p for p in CapabilityBasedPartitioner(outer, _Plannable(on_torch), allows_single_node_partition=True
                                              ).propose_partitions()
        if any(n.target is not operator.getitem for n in p.nodes)]
    reasons = tuple((describe_node(n), why) for n, why in on_torch.items())
    if whole:
        reasons += (("the whole graph", "it writes an input before its last read, or has effects to keep in order: "
                                        "it runs as it is, on torch"),)
    report = DataDependentSplit(name, reasons, len(partitions))
    if partitions:
        outer = fuse_by_partitions(outer, [p.nodes for p in partitions], prefix="fuseg_part_")
        out_node = next(n for n in outer.graph.nodes if n.op == "output")
        for n in _writers(outer):  # (the sort made new nodes; epilogue writes have no users)
            out_node.prepend(n)
    parts = [n for n in outer.graph.nodes if n.op == "call_module" and str(n.target).startswith("fuseg_part_")]
    for k, node in enumerate(parts):
        sub = getattr(outer, node.target)
        out_node = next(n for n in sub.graph.nodes if n.op == "output")
        single = not isinstance(out_node.args[0], (tuple, list))
        if single:  # every part hands back a tuple: the fuseg compiler's convention
            out_node.args = ((out_node.args[0],),)
            sub.recompile()
        setattr(outer, node.target, _Part(compile_part(sub, k), single))
    outer.recompile()
    log.info("%s", report.describe())
    return outer, report
