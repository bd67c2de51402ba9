"""Fusion graphs: the IR, the op table, capture from PyTorch, and JSON in/out."""

from .ir import Alias, FusionGraph, GraphError, GraphInput, Mutation, Node, TensorMeta, ValueRef
from .ops import OPAQUE_OPS, OpInfo, OpKind, op_info

__all__ = [
    "OPAQUE_OPS",
    "Alias",
    "FusionGraph",
    "GraphError",
    "GraphInput",
    "Mutation",
    "Node",
    "OpInfo",
    "OpKind",
    "TensorMeta",
    "ValueRef",
    "op_info",
]
