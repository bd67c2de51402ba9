"""Conjugate and negative bits (segmenter.ir.graph Note [conjugate and negative bits]): programs whose
outputs are lazy conj/neg views, in every alias mode and backend, against eager: values (after
resolving the bits), the bits themselves, strides, aliasing, mutated inputs."""

from __future__ import annotations

import pytest
import torch

import runtime
from alias import MODES, apply_aliases, check
from segmenter import CaptureError, SegmenterOptions, capture, segment

from .util import assert_matches_eager

ONE_OP = SegmenterOptions(max_ops_per_segment=1)


def _c(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.complex64)


def _conj_then_mutate(x):
    y = x.conj()
    x.mul_(2)
    return y


def _conj_twice_out(x):
    c = x.conj()
    return c, c.t()


# name, program, inputs
TABLE = [
    ("conj", lambda x: x.conj(), lambda: [_c(3, 4)]),
    ("H", lambda x: x.H, lambda: [_c(3, 4)]),
    ("mH", lambda x: x.mH, lambda: [_c(2, 3, 4)]),
    ("conj-of-slice", lambda x: x[1:, ::2].conj(), lambda: [_c(3, 4)]),
    ("conj-of-conj", lambda x: x.conj().conj(), lambda: [_c(3, 4)]),
    ("conj-of-intermediate", lambda x: (x * 2).conj(), lambda: [_c(3, 4)]),
    ("conj-then-compute", lambda x: x.conj() * 2 + 1, lambda: [_c(3, 4)]),
    ("conj-output-and-its-view", _conj_twice_out, lambda: [_c(3, 4)]),
    ("conj-view-then-input-mutated", _conj_then_mutate, lambda: [_c(3, 4)]),
    ("imag-of-conj-neg-bit", lambda x: x.conj().imag, lambda: [_c(3, 4)]),
    ("imag-of-conj-times-2", lambda x: x.conj().imag * 2, lambda: [_c(3, 4)]),
    ("neg-view-of-real", lambda r: torch._neg_view(r), lambda: [torch.randn(3, 4)]),
    ("neg-view-then-compute", lambda r: torch._neg_view(r) + 1, lambda: [torch.randn(3, 4)]),
    ("conj-of-real-is-itself", lambda r: r.conj(), lambda: [torch.randn(3, 4)]),
    ("view-as-real", lambda x: torch.view_as_real(x), lambda: [_c(3, 4)]),
    ("view-as-real-of-resolved-conj", lambda x: torch.view_as_real(x.conj().resolve_conj()), lambda: [_c(3, 4)]),
    ("view-as-complex", lambda r: torch.view_as_complex(r), lambda: [torch.randn(3, 4, 2)]),
    ("fft-ifft-real", lambda r: torch.fft.ifft(r), lambda: [torch.randn(3, 8)]),
    ("fft-ihfft-real", lambda r: torch.fft.ihfft(r), lambda: [torch.randn(3, 8)]),
    ("fft-ihfftn-real", lambda r: torch.fft.ihfftn(r), lambda: [torch.randn(4, 6)]),
]


_GRAPHS: dict[str, tuple] = {}


def _captured(name, fn, make_inputs):
    """One capture per program for the whole table (capture is the slow part)."""
    if name not in _GRAPHS:
        torch.manual_seed(0)
        inputs = make_inputs()
        _GRAPHS[name] = (inputs, capture(fn, inputs))
    return _GRAPHS[name]


@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,fn,make_inputs", TABLE, ids=[t[0] for t in TABLE])
def test_conj_neg_table(name, fn, make_inputs, mode, backend) -> None:
    inputs, graph = _captured(name, fn, make_inputs)
    for options in (None, ONE_OP):
        sf = segment(graph, options)
        plan = apply_aliases(sf, mode)
        assert check(sf, plan) == []
        program = runtime.compile(plan, backend=backend)
        assert_matches_eager(fn, inputs, graph, program=program)
        if backend == "cpp":  # complex values and bits are declined with a reason, never misread
            for seg in plan.segments:
                touched = [graph.metas[v] for v in seg.inputs] + [m for n in seg.nodes for m in n.metas if m]
                if program.backend_of.get(seg.index) == "cpp":
                    assert not any(m.dtype.is_complex or m.conj or m.neg for m in touched), seg


def test_view_as_real_of_a_conj_view_is_refused_as_eager_refuses() -> None:
    x = _c(3, 4)
    with pytest.raises(RuntimeError, match="conjugate"):
        torch.view_as_real(x.conj())
    with pytest.raises(CaptureError):
        capture(lambda x: torch.view_as_real(x.conj()), [x])


def test_cpp_declines_complex_with_a_reason() -> None:
    """It used to raise KeyError: torch.complex64 from the kernel generator."""
    x = _c(3, 4)
    for fn in (lambda x: x * 2 + 1, lambda x: x.abs() + 1, lambda x: x.real * 2):
        graph = capture(fn, [x])
        program = runtime.compile(apply_aliases(segment(graph), "post"), backend="cpp")
        reasons = [why for passed in program.passed_over.values() for _, why in passed]
        assert any("complex" in why or "not supported" in why for why in reasons), reasons
        assert_matches_eager(fn, [x], graph, program=program)


def test_inputs_with_a_bit_must_match_the_graph() -> None:
    x = _c(3, 4)
    graph = capture(lambda x: x * 2, [x])
    program = runtime.compile(apply_aliases(segment(graph), "post"))
    from segmenter import GraphError

    with pytest.raises(GraphError, match="input 'x'"):
        program(x.conj())



def test_bits_round_trip_through_json_and_are_checked() -> None:
    import json

    from segmenter.formats.serialize import GraphFormatError, from_json, to_json

    graph = capture(lambda x: x.mH, [_c(2, 3)])
    assert any(m.conj for n in graph.nodes for m in n.metas if m)
    assert from_json(to_json(graph)) == graph
    d = json.loads(to_json(capture(lambda r: r * 2, [torch.randn(3)])))
    d["inputs"][0]["meta"]["conj"] = True  # a float value cannot carry the conjugate bit
    with pytest.raises(GraphFormatError, match=r"inputs\[0\]"):
        from_json(json.dumps(d))
    d["inputs"][0]["meta"]["conj"] = "yes"
    with pytest.raises(GraphFormatError, match="conj"):
        from_json(json.dumps(d))
