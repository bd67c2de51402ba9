"""Hostile-input fuzzing of JSON graphs (issue 14): mutants of graphs exported from real programs
must be refused with the project's own error or run and match the reference semantics, and no
mutant may run code (Note [the hostile-input oracle] in tests/hostile.py).

``FUSEG_HOSTILE_MUTANTS`` sets how many mutants per seed graph (default 150, 600 in all, what CI runs; the
same ones every run unless ``FUSEG_HOSTILE_RANDOM=1``, which prints its seed). Each distinct
finding is kept below as a named regression test.
"""

from __future__ import annotations

import functools
import json
import os
import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from perf.zoo import rope_it_all
from segmenter import capture
from segmenter.formats.serialize import GraphFormatError, from_json, graph_to_dict

from .hostile import check_mutant, mutate

MUTANTS = int(os.environ.get("FUSEG_HOSTILE_MUTANTS", "150"))
_RANDOM = os.environ.get("FUSEG_HOSTILE_RANDOM", "0") == "1"
OUTCOMES: Counter = Counter()


def _rope() -> dict[str, Any]:
    fn = functools.partial(rope_it_all, n_head=4, n_query_groups=2, head_size=8, rope_n_elem=4)
    fn.__name__ = "rope_it_all"  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(0)
    x, cos, sin = torch.randn(1, 4, 64, generator=g), torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    return graph_to_dict(capture(fn, [x, cos, sin]))


def _norm_and_matmul(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.softmax(x @ w, dim=-1)
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return h + b, n[:, 1:].sum(0)


def _aliases_and_mutations(x: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.t()[1:]
    x.mul_(2)
    acc.add_(x.sum())
    t = acc * 3
    return y, x, t[0:2], t[2:], t.t()


def _inplace_nodes() -> dict[str, Any]:
    """A graph as another fuser hands it over, with in-place nodes (functionalized on load)."""
    def meta(shape: list[int], stride: list[int], offset: int = 0) -> dict[str, Any]:
        return {"shape": shape, "stride": stride, "storage_offset": offset, "dtype": "float32", "device": "cpu"}

    def node(name: str, op: str, args: list[Any], m: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "op": op, "args": args, "kwargs": {}, "outputs": [name], "metas": [m]}

    x, w = {"value": "x"}, {"value": "w"}
    return {
        "schema": "fusion-segmenter/graph", "version": 1, "name": "inplace",
        "inputs": [{"name": "x", "meta": meta([4, 4], [4, 1]), "role": "user", "target": None, "storage": 0},
                   {"name": "w", "meta": meta([4], [1]), "role": "parameter", "target": "w", "storage": 1}],
        "nodes": [node("y", "aten.mul.Tensor", [x, w], meta([4, 4], [4, 1])),
                  node("a", "aten.add_.Tensor", [x, 1], meta([4, 4], [4, 1])),
                  node("b", "aten.mul_.Tensor", [x, {"value": "y"}], meta([4, 4], [4, 1])),
                  node("v", "aten.slice.Tensor", [x, 0, 1, 4], meta([3, 4], [4, 1], 4)),
                  node("s", "aten.sin.default", [{"value": "v"}], meta([3, 4], [4, 1])),
                  node("r", "aten.sum.dim_IntList", [{"value": "s"}, [1], False], meta([3], [1]))],
        "outputs": ["y", "v", "r"],
    }


@functools.cache
def seed_graphs() -> dict[str, str]:
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seeds = {
            "rope": _rope(),
            "norm-and-matmul": graph_to_dict(capture(_norm_and_matmul, [
                torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g), torch.randn(8, generator=g)])),
            "aliases-and-mutations": graph_to_dict(capture(_aliases_and_mutations, [
                torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)])),
            "inplace-nodes": _inplace_nodes(),
        }
    return {k: json.dumps(v) for k, v in seeds.items()}


@pytest.mark.parametrize("seed_name", ["rope", "norm-and-matmul", "aliases-and-mutations", "inplace-nodes"])
def test_hostile_mutants(seed_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = json.loads(seed_graphs()[seed_name])
    assert check_mutant(json.dumps(seed))[0] == "ran and matched"  # the seed itself runs
    monkeypatch.chdir(tmp_path)  # a payload that writes a relative path writes here
    marker = tmp_path / "MARKER"
    base = random.randrange(2**32) if _RANDOM else 14
    if _RANDOM:
        print(f"FUSEG_HOSTILE_RANDOM seed for {seed_name}: {base}")
    rng = random.Random(f"{seed_name}/{base}")
    findings = []
    for k in range(MUTANTS):
        kind, what, text = mutate(seed, rng, marker)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome, finding = check_mutant(text, check_metas=k % 4 != 3)
        OUTCOMES[outcome] += 1
        OUTCOMES.update(f"mutator:{m}" for m in set(kind.split("+")))
        if finding is not None:
            findings.append(f"mutant {k} ({what}): {finding}")
        assert not marker.exists(), f"mutant {k} ({what}) wrote the marker file"
        assert sorted(p.name for p in tmp_path.iterdir()) == [], f"mutant {k} ({what}) wrote a file in the cwd"
    assert not findings, "\n".join(findings[:10])


# -- findings: each one the fuzzer made, kept as a named regression test ---------------------

def _seed(name: str) -> dict[str, Any]:
    return json.loads(seed_graphs()[name])


def test_finding_undefined_output_of_an_inplace_graph() -> None:
    """A KeyError from functionalization: outputs of an in-place graph were looked up unchecked."""
    d = _seed("inplace-nodes")
    d["outputs"][0] = "__import__('os').system('touch MARKER')"
    assert check_mutant(json.dumps(d)) == ("refused at load", None)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_finding_unsigned_input_of_a_generated_kernel(dtype: str) -> None:
    """The C++ backend raised KeyError on an input dtype it has no type for; now it declines the
    segment (which runs on torch)."""
    d = _seed("inplace-nodes")
    d["inputs"][1]["meta"]["dtype"] = dtype
    assert check_mutant(json.dumps(d)) == ("ran and matched", None)


@pytest.mark.parametrize("dtype", ["qint8", "quint8", "qint32"])
def test_finding_quantized_dtype(dtype: str) -> None:
    """from_json raised NotImplementedError: no tensor (nor FakeTensor) of a quantized dtype can be made."""
    d = _seed("norm-and-matmul")
    d["inputs"][1]["meta"]["dtype"] = dtype
    assert check_mutant(json.dumps(d)) == ("refused at load", None)
    with pytest.raises(GraphFormatError, match=f"inputs\\[1\\].meta.dtype: unknown dtype '{dtype}'"):
        from_json(json.dumps(d))


def test_finding_cast_written_back_in_place() -> None:
    d = _seed("inplace-nodes")
    d["inputs"][0]["meta"]["dtype"] = "bfloat16"
    assert check_mutant(json.dumps(d)) == ("ran and matched", None)


def test_finding_bool_scalar_in_a_generated_kernel() -> None:
    d = _seed("norm-and-matmul")
    assert d["nodes"][2]["op"] == "aten.pow.Tensor_Scalar"
    d["nodes"][2]["args"][1] = True  # x ** True: torch takes a bool Scalar
    assert check_mutant(json.dumps(d))[1] is None
