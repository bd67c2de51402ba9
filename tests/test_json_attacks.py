"""A graph file is data: nothing in one may run code (issue 14, items 1 and 2).

Each attack is the one the issue reproduced, or one found while fixing it; each must be refused
with the project's own error (or load as an unknown op that is refused when run) and leave no
marker file behind, through ``from_json`` and through ``fuseg segment``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perf.tools.cli import main
from runtime.codegen.build import cpu_compiler
from segmenter.formats.serialize import GraphFormatError, from_json
from segmenter.ir.graph import GraphError
from segmenter.ir.ops import resolve_op


def _meta(shape: list[int]) -> dict[str, Any]:
    stride = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        stride[d] = stride[d + 1] * shape[d + 1]
    return {"shape": shape, "stride": stride, "storage_offset": 0, "dtype": "float32", "device": "cpu"}


def _graph(nodes: list[dict[str, Any]], outputs: list[str], input_name: str = "x") -> dict[str, Any]:
    return {"schema": "fusion-segmenter/graph", "version": 1, "name": "attack",
            "inputs": [{"name": input_name, "meta": _meta([4]), "role": "user", "target": None, "storage": 0}],
            "nodes": nodes, "outputs": outputs}


def _node(name: str, op: str, args: list[Any], outputs: list[str] | None = None,
          kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    outs = [name] if outputs is None else outputs
    return {"name": name, "op": op, "args": args, "kwargs": kwargs or {}, "outputs": outs,
            "metas": [_meta([4]) for _ in outs]}


def _shell(marker: Path) -> str:
    return f"__import__('os').system('touch {marker}')"


def _input_name_attack(marker: Path) -> dict[str, Any]:
    """An input name that was Python source in the fx code functionalization generated."""
    name = f"x={_shell(marker)}"
    return _graph([_node("a", "aten.add_.Tensor", [{"value": name}, 1])], ["a"], input_name=name)


def _the_issues_input_name(marker: Path) -> dict[str, Any]:
    """The issue's exact reproduction: ``touch p`` in the working directory."""
    name = "x=__import__('os').system('touch p')"
    return _graph([_node("a", "aten.add_.Tensor", [{"value": name}, 1])], ["a"], input_name=name)


def _kwarg_key_attack(marker: Path) -> dict[str, Any]:
    """A keyword-argument name, which fx wrote unquoted into the call it generated."""
    key = f"alpha={_shell(marker)},beta"
    return _graph([_node("a", "aten.add_.Tensor", [{"value": "x"}, 1], kwargs={key: 1})], ["a"])


def _node_name_attack(marker: Path) -> dict[str, Any]:
    return _graph([_node(f"a={_shell(marker)}", "aten.add_.Tensor", [{"value": "x"}, 1], outputs=["a"])], ["a"])


def _output_name_attack(marker: Path) -> dict[str, Any]:
    name = f"o={_shell(marker)}"
    return _graph([_node("a", "aten.add_.Tensor", [{"value": "x"}, 1], outputs=[name])], [name])


def _string_arg_attack(marker: Path) -> dict[str, Any]:
    """A string argument: it must stay a string (fx writes it with repr)."""
    return _graph([_node("a", "aten.add_.Tensor", [{"value": "x"}, 1]),
                   _node("g", "aten.gelu.default", [{"value": "a"}], kwargs={"approximate": f"'+{_shell(marker)}+'"})],
                  ["g"])


CODE_IN_NAMES = [
    ("the issue's input name", _the_issues_input_name),
    ("input name", _input_name_attack),
    ("kwarg key", _kwarg_key_attack),
    ("node name", _node_name_attack),
    ("output name", _output_name_attack),
    ("string argument", _string_arg_attack),
]


@pytest.mark.parametrize("make", [c[1] for c in CODE_IN_NAMES], ids=[c[0] for c in CODE_IN_NAMES])
def test_names_in_an_inplace_graph_never_run(make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    try:
        g = from_json(json.dumps(make(marker)))
    except GraphError:  # refused, with the project's own error: fine
        pass
    else:  # loaded: the names are kept as they were, as names
        assert {make(marker)["inputs"][0]["name"]} == set(g.input_names)
    assert not marker.exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("make", [c[1] for c in CODE_IN_NAMES], ids=[c[0] for c in CODE_IN_NAMES])
def test_names_never_run_through_the_cli(make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(make(marker)))
    code = main(["segment", str(path)])
    err = capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "p").exists()
    assert code == 0 or (code == 2 and err.startswith("fuseg: error: ") and err.count("\n") == 1), err


# -- op names ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def evil_library(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A shared library whose constructor writes a marker file when it is loaded."""
    cxx = cpu_compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    tmp = tmp_path_factory.mktemp("evil_so")
    marker = tmp / "so_loaded"
    src = tmp / "evil.cpp"
    src.write_text('#include <cstdio>\n__attribute__((constructor)) static void boom() {\n'
                   f'  FILE* f = fopen("{marker}", "w"); if (f) fclose(f);\n}}\n')
    lib = tmp / "evil.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib, marker


