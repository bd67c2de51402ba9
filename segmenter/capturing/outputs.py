"""What a program returns, as the graph's list of outputs.

Note [model outputs]: a graph's outputs are a flat list of tensors. torch.export flattens tuples,
lists, dicts and registered pytree nodes (transformers registers its ``ModelOutput`` classes) but
stops at anything else, and a transformers model with its config's default ``use_cache`` returns a
``DynamicCache`` holding the keys and values it computed. ``output_tensors`` flattens what the
program returned the same way for every object: tensors in order; tuples, lists and mappings
(``ModelOutput`` included) element by element; any other plain object (a cache, its layers)
through its attributes in definition order, where the tensors sit (a DynamicCache gives, per
layer, its keys then its values). Modules are not entered. What is not a tensor (None, numbers,
strings, a cache's dtype and flags) is not a tensor output: numbers the program computed
(``x.sum().item()``) come back as numbers, other leaves of the returned structure are left out and
named in a warning; attributes of objects other than tensors are bookkeeping and left out silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch.utils import _pytree as pytree

__all__ = ["FlatOutputs", "output_tensors"]

_MAX_DEPTH = 8  # objects inside objects: a cache holds layers; deeper is not a program's output


_VALUES = (bool, int, float, complex, str)  # leaves torch.export returns as they are


@dataclass
class FlatOutputs:
    # every leaf in order: tensors, and the numbers and strings of the returned structure
    leaves: list[tuple[str, object]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # "output.x (dtype)": leaves that are no value at all
    objects: list[str] = field(default_factory=list)  # "output.past_key_values (DynamicCache)": flattened
    # True when torch.export could not flatten the structure by itself (an object in it)
    needs_flattening: bool = False

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [v for _, v in self.leaves if isinstance(v, torch.Tensor)]


def output_tensors(out: object) -> FlatOutputs:
    """The tensors of ``out`` in order (Note [model outputs])."""
    flat = FlatOutputs()
    seen: set[int] = set()

    def walk(x: object, path: str, depth: int, in_object: bool) -> None:
        if isinstance(x, torch.Tensor):
            flat.leaves.append((path, x))
            return
        if isinstance(x, _VALUES):
            if not in_object:  # inside an object: bookkeeping (a cache's flags), not a result
                flat.leaves.append((path, x))
            return
        if depth > _MAX_DEPTH or id(x) in seen:
            return
        if isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]", depth + 1, in_object)
            return
        if isinstance(x, Mapping):
            for k, v in x.items():
                walk(v, f"{path}.{k}" if isinstance(k, str) and k.isidentifier() else f"{path}[{k!r}]", depth + 1,
                     in_object)
            return
        node = pytree.SUPPORTED_NODES.get(type(x))
        if node is not None:  # another type torch's pytree flattens: one level of it
            children, _ = node.flatten_fn(x)
            for i, v in enumerate(children):
                walk(v, f"{path}[{i}]", depth + 1, in_object)
            return
        if hasattr(x, "__dict__") and not isinstance(x, (torch.nn.Module, type)) and not callable(x):
            seen.add(id(x))
            before = len(flat.leaves)
            for k, v in vars(x).items():
                walk(v, f"{path}.{k}", depth + 1, True)
            flat.needs_flattening = True
            if not in_object and len(flat.leaves) > before:
                flat.objects.append(f"{path} ({type(x).__name__}: {len(flat.leaves) - before} tensors)")
            elif not in_object:
                flat.dropped.append(f"{path} ({type(x).__name__})")
            return
        if not in_object and x is not None:  # a dtype, a device...: export could not return it either
            flat.dropped.append(f"{path} ({type(x).__name__})")
            flat.needs_flattening = True

    walk(out, "output", 0, False)
    return flat
