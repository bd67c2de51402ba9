"""Mutations of exported JSON graphs and the oracle every mutant must satisfy (tests/test_hostile_json.py).

Note [the hostile-input oracle]: a mutant loaded with the meta check (the default) is either refused with the project's own error
(``GraphError`` and its subclasses) or it loads; then it must segment, pass ``alias.check``,
compile with the torch and the C++ backends (a backend may decline a segment: the runtime
falls back), and each compiled program must agree with the graph's reference semantics
(``run_graph``) on identical random inputs: values, shapes, strides, which outputs share a storage
with which inputs and outputs, and the inputs' final values. ``run_graph`` trusts the graph's
recorded aliasing, so the reference is also held to the ops: every output of ``run_graph``
equals the value the ops compute for it (``evaluate``), and every written-back input ends
holding the value its mutation names. A program that raises at run time (an index out of range
in the data) must raise in the reference too. Loaded without the meta check, a graph is trusted
(its metas may lie): it must still load or be refused with our error, and never crash the process.
And nothing anywhere may write a marker file.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import runtime
from alias import apply_aliases, check
from perf.tools.run import random_inputs
from segmenter import segment
from segmenter.capturing.reference import clone_inputs, evaluate, run_graph, storage_key
from segmenter.formats.serialize import from_json
from segmenter.ir.graph import FusionGraph, GraphError

__all__ = ["MUTATORS", "Finding", "check_mutant", "mutate", "payloads"]

MAX_RUN_BYTES = 1 << 24  # mutants whose inputs need more than this are loaded and compiled, not run

Finding = str  # what went wrong, for the assertion message


def payloads(marker: Path) -> list[str]:
    """Strings that would run code if a name or argument reached Python, C++ or a shell unquoted."""
    py = f"__import__('os').system('touch {marker}')"
    return [
        py, f"x={py}", f"a);{py};(", f"{py}#", f'"); system("touch {marker}"); //', f"*/ system(\"touch {marker}\"); /*",
        f"$(touch {marker})", f"`touch {marker}`", "{0.__class__.__init__.__globals__}", "%s%s%n%x{}", "\n", "a\x00b",
        "\u202e", "x" * 300, "", "../../../etc/passwd", "aten.sin.default", "x", "in_0", "arg0_1", "out0", "self",
    ]


_NUMBERS = [-1, -2**63, 2**63 - 1, 2**63, 2**64, 10**8, 10**18, 2**31, 2**32 + 1, 0, 1, 7, -7]
_OPS = ["mylib.nope.default", "load_library.__call__.__call__", "import_module.__call__.__call__",
        "aten.from_file.default", "aten.sin.default", "aten.add_.Tensor", "aten.copy_.default",
        "aten.as_strided.default", "aten.index.Tensor", "higher_order.cond", "higher_order.auto_functionalized",
        "aten.empty.memory_format", "aten.embedding.default", "aten.alias.default", "aten.select.int",
        "aten.slice.Tensor", "aten.view.dtype", "aten.expand.default", "aten._to_copy.default", "aten.sum.dim_IntList",
        "aten.mul.Tensor", "aten.cat.default", "aten.permute.default", "aten.t.default", "torch.sin"]
_DTYPES = ["float64", "int32", "bool", "complex64", "float8_e4m3fn", "qint8", "bfloat16", "uint64", "float16"]
_DEVICES = ["meta", "cuda", "cpu:0", "cuda:7", "mps", "xla"]
_RETYPE: list[Any] = [None, True, 0, -1, 1.5, "s", [], {}, [1, 2], {"value": "x"}, {"float": "nan"}, [[[]]]]


def _slots(d: Any, path: tuple = ()) -> list[tuple]:
    """Every (path, value) in the JSON tree."""
    out = [(path, d)]
    if isinstance(d, dict):
        for k, v in d.items():
            out += _slots(v, (*path, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _slots(v, (*path, i))
    return out


def _set(d: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def _delete(d: Any, rng: random.Random, marker: Path) -> str:
    slots = [p for p, _ in _slots(d) if p]
    path = rng.choice(slots)
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    del parent[path[-1]]
    return f"delete {list(path)}"


def _retype(d: Any, rng: random.Random, marker: Path) -> str:
    path = rng.choice([p for p, _ in _slots(d) if p])
    value = copy.deepcopy(rng.choice(_RETYPE))
    _set(d, path, value)
    return f"set {list(path)} = {json.dumps(value)}"


def _number(d: Any, rng: random.Random, marker: Path) -> str:
    slots = [p for p, v in _slots(d) if p and isinstance(v, int) and not isinstance(v, bool)]
    if not slots:
        return _retype(d, rng, marker)
    path, value = rng.choice(slots), rng.choice(_NUMBERS)
    _set(d, path, value)
    return f"set {list(path)} = {value}"


def _string(d: Any, rng: random.Random, marker: Path) -> str:
    slots = [p for p, v in _slots(d) if p and isinstance(v, str)]
    path, value = rng.choice(slots), rng.choice(payloads(marker))
    _set(d, path, value)
    return f"set {list(path)} = {value!r}"


def _rename(d: Any, rng: random.Random, marker: Path) -> str:
    """Rename one value everywhere it appears: the graph stays consistent, the name is hostile."""
    names = [i["name"] for i in d.get("inputs", []) if isinstance(i, dict) and isinstance(i.get("name"), str)]
    names += [o for n in d.get("nodes", []) if isinstance(n, dict) for o in n.get("outputs", []) if isinstance(o, str)]
    if not names:
        return _string(d, rng, marker)
    old, new = rng.choice(names), rng.choice(payloads(marker))

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if set(x) == {"value"} and x["value"] == old:
                return {"value": new}
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    for inp in d.get("inputs", []):
        if isinstance(inp, dict) and inp.get("name") == old:
            inp["name"] = new
    for n in d.get("nodes", []):
        if isinstance(n, dict):
            n["args"], n["kwargs"] = walk(n.get("args")), walk(n.get("kwargs"))
            n["outputs"] = [new if o == old else o for o in n.get("outputs", [])]
            if rng.random() < 0.3:
                n["name"] = new if n.get("name") == old else n.get("name")
    d["outputs"] = [new if o == old else o for o in d.get("outputs", [])]
    for m in d.get("mutations") or []:
        if isinstance(m, dict) and m.get("value") == old:
            m["value"] = new
    return f"rename %{old} -> {new!r}"


def _kwarg_key(d: Any, rng: random.Random, marker: Path) -> str:
    nodes = [n for n in d.get("nodes", []) if isinstance(n, dict) and isinstance(n.get("kwargs"), dict)]
    if not nodes:
        return _string(d, rng, marker)
    n, key = rng.choice(nodes), rng.choice(payloads(marker) + ["alpha", "dtype", "out", "self", "class"])
    value = n["kwargs"].pop(rng.choice(list(n["kwargs"])), 1) if n["kwargs"] and rng.random() < 0.5 else 1
    n["kwargs"][key] = value
    return f"kwarg {key!r} = {json.dumps(value)} on {n.get('name')!r}"


def _op(d: Any, rng: random.Random, marker: Path) -> str:
    nodes = [n for n in d.get("nodes", []) if isinstance(n, dict)]
    n = rng.choice(nodes)
    op = rng.choice(_OPS + [m.get("op") for m in nodes])
    n["op"] = op
    return f"op of {n.get('name')!r} = {op}"


def _arg(d: Any, rng: random.Random, marker: Path) -> str:
    nodes = [n for n in d.get("nodes", []) if isinstance(n, dict) and isinstance(n.get("args"), list)]
    n = rng.choice(nodes)
    args = n["args"]
    choice = rng.random()
    if choice < 0.4 and args:
        i = rng.randrange(len(args))
        args[i] = rng.choice([*_NUMBERS, {"float": "inf"}, {"float": "nan"}, -0.5, [], [0, 0], "tanh", None,
                              {"value": rng.choice(d.get("outputs") or ["x"])}, {"op": rng.choice(_OPS)}])
        return f"{n.get('name')!r}.args[{i}] = {json.dumps(args[i])}"
    if choice < 0.7:
        args.append(rng.choice([0, 1, -1, 2**40, None, True]))
        return f"{n.get('name')!r}.args += {json.dumps(args[-1])}"
    if args:
        args.pop(rng.randrange(len(args)))
    return f"{n.get('name')!r}.args shortened"


def _meta(d: Any, rng: random.Random, marker: Path) -> str:
    metas = [p for p, v in _slots(d) if isinstance(v, dict) and "shape" in v and "stride" in v]
    if not metas:
        return _retype(d, rng, marker)
    path = rng.choice(metas)
    m = d
    for k in path:
        m = m[k]
    field = rng.choice(["shape", "stride", "storage_offset", "dtype", "device"])
    if field in ("shape", "stride") and isinstance(m[field], list) and m[field]:
        i = rng.randrange(len(m[field]))
        m[field][i] = rng.choice([0, 1, 2, 3, -1, 2**47, m[field][i] + 1])
    elif field == "storage_offset":
        m[field] = rng.choice([0, 1, 5, 2**40, -3])
    elif field == "dtype":
        m[field] = rng.choice(_DTYPES)
    elif field == "device":
        m[field] = rng.choice(_DEVICES)
    return f"{list(path)}.{field} = {json.dumps(m.get(field))}"


def _alias(d: Any, rng: random.Random, marker: Path) -> str:
    outs = d.get("outputs") or []
    if not isinstance(outs, list) or not outs:
        return _retype(d, rng, marker)
    aliases = d.get("output_aliases")
    if not isinstance(aliases, list) or len(aliases) != len(outs):
        aliases = d["output_aliases"] = [None] * len(outs)
    i = rng.randrange(len(outs))
    kind = rng.random()
    if kind < 0.3 and len(aliases) > 1:  # swap two claims
        j = rng.randrange(len(aliases))
        aliases[i], aliases[j] = aliases[j], aliases[i]
        return f"swap output_aliases[{i}] and [{j}]"
    if kind < 0.5:
        aliases[i] = None
        return f"output_aliases[{i}] = null"
    metas = [v for _, v in _slots(d) if isinstance(v, dict) and "shape" in v and "stride" in v]
    layout = copy.deepcopy(rng.choice(metas)) if metas and rng.random() < 0.5 else None
    if layout is not None and rng.random() < 0.3:
        layout["dtype"] = rng.choice(_DTYPES)
    source = rng.choice(["input", "input", "output"])
    index = rng.choice([0, 1, 2, -1, i, i - 1, len(d.get("inputs") or [])])
    aliases[i] = {"source": source, "index": index, "layout": layout}
    return f"output_aliases[{i}] = {json.dumps(aliases[i])}"


def _mutation(d: Any, rng: random.Random, marker: Path) -> str:
    muts = d.get("mutations")
    if not isinstance(muts, list):
        muts = d["mutations"] = []
    values = [o for n in d.get("nodes", []) if isinstance(n, dict) for o in n.get("outputs", []) if isinstance(o, str)]
    values += [i.get("name") for i in d.get("inputs", []) if isinstance(i, dict)]
    n_in = len(d.get("inputs") or [])
    if muts and rng.random() < 0.5:
        m = rng.choice(muts)
        if isinstance(m, dict):
            m["input"] = rng.choice([0, 1, 2, -1, n_in, m.get("input", 0)])
            return f"mutation input -> {m['input']}"
    entry = {"input": rng.randrange(max(n_in, 1)), "value": rng.choice(values or ["x"])}
    muts.append(entry)
    return f"mutations += {json.dumps(entry)}"


def _storage(d: Any, rng: random.Random, marker: Path) -> str:
    inputs = [i for i in d.get("inputs", []) if isinstance(i, dict)]
    if len(inputs) < 2:
        return _meta(d, rng, marker)
    a, b = rng.sample(inputs, 2)
    a["storage"] = b.get("storage")
    return f"input {a.get('name')!r} shares storage with {b.get('name')!r}"


MUTATORS: list[tuple[str, Callable[[Any, random.Random, Path], str], int]] = [
    ("delete", _delete, 2), ("retype", _retype, 2), ("number", _number, 2), ("string", _string, 2),
    ("rename", _rename, 2), ("kwarg-key", _kwarg_key, 1), ("op", _op, 2), ("arg", _arg, 3), ("meta", _meta, 2),
    ("alias", _alias, 3), ("mutation", _mutation, 2), ("storage", _storage, 1),
]


def mutate(seed: dict[str, Any], rng: random.Random, marker: Path) -> tuple[str, str, str]:
    """One mutant: (mutator name, what it did, the JSON text). One to three mutations."""
    d = copy.deepcopy(seed)
    names, steps = [], []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        for _attempt in range(8):  # an earlier mutation may have left nothing this one can work on
            name, fn, _w = rng.choices(MUTATORS, weights=[w for *_, w in MUTATORS])[0]
            try:
                steps.append(fn(d, rng, marker))
            except (KeyError, IndexError, TypeError, AttributeError, ValueError):
                continue
            names.append(name)
            break
    return "+".join(names), "; ".join(steps), json.dumps(d)


# -- the oracle -----------------------------------------------------------------------------

def _pattern(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> list[tuple]:
    return [(tuple(i for i, t in enumerate(inputs) if storage_key(t) == storage_key(o) and o.numel()),
             tuple(k for k in range(j) if storage_key(outputs[k]) == storage_key(o) and o.numel()))
            for j, o in enumerate(outputs)]


def _layout(t: torch.Tensor) -> tuple:
    if t.numel() == 0:
        return tuple(t.shape), t.dtype
    return tuple(t.shape), tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride())), t.dtype


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values (layouts aside)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.allclose(a, b, atol=1e-4, rtol=1e-4, equal_nan=True)
    return torch.equal(a, b)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values and the same observable layout."""
    return _layout(a) == _layout(b) and _close(a, b)


