"""FusionGraph <-> JSON, with a versioned schema, so another fuser can hand us a graph.

Schema "fusion-segmenter/graph", version 1::

    {"schema": "fusion-segmenter/graph", "version": 1, "name": str,
     "inputs":  [{"name": str, "meta": META, "role": "user"|"parameter"|"buffer"|"constant"|"storage",
                  "target": str|null, "storage": int, "final_layout": META (optional)}],
     "nodes":   [{"name": str, "op": "aten.add.Tensor", "args": [ARG...], "kwargs": {str: ARG},
                  "outputs": [str|null...], "metas": [META|null...]}],
     "outputs": [str...],
     "output_aliases": [null | {"source": "input"|"output", "index": int, "layout": META|null}...],
     "mutations": [{"input": int, "value": str}...],
     "constants": [{"name": str, "meta": META, "data": str|null}...],   (optional)
     "scalar_outputs": [int...],   (optional: outputs handed back as Python numbers, ``t.item()``)
     "symbols": {name: {"hint": int, "min": int, "max": int}}}   (optional: Note [symbols in graph files])

    META = {"shape": [SIZE], "stride": [SIZE], "storage_offset": SIZE, "dtype": "float32", "device": "cpu",
            "conj": bool, "neg": bool}   (conj/neg optional, false when absent: torch's lazy view bits)
    ARG  = int | float | bool | null | str | [ARG...]
         | {"value": name}            a tensor value
         | {"op": "mylib.foo.default"}  an op (the custom op inside auto_functionalized)
         | {"dtype": "bfloat16"} | {"device": "cuda:0"} | {"layout": "strided"}
         | {"memory_format": "contiguous_format"} | {"float": "inf"|"-inf"|"nan"}
         | {"complex": [re, im]}          re, im: a number or {"float": ...}
         | {"size": SIZE}                  a size (where the schema takes an int)
    SIZE = int | str                     str: an expression of declared symbols ("64*S"): symbolic_json.py

``constants``: tensors the graph holds by value, used by name like inputs. ``meta`` is contiguous
at offset 0 with a dtype whose elements are plain bytes; ``data`` is the base64 (RFC 4648, with
padding) of the elements' bytes in row-major order, each element little-endian (exactly
numel * itemsize bytes), or null where the graph was captured without values (on meta/fake
tensors: such a graph can be segmented, not run). All constants of a file together are bounded
(``MAX_CONSTANT_BYTES``). Inputs with the same ``storage`` share one storage in the caller. ``final_layout``: the layout
(same storage, absolute offset) a user input ends with where the program changed its metadata
(``a.t_()``); it may address only storage elements that ``meta`` addresses. Nodes may come in any order;
they are sorted topologically, and a cycle is an error naming its nodes. Every error names the
field that is wrong (``nodes[3] ("add_1").args[0]: ...``); nothing half-loaded survives. An op
unknown to the op table loads with a warning and runs as OPAQUE (one torch does not have is
refused when the graph is compiled). A graph may hold in-place nodes (``aten.add_.Tensor``): it
is functionalized on the way in (segmenter/capturing/functionalize.py), and its output aliasing and
write-backs are then read from what its in-place ops do.

A file is untrusted input, and these checks run whatever the loader's flags: names and sizes
(segmenter/ir/limits.py), op names (Note [op names are data] in segmenter/ir/ops.py), each node's
arguments against its op's schema (segmenter/ir/schema.py), and the recorded aliasing, write-backs
and shared storages against the ops (Note [an alias claim must hold] in segmenter/capturing/recorded.py).
``check_metas`` adds the check of every recorded shape, stride and dtype against the ops.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import heapq
import json
import math
import warnings
from typing import Any

import torch

from ..capturing.functionalize import functionalize
from ..capturing.recorded import check_recorded_effects
from ..ir.constants import BYTE_DTYPES
from ..ir.graph import (
    Alias,
    Arg,
    FusionGraph,
    GraphConstant,
    GraphError,
    GraphInput,
    Mutation,
    Node,
    OpRef,
    TensorMeta,
    ValueRef,
)
from ..ir.limits import (
    MAX_BYTES,
    MAX_DIM,
    MAX_NESTING,
    MAX_RANK,
    MAX_STRING,
    MAX_VIEW_DEPTH,
    keyword_problem,
    name_problem,
    view_depth_problem,
)
from ..ir.ops import op_info, op_name_problem, op_refusal, resolve_op
from ..ir.schema import args_problem
from ..ir.symbolic import symbolic_hashing
from .symbolic_json import at_maxima, declared, size_in, size_out, symbols_in, symbols_out

__all__ = ["MAX_VIEW_DEPTH", "SCHEMA", "SCHEMA_VERSION", "GraphFormatError", "dump", "from_json", "graph_from_dict", "graph_to_dict",
           "load", "to_json"]

SCHEMA = "fusion-segmenter/graph"
SCHEMA_VERSION = 1
# quantized dtypes (qint8, quint4x2, ...) are left out: no FakeTensor of them can be made
_DTYPES = {name: d for d in vars(torch).values() if isinstance(d, torch.dtype)
           for name in [str(d).removeprefix("torch.")] if not name.startswith(("qint", "quint"))}
_LAYOUTS = {str(x).removeprefix("torch."): x for x in vars(torch).values() if isinstance(x, torch.layout)}
_FORMATS = {str(x).removeprefix("torch."): x for x in vars(torch).values() if isinstance(x, torch.memory_format)}
_ROLES = ("user", "parameter", "buffer", "constant", "storage")


class GraphFormatError(GraphError):
    """A graph file that cannot be loaded; the message names the field that is wrong."""


# -- writing ---------------------------------------------------------------------------------

def _meta_out(m: TensorMeta | None) -> dict[str, Any] | None:
    if m is None:
        return None
    out = {"shape": [size_out(x) for x in m.shape], "stride": [size_out(x) for x in m.stride],
           "storage_offset": size_out(m.storage_offset),
           "dtype": str(m.dtype).removeprefix("torch."), "device": m.device}
    for bit in ("conj", "neg"):  # written only when set: files without them read as before
        if getattr(m, bit):
            out[bit] = True
    return out


def _arg_out(a: Arg) -> Any:
    if isinstance(a, ValueRef):
        return {"value": a.name}
    if isinstance(a, torch.SymInt):  # Note [symbols in graph files]
        return {"size": size_out(a)}
    if isinstance(a, OpRef):
        return {"op": a.name}
    if isinstance(a, tuple):
        return [_arg_out(x) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).removeprefix("torch.")}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a).removeprefix("torch.")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).removeprefix("torch.")}
    if isinstance(a, float) and not math.isfinite(a):
        return {"float": "nan" if math.isnan(a) else ("inf" if a > 0 else "-inf")}
    if isinstance(a, complex):
        return _complex_out(a)
    return a


def graph_to_dict(g: FusionGraph) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "version": SCHEMA_VERSION, "name": g.name,
        "inputs": [{"name": i.name, "meta": _meta_out(i.meta), "role": i.role, "target": i.target,
                    "storage": i.storage, **_final_layout_out(i)} for i in g.inputs],
        "nodes": [{"name": n.name, "op": n.op, "args": [_arg_out(a) for a in n.args],
                   "kwargs": {k: _arg_out(v) for k, v in n.kwargs}, "outputs": list(n.outputs),
                   "metas": [_meta_out(m) for m in n.metas]} for n in g.nodes],
        "outputs": list(g.outputs),
        "output_aliases": [None if a is None else {"source": a.source, "index": a.index, "layout": _meta_out(a.layout)}
                           for a in g.output_aliases],
        "mutations": [{"input": m.input, "value": m.value} for m in g.mutations],
        **_constants_out(g),
        **_scalar_outputs_out(g),
        **symbols_out(g),
    }


def to_json(g: FusionGraph, indent: int | None = None) -> str:
    return json.dumps(graph_to_dict(g), indent=indent, allow_nan=False)


def dump(g: FusionGraph, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(g, indent=1) + "\n")


# -- reading ---------------------------------------------------------------------------------

def _need(d: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise GraphFormatError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise GraphFormatError(f"{where}.{key}: missing")
    v = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise GraphFormatError(f"{where}.{key}: expected {names}, got {type(v).__name__}")
    return v


def _valid(v: Any, problem: str | None, where: str) -> Any:
    """``v``, or GraphFormatError naming ``where`` when a check found a ``problem``."""
    if problem is not None:
        raise GraphFormatError(f"{where}: {problem}")
    return v


def _name(v: Any, where: str) -> str:
    return _valid(v, name_problem(v), where)


def _need_name(d: Any, key: str, where: str) -> str:
    return _name(_need(d, key, str, where), f"{where}.{key}")


def _op_name(v: Any, where: str) -> str:
    return _valid(v, op_name_problem(v) or op_refusal(v), where)  # refusal only of a well-formed name


def _kwarg_name(k: str, where: str) -> str:
    return _valid(k, keyword_problem(k), where)


def _ints(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        if isinstance(v, list) and all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in v):
            return tuple(_size(x, f"{where}[{i}]") for i, x in enumerate(v))  # Note [symbols in graph files]
        raise GraphFormatError(f"{where}: expected a list of integers")
    return tuple(v)


def _size(v: Any, where: str) -> Any:
    try:
        return size_in(v)
    except GraphError as e:
        raise GraphFormatError(f"{where}: {e}") from None


def _meta_in(d: Any, where: str) -> TensorMeta:
    shape = _ints(_need(d, "shape", list, where), f"{where}.shape")
    stride = _ints(_need(d, "stride", list, where), f"{where}.stride")
    offset = _size(_need(d, "storage_offset", (int, str), where), f"{where}.storage_offset")
    if isinstance(offset, bool):
        raise GraphFormatError(f"{where}.storage_offset: expected int or str, got bool")
    dtype_name = _need(d, "dtype", str, where)
    device = _need(d, "device", str, where)
    if dtype_name not in _DTYPES:
        raise GraphFormatError(f"{where}.dtype: unknown dtype {dtype_name!r}")
    # (a symbolic size is bounded where it is read, at its symbols' maxima, and never negative)
    numbers = [x for x in (*shape, *stride, offset) if not isinstance(x, torch.SymInt)]
    if any(abs(x) > MAX_DIM for x in numbers):
        raise GraphFormatError(f"{where}: huge dimension (over 2**48) in shape/stride/offset")
    if len(shape) > MAX_RANK:
        raise GraphFormatError(f"{where}.shape: rank {len(shape)} (at most {MAX_RANK})")
    if any(s < 0 for s in stride if not isinstance(s, torch.SymInt)):  # torch has no negative strides
        raise GraphFormatError(f"{where}.stride: negative stride in {list(stride)}")
    try:
        torch.device(device)
    except RuntimeError:
        raise GraphFormatError(f"{where}.device: unknown device {device!r}") from None
    bits = {bit: _need(d, bit, bool, where) for bit in ("conj", "neg") if bit in d}
    try:
        meta = TensorMeta(shape, stride, offset, _DTYPES[dtype_name], device, **bits)
    except GraphError as e:
        raise GraphFormatError(f"{where}: {e}") from None
    extent = at_maxima(meta.storage_extent)
    if extent * meta.itemsize > MAX_BYTES:  # also bounds numel: no overflow in torch's int64
        raise GraphFormatError(f"{where}: addresses {extent * meta.itemsize} bytes of storage "
                               f"(at most 2**48{' at the symbols maxima' if extent != meta.storage_extent else ''})")
    return meta


def _arg_in(a: Any, where: str, depth: int = 0) -> Arg:
    if isinstance(a, str):
        if len(a) > MAX_STRING or not a.isprintable():
            raise GraphFormatError(f"{where}: a string argument must be printable and at most {MAX_STRING} characters")
        return a
    if isinstance(a, int) and not isinstance(a, bool) and not -(2**63) <= a < 2**63:
        raise GraphFormatError(f"{where}: integer {a} does not fit in 64 bits")
    if a is None or isinstance(a, (bool, int, float)):
        return a
    if isinstance(a, list):
        if depth >= MAX_NESTING:
            raise GraphFormatError(f"{where}: arguments nested more than {MAX_NESTING} deep")
        return tuple(_arg_in(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(a))
    if isinstance(a, dict) and len(a) == 1:
        (key, val), = a.items()
        if key == "value" and isinstance(val, str):
            return ValueRef(_name(val, where))
        if key == "op" and isinstance(val, str):
            return OpRef(_op_name(val, where))
        table = {"dtype": _DTYPES, "layout": _LAYOUTS, "memory_format": _FORMATS}.get(key)
        if table is not None and isinstance(val, str) and val in table:  # a list/object is unhashable
            return table[val]
        if key == "device" and isinstance(val, str):
            try:
                return torch.device(val)
            except RuntimeError:
                pass
        if key == "complex":
            return _complex_in(val, where)
        if key == "size" and isinstance(val, (int, str)) and not isinstance(val, bool):
            return _size(val, where)  # Note [symbols in graph files]
        if key == "float" and val in ("inf", "-inf", "nan"):
            # nan != nan: only the one math.nan object lets graphs compare equal (tuples check identity first)
            return math.nan if val == "nan" else float(val)
        raise GraphFormatError(f"{where}: bad {key!r} argument {val!r}")
    raise GraphFormatError(f"{where}: unsupported argument {json.dumps(a)[:60]}")


def _node_in(d: Any, k: int) -> Node:
    where = f"nodes[{k}]"
    name = _need_name(d, "name", where)
    where = f'nodes[{k}] ({json.dumps(name)})'
    op = _op_name(_need(d, "op", str, where), f"{where}.op")
    args = tuple(_arg_in(a, f"{where}.args[{i}]") for i, a in enumerate(_need(d, "args", list, where)))
    kwargs = tuple((_kwarg_name(key, f"{where}.kwargs"), _arg_in(v, f"{where}.kwargs.{key}"))
                   for key, v in _need(d, "kwargs", dict, where).items())
    outputs = _need(d, "outputs", list, where)
    metas = _need(d, "metas", list, where)
    found = resolve_op(op)
    if isinstance(found, torch._ops.OpOverload):
        problem = args_problem(found, op, args, kwargs)
        if problem is not None:
            field, message = problem
            raise GraphFormatError(f"{where}{'.' + field if field else ''}: {message}")
    if not all(o is None or isinstance(o, str) for o in outputs):
        raise GraphFormatError(f"{where}.outputs: expected names or null")
    for i, o in enumerate(outputs):
        if o is not None:
            _name(o, f"{where}.outputs[{i}]")
    if len(metas) != len(outputs):
        raise GraphFormatError(f"{where}.metas: {len(metas)} metas for {len(outputs)} outputs")
    metas_in = tuple(None if m is None else _meta_in(m, f"{where}.metas[{i}]") for i, m in enumerate(metas))
    try:
        return Node(name, op, args, kwargs, tuple(outputs), metas_in)
    except GraphError as e:
        raise GraphFormatError(f"{where}: {e}") from None


def _topological(nodes: list[Node], defined_outside: set[str]) -> list[Node]:
    """Kahn's algorithm, stable: file order wherever the dependencies allow it."""
    maker: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for o in n.outputs:
            if o is None:
                continue
            if o in maker or o in defined_outside:
                first = f"nodes[{maker[o]}]" if o in maker else "an input"
                raise GraphFormatError(f'nodes[{k}] ("{n.name}").outputs: value {o!r} defined twice (also by {first})')
            maker[o] = k
    for k, n in enumerate(nodes):
        for i, a in enumerate(n.args):
            for v in _refs(a):
                if v not in maker and v not in defined_outside:
                    raise GraphFormatError(f'nodes[{k}] ("{n.name}").args[{i}]: undefined value {v!r}')
        for key, a in n.kwargs:
            for v in _refs(a):
                if v not in maker and v not in defined_outside:
                    raise GraphFormatError(f'nodes[{k}] ("{n.name}").kwargs.{key}: undefined value {v!r}')
    deps = [{maker[v] for v in n.inputs if v in maker} for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    missing = [len(ds) for ds in deps]
    ready = [k for k, m in enumerate(missing) if m == 0]  # a heap: lowest file position first
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = [k for k in range(len(nodes)) if missing[k] > 0]
        raise GraphFormatError(f"cycle between nodes {_cycle(stuck, deps, nodes)}")
    return [nodes[k] for k in order]


def _cycle(stuck: list[int], deps: list[set[int]], nodes: list[Node]) -> str:
    left = set(stuck)
    k, path = stuck[0], []
    while k not in path:
        path.append(k)
        k = min(d for d in deps[k] if d in left)
    cyc = path[path.index(k):] + [k]
    return " -> ".join(repr(nodes[i].name) for i in reversed(cyc))


def _refs(a: Arg) -> list[str]:
    if isinstance(a, ValueRef):
        return [a.name]
    if isinstance(a, tuple):
        return [v for x in a for v in _refs(x)]
    return []


def _optional_list(d: dict[str, Any], key: str) -> list[Any]:
    """``output_aliases`` / ``mutations`` may be left out (or null) by a fuser that has none."""
    v = d.get(key)
    if v is not None and not isinstance(v, list):
        raise GraphFormatError(f"{key}: expected list, got {type(v).__name__}")
    return v or []


def graph_from_dict(d: Any) -> FusionGraph:
    if not isinstance(d, dict):
        raise GraphFormatError(f"top level: expected an object, got {type(d).__name__}")
    try:
        symbols = symbols_in(d.get("symbols"))
    except GraphError as e:
        raise GraphFormatError(f"symbols: {e}") from None
    # a file's sizes may be symbolic (Note [symbols in graph files]): read, hashed and decided on as such
    with declared(symbols), symbolic_hashing(symbols is not None):
        return _graph_from_dict(d)


def _graph_from_dict(d: dict[str, Any]) -> FusionGraph:
    if d.get("schema") != SCHEMA:
        raise GraphFormatError(f"schema: expected {SCHEMA!r}, got {d.get('schema')!r}")
    version = d.get("version")
    if type(version) is not int or version != SCHEMA_VERSION:  # True and 1.0 both == 1
        what = "missing" if "version" not in d else f"{json.dumps(version)} is not supported"
        raise GraphFormatError(f"version: {what} (supported: {SCHEMA_VERSION})")
    name = _need_name(d, "name", "graph")
    inputs = []
    for i, raw in enumerate(_need(d, "inputs", list, "graph")):
        where = f"inputs[{i}]"
        role = _need(raw, "role", str, where)
        if role not in _ROLES:
            raise GraphFormatError(f"{where}.role: {role!r} is not one of {', '.join(_ROLES)}")
        target = raw.get("target")
        if target is not None:
            _name(target, f"{where}.target")
        inputs.append(GraphInput(_need_name(raw, "name", where), _meta_in(_need(raw, "meta", dict, where), f"{where}.meta"),
                                 role, target, _need(raw, "storage", int, where),  # type: ignore[arg-type]
                                 _final_layout_in(raw, where)))
    nodes = [_node_in(n, k) for k, n in enumerate(_need(d, "nodes", list, "graph"))]
    outputs = _need(d, "outputs", list, "graph")
    for i, o in enumerate(outputs):
        _name(o, f"outputs[{i}]")
    aliases = []
    for i, a in enumerate(_optional_list(d, "output_aliases") or [None] * len(outputs)):
        if a is None:
            aliases.append(None)
            continue
        source = _need(a, "source", str, f"output_aliases[{i}]")
        if source not in ("input", "output"):
            raise GraphFormatError(f"output_aliases[{i}].source: {source!r} is not 'input' or 'output'")
        layout = a.get("layout")
        aliases.append(Alias(source, _need(a, "index", int, f"output_aliases[{i}]"),  # type: ignore[arg-type]
                             None if layout is None else _meta_in(layout, f"output_aliases[{i}].layout")))
    mutations = [Mutation(_need(m, "input", int, f"mutations[{i}]"), _need_name(m, "value", f"mutations[{i}]"))
                 for i, m in enumerate(_optional_list(d, "mutations"))]
    seen_nodes: dict[str, int] = {}
    for k, n in enumerate(nodes):
        first = seen_nodes.setdefault(n.name, k)
        if first != k:
            raise GraphFormatError(f"nodes[{k}]: duplicate node name {n.name!r} (also nodes[{first}])")
    constants = _constants_in(d)
    ordered = _topological(nodes, {i.name for i in inputs} | {c.name for c in constants})
    problem = view_depth_problem(ordered)
    if problem is not None:
        raise GraphFormatError(problem)
    for op in sorted({n.op for n in ordered if not op_info(n.op).known}):
        if resolve_op(op) is None:
            warnings.warn(f"unknown op {op}: torch has no such op; it loads as OPAQUE, and compiling the graph "
                          "will refuse it", stacklevel=3)
        else:
            warnings.warn(f"unknown op {op}: it will run as OPAQUE on torch", stacklevel=3)
    try:
        if any(op_info(n.op).mutates for n in ordered):
            if any(a is not None for a in aliases) or mutations or any(i.final_layout for i in inputs):
                raise GraphFormatError("a graph with in-place nodes must not also list output_aliases, mutations or "
                                       "final layouts: they are read from its in-place ops")
            defined = ({i.name for i in inputs} | {c.name for c in constants}
                       | {o for n in ordered for o in n.outputs if o is not None})
            for i, o in enumerate(outputs):
                if o not in defined:
                    raise GraphFormatError(f"outputs[{i}]: undefined value %{o}")
            graph = functionalize(name, inputs, ordered, outputs, constants)
            scalars = _scalar_outputs_in(d)
            if scalars:
                graph = dataclasses.replace(graph, scalar_outputs=scalars)
        else:
            graph = FusionGraph(tuple(inputs), tuple(ordered), tuple(outputs), tuple(aliases), tuple(mutations), name,
                                tuple(constants), _scalar_outputs_in(d))
        check_recorded_effects(graph)  # whatever the loader's flags: later stages believe these facts
        return graph
    except GraphFormatError:
        raise
    except GraphError as e:
        raise GraphFormatError(str(e)) from None


# -- scalar outputs ----------------------------------------------------------------------------

def _scalar_outputs_out(g: FusionGraph) -> dict[str, Any]:
    return {"scalar_outputs": list(g.scalar_outputs)} if g.scalar_outputs else {}


def _scalar_outputs_in(d: dict[str, Any]) -> tuple[int, ...]:
    """Indices of outputs handed back as Python numbers; the FusionGraph checks each is a
    one-element tensor output of its own."""
    v = _optional_list(d, "scalar_outputs")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise GraphFormatError("scalar_outputs: expected a list of output indices")
    return tuple(v)


# -- complex literals --------------------------------------------------------------------------

def _complex_out(c: complex) -> dict[str, Any]:
    """{"complex": [re, im]}, each part a JSON number or {"float": "inf"|"-inf"|"nan"}."""
    return {"complex": [_arg_out(c.real), _arg_out(c.imag)]}


def _complex_in(val: Any, where: str) -> complex:
    def part(p: Any, name: str) -> float:
        if isinstance(p, dict) and len(p) == 1 and p.get("float") in ("inf", "-inf", "nan"):
            return float(p["float"])
        if isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p):
            return float(p)
        raise GraphFormatError(f"{where}: complex {name} part {json.dumps(p)[:40]} is not a number")

    if not isinstance(val, list) or len(val) != 2:
        raise GraphFormatError(f"{where}: a complex argument is [real, imag], got {json.dumps(val)[:60]}")
    return complex(part(val[0], "real"), part(val[1], "imaginary"))


