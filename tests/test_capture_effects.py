"""Programs torch.export hands over in unusual forms: ops with side effects (effect tokens),
numbers read back with ``.item()`` as outputs, complex scalars, data-dependent checks (istft)
and data-dependent shapes (refused, saying why)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from alias import apply_aliases, check
from runtime.compiled.program import CompiledProgram
from segmenter import CaptureError, capture, segment
from segmenter.capturing.reference import clone_inputs, run_graph
from segmenter.formats.serialize import GraphFormatError, from_json, graph_to_dict, to_json


def _spd(n: int = 3) -> torch.Tensor:
    a = torch.randn(n, n)
    return a @ a.T + n * torch.eye(n)


LINALG = [
    ("inv", lambda x: torch.linalg.inv(x)),
    ("cholesky", lambda x: torch.linalg.cholesky(x)),
    ("solve", lambda x: torch.linalg.solve(x, x[:, :1] + 1)),
    ("inv_ex", lambda x: torch.linalg.inv_ex(x).inverse),
    ("matrix_power-neg", lambda x: torch.linalg.matrix_power(x, -2)),
    ("tensorinv", lambda x: torch.linalg.tensorinv(x, ind=1)),
    ("inv-then-pointwise", lambda x: (torch.linalg.inv(x) * 2 + x, torch.linalg.det(x))),
]


def _compiled(graph):
    segmented = segment(graph)
    for mode in ("post", "pre", "off"):
        plan = apply_aliases(segmented, mode)
        assert not check(segmented, plan), check(segmented, plan)
        yield CompiledProgram(plan)


@pytest.mark.parametrize("name,fn", LINALG, ids=[c[0] for c in LINALG])
def test_ops_with_effect_tokens(name, fn) -> None:
    """Export threads a token through ``_linalg_check_errors``: it stays a node run for its effect,
    so a singular matrix raises as in eager."""
    torch.manual_seed(0)
    x = _spd()
    graph = capture(fn, (x,))
    expected = fn(x)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    singular = torch.zeros(3, 3)
    try:
        fn(singular)
        eager_error = None
    except Exception as e:  # noqa: BLE001 - whatever eager raises, we must raise too
        eager_error = type(e)
    for run in (lambda t: run_graph(graph, [t]), *_compiled(graph)):
        for g, e in zip(run(x), expected):
            torch.testing.assert_close(g, e)
        if eager_error is not None:
            with pytest.raises(eager_error):
                run(singular.clone())


def _sum_item(x):
    return x.sum().item()


def _mixed(x):
    return x + 1, x.max().item(), (x > 0).sum().item(), x.argmax().item()


@pytest.mark.parametrize("fn", [_sum_item, _mixed], ids=lambda f: f.__name__)
def test_numbers_read_back_are_returned_as_numbers(fn) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    graph = capture(fn, (x,))
    expected = fn(x)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    again = from_json(to_json(graph))
    assert again == graph and again.scalar_outputs == graph.scalar_outputs
    for run in (lambda t: run_graph(again, [t]), *_compiled(graph)):
        got = run(x)
        assert [type(g) for g in got] == [type(e) for e in expected]
        for g, e in zip(got, expected):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(g, e)
            else:
                assert g == pytest.approx(e, rel=1e-6)


def test_complex_item_is_refused_by_export() -> None:
    """torch.export cannot trace ``.item()`` of a complex tensor: a clean refusal."""
    with pytest.raises(CaptureError, match="torch.export failed.*complex64"):
        capture(lambda x: (x * 1j).sum().item(), (torch.randn(3),))


def test_a_number_read_back_and_used_again_is_refused() -> None:
    with pytest.raises(CaptureError, match=r"reads back from a tensor \(\.item\(\)\)"):
        capture(lambda x: x * x.sum().item(), (torch.randn(3),))


def test_scalar_output_must_be_one_element() -> None:
    d = graph_to_dict(capture(lambda x: (x + 1, x.sum().item()), (torch.randn(3),)))
    d["scalar_outputs"] = [0]
    with pytest.raises(GraphFormatError, match="scalar_outputs.*not a one-element tensor"):
        from_json(json.dumps(d))
    d["scalar_outputs"] = [7]
    with pytest.raises(GraphFormatError, match="scalar_outputs"):
        from_json(json.dumps(d))


COMPLEX = [
    ("full_like", lambda x: torch.full_like(x, 1 + 2j)),
    ("mul-add", lambda x: x * (1 + 2j) + 2j),
    ("inf-part", lambda x: torch.full_like(x, complex(math.inf, -0.5))),
    ("real-times-complex", lambda x: x.real * (0.5 - 1j)),
]


@pytest.mark.parametrize("name,fn", COMPLEX, ids=[c[0] for c in COMPLEX])
def test_complex_scalar_constants(name, fn) -> None:
    x = torch.randn(4, dtype=torch.complex64)
    graph = capture(fn, (x,))
    again = from_json(to_json(graph))
    assert again == graph
    for run in (lambda t: run_graph(again, [t]), *_compiled(again)):
        (got,) = run(x)
        torch.testing.assert_close(got, fn(x), equal_nan=True)


@pytest.mark.parametrize("arg,words", [
    ({"complex": [1, 2, 3]}, "[real, imag]"),
    ({"complex": "1+2j"}, "[real, imag]"),
    ({"complex": [1, "x"]}, "imaginary part"),
    ({"complex": [True, 0]}, "real part"),
    ({"complex": [{"float": "huge"}, 0]}, "real part"),
])
def test_hostile_complex_literals_are_refused(arg, words) -> None:
    d = graph_to_dict(capture(COMPLEX[0][1], (torch.randn(4, dtype=torch.complex64),)))
    d["nodes"][0]["args"][1] = arg
    with pytest.raises(GraphFormatError) as err:
        from_json(json.dumps(d))
    assert words in str(err.value) and "args[1]" in str(err.value)


def test_istft_of_complex_input() -> None:
    """istft checks its window's overlap in eager with a data-dependent ``equal`` that FakeTensors
    cannot run: the program is observed on real copies of the inputs instead."""
    x = torch.randn(5, 4, dtype=torch.complex64)
    fn = lambda t: torch.istft(t, 8)  # noqa: E731
    graph = capture(fn, (x,))
    for run in (lambda t: run_graph(graph, [t]), *_compiled(graph)):
        (got,) = run(x)
        torch.testing.assert_close(got, fn(x), atol=1e-5, rtol=1e-5)


def test_istft_on_fake_inputs_is_refused_naming_the_op() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(5, 4, dtype=torch.complex64))
    with pytest.raises(CaptureError, match="needs the values of its inputs.*fake or on meta"):
        capture(lambda t: torch.istft(t, 8), (x,))


@pytest.mark.parametrize("fn", [torch.nonzero, lambda x: torch.masked_select(x, x > 0), torch.unique],
                         ids=["nonzero", "masked_select", "unique"])
def test_data_dependent_shapes_say_why(fn) -> None:
    with pytest.raises(CaptureError) as err:
        capture(fn, (torch.randn(6),))
    msg = str(err.value)
    assert "depends on the values of the inputs" in msg and "concrete example inputs" not in msg, msg


def test_program_inputs_survive_the_real_run() -> None:
    """The real-copy run (istft) must not touch the caller's tensors."""
    x = torch.randn(5, 4, dtype=torch.complex64)
    before = clone_inputs([x])[0]

    def f(t):
        out = torch.istft(t, 8)
        t.mul_(2)
        return out

    graph = capture(f, (x,))
    assert torch.equal(x, before) and list(graph.mutated_inputs) == [0]