def _reference(graph: FusionGraph, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``run_graph``'s outputs and inputs afterwards, held to the ops (Note [the hostile-input oracle])."""
    ins = clone_inputs(inputs)
    outs = run_graph(graph, ins)
    values = evaluate(graph, clone_inputs(inputs))
    for j, (name, out) in enumerate(zip(graph.outputs, outs)):
        if not _close(out, values[name]):
            raise AssertionError(f"run_graph output {j} (%{name}) is not the value the ops compute for it")
    for m in graph.mutations:
        if not _close(ins[m.input], values[m.value]):
            raise AssertionError(f"input {m.input} does not end holding %{m.value}")
    return outs, ins


def _unchecked(graph: FusionGraph) -> tuple[str, Finding | None]:
    """A graph loaded with ``check_metas=False`` is trusted to be consistent: its recorded metas
    may lie, so torch may refuse its ops at run time and values may differ. What still holds:
    the loader raised only its own errors, nothing crashes the process and no code runs."""
    try:
        programs = [runtime.compile(apply_aliases(segment(graph), "post"), backend=b) for b in ("torch", "cpp")]
        if all(i.meta.device_type == "cpu" for i in graph.inputs) and sum(
                i.meta.storage_extent * i.meta.itemsize for i in graph.inputs) <= MAX_RUN_BYTES:
            inputs = random_inputs(graph)
            for prog in programs:
                prog(*clone_inputs(inputs))
    except Exception as e:  # noqa: BLE001 - torch's refusals of ops whose metas lied
        return f"unchecked: raised {type(e).__name__}", None
    return "unchecked: ran", None


def check_mutant(text: str, check_metas: bool = True) -> tuple[str, Finding | None]:
    """(outcome, finding): outcome is "refused at load", "refused at compile", "ran", ...; a
    finding is a broken rule of Note [the hostile-input oracle] (None: none)."""
    try:
        graph = from_json(text, check_metas=check_metas)
    except GraphError:
        return "refused at load", None
    except Exception as e:  # noqa: BLE001 - exactly what the oracle looks for
        return "load", f"from_json raised {type(e).__name__}: {e}"
    if not check_metas:
        return _unchecked(graph)
    try:
        sf = segment(graph)
        plan = apply_aliases(sf, "post")
    except GraphError:
        return "refused at segment", None
    except Exception as e:  # noqa: BLE001
        return "segment", f"segment/alias raised {type(e).__name__}: {e}"
    problems = check(sf, plan)
    if problems:
        return "alias.check", f"alias.check: {problems[0]}"
    programs = {}
    for backend in ("torch", "cpp"):
        try:
            programs[backend] = runtime.compile(plan, backend=backend)
        except GraphError:
            return "refused at compile", None
        except Exception as e:  # noqa: BLE001
            return "compile", f"runtime.compile(backend={backend}) raised {type(e).__name__}: {e}"
    if any(i.meta.device_type != "cpu" for i in graph.inputs):
        return "loaded (not a CPU graph)", None
    if sum(i.meta.storage_extent * i.meta.itemsize for i in graph.inputs) > MAX_RUN_BYTES:
        return "loaded (too large to run)", None
    try:
        inputs = random_inputs(graph)
    except Exception as e:  # noqa: BLE001 - a dtype torch cannot fill randomly: not a finding
        return f"loaded (no random inputs: {type(e).__name__})", None
    try:
        expected, expected_in = _reference(graph, inputs)
    except AssertionError as e:
        return "reference", str(e)
    except Exception as e:  # noqa: BLE001 - the program itself raises on these inputs
        for backend, prog in programs.items():
            try:
                prog(*clone_inputs(inputs))
            except Exception:  # noqa: BLE001, S112
                continue
            return "run", f"reference raised {type(e).__name__} ({e}) but backend {backend} ran"
        return "raised at run (both)", None
    for backend, prog in programs.items():
        ins = clone_inputs(inputs)
        try:
            got = prog(*ins)
        except Exception as e:  # noqa: BLE001
            return "run", f"backend {backend} raised {type(e).__name__}: {e}; the reference ran"
        if len(got) != len(expected):
            return "run", f"backend {backend}: {len(got)} outputs, reference {len(expected)}"
        for j, (g, e) in enumerate(zip(got, expected)):
            if not _same(g, e):
                return "run", f"backend {backend}: output {j} differs ({_layout(g)} vs {_layout(e)})"
        if _pattern(ins, got) != _pattern(expected_in, expected):
            return "run", f"backend {backend}: aliasing {_pattern(ins, got)} vs {_pattern(expected_in, expected)}"
        for i, (a, b) in enumerate(zip(ins, expected_in)):
            if not _same(a, b):
                return "run", f"backend {backend}: input {i} after the call differs"
    return "ran and matched", None
