"""Resolve a CLI target to a FusionGraph: a JSON file, a built-in example, or module:factory."""

from __future__ import annotations

import importlib
import os
from typing import Any

from segmenter import FusionGraph, GraphError
from segmenter.from_torch import capture
from segmenter.serialize import load

from . import zoo

__all__ = ["TargetError", "load_target"]


class TargetError(ValueError):
    """A target that names nothing we can load."""


def _from_factory(result: Any, where: str) -> FusionGraph:
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise TargetError(f"{where} must return (fn_or_module, example_inputs[, example_kwargs])")
    fn, inputs, *rest = result
    kwargs = rest[0] if rest else None
    return capture(fn, list(inputs), example_kwargs=kwargs, name=where)


def load_target(spec: str) -> FusionGraph:
    if spec.endswith(".json") or os.path.isfile(spec):
        if not os.path.isfile(spec):
            raise TargetError(f"no such file: {spec}")
        return load(spec)
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise TargetError(f"cannot import {mod_name!r}: {e}") from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise TargetError(f"{mod_name!r} has no callable {attr!r}")
        return _from_factory(factory(), spec)
    try:
        entry = zoo.get(spec)
    except KeyError as e:
        raise TargetError(str(e.args[0])) from None
    graph = _from_factory(entry.factory(), entry.name)
    if not isinstance(graph, FusionGraph):  # pragma: no cover - capture always returns one
        raise GraphError(f"{spec}: not a FusionGraph")
    return graph
