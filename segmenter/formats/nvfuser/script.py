"""Reading an nvFuser Python-frontend fusion as data: ``ast.parse``, then reading nodes.

Note [a fusion script is data]: a repro script (``def nvfuser_fusion_id0(fd: FusionDefinition)``,
``with FusionDefinition() as fd:``, ``fd.execute(inputs)``) is Python, and is never run, imported
or evaluated here: the source is parsed and its nodes are read as a graph file's fields are. The
rules are those of segmenter/formats/serialize.py. Names are keys: a variable name is the key of a value
and a label in messages. Only known calls are read: ``fd.define_*``, ``fd.from_pytorch``,
``fd.add_output``, ``fd.ops.<op>`` for the ops of segmenter/formats/nvfuser/ops.py, ``T.shape()``,
``T.size(d)``, ``V[i]`` and the tensor operators (``a + b``); any other call, attribute or
statement is refused with its line (``__import__``, ``getattr``, ``fd.ops.add.__globals__``, a
loop). Numbers are literals: bounded integers, floats, ``float("inf")``; module-level constants
(``bsz = 2``) and integer arithmetic on them are read as values. Sizes are bounded by
segmenter/ir/limits.py when the graph is built. At module level only imports of torch and nvFuser,
the fusion itself, ``inputs = [...]`` (known tensor constructors with literal arguments, read for
their sizes, strides and dtypes, never called) and ``fd.execute(...)`` are accepted.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

import torch

from ...ir.limits import MAX_NAME, MAX_NESTING
from ..serialize import GraphFormatError
from .build import NULL
from .inputs import InputSpec, read_inputs
from .ops import DTYPES, OPS

__all__ = ["FD_METHODS", "MAX_CALLS", "MAX_SOURCE", "Call", "DType", "InputRef", "Ref", "Script", "read_script"]

MAX_SOURCE = 1 << 24  # characters of source
MAX_CALLS = 100_000  # frontend calls in one fusion
MAX_ITEMS = 4096  # items of one list literal
INT_LIMIT = 2**63  # a literal integer's magnitude

FD_METHODS = frozenset({"define_tensor", "define_scalar", "define_constant", "define_vector", "from_pytorch",
                        "add_output"})
_MODULES = {"nvfuser", "nvfuser_direct"}
_HARMLESS_MODULES = {"torch", "typing", "__future__", "math"}  # imported by repro scripts, never run here
_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Mod: "mod", ast.Pow: "pow",
           ast.BitAnd: "bitwise_and", ast.BitOr: "bitwise_or", ast.BitXor: "bitwise_xor"}
_COMPARE = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
_INT_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod}
_FLOAT_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@dataclass(frozen=True)
class Ref:
    """A value bound earlier in the fusion, by its name."""

    name: str


@dataclass(frozen=True)
class InputRef:
    """``inputs[i]``, as ``fd.from_pytorch(inputs[i])`` names input i."""

    index: int


@dataclass(frozen=True)
class DType:
    """``DataType.<name>``: a name of segmenter/formats/nvfuser/ops.py's DTYPES, or Null."""

    name: str

    @property
    def dtype(self) -> torch.dtype | str:
        return NULL if self.name == NULL else DTYPES[self.name]


@dataclass(frozen=True)
class _Folded:
    """Arithmetic on numbers the reader folded (``bsz * 2``): a number, not a call."""

    value: int | float


@dataclass(frozen=True)
class Call:
    """One frontend call: ``func`` is ``define_tensor``, ``add_output``, ``ops.<op>``, ``shape``,
    ``size``, ``at``, or ``=`` (a name bound to a literal or another value)."""

    line: int
    func: str
    args: tuple
    kwargs: tuple[tuple[str, object], ...]
    targets: tuple[str, ...]


@dataclass(frozen=True)
class Script:
    name: str  # the fusion's function (or class), or "fusion" for a with-block
    line: int
    calls: tuple[Call, ...]
    inputs: tuple[InputSpec, ...] | None  # the script's own ``inputs = [...]``, read as data


def _fail(node: ast.AST | int, message: str) -> GraphFormatError:
    line = node if isinstance(node, int) else getattr(node, "lineno", 0)
    return GraphFormatError(f"line {line}: {message}")


