"""What a graph file may hold: names, keyword names, sizes (segmenter/formats/serialize.py reads it).

Each check returns what is wrong (None: nothing); the loader raises it with the field named.

Note [names are identifiers of the graph only]: a name (of the graph, an input, a node, a
value) is used as a key and printed in messages, never as code (see segmenter/capturing/functionalize.py,
Note [no name reaches generated code]). So any printable text is a name; what is refused is
what breaks messages and logs: empty names, control and format characters (newlines, bidi
overrides), and names longer than MAX_NAME. Keyword-argument names go into torch calls: they
must be Python identifiers, not keywords and not dunders. Op names: segmenter.ir.ops.op_name_problem.

Sizes are bounded so that no number in a file can overflow torch's int64 arithmetic or make
loading superlinear: see the constants.
"""

from __future__ import annotations

import keyword
from collections.abc import Sequence

from .graph import Node
from .ops import OpKind, op_info

__all__ = ["MAX_BYTES", "MAX_DIM", "MAX_NAME", "MAX_NESTING", "MAX_RANK", "MAX_STRING", "MAX_VIEW_DEPTH",
           "keyword_problem", "name_problem", "view_depth_problem"]

MAX_NAME = 256
MAX_STRING = 1024  # a string argument (a mode such as gelu's "tanh", an einsum equation)
MAX_DIM = 2**48  # one size, stride or offset
MAX_BYTES = 2**48  # the storage one tensor may address (256 TiB): also bounds numel below int64
MAX_RANK = 64
MAX_NESTING = 32  # argument lists nest a level or two; deeper is a broken file, not a RecursionError
MAX_VIEW_DEPTH = 1024  # real programs chain a handful of views; torch's cost per view grows with the chain


def name_problem(v: object) -> str | None:
    if not isinstance(v, str):
        return f"expected a name (string), got {type(v).__name__}"
    if not v:
        return "empty name"
    if len(v) > MAX_NAME:
        return f"name of {len(v)} characters (at most {MAX_NAME})"
    if not v.isprintable():
        bad = next(c for c in v if not c.isprintable())
        return f"name {v[:40]!r} holds the control or format character {bad!r}"
    return None


def keyword_problem(k: str) -> str | None:
    if not (k.isidentifier() and k.isascii()) or keyword.iskeyword(k) or k.startswith("__"):
        return f"keyword {k[:40]!r} is not an argument name (an identifier)"
    return None


def view_depth_problem(nodes: Sequence[Node]) -> str | None:
    """A chain of view ops deeper than MAX_VIEW_DEPTH (``nodes`` in topological order): torch
    records a view's whole chain, so every op on a deep view (in eager, on FakeTensors, in
    functionalization) costs time in its depth."""
    depth: dict[str, int] = {}
    for n in nodes:
        if op_info(n.op).kind != OpKind.VIEW or not n.inputs:
            continue
        d = depth.get(n.inputs[0], 0) + 1
        if d > MAX_VIEW_DEPTH:
            return f'node "{n.name}": a chain of {d} view ops (at most {MAX_VIEW_DEPTH})'
        for o in n.outputs:
            if o is not None:
                depth[o] = d
    return None
