"""Metadata mutation of inputs: ``a.t_()``, ``a.unsqueeze_(0)``, ``a.as_strided_(...)``, ``a.resize_(...)``.

Note [metadata mutation]: an in-place view op changes the caller's tensor object itself (its
sizes, strides, offset), and a later data write goes through the new layout into the same
storage. torch.export misreads this (it returns the new value in the new layout as if it were a
plain write-back, or fails inside with "list index out of range"), and ``make_fx(functionalize())``
leaves an ``as_strided_`` on the placeholder. So capture runs the program once on FakeTensors
under ``watch_layouts``, which records which inputs end with another layout and the first op
that changed each. Such a program is then traced with those arguments replaced by
``aten.alias`` of themselves: the in-place view ops change the alias's metadata, not the input's,
and every data write reaches the input through the alias as an ordinary mutation in the input's
own layout. The graph records the layout the input ends with (``GraphInput.final_layout``), and
the run applies it to the caller's tensor with ``as_strided_`` after the write-back
(segmenter/capturing/reference.py ``finish``), as eager leaves it: same storage, same bytes, new layout.

What is refused (before anything runs, naming the op and the input): an input given another
storage (``set_``, a ``resize_`` that outgrows its storage), and a final layout that reaches
storage elements the input did not address (``as_strided_`` beyond the view): a functional graph
over the input's elements cannot say what those hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..ir.elements import within
from ..ir.graph import TensorMeta
from ..ir.ops import op_name

__all__ = ["ForeignWrite", "LayoutChange", "LayoutWatch", "refusal", "watch_layouts"]


@dataclass(frozen=True)
class LayoutChange:
    """Watched tensor ``index`` ended with layout ``after`` (it began with ``before``)."""

    index: int
    op: str  # the first op that changed it
    before: TensorMeta
    after: TensorMeta
    new_storage: bool


def _state(t: torch.Tensor) -> tuple:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.untyped_storage()._cdata


class ForeignWrite(RuntimeError):
    """A program run on real copies writes to a tensor it was not given (a global, a closure's)."""


class _Recorder(TorchDispatchMode):
    """Notes, per watched tensor object, the ops that changed its metadata. With ``writable``, every
    write must go to one of those storages or to one the run made: anything else is the
    caller's, and is refused before it is written."""

    supports_higher_order_operators = True  # auto_functionalized & co. pass through (they write nothing)

    def __init__(self, watched: dict[int, int], writable: set[int] | None = None) -> None:
        super().__init__()
        self.watched = watched
        self.writable = writable
        self.ops: dict[int, str] = {}
        self.failed: tuple[str, int | None] | None = None  # the op that raised, and its watched input

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's hook
        kwargs = kwargs or {}
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        index = self.watched.get(id(target)) if target is not None else None
        before = _state(target) if index is not None else None
        try:
            if self.writable is not None:
                self._check_writes(func, args, kwargs)
            out = func(*args, **kwargs)
        except Exception:
            if self.failed is None:
                self.failed = (op_name(func), index)
            raise
        if index is not None and index not in self.ops and _state(target) != before:
            self.ops[index] = op_name(func)
        if self.writable is not None:
            self.writable.update(t.untyped_storage()._cdata for t in pytree.tree_leaves(out)
                                 if isinstance(t, torch.Tensor) and t.layout == torch.strided)
        return out

    def _check_writes(self, func: object, args: tuple, kwargs: dict) -> None:
        schema = getattr(func, "_schema", None)
        for i, a in enumerate(schema.arguments if schema is not None else ()):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for t in pytree.tree_leaves(value):
                if (isinstance(t, torch.Tensor) and t.layout == torch.strided
                        and t.untyped_storage()._cdata not in self.writable):  # type: ignore[operator]
                    raise ForeignWrite(f"it writes to a tensor the program was not given (argument {a.name!r}: "
                                       "a global or a closure's tensor); capture does not run that")


class LayoutWatch:
    def __init__(self, tensors: Sequence[object], guard_writes: bool = False) -> None:
        self.tensors = list(tensors)
        self.before = {i: (TensorMeta.from_tensor(t), t.untyped_storage(), _state(t))
                       for i, t in enumerate(tensors) if isinstance(t, torch.Tensor)}
        writable = {t.untyped_storage()._cdata for t in tensors if isinstance(t, torch.Tensor)} if guard_writes else None
        self.recorder = _Recorder({id(t): i for i, t in enumerate(tensors) if isinstance(t, torch.Tensor)}, writable)

    def changes(self) -> list[LayoutChange]:
        """The watched tensors whose layout or storage differs from before the run."""
        out = []
        for i, (meta, _storage, state) in self.before.items():
            t = self.tensors[i]
            if _state(t) != state:
                out.append(LayoutChange(i, self.recorder.ops.get(i, "an in-place view op"), meta,
                                        TensorMeta.from_tensor(t, device=meta.device), t.untyped_storage()._cdata != state[3]))
        return out

    def restore(self) -> None:
        """Put every watched tensor back as it was (the caller's FakeTensors are reused later)."""
        for i, (meta, storage, state) in self.before.items():
            t = self.tensors[i]
            if _state(t) != state:
                with torch.no_grad():
                    t.set_(storage, meta.storage_offset, meta.shape, meta.stride)


@contextmanager
def watch_layouts(tensors: Sequence[object], mode: TorchDispatchMode | None) -> Iterator[LayoutWatch]:
    """Run the body under ``mode`` (a FakeTensorMode, or None for real copies of the inputs) with
    the in-place metadata changes of ``tensors`` recorded, and writes to any tensor but those and
    what the run makes refused before they happen (``ForeignWrite``: FakeTensorMode runs an op
    on real tensors for real, so a global's ``add_`` would land). Read ``changes()``, and anything
    that depends on the new layouts, inside the block: on leaving it every tensor is put back."""
    watch = LayoutWatch(tensors, guard_writes=True)
    try:
        with mode or nullcontext(), watch.recorder:  # the recorder innermost: it sees each op before the kernel
            yield watch
    finally:
        watch.restore()


def refusal(change: LayoutChange, name: str) -> str | None:
    """Why a metadata change cannot be captured (None: it can; see Note [metadata mutation])."""
    if change.new_storage:
        return (f"{change.op} on input {name!r} gives it another storage ({change.before} -> {change.after}): "
                "a graph cannot make the caller's tensor refer to other memory")
    if not within(change.after, change.before):
        return (f"{change.op} on input {name!r} makes it address storage outside its elements "
                f"({change.before} -> {change.after}): not supported")
    return None
