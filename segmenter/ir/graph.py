"""The FusionGraph IR: small, typed, frozen.

A FusionGraph is a functional program over tensors at ATen level:

    inputs (GraphInput) --> nodes (Node, topologically ordered) --> outputs (value names)

plus what the *original* (possibly mutating, possibly aliasing) program did that a functional
graph cannot say by itself:

* ``output_aliases[i]``: graph output ``i`` was, in the original program, a view of graph input
  ``k`` (``Alias("input", k)``) or of an earlier output ``k`` (``Alias("output", k)``);
* ``mutations``: input ``k`` ends holding the value ``v`` (the write-back epilogue);
* ``GraphInput.storage``: inputs with the same storage id share one storage in the caller;
* ``scalar_outputs``: outputs the program returned as Python numbers (``x.sum().item()``): computed
  as one-element tensors, handed back as numbers;
* ``constants``: tensors the graph holds by value (``GraphConstant``), used by name like inputs
  but never passed in;
* ``GraphInput.final_layout``: the caller's tensor ends with this layout (``t_()``,
  ``unsqueeze_()``... on the input: see Note [metadata mutation] in segmenter/capturing/metadata_mutation.py).

Every value carries a TensorMeta (shape, stride, storage offset, dtype, device). Passes never
mutate a graph; they build a new one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, Union, cast

import torch

from .constants import tensor_bytes, tensor_from_bytes
from .elements import within
from .errors import GraphError

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


# Note [conjugate and negative bits]: torch makes ``x.conj()`` (complex) and ``x.conj().imag``
# zero-cost views that carry a bit saying "read me conjugated / negated"; the storage is not
# touched. A view op that drops or adds such a bit changes the values read, so the bits are part
# of a value's layout here: recorded from FakeTensors like strides, compared by ``same_layout``
# and the checker, restored on every view the runtime makes (``with_bits``), and kept on copies.
# Generated kernels read raw storage, so segments touching a value with a bit stay on torch.


def _size(s: int | torch.SymInt) -> int:
    """A number where torch knows one; else the SymInt, typed ``int`` as torch.Size types it (see
    TensorMeta)."""
    if isinstance(s, torch.SymInt):
        v = s.node.maybe_as_int()
        return cast(int, s) if v is None else int(v)
    return int(s)


@dataclass(frozen=True)
class TensorMeta:
    """Layout of one tensor value: sizes, strides and offset in elements of its storage, and
    the lazy view bits torch keeps on it (see Note [conjugate and negative bits]).

    In a symbolic plan a size, stride or offset may be a ``torch.SymInt`` (Note [symbolic plans] in
    segmenter/ir/symbolic.py); the annotations say ``int`` for both, as torch's own (``torch.Size``)
    do: a SymInt takes an int's arithmetic and comparisons."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype
    device: str = "cpu"
    conj: bool = False  # reads as the conjugate of what its storage holds (x.conj(), x.mH)
    neg: bool = False  # reads as the negation of what its storage holds (x.conj().imag)

    def __post_init__(self) -> None:
        if self.conj and not self.dtype.is_complex:
            raise GraphError(f"the conjugate bit on a {self.dtype} value (only complex values have one)")
        if len(self.shape) != len(self.stride):
            raise GraphError(f"shape {self.shape} and stride {self.stride} differ in rank")
        if any(s < 0 for s in self.shape):
            raise GraphError(f"negative size in shape {self.shape}")
        if self.storage_offset < 0:
            raise GraphError(f"negative storage_offset {self.storage_offset}")

    @classmethod
    def from_tensor(cls, t: torch.Tensor, device: str | None = None) -> TensorMeta:
        """The layout of ``t``; a FakeTensor's symbolic sizes stay SymInts (Note [symbolic plans]
        in segmenter/ir/symbolic.py), numbers are plain ints."""
        return cls(
            tuple(_size(s) for s in t.shape),
            tuple(_size(s) for s in t.stride()),
            _size(t.storage_offset()),
            t.dtype,
            device or str(t.device),
            bool(t.is_conj()),
            bool(t.is_neg()),
        )

    def with_bits(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a view of the right storage and layout) with this meta's conj/neg bits: each
        bit is flipped by its own zero-cost view op where ``t``'s differs."""
        if t.is_conj() != self.conj:
            t = torch._conj(t)
        if t.is_neg() != self.neg:
            t = torch._neg_view(t)
        return t

    @cached_property
    def device_type(self) -> str:
        return torch.device(self.device).type

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @cached_property
    def storage_extent(self) -> int:
        """Elements of storage needed to hold this view: last reachable element + 1."""
        if self.numel == 0:
            return self.storage_offset
        return self.storage_offset + 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.stride))

    @cached_property
    def distinct_elements(self) -> int:
        """Elements actually stored (a stride-0 dim counts once)."""
        if self.numel == 0:
            return 0
        return math.prod(n for n, s in zip(self.shape, self.stride) if s != 0)

    @cached_property
    def nbytes(self) -> int:
        """Bytes of the distinct storage elements this value covers."""
        return self.distinct_elements * self.itemsize

    def _replace_offset(self, offset: int) -> TensorMeta:
        return dataclasses.replace(self, storage_offset=offset)

    def same_layout(self, other: TensorMeta) -> bool:
        """Equal up to what cannot be observed: the strides of size-1 dims, and the offset of
        an empty tensor (torch's meta and real kernels may disagree there)."""
        if (self.shape, self.dtype, self.device, self.conj, self.neg) != (
                other.shape, other.dtype, other.device, other.conj, other.neg):
            return False
        if self.numel == 0:
            return True
        return self.storage_offset == other.storage_offset and all(
            a == b for n, a, b in zip(self.shape, self.stride, other.stride) if n > 1
        )

    def is_contiguous(self) -> bool:
        expected = 1
        for n, s in reversed(list(zip(self.shape, self.stride))):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True

    def __str__(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        if any(isinstance(x, torch.SymInt) for x in (*self.shape, *self.stride, self.storage_offset)):
            return self._symbolic_str(dt)
        layout = "" if self.is_contiguous() and self.storage_offset == 0 else f" stride={list(self.stride)}"
        if self.storage_offset:
            layout += f" offset={self.storage_offset}"
        layout += " conj" * self.conj + " neg" * self.neg
        return f"{dt}{list(self.shape)}{layout}"

    def _symbolic_str(self, dt: str) -> str:
        """Symbolic sizes with their display names (no decision is made on them: nothing is
        compared, so printing records no condition of a plan)."""
        from .symbolic import sizes_of

        sizes = sizes_of(self)
        show = (lambda x: sizes.text(x)) if sizes is not None else str  # noqa: E731
        shape = "[" + ", ".join(show(x) for x in self.shape) + "]"
        stride = "[" + ", ".join(show(x) for x in self.stride) + "]"
        off = show(self.storage_offset)
        layout = f" stride={stride}" + (f" offset={off}" if off != "0" else "")
        return f"{dt}{shape}{layout}" + " conj" * self.conj + " neg" * self.neg


@dataclass(frozen=True)
class ValueRef:
    """A use of a tensor value inside a node's arguments."""

    name: str

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class OpRef:
    """An op passed as an argument (the custom op inside ``auto_functionalized``)."""

    name: str

    def __str__(self) -> str:
        return self.name


# Arguments are literals (int, float, complex, bool, None, str, torch.dtype/device/layout/memory_format),
# value references, or tuples of those.
Arg = Union[  # noqa: UP007 - a runtime alias; | on torch types needs 3.10+ objects
    None, bool, int, float, complex, str, ValueRef, OpRef, torch.dtype, torch.device, torch.layout,
    torch.memory_format, tuple,
]


def iter_value_refs(arg: object) -> Iterator[ValueRef]:
    if isinstance(arg, ValueRef):
        yield arg
    elif isinstance(arg, tuple):
        for a in arg:
            yield from iter_value_refs(a)


@dataclass(frozen=True)
class Node:
    """One ATen op. ``outputs[i]`` names the i-th returned tensor (None where nothing uses it)."""

    name: str
    op: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...]
    outputs: tuple[str | None, ...]
    metas: tuple[TensorMeta | None, ...]

    def __post_init__(self) -> None:
        if len(self.outputs) != len(self.metas):
            raise GraphError(f"node {self.name!r}: {len(self.outputs)} outputs but {len(self.metas)} metas")
        for out, meta in zip(self.outputs, self.metas):
            if out is not None and meta is None:
                raise GraphError(f"node {self.name!r}: output {out!r} has no meta")

    @cached_property
    def inputs(self) -> tuple[str, ...]:
        """Names of the values this node reads, in argument order, without repeats."""
        seen: dict[str, None] = {}
        for a in (*self.args, *(v for _, v in self.kwargs)):
            for ref in iter_value_refs(a):
                seen.setdefault(ref.name, None)
        return tuple(seen)

    @property
    def kwargs_dict(self) -> dict[str, Arg]:
        return dict(self.kwargs)

    def __str__(self) -> str:
        outs = ", ".join(f"%{o}" if o else "_" for o in self.outputs)
        args = [_fmt_arg(a) for a in self.args] + [f"{k}={_fmt_arg(v)}" for k, v in self.kwargs]
        return f"{outs} = {self.op}({', '.join(args)})"


