"""The compiled program as straight-line Python: one function that runs every launch in order.

Note [generated wrapper]: the plan is fixed at compile time, so the call should cost what its
launches cost (Inductor's wrapper codegen does the same): instead of interpreting a list of
closures over a dict, the program is emitted as the source of one function, each graph value a
local variable, each op called directly, each dead value deleted at its last use::

    def fuseg_program(v0, v1):
        v2 = _k0(v0.data_ptr(), ...)        # a generated kernel
        v3 = _reinterpret(v2, (4, 8), (1, 4), v2.storage_offset() + 0)   # a metadata op
        del v2
        ...

Note [reused local names]: the program of a 100k-node graph has ~80k values; giving each a local
of its own made Python's ``compile()`` of it ~14% slower than handing a deleted value's name to the
next value made (a free list; ~20 distinct locals remain). A name is only reused once its value
was deleted, so it is unbound when handed on, and ``var`` refuses a deleted value outright (a read
after a ``del`` would otherwise read whatever value holds the name now): a generator bug fails at
generation, never as a wrong result. Only straight-line code reuses names (the program); code
with branches that each delete values (a launch run alone, with its layout guard) does not.

Note [program parts]: Python's ``compile()`` of one function of 200k statements (a 100k-node
graph) holds the whole tree in memory at once. Cut into functions of ~2000 lines compiled one by
one, it took 1.31 s instead of 2.71 s and the process peaked at 545 MiB instead of 1051 MiB
(medians of one interleaved run, ``python -m perf.experiments.compile_parts``; raw figures in
perf/results/x86-cpu-unrecorded/compile_parts_100k.json). So a long straight-line function is cut, at places its
generator marked (``mark``: between two launches), into parts: each part is a function taking the
values live where it starts and returning those live where it ends, and the function itself calls
the parts in order. A call pays one Python call per part (~1 us each); a function under
``2 * PART_LINES`` lines is never cut. A mark lists the locals bound where it stands, which costs
a pass over them: marks closer than ``PART_LINES // 8`` lines to the previous one are not kept
(a 100k-node program has ~39k places to cut and needs ~85 cuts), so a part may run up to that
many lines longer than ``PART_LINES``.

Nothing from the graph reaches the source text: value names become ``v<n>``, and every other
object a launch needs (an op, a shape, a constant argument, a kernel) is bound in the function's
globals under a generated name (``_c<n>``) and referred to by that name only. A graph file can
therefore not make this module run code of its choosing (see README, "Security: a graph file is data").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

from segmenter.ir.symbolic import NotSymbolic, SymbolicSizes, is_symbolic

__all__ = ["Code"]

#: a ShapeEnv symbol's own name (``s17``, ``u3``): text that only ``str()`` of a SymInt makes.
#: Generated source never holds one (Note [sizes in generated source]).
_RAW_SYMBOL = re.compile(r"\b[su]\d+\b")


# Note [sizes in generated source]: under a symbolic plan (Note [symbolic plans] in
# segmenter/ir/symbolic.py) a shape, stride, offset or argument may hold SymInts. Such a value is
# never bound as an object (the program would then hand a SymInt to an op at run time, which
# raises once the plan is sealed): ``const`` prints it as an expression over the symbols' locals
# (``_z0``...), which the program binds from its inputs at each call; a TensorMeta becomes a
# TensorMeta made at the call. Anything else holding a symbol raises NotSymbolic, and the caller
# specializes the plan instead. A symbol formatted into text by mistake (an f-string of a
# SymInt prints ``s17``) is caught when the source is compiled: no generated name has that form.


def _code_name(name: str, src: str) -> str:
    """The file name a traceback shows for generated ``src``: named by its content, so the same
    program gets the same name in every process and on every replay (a counter made Hypothesis
    see a replayed failure as a new one and report it as flaky instead of shrinking it)."""
    return f"<fuseg {name} {hashlib.sha1(src.encode()).hexdigest()[:12]}>"


#: lines per part of a long function (Note [program parts])
PART_LINES = 2000


class Code:
    """Lines of Python under construction, the locals they use and the globals they need."""

    def __init__(self, fast: bool = False, reuse: bool = False, sizes: SymbolicSizes | None = None) -> None:
        #: emit the dispatcher-free variants of views and allocations (Note [fast and safe programs])
        self.fast = fast
        #: hand the names of deleted values to later values (Note [reused local names])
        self.reuse = reuse
        self._free: list[str] = []
        self._dead: set[str] = set()
        self._count = 0
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {}
        self._vars: dict[str, str] = {}
        self._consts: dict[int, str] = {}  # id(obj) -> name, for objects bound once
        self._keep: list[Any] = []  # keeps every bound object alive while its id is a key
        self._fixed: set[str] = set()
        #: (line index, locals bound there) where a long function may be cut (Note [program parts])
        self._marks: list[tuple[int, list[str]]] = []
        self.indent = "    "
        #: views never made, read as their source's pointer plus bytes (Note [views passed as
        #: pointers] in runtime/compiled/pointers.py): set by the fast program only
        self.pointers: dict[str, tuple[str, int]] = {}
        #: the plan's symbols, where sizes are symbolic (Note [sizes in generated source])
        self.sizes = sizes
        self.symbol_names: list[str] = list(sizes.names.values()) if sizes is not None else []

    # --- names ------------------------------------------------------------------------------

    def var(self, value: str) -> str:
        """The local variable holding graph value ``value``."""
        name = self._vars.get(value)
        if name is None:
            if value in self._dead:  # a generator bug: fail here, never read another value's local
                raise RuntimeError(f"internal: value %{value} used after its del")
            name = self._vars[value] = self._free.pop() if self._free else f"v{self._count}"
            self._count += 1
        return name

    def pointer(self, value: str) -> str:
        """An expression for the data pointer of graph value ``value`` (Note [views passed as pointers])."""
        if value in self.pointers:
            src, delta = self.pointers[value]
            return f"({self.var(src)}.data_ptr() + {self.value(delta)})" if delta else f"{self.var(src)}.data_ptr()"
        return f"{self.var(value)}.data_ptr()"

    def through(self, value: str) -> str:
        """The value whose local holds ``value``'s memory alive: its source where ``value`` is a
        view passed as a pointer, else itself."""
        return self.pointers[value][0] if value in self.pointers else value

    def dying(self, inputs: Iterable[str], dying: frozenset[str]) -> list[str]:
        """Of a launch's ``inputs``, the values to delete after it, each once: an input passed as
        a pointer is its source's memory (``through``)."""
        return [v for v in dict.fromkeys(self.through(v) for v in inputs) if v in dying]

    def has_var(self, value: str) -> bool:
        return value in self._vars

    def fixed(self, value: str, obj: Any) -> None:
        """Graph value ``value`` is ``obj`` on every call (computed once, at compile time): its
        uses read a global, and it is never deleted."""
        self._vars[value] = self.const(obj, "_f")
        self._fixed.add(value)

    def dels(self, values: Iterable[str]) -> None:
        """``del`` the locals of these values (values fixed at compile time are left alone)."""
        values = [v for v in values if v not in self._fixed]
        names = [self.var(v) for v in values]
        if names:
            self.line("del " + ", ".join(names))
        if self.reuse:
            for v, name in zip(values, names):
                del self._vars[v]
                self._dead.add(v)
                self._free.append(name)

    def const(self, obj: Any, prefix: str = "_c") -> str:
        """A global name bound to ``obj`` (the same object gets the same name); where ``obj``
        holds symbolic sizes, an expression computing it at the call (Note [sizes in generated
        source])."""
        if self.sizes is not None and is_symbolic(obj):
            return self.value(obj)
        name = self._consts.get(id(obj))
        if name is None:
            name = self._consts[id(obj)] = f"{prefix}{len(self.globals)}"
            self.globals[name] = obj
            self._keep.append(obj)
        return name

    def value(self, obj: Any) -> str:
        """A Python expression for ``obj`` at the call: sizes over the symbols' locals, a
        symbolic TensorMeta made at the call, tuples of those and of constants."""
        from segmenter import TensorMeta

        if type(obj) is int:
            return str(obj)
        if self.sizes is None or not is_symbolic(obj):
            return self.const(obj)
        if isinstance(obj, (tuple, list)):
            parts = [self.value(a) for a in obj]
            return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"
        if isinstance(obj, TensorMeta):
            return (f"{self.const(TensorMeta)}({self.value(obj.shape)}, {self.value(obj.stride)}, "
                    f"{self.value(obj.storage_offset)}, {self.const(obj.dtype)}, {self.const(obj.device)}, "
                    f"{obj.conj}, {obj.neg})")
        try:
            return self.sizes.python_expr(obj)
        except NotSymbolic:
            raise
        except Exception as e:  # noqa: BLE001 - what the printer cannot take is not a size
            raise NotSymbolic(f"cannot print {type(obj).__name__} {obj!r:.60} in a symbolic program: {e}") from e

    def late(self, prefix: str = "_k") -> str:
        """A global name whose object is bound later (``bind``), e.g. a kernel still compiling."""
        name = f"{prefix}{len(self.globals)}"
        self.globals[name] = None
        return name

    def bind(self, name: str, obj: Any) -> None:
        self.globals[name] = obj

    def mark(self) -> None:
        """Here, between two statements at the function's top level, the function may be cut
        into parts (Note [program parts]). Only straight-line code with reused names knows
        exactly which locals are bound at every point."""
        if not self.reuse or self.indent != "    ":  # pragma: no cover - a generator bug
            raise RuntimeError("internal: a cut needs straight-line code with reused names")
        if self._marks and len(self.lines) - self._marks[-1][0] < PART_LINES // 8:
            return
        live = sorted({name for v, name in self._vars.items() if v not in self._fixed}, key=lambda n: int(n[1:]))
        self._marks.append((len(self.lines), live + self.symbol_names))

    # --- statements -------------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append(self.indent + text)

    def block(self) -> _Block:
        """``with code.block(): ...`` indents the lines emitted inside."""
        return _Block(self)

    # --- functions --------------------------------------------------------------------------

    def function(self, name: str, params: Iterable[str], body: list[str], returns: str | None,
                 ) -> tuple[Callable[..., Any], str]:
        """``def name(params): body; return returns`` compiled with this code's globals, and its source."""
        src = self.source(name, params, body, returns)
        self._no_raw_symbols(src)
        scope: dict[str, Any] = dict(self.globals)
        exec(compile(src, _code_name(name, src), "exec"), scope)  # noqa: S102 - our own source, see the note
        return scope[name], src

    def program(self, name: str, params: list[str], returns: str) -> tuple[Callable[..., Any], str]:
        """Like ``function`` over this code's lines, cut into parts where it is long (Note
        [program parts]); the source returned is the function's, then its parts'."""
        cuts = self._cuts(PART_LINES)
        if not cuts:
            return self.function(name, params, self.lines, returns)
        # The live values travel in one list that each part empties as it starts: no frame but
        # the running part's holds them, so a ``del`` frees a value as it does in one function.
        scope: dict[str, Any] = dict(self.globals)
        bounds = [(0, params), *cuts, (len(self.lines), None)]
        main = [f"    _s = [{''.join(v + ', ' for v in params)}]"]
        sources = []
        for k in range(len(bounds) - 1):
            (start, live_in), (end, live_out) = bounds[k], bounds[k + 1]
            part = f"_fuseg_part{k}"
            head = ([f"    {''.join(v + ', ' for v in live_in)}= _s"] if live_in else []) + ["    _s.clear()"]
            ret = returns if live_out is None else f"[{''.join(v + ', ' for v in live_out)}]"
            src = self.source(part, ["_s"], head + self.lines[start:end], ret)
            self._no_raw_symbols(src)
            exec(compile(src, _code_name(f"{name} part {k}", src), "exec"), scope)  # noqa: S102 - see the notes
            main.append(f"    return {part}(_s)" if live_out is None else f"    _s = {part}(_s)")
            sources.append(src)
        head_src = self.source(name, params, main, None)
        exec(compile(head_src, _code_name(name, head_src), "exec"), scope)  # noqa: S102 - see the notes
        return scope[name], head_src + "".join("\n" + s for s in sources)

    def _no_raw_symbols(self, src: str) -> None:
        if self.sizes is not None and (m := _RAW_SYMBOL.search(src)):
            line = src[src.rfind("\n", 0, m.start()) + 1:src.find("\n", m.end())].strip()
            raise NotSymbolic(f"a symbol ({m.group(0)}) was formatted into generated source as text: {line[:200]}")

    def _cuts(self, every: int) -> list[tuple[int, list[str]]]:
        """Marks about ``every`` lines apart (none for a function under twice that)."""
        if len(self.lines) < 2 * every:
            return []
        cuts, last = [], 0
        for at, live in self._marks:
            if at - last >= every and len(self.lines) - at >= every // 2:
                cuts.append((at, live))
                last = at
        return cuts

    @staticmethod
    def source(name: str, params: Iterable[str], body: list[str], returns: str | None) -> str:
        head = f"def {name}({', '.join(params)}):\n"
        tail = f"    return {returns}\n" if returns is not None else ""
        return head + "".join(line + "\n" for line in body) + (tail or ("" if body else "    pass\n"))


class _Block:
    def __init__(self, code: Code) -> None:
        self.code = code

    def __enter__(self) -> Code:
        self.code.indent += "    "
        return self.code

    def __exit__(self, *exc: object) -> None:
        self.code.indent = self.code.indent[:-4]
