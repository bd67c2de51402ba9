"""Bad and oversized graph files get one clear error naming the field, never a traceback or a
stall (issue 14): through ``from_json`` and through ``fuseg segment`` (exit status 2, one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perf.tools.cli import main
from segmenter.formats.serialize import MAX_VIEW_DEPTH, GraphFormatError, from_json, load


def _meta(shape: list[int], stride: list[int] | None = None) -> dict[str, Any]:
    if stride is None:
        stride = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            stride[d] = stride[d + 1] * shape[d + 1]
    return {"shape": shape, "stride": stride, "storage_offset": 0, "dtype": "float32", "device": "cpu"}


X = {"value": "x"}


def _graph(nodes: list[tuple[str, str, list[Any]]], outputs: list[str], x: dict[str, Any] | None = None,
           **extra: Any) -> dict[str, Any]:
    d = {"schema": "fusion-segmenter/graph", "version": 1, "name": "g",
         "inputs": [{"name": "x", "meta": x or _meta([4]), "role": "user", "target": None, "storage": 0}],
         "nodes": [{"name": n, "op": op, "args": args, "kwargs": {}, "outputs": [n], "metas": [_meta([4])]}
                   for n, op, args in nodes],
         "outputs": outputs}
    d.update(extra)
    return d


def _view_chain(n: int) -> dict[str, Any]:
    nodes = [(f"v{i}", "aten.alias.default", [X if i == 0 else {"value": f"v{i - 1}"}]) for i in range(n)]
    return _graph(nodes, [f"v{n - 1}"])


def _with_kwargs(d: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    d["nodes"][0]["kwargs"] = kwargs
    return d


def _gelu_mode(mode: str) -> dict[str, Any]:
    d = _graph(ADD_ + [("g", "aten.gelu.default", [{"value": "a"}])], ["g"])
    d["nodes"][1]["kwargs"] = {"approximate": mode}
    return d


SIN = [("a", "aten.sin.default", [X])]
ADD_ = [("a", "aten.add_.Tensor", [X, 1])]

BAD: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("negative-stride", lambda: _graph(SIN, ["a"], x=_meta([4], [-1])), "inputs[0].meta.stride: negative stride in [-1]"),
    ("numel-overflow", lambda: _graph(SIN, ["a"], x=_meta([2**40, 2**40])),
     "inputs[0].meta: addresses 4835703278458516698824704 bytes of storage (at most 2**48)"),
    ("rank", lambda: _graph(SIN, ["a"], x=_meta([1] * 65)), "inputs[0].meta.shape: rank 65 (at most 64)"),
    ("integer-over-64-bits", lambda: _graph([("a", "aten.add.Tensor", [X, 2**64])], ["a"]),
     'nodes[0] ("a").args[1]: integer 18446744073709551616 does not fit in 64 bits'),
    ("deep-view-chain", lambda: _view_chain(MAX_VIEW_DEPTH + 1),
     f'node "v{MAX_VIEW_DEPTH}": a chain of {MAX_VIEW_DEPTH + 1} view ops (at most {MAX_VIEW_DEPTH})'),
    ("duplicate-node-in-inplace-graph", lambda: _graph(ADD_ + [("a", "aten.mul_.Tensor", [X, 2])], ["a"]),
     "nodes[1]: duplicate node name 'a' (also nodes[0])"),
    ("torch-error-in-functionalization", lambda: _gelu_mode("bogus"),
     "node 'g' (aten.gelu.default): RuntimeError: approximate argument must be either none or tanh"),
    ("argument-of-the-wrong-type", lambda: _graph([("a", "aten.add_.Tensor", [X, "one"])], ["a"]),
     "nodes[0] (\"a\").args[1]: aten.add_.Tensor takes Tensor for 'other', got str 'one'"),
    ("list-where-a-tensor-goes", lambda: _graph([("a", "aten.sin.default", [[X]])], ["a"]),
     "nodes[0] (\"a\").args[0]: aten.sin.default takes Tensor for 'self', got a list of 1"),
    ("tensor-where-ints-go", lambda: _graph([("a", "aten.sum.dim_IntList", [X, X])], ["a"]),
     "nodes[0] (\"a\").args[1]: aten.sum.dim_IntList takes Optional[List[int]] for 'dim', got tensor %x"),
    ("too-many-arguments", lambda: _graph([("a", "aten.sin.default", [X, 1])], ["a"]),
     "nodes[0] (\"a\"): aten.sin.default takes 1 positional arguments, got 2"),
    ("missing-argument", lambda: _graph([("a", "aten.add_.Tensor", [X])], ["a"]),
     "nodes[0] (\"a\"): aten.add_.Tensor: argument 'other' is missing"),
    ("keyword-the-op-lacks", lambda: _with_kwargs(_graph(ADD_, ["a"]), {"alpah": 2}),
     "nodes[0] (\"a\").kwargs.alpah: aten.add_.Tensor has no argument 'alpah'"),
    ("keyword-given-twice", lambda: _with_kwargs(_graph(ADD_, ["a"]), {"other": 2}),
     "nodes[0] (\"a\").kwargs.other: aten.add_.Tensor: argument 'other' given twice"),
    ("op-as-an-argument-of-an-aten-op", lambda: _graph([("a", "aten.add.Tensor", [X, {"op": "aten.sin.default"}])], ["a"]),
     "nodes[0] (\"a\").args[1]: aten.add.Tensor takes Tensor for 'other', got op aten.sin.default"),
    ("non-tensor-output-of-inplace-graph", lambda: _graph(ADD_ + [("s", "aten.sym_size.int", [X, 0])], ["s"]),
     "node 's': output 's' is a int, not a tensor"),
    ("unknown-op-among-inplace-ops", lambda: _graph(ADD_ + [("f", "mylib.frob.default", [X])], ["f"]),
     "node 'f': mylib.frob.default is unknown to torch"),
]


@pytest.mark.filterwarnings("ignore:unknown op")
@pytest.mark.parametrize("check_metas", [True, False])
@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_naming_the_field(name, make, message: str, check_metas: bool) -> None:
    with pytest.raises(GraphFormatError) as err:
        from_json(json.dumps(make()), check_metas=check_metas)
    assert message in str(err.value)


@pytest.mark.filterwarnings("ignore:unknown op")
@pytest.mark.parametrize("name,make,message", BAD, ids=[b[0] for b in BAD])
def test_cli_says_one_line_and_exits_2(name, make, message: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(make()))
    assert main(["segment", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuseg: error: ") and err.count("\n") == 1 and message in err


def test_a_file_that_is_not_text(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"schema": \xff\xfe}')
    with pytest.raises(GraphFormatError, match="not UTF-8 text: byte 11"):
        load(str(path))
    assert main(["segment", str(path)]) == 2
    assert capsys.readouterr().err.startswith("fuseg: error: not UTF-8 text")


def test_run_with_inputs_too_large_to_make(tmp_path: Path, capsys) -> None:
    path = tmp_path / "big.json"
    big = _meta([2**22, 2**22])  # 64 TiB: a legal layout, no memory to make it
    d = _graph([("a", "aten.sin.default", [X])], ["a"], x=big)
    d["nodes"][0]["metas"] = [big]
    path.write_text(json.dumps(d))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuseg: error: g: cannot make random inputs of 17592186044416 elements") and err.count("\n") == 1


def test_run_a_graph_whose_ops_refuse_random_inputs(tmp_path: Path, capsys) -> None:
    """An embedding of 2 rows indexed with random ints up to 7: the graph's own error, one line."""
    d = _graph([("a", "aten.embedding.default", [{"value": "w"}, {"value": "i"}])], ["a"], x=_meta([2, 4]))
    d["inputs"] = [{"name": "w", "meta": _meta([2, 4]), "role": "user", "target": None, "storage": 0},
                   {"name": "i", "meta": {**_meta([3]), "dtype": "int64"}, "role": "user", "target": None, "storage": 1}]
    d["nodes"][0]["metas"] = [_meta([3, 4])]
    path = tmp_path / "embed.json"
    path.write_text(json.dumps(d))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == "fuseg: error: g: the graph's ops raise on random inputs: IndexError: index out of range in self\n"