def _mutate_then_inv(x):
    x.add_(1)
    return torch.linalg.inv(x)


@pytest.mark.parametrize("name,fn", [*LINALG, ("mutate-then-inv", _mutate_then_inv)],
                         ids=[c[0] for c in LINALG] + ["mutate-then-inv"])
def test_effect_tokens_through_torch_compile(name, fn) -> None:
    """AOTAutograd threads effect tokens through its graph as inputs (None at run time) and
    outputs (dropped): runtime.dynamo strips them; the check still raises."""
    from torch._dynamo.backends.common import aot_autograd

    from runtime.dynamo import FusegCompiler

    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        x = _spd()
        compiler = FusegCompiler()
        compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=compiler, keep_inference_input_mutations=True))
        (e_in,), (c_in,) = clone_inputs([x]), clone_inputs([x])
        expected, got = fn(e_in), compiled(c_in)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(c_in, e_in)
        assert compiler.compiled
        singular = torch.zeros(3, 3) - (1 if name == "mutate-then-inv" else 0)
        try:
            fn(singular.clone())
        except torch.linalg.LinAlgError:
            with pytest.raises(torch.linalg.LinAlgError):
                compiled(singular.clone())
            assert any(n.op == "aten._linalg_check_errors.default" for p in compiler.compiled for n in p.graph.nodes)
        else:  # inv_ex reports through its info output instead
            compiled(singular.clone())
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("fn,words", [
    (lambda x: x.to_sparse(), "output is a torch.sparse_coo tensor"),
    (lambda x: torch.equal(x, x + 1), "aten.equal.default computes a value from the data of its inputs"),
], ids=["sparse-output", "equal"])
def test_clean_refusals(fn, words) -> None:
    with pytest.raises(CaptureError, match=words):
        capture(fn, (torch.randn(3, 2),))


