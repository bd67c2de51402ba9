"""Note [tables of a small input's values] (runtime/codegen/lowering/tables.py): a CPU pointwise loop that
applies a transcendental to a small input broadcast over it reads a table filled once per call
instead of calling the function per element. Each program runs at two shapes against eager, and
bit for bit against the same kernel without tables (the table's value is the same call on the
same float); the CPU source is read for the tables (and for their absence where the rule does
not hold)."""

from __future__ import annotations

import re

import pytest
import torch

import runtime
from alias import apply_aliases
from runtime.codegen.build import cpu_compiler
from runtime.codegen.lowering.tables import MIN_REUSE, TABLE_MAX, tabulate
from segmenter import capture, segment

from .util import assert_matches_eager

needs_compiler = pytest.mark.skipif(cpu_compiler() is None, reason="no C++ compiler")


def _program(fn, inputs):
    return runtime.compile(apply_aliases(segment(capture(fn, inputs)), "post"), backend="cpp")


def _cpu_sources(prog) -> list[str]:
    return [la.kernel.source("cpu").split("#else")[-1] for la in prog._chosen.values()
            if getattr(la, "kernel", None) is not None]


def _rope_backward_like(g, angles):
    """What a RoPE's backward recomputes (phi3, Llama): sin and cos of the (1, seq, dim) angle
    table, broadcast over batch and heads, in the rotate-half pieces."""
    s, c = angles.sin().unsqueeze(1), angles.cos().unsqueeze(1)
    half = g.shape[-1] // 2
    gs = g * s
    return torch.cat([gs[..., half:], -gs[..., :half]], -1) + g * c


def _log_of_scale(x, b):
    return x * b.log()  # a row of logs reused down every row


def _sin_of_itself(x):
    return x.sin() * 2  # full size: nothing to reuse


def _small_loop(x, b):
    return x * b.cos()  # a broadcast reused only twice: below MIN_REUSE


# name -> (program, inputs at a size, tables expected in the CPU source, functions tabulated)
CASES = {
    "rope-backward": (_rope_backward_like, lambda n: [torch.randn(2, 4, n, 16), torch.randn(1, n, 16) * 3], 2,
                      {"sin", "cos"}),
    "log-of-scale": (_log_of_scale, lambda n: [torch.randn(n, 64), torch.rand(64) + 0.5], 1, {"log"}),
    "sin-of-itself": (_sin_of_itself, lambda n: [torch.randn(n, 64)], 0, set()),
    "small-loop": (_small_loop, lambda n: [torch.randn(2, n, 8), torch.randn(n, 8)], 0, set()),
}


@needs_compiler
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [24, 40])
def test_tables_of_small_inputs(case: str, n: int, monkeypatch) -> None:
    fn, make, tables, functions = CASES[case]
    inputs = make(n)
    prog = _program(fn, inputs)
    cpu = "\n".join(_cpu_sources(prog))
    fills = re.findall(r"(fuseg_tab\d+)\[k_\] = ([a-z0-9]+)\(", cpu)
    assert len(fills) == tables, cpu
    assert {f for _, f in fills} == functions
    for table, f in fills:  # every call of a tabulated function left in the loop is gone
        assert re.search(rf"= {f}\(t\d+\);", cpu) is None, cpu
        assert f"{table}[" in cpu.split(f"{table}[k_]")[-1], cpu
    assert_matches_eager(fn, inputs, prog.graph, program=prog)
    # the table holds the very call the loop made: the same bits as the kernel without tables
    import runtime.codegen.lowering.lower as lower

    monkeypatch.setattr(lower, "tabulate", lambda lines, *a, **k: (lines, []))
    plain = _program(fn, inputs)
    assert "fuseg_tab" not in "\n".join(_cpu_sources(plain))
    for got, want in zip(prog(*inputs), plain(*inputs)):
        assert torch.equal(got, want)


def test_the_rule_on_source_lines() -> None:
    """``tabulate`` on body lines: only a tabulated function of a float32 input's load, of plain
    sizes, a span within TABLE_MAX and reused MIN_REUSE times; the fill uses the loop's threads."""
    body = ["    const float t1 = ((float)in0[i_0 * 8 + i_1]);",
            "    const float t2 = sin(t1);",
            "    const float t3 = ((float)in1[i_1]);",
            "    const float t4 = log(t3);",
            "    const float t5 = fabs(t3);",
            "    out0[i_0 * 8 + i_1] = t2 * t4 * t5;"]
    names = iter(f"tab{k}" for k in range(10))
    inputs = {"in0": (torch.float32, (64, 8), (8, 1)), "in1": (torch.float32, (8,), (1,))}
    lines, fill = tabulate(body, inputs, 512, lambda: next(names))
    assert lines[1] == body[1]  # in0 spans the whole loop: no reuse
    assert lines[3] == "    const float t4 = tab0[i_1];"
    assert lines[4] == body[4]  # fabs is cheap: not tabulated
    assert fill == ["  float tab0[8];", "  for (FUSEG_I k_ = 0; k_ < 8; ++k_) tab0[k_] = log((float)in1[k_]);"]
    # too little reuse, a half input, a span past TABLE_MAX, symbolic sizes: nothing
    assert tabulate(body, inputs, 8 * (MIN_REUSE - 1), lambda: "x") == (body, [])
    assert tabulate(body, {**inputs, "in1": (torch.float16, (8,), (1,))}, 512, lambda: "x") == (body, [])
    big = {name: (torch.float32, (TABLE_MAX + 1,), (1,)) for name in inputs}
    assert tabulate(body, big, 10**9, lambda: "x") == (body, [])
    sym = torch.fx.experimental.symbolic_shapes.ShapeEnv()
    s = sym.create_symintnode(sym.create_symbol(8, torch._dynamo.source.ConstantSource("n")), hint=8)
    assert tabulate(body, {**inputs, "in1": (torch.float32, (s,), (1,))}, 512, lambda: "x") == (body, [])
    _, fill = tabulate(body, inputs, 512, lambda: "tabp", threads="")
    assert fill[1] == "  for (FUSEG_I k_ = 0; k_ < 8; ++k_) tabp[k_] = log((float)in1[k_]);"  # short: one thread
    many = {**inputs, "in1": (torch.float32, (4096,), (1,))}
    _, fill = tabulate(body, many, 4096 * MIN_REUSE, lambda: "tabq", threads="")
    pragma = "#pragma omp parallel for schedule(static)"
    assert fill.count(pragma) == 1 and "in1[k_]" in fill[fill.index(pragma) + 1], fill  # in0's 512: one thread
