"""The IR at the bottom of the segmenter: fusion graphs (graph.py), the op table (ops.py) and its
argument schemas (schema.py), size limits (limits.py), element ranges (elements.py), constants held
by value (constants.py), symbolic sizes (symbolic.py) and what differs between torch versions
(torch_compat.py). Nothing here imports the rest of the segmenter.

``from segmenter.ir import FusionGraph`` (the graph's names) keeps working: they are re-exported here.
"""

from .graph import (
    Alias,
    Arg,
    FusionGraph,
    GraphConstant,
    GraphError,
    GraphInput,
    Mutation,
    Node,
    OpRef,
    TensorMeta,
    ValueRef,
    iter_value_refs,
    view_roots,
)

__all__ = [
    "Alias",
    "Arg",
    "FusionGraph",
    "GraphConstant",
    "GraphError",
    "GraphInput",
    "Mutation",
    "Node",
    "OpRef",
    "TensorMeta",
    "ValueRef",
    "iter_value_refs",
    "view_roots",
]
