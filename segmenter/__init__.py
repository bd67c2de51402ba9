"""Fusion graphs: the IR, the op table, capture from PyTorch, JSON in/out, and segmentation."""

from .capturing.from_torch import capture
from .capturing.fx_import import CaptureError, from_fx
from .formats.nvfuser.importer import NvFuserFusion, from_nvfuser, read_nvfuser
from .ir.graph import Alias, FusionGraph, GraphConstant, GraphError, GraphInput, Mutation, Node, TensorMeta, ValueRef
from .ir.ops import OPAQUE_OPS, OpInfo, OpKind, op_info
from .partition.greedy import segment
from .partition.options import SegmenterOptions
from .partition.segments import Boundary, Segment, SegmentedFusion, SegmentKind

__all__ = [
    "OPAQUE_OPS",
    "Alias",
    "Boundary",
    "CaptureError",
    "FusionGraph",
    "GraphConstant",
    "GraphError",
    "GraphInput",
    "Mutation",
    "Node",
    "NvFuserFusion",
    "OpInfo",
    "OpKind",
    "Segment",
    "SegmentKind",
    "SegmentedFusion",
    "SegmenterOptions",
    "TensorMeta",
    "ValueRef",
    "capture",
    "from_fx",
    "from_nvfuser",
    "op_info",
    "read_nvfuser",
    "segment",
]