@pytest.fixture(scope="module")
def evil_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An importable module that writes a marker file when it is imported."""
    tmp = tmp_path_factory.mktemp("evil_mod")
    marker = tmp / "module_imported"
    (tmp / "fuseg_evil_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp))
        yield "fuseg_evil_mod", marker
    sys.modules.pop("fuseg_evil_mod", None)


def _op_graph(op: str, args: list[Any], outputs: int = 1) -> dict[str, Any]:
    outs = ["b"] if outputs else []
    return _graph([_node("a", "aten.sin.default", [{"value": "x"}]), _node("b", op, args, outputs=outs)],
                  ["a"])


def _load_or_refuse(d: dict[str, Any], check_metas: bool = True) -> None:
    """Load the graph; if it loads (an unknown op), segmenting, compiling and running must refuse it."""
    import torch

    import runtime
    from alias import apply_aliases
    from segmenter import segment

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            g = from_json(json.dumps(d), check_metas=check_metas)
        except GraphFormatError:
            return
    with pytest.raises(GraphError):
        prog = runtime.compile(apply_aliases(segment(g), "post"), backend="torch")
        prog(torch.randn(4))


ATTACK_OPS = ["load_library.__call__.__call__", "import_module.__call__.__call__", "load_library.__call__.default",
              "ops.load_library.default", "aten.__class__.__call__", "aten.sin.__call__", "aten.sin.__dict__",
              "higher_order.__class__", "higher_order.cond", "torch.ops.aten"]


@pytest.mark.parametrize("check_metas", [True, False])
@pytest.mark.parametrize("op", ATTACK_OPS)
def test_op_names_reach_only_real_ops(op: str, check_metas: bool, evil_library, evil_module) -> None:
    lib, so_marker = evil_library
    mod, mod_marker = evil_module
    arg = str(lib) if "load_library" in op else mod
    _load_or_refuse(_op_graph(op, [arg]), check_metas)
    _load_or_refuse(_op_graph(op, [arg], outputs=0), check_metas)
    assert not so_marker.exists() and not mod_marker.exists()


@pytest.mark.parametrize("op", ["load_library.__call__.__call__", "import_module.__call__.__call__"])
def test_op_argument_reaches_only_real_ops(op: str, evil_library, evil_module) -> None:
    """``{"op": ...}``: the custom op ``auto_functionalized`` calls."""
    lib, so_marker = evil_library
    mod, mod_marker = evil_module
    arg = str(lib) if "load_library" in op else mod
    d = _graph([_node("a", "aten.sin.default", [{"value": "x"}]),
                _node("b", "higher_order.auto_functionalized", [{"op": op}], kwargs={"path": arg})], ["a"])
    for check in (True, False):
        _load_or_refuse(d, check)
    assert not so_marker.exists() and not mod_marker.exists()


@pytest.mark.parametrize("name", ["load_library.__call__.__call__", "import_module.__call__.__call__",
                                  "aten.sin.__call__", "aten.__class__.default", "__builtins__.eval.default",
                                  "higher_order.cond", "higher_order.__init__", "aten.sin", "aten.sin.default.x",
                                  "aten.save.default", "aten.from_file.default", "aten._print.default",
                                  "debugprims.load_tensor.default", "profiler._record_function_enter.default",
                                  "_c10d_functional.all_reduce.default", "aten. sin.default", "aten.sin.default "])
def test_resolve_op_refuses_what_is_not_an_op(name: str) -> None:
    import torch

    before = set(vars(torch.ops))
    assert resolve_op(name) is None
    assert set(vars(torch.ops)) == before  # no namespace made up on the way


@pytest.mark.parametrize("name", ["aten.add.Tensor", "aten.sin.default", "higher_order.auto_functionalized",
                                  "higher_order.with_effects", "prims.convert_element_type.default"])
def test_resolve_op_finds_real_ops(name: str) -> None:
    assert resolve_op(name) is not None


def test_file_ops_are_refused_at_load() -> None:
    d = _op_graph("aten.from_file.default", ["/etc/hostname", False, 4], outputs=1)
    with pytest.raises(GraphFormatError, match=r'nodes\[1\] \("b"\)\.op: .*aten.from_file.default'):
        from_json(json.dumps(d))


def test_unknown_op_argument_is_refused_when_compiled() -> None:
    """A well-formed op name torch does not have loads (unchecked) but is never handed to an op."""
    d = _graph([_node("a", "aten.sin.default", [{"value": "x"}]),
                _node("b", "higher_order.auto_functionalized", [{"op": "mylib.nothing.default"}])], ["a", "b"])
    import torch

    import runtime
    from alias import apply_aliases
    from segmenter import segment

    g = from_json(json.dumps(d), check_metas=False)  # auto_functionalized is known; its argument unchecked
    with pytest.raises(GraphError, match=r"op argument mylib\.nothing\.default is not an ATen op known to torch"):
        runtime.compile(apply_aliases(segment(g), "post"), backend="torch")(torch.randn(4))