def test_sparse_input_is_refused() -> None:
    with pytest.raises(CaptureError, match="argument 0 is a torch.sparse_coo tensor"):
        capture(lambda x: x * 2, (torch.randn(3, 2).to_sparse(),))


def test_export_failure_on_a_data_dependent_shape_says_why() -> None:
    with pytest.raises(CaptureError, match="linalg_lstsq.default has an output shape that depends on the values"):
        capture(lambda a, b: torch.linalg.lstsq(a, b).solution, (torch.randn(4, 3), torch.randn(4, 2)))


_GLOBAL = torch.zeros(3)


def _writes_a_global(x):
    _GLOBAL.add_(1)
    return x + _GLOBAL


def _writes_a_global_and_reads_back(x):
    _GLOBAL.add_(1)
    return x.sum().item()


@pytest.mark.parametrize("fn", [_writes_a_global, _writes_a_global_and_reads_back], ids=lambda f: f.__name__)
def test_capture_never_writes_the_callers_globals(fn) -> None:
    """FakeTensorMode runs an op on real tensors for real: the observation run refuses a write to
    a tensor the program was not given before it lands (export would mutate it too)."""
    with pytest.raises(CaptureError, match="writes to a tensor the program was not given"):
        capture(fn, (torch.randn(3),))
    assert torch.equal(_GLOBAL, torch.zeros(3))


@pytest.mark.parametrize("fn", [lambda x: torch.nn.functional.dropout(x, 0.5) * 2,
                                lambda x: torch.nn.functional.dropout(x, 0.5).sum().item()],
                         ids=["dropout", "dropout-item"])
def test_capture_keeps_the_random_state(fn) -> None:
    """The run on real copies (``.item()``) draws from the generator; the caller's state is kept."""
    x = torch.randn(4)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    capture(fn, (x,))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("fn", [lambda x: None, lambda x: (x + 1, None), lambda x: (None, x * 2, None)],
                         ids=["none", "tensor-none", "none-tensor-none"])
def test_none_outputs_are_not_values(fn) -> None:
    graph = capture(fn, (torch.randn(3),)) if fn(torch.randn(3)) is not None else None
    if graph is None:  # returns nothing and mutates nothing: no graph to make
        with pytest.raises(Exception, match="has no outputs"):
            capture(fn, (torch.randn(3),))
        return
    assert len(graph.outputs) == 1


def test_a_write_into_an_input_whose_elements_share_memory_is_refused_at_capture() -> None:
    """Found by the capture fuzzer: ``x[::2].add_(1)`` on an expanded x (stride 0). Eager writes
    the one element, which every element of x is; the functional graph's write-back value
    (slice_scatter) changes only the first, so no write-back can give eager's memory. Capture made
    that graph anyway, the loader refused it and the program raised eager's error for a write into
    overlapping memory, which eager does not raise here. Capture now refuses it, naming the input,
    as the loader does."""
    def f(x):
        x[::2].add_(1)
        return x

    x = torch.tensor([4.6230]).expand(2)
    with pytest.raises(CaptureError, match="elements that share memory"):
        capture(f, [x])
    # the same program on an input with its own memory per element is captured and runs
    y = torch.tensor([4.6230, 4.6230])
    graph = capture(f, [y.clone()])
    ins = clone_inputs([y])
    (out,) = run_graph(graph, ins)
    assert torch.equal(out, f(y.clone())) and torch.equal(ins[0], torch.tensor([5.6230, 4.6230]))