def _fmt_arg(a: object) -> str:
    if isinstance(a, tuple):
        return "[" + ", ".join(_fmt_arg(x) for x in a) + "]"
    if isinstance(a, torch.SymInt):  # with its display names (Note [symbols in graph files])
        from .symbolic import sizes_of

        sizes = sizes_of(a)
        return sizes.text(a) if sizes is not None else str(a)
    if isinstance(a, torch.dtype):
        return str(a).removeprefix("torch.")
    return str(a)


# "storage": a flat view of a storage that several arguments share (see segmenter/capturing/from_torch.py)
InputRole = Literal["user", "parameter", "buffer", "constant", "storage"]


@dataclass(frozen=True)
class GraphInput:
    """A graph input. ``storage``: inputs with equal ids share one storage in the caller.

    ``final_layout``: where the original program changed the input's metadata (``a.t_()``), the
    layout (absolute offset, same storage) the caller's tensor ends with. Values and write-backs
    stay in ``meta``'s layout; the layout change is applied after the write-back."""

    name: str
    meta: TensorMeta
    role: InputRole = "user"
    target: str | None = None
    storage: int = -1  # -1: its own storage (the FusionGraph fills in its index)
    final_layout: TensorMeta | None = None


@dataclass(frozen=True)
class GraphConstant:
    """A tensor the graph holds by value: a ``torch.tensor([...])`` built in the program, the index
    of ``x[[1, 2]]``, a module's plain tensor attribute. Nodes use it by ``name`` as they use an
    input; it is never passed in. ``meta`` is contiguous at offset 0 on the device the program
    used; ``data`` its bytes in little-endian order (None where it was captured on fake or meta
    tensors: such a graph can be segmented, not run). Equal graphs hold equal bytes."""

    name: str
    meta: TensorMeta
    data: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.meta.is_contiguous() or self.meta.storage_offset != 0:
            raise GraphError(f"constant {self.name!r}: {self.meta} is not contiguous at offset 0")
        want = self.meta.numel * self.meta.itemsize
        if self.data is not None and len(self.data) != want:
            raise GraphError(f"constant {self.name!r}: {len(self.data)} bytes of data for {self.meta} ({want} bytes)")

    @classmethod
    def from_tensor(cls, name: str, t: torch.Tensor, device: str | None = None) -> GraphConstant:
        t = t.detach()
        meta = TensorMeta.from_tensor(t.contiguous() if t.device.type == "meta" else t, device)
        if not meta.is_contiguous() or meta.storage_offset != 0:
            meta = TensorMeta(meta.shape, _contiguous_strides(meta.shape), 0, meta.dtype, meta.device)
        return cls(name, meta, tensor_bytes(t, f"constant {name!r}"))

    def tensor(self, device: str | torch.device | None = None) -> torch.Tensor:
        """A fresh tensor holding the constant, on ``device`` (default: its own)."""
        if self.data is None:
            raise GraphError(f"constant {self.name!r} was captured without its values (on fake or meta tensors)")
        t = tensor_from_bytes(self.data, self.meta)
        return t.to(device if device is not None else self.meta.device)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Alias:
    """Graph output was a view of graph input ``index`` or of the earlier output ``index``.

    ``layout`` is the view's layout in the original program (absolute storage offset), which the
    functional value need not have: ``y = x[1]; x.add_(1); return y`` computes ``select(x + 1, 1)``
    but must hand back a view of ``x`` at ``x``'s offsets.
    """

    source: Literal["input", "output"]
    index: int
    layout: TensorMeta | None = None