def _dotted(node: ast.AST, depth: int = 0) -> str:
    """``a.b.c`` for a chain of names, for messages (never evaluated)."""
    if isinstance(node, ast.Name):
        return node.id[:60]
    if isinstance(node, ast.Attribute) and depth < 8:
        return f"{_dotted(node.value, depth + 1)}.{node.attr[:60]}"
    if isinstance(node, ast.Call) and depth < 8:
        return f"{_dotted(node.func, depth + 1)}(...)"
    return "(an expression)"


class _Module:
    """What the module level binds: names of nvFuser's FusionDefinition and DataType, of its
    modules, constants, and the fusions it defines."""

    def __init__(self) -> None:
        self.fd_classes, self.dtype_names, self.modules = {"FusionDefinition"}, {"DataType"}, set(_MODULES)
        self.constants: dict[str, int | float | bool] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.called: set[str] = set()  # functions a with-block calls with its fd
        self.fusions: list[tuple[str, str, list[ast.stmt], int]] = []  # (name, fd name, body, line)
        self.inputs: tuple[InputSpec, ...] | None = None

    def is_fd_class(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.fd_classes
        return isinstance(node, ast.Attribute) and node.attr == "FusionDefinition" and \
            isinstance(node.value, ast.Name) and node.value.id in self.modules

    def read(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            self.statement(stmt)
        for name, fn in self.functions.items():
            args = fn.args.posonlyargs + fn.args.args
            first = args[0] if args else None
            annotated = first is not None and first.annotation is not None and (
                self.is_fd_class(first.annotation) or _dotted(first.annotation).endswith("FusionDefinition"))
            if first is None or not (name in self.called or annotated or first.arg == "fd"):
                raise _fail(fn, f"function {name}: not a fusion definition (its first parameter is not a "
                                "FusionDefinition)")
            self.fusions.append((name, first.arg, fn.body, fn.lineno))

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                root = alias.name.split(".")[0]
                if root in _MODULES:
                    self.modules.add(alias.asname or root)
                elif root not in _HARMLESS_MODULES:
                    raise _fail(stmt, f"import of {alias.name[:60]}: a fusion script imports only torch and nvFuser")
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.level or (stmt.module or "").split(".")[0] not in _MODULES | _HARMLESS_MODULES:
                raise _fail(stmt, f"import from {(stmt.module or '.')[:60]}: a fusion script imports only torch and nvFuser")
            for alias in stmt.names:
                if alias.name == "FusionDefinition":
                    self.fd_classes.add(alias.asname or alias.name)
                elif alias.name == "DataType":
                    self.dtype_names.add(alias.asname or alias.name)
        elif isinstance(stmt, ast.FunctionDef):
            if stmt.decorator_list:
                raise _fail(stmt, f"function {stmt.name}: decorators are not read")
            self.functions[stmt.name] = stmt
        elif isinstance(stmt, ast.ClassDef):
            self.fusion_class(stmt)
        elif isinstance(stmt, ast.With):
            self.with_block(stmt)
        elif isinstance(stmt, ast.Assign):
            self.assignment(stmt)
        elif isinstance(stmt, ast.Expr) and (isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
                                             or _is_execute(stmt.value)):
            pass  # a docstring, or fd.execute(inputs): nothing to read
        elif not isinstance(stmt, ast.Pass):
            raise _fail(stmt, f"a {type(stmt).__name__} statement at module level is not read (a fusion script holds "
                              "imports, the fusion, inputs = [...] and fd.execute)")

    def fusion_class(self, stmt: ast.ClassDef) -> None:
        if len(stmt.bases) != 1 or not self.is_fd_class(stmt.bases[0]) or stmt.keywords or stmt.decorator_list:
            raise _fail(stmt, f"class {stmt.name}: only a FusionDefinition subclass is read")
        for item in stmt.body:
            if isinstance(item, ast.FunctionDef) and item.name == "definition" and not item.decorator_list and \
                    len(item.args.args) == 1:
                self.fusions.append((stmt.name, item.args.args[0].arg, item.body, item.lineno))
            elif not (isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant)):
                raise _fail(item, f"class {stmt.name}: only its definition(self) method is read")

    def with_block(self, stmt: ast.With) -> None:
        item = stmt.items[0] if len(stmt.items) == 1 else None
        call = item.context_expr if item is not None else None
        if not (isinstance(call, ast.Call) and self.is_fd_class(call.func) and not call.args and not call.keywords
                and isinstance(item.optional_vars, ast.Name)):
            raise _fail(stmt, "a with-block other than `with FusionDefinition() as fd:`")
        fd = item.optional_vars.id
        body = stmt.body
        if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Call):
            c = body[0].value
            passes_fd = len(c.args) == 1 and isinstance(c.args[0], ast.Name) and c.args[0].id == fd
            if isinstance(c.func, ast.Name) and passes_fd and not c.keywords:
                self.called.add(c.func.id)  # with FusionDefinition() as fd: nvfuser_fusion_id0(fd)
                return
        self.fusions.append(("fusion", fd, body, stmt.lineno))

    def assignment(self, stmt: ast.Assign) -> None:
        target = stmt.targets[0] if len(stmt.targets) == 1 else None
        if _is_execute(stmt.value):
            return  # outputs = fd.execute(inputs)
        if not isinstance(target, ast.Name):
            raise _fail(stmt, "an assignment at module level other than NAME = ...")
        if target.id == "inputs":
            self.inputs = read_inputs(stmt.value)
            return
        value = _number(stmt.value)
        if value is None:
            raise _fail(stmt, f"{target.id[:60]} = ...: only numbers and inputs = [...] are read at module level")
        self.constants[target.id] = value


