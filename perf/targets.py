"""Resolve a CLI target: a JSON file, a built-in example, or module:factory."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from segmenter import FusionGraph
from segmenter.capturing.from_torch import capture
from segmenter.formats.nvfuser.importer import NvFuserFusion, read_nvfuser
from segmenter.formats.serialize import load

from . import fusions, zoo

__all__ = ["Target", "TargetError", "from_factory", "load_program", "load_target"]


class TargetError(ValueError):
    """A target that names nothing we can load."""


@dataclass
class Target:
    graph: FusionGraph
    fn: Any = None  # the program, where there is one (not for a JSON graph)
    inputs: list[Any] | None = None  # its example inputs
    nvfuser: NvFuserFusion | None = None  # what an nvFuser script was bound to (sizes, device)

    @property
    def module(self) -> torch.nn.Module | None:
        return self.fn if isinstance(self.fn, torch.nn.Module) else None


def from_factory(result: Any, where: str) -> Target:
    """A target from a factory's result, ``(fn_or_module, example_inputs[, example_kwargs])``, captured."""
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise TargetError(f"{where} must return (fn_or_module, example_inputs[, example_kwargs])")
    fn, inputs, *rest = result
    kwargs = rest[0] if rest else None
    return Target(capture(fn, list(inputs), example_kwargs=kwargs, name=where), fn, list(inputs))


def _nvfuser_script(path: str) -> Target:
    """An nvFuser Python-frontend script, read as data (segmenter/formats/nvfuser/script.py): never imported."""
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read(1 << 25)
    except UnicodeDecodeError as e:
        raise TargetError(f"{path}: not text: {e.reason}") from None
    fusion = read_nvfuser(source, warn=False)  # the CLI prints its notes
    return Target(fusion.graph, nvfuser=fusion)


def load_program(spec: str, real_size: bool = False) -> Target:
    """``real_size``: an ``hf:`` target at its config's own sizes, on the meta device (perf/hf.py)."""
    if spec.startswith("hf:"):
        from . import hf

        try:
            model, inputs = hf.build(spec, real_size=real_size)
        except hf.HfSpecError as e:
            raise TargetError(str(e)) from None
        return from_factory((model, inputs), spec)
    if spec in fusions.FUSIONS:
        return _nvfuser_script(fusions.path_of(spec))
    if spec.endswith(".py"):
        if not os.path.isfile(spec):
            raise TargetError(f"no such file: {spec}")
        return _nvfuser_script(spec)
    if spec.endswith(".json") or os.path.isfile(spec):
        if not os.path.isfile(spec):
            raise TargetError(f"no such file: {spec}")
        return Target(load(spec))
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise TargetError(f"cannot import {mod_name!r}: {e}") from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise TargetError(f"{mod_name!r} has no callable {attr!r}")
        return from_factory(factory(), spec)
    try:
        entry = zoo.get(spec)
    except KeyError as e:
        raise TargetError(str(e.args[0])) from None
    return from_factory(entry.factory(), entry.name)


def load_target(spec: str) -> FusionGraph:
    return load_program(spec).graph
