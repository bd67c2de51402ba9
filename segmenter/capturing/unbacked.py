"""Which nodes of a dynamo/AOTAutograd graph depend on sizes read from data (issue 63, goal 3).

With ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops`` dynamo keeps ``.item()``,
``nonzero``, ``masked_select``, ``repeat_interleave`` with tensor repeats (and ``torch._check``
on what they give) in the graph; the sizes they give are *unbacked* symbols: no input's size
says what they are, only the data at the call does. A FusionGraph's sizes are numbers or
symbols read from the inputs' sizes (Note [symbolic plans] in segmenter/ir/symbolic.py), so a node
whose value, or any of whose operands, has such a size cannot be planned; this module says which
nodes those are and why (runtime/unbacked.py runs them on torch and plans the rest).
"""

from __future__ import annotations

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, has_free_unbacked_symbols
from torch.utils import _pytree as pytree

from ..ir.ops import op_name

__all__ = ["data_dependent_nodes", "describe_node", "has_data_dependent_sizes"]


def _unbacked(value: object) -> set[sympy.Symbol]:
    try:
        return set(free_unbacked_symbols(value))
    except Exception:  # noqa: BLE001 - a value torch's helper does not walk holds no symbol of ours to read
        return set()


def _symbols(value: object) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for v in pytree.tree_leaves(value):
        if isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
            out |= _unbacked(v)
    return out


def _names(symbols: set[sympy.Symbol]) -> str:
    return ", ".join(sorted(map(str, symbols)))


def _describe(n: fx.Node) -> str:
    return op_name(n.target) if n.op == "call_function" else f"{n.op} {n.target}"


def data_dependent_nodes(gm: fx.GraphModule) -> dict[fx.Node, str]:
    """Each node (placeholders and the output aside) that makes a data-dependent size, has one in
    its value, or reads an operand that has one, with why; in graph order. A node without a value
    (``_assert_scalar``) counts by its operands."""
    out: dict[fx.Node, str] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        bindings = n.meta.get("unbacked_bindings")
        own = _symbols(n.meta.get("val"))
        # a number read from data may have been folded to a constant by a ``torch._check`` (its
        # value then has no symbol): what reads it still reads data
        read = [a for a in n.all_input_nodes if _symbols(a.meta.get("val"))
                or (a in out and not isinstance(a.meta.get("val"), torch.Tensor))]
        if bindings:
            out[n] = f"its size or value is read from data ({_names(set(bindings))})"
        elif own:
            out[n] = f"its shape or value depends on sizes read from data ({_names(own)})"
        elif read:
            out[n] = f"it reads %{read[0].name}, whose size or value is read from data"
    return out


def has_data_dependent_sizes(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` has sizes read from data: a node that makes one (tracing records the symbols
    each op makes as its ``unbacked_bindings``), or a placeholder that has one (a backward graph's
    saved values). Cheap: walking every node's value cost ~20 us a node on a symbolic graph."""
    return any(n.meta.get("unbacked_bindings") or (n.op == "placeholder" and _has_symbols(n.meta.get("val")))
               for n in gm.graph.nodes)


def _has_symbols(value: object) -> bool:
    try:
        return has_free_unbacked_symbols(value)
    except Exception:  # noqa: BLE001 - as in ``_unbacked``
        return False


def describe_node(n: fx.Node) -> str:
    """``%name (op)``: how a node is named in reports."""
    return f"%{n.name} ({_describe(n)})"