@dataclass(frozen=True)
class Mutation:
    """Graph input ``input`` ends the program holding value ``value``."""

    input: int
    value: str


@dataclass(frozen=True)
class FusionGraph:
    inputs: tuple[GraphInput, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    output_aliases: tuple[Alias | None, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    name: str = "graph"
    constants: tuple[GraphConstant, ...] = ()
    scalar_outputs: tuple[int, ...] = ()  # outputs handed back as Python numbers (``t.item()``)

    def __post_init__(self) -> None:
        if not self.output_aliases:
            object.__setattr__(self, "output_aliases", (None,) * len(self.outputs))
        fixed = tuple(
            dataclasses.replace(inp, storage=i) if inp.storage < 0 else inp
            for i, inp in enumerate(self.inputs)
        )
        object.__setattr__(self, "inputs", fixed)
        self._validate()

    # -- queries ---------------------------------------------------------------------------

    @cached_property
    def metas(self) -> dict[str, TensorMeta]:
        """Meta of every value (inputs, constants and node outputs) by name."""
        out = {inp.name: inp.meta for inp in self.inputs}
        out.update((c.name, c.meta) for c in self.constants)
        for node in self.nodes:
            for name, meta in zip(node.outputs, node.metas):
                if name is not None and meta is not None:
                    out[name] = meta
        return out

    @cached_property
    def node_index(self) -> dict[str, int]:
        """Position of each node (by name) in the graph's order."""
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def external_values(self) -> frozenset[str]:
        """Values the caller sees after a run: graph outputs and values written back to inputs."""
        return frozenset(self.outputs) | {m.value for m in self.mutations}

    @cached_property
    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o is not None}

    @cached_property
    def users(self) -> dict[str, tuple[Node, ...]]:
        acc: dict[str, list[Node]] = {name: [] for name in self.metas}
        for n in self.nodes:
            for v in n.inputs:
                acc[v].append(n)
        return {k: tuple(v) for k, v in acc.items()}

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def constant_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.constants)

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(m.input for m in self.mutations)

    def storage_groups(self) -> list[tuple[int, ...]]:
        """Groups of input indices that share a storage (only groups of two or more)."""
        groups: dict[int, list[int]] = {}
        for i, inp in enumerate(self.inputs):
            groups.setdefault(inp.storage, []).append(i)
        return [tuple(g) for g in groups.values() if len(g) > 1]

    # -- invariants ------------------------------------------------------------------------

    def _validate(self) -> None:
        from .ops import op_info  # local: ops imports ir

        if not self.outputs and not self.mutations and all(i.final_layout is None for i in self.inputs):
            raise GraphError(f"graph {self.name!r} has no outputs")  # and no effect on its inputs
        defined: dict[str, str] = {}
        for i, inp in enumerate(self.inputs):
            if inp.name in defined:
                raise GraphError(f"inputs[{i}]: duplicate value name {inp.name!r}")
            defined[inp.name] = f"inputs[{i}]"
            if inp.final_layout is not None:
                _check_final_layout(inp, f"inputs[{i}] ({inp.name!r}).final_layout")
        for i, c in enumerate(self.constants):
            if c.name in defined:
                raise GraphError(f"constants[{i}]: value name {c.name!r} is also {defined[c.name]}")
            defined[c.name] = f"constants[{i}]"
        all_defs = {o: n.name for n in self.nodes for o in n.outputs if o is not None}
        node_names: set[str] = set()
        for k, node in enumerate(self.nodes):
            if node.name in node_names:
                raise GraphError(f"nodes[{k}]: duplicate node name {node.name!r}")
            node_names.add(node.name)
            for v in node.inputs:
                if v not in defined:
                    if v in all_defs:
                        raise GraphError(
                            f"nodes[{k}] ({node.name!r}) uses %{v} before node {all_defs[v]!r} defines it"
                            " (nodes out of topological order, or a cycle)"
                        )
                    raise GraphError(f"nodes[{k}] ({node.name!r}) uses undefined value %{v}")
            info = op_info(node.op)
            if info.mutates:
                raise GraphError(
                    f"nodes[{k}] ({node.name!r}): in-place op {node.op} in a FusionGraph; "
                    "graphs are functional (functionalize on the way in)"
                )
            for o in node.outputs:
                if o is None:
                    continue
                if o in defined:
                    raise GraphError(f"nodes[{k}] ({node.name!r}): value %{o} defined twice")
                defined[o] = f"nodes[{k}]"
        for i, o in enumerate(self.outputs):
            if o not in defined:
                raise GraphError(f"outputs[{i}]: undefined value %{o}")
        if len(self.output_aliases) != len(self.outputs):
            raise GraphError(
                f"output_aliases has {len(self.output_aliases)} entries for {len(self.outputs)} outputs"
            )
        for i, a in enumerate(self.output_aliases):
            if a is None:
                continue
            if a.source == "input" and not 0 <= a.index < len(self.inputs):
                raise GraphError(f"output_aliases[{i}]: no input {a.index}")
            if a.source == "output" and not 0 <= a.index < i:
                raise GraphError(f"output_aliases[{i}]: output {a.index} is not an earlier output")
            if a.source not in ("input", "output"):
                raise GraphError(f"output_aliases[{i}]: source must be 'input' or 'output', not {a.source!r}")
        for k, i in enumerate(self.scalar_outputs):
            if not (isinstance(i, int) and 0 <= i < len(self.outputs)) or i in self.scalar_outputs[:k]:
                raise GraphError(f"scalar_outputs[{k}]: {i!r} is not an output index (or is listed twice)")
            if self.metas[self.outputs[i]].numel != 1 or self.output_aliases[i] is not None:
                raise GraphError(f"scalar_outputs[{k}]: output {i} (%{self.outputs[i]}, "
                                 f"{self.metas[self.outputs[i]]}) is not a one-element tensor of its own")
        seen_inputs: set[int] = set()
        for i, m in enumerate(self.mutations):
            if not 0 <= m.input < len(self.inputs):
                raise GraphError(f"mutations[{i}]: no input {m.input}")
            if m.input in seen_inputs:
                raise GraphError(f"mutations[{i}]: input {m.input} is written back twice")
            seen_inputs.add(m.input)
            if m.value not in defined:
                raise GraphError(f"mutations[{i}]: undefined value %{m.value}")
            dst, src = self.inputs[m.input].meta, self.metas[m.value]
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise GraphError(
                    f"mutations[{i}]: value %{m.value} ({src}) cannot be written into input "
                    f"{self.inputs[m.input].name!r} ({dst})"
                )

    # -- display ---------------------------------------------------------------------------

    def __str__(self) -> str:
        from .ops import op_info

        lines = [f"graph {self.name}("]
        for inp in self.inputs:
            extra = f" {inp.role}" + (f" {inp.target}" if inp.target else "")
            shared = [j.name for j in self.inputs if j.storage == inp.storage and j is not inp]
            if shared:
                extra += f" shares storage with {', '.join(shared)}"
            if inp.final_layout is not None:
                extra += f", final layout {inp.final_layout}"
            lines.append(f"    %{inp.name}: {inp.meta}{extra}")
        lines.append("):")
        for c in self.constants:
            lines.append(f"    constant %{c.name}: {c.meta}")
        for node in self.nodes:
            metas = ", ".join(str(m) for m in node.metas if m is not None)
            lines.append(f"    {node}  # {op_info(node.op).kind.name} -> {metas}")
        for m in self.mutations:
            lines.append(f"    write-back: {self.inputs[m.input].name} <- %{m.value}")
        outs = []
        for k, (o, a) in enumerate(zip(self.outputs, self.output_aliases)):
            note = " (as a number)" if k in self.scalar_outputs else ""
            if a is not None:
                tgt = self.inputs[a.index].name if a.source == "input" else f"output {a.index}"
                note = f" (view of {tgt})"
            outs.append(f"%{o}{note}")
        lines.append(f"    return {', '.join(outs)}")
        return "\n".join(lines)