# -- size: near-linear loading -------------------------------------------------------------

def test_many_outputs_of_an_inplace_graph_load_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """One in-place node and 200k listed outputs took ~20 s (every listing traced); now each
    distinct output is traced once and the repeats are views of it. (Tests assert no times: the
    fx graph handed to functionalization holds one output, whatever the listing.)"""
    import segmenter.capturing.functionalize as functionalize

    traced: list[int] = []
    real = functionalize.from_fx

    def counting(gm, *args, **kwargs):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        traced.append(len(out.args[0]))
        return real(gm, *args, **kwargs)

    monkeypatch.setattr(functionalize, "from_fx", counting)
    n = 200_000
    g = from_json(json.dumps(_graph(ADD_, ["a"] * n)))
    assert traced == [1]
    assert len(g.outputs) == n and len(set(g.outputs)) == 1 and len(set(g.output_aliases)) == 1
    assert g.output_aliases[0] is not None and g.output_aliases[0].source == "input"


def test_the_deepest_view_chain_loads() -> None:
    """torch keeps a view's whole chain, so each op on a deep view costs time in its depth: 4000
    chained views took 18 s to check on FakeTensors (quadratic). Chains are bounded at load
    (``deep-view-chain`` above), and propagation re-makes each view from its base."""
    g = from_json(json.dumps(_view_chain(MAX_VIEW_DEPTH)))
    assert len(g.nodes) == MAX_VIEW_DEPTH


def test_torch_does_not_add_its_own_traceback(tmp_path: Path) -> None:
    """FakeTensorMode logs a 30-line traceback for an op it cannot run; fuseg's error stays one line
    (a subprocess: pytest's log capture would hide the logging)."""
    d = _graph([("a", "aten.mul.Tensor", [X, X])], ["a"])
    d["inputs"][0]["meta"] = _meta([4, 6])
    d["nodes"][0]["metas"] = [_meta([4, 4])]
    d["inputs"].append({"name": "w", "meta": _meta([4, 4]), "role": "user", "target": None, "storage": 1})
    d["nodes"][0]["args"] = [X, {"value": "w"}]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "perf.tools.cli", "segment", str(path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2
    assert done.stderr.startswith("fuseg: error: shape metadata contradicts the ops: node 'a' (aten.mul.Tensor): "
                                  "RuntimeError: Attempting to broadcast") and done.stderr.count("\n") == 1, done.stderr
