"""An fx partitioner for fusers that already work on fx graphs.

Familiar to users of ``torch.fx.passes.infra.partitioner.CapabilityBasedPartitioner``:
``propose_partitions()`` returns our kernel segments as fx ``Partition`` objects (nodes the
operator-support policy rejects stay alone, outside every partition), and
``fuse_partitions()`` turns each into a submodule. Metadata-only segments, as the alias pass
finds them, are left as plain view calls in the parent graph, never a fused submodule: a view
needs no kernel.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import Partition
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from alias import apply_aliases
from segmenter import SegmentedFusion, SegmenterOptions, SegmentKind, from_fx, segment
from segmenter.capturing.fx_import import needs_functionalization

__all__ = ["FusegPartitioner"]

_KERNELS = (SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION, SegmentKind.MATMUL)


class FusegPartitioner:
    def __init__(
        self,
        graph_module: fx.GraphModule,
        operator_support: OperatorSupportBase | None = None,
        example_inputs: Sequence[Any] | None = None,
        options: SegmenterOptions | None = None,
        alias_mode: str = "post",
    ) -> None:
        if needs_functionalization(graph_module):
            raise ValueError("FusegPartitioner takes functional ATen graphs (as AOTAutograd makes them)")
        self.graph_module = graph_module
        self.operator_support = operator_support
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        if example_inputs is None:
            example_inputs = [n.meta.get("val") for n in placeholders]
            if not all(isinstance(v, torch.Tensor) for v in example_inputs):
                raise ValueError("pass example_inputs: some placeholders carry no FakeTensor meta['val']")
        self.example_inputs = list(example_inputs)
        self.options = options or SegmenterOptions()
        self.alias_mode = alias_mode
        self.plan: SegmentedFusion | None = None

    def _unsupported(self) -> frozenset[str]:
        if self.operator_support is None:
            return frozenset()
        modules = dict(self.graph_module.named_modules())
        return frozenset(
            n.name for n in self.graph_module.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem
            and not self.operator_support.is_node_supported(modules, n)
        )

    def propose_partitions(self) -> list[Partition]:
        graph = from_fx(self.graph_module, self.example_inputs)
        options = dataclasses.replace(self.options, opaque_nodes=self.options.opaque_nodes | self._unsupported())
        self.plan = apply_aliases(segment(graph, options), self.alias_mode)
        by_name = {n.name: n for n in self.graph_module.graph.nodes}
        order = {n: i for i, n in enumerate(self.graph_module.graph.nodes)}
        partitions = []
        for seg in self.plan.segments:
            if seg.kind not in _KERNELS:
                continue
            nodes = [by_name[n.name] for n in seg.nodes]
            # getitems of a multi-output node travel with it
            nodes += [u for n in list(nodes) for u in n.users if u.target is operator.getitem]
            partitions.append(Partition(id=len(partitions), nodes=sorted(set(nodes), key=order.get)))
        return partitions

    def fuse_partitions(self, partitions: list[Partition]) -> fx.GraphModule:
        return fuse_by_partitions(self.graph_module, [dict.fromkeys(p.nodes) for p in partitions],
                                  prefix="fuseg_", always_return_tuple=True)

    def partition_and_fuse(self) -> fx.GraphModule:
        return self.fuse_partitions(self.propose_partitions())
