"""Synthetic transformer-like graphs of any size, for segmentation-time benchmarks.

One Llama-style block (RMS norm, q/k/v projections, RoPE, attention with softmax, output
projection, residual, gated MLP) is captured once; the graph is that block's nodes repeated
with fresh names, each copy reading the previous copy's hidden state. Building a 100k-node graph
this way takes seconds, not the minutes that capturing 100k nodes through torch.export would.
"""

from __future__ import annotations

import dataclasses

import torch

from segmenter import FusionGraph, Node, ValueRef
from segmenter.capturing.from_torch import capture

__all__ = ["block_graph", "synthetic_transformer"]


def _block(x: torch.Tensor, wqkv: torch.Tensor, wo: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
           w3: torch.Tensor, norm: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    B, T, C = x.shape
    H, D = 4, C // 4

    def rms(h: torch.Tensor) -> torch.Tensor:
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm

    def rope(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t[..., : D // 2], t[..., D // 2 :]
        return t * cos + torch.cat((-t2, t1), -1) * sin

    q, k, v = (rms(x) @ wqkv).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
    att = torch.softmax(rope(q) @ rope(k).transpose(-1, -2) / D**0.5, -1)
    h = x + ((att @ v).transpose(1, 2).reshape(B, T, C) @ wo)
    m = rms(h)
    return h + (torch.nn.functional.silu(m @ w1) * (m @ w3)) @ w2


def block_graph(C: int = 64, T: int = 16) -> FusionGraph:
    g = torch.Generator().manual_seed(0)

    def r(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)

    return capture(_block, [r(1, T, C), r(C, 3 * C), r(C, C), r(C, 2 * C), r(2 * C, C), r(C, 2 * C), r(C),
                            r(T, C // 4), r(T, C // 4)], name="block")


def synthetic_transformer(n_nodes: int, block: FusionGraph | None = None) -> FusionGraph:
    """About ``n_nodes`` nodes: copies of one block, chained through the hidden state."""
    block = block or block_graph()
    copies = max(1, round(n_nodes / len(block.nodes)))
    hidden_in = block.inputs[0].name
    (hidden_out,) = block.outputs
    nodes: list[Node] = []
    prev = hidden_in
    for k in range(copies):
        names = {n.name: f"{n.name}__{k}" for n in block.nodes}
        values = {o: f"{o}__{k}" for n in block.nodes for o in n.outputs if o is not None}
        values[hidden_in] = prev

        def ren(a: object, values: dict[str, str] = values) -> object:
            if isinstance(a, ValueRef):
                return ValueRef(values.get(a.name, a.name))
            if isinstance(a, tuple):
                return tuple(ren(x, values) for x in a)
            return a

        for n in block.nodes:
            nodes.append(dataclasses.replace(
                n, name=names[n.name], args=tuple(ren(a) for a in n.args),
                kwargs=tuple((key, ren(v)) for key, v in n.kwargs),
                outputs=tuple(None if o is None else values[o] for o in n.outputs),
            ))
        prev = values[hidden_out]
    return FusionGraph(block.inputs, tuple(nodes), (prev,), name=f"synthetic-{len(nodes)}")