def _check_final_layout(inp: GraphInput, where: str) -> None:
    final = inp.final_layout
    assert final is not None
    if inp.role != "user":
        raise GraphError(f"{where}: only a user input's layout may change (this one is a {inp.role})")
    if final.dtype != inp.meta.dtype or final.device != inp.meta.device:
        raise GraphError(f"{where}: {final} on {final.device} changes the dtype or device of {inp.meta} on "
                         f"{inp.meta.device}")
    if not within(final, inp.meta):
        raise GraphError(f"{where}: {final} reaches outside the storage elements of the input ({inp.meta})")


def view_roots(graph: FusionGraph, include_maybe_copies: bool = True) -> dict[str, str]:
    """For every value made by a chain of view ops, the value the chain starts from.

    ``reshape`` is a view only when its input's layout allows one: it counts as a view with
    ``include_maybe_copies`` (the safe side when asking "who can see this storage") and not
    without (the safe side when asking "is this output a view"). The dict is shared: read only.
    """
    from .ops import OpKind, op_info

    # a graph is frozen: computed once per graph and flag (the compile, alias and segment passes
    # each asked for it again, 0.1-0.2 s a time on 100k nodes); callers only read the dict
    cache = graph.__dict__.setdefault("_view_roots", {})
    if include_maybe_copies in cache:
        return cache[include_maybe_copies]
    roots: dict[str, str] = {}
    cache[include_maybe_copies] = roots
    for node in graph.nodes:
        if not node.inputs or op_info(node.op).kind != OpKind.VIEW:
            continue
        if node.op == "aten.reshape.default" and not include_maybe_copies:
            continue
        base = roots.get(node.inputs[0], node.inputs[0])
        for o in node.outputs:
            if o is not None:
                roots[o] = base
    return roots

