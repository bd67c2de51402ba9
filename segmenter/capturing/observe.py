"""What the original program does, seen by running it once on FakeTensors (or on real copies).

Capture exports the program, but an exported program is functional and its outputs flat: which
outputs share a storage with an input (Note [what export loses] in segmenter/capturing/from_torch.py), which
inputs end with another layout (Note [metadata mutation]), and what the program returns beyond
tensors (Note [model outputs]) are read here, from the program as written; and matched with
the export afterwards.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)

from ..ir.graph import GraphInput, ValueRef
from .fx_import import CaptureError, ScalarRead
from .meta import fake_mode, uncached
from .metadata_mutation import LayoutChange, refusal, watch_layouts
from .outputs import FlatOutputs, output_tensors
from .recorded import overlaps_itself
from .reference import clone_inputs

__all__ = ["Observed", "check_write_back", "module_state", "observe", "user_outputs"]


def module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = dict(module.named_parameters(remove_duplicate=False))
    state.update(module.named_buffers(remove_duplicate=False))
    return state


@dataclasses.dataclass
class Observed:
    """What the program does when run on FakeTensors."""

    user: list[torch.Tensor]  # the fakes standing for the user's tensors
    fake: Callable[[torch.Tensor], torch.Tensor]  # the fake standing for any other tensor
    changes: list[LayoutChange]  # user tensors whose metadata it changes
    flat: FlatOutputs  # how its outputs flatten to tensors


def observe(
    program: torch.nn.Module, user: Sequence[torch.Tensor], kwargs: Mapping[str, Any], names: Sequence[str | None],
    graph_name: str, shared: bool,
) -> Observed:
    """Run the original program on FakeTensor copies (no compute, no memory): which outputs
    share a storage with an input (Note [what export loses]), and which inputs end with
    another layout (Note [metadata mutation]); refuse what cannot be captured.

    A program that needs its inputs' values to run (a data-dependent check, as ``istft`` makes;
    ``x.item()``) is run once on real copies of its inputs and weights instead, where those are
    real. In both runs a write to any tensor the program
    was not given is refused before it happens (the caller's globals stay as they were)."""
    state = module_state(program)
    existing = next((t.fake_mode for t in (*user, *state.values()) if isinstance(t, FakeTensor)), None)
    mode = existing or fake_mode(allow_non_fake_inputs=True)  # a module's plain tensor attributes

    def fake(t: torch.Tensor) -> torch.Tensor:
        return t if isinstance(t, FakeTensor) else mode.from_tensor(t)

    fake_user = [fake(t) for t in user]
    fake_state = {k: fake(v) for k, v in state.items()}
    try:
        with uncached(mode, enter=False):  # a handed mode's cache too (Note [fake tensor cache])
            seen = _run_watched(program, fake_user, fake_state, kwargs, mode, fake, graph_name)
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        op = str(e).strip() or type(e).__name__
        tensors = [*user, *state.values()]
        if any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors):
            raise CaptureError(f"{graph_name}: {op} needs the values of its inputs, and the example inputs or "
                               "weights are fake or on meta: capture with real tensors") from None
        copies = clone_inputs(tensors)
        real_user, real_state = copies[:len(user)], dict(zip(state, copies[len(user):]))
        originals = {id(t): c for t, c in zip(tensors, copies)}
        with torch.no_grad():  # capture() keeps the caller's random state around all of this
            seen = _run_watched(program, real_user, real_state, kwargs, None, lambda t: originals.get(id(t), t),
                                graph_name)
    state_names = list(fake_state)
    for c in seen.changes:
        if c.index >= len(fake_user):
            target = state_names[c.index - len(fake_user)]
            raise CaptureError(f"{graph_name}: {c.op} changes the layout of {target!r} of the module: not supported")
        name = names[c.index] if c.index < len(names) and names[c.index] else f"argument {c.index}"
        why = refusal(c, name)
        if why is None and shared:
            why = f"{c.op} on input {name!r}, which shares a storage with another input: not supported"
        if why is not None:
            raise CaptureError(f"{graph_name}: {why}")
    return seen


