"""Note [a matmul's bias after it]: ``addmm(bias, a, b)`` as ``add(mm(a, b), bias)`` where that is
faster, so the bias joins the pointwise kernel that reads the product (a GELU, a residual add
before a layer norm) instead of riding in the GEMM.

Why: on CUDA in float32, ATen runs an ``addmm`` with a 1-D bias through cuBLASLt with a bias
epilogue, and for the small products of a compiled model cuBLASLt picks a split-K kernel that
needs three more launches (a memset, a scaling of C and a separate epilogue kernel): on an H100
(perf/results/nvidia-h100/issue44_run5, ``gpu_kernels_h100.log``) vit's twelve such products took
~11.6 us each against ~5.5 us for the GEMM and split-K reduction Inductor's plain ``mm`` gets
(Inductor moves the bias into its pointwise kernels the same way). The rewrite is exact in what
it computes (the same float32 product, then the same float32 add).

Taken: ``aten.addmm.default`` with no ``beta``/``alpha`` other than 1, a 1-D bias of the
product's row length, float32 on CUDA (the measured case; the CPU's generated GEMM adds the bias
in its own loop, and in fp16/bf16 cuBLASLt's fused epilogue is the tensor-core kernel's).
``SegmenterOptions.bias_after_matmul``: None (the default) for that rule, False for never, True
for every float32 ``addmm`` of a 1-D bias (the CPU tests of the rewrite itself)."""

from __future__ import annotations

import dataclasses

import torch

from ..ir.graph import FusionGraph, Node, ValueRef
from ..ir.symbolic import size_key

__all__ = ["split_matmul_bias"]

_ADDMM = "aten.addmm.default"


def _splittable(node: Node, metas: dict, force: bool) -> bool:
    if node.op != _ADDMM or len(node.args) != 3 or node.outputs[0] is None:
        return False
    if any(k not in ("beta", "alpha") or v != 1 for k, v in node.kwargs):
        return False
    bias, out = node.args[0], node.metas[0]
    if not isinstance(bias, ValueRef) or out is None or out.dtype != torch.float32 or out.ndim != 2:
        return False
    bm = metas.get(bias.name)
    if bm is None or bm.ndim != 1 or bm.dtype != torch.float32 or size_key(bm.shape[0]) != size_key(out.shape[1]):
        return False
    return force or out.device_type == "cuda"


def split_matmul_bias(graph: FusionGraph, force: bool = False) -> FusionGraph:
    """See Note [a matmul's bias after it]: ``graph`` with each ``addmm`` the rule takes as an ``mm``
    and an ``add``; the add keeps the addmm's name and output, so nothing downstream changes."""
    metas = graph.metas
    split = [_splittable(n, metas, force) for n in graph.nodes]
    if not any(split):
        return graph
    taken = set(metas) | {n.name for n in graph.nodes}
    nodes: list[Node] = []
    for n, this in zip(graph.nodes, split):
        if not this:
            nodes.append(n)
            continue
        product = f"{n.outputs[0]}_mm"
        k = 0
        while product in taken:
            k += 1
            product = f"{n.outputs[0]}_mm{k}"
        taken.add(product)
        bias, a, b = n.args
        nodes.append(Node(product, "aten.mm.default", (a, b), (), (product,), n.metas))
        nodes.append(Node(n.name, "aten.add.Tensor", (ValueRef(product), bias), (), n.outputs, n.metas))
    return dataclasses.replace(graph, nodes=tuple(nodes))