def _is_execute(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "execute" and \
        isinstance(node.func.value, ast.Name)


def _number(node: ast.AST) -> int | float | bool | None:
    """A literal number (``-3``, ``1e-5``, ``True``) or None."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        sign = -1 if isinstance(node.op, ast.USub) else 1
        node = node.operand
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return None
    if not isinstance(node, ast.Constant) or not isinstance(node.value, bool | int | float):
        return None
    v = node.value
    if isinstance(v, int) and not isinstance(v, bool):
        if abs(v) >= INT_LIMIT:
            raise _fail(node, f"integer {str(v)[:30]}... beyond 64 bits")
        return sign * v
    return v if sign == 1 else -v


class _Fusion:
    """The body of one fusion, read into Calls."""

    def __init__(self, module: _Module, fd: str) -> None:
        self.module, self.fd = module, fd
        self.calls: list[Call] = []
        self.defined: set[str] = set()
        self.synthetic = 0

    def body(self, stmts: list[ast.stmt]) -> None:
        for k, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                continue  # a docstring
            if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Return) and k == len(stmts) - 1 and (
                    stmt.value is None or isinstance(stmt.value, ast.Constant) and stmt.value.value is None)):
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self.assign(stmt.targets[0], stmt.value)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                self.record(stmt.value, ())
            else:
                raise _fail(stmt, f"a {type(stmt).__name__} statement in a fusion is not a frontend call")

    def assign(self, target: ast.expr, value: ast.expr) -> None:
        names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", [None]))
        if not isinstance(target, ast.Name | ast.Tuple | ast.List) or not all(isinstance(n, ast.Name) for n in names):
            raise _fail(target, "an assignment to something else than names")
        targets = tuple(n.id for n in names)
        for t in targets:
            if len(t) > MAX_NAME:
                raise _fail(target, f"a name of {len(t)} characters (at most {MAX_NAME})")
            if t == self.fd:
                raise _fail(target, f"an assignment to {t}, the FusionDefinition")
        spec = self.spec(value, 0)  # read once: reading records the calls nested in its arguments
        if isinstance(spec, _Folded):
            self.add(Call(value.lineno, "=", (spec.value,), (), targets))
        elif spec is not None:
            self.add(Call(value.lineno, *spec, targets))
        else:
            self.add(Call(value.lineno, "=", (self.expr(value, 0),), (), targets))

    def add(self, call: Call) -> None:
        if len(self.calls) >= MAX_CALLS:
            raise _fail(call.line, f"more than {MAX_CALLS} calls in one fusion")
        self.calls.append(call)
        self.defined.update(call.targets)

    def record(self, node: ast.expr, targets: tuple[str, ...]) -> None:
        spec = self.spec(node, 0)
        if spec is None or isinstance(spec, _Folded):
            raise _fail(node, "not a frontend call")
        func, args, kwargs = spec
        self.add(Call(node.lineno, func, args, kwargs, targets))

    def spec(self, node: ast.expr, depth: int) -> tuple[str, tuple, tuple] | _Folded | None:
        """(func, args, kwargs) where ``node`` is a frontend call (written as a call, an operator or
        a subscript); arithmetic on numbers, folded; None where it is a literal or a name."""
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "float":
                return None  # float("inf"): a literal
            func, receiver = self.func(node)
            if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
                raise _fail(node, f"{func}: *args and **kwargs are not read")
            args = tuple(self.expr(a, depth + 1) for a in node.args)
            kwargs = tuple((k.arg, self.expr(k.value, depth + 1)) for k in node.keywords)
            for k, _ in kwargs:
                if k.startswith("_"):
                    raise _fail(node, f"{func}: keyword {k[:60]!r}")
            return func, ((receiver,) if receiver is not None else ()) + args, kwargs
        if isinstance(node, ast.BinOp):
            lhs, rhs = self.expr(node.left, depth + 1), self.expr(node.right, depth + 1)
            if not (isinstance(lhs, Ref) or isinstance(rhs, Ref)):
                return _Folded(self.arithmetic(node, lhs, rhs))
            if type(node.op) not in _BINOPS:
                raise _fail(node, f"the {type(node.op).__name__} operator on a value is not a frontend op")
            return f"ops.{_BINOPS[type(node.op)]}", (lhs, rhs), ()
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Invert) and _number(node) is None:
            arg = self.expr(node.operand, depth + 1)
            if isinstance(arg, Ref):
                return ("ops.neg" if isinstance(node.op, ast.USub) else "ops.bitwise_not"), (arg,), ()
            if isinstance(node.op, ast.USub) and isinstance(arg, int | float) and not isinstance(arg, bool):
                return _Folded(-arg)
            return None
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            lhs, rhs = self.expr(node.left, depth + 1), self.expr(node.comparators[0], depth + 1)
            return f"ops.{_COMPARE[type(node.ops[0])]}", (lhs, rhs), ()
        if isinstance(node, ast.Subscript) and not (isinstance(node.value, ast.Name) and node.value.id == "inputs"
                                                    and node.value.id not in self.defined):
            return "ops.at", (self.expr(node.value, depth + 1), self.expr(node.slice, depth + 1)), ()
        return None

    def func(self, node: ast.Call) -> tuple[str, Ref | None]:
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == self.fd \
                and f.attr in FD_METHODS:
            return f.attr, None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "ops" and \
                isinstance(f.value.value, ast.Name) and f.value.value.id == self.fd:
            if f.attr not in OPS:
                raise _fail(node, f"fd.ops.{f.attr[:60]} is not an op this reader knows (see segmenter/formats/nvfuser/ops.py)")
            return f"ops.{f.attr}", None
        if isinstance(f, ast.Attribute) and f.attr in ("shape", "size") and isinstance(f.value, ast.Name) and \
                f.value.id in self.defined:
            return f"ops.{f.attr}", Ref(f.value.id)
        raise _fail(node, f"{_dotted(f)}(...) is not a frontend call (only fd.define_*, fd.from_pytorch, "
                          "fd.ops.*, fd.add_output, T.shape() and T.size(d) are read)")

    def expr(self, node: ast.expr, depth: int) -> object:
        if depth > MAX_NESTING:
            raise _fail(node, f"expressions nested deeper than {MAX_NESTING}")
        number = _number(node)
        if number is not None:
            return number
        if isinstance(node, ast.Constant):
            if node.value is None or isinstance(node.value, complex):
                return node.value
            raise _fail(node, f"a {type(node.value).__name__} constant is not a frontend value")
        if isinstance(node, ast.Name):
            if node.id in self.defined:
                return Ref(node.id)
            if node.id in self.module.constants:
                return self.module.constants[node.id]
            raise _fail(node, f"undefined name {node.id[:60]}")
        if isinstance(node, ast.List | ast.Tuple):
            if len(node.elts) > MAX_ITEMS:
                raise _fail(node, f"a list of {len(node.elts)} items (at most {MAX_ITEMS})")
            return tuple(self.expr(e, depth + 1) for e in node.elts)
        if isinstance(node, ast.Attribute):
            return self.dtype(node)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "inputs" \
                and "inputs" not in self.defined:
            index = _number(node.slice)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_ITEMS:
                raise _fail(node, "inputs[...] takes an integer index")
            return InputRef(index)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float":
            return _float_literal(node)
        spec = self.spec(node, depth)
        if isinstance(spec, _Folded):
            return spec.value
        if spec is None:
            raise _fail(node, f"a {type(node).__name__} expression is not read")
        self.synthetic += 1
        name = f"_t{self.synthetic}"  # a nested call's result: named here, never by the script
        self.add(Call(node.lineno, spec[0], spec[1], spec[2], (name,)))
        return Ref(name)

    @staticmethod
    def arithmetic(node: ast.BinOp, lhs: object, rhs: object) -> int | float:
        """``bsz * 2``, ``features // 2``: arithmetic on numbers, folded."""
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lhs, rhs)):
            raise _fail(node, "an operator on something else than values and numbers")
        ints = isinstance(lhs, int) and isinstance(rhs, int)
        table = _INT_ARITH if ints else _FLOAT_ARITH
        if type(node.op) not in table or (type(node.op) in (ast.FloorDiv, ast.Mod, ast.Div) and rhs == 0):
            raise _fail(node, "arithmetic other than + - * // % on integers, + - * / on floats (or by zero)")
        out = table[type(node.op)](lhs, rhs)
        if ints and abs(out) >= INT_LIMIT:
            raise _fail(node, "integer arithmetic beyond 64 bits")
        return out

    def dtype(self, node: ast.Attribute) -> DType:
        owner = node.value
        is_dtype = (isinstance(owner, ast.Name) and owner.id in self.module.dtype_names) or (
            isinstance(owner, ast.Attribute) and owner.attr == "DataType" and isinstance(owner.value, ast.Name)
            and owner.value.id in self.module.modules)
        if not is_dtype:
            raise _fail(node, f"attribute {_dotted(node)} is not a frontend value")
        if node.attr not in DTYPES and node.attr != NULL:
            raise _fail(node, f"DataType.{node.attr[:60]} is not a dtype this reader knows")
        return DType(node.attr)