def _run_watched(
    program: torch.nn.Module, user: list[torch.Tensor], state: dict[str, torch.Tensor], kwargs: Mapping[str, Any],
    mode: FakeTensorMode | None, stand_in: Callable[[torch.Tensor], torch.Tensor], graph_name: str,
) -> Observed:
    with watch_layouts([*user, *state.values()], mode) as watch:
        try:
            out = torch.func.functional_call(program, state, tuple(user), dict(kwargs))
        except (CaptureError, DataDependentOutputException, DynamicOutputShapeException):
            raise
        except Exception as e:  # noqa: BLE001 - the program's own error, with the op named
            op, _ = watch.recorder.failed or ("the program", None)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            on = "FakeTensors" if mode is not None else "copies of the inputs"
            raise CaptureError(f"{graph_name}: {op} failed when run on {on}: {type(e).__name__}: {first}") from e
        flat = output_tensors(out)
        for path, v in flat.leaves:
            if isinstance(v, torch.Tensor) and v.layout != torch.strided:
                raise CaptureError(f"{graph_name}: {path} is a {v.layout} tensor: only strided tensors are supported")
        changes = watch.changes()
        # an output that is an input object itself keeps its final layout after the restore
        watched = {id(t) for t in (*user, *state.values())}
        flat.leaves = [(p, v.as_strided(v.shape, v.stride(), v.storage_offset()) if id(v) in watched else v)
                       for p, v in flat.leaves]
    return Observed(user, stand_in, changes, flat)


def check_write_back(inp: GraphInput, value: str, conv: Any, seen: Observed, user_index: int | None,
                      graph_name: str) -> None:
    """A write-back must fit the input; where it does not, export has read a change of the
    input's layout as a write (``resize_as_``): refuse, naming the op. An input whose elements
    share memory (a stride-0 dim) cannot take a write-back at all: eager's write through a view
    reaches every element that shares the memory, the functional value only the one written (the
    loader refuses such a graph with the same words: segmenter/capturing/recorded.py)."""
    if overlaps_itself(inp.meta):
        raise CaptureError(f"{graph_name}: input {inp.name!r} ({inp.meta}) is written, and its elements that share "
                           "memory cannot be written back as eager writes them: not supported (clone() the input)")
    meta = next((m for n in conv.nodes for o, m in zip(n.outputs, n.metas) if o == value), None)
    if meta is None or (meta.shape == inp.meta.shape and meta.dtype == inp.meta.dtype):
        return
    op = next((c.op for c in seen.changes if c.index == user_index), "an in-place op")
    raise CaptureError(f"{graph_name}: {op} on input {inp.name!r} changes its layout ({inp.meta} -> {meta}) in a way "
                       "torch.export records as a write of another shape: not supported")


def user_outputs(
    returned: list[Any], flat: FlatOutputs, graph_name: str,
) -> tuple[list[str], list[int], list[torch.Tensor | None]]:
    """The graph's outputs from export's, matched with what eager returned (Note [model outputs]):
    tensors; numbers read back with ``.item()`` (returned as numbers: ``scalar_outputs``); and
    literals, the same at every call, left out and named in a warning with what else was."""
    if len(returned) != len(flat.leaves):
        raise CaptureError(f"{graph_name}: eager returned {len(flat.leaves)} values but the exported graph "
                           f"{len(returned)}")
    outputs: list[str] = []
    scalars: list[int] = []
    eager: list[torch.Tensor | None] = []  # per output, the eager tensor (None for numbers)
    dropped = list(flat.dropped)
    for out, (path, value) in zip(returned, flat.leaves):
        if isinstance(out, ValueRef):
            if not isinstance(value, torch.Tensor):
                raise CaptureError(f"{graph_name}: {path} is a {type(value).__name__} in eager, a tensor in the graph")
            outputs.append(out.name)
            eager.append(value)
        elif isinstance(out, ScalarRead):
            scalars.append(len(outputs))
            outputs.append(out.tensor.name)
            eager.append(None)
        else:
            dropped.append(f"{path} ({type(value).__name__})")
    if dropped or flat.objects:
        said = [f"flattened to their tensors: {', '.join(flat.objects)}"] if flat.objects else []
        said += [f"left out (not tensors): {', '.join(dropped)}"] if dropped else []
        warnings.warn(f"{graph_name}: the graph's outputs are the tensors the program returns; " + "; ".join(said),
                      stacklevel=4)
    return outputs, scalars, eager