# -- optional input fields -------------------------------------------------------------------

def _final_layout_out(inp: GraphInput) -> dict[str, Any]:
    """``final_layout`` only where the program changes the input's layout (older files stay as they were)."""
    return {} if inp.final_layout is None else {"final_layout": _meta_out(inp.final_layout)}


def _final_layout_in(raw: dict[str, Any], where: str) -> TensorMeta | None:
    """The layout the caller's tensor ends with; the FusionGraph checks it against the input's
    (same dtype and device, no storage element the input did not address)."""
    final = raw.get("final_layout")
    return None if final is None else _meta_in(final, f"{where}.final_layout")


# -- constants ---------------------------------------------------------------------------------

MAX_CONSTANT_BYTES = 64 << 20  # all constants of one file together; a bigger tensor is a weight: pass it in


def _constants_out(g: FusionGraph) -> dict[str, Any]:
    """``constants`` only where the graph holds some (older files stay as they were)."""
    if not g.constants:
        return {}
    return {"constants": [{"name": c.name, "meta": _meta_out(c.meta),
                           "data": None if c.data is None else base64.b64encode(c.data).decode("ascii")}
                          for c in g.constants]}


def _constants_in(d: dict[str, Any]) -> list[GraphConstant]:
    """Each constant's meta is checked (known dtype held as plain bytes, contiguous, offset 0) and
    its size bounded before its data is decoded; the data must be exactly its elements' bytes."""
    out: list[GraphConstant] = []
    total = 0
    for i, raw in enumerate(_optional_list(d, "constants")):
        where = f"constants[{i}]"
        name = _need(raw, "name", str, where)
        if not (name.isidentifier() and name.isascii()):
            raise GraphFormatError(f"{where}.name: {name[:60]!r} is not an identifier")
        meta = _meta_in(_need(raw, "meta", dict, where), f"{where}.meta")
        if meta.dtype not in BYTE_DTYPES:
            raise GraphFormatError(f"{where}.meta.dtype: {meta.dtype} cannot be held as a constant")
        size = meta.numel * meta.itemsize
        total += size
        if total > MAX_CONSTANT_BYTES:
            raise GraphFormatError(f"{where}: {size} bytes, over the limit of {MAX_CONSTANT_BYTES} bytes for the "
                                   "constants of one graph (pass big tensors as inputs)")
        data = raw.get("data")
        if data is not None:
            if not isinstance(data, str):
                raise GraphFormatError(f"{where}.data: expected a base64 string or null, got {type(data).__name__}")
            if len(data) > 4 * (size // 3 + 1):
                raise GraphFormatError(f"{where}.data: {len(data)} characters of base64 for {size} bytes")
            try:
                data = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise GraphFormatError(f"{where}.data: not valid base64") from None
        try:
            out.append(GraphConstant(name, meta, data))
        except GraphError as e:
            raise GraphFormatError(f"{where}: {e}") from None
    return out


def from_json(text: str, check_metas: bool = True) -> FusionGraph:
    """The graph in ``text``. With ``check_metas`` (the default), every recorded shape, stride
    and dtype is checked against what torch computes for the op (FakeTensor propagation): a graph
    whose metadata contradicts its ops is refused, naming the node."""
    graph = _parse(text)
    if check_metas:
        from ..capturing.meta import meta_mismatches

        try:
            problems = meta_mismatches(graph)
        except GraphError as e:
            raise GraphFormatError(f"shape metadata contradicts the ops: {e}") from None
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise GraphFormatError(f"shape metadata contradicts the ops: {problems[0]}{more}")
    return graph


def _parse(text: str) -> FusionGraph:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphFormatError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:  # an int of over 4300 digits; arrays nested too deep
        raise GraphFormatError(f"not valid JSON: {e}") from None
    return graph_from_dict(data)


def load(path: str) -> FusionGraph:
    with open(path, encoding="utf-8") as f:
        try:
            text = f.read()
        except UnicodeDecodeError as e:
            raise GraphFormatError(f"not UTF-8 text: byte {e.start} ({e.object[e.start:e.start + 1]!r})") from None
    return from_json(text)