def _float_literal(node: ast.Call) -> float:
    text = node.args[0].value if len(node.args) == 1 and isinstance(node.args[0], ast.Constant) else None
    if node.keywords or not isinstance(text, str) or not re.fullmatch(r"[+-]?(inf|nan)", text):
        raise _fail(node, 'float(...) is read only as float("inf"), float("-inf") or float("nan")')
    return float(text)


def read_script(source: str, name: str | None = None) -> Script:
    """The fusion ``source`` defines (``name`` picks one of several), read as data."""
    if not isinstance(source, str):
        raise GraphFormatError(f"a fusion script is text, got {type(source).__name__}")
    if len(source) > MAX_SOURCE:
        raise GraphFormatError(f"a fusion script of {len(source)} characters (at most {MAX_SOURCE})")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise GraphFormatError(f"line {e.lineno}: not Python: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise GraphFormatError(f"not a fusion script: {type(e).__name__}") from None
    module = _Module()
    module.read(tree)
    names = [f[0] for f in module.fusions]
    chosen = [f for f in module.fusions if name is None or f[0] == name]
    if not chosen:
        where = f" named {name!r}" if name is not None else ""
        raise GraphFormatError(f"no fusion{where} in the script (a def taking fd, a `with FusionDefinition() as fd:` "
                               f"block, or a FusionDefinition subclass){'; it has ' + ', '.join(names) if names else ''}")
    if len(chosen) > 1:
        raise GraphFormatError(f"{len(chosen)} fusions in the script ({', '.join(names)}): name one")
    fusion_name, fd, body, line = chosen[0]
    reader = _Fusion(module, fd)
    reader.body(body)
    return Script(fusion_name, line, tuple(reader.calls), module.inputs)
