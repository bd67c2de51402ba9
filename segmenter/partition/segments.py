"""The result of segmentation: segments in execution order, each one kernel (or none).

Note [bytes model]: a launching segment moves the distinct storage elements it reads and writes,
each once (a stride-0 dim counts once); a METADATA segment moves nothing. The floor is what any
schedule must move: graph inputs read by some launching segment, plus graph outputs that are not
views of inputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..ir.graph import FusionGraph, Node, TensorMeta, view_roots

__all__ = ["Boundary", "Segment", "SegmentKind", "SegmentedFusion"]


class SegmentKind(enum.Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"
    MATMUL = "matmul"
    OPAQUE = "opaque"
    METADATA = "metadata"


KERNEL_KINDS = frozenset({SegmentKind.POINTWISE, SegmentKind.REDUCTION, SegmentKind.NORMALIZATION, SegmentKind.MATMUL})


@dataclass(frozen=True)
class Segment:
    index: int
    kind: SegmentKind
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    bytes_read: int
    bytes_written: int

    @property
    def launches_kernel(self) -> bool:
        return self.kind != SegmentKind.METADATA

    @property
    def is_kernel(self) -> bool:
        """A generated kernel (POINTWISE, REDUCTION, NORMALIZATION or MATMUL), not OPAQUE."""
        return self.kind in KERNEL_KINDS

    @property
    def bytes_moved(self) -> int:
        return self.bytes_read + self.bytes_written if self.launches_kernel else 0

    @property
    def name(self) -> str:
        return f"s{self.index}"


@dataclass(frozen=True)
class Boundary:
    """A value crossing from one segment to another, and why the two were not merged."""

    value: str
    producer: int
    consumer: int
    reason: str


@dataclass(frozen=True)
class SegmentedFusion:
    graph: FusionGraph
    segments: tuple[Segment, ...]
    boundaries: tuple[Boundary, ...] = ()
    merges: int = 0
    #: The alias pass that produced this ("post", "pre", "off"); None straight out of the segmenter.
    alias_mode: str | None = None
    #: Filled in by the alias pass (alias.apply_aliases); None straight out of the segmenter.
    alias_report: object | None = field(default=None, compare=False)

    def segment_of(self) -> dict[str, int]:
        """Node name -> index of the segment holding it."""
        return {n.name: s.index for s in self.segments for n in s.nodes}

    def stats(self) -> dict[str, int]:
        kernels = sum(s.is_kernel for s in self.segments)
        opaque = sum(s.kind == SegmentKind.OPAQUE for s in self.segments)
        metadata = sum(s.kind == SegmentKind.METADATA for s in self.segments)
        return {
            "segments": len(self.segments),
            "kernels": kernels,
            "opaque": opaque,
            "launches": kernels + opaque,
            "metadata": metadata,
            "bytes_moved": sum(s.bytes_moved for s in self.segments),
            "bytes_floor": bytes_floor(self),
        }


def bytes_floor(sf: SegmentedFusion) -> int:
    """Graph inputs some op reads (those read only through views count what the views touch),
    plus graph outputs that are not views of inputs. A property of the graph: the same for
    every plan of it, so computed once per graph (the alias pass asks before and after)."""
    g = sf.graph
    found = g.__dict__.get("_bytes_floor")
    if found is None:
        found = g.__dict__["_bytes_floor"] = _bytes_floor(g)
    return found


def _bytes_floor(g: FusionGraph) -> int:
    from ..ir.ops import OpKind, op_info  # local: ops is below segments in the import order

    root = view_roots(g)
    metas = _modeled_metas(g)
    whole: set[str] = set()  # inputs some op reads directly
    through: dict[str, list[TensorMeta]] = {}  # inputs read only through views: those views
    reads = [v for node in g.nodes if op_info(node.op).kind != OpKind.VIEW for v in node.inputs]
    reads += [m.value for m in g.mutations]
    for v in reads:
        r = root.get(v, v)
        if r == v:
            whole.add(v)
        else:
            through.setdefault(r, []).append(metas[v])
    floor = 0
    for inp in g.inputs:
        if inp.name in whole:
            floor += metas[inp.name].nbytes
        elif inp.name in through:  # as in a segment's reads: what the views touch, at most all of it
            floor += footprint(through[inp.name], metas[inp.name])
    seen: set[str] = set()
    for name, alias in zip(g.outputs, g.output_aliases):
        if (alias is None or alias.source != "input") and name not in seen and name not in g.input_names:
            seen.add(name)
            floor += metas[name].nbytes
    return floor


def _contains(a: TensorMeta, b: TensorMeta) -> bool:
    """Whether view ``b`` touches only elements view ``a`` touches (same strides, b's box inside a's)."""
    if a.stride != b.stride or a.dtype != b.dtype:
        return False
    rem = b.storage_offset - a.storage_offset
    if rem < 0:
        return False
    for d in sorted(range(len(a.shape)), key=lambda d: -a.stride[d]):
        st = a.stride[d]
        start = rem // st if st > 0 else 0
        rem -= start * st
        if start + b.shape[d] > a.shape[d]:
            return False
    return rem == 0


def footprint(metas: list[TensorMeta], whole: TensorMeta) -> int:
    """Bytes read of one value through views of it: what the views touch (a view inside another
    counts once), at most the whole value."""
    if not metas:
        return whole.nbytes
    distinct = list(dict.fromkeys(metas))
    kept = [b for i, b in enumerate(distinct)
            if b.numel and not any(j != i and a.numel and _contains(a, b) and not (_contains(b, a) and j > i)
                                   for j, a in enumerate(distinct))]
    return min(whole.nbytes, sum(m.nbytes for m in kept))


def contiguous_nbytes(m: TensorMeta) -> int:
    """Bytes of a value once made contiguous (every element written, stride-0 dims included)."""
    return m.numel * m.itemsize


def _modeled_metas(graph: FusionGraph) -> dict[str, TensorMeta]:
    """The metas bytes are modeled from: symbolic sizes at the first call's values (a figure,
    not a decision: Note [symbolic plans] in segmenter/ir/symbolic.py)."""
    metas = graph.metas
    cache = graph.__dict__.get("_modeled_metas")
    if cache is None:
        from ..ir.symbolic import hinted, sizes_of

        cache = metas if sizes_of(graph) is None else {v: hinted(m) for v, m in metas.items()}
        graph.__dict__["_modeled_metas"] = cache
    return cache


def build_segment(
    graph: FusionGraph, index: int, kind: SegmentKind, nodes: list[Node] | tuple[Node, ...],
    materialized: frozenset[str] = frozenset(),
) -> Segment:
    """A segment over ``nodes`` (any order; kept in graph order), with its inputs, outputs and
    modeled bytes. Values in ``materialized`` cross segment boundaries as contiguous copies
    (the "pre" and "off" alias modes): they are read and written whole."""
    from ..ir.ops import OpKind, op_info  # local: ops is below segments in the import order

    if len(nodes) > 1:
        position = graph.node_index
        nodes = tuple(sorted(nodes, key=lambda n: position[n.name]))
    else:
        nodes = tuple(nodes)
    inside: set[str | None] = set()  # (None: an output a node does not make)
    inputs: dict[str, None] = {}
    local_users: dict[str, list[Node]] = {}
    for n in nodes:  # in graph order: a value read here was made earlier here, or outside
        for v in n.inputs:
            if v not in inside:
                inputs[v] = None
            found = local_users.get(v)
            if found is None:
                local_users[v] = [n]
            else:
                found.append(n)
        inside.update(n.outputs)
    inside.discard(None)
    names = {n.name for n in nodes}
    external, all_users = graph.external_values, graph.users
    outputs = [
        o for n in nodes for o in n.outputs
        if o is not None and (o in external or any(u.name not in names for u in all_users.get(o, ())))
    ]
    if kind == SegmentKind.METADATA:
        return Segment(index, kind, nodes, tuple(inputs), tuple(outputs), 0, 0)
    metas = _modeled_metas(graph)
    out_set = set(outputs)

    def read_metas(v: str) -> list[TensorMeta]:
        found: list[TensorMeta] = []
        stack, seen = [v], set()
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            users = local_users.get(x, ())
            views = [u for u in users if op_info(u.op).kind == OpKind.VIEW]
            if x in out_set or len(views) < len(users):
                if x == v:
                    return []  # read whole
                found.append(metas[x])
            stack.extend(o for u in views for o in u.outputs if o is not None)
        return found

    def read(v: str) -> int:
        if v in materialized:
            return contiguous_nbytes(metas[v])
        return footprint(read_metas(v), metas[v])

    written = sum(contiguous_nbytes(metas[v]) if v in materialized else metas[v].nbytes for v in outputs)
    return Segment(index, kind, nodes, tuple(inputs), tuple(outputs), sum(read(v) for v in inputs), written)
